"""Shared fixtures: run Snakemake on a temporary copy of the workflow at the `smoke` preset."""

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def snakemake_env() -> dict:
    env = dict(os.environ)
    # Rules call `python`: make it this interpreter, with the package importable.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # Downloaded Debian packages are cached across test runs (and shared with `make all`).
    env.setdefault("HYBRIDLAB_CACHE", str(ROOT / "cache"))
    return env


def run_snakemake(cwd, *args, timeout=900):
    """`snakemake ARGS` in `cwd`; returns the CompletedProcess (stdout/stderr captured)."""
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=cwd, env=snakemake_env(),
                          capture_output=True, text=True, timeout=timeout)


def copy_workflow(dst: Path) -> Path:
    """Copy what a run needs (not results/, .snakemake/ or caches) into `dst`."""
    for name in ("Snakefile", "config.yaml"):
        shutil.copy(ROOT / name, dst / name)
    for name in ("rules", "workflow_scripts", "profiles", "envs", "src"):
        shutil.copytree(ROOT / name, dst / name, symlinks=True,
                        ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    return dst


def build(work: Path, *targets: str, cores: int = 2) -> None:
    """Build smoke targets in `work`; fail the test with the tail of Snakemake's output."""
    proc = run_snakemake(work, *targets, "--config", "scale=smoke", "--cores", str(cores))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory):
    """One workflow copy per test session with the smoke `data` phase built; tests add their targets."""
    work = copy_workflow(tmp_path_factory.mktemp("smoke"))
    t0 = time.time()
    build(work, "data")
    elapsed = time.time() - t0
    assert elapsed < 180, f"smoke data phase took {elapsed:.0f}s (budget 180s)"
    return work

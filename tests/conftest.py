"""Shared fixtures: run Snakemake on a temporary copy of the workflow at the `smoke` preset."""

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from smoke import make_smoke_repo

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


def build(work: Path, *targets: str, cores: int = 2) -> None:
    """Build smoke targets in `work`; fail the test with the tail of Snakemake's output."""
    proc = run_snakemake(work, *targets, "--config", "scale=smoke", "--cores", str(cores))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory):
    """The session's smoke repository (tests/smoke.py: a git repository of this working tree, `scale:
    smoke`) with the data phase built. Every end-to-end test builds its targets here, so each job of the
    smoke DAG runs once per session; tests that change files work on a copy or a clone."""
    work = make_smoke_repo(tmp_path_factory.mktemp("smoke"))
    t0 = time.time()
    build(work, "data")
    elapsed = time.time() - t0
    assert elapsed < 180, f"smoke data phase took {elapsed:.0f}s (budget 180s)"
    return work

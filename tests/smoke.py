"""Helpers shared by the end-to-end tests: subprocess wrappers for Snakemake, DVC and git, the
session's one smoke-preset repository (`make_smoke_repo`, fixture `smoke_workdir` in conftest.py), a git
repository of this working tree in which every smoke pipeline test builds its targets, so the whole
smoke DAG is built once per test session, and the rehearsal's repository (`make_rehearsal_repo`).
Tests import from here, never from conftest.py.
"""

from __future__ import annotations

import functools
import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SCALE = "smoke"


def pipeline_env(**extra: str) -> dict[str, str]:
    """Environment for Snakemake/DVC subprocesses: this venv's python first, no network telemetry."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    # Downloaded Debian packages are cached across test runs (and shared with `make all`).
    env.setdefault("HYBRIDLAB_CACHE", str(ROOT / "cache"))
    # Users' Python writes __pycache__ into src/; DVC dep hashes must not depend on it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(DVC_NO_ANALYTICS="1", DVC_STUDIO_OFFLINE="1")
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 900,
        check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env or pipeline_env(), capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{' '.join(cmd[:6])} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc


def snakemake(cwd: Path, *args: str, env=None, check=True, timeout: int = 900) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "snakemake", *args], cwd, env=env, timeout=timeout, check=check)


def run_snakemake(cwd: Path, *args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    """`snakemake ARGS` in `cwd`; returns the CompletedProcess without checking its exit status."""
    return snakemake(cwd, *args, check=False, timeout=timeout)


@functools.lru_cache(maxsize=None)
def dry_run_all(scale: str) -> str:
    """stdout of `snakemake -n -p --nolock --forceall all` at `scale` in this checkout: every job of the
    preset's DAG with its shell command, whatever the checkout built. Run once per session and scale
    (test_pipeline_data.py and test_tokenizer_routing.py read the same dry runs)."""
    proc = snakemake(ROOT, "-n", "-p", "--nolock", "--forceall", "all", "--config", f"scale={scale}",
                     check=False, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout


def dvc(cwd: Path, *args: str, env=None, check=True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "dvc", *args], cwd, env=env, check=check)


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run(["git", "-c", "user.name=hybridlab-test", "-c", "user.email=test@hybridlab.invalid",
                "-c", "commit.gpgsign=false", *args], cwd)


# Time limit of one DAG build: a guard against a hang, not a budget (two xdist workers building two DAGs
# on two cores, on a machine others also use, take several times a lone build's time).
BUILD_TIMEOUT = 2700


def build(work: Path, *targets: str, cores: int = 2) -> None:
    """Build smoke targets in `work`; fail the test with the tail of Snakemake's output."""
    snakemake(work, *targets, "--config", f"scale={SCALE}", "--cores", str(cores), timeout=BUILD_TIMEOUT)


def copy_worktree(dst: Path) -> Path:
    """Copy the files git would commit from this working tree (tracked + untracked, not ignored)."""
    listing = run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], ROOT).stdout
    for rel in filter(None, listing.split("\0")):
        src = ROOT / rel
        if src.is_file() or src.is_symlink():
            (dst / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dst / rel, follow_symlinks=False)
    return dst


def set_scale(repo: Path, scale: str) -> None:
    path = repo / "config.yaml"
    lines = path.read_text().splitlines(keepends=True)
    hits = [i for i, line in enumerate(lines) if line.startswith("scale:")]
    assert len(hits) == 1, "config.yaml must set `scale:` on exactly one top-level line"
    lines[hits[0]] = f"scale: {scale}\n"
    path.write_text("".join(lines))


def make_smoke_repo(repo: Path) -> Path:
    """A git repository of this working tree with `scale: smoke` in config.yaml (dvc.yaml reads it)."""
    copy_worktree(repo)
    set_scale(repo, SCALE)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "hybridlab working tree")
    return repo


def make_rehearsal_repo(repo: Path, timeout: int = BUILD_TIMEOUT) -> Path:
    """A repository of this working tree with `snakemake all --config scale=rehearsal` built, as
    `make rehearsal` does it: the smoke corpus (the one smoke job the rehearsal needs), then the local
    hub copies and random hub-architecture models under cache/rehearsal, then the rehearsal DAG.

    Its own repository, not the session's smoke one, so that under pytest-xdist it builds on one worker
    while the smoke DAG builds on the other; the price is the smoke corpus job run a second time.
    """
    make_smoke_repo(repo)
    build(repo, "results/data/smoke/corpus/parallel.parquet")
    run([sys.executable, "workflow_scripts/make_rehearsal_inputs.py", "--corpus", "results/data/smoke/corpus",
         "--out", "cache/rehearsal"], repo)
    snakemake(repo, "all", "--config", "scale=rehearsal", "--cores", "2", timeout=timeout)
    return repo


def built_repo(smoke_repo: Path, targets: list[str]) -> Path:
    """The session's smoke repository with `targets` built (Snakemake skips what is already there).

    Callers copy it (`shutil.copytree(..., symlinks=True)`) before changing anything in it.
    """
    build(smoke_repo, *targets)
    return smoke_repo


def file_hashes(root: Path, skip_dirs: tuple[str, ...] = ()) -> dict[str, str]:
    """sha256 of every file under root, keyed by relative path (directories in skip_dirs left out)."""
    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        rel = path.relative_to(root).as_posix()
        if not any(part in skip_dirs for part in Path(rel).parts[:-1]):
            out[rel] = hashlib.sha256(path.read_bytes()).hexdigest()
    return out


def results_hashes(repo: Path, phases: list[str]) -> dict[str, str]:
    hashes = {}
    for phase in phases:
        root = repo / "results" / phase / SCALE
        hashes.update({f"{phase}/{k}": v for k, v in file_hashes(root).items()})
    return hashes

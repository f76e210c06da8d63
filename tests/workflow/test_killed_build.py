"""A smoke build that is killed (SIGKILL to its process group, as an OOM kill or a power cut would) during a
training job and then during an evaluation job, and stopped with Ctrl-C (SIGINT), continues each time with
the same `make all SCALE=smoke`, no extra flags, and ends with the tables of an uninterrupted build.

It works on a copy of the session's smoke repository (`smoke_workdir`) with `all` built, so it pays only for the jobs it
kills and what depends on them: one BLD-SR arm (trained from scratch, killed after its first checkpoint,
resumed) and the position-loss evaluation (killed, interrupted, rerun).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import polars as pl
import pytest

from hybridlab.atomic import TMP_MARK
from smoke import ROOT, SCALE, built_repo, pipeline_env

pytestmark = [pytest.mark.slow, pytest.mark.smoke_dag]

MAKE = ["make", "all", f"SCALE={SCALE}"]
STAMP = Path(sys.prefix) / ".hybridlab-installed"


def _compare_builds():
    spec = importlib.util.spec_from_file_location("compare_builds", ROOT / "benchmarks" / "compare_builds.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _start(repo: Path, log: Path) -> subprocess.Popen:
    """`make all SCALE=smoke` in its own process group (as a terminal runs a foreground command)."""
    return subprocess.Popen(MAKE, cwd=repo, env=pipeline_env(), stdout=log.open("w"), stderr=subprocess.STDOUT,
                            start_new_session=True)


def _wait_until(proc: subprocess.Popen, log: Path, ready, what: str, timeout: float = 900) -> None:
    end = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            pytest.fail(f"the build ended (exit {proc.returncode}) before {what}:\n{log.read_text()[-3000:]}")
        if time.monotonic() > end:
            os.killpg(proc.pid, signal.SIGKILL)
            pytest.fail(f"no {what} within {timeout} s:\n{log.read_text()[-3000:]}")
        time.sleep(0.02)


def _signal(proc: subprocess.Popen, sig: int) -> float:
    """Send `sig` to the build's process group; seconds until make exited."""
    t0 = time.monotonic()
    os.killpg(proc.pid, sig)
    proc.wait(timeout=120)
    if sig == signal.SIGKILL:  # the jobs are in the group too; make sure none outlives the kill
        for _ in range(100):
            try:
                os.killpg(proc.pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.05)
    return time.monotonic() - t0


def _leftovers(results: Path) -> list[str]:
    """Temporaries among the outputs (a job's work directory, `runs/`, may keep a killed writer's until the
    job cleans it on its next run)."""
    return sorted(str(p.relative_to(results)) for p in results.rglob("*")
                  if (TMP_MARK in p.name or p.name.startswith(".tmp_")) and "runs" not in p.relative_to(results).parts)


def _differences(before: Path, after: Path) -> list[str]:
    """Tables that differ between two builds beyond timing (`benchmarks/compare_builds.py`'s reading of them)."""
    lines, _ = _compare_builds().differences(before / "results", after / "results", SCALE)
    return [line for line in lines if not line.endswith("(timing)")]


def test_killed_and_interrupted_build_continues_with_the_same_command(smoke_workdir, tmp_path):
    if not (STAMP.exists() and STAMP.stat().st_mtime >= (ROOT / "pyproject.toml").stat().st_mtime):
        pytest.skip(f"`make all` would reinstall {sys.prefix}: run `make setup` first (as `make test` does)")
    reference = built_repo(smoke_workdir, ["all"])
    repo = tmp_path / "repo"
    shutil.copytree(reference, repo, symlinks=True)
    (repo / ".venv").symlink_to(sys.prefix)
    results = repo / "results"

    arm_dir = sorted((results / "train" / SCALE / "bld_sr").glob("seed*/baseline"))[0]
    seed = arm_dir.parent.name
    work = results / "train" / SCALE / "runs" / "bld_sr" / seed / "baseline"
    position_loss = [results / "eval" / SCALE / f for f in ("position_loss.parquet", "position_loss_summary.parquet")]
    # the arm trains again from scratch, and the evaluation runs again
    shutil.rmtree(arm_dir)
    shutil.rmtree(work, ignore_errors=True)
    for f in position_loss:
        f.unlink()

    # 1. SIGKILL during training, once the arm has written its first checkpoint
    log = tmp_path / "make1.log"
    proc = _start(repo, log)
    # the run directory holds one subdirectory per run fingerprint
    _wait_until(proc, log, lambda: any(work.glob("*/checkpoints/step_*")), "a BLD-SR checkpoint")
    _signal(proc, signal.SIGKILL)
    assert not (arm_dir / "summary.json").exists(), "the training job finished before the kill"
    assert list((repo / ".snakemake" / "locks").glob("*.lock")), "a SIGKILL leaves Snakemake's lock"

    # 2. the same command: the lock goes, the arm resumes from its checkpoint; SIGKILL during the evaluation
    log = tmp_path / "make2.log"
    proc = _start(repo, log)
    _wait_until(proc, log, lambda: "rule eval_position_loss:" in log.read_text(), "position-loss job")
    time.sleep(1)  # the job has started its script
    _signal(proc, signal.SIGKILL)
    assert "removed the lock left by a Snakemake build that no longer runs" in log.read_text()
    assert not any(f.exists() for f in position_loss)

    # 3. Ctrl-C while the evaluation runs again: out within 30 s, nothing that looks complete but is not
    log = tmp_path / "make3.log"
    proc = _start(repo, log)
    _wait_until(proc, log, lambda: "rule eval_position_loss:" in log.read_text(), "position-loss job")
    time.sleep(1)
    waited = _signal(proc, signal.SIGINT)
    assert waited < 30, f"Ctrl-C took {waited:.0f} s to stop the build"
    assert proc.returncode != 0
    assert not any(f.exists() for f in position_loss) and _leftovers(results) == []

    # 4. the same command finishes, with the tables of the uninterrupted build
    done = subprocess.run(MAKE, cwd=repo, env=pipeline_env(), capture_output=True, text=True, timeout=1800)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert _leftovers(results) == []
    assert pl.read_parquet(position_loss[1]).height > 0
    train_log = results / "train" / SCALE / "logs" / f"bld_sr_baseline_{seed}.log"
    assert "resuming from" in train_log.read_text(), train_log.read_text()[-2000:]  # not trained from scratch
    assert _differences(reference, repo) == []

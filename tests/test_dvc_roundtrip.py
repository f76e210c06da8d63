"""DVC round trip: build with Snakemake, `dvc commit` + `dvc push` to the default (local directory)
remote, clone afresh, `hybridlab cache pull`, and check that Snakemake accepts the pulled outputs.

The repository is copied from this working tree into a temporary git repository with
`scale: smoke` in config.yaml (dvc.yaml is templated on it). The builder and helpers below are
shared with test_dvc_s3.py and test_slurm.py (one smoke build per session).
"""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from hybridlab import cache
from hybridlab.errors import HybridlabError

ROOT = Path(__file__).resolve().parents[1]
# What is built, cached and pulled; switch to ["all"] once every phase is implemented.
TARGETS = ["data", "results/models/smoke/teachers/teacher/model.safetensors"]
SCALE = "smoke"
# One output that is deleted after the pull, and the only rule that may rerun to rebuild it.
REBUILD, REBUILD_RULE = "results/data/smoke/tokenizer/tokenizer.json", "tokenizer"

pytestmark = pytest.mark.slow


# --------------------------------------------------------------------------------------------------
# Shared helpers (imported by test_dvc_s3.py and test_slurm.py)

def pipeline_env(**extra: str) -> dict[str, str]:
    """Environment for Snakemake/DVC subprocesses: this venv's python first, no network telemetry."""
    env = dict(os.environ)
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env.setdefault("HYBRIDLAB_CACHE", str(ROOT / "cache"))
    # Users' Python writes __pycache__ into src/; DVC dep hashes must not depend on it.
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env.update(DVC_NO_ANALYTICS="1", DVC_STUDIO_OFFLINE="1")
    env.update(extra)
    return env


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None, timeout: int = 600,
        check: bool = True) -> subprocess.CompletedProcess:
    proc = subprocess.run(cmd, cwd=cwd, env=env or pipeline_env(), capture_output=True, text=True,
                          timeout=timeout)
    if check:
        assert proc.returncode == 0, f"{' '.join(cmd[:6])} failed:\n{(proc.stdout + proc.stderr)[-4000:]}"
    return proc


def snakemake(cwd: Path, *args: str, env=None, check=True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "snakemake", *args], cwd, env=env, check=check)


def dvc(cwd: Path, *args: str, env=None, check=True) -> subprocess.CompletedProcess:
    return run([sys.executable, "-m", "dvc", *args], cwd, env=env, check=check)


def git(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    return run(["git", "-c", "user.name=hybridlab-test", "-c", "user.email=test@hybridlab.invalid",
                "-c", "commit.gpgsign=false", *args], cwd)


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


def built_repo(tmp_path_factory, targets: list[str]) -> Path:
    """A git repository of this working tree (scale: smoke) with `targets` built, once per session.

    Callers copy it (`shutil.copytree(..., symlinks=True)`) before changing anything in it.
    """
    key = hashlib.sha1("\0".join(targets).encode()).hexdigest()[:10]
    repo = tmp_path_factory.getbasetemp() / f"hybridlab-built-{key}"
    done = repo.with_name(repo.name + ".done")
    if done.exists():
        return repo
    shutil.rmtree(repo, ignore_errors=True)
    repo.mkdir()
    copy_worktree(repo)
    set_scale(repo, SCALE)
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "hybridlab working tree")
    snakemake(repo, *targets, "--config", f"scale={SCALE}", "--cores", "2")
    done.touch()
    return repo


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


@pytest.fixture
def dvc_env(monkeypatch, tmp_path):
    """os.environ for in-process `cache.pull` calls: isolated DVC config and site cache."""
    for key, value in pipeline_env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
    for name in ("DVC_GLOBAL_CONFIG_DIR", "DVC_SYSTEM_CONFIG_DIR", "DVC_SITE_CACHE_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))


# --------------------------------------------------------------------------------------------------
# Pure parts of hybridlab.cache

def test_phases_for_targets_includes_every_upstream_phase():
    assert cache.phases_for(["data"]) == ["data"]
    assert cache.phases_for(["results/models/smoke/teachers/teacher/model.safetensors"]) == ["data", "models"]
    assert cache.phases_for(["results/eval/tiny/x.parquet", "data"]) == ["data", "models", "train", "eval"]
    assert cache.phases_for(["all"]) == list(cache.PHASES)
    assert cache.phases_for(["fig_niah"]) == list(cache.PHASES)  # a figure may need every phase
    with pytest.raises(HybridlabError, match="results/<phase>/"):
        cache.phases_for(["results/weights/smoke/x"])
    with pytest.raises(HybridlabError, match="no Snakemake targets"):
        cache.phases_for([])


def test_parse_job_stats_reads_snakemakes_table():
    text = ("Building DAG of jobs...\nJob stats:\njob          count\n---------  -------\n"
            "tokenizer        1\nmixture          2\ndata             1\ntotal            4\n\nReasons: ...\n")
    assert cache.parse_job_stats(text) == {"tokenizer": 1, "mixture": 2, "data": 1}
    assert cache.parse_job_stats("Nothing to be done (all requested files are present and up to date).") == {}
    with pytest.raises(HybridlabError, match="neither a job table"):
        cache.parse_job_stats("WorkflowError: something else")


def test_dvcignore_excludes_bytecode():
    # DVC hashes dep directories (src/hybridlab/<phase>, workflow_scripts) file by file: without this,
    # running Python in a clone writes __pycache__ there and every cached stage looks stale.
    patterns = {line.strip() for line in (ROOT / ".dvcignore").read_text().splitlines()}
    assert patterns & {"__pycache__", "__pycache__/", "**/__pycache__"}, \
        "add `__pycache__/` (and `*.pyc`) to .dvcignore"


# --------------------------------------------------------------------------------------------------
# The round trip

@pytest.fixture(scope="module")
def published(tmp_path_factory):
    """(workdir, repo): the smoke build committed to dvc.lock, pushed to the default remote."""
    work = tmp_path_factory.mktemp("dvc-roundtrip")
    repo = work / "repo"
    shutil.copytree(built_repo(tmp_path_factory, TARGETS), repo, symlinks=True)
    env = pipeline_env(DVC_GLOBAL_CONFIG_DIR=str(work / "dvc-global"), DVC_SYSTEM_CONFIG_DIR=str(work / "dvc-sys"),
                       DVC_SITE_CACHE_DIR=str(work / "dvc-site"))
    stages = cache.phases_for(TARGETS)
    # Snakemake built the outputs; `dvc commit` records them in dvc.lock without rerunning anything.
    dvc(repo, "commit", "--force", *stages, env=env)
    assert "up to date" in dvc(repo, "status", *stages, env=env).stdout
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "cache smoke results")
    dvc(repo, "push", env=env)
    # .dvc/config's default remote is ../../hybridlab-dvc-remote, i.e. next to the repository.
    remote = work / "hybridlab-dvc-remote"
    assert remote.is_dir() and any(p.is_file() for p in remote.rglob("*")), "dvc push wrote nothing"
    return work, repo


@pytest.fixture(scope="module")
def pulled_clone(published, tmp_path_factory):
    """A fresh clone after `hybridlab cache pull` (shared by the tests below, in file order)."""
    work, repo = published
    clone = work / "clone"
    git(work, "clone", "-q", str(repo), str(clone))
    assert not (clone / "results").exists()
    mp = pytest.MonkeyPatch()
    try:
        for key, value in pipeline_env(DVC_GLOBAL_CONFIG_DIR=str(work / "dvc-global"),
                                       DVC_SYSTEM_CONFIG_DIR=str(work / "dvc-sys"),
                                       DVC_SITE_CACHE_DIR=str(work / "dvc-site")).items():
            mp.setenv(key, value)
        mp.delenv("PYTHONDONTWRITEBYTECODE", raising=False)
        report = cache.pull(TARGETS, repo=clone, scale=SCALE)
    finally:
        mp.undo()
    return clone, report


def test_pull_restores_outputs_and_snakemake_has_nothing_to_do(published, pulled_clone):
    _, repo = published
    clone, report = pulled_clone
    stages = cache.phases_for(TARGETS)
    assert report.pulled == stages and report.not_cached == [] and report.to_build == {}
    assert report.n_marked > 0
    assert results_hashes(clone, stages) == results_hashes(repo, stages)

    # (a) No spurious reruns, neither with the workflow's default profile nor with every trigger.
    for extra in ([], ["--rerun-triggers", "mtime", "params", "input", "code", "software-env"]):
        proc = snakemake(clone, "-n", *TARGETS, "--config", f"scale={SCALE}", *extra)
        assert cache.parse_job_stats(proc.stdout + proc.stderr) == {}, (proc.stdout + proc.stderr)[-3000:]
    # Touching changed no content: DVC agrees the pulled stages match dvc.lock.
    assert "up to date" in dvc(clone, "status", *stages).stdout


def test_deleting_one_output_rebuilds_only_its_job(pulled_clone):
    clone, _ = pulled_clone
    target = clone / REBUILD
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    target.unlink()
    proc = snakemake(clone, REBUILD, "--config", f"scale={SCALE}", "--cores", "2")
    assert cache.parse_job_stats(proc.stdout + proc.stderr) == {REBUILD_RULE: 1}
    assert hashlib.sha256(target.read_bytes()).hexdigest() == before, "the rebuild is not deterministic"
    # Its consumers recorded this input's checksum at pull time, so the new mtime reruns nothing.
    proc = snakemake(clone, "-n", *TARGETS, "--config", f"scale={SCALE}")
    assert cache.parse_job_stats(proc.stdout + proc.stderr) == {}


def test_params_changed_after_pull_trigger_a_rerun(pulled_clone):
    # Metadata recorded by the pull is what lets Snakemake see a params change at all.
    clone, _ = pulled_clone
    cfg = clone / "config.yaml"
    original = cfg.read_text()
    changed = original.replace("n_train: 512, n_val: 64, n_test: 64", "n_train: 512, n_val: 32, n_test: 64")
    assert changed != original, "the smoke Spaced Retrieval preset changed; update this test's edit"
    try:
        cfg.write_text(changed)
        proc = snakemake(clone, "-n", "data", "--config", f"scale={SCALE}")
        counts = cache.parse_job_stats(proc.stdout + proc.stderr)
        assert counts.get("spaced_retrieval") == 1 and "corpus" not in counts
    finally:
        cfg.write_text(original)


def test_pull_repairs_any_mtime_order(published, dvc_env):
    """A bare `dvc pull` may leave an input newer than its outputs; `cache.pull` fixes any order."""
    work, repo = published
    clone = work / "clone-mtime"
    git(work, "clone", "-q", str(repo), str(clone))
    stages = cache.phases_for(TARGETS)
    dvc(clone, "pull", *stages)
    corpus = clone / "results/data/smoke/corpus/mono.parquet"
    newest = max(p.stat().st_mtime for p in (clone / "results").rglob("*") if p.is_file())
    os.utime(corpus, (newest + 10, newest + 10))
    proc = snakemake(clone, "-n", *TARGETS, "--config", f"scale={SCALE}")
    assert "tokenizer" in cache.parse_job_stats(proc.stdout + proc.stderr), "expected the trap to show"

    report = cache.pull(TARGETS, repo=clone)
    assert report.to_build == {}


def test_pull_refuses_a_stale_stage(published, dvc_env):
    work, repo = published
    clone = work / "clone-stale"
    git(work, "clone", "-q", str(repo), str(clone))
    rules = clone / "rules" / "data.smk"
    rules.write_text(rules.read_text() + "\n# a local edit after the cache was made\n")
    with pytest.raises(HybridlabError, match=r"data: changed deps rules/data\.smk modified"):
        cache.pull(TARGETS, repo=clone)
    assert not (clone / ".snakemake" / "metadata").exists(), "stale outputs must not be marked complete"


def test_pull_errors_name_the_fix(published, tmp_path_factory):
    _, repo = published
    with pytest.raises(HybridlabError, match=r"scale: smoke"):
        cache.pull(TARGETS, repo=repo, scale="tiny")
    # The built repository before `dvc commit` has no dvc.lock.
    unlocked = built_repo(tmp_path_factory, TARGETS)
    assert not (unlocked / "dvc.lock").exists()
    with pytest.raises(HybridlabError, match="dvc.lock records none of the stages"):
        cache.pull(TARGETS, repo=unlocked)
    with pytest.raises(HybridlabError, match="no dvc.yaml"):
        cache.pull(TARGETS, repo=tmp_path_factory.mktemp("empty"))

"""DVC round trip: build with Snakemake, `dvc commit` + `dvc push` to the default (local directory)
remote, clone afresh, `hybridlab cache pull`, and check that Snakemake accepts the pulled outputs.

The whole smoke DAG (`all`: every phase, figure and table) is built once per test session in the
shared smoke repository (tests/smoke.py, fixture `smoke_workdir`), copied, committed to dvc.lock and
pushed; a fresh clone pulls it. test_dvc_s3.py does the same through an S3 server.
"""

from __future__ import annotations

import hashlib
import os
import shutil

import pytest

from hybridlab import cache
from hybridlab.errors import HybridlabError

from smoke import ROOT, SCALE, built_repo, dvc, git, pipeline_env, results_hashes, snakemake

# What is built, cached and pulled: the whole smoke DAG.
TARGETS = ["all"]
# One output that is deleted after the pull, and the only rule that may rerun to rebuild it.
REBUILD, REBUILD_RULE = "results/figures/smoke/fig_sr_accuracy.png", "figure"

pytestmark = [pytest.mark.slow, pytest.mark.smoke_dag]


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
def published(tmp_path_factory, smoke_workdir):
    """(workdir, repo): the smoke build committed to dvc.lock, pushed to the default remote."""
    work = tmp_path_factory.mktemp("dvc-roundtrip")
    repo = work / "repo"
    shutil.copytree(built_repo(smoke_workdir, TARGETS), repo, symlinks=True)
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


def test_deleting_one_figure_rebuilds_only_that_figure(pulled_clone):
    clone, _ = pulled_clone
    target = clone / REBUILD
    before = hashlib.sha256(target.read_bytes()).hexdigest()
    target.unlink()
    proc = snakemake(clone, "fig_sr_accuracy", "--config", f"scale={SCALE}", "--cores", "2")
    # the figure rule once, plus the named target rule that only collects its files
    assert cache.parse_job_stats(proc.stdout + proc.stderr) == {REBUILD_RULE: 1, "fig_sr_accuracy": 1}
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


def test_pull_repairs_any_mtime_order(published, dvc_env, capsys):
    """A bare `dvc pull` may leave an input newer than its outputs; `hybridlab cache pull` fixes any order."""
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

    # through the command a user types: exit 0, and nothing left to build
    from hybridlab.cli import main

    assert main(["cache", "pull", *TARGETS, "--repo", str(clone)]) == 0
    out = capsys.readouterr().out
    assert "pulled stages (smoke): " in out and "nothing left to build for the requested targets" in out, out


def test_pull_refuses_a_stale_stage(published, dvc_env):
    work, repo = published
    clone = work / "clone-stale"
    git(work, "clone", "-q", str(repo), str(clone))
    rules = clone / "rules" / "data.smk"
    rules.write_text(rules.read_text() + "\n# a local edit after the cache was made\n")
    with pytest.raises(HybridlabError, match=r"data: changed deps rules/data\.smk modified"):
        cache.pull(TARGETS, repo=clone)
    assert not (clone / ".snakemake" / "metadata").exists(), "stale outputs must not be marked complete"


def test_pull_refuses_the_models_stage_after_a_library_edit(published, dvc_env):
    """The teacher trains in the models phase: an edit under src/hybridlab/train makes that stage stale."""
    work, repo = published
    clone = work / "clone-stale-lib"
    git(work, "clone", "-q", str(repo), str(clone))
    loop = clone / "src" / "hybridlab" / "train" / "loop.py"
    loop.write_text(loop.read_text() + "\n# a local edit after the cache was made\n")
    with pytest.raises(HybridlabError, match=r"models: changed deps src/hybridlab modified") as err:
        cache.pull(TARGETS, repo=clone)
    assert "\n" not in str(err.value)
    assert not (clone / ".snakemake" / "metadata").exists(), "stale outputs must not be marked complete"


def test_pull_errors_name_the_fix(published, smoke_workdir, tmp_path_factory):
    _, repo = published
    with pytest.raises(HybridlabError, match=r"scale: smoke"):
        cache.pull(TARGETS, repo=repo, scale="tiny")
    # The built repository before `dvc commit` has no dvc.lock.
    unlocked = smoke_workdir
    assert not (unlocked / "dvc.lock").exists()
    with pytest.raises(HybridlabError, match="dvc.lock records none of the stages"):
        cache.pull(TARGETS, repo=unlocked)
    with pytest.raises(HybridlabError, match="no dvc.yaml"):
        cache.pull(TARGETS, repo=tmp_path_factory.mktemp("empty"))

"""Shared fixtures: the session's smoke repository, and Snakemake runners for the pipeline tests."""

import time

import pytest

from smoke import ROOT, build, make_smoke_repo, snakemake  # noqa: F401  (ROOT and build: re-exported)


def run_snakemake(cwd, *args, timeout=900):
    """`snakemake ARGS` in `cwd`; returns the CompletedProcess without checking its exit status."""
    return snakemake(cwd, *args, check=False, timeout=timeout)


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

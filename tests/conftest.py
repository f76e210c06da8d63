"""Shared fixtures: the session's smoke repository (helpers live in tests/smoke.py)."""

import ast
import functools
import os
from pathlib import Path

import pytest

from hybridlab.heap import retain_freed_memory
from smoke import build, make_smoke_repo

# Tests import their helpers from tests/smoke.py, never from this file: fixtures only here.

# Under pytest-xdist (`make test` runs `pytest -n 2`), a session or module fixture runs once in every
# worker that runs a test needing it. So tests are sent in whole groups (scheduler below): the files
# marked `smoke_dag` (they build in the session's smoke repository, `smoke_workdir`) form one group, on one
# worker, so each smoke job still runs once per session; every other file is its own group (its module
# fixtures, e.g. test_fsdp.py's torchrun runs, run once). Longest first: the smoke group, then the rehearsal
# (its own repository, so it builds on the other worker meanwhile), then the next longest files, then the rest.
# `pytest -m smoke_dag` runs the smoke-DAG files alone, `-m "not smoke_dag"` everything else.
DAG_MARK = "smoke_dag"
DAG_GROUP = "smoke-dag"
LONG_FILES = ["test_rehearsal.py", "test_real_checkpoint.py", "test_fsdp.py", "test_gpu_acceptance.py"]
XDIST_WORKER = os.environ.get("PYTEST_XDIST_WORKER")


ROOT = Path(__file__).resolve().parent.parent  # node ids are relative to the repository root (pyproject.toml)


def _file(nodeid: str) -> str:
    """The test file of a node id, relative to the repository root (e.g. tests/workflow/test_slurm.py)."""
    return nodeid.split("::", 1)[0]


@functools.lru_cache(maxsize=None)
def _uses_smoke_repo(rel: str) -> bool:
    """Whether test file `rel` is marked `smoke_dag` at module level (`pytestmark`). Read from its syntax
    tree: xdist's controller schedules by node id, before any test module is imported."""
    path = ROOT / rel
    if not path.is_file():
        return False
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in node.targets):
            return any(isinstance(n, ast.Attribute) and n.attr == DAG_MARK for n in ast.walk(node.value))
    return False


def _rank(nodeid: str) -> int:
    rel = _file(nodeid)
    if _uses_smoke_repo(rel):
        return 0
    name = Path(rel).name
    return LONG_FILES.index(name) + 1 if name in LONG_FILES else len(LONG_FILES) + 1


def pytest_configure(config):
    retain_freed_memory()  # as the pipeline's jobs run (hybridlab.heap)
    if XDIST_WORKER:
        import torch

        # Two workers on two cores: one intra-op thread each instead of two each competing.
        torch.set_num_threads(1)


@pytest.hookimpl(optionalhook=True)  # a plain `pytest` without pytest-xdist must still load this file
def pytest_xdist_make_scheduler(config, log):
    """Groups as above: one work unit per file, the smoke-repository files together in one (xdist's own
    `--dist loadgroup` cannot do this under pytest 9.2: it renames node ids, which no longer works)."""
    from xdist.scheduler import LoadScopeScheduling

    class DagScheduling(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return DAG_GROUP if _uses_smoke_repo(_file(nodeid)) else nodeid.split("::", 1)[0]

    config.option.loadscopereorder = False  # collection order (longest first, below), not group size
    return DagScheduling(config, log)


def pytest_collection_modifyitems(config, items):
    # A test on the smoke repository in a file without the module-level mark would build a second repository
    # on the other worker: say so instead.
    stray = sorted({_file(item.nodeid) for item in items
                    if "smoke_workdir" in item.fixturenames and not _uses_smoke_repo(_file(item.nodeid))})
    if stray:
        raise pytest.UsageError(f"{stray} use smoke_workdir without the module mark; add `pytestmark = "
                                f"pytest.mark.{DAG_MARK}` there so tests/conftest.py schedules them with the smoke DAG")
    if XDIST_WORKER:
        items.sort(key=lambda item: _rank(item.nodeid))  # stable: file order kept within a rank


@pytest.fixture(scope="session")
def smoke_workdir(tmp_path_factory):
    """The session's smoke repository (tests/smoke.py: a git repository of this working tree, `scale:
    smoke`) with the data phase built. Every end-to-end test builds its targets here, so each job of the
    smoke DAG runs once per session; tests that change files work on a copy or a clone."""
    work = make_smoke_repo(tmp_path_factory.mktemp("smoke"))
    # No timing assert here (it would flake on a loaded machine); the phase's jobs' times are in its
    # benchmark files and docs/performance.md tracks the suite's time.
    build(work, "data")
    return work

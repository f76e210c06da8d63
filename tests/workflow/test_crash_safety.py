"""A crash or a full disk leaves no partial output, and the same command continues afterwards.

- the default profile reruns the jobs a killed Snakemake had started (`rerun-incomplete`);
- a full disk (simulated ENOSPC) at each writer: the atomic writer (tables, figures), training checkpoints,
  hybrid model directories, a workflow script's exit: one line, nothing under the final name, no temporary;
- an interrupted `hybridlab cache pull` completes when rerun (local directory remote, no network).
"""

from __future__ import annotations

import errno
import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from hybridlab import atomic, build_lock, cache
from hybridlab.atomic import TMP_MARK, atomic_file, write_text
from hybridlab.errors import HybridlabError
from hybridlab.models.io import save_hybrid
from hybridlab.train import checkpoint
from hybridlab.train.checkpoint import list_checkpoints

from test_damaged_inputs import DATA, Task, Tiny, _hybrid, dvc_repo, no_snakemake, one_line  # noqa: F401
from hybridlab.train.config import TrainConfig
from hybridlab.train.loop import train

ROOT = Path(__file__).resolve().parents[2]
FULL = "no space left on device writing"


def enospc(*_, **__):
    raise OSError(errno.ENOSPC, "No space left on device")


def leftovers(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.rglob("*") if TMP_MARK in p.name or p.name.startswith(".tmp_"))


# --- the default profile -----------------------------------------------------------------------------------

def test_default_profile_reruns_incomplete_jobs():
    """`snakemake all` / `make all` load profiles/default: after a crash the same command goes on."""
    default = ROOT / "profiles" / "default" / "config.yaml"
    profile = yaml.safe_load(default.read_text())
    assert profile.get("rerun-incomplete") is True
    assert profile.get("keep-incomplete") is False  # partial outputs of a killed job are deleted, not kept
    assert "--profile" not in (ROOT / "Makefile").read_text()  # make all relies on the default profile


# --- Snakemake's lock after a SIGKILL -----------------------------------------------------------------------

def _locked(workdir: Path, owner_pid: int, host: str | None = None, lock_after_record: bool = False) -> Path:
    """A working directory as a killed build leaves it: Snakemake's lock files and the owner record."""
    locks = workdir / ".snakemake" / "locks"
    locks.mkdir(parents=True)
    lock = locks / "0.output.lock"
    lock.write_text("results/eval/smoke/fertility.parquet\n")
    owner = workdir / ".snakemake" / build_lock.OWNER
    record = {"host": host or socket.gethostname(), "pid": owner_pid, "started": build_lock._start_time(owner_pid)}
    owner.write_text(json.dumps(record))
    lock_ns, owner_ns = (2_000_000_000, 1_000_000_000) if lock_after_record else (1_000_000_000, 2_000_000_000)
    os.utime(lock, ns=(lock_ns, lock_ns))
    os.utime(owner, ns=(owner_ns, owner_ns))
    return locks


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_lock_of_a_killed_build_is_removed(tmp_path):
    locks = _locked(tmp_path, _dead_pid())
    note = build_lock.clear_stale_lock(tmp_path)
    assert note is not None and note.startswith("note: removed the lock left by a Snakemake build")
    assert not locks.exists() and not (tmp_path / ".snakemake" / build_lock.OWNER).exists()


@pytest.mark.parametrize("case", ["owner alive", "other host", "locked after the record", "no record"])
def test_lock_that_may_belong_to_a_live_build_stays(tmp_path, case):
    pid = os.getpid() if case == "owner alive" else _dead_pid()
    locks = _locked(tmp_path, pid, host="another-node" if case == "other host" else None,
                    lock_after_record=case == "locked after the record")
    if case == "no record":
        (tmp_path / ".snakemake" / build_lock.OWNER).unlink()
    assert build_lock.clear_stale_lock(tmp_path) is None
    assert (locks / "0.output.lock").exists()


def test_owner_record_names_this_process_and_is_forgotten_only_by_it(tmp_path):
    build_lock.record_owner(tmp_path)
    owner = tmp_path / ".snakemake" / build_lock.OWNER
    assert json.loads(owner.read_text())["pid"] == os.getpid()
    owner.write_text(json.dumps({"host": socket.gethostname(), "pid": 1, "started": None}))
    build_lock.forget_owner(tmp_path)  # another build's record: kept
    assert owner.exists()
    build_lock.record_owner(tmp_path)
    build_lock.forget_owner(tmp_path)
    assert not owner.exists()


# --- the atomic writer: tables and figures -----------------------------------------------------------------

def test_full_disk_writing_a_table_leaves_nothing(tmp_path, monkeypatch):
    out = tmp_path / "results" / "eval" / "smoke" / "fertility.parquet"

    def partial_then_full(self, file, *a, **k):
        Path(file).write_bytes(b"PAR1 half a table")
        enospc()

    monkeypatch.setattr(pl.DataFrame, "write_parquet", partial_then_full)
    with pytest.raises(HybridlabError) as e:
        with atomic_file(out) as tmp:
            pl.DataFrame({"a": [1]}).write_parquet(tmp)
    msg = one_line(e)
    assert msg.startswith(f"{FULL} {out};") and "free space and rerun" in msg
    assert not out.exists() and leftovers(tmp_path) == []


def test_full_disk_keeps_the_previous_output(tmp_path, monkeypatch):
    out = write_text(tmp_path / "fig.md", "old\n")
    with pytest.raises(HybridlabError, match=FULL):
        with atomic_file(out) as tmp:
            tmp.write_text("new, partial")
            enospc()
    assert out.read_text() == "old\n" and leftovers(tmp_path) == []


def test_full_disk_saving_a_figure_leaves_nothing(tmp_path, monkeypatch):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots()
    ax.plot([0, 1])
    real_open = open

    def full_open(file, mode="r", *a, **k):  # the disk fills after the first bytes of the PNG
        f = real_open(file, mode, *a, **k)
        if "w" in mode and TMP_MARK in str(file):
            write = f.write

            def short_write(data):
                write(data[:10])
                enospc()
            f.write = short_write
        return f

    out = tmp_path / "fig.png"
    monkeypatch.setattr("builtins.open", full_open)
    with pytest.raises(HybridlabError) as e:
        with atomic_file(out) as tmp:
            fig.savefig(tmp, format="png")
    monkeypatch.undo()
    plt.close(fig)
    assert one_line(e).startswith(f"{FULL} {out};")
    assert not out.exists() and leftovers(tmp_path) == []


def test_other_write_errors_are_not_reported_as_a_full_disk(tmp_path):
    with pytest.raises(PermissionError):
        with atomic_file(tmp_path / "x") as tmp:
            tmp.write_text("x")
            raise PermissionError(errno.EACCES, "Permission denied")
    assert not atomic.disk_full(OSError(errno.EACCES, "Permission denied"))
    assert atomic.disk_full(RuntimeError("IO error: No space left on device (os error 28)"))


def test_workflow_script_reports_a_raw_full_disk_in_one_line(tmp_path):
    code = ("import sys, errno; sys.path.insert(0, 'workflow_scripts'); import _common\n"
            "def main():\n"
            f"    raise OSError(errno.ENOSPC, 'No space left on device', {str(tmp_path / 'x.log')!r})\n"
            "_common.run(main)\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines() == [
        f"error: no space left on device writing {tmp_path / 'x.log'}; free space and rerun the same command"]


# --- training checkpoints ----------------------------------------------------------------------------------

def go(tmp_path, steps):
    c = TrainConfig(out_dir=str(tmp_path / "run"), steps=steps, micro_batch_size=2, ckpt_every=1, keep_last_k=3,
                    progress=False)
    torch.manual_seed(0)
    return train(Tiny(), Task(), DATA, c)


@pytest.mark.parametrize("where", ["shards", "state"])
def test_full_disk_writing_a_checkpoint(tmp_path, monkeypatch, where):
    """The disk fills while step 2 is written: step 1 stays, no step 2 and no temporary, one line; after
    freeing space the same run resumes from step 1."""
    real_dcp_save, real_torch_save, calls = checkpoint.dcp.save, checkpoint.torch.save, {"n": 0}

    def dcp_save(*a, **k):  # counts the checkpoints
        calls["n"] += 1
        return real_dcp_save(*a, **k)

    def torch_save(obj, f, *a, **k):
        name = getattr(f, "name", f)  # DCP also saves into in-memory buffers
        is_state = isinstance(name, (str, Path)) and Path(name).name == checkpoint.STATE_FILE
        if calls["n"] == 2 and not is_state:
            enospc()  # raised inside DCP's writer, which wraps it in a CheckpointException
        return real_torch_save(obj, f, *a, **k)

    def full_device(path, mode="r", *a, **k):
        """The small state file goes to /dev/full: the kernel's own ENOSPC, through torch's real writer."""
        if calls["n"] == 2 and Path(path).name == checkpoint.STATE_FILE:
            return open("/dev/full", mode, *a, **k)
        return open(path, mode, *a, **k)

    monkeypatch.setattr(checkpoint.dcp, "save", dcp_save)
    if where == "shards":
        monkeypatch.setattr(checkpoint.torch, "save", torch_save)
    else:
        if not Path("/dev/full").exists():
            pytest.skip("no /dev/full on this system")
        monkeypatch.setattr(checkpoint, "open", full_device, raising=False)
    with pytest.raises(HybridlabError) as e:
        go(tmp_path, steps=3)
    ckpts = tmp_path / "run" / "checkpoints"
    msg = one_line(e)
    assert msg.startswith(f"{FULL} checkpoint {ckpts / 'step_000000002'};") and "resumes" in msg
    assert [s for s, _ in list_checkpoints(ckpts)] == [1] and leftovers(ckpts) == []
    monkeypatch.undo()
    res = go(tmp_path, steps=3)
    assert res.step == 3 and [s for s, _ in list_checkpoints(ckpts)] == [1, 2, 3]


# --- hybrid model directories ------------------------------------------------------------------------------

def _full_weights(monkeypatch):
    import safetensors.torch

    def save_model(model, filename, metadata=None):
        Path(filename).write_bytes(b"half a safetensors file")
        enospc()

    monkeypatch.setattr(safetensors.torch, "save_model", save_model)


def test_full_disk_saving_a_hybrid_leaves_no_directory(tmp_path, monkeypatch):
    model = _hybrid()
    out = tmp_path / "results" / "models" / "smoke" / "students" / "s0" / "last-gdn"
    _full_weights(monkeypatch)
    with pytest.raises(HybridlabError) as e:
        save_hybrid(model, out)
    assert one_line(e).startswith(f"{FULL} hybrid directory {out};")
    assert not out.exists() and leftovers(tmp_path) == []


def test_full_disk_saving_a_hybrid_inside_a_job_output(tmp_path, monkeypatch):
    """The training jobs save into an `atomic_dir`: its final name never appears."""
    model = _hybrid()
    out = tmp_path / "arm"
    _full_weights(monkeypatch)
    with pytest.raises(HybridlabError) as e:
        with atomic.atomic_dir(out) as tmp:
            save_hybrid(model, tmp)
    assert FULL in one_line(e)
    assert not out.exists() and list(tmp_path.iterdir()) == []


# --- an interrupted `hybridlab cache pull` -----------------------------------------------------------------

def test_interrupted_cache_pull_completes_when_rerun(dvc_repo, no_snakemake, monkeypatch):
    repo, _, originals = dvc_repo
    out = repo / "results" / "data" / "smoke"
    real_pull = cache.dvc_pull

    def killed_pull(repo_, stages, **k):  # DVC wrote one file whole, one half, then the user hit Ctrl-C
        out.mkdir(parents=True)
        (out / "part0.bin").write_bytes(originals["part0.bin"])
        (out / "part1.bin").write_bytes(originals["part1.bin"][:1000])
        raise KeyboardInterrupt

    monkeypatch.setattr(cache, "dvc_pull", killed_pull)
    with pytest.raises(KeyboardInterrupt):
        cache.pull(["data"], repo=repo)
    assert (repo / cache.PULL_RECORD).is_file()
    monkeypatch.setattr(cache, "dvc_pull", real_pull)
    report = cache.pull(["data"], repo=repo)  # a bare `dvc pull` refuses the half file as "unsaved"
    assert report.resumed and "completed an interrupted pull" in report.summary()
    assert {p.name: p.read_bytes() for p in out.iterdir()} == originals
    assert not (repo / cache.PULL_RECORD).exists()


def test_local_changes_still_need_force(dvc_repo, no_snakemake):
    """Without an interrupted pull, files changed by hand are not overwritten silently."""
    repo, _, originals = dvc_repo
    cache.pull(["data"], repo=repo)
    edited = repo / "results" / "data" / "smoke" / "part2.bin"
    edited.chmod(0o644)
    edited.write_bytes(b"my own edit")
    # a pull of a stage whose outputs changed: DVC sees the workspace differ from dvc.lock
    with pytest.raises(HybridlabError) as e:
        cache.pull(["data"], repo=repo)
    assert "--force" in one_line(e) and edited.read_bytes() == b"my own edit"
    assert not (repo / cache.PULL_RECORD).exists()
    cache.pull(["data"], repo=repo, force=True)
    assert edited.read_bytes() == originals["part2.bin"]

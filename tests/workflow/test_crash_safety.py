"""A crash or a full disk leaves no partial output, and the same command continues afterwards.

- the default profile reruns the jobs a killed Snakemake had started (`rerun-incomplete`);
- a full disk (simulated ENOSPC) at each writer: the atomic writer (tables, figures), training checkpoints,
  hybrid model directories, a workflow script's exit: one line, nothing under the final name, no temporary;
- an interrupted `hybridlab cache pull` completes when rerun (local directory remote, no network).
"""

from __future__ import annotations

import errno
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
import yaml

from hybridlab import atomic, cache
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
        is_state = isinstance(f, (str, Path)) and Path(f).name == checkpoint.STATE_FILE
        if calls["n"] == 2 and (is_state if where == "state" else not is_state):
            if is_state:
                Path(f).write_bytes(b"half")
            enospc()  # for the shards: raised inside DCP's writer, which wraps it in a CheckpointException
        return real_torch_save(obj, f, *a, **k)

    monkeypatch.setattr(checkpoint.dcp, "save", dcp_save)
    monkeypatch.setattr(checkpoint.torch, "save", torch_save)
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

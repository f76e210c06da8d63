"""Damaged inputs stop a job with one line naming the file and how to rebuild it.

Covers the readers: parquet tables of the figure jobs (`read_tables`), training checkpoints (checksum
manifest, `train/checkpoint.py`), hybrid model directories (`models/io.py`: checksums in hybrid.json,
safetensors header, config.json / hybrid.json), a workflow script's exit, and a pulled DVC file whose
content does not match dvc.lock (`hybridlab cache pull`, local directory remote, no network).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch
from tiny_models import tiny_hybrid

from hybridlab import cache
from hybridlab.atomic import MANIFEST, read_manifest
from hybridlab.errors import HybridlabError
from hybridlab.models.io import load_hybrid, save_hybrid
from hybridlab.plots.registry import read_tables
from hybridlab.train.checkpoint import STATE_FILE, latest_checkpoint
from hybridlab.train.config import TrainConfig
from hybridlab.train.loop import train

ROOT = Path(__file__).resolve().parents[2]


def one_line(exc: pytest.ExceptionInfo) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and msg
    return msg


# --- tables ------------------------------------------------------------------------------------------------

@pytest.fixture
def fertility(tmp_path):
    path = tmp_path / "results" / "eval" / "smoke" / "fertility.parquet"
    path.parent.mkdir(parents=True)
    pl.DataFrame({"language": ["en", "de"], "fertility": [1.2, 1.5]}).write_parquet(path)
    return path


@pytest.mark.parametrize("damage", ["truncated", "garbage", "empty"])
def test_damaged_table_names_file_and_rebuild_command(fertility, damage):
    data = fertility.read_bytes()
    fertility.write_bytes({"truncated": data[: len(data) // 2], "garbage": b"x" * len(data), "empty": b""}[damage])
    with pytest.raises(HybridlabError) as e:
        read_tables([f"fertility={fertility}"])
    msg = one_line(e)
    assert str(fertility) in msg and "'fertility'" in msg
    assert "snakemake --force results/eval/smoke/fertility.parquet --config scale=smoke" in msg
    assert "make all SCALE=smoke" in msg


def test_damaged_table_outside_results_says_rerun_make(tmp_path):
    bad = tmp_path / "t.parquet"
    bad.write_bytes(b"PAR1 not really")
    with pytest.raises(HybridlabError) as e:
        read_tables([f"t={bad}"])
    assert "delete it and rerun `make all`" in one_line(e)


def test_figure_script_prints_one_line_for_a_damaged_table(fertility, tmp_path):
    """The figure job's own exit: one `error:` line on stderr, no traceback, exit 1, no output written."""
    fertility.write_bytes(fertility.read_bytes()[:40])
    code = (
        "import sys; sys.path.insert(0, 'workflow_scripts'); import _common\n"
        "from hybridlab.plots.registry import read_tables\n"
        f"_common.run(lambda: read_tables([{f'fertility={fertility}'!r}]))\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: table file ") and "Traceback" not in proc.stderr
    assert "snakemake --force" in lines[0]


# --- checkpoints -------------------------------------------------------------------------------------------

V = 7


class Tiny(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(V, 4)
        self.head = torch.nn.Linear(4, V)

    def forward(self, ids):
        return self.head(self.embed(ids))


class Task:
    def loss(self, model, batch):
        logits = model(batch[:, :-1])
        return torch.nn.functional.cross_entropy(logits.reshape(-1, V), batch[:, 1:].reshape(-1)), {}

    def num_tokens(self, batch):
        return batch[:, 1:].numel()


DATA = [torch.arange(i, i + 5) % V for i in range(10)]


def go(tmp_path, steps=2):
    c = TrainConfig(out_dir=str(tmp_path / "run"), steps=steps, micro_batch_size=2, ckpt_every=1, keep_last_k=2,
                    progress=False)
    torch.manual_seed(0)
    return train(Tiny(), Task(), DATA, c)


def test_checkpoint_has_a_manifest_of_every_file(tmp_path):
    ckpt = go(tmp_path).checkpoint
    listed = read_manifest(ckpt, "fix")
    assert set(listed) == {p.name for p in ckpt.iterdir()} - {MANIFEST}
    assert STATE_FILE in listed and ".metadata" in listed


@pytest.mark.parametrize("victim", [STATE_FILE, ".metadata", "__0_0.distcp"])
def test_checkpoint_edited_in_place_is_named(tmp_path, victim):
    """Same size, same mtime, one byte changed: only the checksum can tell, and it does."""
    ckpt = go(tmp_path).checkpoint
    f = ckpt / victim
    data, st = bytearray(f.read_bytes()), f.stat()
    data[len(data) // 2] ^= 0xFF
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))
    with pytest.raises(HybridlabError) as e:
        go(tmp_path)  # resuming must stop at the damaged file
    msg = one_line(e)
    assert str(f) in msg and "sha256" in msg and "delete it to resume from the previous checkpoint" in msg


def test_checkpoint_with_damaged_manifest_is_named(tmp_path):
    ckpt = go(tmp_path).checkpoint
    (ckpt / MANIFEST).write_text("not a checksum line\n")
    with pytest.raises(HybridlabError) as e:
        go(tmp_path)
    assert str(ckpt / MANIFEST) in one_line(e)


def test_checkpoint_without_manifest_still_resumes(tmp_path):
    """Checkpoints written before manifests existed are read as before."""
    go(tmp_path)
    (latest_checkpoint(tmp_path / "run" / "checkpoints") / MANIFEST).unlink()
    assert go(tmp_path).step == 2


# --- hybrid model directories ------------------------------------------------------------------------------

def _hybrid():
    torch.manual_seed(1)
    return tiny_hybrid([1], "gdn", seed=0, tie_word_embeddings=True, bos_token_id=None, eos_token_id=None,
                       pad_token_id=None)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A hybrid saved where the pipeline keeps students: results/models/smoke/students/.../"""
    root = tmp_path_factory.mktemp("hyb")
    d = save_hybrid(_hybrid(), root / "results" / "models" / "smoke" / "students" / "s0" / "last-gdn")
    return d


def _copy(saved, tmp_path):
    d = tmp_path / "results" / "models" / "smoke" / "students" / "s0" / "last-gdn"
    d.mkdir(parents=True)
    for f in saved.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    return d


def test_hybrid_json_records_the_sha256_of_every_other_file(saved):
    files = json.loads((saved / "hybrid.json").read_text())["files"]
    assert set(files) == {p.name for p in saved.iterdir()} - {"hybrid.json"}
    load_hybrid(saved)


def _flip_keep_mtime(f: Path, at: int) -> None:
    data, st = bytearray(f.read_bytes()), f.stat()
    data[at] ^= 0x01
    f.write_bytes(bytes(data))
    os.utime(f, ns=(st.st_atime_ns, st.st_mtime_ns))


HINT = "snakemake --force results/models/smoke/students/s0/last-gdn/config.json --config scale=smoke"


@pytest.mark.parametrize("case", ["weights_edited", "weights_header", "weights_truncated", "config_garbled",
                                  "config_missing", "spec_garbled", "spec_missing"])
def test_damaged_hybrid_directory_names_file_and_rebuild_command(saved, tmp_path, case):
    d = _copy(saved, tmp_path)
    w = d / "model.safetensors"
    if case == "weights_edited":
        _flip_keep_mtime(w, w.stat().st_size - 3)  # a weight value, past the header
    elif case == "weights_header":
        _flip_keep_mtime(w, 12)  # inside the JSON header
    elif case == "weights_truncated":
        w.write_bytes(w.read_bytes()[:100])
    elif case == "config_garbled":
        (d / "config.json").write_text("{garbled")
    elif case == "config_missing":
        (d / "config.json").unlink()
    elif case == "spec_garbled":
        (d / "hybrid.json").write_text('{"format": "hybridlab-hybrid", ')
    elif case == "spec_missing":
        (d / "hybrid.json").unlink()
    with pytest.raises(HybridlabError) as e:
        load_hybrid(d)
    msg = one_line(e)
    assert str(d) in msg and HINT in msg, msg
    if case.startswith("weights"):
        assert str(w) in msg
    if case == "weights_edited":
        assert "sha256" in msg


def test_hybrid_without_checksums_loads_and_still_checks_the_header(saved, tmp_path):
    """Directories written before checksums existed: loaded, and safetensors damage still named."""
    d = _copy(saved, tmp_path)
    spec = json.loads((d / "hybrid.json").read_text())
    del spec["files"]
    (d / "hybrid.json").write_text(json.dumps(spec))
    load_hybrid(d)
    (d / "model.safetensors").write_bytes(b"\xff" * 64)
    with pytest.raises(HybridlabError) as e:
        load_hybrid(d)
    assert str(d / "model.safetensors") in one_line(e)


# --- a pulled DVC file that does not match dvc.lock ---------------------------------------------------------

def dvc(repo: Path, *args: str) -> subprocess.CompletedProcess:
    proc = subprocess.run([sys.executable, "-m", "dvc", *args], cwd=repo, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return proc


@pytest.fixture
def dvc_repo(tmp_path, monkeypatch):
    """(repo, remote): a git + DVC repository whose `data` stage (3 files) is in dvc.lock and pushed to a
    local directory remote; the workspace copy is then deleted, as in a fresh clone."""
    for name in ("DVC_GLOBAL_CONFIG_DIR", "DVC_SYSTEM_CONFIG_DIR", "DVC_SITE_CACHE_DIR"):
        monkeypatch.setenv(name, str(tmp_path / name.lower()))
    monkeypatch.setenv("DVC_NO_ANALYTICS", "1")
    repo, remote = tmp_path / "repo", tmp_path / "remote"
    repo.mkdir()
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    dvc(repo, "init", "-q")
    out = repo / "results" / "data" / "smoke"
    out.mkdir(parents=True)
    for i in range(3):
        (out / f"part{i}.bin").write_bytes(os.urandom(50_000))
    (repo / "config.yaml").write_text("scale: smoke\n")
    (repo / "dvc.yaml").write_text("stages:\n  data:\n    cmd: snakemake data --config scale=smoke\n"
                                   "    outs:\n      - results/data/smoke\n")
    dvc(repo, "remote", "add", "-q", "-d", "local", str(remote))
    dvc(repo, "commit", "-q", "-f", "data")
    dvc(repo, "push", "-q")
    originals = {p.name: p.read_bytes() for p in out.iterdir()}
    import shutil

    shutil.rmtree(out)
    shutil.rmtree(repo / ".dvc" / "cache")
    return repo, remote, originals


@pytest.fixture
def no_snakemake(monkeypatch):
    """`cache.pull` without its Snakemake steps (DAG summary, touch, dry run): this repository has no Snakefile."""
    monkeypatch.setattr(cache, "complete_outputs", lambda repo, targets, scale: ["results/data/smoke/part0.bin"])
    monkeypatch.setattr(cache, "mark_complete", lambda repo, outputs, scale: None)
    monkeypatch.setattr(cache, "pending_jobs", lambda repo, targets, scale, extra=(): {})


def test_cache_pull_refuses_a_damaged_cached_file(dvc_repo, no_snakemake):
    repo, remote, originals = dvc_repo
    part = repo / "results" / "data" / "smoke" / "part1.bin"
    md5 = __import__("hashlib").md5(originals["part1.bin"]).hexdigest()
    obj = remote / "files" / "md5" / md5[:2] / md5[2:]
    good = obj.read_bytes()
    obj.chmod(0o644)
    obj.write_bytes(good[:-1] + bytes([good[-1] ^ 0xFF]))  # same size, one byte off
    with pytest.raises(HybridlabError) as e:
        cache.pull(["data"], repo=repo)
    msg = one_line(e)
    assert "results/data/smoke/part1.bin" in msg and "does not match its checksum in dvc.lock" in msg
    assert "snakemake --force results/data/smoke/part1.bin --config scale=smoke" in msg
    # refused: the damaged file and its cache object are gone, nothing was marked complete
    assert not part.exists() and not (repo / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]).exists()
    # once the remote holds a good copy again, the rerun completes
    obj.write_bytes(good)
    report = cache.pull(["data"], repo=repo)
    assert report.pulled == ["data"] and report.n_verified == 3
    assert {p.name: p.read_bytes() for p in part.parent.iterdir()} == originals
    assert not (repo / cache.PULL_RECORD).exists()

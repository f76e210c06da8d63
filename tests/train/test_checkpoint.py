"""Checkpoints: contents, atomicity, keep-last-k, corrupt/incompatible files, restart, RNG."""

import random

import numpy as np
import pytest
import torch
import torch.distributed.checkpoint as dcp
import torch.nn.functional as F
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.train.checkpoint import (
    STATE_FILE,
    capture_rng,
    latest_checkpoint,
    list_checkpoints,
    restore_rng,
)
from hybridlab.train.config import TrainConfig
from hybridlab.train.distributed import init_distributed
from hybridlab.train.fsdp import Engine
from hybridlab.train.loop import train

SHARDS = "__0_0.distcp"  # DCP's data file of rank 0

V = 7


class Tiny(nn.Module):
    def __init__(self, d=4):
        super().__init__()
        self.embed = nn.Embedding(V, d)
        self.head = nn.Linear(d, V)

    def forward(self, ids):
        return self.head(self.embed(ids))


class Task:
    def loss(self, model, batch):
        return F.cross_entropy(model(batch[:, :-1]).reshape(-1, V), batch[:, 1:].reshape(-1)), {}

    def num_tokens(self, batch):
        return batch[:, 1:].numel()


DATA = [torch.arange(i, i + 5) % V for i in range(10)]


def go(tmp_path, model=None, restart=False, **kw):
    c = TrainConfig(**{**dict(out_dir=str(tmp_path / "run"), steps=4, micro_batch_size=2, ckpt_every=1,
                              keep_last_k=2, progress=False, lr=1e-2), **kw})
    torch.manual_seed(0)
    return train(model or Tiny(), Task(), DATA, c, restart=restart)


def test_checkpoint_contents_and_keep_last_k(tmp_path):
    res = go(tmp_path)
    ckpts = list_checkpoints(tmp_path / "run" / "checkpoints")
    assert [s for s, _ in ckpts] == [3, 4]  # keep_last_k=2 of 1..4
    assert res.checkpoint == ckpts[-1][1]
    state = torch.load(res.checkpoint / STATE_FILE, weights_only=True)
    assert state["step"] == 4 and state["tokens"] == 4 * 2 * 4
    assert state["sampler"] == {"n": 10, "seed": 0, "epoch": 0, "index": 8}
    assert set(state["rng"][0]) == {"python", "numpy", "torch", "cuda"}
    assert state["optimizer"] == "adamw" and state["world_size"] == 1 and state["fingerprint"] is None
    # Every parameter has AdamW state, and the template records its shape for the load.
    assert set(state["optim_held"]) == {"embed.weight", "head.weight", "head.bias"}
    assert state["optim_held"]["head.weight"]["exp_avg"] == ([V, 4], "float32", True)
    assert (res.checkpoint / ".metadata").is_file() and (res.checkpoint / SHARDS).stat().st_size > 0


def test_a_weights_only_final_checkpoint_drops_the_optimiser_and_a_rerun_only_publishes(tmp_path):
    res = go(tmp_path, ckpt_every=2, keep_last_k=1, final_checkpoint="weights")
    assert [s for s, _ in list_checkpoints(tmp_path / "run" / "checkpoints")] == [4]
    state = torch.load(res.checkpoint / STATE_FILE, weights_only=True)
    assert state["weights_only"] is True and state["optim_held"] == {}
    stored = dcp.FileSystemReader(str(res.checkpoint)).read_metadata().state_dict_metadata
    assert sorted(stored) == ["model.embed.weight", "model.head.bias", "model.head.weight"]
    full = go(tmp_path / "full", ckpt_every=2, keep_last_k=1)  # the same run with the optimiser state kept
    assert (res.checkpoint / SHARDS).stat().st_size < 0.5 * (full.checkpoint / SHARDS).stat().st_size
    # A rerun resumes at the end (no update) and hands back the trained weights.
    trained = Tiny()
    again = go(tmp_path, model=trained, ckpt_every=2, keep_last_k=1, final_checkpoint="weights")
    assert again.step == 4 and again.tokens == res.tokens
    m = Tiny()
    go(tmp_path / "plain", model=m, ckpt_every=2, keep_last_k=1)
    for a, b in zip(trained.parameters(), m.parameters()):
        assert torch.equal(a, b)


def test_temp_dirs_are_ignored_and_latest_is_by_step(tmp_path):
    d = tmp_path / "c"
    (d / ".tmp_step_000000009").mkdir(parents=True)
    (d / "step_000000010").mkdir()
    (d / "step_000000002").mkdir()
    (d / "notes").mkdir()
    assert latest_checkpoint(d).name == "step_000000010"
    assert latest_checkpoint(tmp_path / "missing") is None


def test_nan_weights_are_found_by_name():
    m = Tiny()
    engine = Engine(m, init_distributed("cpu"))
    assert engine.all_finite() == (True, None)
    with torch.no_grad():
        m.head.bias[0] = float("nan")
    assert engine.all_finite() == (False, "head.bias")


@pytest.mark.parametrize("victim", [SHARDS, STATE_FILE, ".metadata"])
def test_truncated_file_names_file_and_fix(tmp_path, victim):
    res = go(tmp_path)
    f = res.checkpoint / victim
    f.write_bytes(f.read_bytes()[:50])
    with pytest.raises(HybridlabError) as e:
        go(tmp_path)  # rerunning the same command must stop at the corrupt file
    msg = str(e.value)
    # The state file is named itself; a damaged DCP file by its checkpoint directory.
    assert str(f if victim == STATE_FILE else res.checkpoint) in msg and "--restart" in msg and "\n" not in msg


def test_incompatible_model_shapes(tmp_path):
    go(tmp_path)
    with pytest.raises(HybridlabError, match="does not fit this model"):
        go(tmp_path, model=Tiny(d=6))


def test_different_config_hash_and_restart(tmp_path):
    go(tmp_path)
    with pytest.raises(HybridlabError, match="different training config"):
        go(tmp_path, lr=5e-3)
    # Cadence fields are not part of the hash: resuming with another ckpt_every is fine.
    assert go(tmp_path, ckpt_every=2).step == 4
    res = go(tmp_path, lr=5e-3, restart=True)
    assert res.step == 4
    state = torch.load(res.checkpoint / STATE_FILE, weights_only=True)
    assert state["config_hash"] == TrainConfig(out_dir="x", steps=4, micro_batch_size=2, lr=5e-3).config_hash()


def test_rng_roundtrip():
    random.seed(1), np.random.seed(1), torch.manual_seed(1)
    s = capture_rng()
    a = (random.random(), np.random.rand(), torch.rand(3))
    restore_rng(s)
    b = (random.random(), np.random.rand(), torch.rand(3))
    assert a[0] == b[0] and a[1] == b[1] and torch.equal(a[2], b[2])


def test_checkpoint_of_another_run_is_refused_and_kept(tmp_path):
    c = TrainConfig(out_dir=str(tmp_path / "run"), steps=2, micro_batch_size=2, ckpt_every=1, progress=False)
    torch.manual_seed(0)
    train(Tiny(), Task(), DATA, c, fingerprint="inputs-a")
    ckpt = latest_checkpoint(tmp_path / "run" / "checkpoints")
    before = {p.name: p.read_bytes() for p in ckpt.iterdir()}
    with pytest.raises(HybridlabError) as e:
        train(Tiny(), Task(), DATA, c, fingerprint="inputs-b")
    msg = str(e.value)
    assert "another run" in msg and "inputs-a" in msg and "--restart" in msg and "\n" not in msg
    assert {p.name: p.read_bytes() for p in ckpt.iterdir()} == before  # nothing overwritten


def test_cuda_rng_restores_the_devices_a_resumed_run_has(monkeypatch):
    # saved with 4 visible GPUs, resumed with 2: the first two states are restored, nothing indexes past them
    s = capture_rng()
    s["cuda"] = [torch.full((4,), i, dtype=torch.uint8) for i in range(4)]
    calls = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "set_rng_state", lambda state, device: calls.append((int(state[0]), device)))
    monkeypatch.setattr(torch.cuda, "set_rng_state_all", lambda states: pytest.fail("indexes every saved device"))
    restore_rng(s)
    assert calls == [(0, 0), (1, 1)]


def test_a_single_process_save_and_resume_print_no_distributed_warning(tmp_path):
    import warnings

    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        res = go(tmp_path)  # saves steps 1..4
        again = go(tmp_path)  # a rerun loads the last one
    assert res.step == again.step == 4
    assert not [w for w in seen if "torch.distributed is" in str(w.message)]


def test_sigterm_checkpoints_the_update_in_progress_and_the_rerun_resumes_to_the_same_weights(tmp_path):
    import os
    import signal

    from hybridlab.train.loop import Preempted

    def term_during_update_2(step, model, opt):
        if step == 1:  # the second update: SIGTERM arrives mid-update
            os.kill(os.getpid(), signal.SIGTERM)

    previous = signal.getsignal(signal.SIGTERM)
    c = TrainConfig(out_dir=str(tmp_path / "run"), steps=4, micro_batch_size=2, keep_last_k=2, progress=False,
                    lr=1e-2)  # no ckpt_every: only the end's checkpoint would be written
    torch.manual_seed(0)
    with pytest.raises(Preempted, match="stopped by SIGTERM after update 2 of 4; checkpoint .*step_000000002"):
        train(Tiny(), Task(), DATA, c, on_step_start=[term_during_update_2])
    assert signal.getsignal(signal.SIGTERM) == previous  # the handler lives only while training runs
    assert [s for s, _ in list_checkpoints(tmp_path / "run" / "checkpoints")] == [2]
    torch.manual_seed(0)
    resumed = Tiny()
    assert train(resumed, Task(), DATA, c).step == 4
    whole = Tiny()
    go(tmp_path / "whole", model=whole, ckpt_every=None)
    for a, b in zip(resumed.parameters(), whole.parameters()):
        assert torch.equal(a, b)

"""The same loop under `torchrun --nproc_per_node 2` (gloo, CPU) matches one process."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

import polars as pl
import pytest
import torch

from hybridlab.train.checkpoint import list_checkpoints
from hybridlab.train.distributed import BUCKET_NUMEL, _buckets, init_distributed

SCRIPT = r'''
import os, sys
import torch, torch.nn as nn, torch.nn.functional as F
from hybridlab.train.config import TrainConfig
from hybridlab.train.loop import train

V, D = 10, 8

class M(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Embedding(V, D)
        self.mlp = nn.Linear(D, D)
        self.rare = nn.Linear(D, D)  # used only by some micro-batches: some ranks get no grad
        self.head = nn.Linear(D, V)

    def forward(self, ids):
        h = self.embed(ids)
        h = h + torch.tanh(self.mlp(h))
        if (ids[:, 0] < 2).any():
            h = h + self.rare(h)
        return self.head(h)

class Task:
    def loss(self, model, batch):
        ids = batch["ids"]
        loss = F.cross_entropy(model(ids[:, :-1]).reshape(-1, V), ids[:, 1:].reshape(-1))
        return loss, {"first": ids[:, 0].float().mean()}
    def num_tokens(self, batch):
        return batch["ids"][:, 1:].numel()

data = [{"ids": (torch.arange(7) * (1 + i % 2) + i) % V} for i in range(13)]
torch.manual_seed(0)
model = M()
cfg = TrainConfig(out_dir=sys.argv[1], steps=5, micro_batch_size=2, grad_accum=4, lr=2e-2,
                  ckpt_every=2, log_every=1, progress=False, weight_decay=0.1)
train(model, Task(), data, cfg)
torch.save(model.state_dict(), os.path.join(sys.argv[1], f"final_rank{os.environ.get('RANK', '0')}.pt"))
'''


def _env():
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(k, None)
    return env


def _run(cmd):
    p = subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-4000:]


def test_two_gloo_processes_match_one_process(tmp_path):
    torchrun = shutil.which("torchrun", path=str(Path(sys.executable).parent))
    assert torchrun is not None
    script = tmp_path / "train_tiny.py"
    script.write_text(SCRIPT)
    one, two = tmp_path / "one", tmp_path / "two"
    _run([sys.executable, str(script), str(one)])
    _run([torchrun, "--standalone", "--nproc_per_node", "2", str(script), str(two)])

    a, b = pl.read_parquet(one / "metrics.parquet"), pl.read_parquet(two / "metrics.parquet")
    assert a["step"].to_list() == b["step"].to_list() == [1, 2, 3, 4, 5]
    assert a["tokens"].to_list() == b["tokens"].to_list()
    for col in ("loss", "grad_norm", "first", "lr"):
        assert a[col].to_list() == pytest.approx(b[col].to_list(), rel=1e-5, abs=1e-7), col
    w1 = torch.load(one / "final_rank0.pt")
    w2 = {r: torch.load(two / f"final_rank{r}.pt") for r in (0, 1)}
    for k in w1:
        assert torch.equal(w2[0][k], w2[1][k]), k  # ranks stay in sync
        torch.testing.assert_close(w2[0][k], w1[k], rtol=1e-5, atol=1e-6)
    assert not torch.equal(w1["rare.weight"], _initial_rare_weight())  # the rarely-used layer trained
    # Only rank 0 wrote: one metrics file, the usual checkpoints, no stray temp files.
    assert sorted(p.name for p in two.iterdir()) == ["checkpoints", "final_rank0.pt", "final_rank1.pt", "metrics.parquet"]
    assert [s for s, _ in list_checkpoints(two / "checkpoints")] == [4, 5]


def _initial_rare_weight():
    from torch import nn

    torch.manual_seed(0)
    nn.Embedding(10, 8), nn.Linear(8, 8)
    return nn.Linear(8, 8).weight.detach()


def test_single_process_context_and_buckets(monkeypatch):
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    ctx = init_distributed("cpu")
    assert (ctx.rank, ctx.world_size, ctx.enabled, ctx.device.type) == (0, 1, False, "cpu")
    t = torch.ones(3)
    assert torch.equal(ctx.all_reduce_sum_(t), torch.ones(3))
    big = torch.zeros(BUCKET_NUMEL)
    gs = [torch.zeros(3), torch.zeros(2, dtype=torch.float64), torch.zeros(4, dtype=torch.float64), big, torch.zeros(1)]
    assert [[tuple(g.shape) for g in b] for b in _buckets(gs)] == [[(3,)], [(2,), (4,)], [(BUCKET_NUMEL,)], [(1,)]]

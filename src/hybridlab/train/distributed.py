"""Data-parallel training under `torchrun` (env:// rendezvous; gloo on CPU, nccl on CUDA).

Without `WORLD_SIZE > 1` in the environment everything here is a no-op on a single process, so the
same loop runs unchanged on a laptop and on a cluster.

Gradients are synchronised by an explicit bucketed all-reduce (SUM) after the last micro-batch of
an update rather than by wrapping the model in `DistributedDataParallel`, because
(a) freeze schedules flip `requires_grad` mid-run, which DDP's reducer does not allow without
rebuilding it, and (b) tasks receive the plain module (its attributes, hooks, `config`), not a
wrapper. A parameter that got a gradient on *some* rank gets a zero gradient on the others before
the reduction, so the set of updated parameters equals the single-process set (a parameter is
updated iff any micro-batch of the global batch reached it). The loop divides each micro-batch loss
by the *global* number of micro-batches, so the summed gradient is the global-batch mean.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any, Iterable

import torch
import torch.distributed as dist
from torch import nn

from hybridlab.errors import HybridlabError

# Elements per all-reduce bucket: bounds the temporary flat buffer (100 MiB in fp32).
BUCKET_NUMEL = 1 << 25


@dataclass(frozen=True)
class DistContext:
    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    owns_group: bool  # we initialised the process group, so we destroy it

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    def barrier(self) -> None:
        if self.enabled:
            dist.barrier()

    def broadcast_module(self, model: nn.Module) -> None:
        """Make every rank start from rank 0's parameters and buffers (as DDP does)."""
        if not self.enabled:
            return
        with torch.no_grad():
            for t in list(model.parameters()) + list(model.buffers()):
                dist.broadcast(t.data, src=0)

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_reduce_grads(self, params: Iterable[torch.Tensor]) -> None:
        """Sum `.grad` over ranks in place (see module docstring for missing gradients)."""
        if not self.enabled:
            return
        params = [p for p in params if p.requires_grad]
        has_grad = torch.tensor([p.grad is not None for p in params], dtype=torch.int32, device=self.device)
        dist.all_reduce(has_grad, op=dist.ReduceOp.SUM)
        grads = []
        for p, n in zip(params, has_grad.tolist()):
            if n == 0:
                continue
            if p.grad is None:
                p.grad = torch.zeros_like(p)
            grads.append(p.grad)
        for bucket in _buckets(grads):
            flat = torch.cat([g.reshape(-1) for g in bucket])
            dist.all_reduce(flat, op=dist.ReduceOp.SUM)
            offset = 0
            for g in bucket:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


def _buckets(grads: list[torch.Tensor]) -> list[list[torch.Tensor]]:
    """Consecutive same-dtype groups of at most BUCKET_NUMEL elements (one tensor may exceed it)."""
    out: list[list[torch.Tensor]] = []
    size = 0
    for g in grads:
        if out and out[-1][0].dtype == g.dtype and size + g.numel() <= BUCKET_NUMEL:
            out[-1].append(g)
            size += g.numel()
        else:
            out.append([g])
            size = g.numel()
    return out


def resolve_device(pref: str, local_rank: int = 0) -> torch.device:
    if pref == "cuda" or (pref == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise HybridlabError("device=cuda but no CUDA device is visible; set device: cpu or auto")
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def init_distributed(device_pref: str) -> DistContext:
    """Read torchrun's env vars, pick the device and join (or reuse) the process group."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        return DistContext(0, 1, 0, resolve_device(device_pref), owns_group=False)
    missing = [k for k in ("RANK", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT") if k not in os.environ]
    if missing:
        raise HybridlabError(f"WORLD_SIZE={world} but {missing} are not set; launch with torchrun")
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    device = resolve_device(device_pref, local_rank)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    owns = not dist.is_initialized()
    if owns:
        dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo")
    return DistContext(rank, world, local_rank, device, owns_group=owns)

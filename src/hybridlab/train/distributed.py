"""The process group under `torchrun` (env:// rendezvous; gloo on CPU, nccl on CUDA).

Without `WORLD_SIZE > 1` in the environment everything here is a no-op on a single process, so the
same loop runs unchanged on a laptop and on a cluster. Sharding itself is FSDP2's
(`hybridlab.train.fsdp`); this module only joins the group, picks the device and offers the few
collectives the loop needs for scalars (loss sums, RNG states).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from hybridlab.device import resolve_device
from hybridlab.errors import HybridlabError

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

    def all_reduce_sum_(self, t: torch.Tensor) -> torch.Tensor:
        if self.enabled:
            dist.all_reduce(t, op=dist.ReduceOp.SUM)
        return t

    def all_gather_object(self, obj: Any) -> list[Any]:
        if not self.enabled:
            return [obj]
        out: list[Any] = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

    def close(self) -> None:
        if self.owns_group and dist.is_initialized():
            dist.destroy_process_group()


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

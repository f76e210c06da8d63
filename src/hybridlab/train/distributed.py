"""The process group under `torchrun` (env:// rendezvous; gloo on CPU, nccl on CUDA).

Without `WORLD_SIZE > 1` in the environment everything here is a no-op on a single process, so the
same loop runs unchanged on a laptop and on a cluster. `init_distributed(..., fsdp="always")` makes a
one-process group (an in-memory store, no rendezvous) so the engine shards with FSDP2 at world size 1
too: the same code path, memory layout and bf16 parameters as a multi-GPU run, on one device. Sharding itself is FSDP2's
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
    grouped: bool = False  # a process group is active even at world size 1 (fsdp="always")

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def enabled(self) -> bool:
        return self.world_size > 1

    @property
    def shards(self) -> bool:
        """Whether the engine shards with FSDP2: more than one process, or a one-process group."""
        return self.enabled or self.grouped

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


FSDP_MODES = ("auto", "always")


def init_distributed(device_pref: str, fsdp: str = "auto") -> DistContext:
    """Read torchrun's env vars, pick the device and join (or reuse) the process group.

    `fsdp`: "auto" shards only under torchrun with more than one process; "always" also gives a single
    process a group of one, so the engine shards it.
    """
    if fsdp not in FSDP_MODES:
        raise HybridlabError(f"fsdp={fsdp!r}: must be one of {FSDP_MODES}")
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world <= 1:
        device = resolve_device(device_pref)
        if fsdp != "always":
            return DistContext(0, 1, 0, device, owns_group=False)
        if device.type == "cuda":
            torch.cuda.set_device(device.index or 0)
        owns = not dist.is_initialized()
        if owns:
            dist.init_process_group(backend="nccl" if device.type == "cuda" else "gloo", store=dist.HashStore(),
                                    rank=0, world_size=1)
        return DistContext(0, 1, 0, device, owns_group=owns, grouped=True)
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
    return DistContext(rank, world, local_rank, device, owns_group=owns, grouped=True)

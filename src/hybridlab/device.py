"""The one device policy: which torch device a job runs on.

`resolve_device(pref, local_rank)`: "auto" (or None) is the local GPU `cuda:<local_rank>` when CUDA is
available, else the CPU; "cpu" is the CPU; "cuda" is `cuda:<local_rank>` and a one-line `HybridlabError`
when no GPU is visible (so is an explicit "cuda:<n>"). Training (`hybridlab.train.distributed`) and the
analyses (`hybridlab.eval`) all call it. Imports only torch and `hybridlab.errors`, so it sits below every layer.

`bf16_is_fast(device_type)`: whether bf16 matmuls beat fp32 ones on this device, the rule behind the
"fast" precision and dtype settings: on CUDA, and on CPUs with AMX tiles (bf16 matrix units). A CPU with
AVX512-BF16 but no AMX runs bf16 GEMMs at about half its fp32 rate (oneDNN converts and accumulates per
vector), so there "fast" is fp32.
"""

from __future__ import annotations

import functools
import re
from pathlib import Path

import torch

from hybridlab.errors import HybridlabError

DEVICES = ("auto", "cpu", "cuda")


def resolve_device(pref: str | torch.device | None = "auto", local_rank: int = 0) -> torch.device:
    """The device for preference `pref` on local rank `local_rank`: one of DEVICES (None means "auto"),
    an explicit "cuda:<n>", or a torch.device (returned as it is)."""
    if isinstance(pref, torch.device):
        return pref
    pref = "auto" if pref is None else pref
    explicit = isinstance(pref, str) and re.fullmatch(r"cuda:\d+", pref) is not None
    if pref not in DEVICES and not explicit:
        raise HybridlabError(f"device={pref!r} is not a device choice; use one of {', '.join(DEVICES)} (or cuda:<n>)")
    if pref == "cuda" or explicit or (pref == "auto" and torch.cuda.is_available()):
        if not torch.cuda.is_available():
            raise HybridlabError(f"device={pref} but no CUDA device is visible; set device: cpu or auto")
        return torch.device(pref) if explicit else torch.device("cuda", local_rank)
    return torch.device("cpu")


@functools.lru_cache(maxsize=None)
def _cpu_has_amx() -> bool:
    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    if init is not None:
        return bool(init())
    try:
        return "amx_tile" in Path("/proc/cpuinfo").read_text().split()
    except OSError:
        return False


def bf16_is_fast(device_type: str) -> bool:
    """True where bf16 matmuls run faster than fp32 ones: CUDA, or a CPU with AMX (see the module docstring)."""
    return device_type == "cuda" or (device_type == "cpu" and _cpu_has_amx())


def fast_dtype(dtype, device_type: str):
    """`dtype` with "fast" replaced by "bfloat16" where `bf16_is_fast(device_type)`, else "float32"; any other
    value unchanged (the one place the "fast" dtype setting is resolved)."""
    if dtype != "fast":
        return dtype
    return "bfloat16" if bf16_is_fast(device_type) else "float32"

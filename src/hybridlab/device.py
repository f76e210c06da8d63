"""The one device policy: which torch device a job runs on.

`resolve_device(pref, local_rank)`: "auto" (or None) is the local GPU `cuda:<local_rank>` when CUDA is
available, else the CPU; "cpu" is the CPU; "cuda" is `cuda:<local_rank>` and a one-line `HybridlabError`
when no GPU is visible (so is an explicit "cuda:<n>"). Training (`hybridlab.train.distributed`) and the
analyses (`hybridlab.eval`) all call it. Imports only torch and `hybridlab.errors`, so it sits below every layer.

`bf16_is_fast(device_type)`: whether bf16 matmuls beat fp32 ones on this device, the rule behind the
"fast" precision and dtype settings: on CUDA, and on CPUs with AMX tiles (bf16 matrix units). A CPU with
AVX512-BF16 but no AMX differs by core: some run bf16 GEMMs at about half their fp32 rate, others (full-width
bf16 dot products) at several times it. There the answer is measured once per process, a model-shaped GEMM
timed in both dtypes, and bf16 counts as fast when it is at least `BF16_MIN_SPEEDUP` times quicker. A CPU
with neither has no bf16 arithmetic (bf16 is converted to fp32), so "fast" is fp32 there without a test.
"""

from __future__ import annotations

import functools
import re
import time
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


def _cpu_flags() -> set[str]:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


@functools.lru_cache(maxsize=None)
def _cpu_has_amx() -> bool:
    init = getattr(getattr(torch._C, "_cpu", None), "_init_amx", None)
    if init is not None:
        return bool(init())
    return "amx_tile" in _cpu_flags()


BF16_MIN_SPEEDUP = 1.5  # measured bf16/fp32 GEMM speed ratio above which a CPU without AMX runs "fast" as bf16


def _gemm_seconds(dtype: torch.dtype, repeats: int = 5) -> float:
    """Best-of-`repeats` time of one [1024, 576] x [576, 1536] product (a 135M-class MLP projection)."""
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(1024, 576, generator=gen).to(dtype)
    b = torch.randn(576, 1536, generator=gen).to(dtype)
    a @ b  # first call: kernel selection and allocation
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - t0)
    return best


def cpu_bf16_speedup() -> float:
    """fp32 time over bf16 time of the same GEMM on this CPU (above 1: bf16 is quicker)."""
    return _gemm_seconds(torch.float32) / _gemm_seconds(torch.bfloat16)


@functools.lru_cache(maxsize=None)
def _cpu_bf16_fast() -> bool:
    if _cpu_has_amx():
        return True
    if "avx512_bf16" not in _cpu_flags():
        return False
    return cpu_bf16_speedup() >= BF16_MIN_SPEEDUP


def bf16_is_fast(device_type: str) -> bool:
    """True where bf16 matmuls run faster than fp32 ones: CUDA, a CPU with AMX, or a CPU with AVX512-BF16 where
    a side-by-side GEMM measures bf16 at least BF16_MIN_SPEEDUP times quicker (see the module docstring)."""
    return device_type == "cuda" or (device_type == "cpu" and _cpu_bf16_fast())


def fast_dtype(dtype, device_type: str):
    """`dtype` with "fast" replaced by "bfloat16" where `bf16_is_fast(device_type)`, else "float32"; any other
    value unchanged (the one place the "fast" dtype setting is resolved)."""
    if dtype != "fast":
        return dtype
    return "bfloat16" if bf16_is_fast(device_type) else "float32"

"""Keep freed heap memory in the process, so a training step does not page-fault its tensors in again.

A training step allocates and frees the same few hundred MB of activations every update. glibc's malloc
hands large blocks (by default above a threshold that adapts up to 32 MiB) to the kernel with mmap and
gives freed heap top back with `trim`, so each update's tensors are fresh pages and every 4 KiB page is a
page fault when first written. On a KVM guest a fault costs about a microsecond: the tiny teacher's update took
~89k faults, 1.08-1.17x its time (docs/performance.md, "Freed memory and page faults").

`retain_freed_memory()` sets glibc's `M_MMAP_THRESHOLD` to its maximum (32 MiB: smaller blocks come from the
heap) and `M_TRIM_THRESHOLD` to 2 GiB (freed memory stays with the process for the next update). The
process's resident memory then stays at its high-water mark instead of falling between updates. It is a
no-op off glibc (musl, macOS, Windows) and when `HYBRIDLAB_RETAIN_FREED_MEMORY=0`. Torch-free, so every
workflow script can call it at start-up.
"""

from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD = -1  # glibc's mallopt parameter numbers (malloc.h)
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD_BYTES = 32 << 20  # glibc's maximum on 64-bit (HEAP_MAX_SIZE / 2); larger values are refused
TRIM_THRESHOLD_BYTES = 2**31 - 1  # mallopt takes an int
ENV = "HYBRIDLAB_RETAIN_FREED_MEMORY"


def retain_freed_memory() -> bool:
    """Apply the two malloc settings above; True when glibc took both, False where it does not apply."""
    if os.environ.get(ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # glibc exports it; musl does not
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES)) and bool(mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD_BYTES))

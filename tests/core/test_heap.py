"""`hybridlab.heap.retain_freed_memory`: freed blocks stay with the process, so re-allocating them costs no
page faults (measured in a fresh interpreter: the settings are process-wide)."""

import subprocess
import sys

import pytest

from hybridlab import heap

# Allocate 40 blocks of 8 MiB, write them, free them all, then do it again and count the minor page faults of
# the second round: without the settings glibc returns the blocks to the kernel (mmap'd, or trimmed off the
# heap top), so each of the second round's 40 x 2048 pages faults again.
PROBE = r"""
import ctypes, resource, sys
sys.path.insert(0, sys.argv[1])
from hybridlab.heap import retain_freed_memory
took = retain_freed_memory()
libc = ctypes.CDLL(None)
libc.malloc.restype = ctypes.c_void_p
libc.free.argtypes = [ctypes.c_void_p]
def round_trip():
    blocks = [libc.malloc(8 << 20) for _ in range(40)]
    for b in blocks:
        ctypes.memset(b, 1, 8 << 20)
    for b in blocks:
        libc.free(b)
round_trip()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
round_trip()
print(took, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES = 40 * (8 << 20) // 4096


def second_round_faults(monkeypatch, retain: str) -> tuple[str, int]:
    monkeypatch.setenv(heap.ENV, retain)
    src = str(heap.__file__).rsplit("/hybridlab/", 1)[0]
    out = subprocess.run([sys.executable, "-c", PROBE, src], capture_output=True, text=True, check=True).stdout
    took, faults = out.split()
    return took, int(faults)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc malloc settings")
def test_freed_blocks_are_reused_without_page_faults(monkeypatch):
    took, faults = second_round_faults(monkeypatch, "1")
    if took != "True":
        pytest.skip("not glibc: retain_freed_memory() is a no-op here")
    assert faults < PAGES // 20, f"{faults} page faults re-allocating retained memory ({PAGES} pages)"
    took_off, faults_off = second_round_faults(monkeypatch, "0")
    assert took_off == "False"
    assert faults_off > PAGES // 2, "glibc kept the blocks by itself: the probe no longer shows the difference"

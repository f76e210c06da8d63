"""Shared pieces of the benchmark scripts: this machine's fp32 matmul throughput and analytic op FLOPs.

- `measure_matmul_gflops(sizes, reps)`: fp32 GEMM throughput (2 n^3 FLOPs per n x n product) at the
  current torch thread count, the median of `reps` timed products per size after one untimed warm-up
  product; returns GFLOP/s per size. The best size is the "measured matmul throughput" that model
  FLOP utilisation (MFU) is reported against.
- `chunked_op_matmul_flops(kind, chunks, K, V, C)`: matmul FLOPs (2 per multiply-add) of the
  project's chunked CPU recurrent ops (`hybridlab.models.ops`) over `chunks` (chunk, batch x head)
  tiles of C tokens, as (forward, forward + backward). Only the batched products are counted; the
  triangular inverse, the decay exponentials and other element-wise work are not.
  * GDN forward: K K^T, Q K^T (C^2 K each); T X, P V_new (C^2 V each); K_bg S, K_d^T V_new, Q_g S
    (C K V each), with X = V_b - K_bg S (W = T K_bg is never formed). Its hand-written backward (ops/gdn.py) does 3 products of C^2 K, 4 of C^2 V
    and 6 of C K V.
  * KDA forward: the per-channel scores of q and k rows against k (per row set: C^2 K for the
    off-diagonal sub-chunk blocks + c C K element-wise for the diagonal ones, c = sub-chunk size),
    T X and P V_new (C^2 V each), K_bg S, K_d^T V_new, Q_g S (C K V each), with X = V_b - K_bg S
    (W = T K_bg is never formed). GLA: the q scores (C^2 K + c C K), P V (C^2 V), Q_g S and K_d^T V
    (C K V each). Their hand-written backward (ops/per_channel.py) does two products per forward product:
    forward + backward = 3 x forward.
- `int_at_least(minimum)`: an argparse type for counts, so a bad value is a one-line usage error.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from hybridlab.heap import retain_freed_memory
from hybridlab.models.ops.common import sub_chunk_size

retain_freed_memory()  # as every pipeline job runs (workflow_scripts/_common.py); HYBRIDLAB_RETAIN_FREED_MEMORY=0 to compare

RECURRENT_KINDS = ("gdn", "kda", "gla")


def measure_matmul_gflops(sizes: tuple[int, ...] = (1024, 2048), reps: int = 5) -> dict[int, float]:
    """fp32 GEMM GFLOP/s per square size n (median of `reps` timed n x n products)."""
    out = {}
    for n in sizes:
        a, b = torch.randn(n, n), torch.randn(n, n)
        c = a @ b  # warm-up: allocates the output, wakes the thread pool
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            torch.matmul(a, b, out=c)
            times.append(time.perf_counter() - start)
        out[n] = 2 * n**3 / statistics.median(times) / 1e9
    return out


def tile_matmul_flops(kind: str, K: int, V: int, C: int) -> dict[str, tuple[int, int]]:
    """(forward, forward + backward) matmul FLOPs of one C-token tile of the chunked `kind` op, by product shape:
    `scores` ([C, K] @ [K, C]; KDA/GLA's sub-chunk products counted here too), `values` ([C, C] @ [C, V]) and
    `state` ([C, K] @ [K, V] and [K, C] @ [C, V]). GDN's hand-written backward has its own counts; KDA's and
    GLA's are 2 x their forward."""
    if kind not in RECURRENT_KINDS:
        raise ValueError(f"unknown recurrent op {kind!r}; use one of {RECURRENT_KINDS}")
    c = sub_chunk_size(C)
    if kind == "gdn":
        return {"scores": (2 * 2 * C * C * K, 2 * 5 * C * C * K), "values": (2 * 2 * C * C * V, 2 * 6 * C * C * V),
                "state": (2 * 3 * C * K * V, 2 * 9 * C * K * V)}
    if kind == "kda":
        fwd = {"scores": 2 * (2 * C * C * K + 2 * c * C * K), "values": 2 * 2 * C * C * V, "state": 2 * 3 * C * K * V}
    else:
        fwd = {"scores": 2 * (C * C * K + c * C * K), "values": 2 * C * C * V, "state": 2 * 2 * C * K * V}
    return {name: (f, 3 * f) for name, f in fwd.items()}


def chunked_op_matmul_flops(kind: str, chunks: int, K: int, V: int, C: int) -> tuple[float, float]:
    """(forward, forward + backward) matmul FLOPs of the chunked `kind` op over `chunks` tiles of C tokens."""
    tile = tile_matmul_flops(kind, K, V, C).values()
    return chunks * sum(f for f, _ in tile), chunks * sum(fb for _, fb in tile)


def best_seconds(fn, reps: int = 5, clock=time.perf_counter) -> float:
    """The shortest of `reps` timed calls of `fn`, after one untimed warm-up call."""
    fn()
    best = float("inf")
    for _ in range(reps):
        start = clock()
        fn()
        best = min(best, clock() - start)
    return best


def int_at_least(minimum: int):
    """argparse type: an integer >= `minimum`, else a one-line usage error."""
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{value} must be >= {minimum}")
        return value
    return parse

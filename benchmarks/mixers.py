"""CPU benchmark of the chunked recurrent-mixer ops against the public PyTorch references.

Shapes: B=4, T=1024, H=4, K=64, V=128, fp32, chunk 64, default torch threads. For each op it times the
forward (under ``no_grad``) and forward+backward of

- GDN: ``hybridlab`` chunked op | fla's ``naive_chunk_gated_delta_rule`` | transformers' Qwen3.5
  fallback ``torch_chunk_gated_delta_rule`` (unwrapped: the decorated name routes to fla's Triton
  kernels whenever fla is installed, which cannot run on CPU);
- KDA: ``hybridlab`` chunked op | fla's ``naive_chunk_kda``;
- GLA: ``hybridlab`` chunked op | fla's ``naive_recurrent_gla`` (fla 0.6 ships no naive chunked GLA).

The references run at their default chunk of 64. ``hybridlab``'s GDN runs at ``--gdn-chunk`` (default
32): the chunk is only a tiling parameter of the op (its result does not depend on it), and on CPU 32
is the faster tile at these shapes (smaller C x C work per token; see ``ops/gdn.py``). Pass
``--gdn-chunk 64`` to time it at the references' tile.

Contenders run interleaved, round after round, so background load hits them alike; the reported
time is the median over rounds after one warm-up round (the JSON also has the minimum), and each
speed-up is the ratio of those medians. The per-round ratios (same round, back to back) are printed
as a range and kept in the JSON, so a run shows how much the machine moved under it: on the 2-core
2-core AMD EPYC (Zen 5) machine single runs of the GDN comparison ranged 3.7-4.8x while the median of runs was 4.2x
(fla's naive chunk alone swings 140-170 ms with the page faults of its autograd graph). Other
processes on the machine distort the ratios (every op is an OpenMP barrier that waits for a
descheduled thread), so compare on an otherwise idle machine. It also measures this machine's fp32 matmul
throughput and reports, for each ``hybridlab`` op, the achieved fraction of it from an analytic count
of the op's matmul FLOPs (triangular inverses and element-wise work not counted), and why a share target
is met or missed: an estimate of the rate of the ops' own products at their tile shapes, batched and weighted
by the op's FLOPs in each shape (`tile_gemm_gflops`), and the part of the op's time they would need to take at
that rate to meet the target.
The last printed line is one JSON object with every time and ratio.

    python benchmarks/mixers.py [--reps 9] [--ops gdn kda gla]
"""

from __future__ import annotations

import argparse
import inspect
import json
import statistics
import time
import warnings

import torch
import torch.nn.functional as F

from _common import best_seconds, chunked_op_matmul_flops, int_at_least, measure_matmul_gflops, tile_matmul_flops
from _machine import describe, describe_line
from hybridlab.models import ops

with warnings.catch_warnings():  # fla warns that Triton cannot run on a CPU-only machine
    warnings.simplefilter("ignore")
    from fla.ops.gated_delta_rule.naive import naive_chunk_gated_delta_rule
    from fla.ops.gla.naive import naive_recurrent_gla
    from fla.ops.kda.naive import naive_chunk_kda
    from transformers.models.qwen3_5 import modeling_qwen3_5

B, T, H, K, V, C = 4, 1024, 4, 64, 128, 64
TARGETS = {  # minimum fwd+bwd speed-ups asked of the hybridlab ops
    ("gdn", "transformers_fallback"): 2.0,
    ("gdn", "fla_naive_chunk"): 4.0,
    ("kda", "fla_naive_chunk"): 3.0,
    ("gla", "fla_naive_recurrent"): 3.0,
}
SHARE_TARGETS = {"gdn": 0.40, "kda": 0.30, "gla": 0.30}  # minimum fwd+bwd share of matmul throughput


def transformers_fallback():
    fn = inspect.unwrap(modeling_qwen3_5.torch_chunk_gated_delta_rule)
    if not fn.__code__.co_filename.endswith("modeling_qwen3_5.py"):
        raise SystemExit(f"could not unwrap transformers' torch_chunk_gated_delta_rule (got {fn})")
    return fn


def make_inputs(per_channel_g: bool, seed: int = 0) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    g_shape = (B, T, H, K) if per_channel_g else (B, T, H)
    g = F.logsigmoid(torch.randn(g_shape, generator=gen))
    return {
        "q": torch.randn(B, T, H, K, generator=gen),
        "k": F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1),
        "v": torch.randn(B, T, H, V, generator=gen),
        "g": g / 16 if per_channel_g else g,  # fla's GLA gate_logit_normalizer scale for channel decays
        "beta": torch.rand(B, T, H, generator=gen).sigmoid(),
    }


def matmul_flops(kind: str, C: int = C) -> tuple[float, float]:
    """Analytic matmul FLOPs (forward, forward+backward) of the hybridlab chunked op at these shapes."""
    return chunked_op_matmul_flops(kind, B * H * T // C, K, V, C)


def tile_gemm_gflops(kind: str, chunk: int, reps: int = 5) -> float:
    """Estimated GFLOP/s of the `kind` op's matrix products if all of them ran batched over the B*H*T/chunk tiles:
    each product shape timed alone (best of `reps`), weighted by the op's fwd+bwd FLOPs in that shape
    (`_common.tile_matmul_flops`). An estimate of what this CPU's GEMMs give at the op's sizes, not a bound: the
    op's real products are partly smaller (the chunk scan's are per tile)."""
    n = B * H * T // chunk
    shapes = {"scores": [((n, chunk, K), (n, K, chunk))], "values": [((n, chunk, chunk), (n, chunk, V))],
              "state": [((n, chunk, K), (n, K, V)), ((n, K, chunk), (n, chunk, V))]}
    rate = {}
    for family, pairs in shapes.items():
        flops = seconds = 0.0
        for a_shape, b_shape in pairs:
            a, b = torch.randn(a_shape), torch.randn(b_shape)
            out = torch.empty(n, a_shape[1], b_shape[-1])
            seconds += best_seconds(lambda a=a, b=b, out=out: torch.bmm(a, b, out=out), reps)
            flops += 2 * a.numel() * b_shape[-1]
        rate[family] = flops / seconds
    work = {family: fwdbwd for family, (_, fwdbwd) in tile_matmul_flops(kind, K, V, chunk).items()}
    return sum(work.values()) / sum(f / rate[family] for family, f in work.items()) / 1e9


def contenders(kind: str, gdn_chunk: int):
    """name -> function(inputs) returning the output ``[B, T, H, V]``."""
    if kind == "gdn":
        fallback = transformers_fallback()
        return {
            "hybridlab": lambda x: ops.chunk_gated_delta_rule(
                x["q"], x["k"], x["v"], x["g"], x["beta"], chunk_size=gdn_chunk
            )[0],
            "fla_naive_chunk": lambda x: naive_chunk_gated_delta_rule(x["q"], x["k"], x["v"], x["g"], x["beta"])[0],
            "transformers_fallback": lambda x: fallback(x["q"], x["k"], x["v"], x["g"], x["beta"])[0],
        }
    if kind == "kda":
        return {
            "hybridlab": lambda x: ops.chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])[0],
            "fla_naive_chunk": lambda x: naive_chunk_kda(x["q"], x["k"], x["v"], x["g"], x["beta"])[0],
        }
    return {
        "hybridlab": lambda x: ops.chunk_gla(x["q"], x["k"], x["v"], x["g"])[0],
        "fla_naive_recurrent": lambda x: naive_recurrent_gla(x["q"], x["k"], x["v"], x["g"])[0],
    }


def time_once(fn, inputs, backward: bool) -> float:
    for t in inputs.values():
        t.grad = None
    start = time.perf_counter()
    if backward:
        fn(inputs).sum().backward()
    else:
        with torch.no_grad():
            fn(inputs)
    return time.perf_counter() - start


def bench_op(kind: str, reps: int, peak_gflops: float, gdn_chunk: int) -> dict:
    inputs = {name: t.requires_grad_() for name, t in make_inputs(kind != "gdn").items()}
    if kind == "gla":
        del inputs["beta"]
    fns = contenders(kind, gdn_chunk)
    times = {name: {"fwd": [], "fwdbwd": []} for name in fns}
    for round_idx in range(reps + 1):  # the first round is the warm-up
        for name, fn in fns.items():
            fwd, fwdbwd = time_once(fn, inputs, False), time_once(fn, inputs, True)
            if round_idx:
                times[name]["fwd"].append(fwd)
                times[name]["fwdbwd"].append(fwdbwd)
    result = {}
    for name in fns:
        for mode in ("fwd", "fwdbwd"):
            result[f"{name}_{mode}_ms"] = 1e3 * statistics.median(times[name][mode])
            result[f"{name}_{mode}_min_ms"] = 1e3 * min(times[name][mode])  # least disturbed by other load
    for name in fns:
        if name == "hybridlab":
            continue
        for mode in ("fwd", "fwdbwd"):
            result[f"speedup_{mode}_vs_{name}"] = result[f"{name}_{mode}_ms"] / result[f"hybridlab_{mode}_ms"]
            per_round = [a / b for a, b in zip(times[name][mode], times["hybridlab"][mode])]
            result[f"speedup_{mode}_vs_{name}_per_round"] = per_round
    flops_fwd, flops_fwdbwd = matmul_flops(kind, gdn_chunk if kind == "gdn" else C)
    for mode, flops in (("fwd", flops_fwd), ("fwdbwd", flops_fwdbwd)):
        gflops = flops / (result[f"hybridlab_{mode}_ms"] / 1e3) / 1e9
        result[f"hybridlab_{mode}_gflops"] = gflops
        result[f"hybridlab_{mode}_fraction_of_matmul_peak"] = gflops / peak_gflops
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--reps", type=int_at_least(1), default=9, help="timed rounds per contender (median reported)")
    parser.add_argument("--ops", nargs="+", default=["gdn", "kda", "gla"], choices=["gdn", "kda", "gla"])
    parser.add_argument("--gdn-chunk", type=int_at_least(1), default=32, help="chunk (tile) of hybridlab's GDN op")
    args = parser.parse_args()
    torch.manual_seed(0)
    machine = describe()
    print(describe_line(machine))
    peak = max(measure_matmul_gflops().values())
    print(f"shapes B={B} T={T} H={H} K={K} V={V} chunk={C} (hybridlab GDN: {args.gdn_chunk}) fp32, "
          f"threads={torch.get_num_threads()}")
    print(f"fp32 matmul throughput (2048^3): {peak:.1f} GFLOP/s")
    report = {"shapes": {"B": B, "T": T, "H": H, "K": K, "V": V, "chunk": C, "hybridlab_gdn_chunk": args.gdn_chunk},
              "threads": torch.get_num_threads(), "matmul_gflops": peak, "machine": machine}
    for kind in args.ops:
        res = bench_op(kind, args.reps, peak, args.gdn_chunk)
        report[kind] = res
        names = [key[: -len("_fwd_ms")] for key in res if key.endswith("_fwd_ms")]
        print(f"\n{kind.upper()}")
        for name in names:
            print(f"  {name:24s} fwd {res[f'{name}_fwd_ms']:9.1f} ms   fwd+bwd {res[f'{name}_fwdbwd_ms']:9.1f} ms")
        for name in names[1:]:
            rounds = res[f"speedup_fwdbwd_vs_{name}_per_round"]
            print(f"  speed-up vs {name:22s} fwd {res[f'speedup_fwd_vs_{name}']:5.2f}x   "
                  f"fwd+bwd {res[f'speedup_fwdbwd_vs_{name}']:5.2f}x (rounds {min(rounds):.2f}-{max(rounds):.2f}x)")
        print(f"  hybridlab achieved {res['hybridlab_fwd_gflops']:.1f} / {res['hybridlab_fwdbwd_gflops']:.1f} "
              f"GFLOP/s (fwd / fwd+bwd) = {100 * res['hybridlab_fwd_fraction_of_matmul_peak']:.0f}% / "
              f"{100 * res['hybridlab_fwdbwd_fraction_of_matmul_peak']:.0f}% of matmul throughput")
        tile = args.gdn_chunk if kind == "gdn" else C
        res["tile_gemm_gflops"] = tile_gemm_gflops(kind, tile)
        res["tile_gemm_fraction_of_matmul_peak"] = res["tile_gemm_gflops"] / peak
        line = (f"  its products at their tile shapes (chunk {tile}), batched over all tiles, timed alone and weighted "
                f"by its FLOPs in each: an estimated {res['tile_gemm_gflops']:.1f} GFLOP/s = "
                f"{100 * res['tile_gemm_fraction_of_matmul_peak']:.0f}% of matmul throughput; the op's rate is "
                f"{100 * res['hybridlab_fwdbwd_gflops'] / res['tile_gemm_gflops']:.0f}% of that, so at that rate its "
                "GEMMs would take that part of its time")
        share = SHARE_TARGETS.get(kind)
        if share is not None and res["hybridlab_fwdbwd_fraction_of_matmul_peak"] < share:
            need = share / res["tile_gemm_fraction_of_matmul_peak"]
            line += (f". Target {100 * share:.0f}% missed: " + (
                f"its GEMMs would have to take {100 * need:.0f}% of its time at that rate (the rest: element-wise "
                "passes, layout copies and the chunk scan, see benchmarks/profile_ops.py)" if need < 1 else
                "above what its products reach at these shapes on this CPU: unreachable by cutting the rest"))
        print(line)
    met = {}
    for (kind, other), target in TARGETS.items():
        if kind in report:
            met[f"{kind}_fwdbwd_vs_{other}>={target:g}x"] = report[kind][f"speedup_fwdbwd_vs_{other}"] >= target
    for kind, share in SHARE_TARGETS.items():
        if kind in report:
            met[f"{kind}_fwdbwd_share_of_matmul>={share:g}"] = (
                report[kind]["hybridlab_fwdbwd_fraction_of_matmul_peak"] >= share)
    report["targets_met"] = met
    print("\ntargets:", ", ".join(f"{k}: {'met' if v else 'MISSED'}" for k, v in met.items()))
    print(json.dumps(report, sort_keys=True))


if __name__ == "__main__":
    main()

"""Kernel stage of the GPU acceptance script: fla's chunked kernels against the project's CPU ops.

For each op (GDN `chunk_gated_delta_rule`, KDA `chunk_kda`, GLA `chunk_gla`) and input dtype (fp32,
bf16), called as the mixers call them (q/k/v in the dtype, log-decay g and beta in fp32, an fp32
initial state, the final state returned, q/k L2-normalised in the kernel for GDN and KDA):

- candidate: `hybridlab.models.ops.chunk_*` on the device tensors. On CUDA that is fla's Triton kernel;
  in the dry run (CPU) it is the project's chunked CPU op.
- reference: the same inputs (the dtype-rounded values, so only the kernel's arithmetic differs)
  copied to the CPU in fp64, through the project's chunked CPU op on CUDA runs, or through the naive
  per-token recurrence (`naive_recurrent_*`) in the dry run.
- both get the same fixed random upstream gradients for the output and the final state, so their
  input gradients are directly comparable (a linear loss: the upstream gradient does not depend on
  the forward's error).

Measured: `max_rel_err` = max |x - x_ref| / max |x_ref| of the output and final state (normwise, so
near-zero entries do not blow up the ratio), and per input gradient its cosine to the reference and
norm ratio. fla has shipped silently wrong gradients on some Triton/Hopper versions: a wrong
backward shows up as a cosine far below 1, which the tolerances below catch. fp32 tolerances allow
for TF32 matmuls inside fla's kernels.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterator

import torch
import torch.nn.functional as F

OPS = ("gdn", "kda", "gla")
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
# pass bounds per input dtype: output/state max relative error, gradient cosine, |norm ratio - 1|
TOLERANCES = {
    "fp32": {"max_rel_err": 2e-2, "grad_cosine": 0.9995, "grad_norm_ratio_err": 2e-2},
    "bf16": {"max_rel_err": 5e-2, "grad_cosine": 0.995, "grad_norm_ratio_err": 5e-2},
}
INPUT_NAMES = {"gdn": ("q", "k", "v", "g", "beta", "h0"), "kda": ("q", "k", "v", "g", "beta", "h0"),
               "gla": ("q", "k", "v", "g", "h0")}


def make_inputs(op: str, T: int, H: int, K: int, V: int, seed: int = 0) -> dict[str, torch.Tensor]:
    """fp32 CPU inputs of batch 1 in fla's layout, with decays in the range the mixers produce."""
    gen = torch.Generator().manual_seed(seed)
    x = {
        "q": torch.randn(1, T, H, K, generator=gen),
        "k": torch.randn(1, T, H, K, generator=gen),
        "v": torch.randn(1, T, H, V, generator=gen),
    }
    if op == "gla":  # GLA does not normalise q/k: unit-norm keys and scaled queries keep the state bounded
        x["k"] = F.normalize(x["k"], dim=-1)
    g_shape = (1, T, H) if op == "gdn" else (1, T, H, K)
    x["g"] = F.logsigmoid(torch.randn(g_shape, generator=gen)) / (1 if op == "gdn" else 8)
    if op != "gla":
        x["beta"] = torch.rand(1, T, H, generator=gen)
    x["h0"] = 0.1 * torch.randn(1, H, K, V, generator=gen)
    return x


def _call(fn: Callable, op: str, x: dict[str, torch.Tensor]):
    kwargs: dict[str, Any] = {"initial_state": x["h0"], "output_final_state": True}
    if op == "gla":
        return fn(x["q"], x["k"], x["v"], x["g"], **kwargs)
    return fn(x["q"], x["k"], x["v"], x["g"], x["beta"], use_qk_l2norm_in_kernel=True, **kwargs)


def _ops(op: str) -> tuple[Callable, Callable]:
    """(chunked op, naive per-token reference) of the project."""
    from hybridlab.models import ops

    return {"gdn": (ops.chunk_gated_delta_rule, ops.naive_recurrent_gdn),
            "kda": (ops.chunk_kda, ops.naive_recurrent_kda),
            "gla": (ops.chunk_gla, ops.naive_recurrent_gla)}[op]


def forward_backward(fn: Callable, op: str, x: dict[str, torch.Tensor], d_o: torch.Tensor, d_s: torch.Tensor):
    """(output, final state, {input name: gradient}) of `fn` with upstream gradients (d_o, d_s)."""
    leaves = {n: t.detach().clone().requires_grad_(True) for n, t in x.items()}
    o, s = _call(fn, op, leaves)
    grads = torch.autograd.grad((o, s), list(leaves.values()), (d_o.to(o.dtype), d_s.to(s.dtype)),
                                allow_unused=True)
    return o.detach(), s.detach(), dict(zip(leaves, grads))


def max_rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double().cpu(), ref.detach().double().cpu()
    return float((got - ref).abs().max() / ref.abs().max().clamp_min(1e-300))


def cosine(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.detach().double().cpu().flatten(), ref.detach().double().cpu().flatten()
    return float(torch.dot(got, ref) / (got.norm() * ref.norm()).clamp_min(1e-300))


def norm_ratio(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float(got.detach().double().cpu().norm() / ref.detach().double().cpu().norm().clamp_min(1e-300))


def compare(op: str, dtype: str, *, T: int, H: int, K: int, V: int, device: str, reference: str,
            seed: int = 0) -> dict[str, Any]:
    """One op x dtype: candidate on `device` against the fp64 CPU `reference` ("chunk" or "naive")."""
    chunk, naive = _ops(op)
    base = make_inputs(op, T, H, K, V, seed)
    low = {n: (t.to(DTYPES[dtype]) if n in ("q", "k", "v") else t) for n, t in base.items()}  # as the mixers
    gen = torch.Generator().manual_seed(seed + 1)
    d_o = torch.randn(1, T, H, V, generator=gen)
    d_s = torch.randn(1, H, K, V, generator=gen)
    o, s, grads = forward_backward(chunk, op, {n: t.to(device) for n, t in low.items()},
                                   d_o.to(device, DTYPES[dtype]), d_s.to(device))
    ref_fn = chunk if reference == "chunk" else naive
    ref64 = {n: t.double() for n, t in low.items()}  # the dtype-rounded values, exactly
    d_o64 = d_o.to(DTYPES[dtype]).double()  # the candidate's upstream gradient, exactly
    o_ref, s_ref, g_ref = forward_backward(ref_fn, op, ref64, d_o64, d_s.double())
    tol = TOLERANCES[dtype]
    per_grad = {}
    for name in INPUT_NAMES[op]:
        got, want = grads[name], g_ref[name]
        if got is None or want is None:
            per_grad[name] = {"cosine": None, "norm_ratio": None, "max_rel_err": None}
            continue
        per_grad[name] = {"cosine": cosine(got, want), "norm_ratio": norm_ratio(got, want),
                          "max_rel_err": max_rel_err(got, want)}
    cosines = [g["cosine"] for g in per_grad.values()]
    ratios = [g["norm_ratio"] for g in per_grad.values()]
    row = {
        "op": op, "dtype": dtype, "T": T, "H": H, "K": K, "V": V,
        "out_max_rel_err": max_rel_err(o, o_ref), "state_max_rel_err": max_rel_err(s, s_ref),
        "grad_min_cosine": min(c for c in cosines if c is not None) if any(c is not None for c in cosines) else None,
        "grad_max_norm_ratio_err": max(abs(r - 1) for r in ratios if r is not None) if any(
            r is not None for r in ratios) else None,
        "grads": per_grad, "tolerance": tol,
    }
    finite = all(v is not None and math.isfinite(v) for v in (
        row["out_max_rel_err"], row["state_max_rel_err"], row["grad_min_cosine"], row["grad_max_norm_ratio_err"]))
    missing = [n for n, g in per_grad.items() if g["cosine"] is None]
    row["missing_grads"] = missing
    row["pass"] = bool(finite and not missing
                       and row["out_max_rel_err"] <= tol["max_rel_err"]
                       and row["state_max_rel_err"] <= tol["max_rel_err"]
                       and row["grad_min_cosine"] >= tol["grad_cosine"]
                       and row["grad_max_norm_ratio_err"] <= tol["grad_norm_ratio_err"])
    return row


def run(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Worker entry: one record per op x dtype (a failing op is a record with `error`, not a crash)."""
    device = "cuda" if not spec["dry_run"] else "cpu"
    reference = "naive" if spec["dry_run"] else "chunk"
    yield {"meta": {"device": device, "reference": f"{reference}_cpu_fp64",
                    "candidate": "cpu_chunk_op" if spec["dry_run"] else "fla_triton"}}
    for op in spec.get("ops", OPS):
        for dtype in spec.get("dtypes", tuple(DTYPES)):
            try:
                yield compare(op, dtype, T=spec["T"], H=spec["H"], K=spec["K"], V=spec["V"], device=device,
                              reference=reference)
            except Exception as exc:  # noqa: BLE001 - reported per op, the other ops still run
                yield {"op": op, "dtype": dtype, "pass": False, "error": f"{type(exc).__name__}: {exc}"[:500]}
            if device == "cuda":
                torch.cuda.empty_cache()

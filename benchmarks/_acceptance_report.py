"""The GPU acceptance script's JSON report: stage results in a fixed shape, MFU, targets and checks.

Pure functions of the stage results (`gpu_acceptance.py` collects them), so the report's shape and
pass/fail rules are tested without running anything. Every key is present whatever happened; a
value that was not measured is null, with a `reason` next to it. Non-finite floats become null (the
line stays strict JSON).

Targets: `distill_mfu_qwen3_4b` (MFU >= 0.40 at 4B shapes) and `plan_within_15pct_<model>`
(|plan estimate - measured peak| / measured peak <= 0.15). Checks: every kernel row within its
tolerances, the CUDA tests without failures, the warm-up finished, every distillation and NIAH run
measured (an OOM counts as measured: it is a result). `pass` is true only if every target and check
passed; a null counts as not passed.
"""

from __future__ import annotations

import math
from typing import Any

SCHEMA = "hybridlab.gpu_acceptance/2"
TARGET_MFU, TARGET_PLAN_REL_ERR = 0.40, 0.15
# bf16 dense tensor-core peak in TFLOP/s; the first entry whose key is in the device name wins
PEAK_BF16_TFLOPS = (("H200", 989.0), ("H100 PCIe", 756.0), ("H100 NVL", 835.0), ("H100", 989.0), ("A100", 312.0))
DISTILL_MODELS = ("qwen3_0.6b", "qwen3_4b")
NIAH_MODELS = ("hybrid", "dense")
NIAH_LABELS = ("32k", "128k")  # the dry run keeps the labels at its miniature lengths
DISTILL_FIELDS = ("seq_len", "layers", "full_layers", "plan_estimate_full_depth", "micro_batch", "micro_batch_reason",
                  "oom_micro_batches", "grad_accum", "paper_grad_accum", "student_params",
                  "fa_layers", "checkpointing", "precision", "sharding", "oom", "warmup_update_s", "update_s",
                  "tokens_per_update",
                  "flops_per_update", "tokens_per_s", "flops_per_s", "mfu", "peak_bytes", "peak_kind",
                  "resident_model_bytes", "plan_estimate", "plan_estimate_allocated", "plan_terms", "plan_rel_err",
                  "plan_reason", "error")
ENGINE_FIELDS = ("mixer", "fa_layers", "seq_len", "updates", "optimizer", "task", "sharding", "trainable_params",
                 "preempted", "first_run_s", "checkpoint", "checkpoint_bytes", "resume_s", "final_step", "losses",
                 "losses_finite", "peak_bytes")
NIAH_FIELDS = ("context", "seconds", "peak_bytes", "memory_kind", "oom", "skipped", "plan_estimate", "plan_rel_err")
KERNEL_FIELDS = ("op", "dtype", "out_max_rel_err", "state_max_rel_err", "grad_min_cosine", "grad_max_norm_ratio_err",
                 "grads", "tolerance", "pass", "error")


def peak_flops(device: dict[str, Any], override_tflops: float | None) -> tuple[float | None, str]:
    """(peak FLOP/s, where it came from): the override, the bf16 table by name, or the dry run's matmul rate."""
    if override_tflops:
        return override_tflops * 1e12, "--peak-tflops"
    if device.get("type") == "cuda":
        name = device.get("name") or ""
        for key, tflops in PEAK_BF16_TFLOPS:
            if key in name:
                return tflops * 1e12, f"bf16 dense peak of {key} (table)"
        return None, f"{name!r} is not in the bf16 peak table; pass --peak-tflops"
    if device.get("cpu_matmul_gflops"):
        return device["cpu_matmul_gflops"] * 1e9, "measured fp32 matmul throughput (CPU dry run)"
    return None, "no peak throughput known; pass --peak-tflops"


def clean(x: Any) -> Any:
    """JSON-safe copy: non-finite floats as None, tuples as lists."""
    if isinstance(x, float):
        return x if math.isfinite(x) else None
    if isinstance(x, dict):
        return {str(k): clean(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [clean(v) for v in x]
    return x


def _stage_head(result: dict[str, Any]) -> dict[str, Any]:
    return {k: result.get(k) for k in ("status", "reason", "seconds", "budget_s")} | (
        {"log_tail": result["log_tail"]} if result.get("log_tail") else {})


def _target(value: float | None, threshold: float, ok: bool | None, reason: str | None) -> dict[str, Any]:
    return {"value": value, "threshold": threshold, "pass": ok, "reason": None if ok is not None else reason}


def distill_entry(result: dict[str, Any], peak: float | None) -> dict[str, Any]:
    row = result.get("rows", [{}])[0] if result.get("rows") else {}
    entry = _stage_head(result) | {k: row.get(k) for k in DISTILL_FIELDS}
    if entry["flops_per_s"] is not None and peak:
        entry["mfu"] = entry["flops_per_s"] / peak
    if row.get("error") and entry["status"] == "ok":
        entry["status"], entry["reason"] = "oom" if row.get("oom") else "error", row["error"]
    return entry


def niah_entry(result: dict[str, Any], contexts: list[int]) -> dict[str, Any]:
    by_context = {r.get("context"): r for r in result.get("rows", [])}
    meta = result.get("meta") or {}
    entry = _stage_head(result) | {"params": meta.get("params"), "fa_layers": meta.get("fa_layers"),
                                   "warmup_s": meta.get("warmup_s"), "new_tokens": meta.get("new_tokens")}
    entry["results"] = {}
    for label, n in zip(NIAH_LABELS, contexts):
        row = by_context.get(n)
        entry["results"][label] = {k: (row or {}).get(k) for k in NIAH_FIELDS} | {
            "context": n, "measured": row is not None, "oom": bool(row and row.get("oom")),
            "skipped": bool(row and row.get("skipped"))}
    return entry


def build(stages: dict[str, dict[str, Any]], *, dry_run: bool, time_limit: float, elapsed: float,
          override_tflops: float | None, niah_contexts: list[int], kernel_shape: dict[str, int]) -> dict[str, Any]:
    """The report (see the module docstring) from the orchestrator's per-stage results."""
    dev_stage = stages.get("device", {})
    device = dict((dev_stage.get("rows") or [{}])[0])
    peak, peak_source = peak_flops(device, override_tflops)
    device.update(peak_flops=peak, peak_source=peak_source, status=dev_stage.get("status"),
                  reason=dev_stage.get("reason"))

    k = stages.get("kernels", {})
    kernel_rows = [{f: r.get(f) for f in KERNEL_FIELDS} for r in k.get("rows", [])]
    kernels = _stage_head(k) | {"shape": kernel_shape, "reference": (k.get("meta") or {}).get("reference"),
                                "candidate": (k.get("meta") or {}).get("candidate"), "results": kernel_rows}

    cuda_tests = {key: stages.get("cuda_tests", {}).get(key) for key in (
        "status", "reason", "seconds", "budget_s", "command", "returncode", "passed", "failed", "skipped", "errors",
        "log_tail")}
    w = stages.get("warmup", {})
    items = [{"what": r.get("what"), "seconds": r.get("seconds")} for r in w.get("rows", [])]
    warmup = _stage_head(w) | {"items": items,
                               "items_s": sum(i["seconds"] for i in items if isinstance(i["seconds"], (int, float)))}
    distill = {m: distill_entry(stages.get(f"distill:{m}", {}), peak) for m in DISTILL_MODELS}
    niah = {m: niah_entry(stages.get(f"niah:{m}", {}), niah_contexts) for m in NIAH_MODELS}
    e = stages.get("engine", {})
    engine = _stage_head(e) | {k: ((e.get("rows") or [{}])[0]).get(k) for k in ENGINE_FIELDS}

    targets = {}
    big = distill["qwen3_4b"]
    mfu = big["mfu"]
    targets["distill_mfu_qwen3_4b"] = _target(
        mfu, TARGET_MFU, None if mfu is None else mfu >= TARGET_MFU,
        big["reason"] or (peak_source if peak is None else "not measured"))
    for m in DISTILL_MODELS:
        err = distill[m]["plan_rel_err"]
        reason = distill[m]["plan_reason"] or distill[m]["reason"] or "not measured"
        targets[f"plan_within_15pct_{m}"] = _target(
            err, TARGET_PLAN_REL_ERR, None if err is None else abs(err) <= TARGET_PLAN_REL_ERR, reason)

    def stage_ok(s: dict[str, Any]) -> bool:
        return s.get("status") == "ok"

    tests_ok = stage_ok(cuda_tests) and not cuda_tests["failed"] and not cuda_tests["errors"] and (
        dry_run or bool(cuda_tests["passed"]))
    checks = {
        "kernels": stage_ok(kernels) and bool(kernel_rows) and all(r["pass"] is True for r in kernel_rows),
        "cuda_tests": tests_ok,
        "warmup": stage_ok(warmup),
        "distill_measured": all(stage_ok(d) or d["status"] == "oom" for d in distill.values()),
        "engine": stage_ok(engine) and engine["preempted"] is True and engine["losses_finite"] is True
        and engine["final_step"] == engine["updates"],
        "niah_measured": all(stage_ok(n) and all(r["measured"] for r in n["results"].values()) for n in niah.values()),
    }
    passed = all(t["pass"] is True for t in targets.values()) and all(checks.values())
    return clean({"schema": SCHEMA, "dry_run": dry_run, "time_limit_s": time_limit, "elapsed_s": round(elapsed, 2),
                  "device": device, "warmup": warmup, "kernels": kernels, "cuda_tests": cuda_tests,
                  "distill": distill, "engine": engine, "niah": niah, "targets": targets, "checks": checks, "pass": passed})

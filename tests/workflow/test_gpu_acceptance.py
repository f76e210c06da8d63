"""benchmarks/gpu_acceptance.sh: the CPU dry run prints one JSON line of the documented shape with sane values;
the report's pass/fail rules, the kernel check's sensitivity to a wrong backward, budgets that stop a stage and
add up to the 6-minute limit with the warm-up, no network step."""

from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import _acceptance_kernels as kernels  # noqa: E402
import _acceptance_models as models  # noqa: E402
import _acceptance_report as report  # noqa: E402
import gpu_acceptance  # noqa: E402

TOP_KEYS = {"schema", "dry_run", "time_limit_s", "elapsed_s", "device", "warmup", "kernels", "cuda_tests", "distill",
            "engine", "niah", "targets", "checks", "pass"}
TARGETS = {"distill_mfu_qwen3_4b", "plan_within_15pct_qwen3_0.6b", "plan_within_15pct_qwen3_4b"}


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("acceptance") / "report.json"
    start = time.perf_counter()
    proc = subprocess.run(["bash", str(ROOT / "benchmarks/gpu_acceptance.sh"), "--dry-run", "--out", str(out)],
                          cwd=ROOT, capture_output=True, text=True, timeout=600)
    elapsed = time.perf_counter() - start
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, out, elapsed


@pytest.mark.slow
def test_dry_run_prints_one_json_line_also_written_to_out(dry_run):
    proc, out, elapsed = dry_run
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout[-2000:]
    rep = json.loads(lines[0])
    assert json.loads(out.read_text()) == rep
    assert set(rep) == TOP_KEYS and rep["schema"] == report.SCHEMA and rep["dry_run"] is True
    assert rep["elapsed_s"] < rep["time_limit_s"] and elapsed < 300
    for name in ("warmup", "kernels", "cuda_tests"):
        assert rep[name]["status"] == "ok", (name, rep[name])
    assert len(rep["warmup"]["items"]) == len(kernels.OPS) * len(kernels.DTYPES) + 2 * len(report.DISTILL_MODELS)
    assert 0 < rep["warmup"]["items_s"] <= rep["warmup"]["seconds"]
    assert rep["device"]["type"] == "cpu" and rep["device"]["peak_flops"] > 1e8


@pytest.mark.slow
def test_dry_run_kernel_rows_compare_every_op_and_dtype_within_tolerance(dry_run):
    rep = json.loads(dry_run[0].stdout)
    rows = rep["kernels"]["results"]
    assert {(r["op"], r["dtype"]) for r in rows} == {(o, d) for o in kernels.OPS for d in kernels.DTYPES}
    assert rep["kernels"]["reference"] == "naive_cpu_fp64" and rep["kernels"]["candidate"] == "cpu_chunk_op"
    for r in rows:
        assert r["pass"] is True and r["error"] is None, r
        assert 0 <= r["out_max_rel_err"] < (1e-5 if r["dtype"] == "fp32" else 1e-2)
        assert set(r["grads"]) == set(kernels.INPUT_NAMES[r["op"]])
        for g in r["grads"].values():
            assert 0.999 < g["cosine"] <= 1 + 1e-12 and abs(g["norm_ratio"] - 1) < 1e-2


@pytest.mark.slow
def test_dry_run_distillation_and_niah_values_are_finite_and_consistent(dry_run):
    rep = json.loads(dry_run[0].stdout)
    for name, d in rep["distill"].items():
        assert d["status"] == "ok", (name, d)
        assert set(report.DISTILL_FIELDS) | {"status", "reason", "seconds", "budget_s"} <= set(d)
        assert d["seq_len"] == 64 and d["tokens_per_update"] == d["micro_batch"] * d["grad_accum"] * 64
        assert d["tokens_per_s"] == pytest.approx(d["tokens_per_update"] / d["update_s"])
        assert d["mfu"] == pytest.approx(d["flops_per_s"] / rep["device"]["peak_flops"]) and 0 < d["mfu"] < 1
        assert d["peak_bytes"] > d["resident_model_bytes"] > 0
        assert d["sharding"] == "FSDP2 (fsdp=always), world size 1" and d["warmup_update_s"] > 0
        if d["plan_estimate"] is None:  # the plan may be missing; then it says why
            assert d["plan_reason"]
        else:
            assert d["plan_rel_err"] == pytest.approx((d["plan_estimate_allocated"] - d["peak_bytes"]) / d["peak_bytes"])
    small, big = rep["distill"]["qwen3_0.6b"], rep["distill"]["qwen3_4b"]
    # the 4B student is measured on a depth slice (3 of the miniature's 4 layers); the plan also gives the whole
    assert (small["layers"], small["full_layers"]) == (4, 4) and (big["layers"], big["full_layers"]) == (3, 4)
    if big["plan_estimate"] is not None:
        assert big["plan_estimate_full_depth"] > big["plan_estimate"]
        assert small["plan_estimate_full_depth"] == small["plan_estimate"]
    assert big["student_params"] > small["student_params"] and big["flops_per_update"] > small["flops_per_update"]
    e = rep["engine"]  # KDA, stage 1, Muon, SIGTERM -> DCP checkpoint, resume from it
    assert e["status"] == "ok", e
    assert e["preempted"] is True and e["checkpoint"] is not None and e["checkpoint_bytes"] > 0
    assert e["final_step"] == e["updates"] == 3 and len(e["losses"]) == 3 and e["losses_finite"] is True
    assert e["mixer"] == "kda" and e["optimizer"] == "muon" and e["trainable_params"] > 0
    for model, n in rep["niah"].items():
        assert n["status"] == "ok" and (n["fa_layers"] is None) == (model == "dense")
        assert set(n["results"]) == set(report.NIAH_LABELS)
        for r in n["results"].values():
            assert r["measured"] and not r["oom"] and _finite(r["seconds"]) and r["peak_bytes"] > 0
    assert set(rep["targets"]) == TARGETS and all(isinstance(t["pass"], bool) for t in rep["targets"].values())
    assert rep["checks"] == {k: True for k in rep["checks"]}
    assert rep["pass"] is False  # the CPU reaches nowhere near 40 % MFU


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU-only behaviour of the GPU mode")
def test_gpu_mode_without_a_gpu_skips_every_stage_with_the_reason(capsys):
    rep = gpu_acceptance.main([])
    assert json.loads(capsys.readouterr().out) == rep and set(rep) == TOP_KEYS
    assert rep["device"]["status"] == "ok" and rep["device"]["type"] == "cpu"
    for stage in (rep["warmup"], rep["kernels"], rep["cuda_tests"], *rep["distill"].values(), rep["engine"],
                  *rep["niah"].values()):
        assert stage["status"] == "skipped" and "no CUDA device" in stage["reason"]
    assert all(t["pass"] is None and "no CUDA device" in t["reason"] for t in rep["targets"].values())
    assert rep["pass"] is False and not any(rep["checks"].values())


def test_kernel_check_catches_a_wrong_backward_with_a_correct_forward(monkeypatch):
    class ReversedGrad(torch.autograd.Function):  # identity forward, gradient reversed in time (same norm)
        @staticmethod
        def forward(ctx, x):
            return x.view_as(x)

        @staticmethod
        def backward(ctx, g):
            return g.flip(1)

    chunk, naive = kernels._ops("gdn")
    monkeypatch.setattr(kernels, "_ops", lambda op: (lambda q, *a, **kw: chunk(ReversedGrad.apply(q), *a, **kw), naive))
    row = kernels.compare("gdn", "fp32", T=32, H=2, K=8, V=8, device="cpu", reference="naive")
    assert row["out_max_rel_err"] < 1e-5 and row["grads"]["k"]["cosine"] > 0.99999
    assert row["grads"]["q"]["cosine"] < 0.9 and row["pass"] is False


def test_peak_table_by_device_name_and_override():
    cases = {"NVIDIA H200": 989, "NVIDIA H100 80GB HBM3": 989, "NVIDIA H100 PCIe": 756, "NVIDIA A100-SXM4-80GB": 312}
    for name, tflops in cases.items():
        assert report.peak_flops({"type": "cuda", "name": name}, None)[0] == tflops * 1e12
    assert report.peak_flops({"type": "cuda", "name": "NVIDIA L4"}, None)[0] is None
    assert report.peak_flops({"type": "cuda", "name": "NVIDIA L4"}, 121.0) == (121e12, "--peak-tflops")


def _stage(status="ok", rows=(), meta=None):
    return {"status": status, "reason": None if status == "ok" else "why", "seconds": 1.0, "budget_s": 10.0,
            "rows": list(rows), "meta": meta}


def test_report_targets_pass_fail_and_null_with_reason():
    distill = {"micro_batch": 1, "grad_accum": 2, "flops_per_s": 0.45 * 989e12, "peak_bytes": 100,
               "plan_rel_err": 0.10, "plan_reason": None}
    stages = {"device": _stage(rows=[{"type": "cuda", "name": "NVIDIA H200"}]),
              "distill:qwen3_4b": _stage(rows=[distill]),
              "distill:qwen3_0.6b": _stage(rows=[{**distill, "plan_rel_err": -0.2}])}
    rep = report.build(stages, dry_run=False, time_limit=360, elapsed=1.0, override_tflops=None,
                       niah_contexts=[32768, 131072], kernel_shape={})
    t = rep["targets"]
    assert t["distill_mfu_qwen3_4b"]["value"] == pytest.approx(0.45) and t["distill_mfu_qwen3_4b"]["pass"] is True
    assert t["plan_within_15pct_qwen3_4b"]["pass"] is True and t["plan_within_15pct_qwen3_0.6b"]["pass"] is False
    # a stage that never ran: every key still there, null values, a reason, and no pass
    assert rep["kernels"]["status"] is None and rep["kernels"]["results"] == []
    assert rep["niah"]["dense"]["results"]["128k"] == {
        "context": 131072, "seconds": None, "peak_bytes": None, "memory_kind": None, "oom": False, "skipped": False,
        "plan_estimate": None, "plan_rel_err": None, "measured": False}
    assert rep["checks"]["kernels"] is False and rep["pass"] is False
    stages["distill:qwen3_4b"] = _stage("skipped")
    t = report.build(stages, dry_run=False, time_limit=360, elapsed=1.0, override_tflops=None,
                     niah_contexts=[1, 2], kernel_shape={})["targets"]["distill_mfu_qwen3_4b"]
    assert t["pass"] is None and t["value"] is None and t["reason"] == "why"


def test_report_is_strict_json_without_nan():
    rep = report.build({"device": _stage(rows=[{"type": "cpu", "cpu_matmul_gflops": float("nan")}])}, dry_run=True,
                       time_limit=1, elapsed=float("inf"), override_tflops=None, niah_contexts=[1, 2], kernel_shape={})
    assert rep["elapsed_s"] is None and rep["device"]["cpu_matmul_gflops"] is None
    json.dumps(rep, allow_nan=False)


def test_a_stage_past_its_budget_is_stopped_with_its_children(tmp_path):
    marker = tmp_path / "child_survived"
    cmd = ["bash", "-c", f"(sleep 3; touch {marker}) & sleep 30"]
    start = time.perf_counter()
    rc, seconds = gpu_acceptance.run_process(cmd, 1.0, tmp_path / "log")
    assert rc is None and seconds < 15 and time.perf_counter() - start < 15
    time.sleep(3.5)
    assert not marker.exists()  # the background child was killed with its process group


def test_pytest_summary_counts():
    out = "....F.s\nFAILED tests/models/test_ops_cuda.py::test_x - assert\n1 failed, 5 passed, 1 skipped, 2 errors in 3.1s\n"
    assert gpu_acceptance.pytest_counts(out) == {"passed": 5, "failed": 1, "skipped": 1, "errors": 2}
    assert gpu_acceptance.pytest_counts("14 skipped, 300 deselected in 2.0s") == {
        "passed": 0, "failed": 0, "skipped": 14, "errors": 0}
    assert gpu_acceptance.pytest_counts("1 error in 0.5s")["errors"] == 1


def test_bad_arguments_are_one_line_usage_errors(capsys):
    for argv in (["--budget", "nosuch=5"], ["--budget", "pipeline=-1"], ["--budget", "pipeline"],
                 ["--peak-tflops", "0"], ["--micro-batch", "0"], ["--only", "nosuch"]):
        with pytest.raises(SystemExit):
            gpu_acceptance.parse_args(argv)
        assert "error:" in capsys.readouterr().err


def test_stage_budgets_with_the_warm_up_add_up_to_the_six_minute_limit():
    assert gpu_acceptance.TIME_LIMIT_S == 360
    assert set(gpu_acceptance.BUDGETS) == set(gpu_acceptance.STAGES)
    assert sum(gpu_acceptance.BUDGETS.values()) <= gpu_acceptance.TIME_LIMIT_S
    # the warm-up runs right after the device probe, before every stage it compiles for
    assert gpu_acceptance.STAGES[:2] == ("device", "warmup")
    spec = gpu_acceptance.stage_specs(False, None)["warmup"]
    assert spec["kernels"] == gpu_acceptance.stage_specs(False, None)["kernels"]
    assert spec["models"] == list(report.DISTILL_MODELS) and spec["seq_len"] == 4096


def test_no_stage_touches_the_network():
    """No download, package manager or DAG build (the smoke DAG fetches Debian packages) in any stage; the
    wrapper and the orchestrator set the Hugging Face libraries offline."""
    bench = ROOT / "benchmarks"
    files = [bench / "gpu_acceptance.sh", bench / "gpu_acceptance.py", *sorted(bench.glob("_acceptance_*.py"))]
    assert len(files) == 6
    for f in files:
        text = f.read_text()
        for word in ("apt-get", "apt ", "snakemake", "pip install", "urllib", "requests", "socket", "curl", "wget",
                     "git clone", "hf_hub_download", "snapshot_download", "from_pretrained", "load_dataset"):
            assert word not in text, (f.name, word)
    wrapper = (bench / "gpu_acceptance.sh").read_text()
    assert "HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1" in wrapper
    assert "pipeline" not in gpu_acceptance.STAGES


def test_the_warm_up_compiles_each_kernel_and_model_once_and_reports_its_seconds():
    rows = list(models.run_warmup({"dry_run": True, "kernels": dict(T=16, H=2, K=8, V=8), "models": ["qwen3_0.6b"],
                                   "seq_len": 16}))
    assert [r["what"] for r in rows] == [f"kernel {o} {d}" for o in kernels.OPS for d in kernels.DTYPES] + [
        "qwen3_0.6b training forward + backward", "qwen3_0.6b generation (prefill + 2 tokens)"]
    assert all(r["seconds"] > 0 for r in rows)
    rep = report.build({"warmup": _stage(rows=rows)}, dry_run=True, time_limit=360, elapsed=1.0,
                       override_tflops=None, niah_contexts=[1, 2], kernel_shape={})
    assert rep["warmup"]["items_s"] == pytest.approx(sum(r["seconds"] for r in rows))
    assert rep["checks"]["warmup"] is True


def test_micro_batch_pick_says_when_the_plan_fits_nothing():
    class Estimate:
        def __init__(self, total):
            self.total, self.terms = total, {}

    class Plan:  # 30 GiB per row of micro batch
        @staticmethod
        def estimate_step(config, *, micro_batch, **kw):
            return Estimate(micro_batch * 30 * 2**30)

    spec = {"seq_len": 8, "grad_accum": 1, "dry_run": False}
    d = {"gradient_checkpointing": True, "kl_chunk_tokens": 8, "kl_vocab_chunk": None}
    assert models.pick_micro_batch(Plan, None, spec, 2, d, 80 * 2**30) == (
        2, "largest of 1/2/4 the plan fits in 90% of the device memory")
    mb, why = models.pick_micro_batch(Plan, None, spec, 2, d, 20 * 2**30)
    assert mb == 1 and why.startswith("none of 1/2/4 fits: the plan predicts 30.0 GiB at micro batch 1")

"""GPU acceptance: kernels, CUDA tests, distillation step and NIAH generation on one GPU, offline, in 6 minutes.

    bash benchmarks/gpu_acceptance.sh [--dry-run] [--out FILE] [--peak-tflops X] [--only STAGE ...]

Stages, in this order, each in its own subprocess with its own time budget (killed at the budget, its
finished measurements kept; skipped with a reason when too little of the total `--time-limit` is left):

1. `device`: name, memory, versions (`_acceptance_models.run_device`).
2. `warmup`: Triton compilation and fla autotuning of every kernel the later stages time, paid here and
   reported apart (`_acceptance_models.run_warmup`; the results persist in Triton's cache directory,
   autotuning included via `TRITON_CACHE_AUTOTUNING=1`, so the later processes load them).
3. `kernels`: fla's GDN/KDA/GLA chunked kernels against the project's CPU ops, forward and backward,
   fp32 and bf16, at T=4096 (`_acceptance_kernels`).
4. `cuda_tests`: `pytest -q -m cuda tests/`.
5. `distill:qwen3_0.6b`, `distill:qwen3_4b`: stage-2 distillation updates of a Qwen3-shaped random
   hybrid student (Qwen3-4B: a 12-of-36-layer slice at full width, which fits one 80 GB GPU) through the
   project's loop and sharded engine (FSDP2 at world size 1, bf16 parameters); tokens/s, MFU, peak
   memory against the memory plan's line for one GPU (`_acceptance_models`).
6. `engine`: stage 1 of a Qwen3-0.6B-shaped KDA hybrid with Muon under FSDP2, stopped by a SIGTERM
   (the loop writes a DCP checkpoint) and resumed from it (`_acceptance_models.run_engine`).
7. `niah:hybrid`, `niah:dense`: generation time and memory at 32K and 128K context, 4B shapes
   (`_acceptance_niah`).

Nothing touches the network: models are random and built from their public shapes, the wrapper sets
the Hugging Face libraries offline, and no stage downloads (the smoke DAG, whose corpus job fetches
Debian packages, is not run here). The budgets plus the warm-up add up to the 360 s limit, so a rerun
with the machine's start-up still fits a task's 15 minutes of device time.

`--dry-run` runs every stage on the CPU at miniature shapes (tiny configs, T=64; the kernel stage
compares the CPU op with the naive recurrence) and prints the same keys. Targets: distillation >= 40 % MFU at 4B shapes (MFU against the
GPU's bf16 dense peak, `_acceptance_report.PEAK_BF16_TFLOPS` by device name or `--peak-tflops`; the dry
run uses the measured fp32 matmul throughput) and the memory plan within 15 % of the measured peak.
They are reported as pass/fail (`_acceptance_report.build`), never asserted. stdout carries exactly
one line, the JSON report (also written to `--out`); progress goes to stderr. The exit status is 0
whenever the report was written: pass/fail is in the report. See docs/cluster.md, "GPU acceptance".
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any, Sequence

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
STAGES = ("device", "warmup", "kernels", "cuda_tests", "distill:qwen3_0.6b", "distill:qwen3_4b", "engine",
          "niah:hybrid", "niah:dense")
# seconds per stage (subprocess start and imports included); together at most TIME_LIMIT_S, warm-up included
BUDGETS = {"device": 20, "warmup": 60, "kernels": 35, "cuda_tests": 60, "distill:qwen3_0.6b": 40,
           "distill:qwen3_4b": 55, "engine": 35, "niah:hybrid": 30, "niah:dense": 25}
DRY_BUDGETS = {name: 60 for name in STAGES}
MIN_STAGE_S = 15  # a stage is skipped when less than this is left of the total time limit
TIME_LIMIT_S, DRY_TIME_LIMIT_S = 360, 240


# ---- subprocesses -------------------------------------------------------------------------------------
def run_process(cmd: Sequence[str], timeout: float, log: Path, cwd: Path = ROOT,
                env: dict[str, str] | None = None) -> tuple[int | None, float]:
    """Run `cmd` in its own process group with output to `log`; (exit code or None on timeout, seconds)."""
    start = time.perf_counter()
    with open(log, "w") as out:
        proc = subprocess.Popen(list(cmd), cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT,
                                start_new_session=True)
        try:
            rc: int | None = proc.wait(timeout=max(1.0, timeout))
        except subprocess.TimeoutExpired:
            rc = None
            for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 30)):
                try:
                    os.killpg(proc.pid, sig)  # the group of the process started here: its children too
                except ProcessLookupError:
                    break
                try:
                    proc.wait(timeout=grace)
                    break
                except subprocess.TimeoutExpired:
                    continue
    return rc, time.perf_counter() - start


def tail(path: Path, n: int = 1500) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return ""


def run_worker(stage: str, spec: dict[str, Any], budget: float, logs: Path) -> dict[str, Any]:
    """One Python stage in a subprocess: its JSON-lines records, with status ok / error / timeout."""
    slug = stage.replace(":", "_")
    out, log = logs / f"{slug}.jsonl", logs / f"{slug}.log"
    rc, seconds = run_process([sys.executable, str(Path(__file__)), "--worker", json.dumps(spec), str(out)],
                              budget, log)
    records = [json.loads(line) for line in out.read_text().splitlines() if line.strip()] if out.exists() else []
    meta = next((r["meta"] for r in records if "meta" in r), None)
    error = next((r["error"] for r in records if "worker_error" in r), None)
    rows = [r for r in records if "meta" not in r and "worker_error" not in r and "done" not in r]
    done = any("done" in r for r in records)
    result: dict[str, Any] = {"seconds": round(seconds, 2), "budget_s": round(budget, 1), "meta": meta, "rows": rows}
    if rc is None:
        result.update(status="timeout", reason=f"stopped at its {budget:.0f} s budget; {len(rows)} rows finished")
    elif rc != 0 or not done:
        result.update(status="error", reason=error or f"exit code {rc}", log_tail=tail(log))
    else:
        result.update(status="ok", reason=None)
    return result


def worker_main(spec_json: str, out_path: str) -> int:
    """Subprocess entry: run one stage, appending each record as a JSON line as soon as it exists."""
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    spec = json.loads(spec_json)
    with open(out_path, "a") as out:
        def emit(record: dict[str, Any]) -> None:
            out.write(json.dumps(record, default=str) + "\n")
            out.flush()

        try:
            if spec["stage"] in ("kernels", "niah"):
                module = importlib.import_module(f"_acceptance_{spec['stage']}")
                records = module.run(spec)
            else:
                import _acceptance_models as module

                records = module.STAGES[spec["stage"]](spec)
            for record in records:
                emit(record)
        except Exception as exc:  # noqa: BLE001 - reported in the JSON, the other stages still run
            traceback.print_exc()
            emit({"worker_error": True, "error": f"{type(exc).__name__}: {str(exc)[:600]}"})
            return 1
        emit({"done": True})
    return 0


# ---- stages run by the orchestrator itself -------------------------------------------------------------
def pytest_counts(output: str) -> dict[str, int]:
    """passed / failed / skipped / errors from the last summary line of `pytest -q` output."""
    counts = {k: 0 for k in ("passed", "failed", "skipped", "errors")}
    pattern = r"(\d+) (passed|failed|skipped|errors?|deselected)\b"
    summary = [line for line in output.splitlines() if re.search(pattern, line)]
    for n, word in re.findall(pattern, summary[-1] if summary else ""):
        if word != "deselected":
            counts["errors" if word.startswith("error") else word] += int(n)
    return counts


def stage_cuda_tests(dry_run: bool, budget: float, logs: Path) -> dict[str, Any]:
    target = "tests/models/test_ops_cuda.py" if dry_run else "tests/"
    cmd = [sys.executable, "-m", "pytest", "-q", "-m", "cuda", "-p", "no:cacheprovider", target]
    log = logs / "cuda_tests.log"
    rc, seconds = run_process(cmd, budget, log)
    text = tail(log, 4000)
    counts = pytest_counts(text)
    # pytest: 0 all passed, 1 some failed (a result), 5 nothing collected; anything else broke the run
    status = "timeout" if rc is None else "ok" if rc in (0, 1, 5) else "error"
    reason = (f"stopped at its {budget:.0f} s budget" if rc is None else f"pytest exit code {rc}" if status == "error"
              else f"{counts['failed']} failed, {counts['errors']} errors" if rc == 1 else None)
    return {"status": status, "reason": reason, "seconds": round(seconds, 2), "budget_s": round(budget, 1),
            "command": " ".join(cmd[1:]), "returncode": rc, **counts,
            "log_tail": text[-1500:] if rc != 0 and rc != 5 else None}


# ---- orchestration -------------------------------------------------------------------------------------
def stage_specs(dry_run: bool, micro_batch: int | None) -> dict[str, dict[str, Any]]:
    """What each Python stage measures: full shapes on a GPU, miniatures in the dry run."""
    kernels = dict(T=64, H=2, K=16, V=16) if dry_run else dict(T=4096, H=4, K=128, V=128)
    distill = (dict(seq_len=64, grad_accum=1, warmup=1, steps=2) if dry_run else
               dict(seq_len=4096, grad_accum=2, warmup=1, steps=2))
    niah = dict(contexts=[64, 128], new_tokens=2) if dry_run else dict(contexts=[32768, 131072], new_tokens=8)
    engine = dict(seq_len=64, steps=3) if dry_run else dict(seq_len=2048, steps=3)
    specs: dict[str, dict[str, Any]] = {"device": {}, "kernels": kernels, "engine": engine,
                                        "warmup": {"kernels": kernels, "models": ["qwen3_0.6b", "qwen3_4b"],
                                                   "seq_len": distill["seq_len"]}}
    for name in ("qwen3_0.6b", "qwen3_4b"):
        specs[f"distill:{name}"] = {**distill, "name": name, "micro_batch": micro_batch}
    for model in ("hybrid", "dense"):
        specs[f"niah:{model}"] = {**niah, "model": model}
    for name, spec in specs.items():
        spec.update(stage=name.split(":")[0], dry_run=dry_run)
    return specs


def precondition(name: str, device: dict[str, Any] | None, dry_run: bool) -> str | None:
    """Why stage `name` cannot run here (None: it can)."""
    if name == "device":
        return None
    if device is None:
        return "the device stage failed, see device.reason"
    if not dry_run and device.get("type") != "cuda":
        return "no CUDA device is visible; on a CPU machine run with --dry-run"
    if name == "cuda_tests" and importlib.util.find_spec("pytest") is None:
        return "pytest is not installed in this Python"
    if not dry_run and name.split(":")[0] in ("warmup", "kernels", "distill", "engine", "niah"):
        if device.get("fla") is None:
            return "flash-linear-attention is not installed; the CUDA mixers need it (fla.ops)"
        if device.get("fla_import_error"):
            return f"fla does not import ({device['fla_import_error']}); the CUDA mixers need it"
    return None


def parse_budget(text: str) -> tuple[str, float]:
    name, _, value = text.partition("=")
    if name not in STAGES:
        raise argparse.ArgumentTypeError(f"unknown stage {name!r}; use one of {', '.join(STAGES)}")
    try:
        seconds = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: write STAGE=SECONDS, e.g. kernels=60") from None
    if not seconds > 0:
        raise argparse.ArgumentTypeError(f"{text!r}: the budget must be > 0 seconds")
    return name, seconds


def positive_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number") from None
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{value} must be > 0")
    return value


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    from _common import int_at_least

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dry-run", action="store_true", help="every stage on the CPU at miniature shapes")
    ap.add_argument("--out", help="also write the JSON report to this file")
    ap.add_argument("--peak-tflops", type=positive_float, help="bf16 dense peak for MFU (default: table by device)")
    ap.add_argument("--time-limit", type=positive_float, help=f"total seconds (default {TIME_LIMIT_S}, dry run "
                                                              f"{DRY_TIME_LIMIT_S})")
    ap.add_argument("--budget", type=parse_budget, action="append", default=[], metavar="STAGE=SECONDS",
                    help="override one stage's time budget (repeatable)")
    ap.add_argument("--only", nargs="+", choices=STAGES, help="run these stages (device always runs)")
    ap.add_argument("--micro-batch", type=int_at_least(1), help="distillation micro batch (default: from the plan)")
    ap.add_argument("--log-dir", help="keep every stage's log here (default: a temporary folder, removed)")
    ap.add_argument("--worker", nargs=2, metavar=("SPEC", "OUT"), help=argparse.SUPPRESS)
    return ap.parse_args(argv)


def say(text: str) -> None:
    print(f"[gpu_acceptance] {text}", file=sys.stderr, flush=True)


def importable_project() -> None:
    """The project and the benchmark helpers importable here and in every subprocess, installed or not."""
    sys.path[:0] = [p for p in (str(ROOT / "src"), str(HERE)) if p not in sys.path]
    paths = [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(dict.fromkeys(paths))


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    importable_project()
    from _acceptance_report import build

    args = parse_args(argv)
    if args.worker:
        sys.exit(worker_main(*args.worker))
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    os.environ.setdefault("TRITON_CACHE_AUTOTUNING", "1")  # the warm-up's autotuning reused by every later stage
    limit = args.time_limit or (DRY_TIME_LIMIT_S if args.dry_run else TIME_LIMIT_S)
    budgets = {**(DRY_BUDGETS if args.dry_run else BUDGETS), **dict(args.budget)}
    specs = stage_specs(args.dry_run, args.micro_batch)
    logs = Path(args.log_dir) if args.log_dir else Path(tempfile.mkdtemp(prefix="gpu_acceptance_logs_"))
    logs.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    stages: dict[str, dict[str, Any]] = {}
    device: dict[str, Any] | None = None
    try:
        for name in STAGES:
            left = limit - (time.perf_counter() - t0)
            reason = precondition(name, device, args.dry_run)
            if args.only and name != "device" and name not in args.only:
                reason = "not selected by --only"
            elif reason is None and left < MIN_STAGE_S:
                reason = f"only {max(left, 0):.0f} s left of the {limit:.0f} s limit"
            if reason is not None:
                stages[name] = {"status": "skipped", "reason": reason, "seconds": 0.0, "budget_s": None}
                say(f"{name}: skipped ({reason})")
                continue
            budget = min(budgets[name], left)
            say(f"{name}: running (budget {budget:.0f} s)")
            if name == "cuda_tests":
                stages[name] = stage_cuda_tests(args.dry_run, budget, logs)
            else:
                stages[name] = run_worker(name, specs[name], budget, logs)
            say(f"{name}: {stages[name]['status']} in {stages[name]['seconds']:.1f} s"
                + (f" ({stages[name]['reason']})" if stages[name].get("reason") else ""))
            if name == "device" and stages[name]["status"] == "ok" and stages[name]["rows"]:
                device = stages[name]["rows"][0]
        report = build(stages, dry_run=args.dry_run, time_limit=limit, elapsed=time.perf_counter() - t0,
                       override_tflops=args.peak_tflops, niah_contexts=specs["niah:hybrid"]["contexts"],
                       kernel_shape={k: specs["kernels"][k] for k in "THKV"})
    finally:
        if not args.log_dir:
            shutil.rmtree(logs, ignore_errors=True)
    line = json.dumps(report, sort_keys=True, allow_nan=False)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(line + "\n")
    print(line, flush=True)
    return report


if __name__ == "__main__":
    main()

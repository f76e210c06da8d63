"""Model stages of the GPU acceptance script: the device probe, the distillation step and NIAH generation.

- `device`: what the orchestrator needs before the other stages: device name and memory, library
  versions, whether fla imports, and on CPU the measured fp32 matmul throughput (the dry run's MFU
  reference, `_common.measure_matmul_gflops`).
- `distill`: one Qwen3-shaped random student, converted to a hybrid with the project's conversion
  (`standard_periodic` placement at the paper preset's `fa_ratio`, GDN mixers), trained for stage 2
  through the project's loop (`hybridlab.train.loop.train`: bf16 autocast on CUDA, the frozen bf16
  teacher's forward, the chunked KL of `distill.Stage2Task`, backward, gradient clipping, AdamW step)
  with the paper preset's distillation settings (KL chunking, activation checkpointing, lr schedule)
  at seq 4096. Reported: tokens/s, achieved FLOP/s and the FLOPs counted by
  `train_throughput.FlopCounter` (student forward + backward + teacher forward), the peak memory of
  the timed updates (`torch.cuda.max_memory_allocated` after a reset at the first timed update; on
  CPU the live model bytes plus `plan.measure_peak_bytes` of the run) and the memory plan's estimate
  (`plan.estimate_step`) with its relative error.
- `niah`: a 4B-shaped bf16 model, the hybrid or its dense twin, greedy generation through the
  project's NIAH runner (`eval.niah.run_niah`: `model.generate`, time and peak memory per example,
  CUDA OOM recorded as a row) on random token ids at each context length, after an untimed warm-up
  generation (kernel compilation). The runner reads prompts through a tokenizer, so a stub maps each
  example's prompt key to its token ids.

Weights are random: the stages measure cost, not quality.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import math
import platform
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

ROOT = Path(__file__).resolve().parents[1]
PLACEMENT, MIXER = "standard_periodic", "gdn"
VOCAB = 151936
# Public architecture numbers of Qwen/Qwen3-0.6B and Qwen/Qwen3-4B (both tie their embeddings).
QWEN3_SHAPES = {
    "qwen3_0.6b": dict(hidden_size=1024, num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8,
                       head_dim=128, intermediate_size=3072),
    "qwen3_4b": dict(hidden_size=2560, num_hidden_layers=36, num_attention_heads=32, num_key_value_heads=8,
                     head_dim=128, intermediate_size=9728),
}
# Miniatures for the CPU dry run: same code paths, seconds instead of minutes.
DRY_SHAPES = {
    "qwen3_0.6b": dict(hidden_size=64, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       head_dim=16, intermediate_size=128),
    "qwen3_4b": dict(hidden_size=96, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                     head_dim=24, intermediate_size=192),
}
DRY_VOCAB = 512


def _version(dist: str) -> str | None:
    """Installed version of a distribution (metadata only: importing fla and Triton takes seconds)."""
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def run_device(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Device name, memory, versions, whether fla's GDN kernels import; on CPU the fp32 matmul GFLOP/s."""
    from _common import measure_matmul_gflops

    row: dict[str, Any] = {"python": platform.python_version(), "torch": torch.__version__,
                           "transformers": _version("transformers"), "triton": _version("triton"),
                           "fla": _version("flash-linear-attention") or _version("fla-core"),
                           "cuda_available": torch.cuda.is_available(), "fla_import_error": None}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        row.update(name=props.name, type="cuda", total_memory_bytes=int(props.total_memory),
                   capability=f"{props.major}.{props.minor}", cuda=torch.version.cuda)
        try:  # what the CUDA mixers import first; a broken Triton shows up here
            importlib.import_module("fla.ops.gated_delta_rule")
        except Exception as exc:  # noqa: BLE001 - reported, the orchestrator skips the stages that need it
            row["fla_import_error"] = f"{type(exc).__name__}: {str(exc)[:300]}"
    else:
        row.update(name=platform.processor() or platform.machine(), type="cpu", total_memory_bytes=None)
    if spec["dry_run"]:
        row["cpu_matmul_gflops"] = max(measure_matmul_gflops((256, 512), reps=3).values())
    yield row


# ---- models ----------------------------------------------------------------------------------------
def qwen3_config(name: str, dry_run: bool, max_positions: int):
    from transformers import Qwen3Config

    shape = (DRY_SHAPES if dry_run else QWEN3_SHAPES)[name]
    return Qwen3Config(vocab_size=DRY_VOCAB if dry_run else VOCAB, tie_word_embeddings=True, rms_norm_eps=1e-6,
                       max_position_embeddings=max_positions, **shape)


def paper_settings() -> dict[str, Any]:
    """The paper preset's distillation settings and FA ratio (config.yaml)."""
    from hybridlab.config import load, resolve

    C = resolve(load(ROOT / "config.yaml", {"scale": "paper"}))
    return {"distill": C["train"]["distill"], "fa_ratio": C["experiments"]["distill"]["fa_ratio"]}


def build_dense(config, device: str, dtype: torch.dtype, seed: int = 0):
    from transformers import Qwen3ForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):  # initialise on the device: a 4B model on the CPU takes minutes
        model = Qwen3ForCausalLM(config)
    return model.to(dtype)


def to_hybrid(dense, fa_ratio: float, device: str, inplace: bool):
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.placements import fa_layers

    fa = fa_layers(PLACEMENT, dense.config.num_hidden_layers, ratio=fa_ratio)
    with torch.device(device):  # the mixers are created on the device too
        return convert_to_hybrid(dense, fa, MIXER, seed=0, inplace=inplace)


def enable_checkpointing(model) -> None:
    enable = getattr(model, "activation_checkpointing_enable", None) or model.gradient_checkpointing_enable
    enable()


def live_bytes(*models) -> int:
    """Bytes of the distinct storages of the models' parameters and buffers (tied weights once)."""
    seen: dict[int, int] = {}
    for m in models:
        for t in [*m.parameters(), *m.buffers()]:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def plan_module():
    """hybridlab.train.plan, or (None, reason) while the memory plan is missing or incomplete."""
    try:
        plan = importlib.import_module("hybridlab.train.plan")
    except Exception as exc:  # noqa: BLE001
        return None, f"hybridlab.train.plan does not import: {type(exc).__name__}: {exc}"
    missing = [f for f in ("estimate_step", "measure_peak_bytes") if not callable(getattr(plan, f, None))]
    if missing:
        return None, f"hybridlab.train.plan has no {', '.join(missing)} yet"
    return plan, None


def estimate_step(plan, config, *, micro_batch: int, seq_len: int, grad_accum: int, mixer_layers: int, cuda: bool,
                  distill: dict) -> tuple[Any, str | None]:
    try:
        return plan.estimate_step(config, micro_batch=micro_batch, seq_len=seq_len, grad_accum=grad_accum,
                                  world_size=1, task="stage2",
                                  mixer=MIXER, mixer_layers=mixer_layers, teacher=config,
                                  precision="bf16" if cuda else "fp32",
                                  checkpointing=bool(distill["gradient_checkpointing"]),
                                  chunk_tokens=distill["kl_chunk_tokens"], vocab_chunk=distill["kl_vocab_chunk"]), None
    except Exception as exc:  # noqa: BLE001 - the plan's failure is a result of this stage
        return None, f"plan.estimate_step failed: {type(exc).__name__}: {str(exc)[:300]}"


def pick_micro_batch(plan, config, spec, mixer_layers, distill, total_memory: int | None) -> tuple[int, str]:
    """The requested micro batch, else the largest of 1, 2, 4 the plan fits in 90 % of the device."""
    if spec.get("micro_batch"):
        return int(spec["micro_batch"]), "requested"
    if spec["dry_run"]:
        return 2, "dry run"
    if plan is None or not total_memory:
        return 1, "default (no memory plan)"
    best = 1
    for mb in (1, 2, 4):
        est, _ = estimate_step(plan, config, micro_batch=mb, seq_len=spec["seq_len"], grad_accum=spec["grad_accum"],
                               mixer_layers=mixer_layers, cuda=True, distill=distill)
        if est is not None and est.total <= 0.9 * total_memory:
            best = mb
    return best, "largest of 1/2/4 the plan fits in 90% of the device memory"


def run_distill(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One stage-2 distillation benchmark (see the module docstring); yields one record."""
    from train_throughput import FlopCounter, Probe, _Enough

    from hybridlab.train import distill as dist
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train

    cuda = not spec["dry_run"]
    device = "cuda" if cuda else "cpu"
    settings = paper_settings()
    d = dict(settings["distill"])
    if spec["dry_run"]:
        d["kl_chunk_tokens"] = 32  # several KL chunks at T=64
    T, name = spec["seq_len"], spec["name"]
    config = qwen3_config(name, spec["dry_run"], max_positions=T)
    teacher = build_dense(config, device, torch.float32)
    student = to_hybrid(teacher, settings["fa_ratio"], device, inplace=False)
    teacher = dist.freeze(teacher.to(torch.bfloat16 if cuda else torch.float32))  # as workflow_scripts/distill.py
    for p in student.parameters():
        p.requires_grad_(True)
    if d["gradient_checkpointing"]:
        enable_checkpointing(student)
    mixer_layers = len(student.hybridlab_spec.mixer_layers)
    plan, plan_reason = plan_module()
    total_memory = torch.cuda.get_device_properties(0).total_memory if cuda else None
    mb, mb_reason = pick_micro_batch(plan, config, spec, mixer_layers, d, total_memory)
    accum, warmup, steps = spec["grad_accum"], spec["warmup"], spec["steps"]
    s_count, t_count = FlopCounter.of(student), FlopCounter.of(teacher)
    n_params = sum(p.numel() for p in student.parameters())
    record: dict[str, Any] = {
        "name": name, "seq_len": T, "micro_batch": mb, "micro_batch_reason": mb_reason, "grad_accum": accum,
        "paper_grad_accum": d["stage2"].get("grad_accum", 1), "warmup_updates": warmup, "timed_updates": steps,
        "student_params": n_params, "fa_layers": student.hybridlab_spec.fa_layers, "mixer": MIXER,
        "checkpointing": bool(d["gradient_checkpointing"]), "kl_chunk_tokens": d["kl_chunk_tokens"],
        "precision": "bf16 autocast" if cuda else "fp32", "oom": False,
    }

    def batch_flops(b: torch.Tensor) -> float:
        lengths = [b.shape[1]] * b.shape[0]
        return s_count.train(lengths) + t_count.forward(lengths)

    class PeakProbe(Probe):
        """The benchmark's probe, resetting CUDA's peak counter at the first timed update."""

        def on_step_start(self, step, model, optimizer):
            if cuda and len(self.starts) == warmup:
                torch.cuda.synchronize()
                torch.cuda.reset_peak_memory_stats()
            if cuda:
                torch.cuda.synchronize()  # the update before this one is finished when its time is taken
            super().on_step_start(step, model, optimizer)

    gen = torch.Generator().manual_seed(0)
    rows = torch.randint(config.vocab_size, (max(4, 2 * mb * accum), T), generator=gen)
    task = dist.Stage2Task(teacher, chunk_tokens=d["kl_chunk_tokens"], vocab_chunk=d["kl_vocab_chunk"])
    probe = PeakProbe(task, batch_flops, warmup + steps)
    resident = live_bytes(student, teacher)

    def run_loop():
        with tempfile.TemporaryDirectory(prefix="gpu_acceptance_") as out_dir:
            run = {k: v for k, v in d["stage2"].items() if k not in ("token_budget", "steps")}
            cfg = TrainConfig.from_dict({**run, "steps": warmup + steps + 1, "micro_batch_size": mb,
                                         "grad_accum": accum, "seq_len": T, "warmup_steps": 1, "out_dir": out_dir,
                                         "eval_every": None, "ckpt_every": None, "progress": False,
                                         "log_every": 1000})
            try:
                train(student, probe, rows, cfg, on_step_start=probe.on_step_start,
                      grad_norm_groups=dist.grad_norm_groups())
            except _Enough:
                pass

    try:
        if cuda:
            run_loop()
            record["peak_bytes"] = int(torch.cuda.max_memory_allocated())
            record["peak_kind"] = "cuda_max_memory_allocated over the timed updates"
        elif plan is not None:
            _, delta = plan.measure_peak_bytes(run_loop)
            record["peak_bytes"] = int(resident + delta)
            record["peak_kind"] = "live model bytes + plan.measure_peak_bytes of the run"
        else:
            run_loop()
            record["peak_bytes"] = None
            record["peak_kind"] = f"not measured on CPU: {plan_reason}"
    except torch.OutOfMemoryError as exc:
        record.update(oom=True, error=f"CUDA out of memory at micro batch {mb}: {str(exc)[:200]}")
        yield record
        return
    dt = [b - a for a, b in zip(probe.starts[warmup:], probe.starts[warmup + 1:])]
    tokens, flops = probe.tokens[warmup:warmup + steps], probe.flops[warmup:warmup + steps]
    update_s = sorted(dt)[len(dt) // 2]
    record.update(update_s=update_s, tokens_per_update=tokens[0], flops_per_update=flops[0],
                  tokens_per_s=tokens[0] / update_s, flops_per_s=flops[0] / update_s,
                  resident_model_bytes=resident)
    record.update(plan_fields(plan, plan_reason, config, record, mixer_layers, cuda, d))
    yield record


def plan_fields(plan, reason, config, record, mixer_layers, cuda, d) -> dict[str, Any]:
    """The plan's estimate at the measured shape, and its relative error against the measured peak."""
    out: dict[str, Any] = {"plan_estimate": None, "plan_estimate_allocated": None, "plan_terms": None,
                           "plan_rel_err": None, "plan_reason": reason}
    if plan is None:
        return out
    est, err = estimate_step(plan, config, micro_batch=record["micro_batch"], seq_len=record["seq_len"],
                             grad_accum=record["grad_accum"], mixer_layers=mixer_layers, cuda=cuda, distill=d)
    if est is None:
        out["plan_reason"] = err
        return out
    terms = {k: int(v) for k, v in dict(est.terms).items()}
    # max_memory_allocated never sees the CUDA context, so it is left out of the comparison
    allocated = int(est.total) - terms.get("cuda_context", 0)
    out.update(plan_estimate=int(est.total), plan_estimate_allocated=allocated, plan_terms=terms, plan_reason=None)
    if record.get("peak_bytes"):
        out["plan_rel_err"] = (allocated - record["peak_bytes"]) / record["peak_bytes"]
    return out


# ---- NIAH generation ---------------------------------------------------------------------------------
class IdsTokenizer:
    """Stub tokenizer for `run_niah`: a prompt is a key for prepared token ids; decoding lists the ids."""

    pad_token_id = 0
    eos_token_id = 0

    def __init__(self, prompts: dict[str, torch.Tensor]):
        self.prompts = prompts

    def __call__(self, text: str, return_tensors: str | None = None):
        return {"input_ids": self.prompts[text]}

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return " ".join(str(int(i)) for i in ids)


def run_niah(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Generation time and peak memory of the 4B-shaped `spec["model"]` ("hybrid" | "dense") per context."""
    from hybridlab.eval.niah import NiahExample, run_niah as niah_runner

    cuda = not spec["dry_run"]
    device = "cuda" if cuda else "cpu"
    dtype = torch.bfloat16 if cuda else torch.float32
    contexts = spec["contexts"]
    config = qwen3_config("qwen3_4b", spec["dry_run"], max_positions=max(contexts) + spec["new_tokens"] + 16)
    model = build_dense(config, device, dtype)
    if spec["model"] == "hybrid":
        model = to_hybrid(model, paper_settings()["fa_ratio"], device, inplace=True).to(dtype)
    model.eval()
    gen = torch.Generator().manual_seed(0)
    warm = min(256, contexts[0])
    prompts = {f"ids-{n}": torch.randint(config.vocab_size, (1, n), generator=gen) for n in [warm, *contexts]}
    tok = IdsTokenizer(prompts)

    def example(n: int) -> NiahExample:
        return NiahExample(prompt=f"ids-{n}", answers=("0",), task="niah_single", lang="random",
                           context_tokens=n, depth=0.5, target_tokens=n)

    warm_rows = niah_runner(model, tok, [example(warm)], 2, device)  # compiles the kernels, untimed
    yield {"meta": {"model": spec["model"], "params": sum(p.numel() for p in model.parameters()),
                    "fa_layers": getattr(getattr(model, "hybridlab_spec", None), "fa_layers", None),
                    "warmup_s": warm_rows["seconds"][0], "dtype": str(dtype).replace("torch.", ""),
                    "new_tokens": spec["new_tokens"]}}
    plan, _ = plan_module()
    for n in contexts:  # one at a time, so a timeout keeps the finished lengths
        row = niah_runner(model, tok, [example(n)], spec["new_tokens"], device).row(0, named=True)
        rec = {"model": spec["model"], "context": n, "seconds": row["seconds"], "peak_bytes": row["peak_memory_bytes"],
               "memory_kind": row["memory_kind"], "oom": bool(row["oom"]), "plan_estimate": None,
               "plan_rel_err": None}
        if plan is not None and callable(getattr(plan, "estimate_generate", None)):
            try:
                mixer_layers = len(model.hybridlab_spec.mixer_layers) if spec["model"] == "hybrid" else 0
                est = plan.estimate_generate(config, batch=1, context=n, mixer=MIXER if mixer_layers else None,
                                             mixer_layers=mixer_layers, precision="bf16" if cuda else "fp32")
                rec["plan_estimate"] = int(est.total) - int(dict(est.terms).get("cuda_context", 0))
                if cuda and rec["peak_bytes"] and not rec["oom"]:  # on CPU the peak is the process RSS
                    rec["plan_rel_err"] = (rec["plan_estimate"] - rec["peak_bytes"]) / rec["peak_bytes"]
            except Exception as exc:  # noqa: BLE001
                rec["plan_reason"] = f"plan.estimate_generate failed: {type(exc).__name__}: {str(exc)[:200]}"
        yield rec
        if rec["oom"]:
            for m in contexts[contexts.index(n) + 1:]:
                yield {"model": spec["model"], "context": m, "seconds": None, "peak_bytes": None, "oom": True,
                       "skipped": True, "plan_estimate": None}
            return


STAGES = {"device": run_device, "distill": run_distill, "niah": run_niah}


def finite(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)

"""Model stages of the GPU acceptance script: the device probe, the warm-up, the distillation step and NIAH.

- `device`: what the orchestrator needs before the other stages: device name and memory, library
  versions, whether fla imports, and on CPU the measured fp32 matmul throughput (the dry run's MFU
  reference, `_common.measure_matmul_gflops`).
- `warmup`: pays Triton's compilation and fla's autotuning before the timed stages, one record per
  item with its seconds (reported apart from the stages' timings). Compiled kernels land in Triton's
  cache directory, and with `TRITON_CACHE_AUTOTUNING=1` (set by the orchestrator) the autotuning
  results too, so the later stages' processes load them instead of compiling. Items: the kernel
  stage's ops at its shape (forward + backward, fp32 and bf16), and per distillation model a 4-layer
  hybrid of its width with bf16 parameters: one training forward + backward at the timed sequence
  length under bf16 autocast (the distillation stage's kernels), and a no-grad generation of 2 tokens
  (prefill and decoding kernels of the NIAH stage).
- `engine`: the paths the distillation stage does not take: a KDA hybrid, stage 1 (teacher inputs,
  mixers only), Muon (`ShardedMuon`), a SIGTERM that makes the loop write a DCP checkpoint and stop,
  and a resume that loads it (`run_engine`).
- `distill`: one Qwen3-shaped random student (Qwen3-4B: its first 12 of 36 layers at full width,
  `SLICE_LAYERS`, since the whole student's training state alone is ~76 GB), converted to a hybrid with
  the project's conversion (`standard_periodic` placement at the paper preset's `fa_ratio`, GDN mixers), trained for stage 2
  through the project's loop and its sharded engine (`hybridlab.train.loop.train` with
  `fsdp="always"`: FSDP2 in a group of one, bf16 parameters with fp32 master shards on CUDA, the frozen
  bf16 teacher's forward, the chunked KL of `distill.Stage2Task`, backward, gradient clipping, AdamW
  step) with the paper preset's distillation settings (KL chunking, activation checkpointing, lr
  schedule) at seq 4096; the memory plan's line is the one for the same world size (1) and sharding. Reported: tokens/s, achieved FLOP/s and the FLOPs counted by
  `train_throughput.FlopCounter` (student forward + backward + teacher forward), the peak memory of
  the timed updates (`torch.cuda.max_memory_allocated` after a reset at the first timed update; on
  CPU the teacher's live bytes plus `plan.measure_peak_bytes` of the run, which allocates the student's
  shards while the engine frees the student's own weights) and the memory plan's estimate
  (`plan.estimate_step`) with its relative error, and the plan's line for the whole depth
  (`plan_estimate_full_depth`). The untimed first update is reported as `warmup_update_s`.

Also the Qwen3 shapes and model builders the NIAH stage (`_acceptance_niah.py`) shares. Weights are
random: the stages measure cost, not quality.
"""

from __future__ import annotations

import gc
import importlib
import importlib.metadata
import platform
import statistics
import tempfile
import time
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
# Students measured on a slice of their depth at full width: a whole Qwen3-4B hybrid student (4.7B parameters,
# fp32 master weights, gradients and two AdamW states: ~76 GB) and its bf16 teacher (~8 GB) cannot train on one
# 80 GB GPU. Every layer has the full model's shapes, so tokens/s per layer and the per-layer memory terms
# carry over; the plan is checked at the slice and its full-depth line is reported beside it.
SLICE_LAYERS = {"qwen3_4b": 12}
DRY_SLICE_LAYERS = {"qwen3_4b": 3}


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


def run_warmup(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Compile and autotune every kernel the timed stages call (see the module docstring); one record per item."""
    import _acceptance_kernels as kernels

    cuda = not spec["dry_run"]
    device = "cuda" if cuda else "cpu"

    def timed(what: str, fn) -> dict[str, Any]:
        start = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        return {"what": what, "seconds": time.perf_counter() - start}

    k = spec["kernels"]
    gen = torch.Generator().manual_seed(0)
    for op in kernels.OPS:
        chunk, _ = kernels._ops(op)
        base = kernels.make_inputs(op, k["T"], k["H"], k["K"], k["V"])
        for label, dtype in kernels.DTYPES.items():
            x = {n: (t.to(dtype) if n in ("q", "k", "v") else t).to(device) for n, t in base.items()}
            d_o = torch.randn(1, k["T"], k["H"], k["V"], generator=gen).to(device, dtype)
            d_s = torch.randn(1, k["H"], k["K"], k["V"], generator=gen).to(device)
            yield timed(f"kernel {op} {label}", lambda: kernels.forward_backward(chunk, op, x, d_o, d_s))
    fa_ratio = paper_settings()["fa_ratio"]
    T = spec["seq_len"]
    for name in spec["models"]:
        config = qwen3_config(name, spec["dry_run"], max_positions=T)
        config.num_hidden_layers = 4
        hybrid = to_hybrid(build_dense(config, device, torch.float32), fa_ratio, device, inplace=True)
        if cuda:  # the sharded engine computes with bf16 parameters (buffers stay fp32, as under FSDP2)
            for prm in hybrid.parameters():
                prm.data = prm.data.to(torch.bfloat16)
        ids = torch.randint(config.vocab_size, (1, T), generator=gen).to(device)

        def train_step():
            with torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
                hybrid(input_ids=ids).logits.float().mean().backward()

        def generate():
            with torch.no_grad(), torch.autocast(device, dtype=torch.bfloat16, enabled=cuda):
                hybrid.generate(ids, max_new_tokens=2, do_sample=False, attention_mask=torch.ones_like(ids))

        yield timed(f"{name} training forward + backward", train_step)
        yield timed(f"{name} generation (prefill + 2 tokens)", generate)
        del hybrid
        gc.collect()
        if cuda:
            torch.cuda.empty_cache()


# ---- models ----------------------------------------------------------------------------------------
def qwen3_config(name: str, dry_run: bool, max_positions: int, layers: int | None = None):
    """The model's Qwen3Config (random weights); `layers` keeps only that many of its layers (a depth slice)."""
    from transformers import Qwen3Config

    shape = dict((DRY_SHAPES if dry_run else QWEN3_SHAPES)[name])
    if layers is not None:
        shape["num_hidden_layers"] = layers
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


def live_bytes(*models) -> int:
    """Bytes of the distinct storages of the models' parameters and buffers (tied weights once)."""
    seen: dict[int, int] = {}
    for m in models:
        for t in [*m.parameters(), *m.buffers()]:
            s = t.untyped_storage()
            seen[s.data_ptr()] = s.nbytes()
    return sum(seen.values())


def plan_module():
    """hybridlab.pipeline.cluster.plan, or (None, reason) while the memory plan is missing or incomplete."""
    try:
        plan = importlib.import_module("hybridlab.pipeline.cluster.plan")
    except Exception as exc:  # noqa: BLE001
        return None, f"hybridlab.pipeline.cluster.plan does not import: {type(exc).__name__}: {exc}"
    missing = [f for f in ("estimate_step", "measure_peak_bytes") if not callable(getattr(plan, f, None))]
    if missing:
        return None, f"hybridlab.pipeline.cluster.plan has no {', '.join(missing)} yet"
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
    """The requested micro batch, else the largest of 1, 2, 4 the plan fits in 90 % of the device; when not
    even 1 fits, 1 with a reason that says so (the run then measures how far the plan is off)."""
    if spec.get("micro_batch"):
        return int(spec["micro_batch"]), "requested"
    if spec["dry_run"]:
        return 2, "dry run"
    if plan is None or not total_memory:
        return 1, "default (no memory plan)"
    fits, first = [], None
    for mb in (1, 2, 4):
        est, _ = estimate_step(plan, config, micro_batch=mb, seq_len=spec["seq_len"], grad_accum=spec["grad_accum"],
                               mixer_layers=mixer_layers, cuda=True, distill=distill)
        first = est if first is None else first
        if est is not None and est.total <= 0.9 * total_memory:
            fits.append(mb)
    if not fits:
        need = f"{first.total / 2**30:.1f} GiB" if first is not None else "an unknown amount"
        return 1, (f"none of 1/2/4 fits: the plan predicts {need} at micro batch 1 against 90% of "
                   f"{total_memory / 2**30:.1f} GiB")
    return max(fits), "largest of 1/2/4 the plan fits in 90% of the device memory"


class _Student:
    """The models, FLOP counters and settings of one distillation benchmark (at `SLICE_LAYERS` depth)."""

    def __init__(self, spec: dict[str, Any]):
        from train_throughput import FlopCounter

        from hybridlab.models.placements import fa_layers
        from hybridlab.train import distill as dist

        self.cuda = not spec["dry_run"]
        device = "cuda" if self.cuda else "cpu"
        settings = paper_settings()
        self.d = dict(settings["distill"])
        if spec["dry_run"]:
            self.d["kl_chunk_tokens"] = 32  # several KL chunks at T=64
        slices = DRY_SLICE_LAYERS if spec["dry_run"] else SLICE_LAYERS
        self.full_config = qwen3_config(spec["name"], spec["dry_run"], max_positions=spec["seq_len"])
        self.config = qwen3_config(spec["name"], spec["dry_run"], max_positions=spec["seq_len"],
                                   layers=slices.get(spec["name"]))
        full_layers = self.full_config.num_hidden_layers
        self.full_mixer_layers = full_layers - len(fa_layers(PLACEMENT, full_layers, ratio=settings["fa_ratio"]))
        teacher = build_dense(self.config, device, torch.float32)
        self.student = to_hybrid(teacher, settings["fa_ratio"], device, inplace=False)
        # the teacher only runs forward: bf16 on CUDA, as workflow_scripts/distill.py keeps it
        self.teacher = dist.freeze(teacher.to(torch.bfloat16 if self.cuda else torch.float32))
        for p in self.student.parameters():  # stage 2 trains the whole student
            p.requires_grad_(True)
        self.mixer_layers = len(self.student.hybridlab_spec.mixer_layers)
        self.s_count, self.t_count = FlopCounter.of(self.student), FlopCounter.of(self.teacher)

    def batch_flops(self, b: torch.Tensor) -> float:
        lengths = [b.shape[1]] * b.shape[0]
        return self.s_count.train(lengths) + self.t_count.forward(lengths)

    def timed_run(self, mb: int, spec: dict[str, Any], plan) -> dict[str, Any]:
        """`warmup` + `steps` updates through the loop at micro batch `mb`; times, tokens, FLOPs, peak bytes."""
        from train_throughput import Probe, _Enough

        from hybridlab.train import distill as dist
        from hybridlab.train.config import TrainConfig
        from hybridlab.train.loop import train

        cuda, d, T = self.cuda, self.d, spec["seq_len"]
        accum, warmup, steps = spec["grad_accum"], spec["warmup"], spec["steps"]

        class PeakProbe(Probe):
            """The throughput benchmark's probe; on CUDA it syncs before each time stamp and resets the
            peak-memory counter at the first timed update."""

            def on_step_start(self, step, model, optimizer):
                if cuda:
                    torch.cuda.synchronize()
                    if len(self.starts) == warmup:
                        torch.cuda.reset_peak_memory_stats()
                super().on_step_start(step, model, optimizer)

        rows = torch.randint(self.config.vocab_size, (max(4, 2 * mb * accum), T),
                             generator=torch.Generator().manual_seed(0))
        task = dist.Stage2Task(self.teacher, chunk_tokens=d["kl_chunk_tokens"], vocab_chunk=d["kl_vocab_chunk"])
        probe = PeakProbe(task, self.batch_flops, warmup + steps)

        def run_loop():
            with tempfile.TemporaryDirectory(prefix="gpu_acceptance_") as out_dir:
                run = {k: v for k, v in d["stage2"].items() if k not in ("token_budget", "steps")}
                # fsdp "always": FSDP2 at world size 1, the multi-GPU path (bf16 parameters on CUDA)
                cfg = TrainConfig.from_dict({**run, "steps": warmup + steps + 1, "micro_batch_size": mb,
                                             "grad_accum": accum, "seq_len": T, "warmup_steps": 1,
                                             "out_dir": out_dir, "eval_every": None, "ckpt_every": None,
                                             "progress": False, "log_every": 1000, "fsdp": "always",
                                             # the engine's per-layer checkpointing, as the distillation job
                                             "activation_checkpointing": bool(d["gradient_checkpointing"])})
                try:
                    train(self.student, probe, rows, cfg, on_step_start=probe.on_step_start,
                          grad_norm_groups=dist.grad_norm_groups())
                except _Enough:
                    pass

        out: dict[str, Any] = {"resident_model_bytes": live_bytes(self.student, self.teacher)}
        if cuda:
            run_loop()
            out.update(peak_bytes=int(torch.cuda.max_memory_allocated()),
                       peak_kind="cuda max_memory_allocated over the timed updates")
        elif plan is not None:
            teacher_bytes = live_bytes(self.teacher)
            _, delta = plan.measure_peak_bytes(run_loop)  # the student's shards are allocated inside the run
            out.update(peak_bytes=teacher_bytes + int(delta),
                       peak_kind="live teacher bytes + plan.measure_peak_bytes of the sharded run")
        else:
            run_loop()
            out.update(peak_bytes=None, peak_kind="not measured on CPU without plan.measure_peak_bytes")
        dt = [b - a for a, b in zip(probe.starts[warmup:], probe.starts[warmup + 1:])]
        update_s = statistics.median(dt)
        tokens = statistics.median(probe.tokens[warmup:warmup + steps])
        flops = statistics.median(probe.flops[warmup:warmup + steps])
        out["warmup_update_s"] = probe.starts[warmup] - probe.starts[0] if len(probe.starts) > warmup else None
        return out | {"update_s": update_s, "tokens_per_update": tokens, "flops_per_update": flops,
                      "tokens_per_s": tokens / update_s, "flops_per_s": flops / update_s}


def run_distill(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """One stage-2 distillation benchmark (see the module docstring); yields one record.

    A CUDA out-of-memory error halves the micro batch and retries (down to 1) with a fresh student (the
    sharded engine leaves an abandoned run's weights on meta); the sizes that did not fit are listed in
    `oom_micro_batches`, and an OOM at micro batch 1 is the result.
    """
    job = _Student(spec)
    plan, plan_reason = plan_module()
    total_memory = torch.cuda.get_device_properties(0).total_memory if job.cuda else None
    mb, mb_reason = pick_micro_batch(plan, job.config, spec, job.mixer_layers, job.d, total_memory)
    record: dict[str, Any] = {
        "name": spec["name"], "seq_len": spec["seq_len"], "micro_batch_reason": mb_reason,
        "layers": job.config.num_hidden_layers, "full_layers": job.full_config.num_hidden_layers,
        "grad_accum": spec["grad_accum"], "paper_grad_accum": job.d["stage2"].get("grad_accum", 1),
        "warmup_updates": spec["warmup"], "timed_updates": spec["steps"],
        "student_params": sum(p.numel() for p in job.student.parameters()),
        "fa_layers": job.student.hybridlab_spec.fa_layers, "mixer": MIXER,
        "checkpointing": bool(job.d["gradient_checkpointing"]), "kl_chunk_tokens": job.d["kl_chunk_tokens"],
        "precision": "bf16 parameters (fp32 master shards), bf16 autocast" if job.cuda else "fp32",
        "sharding": "FSDP2 (fsdp=always), world size 1", "oom": False, "oom_micro_batches": [],
    }
    while True:
        record["micro_batch"] = mb
        try:
            record.update(job.timed_run(mb, spec, plan))
            break
        except torch.OutOfMemoryError as exc:
            message = f"CUDA out of memory at micro batch {mb}: {str(exc)[:200]}"
        # outside the except block, so the traceback (and the tensors its frames hold) can be freed
        record["oom_micro_batches"].append(mb)
        del job
        gc.collect()
        torch.cuda.empty_cache()
        if mb == 1:
            record.update(oom=True, error=message)
            yield record
            return
        mb //= 2
        job = _Student(spec)
    record.update(plan_fields(plan, plan_reason, job.config, record, job.mixer_layers, job.cuda, job.d))
    record["plan_estimate_full_depth"] = None
    if plan is not None:  # what the whole model would need on one GPU at the measured micro batch
        est, _ = estimate_step(plan, job.full_config, micro_batch=record["micro_batch"], seq_len=record["seq_len"],
                               grad_accum=record["grad_accum"], mixer_layers=job.full_mixer_layers, cuda=job.cuda,
                               distill=job.d)
        record["plan_estimate_full_depth"] = None if est is None else int(est.total)
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


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def run_engine(spec: dict[str, Any]) -> Iterator[dict[str, Any]]:
    """Stage 1 of a KDA hybrid with Muon through the sharded engine, preempted and resumed; yields one record.

    The Qwen3-0.6B-shaped student (KDA mixers, `standard_periodic` at the paper's `fa_ratio`) trains its
    mixers on the frozen teacher's inputs (`distill.Stage1Task`, teacher-forced) with `optimizer: muon`
    (`ShardedMuon` for the mixers' matrices, AdamW for the rest) under FSDP2 at world size 1. A SIGTERM
    sent to the process during the second update makes the loop write a DCP checkpoint after it and stop
    (`Preempted`); a fresh student then resumes from that checkpoint (DCP load) and runs the last update.
    """
    import math
    import os
    import signal

    import polars as pl

    from hybridlab.errors import HybridlabError
    from hybridlab.models.convert import convert_to_hybrid
    from hybridlab.models.placements import fa_layers
    from hybridlab.train import distill as dist
    from hybridlab.train.checkpoint import latest_checkpoint
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train

    cuda = not spec["dry_run"]
    device = "cuda" if cuda else "cpu"
    settings = paper_settings()
    T, steps = spec["seq_len"], spec["steps"]
    config = qwen3_config("qwen3_0.6b", spec["dry_run"], max_positions=T)
    fa = fa_layers(PLACEMENT, config.num_hidden_layers, ratio=settings["fa_ratio"])
    rows = torch.randint(config.vocab_size, (2 * steps, T), generator=torch.Generator().manual_seed(0))

    def models():
        teacher = build_dense(config, device, torch.float32)
        with torch.device(device):
            student = convert_to_hybrid(teacher, fa, "kda", seed=0)
        dist.freeze_all_but_mixers(student)
        return dist.freeze(teacher.to(torch.bfloat16 if cuda else torch.float32)), student

    def sigterm_during_second_update(step, model, optimizer):
        if step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the loop only records it; the update runs to its end

    def timed_run(cfg, hook=None):
        """Fresh models, one `train` call; (result or the HybridlabError it raised, seconds, trainable params)."""
        teacher, student = models()
        n_trainable = sum(p.numel() for p in student.parameters() if p.requires_grad)
        task = dist.Stage1Task(teacher, student, inputs="teacher")
        start = time.perf_counter()
        try:
            outcome = train(student, task, rows, cfg, on_step_start=hook)
        except HybridlabError as exc:  # Preempted: a checkpoint was written after the update in flight
            outcome = exc
        finally:
            task.close()
        if cuda:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - start
        del teacher, student, task
        gc.collect()
        return outcome, seconds, n_trainable

    record: dict[str, Any] = {"mixer": "kda", "fa_layers": fa, "seq_len": T, "updates": steps, "optimizer": "muon",
                              "task": "stage 1 (teacher inputs, mixers only)", "sharding": "FSDP2 (fsdp=always)"}
    with tempfile.TemporaryDirectory(prefix="gpu_acceptance_engine_") as out:
        cfg = TrainConfig.from_dict({
            "out_dir": out, "steps": steps, "micro_batch_size": 1, "seq_len": T, "lr": 1e-3, "warmup_steps": 1,
            "optimizer": "muon", "grad_clip": None, "precision": "bf16" if cuda else "fp32", "device": device,
            "fsdp": "always", "progress": False, "log_every": 1, "final_checkpoint": "full",
            "activation_checkpointing": bool(settings["distill"]["gradient_checkpointing"])})
        first, record["first_run_s"], record["trainable_params"] = timed_run(cfg, sigterm_during_second_update)
        record["preempted"] = isinstance(first, HybridlabError) and "SIGTERM" in str(first)
        ckpt = latest_checkpoint(Path(out) / "checkpoints")
        record["checkpoint"] = None if ckpt is None else ckpt.name
        record["checkpoint_bytes"] = None if ckpt is None else _dir_bytes(ckpt)
        result, record["resume_s"], _ = timed_run(cfg)
        if isinstance(result, HybridlabError):
            raise result
        record["final_step"] = result.step
        losses = [float(x) for x in pl.read_parquet(result.metrics_path)["loss"].to_list()]
        record["losses"] = losses
        record["losses_finite"] = bool(losses) and all(math.isfinite(x) for x in losses)
        if cuda:
            record["peak_bytes"] = int(torch.cuda.max_memory_allocated())
    yield record


STAGES = {"device": run_device, "warmup": run_warmup, "distill": run_distill, "engine": run_engine}


"""The distillation jobs: one stage of the two-stage recipe (`distill`), and a placement's stage-1 student
assembled from the shared stage 1 (`assemble_stage1`). Conventions (work directories, checks before the first
update, atomic publishing) as in `hybridlab.pipeline.jobs.train`; torch and the models are imported lazily.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from hybridlab.atomic import atomic_dir
from hybridlab.config_spec import DISTILL_JOBS, DistillStage1Job, DistillStage2Job, job_settings, to_dict
from hybridlab.errors import HybridlabError
from hybridlab.pipeline.jobs.train import (
    INITIAL_EVAL_FILE, SUMMARY_FILE, final_eval, is_main, with_initial_row, write_summary)


def _read_summary(directory: str | Path) -> dict:
    path = Path(directory) / SUMMARY_FILE
    return json.loads(path.read_text()) if path.is_file() else {}


def heldout_identity(langs, rows_per_language) -> dict:
    """What fixes a run's held-out curve rows: a stage whose rows match may reuse another's evaluation."""
    return {"langs": list(langs), "rows_per_language": rows_per_language}


def stage2_rows(stage1_summary: dict, n: int, seed: int, student) -> list[int]:
    """The train rows stage 2 reads: those stage 1's sampler never reached (`sampler.rows_after`).

    `stage1_summary` is the stage-1 result's summary.json; one written before stage 1 recorded its rows (or a
    stage 1 of another mixture or seed) gets a one-line error.
    """
    from hybridlab.train.sampler import rows_after

    seen = stage1_summary.get("train_rows")
    if seen is None:
        raise HybridlabError(f"{student}: its summary.json does not say which train rows stage 1 read; rerun "
                             "stage 1 (snakemake --forcerun distill_stage1)")
    if seen["n"] != n or seen["seed"] != seed:
        raise HybridlabError(f"{student}: stage 1 read a mixture of {seen['n']} train rows with seed {seen['seed']}, "
                             f"stage 2 has {n} rows and seed {seed}; run both stages on the same mixture and seed")
    rows = rows_after(n, seed, seen["seen"])
    if not rows:
        raise HybridlabError(f"stage 1 read all {n} train rows, so stage 2 would repeat them; raise "
                             "data.mixture_tokens")
    return rows


def distill(params: DistillStage1Job | DistillStage2Job | dict, *, stage: int, teacher: str, student: str | Path, mixture: str | Path,
            work: str | Path, out: str | Path, restart: bool = False) -> dict | None:
    """Distil a dense teacher into its converted hybrid: stage 1 (attention alignment) or 2 (logit KL).

    Stage 1: `student` is the converted hybrid; only its mixers train, on the L2 distance between each
    mixer's output and the frozen teacher's attention output (`hybridlab.train.distill.Stage1Task`).
    Stage 2: `student` is the stage-1 result; the whole student trains on forward KL(teacher || student)
    of the logits, chunked so the vocabulary never materialises (`Stage2Task`). `teacher` is a model
    directory or hub id.

    Held-out CE and KL, overall and per language, are evaluated every `eval_every_tokens` tokens on the
    val split (stage 1 also logs the held-out alignment loss ``align``); the evaluation before the first
    update is stored in the work directory (``initial_eval.json``, reused on a resume) and becomes the
    step-0 row of ``metrics.parquet``. A NaN in the final held-out metrics stops the job with one line.
    Writes `out` in `save_hybrid` layout (config.json, model.safetensors, hybrid.json, with
    ``distill_stage<n>`` in hybrid.json's extra) plus ``metrics.parquet`` and ``summary.json`` (stage,
    steps, tokens, trainable_parameters, train_seconds, initial, final). On CUDA the teacher is kept in
    bf16 (it only runs forward) and the loop autocasts to bf16. Returns the summary (None off rank 0).
    """
    import polars as pl
    import torch

    from hybridlab.data.budget import check_budget, check_mixture_vocab, check_train_data
    from hybridlab.data.packed_dataset import PackedDataset
    from hybridlab.models.io import load_hybrid, save_hybrid
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train import distill as D
    from hybridlab.train.config import TrainConfig
    from hybridlab.device import resolve_device
    from hybridlab.train.distributed import init_distributed
    from hybridlab.train.fsdp import Frozen, params_on_meta
    from hybridlab.train.loop import METRICS_FILE, train
    from hybridlab.train.run import work_dir

    job = job_settings(DISTILL_JOBS[stage], params, f"distill.py --stage {stage}")
    run = to_dict(job.stage1 if stage == 1 else job.stage2)
    epochs = run.pop("epochs", None)
    train_set = PackedDataset(mixture, "train", documents=job.document_mask)
    val_set = PackedDataset(mixture, "val", documents=job.document_mask)
    seq_len = train_set.seq_len
    every = {k: D.eval_interval_steps(tokens, run["micro_batch_size"], run["grad_accum"], seq_len)
             for k, tokens in (("eval", job.eval_every_tokens), ("ckpt", job.ckpt_every_tokens))}
    stage1_summary = _read_summary(student) if stage == 2 else {}
    # Stage 2 reads only the train rows stage 1 (same seed, same sampler) never reached; a student that never went
    # through stage 1 (a converted one: no summary) may read them all.
    rows = stage2_rows(stage1_summary, len(train_set), job.seed, student) if stage1_summary else None

    # keyed by settings + input contents (models and mixture): a run of other inputs is never resumed
    # (Snakemake reruns stage 2 when stage 1 changed, for instance); see hybridlab.train.run
    main = is_main()
    work = work_dir(work, {"stage": stage, **to_dict(job)}, [student, teacher, mixture], restart=restart, is_main=main)
    cfg = TrainConfig.from_dict({"out_dir": str(work), "seed": job.seed, "seq_len": seq_len,
                                 "keep_last_k": job.keep_last_k, "final_checkpoint": job.final_checkpoint,
                                 "eval_every": every["eval"], "ckpt_every": every["ckpt"],
                                 "activation_checkpointing": job.gradient_checkpointing, **run})
    if stage == 1:  # the stage-1 curve has two points, before the first update and after the last
        cfg.eval_every = cfg.total_steps()

    # The loop picks the same device per rank; only rank 0 evaluates the start point and writes outputs.
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    dtype = torch.bfloat16 if cfg.resolved_precision(device.type) == "bf16" else torch.float32  # the teacher's
    teacher_model = D.freeze(load_causal_lm(teacher, dtype=dtype)).to(device)
    # The frozen teacher: replicated on every rank, or FSDP-sharded (the memory plan's teacher term); a sharded
    # one needs the process group now, and train() reuses it.
    shard_teacher = job.teacher_sharding == "shard"
    ctx = init_distributed(cfg.device) if shard_teacher else None
    frozen_teacher = Frozen(teacher_model, ctx, shard=True) if shard_teacher else teacher_model
    # Sharded, rank 0 reads the student to its CPU and the engine broadcasts it shard by shard; the other ranks
    # build its structure only (parameters on meta), so no device ever holds the full fp32 student.
    if not (int(os.environ.get("WORLD_SIZE", "1")) > 1 or cfg.fsdp == "always"):
        model = load_hybrid(student, dtype=torch.float32, device=device)
    elif main:
        model = load_hybrid(student, dtype=torch.float32)
    else:
        with params_on_meta():
            model = load_hybrid(student, dtype=torch.float32, weights=False)
    # Before any update: the mixture is in this teacher's tokens (ids fit both embeddings) and holds the budget.
    what = f"distill stage {stage}"
    check_mixture_vocab(mixture, teacher_model, f"{what} teacher {teacher}")
    need = cfg.total_steps() * cfg.batch_size * seq_len
    if rows is None:
        check_train_data(mixture, model, what=what, need_tokens=need, epochs=epochs, fix="raise data.mixture_tokens")
    else:
        check_mixture_vocab(mixture, model, what)
        passes = check_budget(f"{what} (the train rows stage 1 did not read)", need, len(rows) * seq_len,
                              epochs=epochs, fix="raise data.mixture_tokens")
        print(f"{what}: {need} tokens = {passes:.2f} passes over the {len(rows)} train rows stage 1 did not read")
        train_set = torch.utils.data.Subset(train_set, rows)
    torch.manual_seed(job.seed)
    if stage == 1:
        trainable = D.freeze_all_but_mixers(model)
        task = D.Stage1Task(frozen_teacher, model, inputs=job.stage1_inputs)
    else:
        for prm in model.parameters():
            prm.requires_grad_(True)
        trainable = [n for n, _ in model.named_parameters()]
        task = D.Stage2Task(frozen_teacher, chunk_tokens=job.kl_chunk_tokens, vocab_chunk=job.kl_vocab_chunk)
    names = set(trainable)
    n_train = sum(prm.numel() for n, prm in model.named_parameters() if n in names)
    print(f"stage {stage}: {n_train / 1e6:.3f}M trainable parameters, {cfg.total_steps()} updates of "
          f"{cfg.batch_size} x {seq_len} tokens, eval every {cfg.eval_every} updates")

    eval_ids, eval_langs = D.heldout_rows(val_set, job.eval_rows_per_language)
    teacher_memo: dict = {}  # the frozen teacher's hidden states on the held-out rows, computed once

    def eval_fn(m, step):
        out = D.heldout_curve_metrics(m, frozen_teacher, eval_ids, eval_langs, job.eval_batch_size, teacher_memo)
        if stage == 1:
            out["align"] = task.heldout_alignment(m, eval_ids, job.eval_batch_size)
            task.clear()
        return out

    # Before the first update: the curve's 0-token point, evaluated by the loop through the engine like every
    # other point (rank 0 decides; on a resume the stored one is reused).
    initial_path = work / INITIAL_EVAL_FILE
    eval_id = heldout_identity(eval_langs, job.eval_rows_per_language)
    # Stage 2 starts from stage 1's weights: stage 1's last evaluation on the same rows is its first point.
    reused = stage1_summary.get("final") if stage1_summary.get("eval_rows") == eval_id else None
    if main and reused is not None and not initial_path.exists():
        initial_path.write_text(json.dumps({k: v for k, v in reused.items() if k != "align"}, sort_keys=True))
    store_initial = (lambda values: initial_path.write_text(json.dumps(values, sort_keys=True))) \
        if not initial_path.exists() else None

    t0 = time.perf_counter()
    result = train(model, task, train_set, cfg, eval_fn=eval_fn, grad_norm_groups=D.grad_norm_groups(),
                   initial_eval=store_initial)
    seconds = time.perf_counter() - t0
    if ctx is not None:
        ctx.close()
    if stage == 1:
        task.close()
    if not main:
        return None

    initial = json.loads(initial_path.read_text())
    metrics = with_initial_row(pl.read_parquet(work / METRICS_FILE), initial)
    final = final_eval(metrics, f"stage {stage}")

    model.hybridlab_spec.extra = {**model.hybridlab_spec.extra, f"distill_stage{stage}":
                                  {"teacher": teacher, "steps": result.step, "tokens": result.tokens}}
    summary = {"stage": stage, "steps": result.step, "tokens": result.tokens, "trainable_parameters": n_train,
               "train_seconds": seconds, "precision": cfg.resolved_precision(device.type), "initial": initial,
               "final": final, "eval_rows": eval_id,
               "train_rows": {"n": len(train_set), "seed": job.seed, "seen": result.step * cfg.batch_size}}
    with atomic_dir(out) as tmp:
        save_hybrid(model, tmp)
        metrics.write_parquet(tmp / METRICS_FILE)
        write_summary(tmp, summary)
    # The published directory is the stage's result; its resumption checkpoints (weights and optimiser
    # state, several times the model's size) are no longer needed. Metrics and fingerprint stay.
    shutil.rmtree(work / "checkpoints", ignore_errors=True)
    print(f"stage {stage}: held-out KL {initial['kl']:.4f} -> {final['kl']:.4f}, "
          f"CE {initial['ce']:.4f} -> {final['ce']:.4f} ({result.tokens} tokens, {seconds:.1f}s)")
    return summary


def assemble_stage1(params: DistillStage2Job | dict, *, teacher: str, student: str | Path, shared: str | Path,
                    mixture: str | Path, out: str | Path) -> dict:
    """A placement's stage-1 result assembled from the shared stage 1 (`hybridlab.train.distill.assemble`).

    `student` is the placement's converted hybrid, `shared` the published stage 1 of the same teacher, mixer and
    seed with every layer converted (teacher inputs). The result's mixers are the shared run's, its FA layers
    the teacher's. Takes stage 2's settings (`params`): the two held-out evaluations (the converted student,
    the assembled one) run on stage 2's curve rows in its precision, so stage 2 reuses the second as its first
    point. Writes `out` as a stage-1 job does: the model, ``metrics.parquet`` (the two points, at 0 tokens and
    at the shared run's tokens) and ``summary.json`` (the shared run's steps, tokens and train rows, with
    ``assembled_from``).
    """
    import polars as pl
    import torch

    from hybridlab.data.packed_dataset import PackedDataset
    from hybridlab.device import resolve_device
    from hybridlab.models.io import load_hybrid, save_hybrid
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train import distill as D
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import METRICS_FILE

    job = job_settings(DistillStage2Job, params, "assemble_stage1.py")
    shared_summary = _read_summary(shared)
    if shared_summary.get("stage") != 1 or "train_rows" not in shared_summary:
        raise HybridlabError(f"{shared} is not a published stage-1 run (its summary.json lacks stage 1's train "
                             "rows); rerun the shared stage 1")
    run = to_dict(job.stage2)
    run.pop("epochs", None)
    val_set = PackedDataset(mixture, "val", documents=job.document_mask)
    cfg = TrainConfig.from_dict({"out_dir": str(out), "seed": job.seed, "seq_len": val_set.seq_len, **run})
    device = resolve_device(cfg.device)
    precision = cfg.resolved_precision(device.type)
    dtype = torch.bfloat16 if precision == "bf16" else torch.float32
    teacher_model = D.freeze(load_causal_lm(teacher, dtype=dtype)).to(device)
    model = load_hybrid(student, dtype=torch.float32, device=device)
    eval_ids, eval_langs = D.heldout_rows(val_set, job.eval_rows_per_language)
    memo: dict = {}

    def evaluate():
        autocast = torch.autocast(device.type, dtype=torch.bfloat16) if precision == "bf16" else None
        with torch.no_grad(), (autocast or torch.autocast(device.type, enabled=False)):
            return D.heldout_curve_metrics(model.eval(), teacher_model, eval_ids, eval_langs, job.eval_batch_size,
                                           memo)

    t0 = time.perf_counter()
    initial = evaluate()
    layers = D.assemble(model, load_hybrid(shared, dtype=torch.float32, device=device))
    final = evaluate()
    steps, tokens = shared_summary["steps"], shared_summary["tokens"]
    metrics = with_initial_row(pl.DataFrame([{"step": steps, "tokens": tokens,
                                              **{f"eval/{k}": float(v) for k, v in final.items()}}]), initial)
    final_eval(metrics, f"assembled stage 1 of {student}")
    n_train = sum(p.numel() for n, p in model.named_parameters() if D.MIXER_PARAM_MARK in f".{n}")
    model.hybridlab_spec.extra = {**model.hybridlab_spec.extra, "distill_stage1":
                                  {"teacher": teacher, "steps": steps, "tokens": tokens, "assembled_from": str(shared)}}
    summary = {"stage": 1, "steps": steps, "tokens": tokens, "trainable_parameters": n_train,
               "train_seconds": 0.0, "eval_seconds": time.perf_counter() - t0, "precision": precision,
               "initial": initial, "final": final, "eval_rows": heldout_identity(eval_langs, job.eval_rows_per_language),
               "train_rows": shared_summary["train_rows"], "assembled_from": str(shared), "layers": layers}
    with atomic_dir(out) as tmp:
        save_hybrid(model, tmp)
        metrics.write_parquet(tmp / METRICS_FILE)
        write_summary(tmp, summary)
    print(f"assembled stage 1 ({len(layers)} mixers from {shared}): held-out KL {initial['kl']:.4f} -> "
          f"{final['kl']:.4f}, CE {initial['ce']:.4f} -> {final['ce']:.4f}")
    return summary

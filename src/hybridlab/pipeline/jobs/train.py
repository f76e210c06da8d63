"""The pipeline's training jobs: one function per job, called by its thin workflow script.

Every job takes its typed section (`hybridlab.config_spec.job_sections`: built and checked from the JSON
object the rule passes as ``--params``; a dict is built and checked here) and plain paths, and does the
whole run:

- **Work directory.** Checkpoints, the metrics log and any step-0 evaluation live in
  ``<work>/<fingerprint>`` (`hybridlab.train.run.work_dir`): rerunning the same job after a kill resumes
  it, while other settings or input contents start over. ``restart=True`` empties it first.
- **Checks before the first update** (`hybridlab.data.budget`): token ids fit the model's embedding and
  the run's tokens fit in the mixture.
- **Training** in the shared loop (`hybridlab.train.loop.train`), on every rank under torchrun.
- **Publishing.** Rank 0 alone writes the output directory, atomically (`hybridlab.atomic.atomic_dir`:
  everything is written to ``.<name>.tmp-<pid>`` next to it, which then replaces it), with the model,
  ``metrics.parquet`` and ``summary.json`` (indent 1, sorted keys). Other ranks return None.

A workflow script's ``--help`` shows its section's keys (`hybridlab.config_spec.describe_job`). User errors raise `HybridlabError` (one line). This module imports torch and the models lazily, so a
script's ``--help`` stays fast.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

from hybridlab.atomic import atomic_dir
from hybridlab.config_spec import BldNlJob, BldSrJob, TeacherJob, job_settings, to_dict
from hybridlab.errors import HybridlabError

SUMMARY_FILE = "summary.json"
INITIAL_EVAL_FILE = "initial_eval.json"


def is_main() -> bool:
    """Rank 0 under torchrun (or the only process): the one that publishes outputs."""
    return int(os.environ.get("RANK", "0")) == 0


def write_summary(directory: str | Path, summary: dict) -> None:
    (Path(directory) / SUMMARY_FILE).write_text(json.dumps(summary, indent=1, sort_keys=True))


def with_initial_row(metrics, initial: dict):
    """`metrics` (a loop log) with a step-0 row first: the evaluation before any update, as ``eval/<key>``."""
    import polars as pl

    start = pl.DataFrame([{"step": 0, "tokens": 0, **{f"eval/{k}": float(v) for k, v in initial.items()}}])
    return pl.concat([start.cast({"step": metrics.schema["step"], "tokens": metrics.schema["tokens"]}), metrics],
                     how="diagonal_relaxed")


def final_eval(metrics, what: str, key: str = "kl") -> dict:
    """The last held-out evaluation of a metrics log (rows with ``eval/<key>``) as {metric: value}.

    One-line error naming `what` when any value is NaN (the run diverged; its weights are not published).
    """
    import polars as pl

    row = metrics.filter(pl.col(f"eval/{key}").is_not_null()).row(-1, named=True)
    final = {k.removeprefix("eval/"): v for k, v in row.items() if k.startswith("eval/")}
    if not all(v == v for v in final.values()):
        raise HybridlabError(f"{what} ended with NaN held-out metrics; lower the lr and rerun with --restart")
    return final


def pretrain_teacher(params: TeacherJob | dict, *, mixture: str | Path, tokenizer: str | Path, work: str | Path,
                     out: str | Path, restart: bool = False) -> dict | None:
    """Pre-train the dense teacher (Qwen3 architecture) from scratch on the packed multilingual mixture.

    Writes `out`: the final model (``config.json`` + ``model.safetensors``, a normal `from_pretrained`
    directory), ``metrics.parquet`` (loss, lr, held-out CE overall and per language) and ``summary.json``
    (parameters, steps, tokens, final held-out CE ``heldout``, and ``unigram_baseline_ce``, the train
    tokens' unigram entropy the held-out loss is compared against). Returns the summary (None off rank 0).
    The section's `shape` and `train` are required here (the offline presets').
    """
    import numpy as np
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hybridlab.data.budget import check_train_data
    from hybridlab.data.packed_dataset import PackedDataset
    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train
    from hybridlab.train.run import work_dir
    from hybridlab.train.tasks import CausalLMTask, heldout_ce_by_language, unigram_entropy

    job = job_settings(TeacherJob, params, "pretrain_teacher.py")
    if job.shape is None or job.train is None:
        raise HybridlabError("pretrain_teacher.py: --params shape and train are null; pre-training needs the "
                             "teacher's shape (models.teacher) and its run (train.teacher)")
    tok = load_tokenizer(tokenizer)
    run = to_dict(job.train)
    eval_rows = run.pop("eval_rows_per_language")
    epochs = run.pop("epochs", None)
    train_set = PackedDataset(mixture, "train", documents=job.document_mask)
    val_set = PackedDataset(mixture, "val", documents=job.document_mask)
    seq_len = train_set.seq_len

    torch.manual_seed(job.seed)
    config = Qwen3Config(vocab_size=len(tok), max_position_embeddings=seq_len, tie_word_embeddings=True,
                         bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.eos_token_id, **to_dict(job.shape))
    model = Qwen3ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"teacher: {n_params / 1e6:.2f}M parameters, {len(train_set)} train rows of {seq_len} tokens")

    # keyed by params + input contents: a rebuilt mixture starts over instead of resuming (hybridlab.train.run)
    work = work_dir(work, to_dict(job), [mixture, tokenizer], restart=restart, is_main=is_main())
    cfg = TrainConfig.from_dict({"out_dir": str(work), "seed": job.seed, "log_every": 10, **run})
    # Before any update: every token id fits the embedding, and the run's tokens fit in the mixture.
    check_train_data(mixture, model, what="teacher", need_tokens=cfg.total_steps() * cfg.batch_size * seq_len,
                     epochs=epochs, fix="raise data.mixture_tokens")

    def eval_fn(model, step):
        return heldout_ce_by_language(model, val_set, max_rows_per_language=eval_rows,
                                      device=next(model.parameters()).device)

    result = train(model, CausalLMTask(), train_set, cfg, eval_fn=eval_fn)
    if not is_main():  # rank 0 holds the trained weights and publishes
        return None
    final = eval_fn(model.eval(), result.step)
    baseline = unigram_entropy(np.asarray(train_set.tokens), len(tok))

    summary = {"parameters": n_params, "steps": result.step, "tokens": result.tokens,
               "heldout": final, "unigram_baseline_ce": baseline}
    with atomic_dir(out) as tmp:
        model.save_pretrained(tmp, safe_serialization=True)
        shutil.copy(work / "metrics.parquet", tmp / "metrics.parquet")
        write_summary(tmp, summary)
    print(f"held-out CE {final['ce']:.3f} vs unigram baseline {baseline:.3f}")
    return summary


def train_bld_sr(params: BldSrJob | dict, *, data: str | Path, work: str | Path, out: str | Path, restart: bool = False,
                 threads: int | None = None) -> dict | None:
    """Train one arm of BLD on Spaced Retrieval (2 KDA + 2 attention layers, loss on the answer digits).

    The arm says which recurrent blocks freeze when (fractions of training or updates) and, optionally, the
    long-gap share of the train mix (the split is resampled; `hybridlab.train.spaced_retrieval`). `data` holds the
    splits (train/val/test.parquet); `threads` sets torch's CPU threads (None: torch's choice). Writes `out`:

    - ``config.json``, ``model.safetensors``, ``hybrid.json``: the final model (`save_hybrid` layout);
    - ``metrics.parquet``: per logged step loss, lr, gradient norms (total, per layer and per mixer type:
      ``grad_norm/layer<i>/<kind>``, ``grad_norm/<kind>``), ``frozen`` (the recurrent layers were frozen
      during the logged update), per-gap train accuracy (``acc/gap<g>``,
      ``seq_acc/gap<g>``, from the count columns ``sr/...``) and, every `eval_every` steps, validation
      accuracy per gap (``eval/acc/gap<g>``, ``eval/seq_acc/gap<g>``);
    - ``score_checkpoints/step_<step, 6 digits>/`` (`save_hybrid` layout) at the configured fractions of
      training, and ``score_checkpoints/index.json`` listing them (read by the retrieval-score rule);
    - ``summary.json``: arm, seed, parameters, steps, tokens, layer types, freeze windows (in updates) and
      scope, recurrent layers, optimiser-switch step, long-gap fraction, test accuracy per gap, wall time.

    Returns the summary (None off rank 0).
    """
    import polars as pl
    import torch

    from hybridlab.data import spaced_retrieval as sr
    from hybridlab.models.io import save_hybrid
    from hybridlab.train import spaced_retrieval as srt
    from hybridlab.train.bld import grad_norm_groups, plan_bld
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train
    from hybridlab.train.run import work_dir

    job = job_settings(BldSrJob, params, "train_bld_sr.py")
    if threads is not None:
        torch.set_num_threads(threads)
    t0 = time.perf_counter()
    splits = {s: sr.read_split(Path(data) / f"{s}.parquet") for s in sr.SPLITS}
    arm = srt.SRArm.from_dict(to_dict(job.arm))
    seed = job.seed
    train_records = splits["train"]
    if arm.long_gap_fraction is not None:
        train_records = srt.resample_long_gap(train_records, arm.long_gap_fraction, seed)
    gaps = sorted(set(splits["train"].gaps_N.tolist()))

    shape = to_dict(job.train.model)
    chunk_size = shape.pop("mixer_chunk_size", None)
    max_len = max(sr.sequence_length(splits[s].t, int(splits[s].gaps_N.max())) for s in sr.SPLITS)
    model_cfg = srt.SRModelConfig(**shape, pattern=tuple(job.pattern), mixer=job.mixer,
                                  max_position_embeddings=max_len,
                                  mixer_overrides={"chunk_size": chunk_size} if chunk_size else {})
    model = srt.build_sr_model(model_cfg, seed)
    n_params = sum(q.numel() for q in model.parameters())

    run = to_dict(job.train)
    run.pop("model")
    eval_rows = run.pop("eval_rows_per_gap")
    steps = run["steps"]
    plan = plan_bld(model, arm.freeze, steps)
    # keyed by params + the data's contents: other inputs start over instead of resuming (hybridlab.train.run)
    work = work_dir(work, to_dict(job), [data], restart=restart, is_main=is_main())
    cfg = TrainConfig.from_dict({"out_dir": str(work), "seed": seed, **run, **plan.train_config_overrides()})

    score_at = srt.score_steps(job.score_fractions, steps, job.score_updates)
    ckpt = srt.ScoreCheckpointer(str(work / "score_checkpoints"), score_at)
    val = srt.take_per_gap(splits["val"], eval_rows) if eval_rows else splits["val"]

    def eval_fn(model, step):
        return srt.accuracy_by_gap(model, val)

    print(f"arm {arm.name}: {n_params / 1e6:.3f}M parameters, layers {model.hybridlab_spec.layer_types}, "
          f"{len(train_records)} train examples (long-gap fraction {arm.long_gap_fraction}), "
          f"recurrent layers {plan.recurrent_layers} frozen in updates {plan.windows} ({arm.freeze.scope})")
    result = train(model, srt.SpacedRetrievalTask(gaps), sr.SpacedRetrievalDataset(train_records), cfg,
                   collate_fn=sr.collate, on_step_start=[*plan.schedules, ckpt], eval_fn=eval_fn,
                   grad_norm_groups=grad_norm_groups(model))
    if not is_main():  # rank 0 holds the trained weights and publishes
        return None
    model.eval()
    if steps in score_at:
        ckpt.save(steps, model)
    missing = [s for s in score_at if not ckpt.path(s).is_dir()]
    if missing:
        raise HybridlabError(f"score checkpoints {missing} are missing from {ckpt.out_dir}; rerun with --restart")
    with torch.no_grad():
        test_acc = srt.accuracy_by_gap(model, splits["test"])

    index = {"arm": arm.name, "seed": seed, "total_steps": steps, "long_gap_fraction": arm.long_gap_fraction,
             "freeze_windows": plan.windows, "checkpoints": [
                 {"step": s, "fraction": s / steps, "path": f"score_checkpoints/{ckpt.path(s).name}"}
                 for s in score_at]}
    with atomic_dir(out) as tmp:
        save_hybrid(model, tmp)
        metrics = srt.add_accuracy_columns(pl.read_parquet(result.metrics_path), gaps)
        # row `step` logs update step - 1 (hybridlab.train.config): frozen exactly when that update was
        metrics = metrics.with_columns(frozen=pl.Series([plan.frozen_at(s - 1) for s in metrics["step"]],
                                                        dtype=pl.Boolean))
        metrics.write_parquet(tmp / "metrics.parquet")
        shutil.copytree(work / "score_checkpoints", tmp / "score_checkpoints")
        (tmp / "score_checkpoints" / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
        summary = {"arm": arm.name, "seed": seed, "parameters": n_params, "steps": result.step,
                   "tokens": result.tokens, "layer_types": model.hybridlab_spec.layer_types,
                   "freeze_windows": plan.windows, "freeze_scope": arm.freeze.scope,
                   "recurrent_layers": plan.recurrent_layers, "optimizer_switch_step": plan.optimizer_switch_step,
                   "long_gap_fraction": arm.long_gap_fraction, "test": test_acc,
                   "wall_s": round(time.perf_counter() - t0, 1)}
        write_summary(tmp, summary)
    print(f"arm {arm.name}: test " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(test_acc.items())))
    return summary


def train_bld_nl(params: BldNlJob | dict, *, mixture: str | Path, tokenizer: str | Path, work: str | Path, out: str | Path,
                 restart: bool = False, threads: int | None = None) -> dict | None:
    """Train one BLD natural-language arm: a NoPE Attention-Mixer-Mixer-Mixer hybrid on English text.

    See `hybridlab.train.bld_nl` for the model, the arms and the schedule. `mixture` is the packed
    English mixture; `threads` sets torch's CPU threads (None: torch's choice). Writes `out` in
    `save_hybrid` layout (with the tokenizer), ``metrics.parquet`` (loss, lr, grad norms per layer kind,
    held-out CE) and ``summary.json`` (arm, mixer, size, variant, parameters, steps, tokens, context_len,
    freeze windows, frozen parameter count, the optimiser switch and the optimiser after it, final
    held-out CE ``heldout``). Returns the summary (None off rank 0).
    """
    import torch

    job = job_settings(BldNlJob, params, "train_bld_nl.py")
    if threads is not None:
        torch.set_num_threads(threads)

    from hybridlab.data.budget import check_train_data
    from hybridlab.data.packed_dataset import PackedDataset, check_row_blocks
    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.models.io import save_hybrid
    from hybridlab.train import bld_nl
    from hybridlab.train.arms import NLArm
    from hybridlab.train.bld import grad_norm_groups
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train
    from hybridlab.train.run import work_dir
    from hybridlab.train.tasks import CausalLMTask, heldout_ce_by_language

    arm = NLArm(**to_dict(job.arm))
    run, exp, seed = to_dict(job.run), to_dict(job.experiment), job.seed
    tok = load_tokenizer(tokenizer)
    docs = job.document_mask
    train_rows = PackedDataset(mixture, "train", documents=docs)
    k = bld_nl.rows_per_sequence(run["context_len"], train_rows.seq_len)
    check_row_blocks(train_rows, k, f"bld_nl {arm.name}")
    train_set = bld_nl.JoinedRows(train_rows, k)
    val_set = bld_nl.JoinedRows(PackedDataset(mixture, "val", documents=docs), k)

    model = bld_nl.build_nope_hybrid(to_dict(job.shape), pattern=exp["pattern"], mixer=arm.mixer,
                                     vocab_size=len(tok), context_len=run["context_len"],
                                     eos_id=tok.eos_token_id, seed=seed)
    model.hybridlab_spec.extra.update({"arm": arm.name, "variant": arm.variant, "size": arm.size})
    n_params = bld_nl.count_parameters(model)
    steps = bld_nl.total_steps(run, n_params)
    plan = bld_nl.plan_arm(model, arm, steps, freeze_fraction=exp["freeze_fraction"], scope=exp["freeze_scope"],
                           optimizer_after_unfreeze=exp["optimizer_after_unfreeze"])
    # keyed by params + input contents: a rebuilt mixture starts over instead of resuming (hybridlab.train.run)
    work = work_dir(work, to_dict(job), [mixture, tokenizer], restart=restart, is_main=is_main())
    cfg = TrainConfig.from_dict(bld_nl.train_config_dict(run, out_dir=str(work), seed=seed, steps=steps, plan=plan))
    # Before any update: token ids fit the embedding, and the arm's tokens fit in the English mixture.
    why = f"{run['tokens_per_param']:g} tokens/param" if "tokens_per_param" in run else f"{steps} updates"
    check_train_data(mixture, model, what=f"bld_nl {arm.name}", need_tokens=steps * cfg.batch_size * run["context_len"],
                     epochs=run.get("epochs"), why=why, fix="raise data.mixture_tokens / data.english_web_docs")
    frozen = f"updates [0, {plan.windows[0][1]})" if plan.windows else "never"
    print(f"{arm.name}: {n_params / 1e6:.2f}M parameters, layers {model.hybridlab_spec.layer_types}, NoPE, "
          f"{steps} updates of {cfg.batch_size} x {run['context_len']} tokens; recurrent {exp['freeze_scope']}s "
          f"frozen {frozen}; adamw -> {plan.optimizer_after_switch} at update {plan.optimizer_switch_step}")

    groups = {k: v for k, v in grad_norm_groups(model).items() if "/" not in k}  # per kind, not per layer
    eval_rows = job.run.eval_rows

    def eval_fn(model, step):
        return heldout_ce_by_language(model, val_set, max_rows_per_language=eval_rows,
                                      device=next(model.parameters()).device)

    result = train(model, CausalLMTask(), train_set, cfg, on_step_start=plan.schedules, eval_fn=eval_fn,
                   grad_norm_groups=groups)
    if not is_main():  # rank 0 holds the trained weights and publishes
        return None
    final = eval_fn(model.eval(), result.step)

    summary = {"arm": arm.name, "mixer": arm.mixer, "size": arm.size, "variant": arm.variant,
               "parameters": n_params, "steps": result.step, "tokens": result.tokens,
               "context_len": run["context_len"], "freeze_windows": plan.windows,
               "frozen_parameters": len(plan.frozen_names), "optimizer_switch_step": plan.optimizer_switch_step,
               "optimizer_after_switch": plan.optimizer_after_switch, "heldout": final}
    with atomic_dir(out) as tmp:
        save_hybrid(model, tmp, tokenizer=tok)
        shutil.copy(work / "metrics.parquet", tmp / "metrics.parquet")
        write_summary(tmp, summary)
    print(f"{arm.name}: held-out CE {final['ce']:.3f} after {result.step} updates ({result.tokens} tokens)")
    return summary

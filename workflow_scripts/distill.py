"""Distil a dense teacher into its converted hybrid: stage 1 (attention alignment) or stage 2 (logit KL).

`--stage 1`: the student is the converted hybrid; only its mixers train, on the L2 distance between each
mixer's output and the frozen teacher's attention output (`hybridlab.train.distill.Stage1Task`).
`--stage 2`: the student is the stage-1 result; the whole student trains on forward KL(teacher || student)
of the logits, chunked so the vocabulary never materialises (`Stage2Task`).

Both stages run the shared loop (resumable after a kill, `--restart` starts over; the work directory under
--work is keyed by the settings and input contents, `hybridlab.train.run`, so other inputs start over) and evaluate
held-out CE and KL, overall and per language, every `eval_every_tokens` tokens on the val split; stage 1
also logs the held-out alignment loss. The evaluation before the first update is stored as a step-0 row.
Writes --out in `save_hybrid` layout (config.json, model.safetensors, hybrid.json) plus metrics.parquet and
summary.json. On CUDA the teacher is kept in bf16 (it only runs forward) and the loop autocasts to bf16.
"""

import json
import os
import shutil
import time
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--stage", required=True, type=int, choices=(1, 2), help="distillation stage")
    p.add_argument("--teacher", required=True, help="teacher model directory or hub id")
    p.add_argument("--student", required=True, help="student hybrid directory (converted, or stage-1 output)")
    p.add_argument("--mixture", required=True, help="packed multilingual mixture directory")
    p.add_argument("--work", required=True, help="run directory (checkpoints, metrics)")
    p.add_argument("--out", required=True, help="output hybrid directory")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl
    import torch

    from hybridlab.data.budget import check_mixture_vocab, check_train_data
    from hybridlab.data.packing import PackedDataset
    from hybridlab.errors import HybridlabError
    from hybridlab.models.io import load_hybrid, save_hybrid
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train import distill
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.distributed import init_distributed, resolve_device
    from hybridlab.train.fsdp import Frozen
    from hybridlab.train.loop import METRICS_FILE, train

    run = dict(params[f"stage{args.stage}"])
    epochs = run.pop("epochs", None)
    docs = params.get("document_mask", False)  # data.packing.document_mask
    train_set = PackedDataset(args.mixture, "train", documents=docs)
    val_set = PackedDataset(args.mixture, "val", documents=docs)
    seq_len = train_set.seq_len
    every = {k: distill.eval_interval_steps(params[f"{k}_every_tokens"], run["micro_batch_size"],
                                            run.get("grad_accum", 1), seq_len) for k in ("eval", "ckpt")}
    from hybridlab.train.run import work_dir

    # keyed by settings + input contents (models and mixture): a run of other inputs is never resumed
    # (Snakemake reruns stage 2 when stage 1 changed, for instance); see hybridlab.train.run
    work = work_dir(args.work, {"stage": args.stage, **params}, [args.student, args.teacher, args.mixture],
                    restart=args.restart, is_main=int(os.environ.get("RANK", "0")) == 0)
    cfg = TrainConfig.from_dict({"out_dir": str(work), "seed": params["seed"], "seq_len": seq_len,
                                 "eval_every": every["eval"], "ckpt_every": every["ckpt"],
                                 "activation_checkpointing": params["gradient_checkpointing"], **run})

    # The loop picks the same device per rank; only rank 0 evaluates the start point and writes outputs.
    device = resolve_device(cfg.device, int(os.environ.get("LOCAL_RANK", "0")))
    is_main = int(os.environ.get("RANK", "0")) == 0
    dtype = torch.bfloat16 if cfg.resolved_precision(device.type) == "bf16" else torch.float32  # the teacher's
    teacher_model = distill.freeze(load_causal_lm(args.teacher, dtype=dtype)).to(device)
    # The frozen teacher: replicated on every rank, or FSDP-sharded (the memory plan's teacher term); a sharded
    # one needs the process group now, and train() reuses it.
    shard_teacher = params.get("teacher_sharding", "replicate") == "shard"
    ctx = init_distributed(cfg.device) if shard_teacher else None
    teacher = Frozen(teacher_model, ctx, shard=True) if shard_teacher else teacher_model
    student = load_hybrid(args.student, dtype=torch.float32, device=device)
    # Before any update: the mixture is in this teacher's tokens (ids fit both embeddings) and holds the budget.
    what = f"distill stage {args.stage}"
    check_mixture_vocab(args.mixture, teacher_model, f"{what} teacher {args.teacher}")
    check_train_data(args.mixture, student, what=what, need_tokens=cfg.total_steps() * cfg.batch_size * seq_len,
                     epochs=epochs, fix="raise data.mixture_tokens")
    torch.manual_seed(params["seed"])
    if args.stage == 1:
        trainable = distill.freeze_all_but_mixers(student)
        task = distill.Stage1Task(teacher, student, inputs=params["stage1_inputs"])
    else:
        for prm in student.parameters():
            prm.requires_grad_(True)
        trainable = [n for n, _ in student.named_parameters()]
        task = distill.Stage2Task(teacher, chunk_tokens=params["kl_chunk_tokens"],
                                  vocab_chunk=params["kl_vocab_chunk"])
    names = set(trainable)
    n_train = sum(prm.numel() for n, prm in student.named_parameters() if n in names)
    print(f"stage {args.stage}: {n_train / 1e6:.3f}M trainable parameters, {cfg.total_steps()} updates of "
          f"{cfg.batch_size} x {seq_len} tokens, eval every {every['eval']} updates")

    eval_ids, eval_langs = distill.heldout_rows(val_set, params["eval_rows_per_language"])

    def eval_fn(model, step):
        out = distill.heldout_curve_metrics(model, teacher, eval_ids, eval_langs, params["eval_batch_size"])
        if args.stage == 1:
            out["align"] = task.heldout_alignment(model, eval_ids, params["eval_batch_size"])
            task.clear()
        return out

    initial_path = work / "initial_eval.json"
    want_initial = not initial_path.exists()
    if ctx is not None:  # one decision for all ranks (rank 0 writes the file the others would see)
        want_initial = ctx.all_gather_object(want_initial)[0]
    if want_initial and (is_main or ctx is not None):  # a sharded teacher needs every rank in the call
        # Before the first update: the curve's 0-token point (on a resume, the stored one is reused).
        student.eval()
        with torch.no_grad():
            initial = eval_fn(student, 0)
        if is_main:
            initial_path.write_text(json.dumps(initial, sort_keys=True))

    t0 = time.perf_counter()
    result = train(student, task, train_set, cfg, eval_fn=eval_fn,
                   grad_norm_groups=distill.grad_norm_groups())
    seconds = time.perf_counter() - t0
    if ctx is not None:
        ctx.close()
    if args.stage == 1:
        task.close()
    if not is_main:
        return

    initial = json.loads(initial_path.read_text())
    metrics = pl.read_parquet(work / METRICS_FILE)
    start = pl.DataFrame([{"step": 0, "tokens": 0, **{f"eval/{k}": float(v) for k, v in initial.items()}}])
    metrics = pl.concat([start.cast({"step": metrics.schema["step"], "tokens": metrics.schema["tokens"]}), metrics],
                        how="diagonal_relaxed")
    final_row = metrics.filter(pl.col("eval/kl").is_not_null()).row(-1, named=True)
    final = {k.removeprefix("eval/"): v for k, v in final_row.items() if k.startswith("eval/")}
    if not all(map(lambda v: v == v, final.values())):
        raise HybridlabError(f"stage {args.stage} ended with NaN held-out metrics; lower the lr and rerun with --restart")

    out = Path(args.out)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    student.hybridlab_spec.extra = {**student.hybridlab_spec.extra, f"distill_stage{args.stage}":
                                    {"teacher": args.teacher, "steps": result.step, "tokens": result.tokens}}
    save_hybrid(student, tmp)
    metrics.write_parquet(tmp / METRICS_FILE)
    summary = {"stage": args.stage, "steps": result.step, "tokens": result.tokens, "trainable_parameters": n_train,
               "train_seconds": seconds, "initial": initial, "final": final}
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"stage {args.stage}: held-out KL {initial['kl']:.4f} -> {final['kl']:.4f}, "
          f"CE {initial['ce']:.4f} -> {final['ce']:.4f} ({result.tokens} tokens, {seconds:.1f}s)")


if __name__ == "__main__":
    _common.run(main)

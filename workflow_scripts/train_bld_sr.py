"""Train one arm of BLD on Spaced Retrieval (2 KDA + 2 attention layers, loss on the answer digits).

The arm (`--params` key `arm`) says which recurrent blocks freeze when (fractions of training) and,
optionally, the long-gap share of the train mix (the split is resampled; see
`hybridlab.train.spaced_retrieval`). Writes to `--out`:

- `config.json`, `model.safetensors`, `hybrid.json`: the final model (`save_hybrid` layout);
- `metrics.parquet`: per logged step loss, lr, gradient norms (total, per layer and per mixer type:
  `grad_norm/layer<i>/<kind>`, `grad_norm/<kind>`), per-gap train accuracy (`acc/gap<g>`,
  `seq_acc/gap<g>`, from the count columns `sr/...`) and, every `eval_every` steps, validation
  accuracy per gap (`eval/acc/gap<g>`, `eval/seq_acc/gap<g>`);
- `score_checkpoints/step_<step, 6 digits>/` (`save_hybrid` layout) at the configured fractions of training, and
  `score_checkpoints/index.json` listing them (read by the retrieval-score rule);
- `summary.json`: parameters, steps, freeze windows in updates, test accuracy per gap, wall time.

Resumable: loop checkpoints live in `--work`; rerunning after a kill continues the same run. A
different run (any parameter changed) in an existing `--work` starts over (the old run is obsolete).
"""

import json
import shutil
import time
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--data", required=True, help="spaced_retrieval split directory (train/val/test.parquet)")
    p.add_argument("--work", required=True, help="run directory (loop checkpoints, score checkpoints)")
    p.add_argument("--out", required=True, help="arm output directory")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import torch

    from hybridlab.data import spaced_retrieval as sr
    from hybridlab.errors import HybridlabError
    from hybridlab.models.io import save_hybrid
    from hybridlab.train import spaced_retrieval as srt
    from hybridlab.train.bld import grad_norm_groups, plan_bld
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    data = Path(args.data)
    splits = {s: sr.read_split(data / f"{s}.parquet") for s in sr.SPLITS}
    arm = srt.SRArm.from_dict(params["arm"])
    seed = params["seed"]
    train_records = splits["train"]
    if arm.long_gap_fraction is not None:
        train_records = srt.resample_long_gap(train_records, arm.long_gap_fraction, seed)
    gaps = sorted(set(splits["train"].gaps_N.tolist()))

    shape = dict(params["train"]["model"])
    chunk_size = shape.pop("mixer_chunk_size", None)
    max_len = max(sr.sequence_length(splits[s].t, int(splits[s].gaps_N.max())) for s in sr.SPLITS)
    model_cfg = srt.SRModelConfig(**shape, pattern=tuple(params["pattern"]), mixer=params["mixer"],
                                  max_position_embeddings=max_len,
                                  mixer_overrides={"chunk_size": chunk_size} if chunk_size else {})
    model = srt.build_sr_model(model_cfg, seed)
    n_params = sum(q.numel() for q in model.parameters())

    run = dict(params["train"])
    run.pop("model")
    eval_rows = run.pop("eval_rows_per_gap")
    steps = run["steps"]
    plan = plan_bld(model, arm.freeze, steps)
    from hybridlab.train.run import work_dir

    # keyed by params + the data's contents: other inputs start over instead of resuming (hybridlab.train.run)
    work = work_dir(args.work, params, [args.data], restart=args.restart, is_main=_common.is_main())
    cfg = TrainConfig.from_dict({"out_dir": str(work), "seed": seed, **run, **plan.train_config_overrides()})

    score_at = srt.score_steps(params["score_fractions"], steps)
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
    model.eval()
    if steps in score_at:
        ckpt.save(steps, model)
    missing = [s for s in score_at if not ckpt.path(s).is_dir()]
    if missing:
        raise HybridlabError(f"score checkpoints {missing} are missing from {ckpt.out_dir}; rerun with --restart")
    with torch.no_grad():
        test_acc = srt.accuracy_by_gap(model, splits["test"])

    out = Path(args.out)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_hybrid(model, tmp)
    import polars as pl

    metrics = srt.add_accuracy_columns(pl.read_parquet(result.metrics_path), gaps)
    metrics.write_parquet(tmp / "metrics.parquet")
    shutil.copytree(work / "score_checkpoints", tmp / "score_checkpoints")
    index = {"arm": arm.name, "seed": seed, "total_steps": steps, "long_gap_fraction": arm.long_gap_fraction,
             "freeze_windows": plan.windows, "checkpoints": [
                 {"step": s, "fraction": s / steps, "path": f"score_checkpoints/{ckpt.path(s).name}"}
                 for s in score_at]}
    (tmp / "score_checkpoints" / "index.json").write_text(json.dumps(index, indent=1, sort_keys=True))
    summary = {"arm": arm.name, "seed": seed, "parameters": n_params, "steps": result.step, "tokens": result.tokens,
               "layer_types": model.hybridlab_spec.layer_types, "freeze_windows": plan.windows,
               "freeze_scope": arm.freeze.scope, "recurrent_layers": plan.recurrent_layers,
               "optimizer_switch_step": plan.optimizer_switch_step,
               "long_gap_fraction": arm.long_gap_fraction, "test": test_acc,
               "wall_s": round(time.perf_counter() - t0, 1)}
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"arm {arm.name}: test " + ", ".join(f"{k}={v:.3f}" for k, v in sorted(test_acc.items())))


if __name__ == "__main__":
    _common.run(main)

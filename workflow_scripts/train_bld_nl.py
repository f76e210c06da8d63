"""Train one BLD natural-language arm: a NoPE Attention-Mixer-Mixer-Mixer hybrid on English text.

See `hybridlab.train.bld_nl` for the model, the arms and the schedule. Resumable: rerunning the same
command after a kill continues from the last checkpoint in --work (`--restart` starts over).
Writes the final model to --out in `save_hybrid` layout (with the tokenizer), `metrics.parquet`
(loss, lr, grad norms per layer kind, held-out CE) and `summary.json` (parameters, steps, tokens, the
freeze and optimiser-switch updates, final held-out CE).
"""

import json
import shutil
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--mixture", required=True, help="packed English mixture directory")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--work", required=True, help="run directory (checkpoints, metrics)")
    p.add_argument("--out", required=True, help="final model directory")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)

    from hybridlab.data.budget import check_train_data
    from hybridlab.data.packing import PackedDataset, check_row_blocks
    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.models.io import save_hybrid
    from hybridlab.train import bld_nl
    from hybridlab.train.bld import grad_norm_groups
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train
    from hybridlab.train.tasks import CausalLMTask, heldout_ce_by_language

    arm = bld_nl.NLArm(**params["arm"])
    run, exp, seed = params["run"], params["experiment"], params["seed"]
    tok = load_tokenizer(args.tokenizer)
    docs = params.get("document_mask", False)  # data.packing.document_mask
    train_rows = PackedDataset(args.mixture, "train", documents=docs)
    k = bld_nl.rows_per_sequence(run["context_len"], train_rows.seq_len)
    check_row_blocks(train_rows, k, f"bld_nl {arm.name}")
    train_set = bld_nl.JoinedRows(train_rows, k)
    val_set = bld_nl.JoinedRows(PackedDataset(args.mixture, "val", documents=docs), k)

    model = bld_nl.build_nope_hybrid(params["shape"], pattern=exp["pattern"], mixer=arm.mixer,
                                     vocab_size=len(tok), context_len=run["context_len"],
                                     eos_id=tok.eos_token_id, seed=seed)
    model.hybridlab_spec.extra.update({"arm": arm.name, "variant": arm.variant, "size": arm.size})
    n_params = bld_nl.count_parameters(model)
    steps = bld_nl.total_steps(run, n_params)
    plan = bld_nl.plan_arm(model, arm, steps, freeze_fraction=exp["freeze_fraction"], scope=exp["freeze_scope"],
                           optimizer_after_unfreeze=exp["optimizer_after_unfreeze"])
    from hybridlab.train.run import work_dir

    # keyed by params + input contents: a rebuilt mixture starts over instead of resuming (hybridlab.train.run)
    work = work_dir(args.work, params, [args.mixture, args.tokenizer], restart=args.restart, is_main=_common.is_main())
    cfg = TrainConfig.from_dict(bld_nl.train_config_dict(run, out_dir=str(work), seed=seed, steps=steps, plan=plan))
    # Before any update: token ids fit the embedding, and the arm's tokens fit in the English mixture.
    why = f"{run['tokens_per_param']:g} tokens/param" if "tokens_per_param" in run else f"{steps} updates"
    check_train_data(args.mixture, model, what=f"bld_nl {arm.name}", need_tokens=steps * cfg.batch_size * run["context_len"],
                     epochs=run.get("epochs"), why=why, fix="raise data.mixture_tokens / data.english_web_docs")
    frozen = f"updates [0, {plan.windows[0][1]})" if plan.windows else "never"
    print(f"{arm.name}: {n_params / 1e6:.2f}M parameters, layers {model.hybridlab_spec.layer_types}, NoPE, "
          f"{steps} updates of {cfg.batch_size} x {run['context_len']} tokens; recurrent {exp['freeze_scope']}s "
          f"frozen {frozen}; adamw -> {plan.optimizer_after_switch} at update {plan.optimizer_switch_step}")

    groups = {k: v for k, v in grad_norm_groups(model).items() if "/" not in k}  # per kind, not per layer
    eval_rows = run.get("eval_rows", 16)

    def eval_fn(model, step):
        return heldout_ce_by_language(model, val_set, max_rows_per_language=eval_rows,
                                      device=next(model.parameters()).device)

    result = train(model, CausalLMTask(), train_set, cfg, on_step_start=plan.schedules, eval_fn=eval_fn,
                   grad_norm_groups=groups)
    if not _common.is_main():  # every rank holds the trained weights; rank 0 publishes
        return
    final = eval_fn(model.eval(), result.step)

    out = Path(args.out)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    save_hybrid(model, tmp, tokenizer=tok)
    shutil.copy(work / "metrics.parquet", tmp / "metrics.parquet")
    summary = {"arm": arm.name, "mixer": arm.mixer, "size": arm.size, "variant": arm.variant,
               "parameters": n_params, "steps": result.step, "tokens": result.tokens,
               "context_len": run["context_len"], "freeze_windows": plan.windows,
               "frozen_parameters": len(plan.frozen_names), "optimizer_switch_step": plan.optimizer_switch_step,
               "optimizer_after_switch": plan.optimizer_after_switch, "heldout": final}
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"{arm.name}: held-out CE {final['ce']:.3f} after {result.step} updates ({result.tokens} tokens)")


if __name__ == "__main__":
    _common.run(main)

"""Pre-train the dense teacher (Qwen3 architecture from a local config) on the multilingual mixture.

Resumable: rerunning the same command after a kill continues from the last checkpoint in --work.
Writes the final model (`config.json` + `model.safetensors`, a normal `from_pretrained` directory),
`metrics.parquet` (loss, lr, held-out CE overall and per language) and `summary.json` with the
unigram baseline the held-out loss is compared against.
"""

import json
import shutil
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--mixture", required=True, help="packed mixture directory")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--work", required=True, help="run directory (checkpoints, metrics)")
    p.add_argument("--out", required=True, help="final model directory")
    p.add_argument("--restart", action="store_true", help="delete previous checkpoints and start over")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import numpy as np
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hybridlab.data.budget import check_train_data
    from hybridlab.data.packing import PackedDataset
    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.train.config import TrainConfig
    from hybridlab.train.loop import train
    from hybridlab.train.run import work_dir
    from hybridlab.train.tasks import CausalLMTask, heldout_ce_by_language, unigram_entropy

    tok = load_tokenizer(args.tokenizer)
    run = dict(params["train"])
    eval_rows = run.pop("eval_rows_per_language", 8)
    epochs = run.pop("epochs", None)
    docs = params.get("document_mask", False)  # data.packing.document_mask
    train_set = PackedDataset(args.mixture, "train", documents=docs)
    val_set = PackedDataset(args.mixture, "val", documents=docs)
    seq_len = train_set.seq_len

    torch.manual_seed(params["seed"])
    config = Qwen3Config(vocab_size=len(tok), max_position_embeddings=seq_len, tie_word_embeddings=True,
                         bos_token_id=tok.eos_token_id, eos_token_id=tok.eos_token_id,
                         pad_token_id=tok.eos_token_id, **params["shape"])
    model = Qwen3ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    print(f"teacher: {n_params / 1e6:.2f}M parameters, {len(train_set)} train rows of {seq_len} tokens")

    # keyed by params + input contents: a rebuilt mixture starts over instead of resuming (hybridlab.train.run)
    work = work_dir(args.work, params, [args.mixture, args.tokenizer], restart=args.restart, is_main=_common.is_main())
    cfg = TrainConfig.from_dict({"out_dir": str(work), "seed": params["seed"], "log_every": 10, **run})
    # Before any update: every token id fits the embedding, and the run's tokens fit in the mixture.
    check_train_data(args.mixture, model, what="teacher", need_tokens=cfg.total_steps() * cfg.batch_size * seq_len,
                     epochs=epochs, fix="raise data.mixture_tokens")

    def eval_fn(model, step):
        return heldout_ce_by_language(model, val_set, max_rows_per_language=eval_rows,
                                      device=next(model.parameters()).device)

    result = train(model, CausalLMTask(), train_set, cfg, eval_fn=eval_fn)
    if not _common.is_main():  # every rank holds the trained weights; rank 0 publishes
        return
    final = eval_fn(model.eval(), result.step)
    baseline = unigram_entropy(np.asarray(train_set.tokens), len(tok))

    out = Path(args.out)
    tmp = out.parent / f".{out.name}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp, safe_serialization=True)
    shutil.copy(work / "metrics.parquet", tmp / "metrics.parquet")
    summary = {"parameters": n_params, "steps": result.step, "tokens": result.tokens,
               "heldout": final, "unigram_baseline_ce": baseline}
    (tmp / "summary.json").write_text(json.dumps(summary, indent=1, sort_keys=True))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    print(f"held-out CE {final['ce']:.3f} vs unigram baseline {baseline:.3f}")


if __name__ == "__main__":
    _common.run(main)

"""Retrieval heads of every BLD natural-language arm (DuoAttention-style gates, `hybridlab.eval.retrieval_heads`).

Passkey examples are built from the held-out English text of the packed English mixture (the val rows,
contiguous text) with the data tokenizer: `n_train` to train the gates, `n_test` (other haystack slices
and keys) for the masking curve; the same examples for every arm. Writes

- --out    (retrieval_heads.parquet): model, mixer, size, variant, layer, kv_head, alpha
- --curve  (retrieval_heads_masking.parquet): model, mixer, size, variant, n_masked, frac_masked,
           masked_layer, masked_kv_head, masked_alpha, accuracy, token_accuracy, answer_nll, n (test examples)
"""

import os
from pathlib import Path

import _common


def arm_columns(model_dir: str, name: str) -> dict:
    """(mixer, size, variant) of a BLD-NL arm from its hybrid.json (written by train_bld_nl.py)."""
    from hybridlab.models.io import read_spec

    spec = read_spec(model_dir)
    extra = spec.get("extra") or {}
    return {"model": name, "mixer": spec["mixer_kind"], "size": extra.get("size"), "variant": extra.get("variant")}


def write_parquet(df, path: str) -> None:
    tmp = f"{path}.tmp"
    df.write_parquet(tmp)
    os.replace(tmp, path)


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--models", nargs="+", required=True, help="arm directories (save_hybrid layout)")
    p.add_argument("--mixture", required=True, help="packed English mixture directory")
    p.add_argument("--tokenizer", required=True, help="tokenizer directory")
    p.add_argument("--work", required=True, help="scratch directory for the gate-training runs")
    p.add_argument("--out", required=True, help="alpha table (parquet)")
    p.add_argument("--curve", required=True, help="masking-curve table (parquet)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import polars as pl

    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.eval import retrieval_heads as rh
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train.bld_nl import val_stream

    cfg_in, seed = params["retrieval_heads"], params["seed"]
    duo = rh.DuoConfig(sink=cfg_in["sink"], recent=cfg_in["recent"], steps=cfg_in["steps"],
                       micro_batch_size=cfg_in["micro_batch_size"], lr=cfg_in["lr"], l1=cfg_in["l1"], seed=seed)
    tok = load_tokenizer(args.tokenizer)
    hay = val_stream(args.mixture)
    common = dict(context_len=cfg_in["context_len"], n_digits=cfg_in["n_digits"], sink=duo.sink, recent=duo.recent)
    train_ex = rh.make_passkey_examples(tok, hay, n=cfg_in["n_train"], seed=seed, **common)
    test_ex = rh.make_passkey_examples(tok, hay, n=cfg_in["n_test"], seed=seed + 1, **common)
    print(f"passkey: {cfg_in['n_train']} train / {cfg_in['n_test']} test examples of {cfg_in['context_len']} "
          f"tokens; streaming = {duo.sink} sink + {duo.recent} recent tokens")

    alpha_tables, curves = [], []
    for model_dir in args.models:
        name = Path(model_dir).name
        meta = arm_columns(model_dir, name)
        torch.manual_seed(seed)
        model = load_causal_lm(model_dir, dtype=params.get("dtype", "float32"),
                               device_map=params.get("device", "cpu"))
        alphas, curve = rh.analyse_retrieval_heads(model, train_ex, test_ex, duo, model_name=name,
                                                   out_dir=str(Path(args.work) / name))
        extra = [pl.lit(meta[k]).cast(pl.String).alias(k) for k in ("mixer", "size", "variant")]
        alpha_tables.append(alphas.with_columns(extra))
        # n: the passkey test examples behind each accuracy (the figure's Wilson intervals)
        curves.append(curve.with_columns(*extra, n=pl.lit(int(test_ex["input_ids"].shape[0]), pl.Int64)))
        full, masked = curve["accuracy"][0], curve["accuracy"][-1]
        print(f"{name}: alpha {[round(a, 3) for a in alphas['alpha'].to_list()]}; passkey accuracy "
              f"{full:.3f} full -> {masked:.3f} all heads streaming; answer NLL {curve['answer_nll'][0]:.3f} -> "
              f"{curve['answer_nll'][-1]:.3f}")
    write_parquet(pl.concat(alpha_tables), args.out)
    write_parquet(pl.concat(curves), args.curve)


if __name__ == "__main__":
    _common.run(main)

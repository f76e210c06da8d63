"""Attention-recency table: local attention mass and mean attention distance of every full-attention head.

For every analysis model (`hybridlab.eval.pairs`) and configured language, `n_sequences` monolingual
documents (seeded order, the first ones with at least `input_tokens` tokens in the model's tokenizer)
are cut to their first `input_tokens` tokens and run with eager attention; the probabilities of each
full-attention (FA) layer give, per head, the mass on the last w tokens for every window w and the
mean attention distance (`hybridlab.eval.recency`). Do the FA layers of hybrids attend further back
than those of the dense model at the same depth?

Output `--out` (tidy parquet), one row per (model, pair, lang, layer, head, window):
  model, pair, role (hybrid | dense), lang, layer (decoder layer of an FA layer), head,
  window, mass (mean over queries q >= w of the attention on the last w keys),
  mean_distance (mean over queries of sum_k A[q, k] (q - k); the same for every window of a head),
  n_sequences, input_tokens
"""

import time

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--mono", required=True, help="monolingual corpus parquet (doc_id, lang, text, source)")
    p.add_argument("--out", required=True, help="output table (.parquet)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl

    from hybridlab.eval import pairs
    from hybridlab.errors import HybridlabError
    from hybridlab.eval.recency import attention_recency

    cfg = params["recency"]
    mono = pl.read_parquet(args.mono)
    device = pairs.analysis_device()
    docs = pairs.mono_documents(mono, cfg["languages"], params["seed"])
    print(f"recency: {cfg['n_sequences']} x {cfg['input_tokens']} tokens per language {cfg['languages']}, "
          f"windows {cfg['windows']}, device {device}")
    tables = []
    for m in pairs.analysis_models(**params["models"]):
        t0 = time.perf_counter()
        model, tok = pairs.load_analysis_model(m, dtype=params["dtype"], device=device, eager_attention=True)
        fa = pairs.fa_layers(model)
        if not fa:
            raise HybridlabError(f"model {m.name} has no full-attention layer; attention recency needs one")
        for lang, texts in docs.items():
            seqs = pairs.token_windows(tok, texts, cfg["n_sequences"], cfg["input_tokens"], lang)
            df = attention_recency(model, seqs, fa, cfg["windows"], device=device, batch_size=cfg["batch_size"])
            df = df.with_columns(pl.lit(lang).alias("lang"), pl.lit(len(seqs)).alias("n_sequences"),
                                 pl.lit(cfg["input_tokens"]).alias("input_tokens"))
            keys = pl.DataFrame(pairs.pair_rows(m))
            tables.append(keys.join(df, how="cross"))
        del model
        print(f"  {m.name}: FA layers {fa}, {time.perf_counter() - t0:.1f}s")

    table = (pl.concat(tables)
             .select("model", "pair", "role", "lang", "layer", "head", "window", "mass", "mean_distance",
                     "n_sequences", "input_tokens")
             .sort("model", "pair", "lang", "layer", "head", "window"))
    pairs.write_table(table, args.out)
    print(table.group_by("model", "window").agg(pl.col("mass").mean(), pl.col("mean_distance").mean())
          .sort("model", "window"))


if __name__ == "__main__":
    _common.run(main)

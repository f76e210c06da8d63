"""Retrieval heads of every BLD natural-language arm (DuoAttention-style gates, `hybridlab.eval.retrieval_heads`).

Passkey examples from the held-out English text of the packed English mixture, the same for every arm
(`retrieval_heads_tables`). Writes
- --out    (retrieval_heads.parquet): model, layer, kv_head, alpha, mixer, size, variant
- --curve  (retrieval_heads_masking.parquet): model, n_masked, frac_masked, masked_layer, masked_kv_head,
           masked_alpha, accuracy, token_accuracy, answer_nll, mixer, size, variant, n (test examples)
"""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import RetrievalHeadsJob

    p = _common.parser(__doc__, RetrievalHeadsJob)
    p.add_argument("--models", type=Path, nargs="+", required=True, help="arm directories (save_hybrid layout)")
    p.add_argument("--mixture", type=Path, required=True, help="packed English mixture directory")
    p.add_argument("--tokenizer", type=Path, required=True, help="tokenizer directory")
    p.add_argument("--work", type=Path, required=True, help="scratch directory for the gate-training runs")
    p.add_argument("--out", type=Path, required=True, help="alpha table (parquet)")
    p.add_argument("--curve", type=Path, required=True, help="masking-curve table (parquet)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_job(RetrievalHeadsJob, args.params)
    _common.set_threads(args.threads)

    from hybridlab.pipeline.jobs.eval import retrieval_heads_job

    retrieval_heads_job(params, models=args.models, mixture=args.mixture, tokenizer=args.tokenizer, work=args.work,
                        out=args.out, curve=args.curve)


if __name__ == "__main__":
    _common.run(main)

"""Attention-recency table: local attention mass and mean attention distance of every full-attention head.

Do the FA layers of hybrids attend further back than those of the dense model at the same depth? Writes
`--out` (tidy parquet), one row per (model, pair, lang, layer, head, window): model, pair, role (hybrid |
dense), lang, layer (decoder layer of an FA layer), head, window, mass (mean over queries q >= w of the
attention on the last w keys), mean_distance (mean over queries of sum_k A[q, k] (q - k)), their 95 %
bootstrap intervals over the sequences (mass_lo, mass_hi, mean_distance_lo, mean_distance_hi), n_sequences,
input_tokens, n_boot. Definitions: `hybridlab.eval.recency` (`recency_table`).
"""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import RecencyJob

    p = _common.parser(__doc__, RecencyJob)
    p.add_argument("--mono", type=Path, required=True, help="monolingual corpus parquet (doc_id, lang, text, source)")
    p.add_argument("--out", type=Path, required=True, help="output table (.parquet)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.eval import recency_job

    recency_job(_common.load_job(RecencyJob, args.params), mono=args.mono, out=args.out)


if __name__ == "__main__":
    _common.run(main)

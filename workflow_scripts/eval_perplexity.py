"""Per-language CE / perplexity / KL-to-teacher of every teacher and stage-2 student, and tokens to baseline.

Writes (parquet; definitions: `hybridlab.eval.perplexity.perplexity_tables`)
--out         model, teacher, placement, mixer, seed, lang, n_tokens, ce, ppl, kl: the first
              `rows_per_language` held-out rows of each language, plus a lang="all" row per model; teacher
              rows have null placement, mixer, seed and kl; `seed` is the student's replicate seed
--tokens-out  teacher, mixer, seed, placement, metric, lang, target, tokens, baseline_tokens, fraction, final:
              the stage-2 held-out curves of every placement against the same seed's baseline placement
--rows-out    (optional) model, teacher, placement, mixer, seed, lang, row, n_tokens, ce, kl: one row per
              model x held-out row (paired on `row` across the models of one teacher)
"""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import PerplexityJob

    p = _common.parser(__doc__, PerplexityJob)
    p.add_argument("--mixture", type=Path, required=True,
                   help="packed multilingual mixture directory (params.mixtures overrides it per teacher)")
    p.add_argument("--out", type=Path, required=True, help="perplexity table (parquet)")
    p.add_argument("--tokens-out", type=Path, required=True, help="tokens-to-baseline table (parquet)")
    p.add_argument("--rows-out", type=Path, help="per-row CE / KL table (parquet)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.eval import perplexity_job

    perplexity_job(_common.load_job(PerplexityJob, args.params), mixture=args.mixture, out=args.out,
                   tokens_out=args.tokens_out, rows_out=args.rows_out)


if __name__ == "__main__":
    _common.run(main)

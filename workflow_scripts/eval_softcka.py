"""SoftCKA table: cross-lingual similarity of every layer, English vs each parallel language, per model.

Writes `--out` (tidy parquet), one row per (model, pair, kind, layer, lang): model, pair, role, kind (hidden |
attn_delta), layer, layer_type, lang, cka, cka_lo, cka_hi, cka_debiased, alignment, alignment_lo, alignment_hi,
alignment_method, alignment_gram_rows, alignment_pooled, language_offset, language_offset_lo, language_offset_hi, mmd,
n_sentences, method, sigma_eng, sigma_x, sigma_pair, sigma_convention.
Definitions and the method: `hybridlab.eval.softcka.softcka_table` and the `hybridlab.eval.softcka` module.
"""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import SoftckaJob

    p = _common.parser(__doc__, SoftckaJob)
    p.add_argument("--parallel", type=Path, required=True, help="parallel corpus parquet (sid, lang, text, source)")
    p.add_argument("--model", help="one analysis model (its name): its rows only (the rule's per-model jobs; "
                                   "gather_eval.py softcka joins them)")
    p.add_argument("--out", type=Path, required=True, help="output table (.parquet)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.eval import softcka_job

    softcka_job(_common.load_job(SoftckaJob, args.params), parallel=args.parallel, out=args.out, model=args.model)


if __name__ == "__main__":
    _common.run(main)

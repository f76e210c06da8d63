"""Layer importance of one teacher x mixer: each layer's attention replaced alone by its stage-1 mixer.

Writes `--out` (parquet, one row per group x layer: teacher, mixer, group, layer, kl, kl_lo, kl_hi, residual,
residual_lo, residual_hi, residual_rel, p_top, chosen, n_fa, n_languages, n_sentences) and `--rows` (one row per layer x sentence: the
summed KL and residual terms). Definitions: `hybridlab.eval.layer_importance`. The searched placements'
conversions read `--out`.
"""

from pathlib import Path

import _common


def main() -> None:
    from hybridlab.config_spec import LayerImportanceJob

    p = _common.parser(__doc__, LayerImportanceJob)
    p.add_argument("--teacher", required=True, help="teacher model directory")
    p.add_argument("--student", required=True, help="the stage-1 all_mixers student directory")
    p.add_argument("--tokenizer", required=True, help="the teacher's tokenizer directory")
    p.add_argument("--parallel", type=Path, required=True, help="parallel corpus parquet (sid, lang, text, source)")
    p.add_argument("--out", type=Path, required=True, help="scores by group x layer (.parquet)")
    p.add_argument("--rows", type=Path, required=True, help="terms by layer x sentence (.parquet)")
    args = p.parse_args()
    job = _common.load_job(LayerImportanceJob, args.params)

    from hybridlab.pipeline.jobs.eval import layer_importance_job

    for line in layer_importance_job(job, teacher=args.teacher, student=args.student, tokenizer=args.tokenizer,
                                     parallel=args.parallel, out=args.out, rows=args.rows):
        print(line)


if __name__ == "__main__":
    _common.run(main)

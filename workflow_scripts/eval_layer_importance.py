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

    import polars as pl
    import torch

    from hybridlab.device import fast_dtype
    from hybridlab.errors import HybridlabError
    from hybridlab.eval.layer_importance import group_scores, importance_sentences, score_layers
    from hybridlab.models.convert import hybrid_spec
    from hybridlab.models.io import load_hybrid
    from hybridlab.models.placements import num_fa_layers
    from hybridlab.models.registry import load_causal_lm, load_tokenizer_for
    from hybridlab.train.distill import mixer_wrappers

    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, fast_dtype(job.dtype, device))
    teacher = load_causal_lm(args.teacher, dtype=dtype).to(device).eval()
    student = load_hybrid(args.student, dtype=dtype, device=device)
    spec = hybrid_spec(student)
    if spec.fa_layers:
        raise HybridlabError(f"{args.student} keeps full attention at layers {spec.fa_layers}; the importance pass "
                             "needs the all_mixers student (every layer converted)")
    languages = [job.english] + [lang for lang in job.languages if lang != job.english]
    text = importance_sentences(pl.read_parquet(args.parallel), languages, job.sentences)
    tokenizer = load_tokenizer_for(args.tokenizer)
    ids = tokenizer(text["text"].to_list(), add_special_tokens=False)["input_ids"]
    keep = [i for i, s in enumerate(ids) if len(s) >= 2]
    rows = score_layers(teacher, mixer_wrappers(student), [ids[i] for i in keep], text["lang"].gather(keep).to_list(),
                        text["sid"].gather(keep).to_list(), batch_size=job.batch_size)
    n_fa = num_fa_layers(spec.num_layers, job.fa_ratio)
    scores = group_scores(rows, job.english, n_fa, n_boot=job.n_boot, seed=job.seed)
    label = [pl.lit(job.teacher).alias("teacher"), pl.lit(job.mixer).alias("mixer")]
    _common.write_parquet(rows.select(*label, pl.all()), args.rows)
    _common.write_parquet(scores.select(*label, pl.all()), args.out)
    for g in scores.partition_by("group", maintain_order=True):
        chosen = g.filter(pl.col("chosen"))["layer"].to_list()
        print(f"{g['group'][0]}: FA layers {chosen} (layer 0 in the top {n_fa} in "
              f"{g.filter(pl.col('layer') == 0)['p_top'][0]:.0%} of {job.n_boot} bootstraps)")


if __name__ == "__main__":
    _common.run(main)

"""Job functions of the evaluation rules that combine several library parts: the layer importance pass (a
teacher and its all_mixers stage-1 student) and the lm-eval benchmarks (paper preset)."""

from __future__ import annotations

from pathlib import Path

from hybridlab.config_spec import LayerImportanceJob, LmBenchmarksJob, job_settings, to_dict
from hybridlab.errors import HybridlabError


def layer_importance_job(params: LayerImportanceJob | dict, *, teacher: str | Path, student: str | Path,
                         tokenizer: str | Path, parallel: str | Path, out: str | Path, rows: str | Path) -> list[str]:
    """Each layer's attention replaced alone by its stage-1 mixer: per-sentence terms to `rows`, scores by group x
    layer to `out` (definitions: `hybridlab.eval.layer_importance`); returns one summary line per group."""
    import polars as pl
    import torch

    from hybridlab.atomic import atomic_file
    from hybridlab.device import fast_dtype
    from hybridlab.eval.layer_importance import group_scores, importance_sentences, score_layers
    from hybridlab.models.convert import hybrid_spec
    from hybridlab.models.io import load_hybrid
    from hybridlab.models.placements import num_fa_layers
    from hybridlab.models.registry import load_causal_lm, load_tokenizer_for
    from hybridlab.train.distill import mixer_wrappers

    job = job_settings(LayerImportanceJob, params, "eval_layer_importance.py")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    dtype = getattr(torch, fast_dtype(job.dtype, device))
    student_model = load_hybrid(str(student), dtype=dtype, device=device)
    spec = hybrid_spec(student_model)
    if spec.fa_layers:
        raise HybridlabError(f"{student} keeps full attention at layers {spec.fa_layers}; the importance pass "
                             "needs the all_mixers student (every layer converted)")
    teacher_model = load_causal_lm(str(teacher), dtype=dtype).to(device).eval()
    languages = [job.english] + [lang for lang in job.languages if lang != job.english]
    text = importance_sentences(pl.read_parquet(parallel), languages, job.sentences)
    ids = load_tokenizer_for(str(tokenizer))(text["text"].to_list(), add_special_tokens=False)["input_ids"]
    keep = [i for i, s in enumerate(ids) if len(s) >= 2]
    terms = score_layers(teacher_model, mixer_wrappers(student_model), [ids[i] for i in keep],
                         text["lang"].gather(keep).to_list(), text["sid"].gather(keep).to_list(),
                         batch_size=job.batch_size)
    n_fa = num_fa_layers(spec.num_layers, job.fa_ratio)
    scores = group_scores(terms, job.english, n_fa, n_boot=job.n_boot, seed=job.seed)
    label = [pl.lit(job.teacher).alias("teacher"), pl.lit(job.mixer).alias("mixer")]
    for frame, path in ((terms, rows), (scores, out)):
        with atomic_file(path) as tmp:  # parents created
            frame.select(*label, pl.all()).write_parquet(tmp)
    lines = []
    for g in scores.partition_by("group", maintain_order=True):
        chosen = g.filter(pl.col("chosen"))["layer"].to_list()
        lines.append(f"{g['group'][0]}: FA layers {chosen} (layer 0 in the top {n_fa} in "
                     f"{g.filter(pl.col('layer') == 0)['p_top'][0]:.0%} of {job.n_boot} bootstraps)")
    return lines


def lm_benchmarks_job(params: LmBenchmarksJob | dict, *, models: list[str], tokenizers: list[str], out: str | Path,
                      work: str | Path | None = None) -> None:
    """lm-eval on each model (loaded with `load_causal_lm`, handed to lm-eval's HFLM wrapper,
    `hybridlab.eval.lm_eval`), one table to `out`. With `work`, each finished lm-eval call is kept, keyed by the
    settings and the model's weights, and a rerun skips it. Without lm-eval the job stops with one line before
    loading any model."""
    import polars as pl

    from hybridlab.atomic import atomic_file
    from hybridlab.data.tokenizer import load_tokenizer
    from hybridlab.eval.lm_eval import RULER_TASKS, LMEvalConfig, require_lm_eval, run_lm_eval
    from hybridlab.models.registry import load_causal_lm

    job = job_settings(LmBenchmarksJob, params, "eval_lm_benchmarks.py")
    require_lm_eval()
    c = job.lm_eval
    cfg = LMEvalConfig(tasks=c.tasks, ruler_lengths=c.ruler_lengths, ruler_tasks=c.ruler_tasks or RULER_TASKS,
                       ruler_exclude=c.ruler_exclude, num_fewshot=c.num_fewshot, batch_size=c.batch_size,
                       limit=c.limit, max_length=c.max_length, seed=job.seed, ruler_samples=c.ruler_samples or None)
    if len(tokenizers) not in (1, len(models)):
        raise HybridlabError(f"--tokenizer: {len(tokenizers)} tokenizers for {len(models)} models; give one "
                             "per model (same order) or one for all")
    tok_paths = list(tokenizers) * len(models) if len(tokenizers) == 1 else list(tokenizers)
    tables = []
    for model_dir, tok_path in zip(models, tok_paths):
        # results/<phase>/<scale>/<what> -> <what> (e.g. distill/<teacher>/<student>/stage2: unique per teacher)
        parts = Path(model_dir).parts
        name = "/".join(parts[3:] if parts[0] == "results" and len(parts) > 3 else parts[-2:])
        tok = load_tokenizer(tok_path)  # the evaluated model's own tokenizer
        resume = None
        if work:
            from hybridlab.train.run import work_dir

            weights = [f for f in (Path(model_dir) / "model.safetensors",) if f.exists()]
            resume = work_dir(Path(work) / name.replace("/", "--"),
                              {"params": to_dict(job), "model": name, "tokenizer": tok_path}, weights)
        model = load_causal_lm(model_dir, dtype=c.dtype, device_map=c.device)
        tables.append(run_lm_eval(model, tok, cfg, tokenizer_name=tok_path, model_name=name, work=resume))
        del model
    with atomic_file(out) as tmp:
        pl.concat(tables).write_parquet(tmp)

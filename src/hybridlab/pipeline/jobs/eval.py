"""The evaluation rules' jobs: one function per rule, called by its thin workflow script (load the inputs, run
the evaluation, publish its tables atomically). The evaluations themselves, and the columns of every table,
are defined next to the science in `hybridlab.eval` (`softcka_table`, `niah_tables`, ...); a job adds the
files. Every job takes its typed section (`hybridlab.config_spec.job_sections`, or its dict) and plain paths.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hybridlab.atomic import write_parquet
from hybridlab.config_spec import (FertilityJob, GatherJob, LayerImportanceJob, LmBenchmarksJob, NiahJob,
                                   PerplexityJob, PositionLossJob, RecencyJob, RetrievalHeadsJob, RetrievalScoreJob,
                                   SoftckaJob, job_settings, to_dict)
from hybridlab.errors import HybridlabError


def _publish(tables: dict, *, statistics: bool = True) -> None:
    """Write each {path: polars table} atomically (parents created); a None path is skipped."""
    for path, frame in tables.items():
        if path is not None:
            write_parquet(path, frame, statistics=statistics)


def softcka_job(params: SoftckaJob | dict, *, parallel: str | Path, out: str | Path, model: str | None = None) -> None:
    """SoftCKA of every layer, English vs each parallel language (`hybridlab.eval.softcka.softcka_table`), of
    every analysis model or of `model` alone (the rule's per-model jobs), to `out`."""
    import polars as pl

    from hybridlab.eval.softcka import softcka_table

    table = softcka_table(pl.read_parquet(parallel), job_settings(SoftckaJob, params, "eval_softcka.py"), only=model)
    _publish({out: table}, statistics=False)


def niah_job(params: NiahJob | dict, *, mono: str | Path | None, examples: str | Path, out: str | Path | None = None,
             model: str | None = None, work: str | Path | None = None) -> None:
    """Multilingual needle-in-a-haystack (`hybridlab.eval.niah`): with `model`, that model's per-example table
    to `examples` (each finished task kept in `work`, so a rerun decodes only the rest); without, every model's
    per-example table to `examples` and the summary to `out`."""
    import polars as pl

    from hybridlab.eval.niah import niah_model_examples, niah_tables

    job = job_settings(NiahJob, params, "eval_niah.py")
    corpus = pl.read_parquet(mono) if mono is not None else None
    if model:
        _publish({examples: niah_model_examples(corpus, job, model, work=work)}, statistics=False)
        return
    if out is None:
        raise HybridlabError("eval_niah.py: give --out (the summary table) or --model (one model's examples)")
    per_example, summary = niah_tables(corpus, job)
    _publish({examples: per_example, out: summary}, statistics=False)


def recency_job(params: RecencyJob | dict, *, mono: str | Path, out: str | Path) -> None:
    """Attention recency of every analysis model (`hybridlab.eval.recency.recency_table`) to `out`."""
    import polars as pl

    from hybridlab.eval.recency import recency_table

    table = recency_table(pl.read_parquet(mono), job_settings(RecencyJob, params, "eval_recency.py"))
    _publish({out: table}, statistics=False)


def fertility_job(params: FertilityJob | dict, *, parallel: str | Path, tokenizer: str | Path, out: str | Path,
                  log=print) -> None:
    """Tokens per sentence relative to English (`hybridlab.eval.fertility.fertility`) for the project tokenizer
    (`tokenizer`, named `project`), every hub analysis model's own tokenizer, `fertility.hub_tokenizers` and the
    `utf8_bytes` reference, to `out`."""
    import polars as pl

    from hybridlab.eval import pairs
    from hybridlab.eval.fertility import fertility
    from hybridlab.models.registry import load_tokenizer_for

    job = job_settings(FertilityJob, params, "eval_fertility.py")
    names = {"project": str(tokenizer)}
    for m in pairs.analysis_models(**to_dict(job.models)):
        if m.hub:  # DAG models read the project tokenizer; hub models their own, named by hub id
            names.setdefault(m.name, m.tokenizer)
    for hub_id in job.fertility.hub_tokenizers:
        names.setdefault(hub_id, hub_id)
    tokenizers = {name: load_tokenizer_for(path) for name, path in names.items()}
    tokenizers["utf8_bytes"] = lambda text: text.encode("utf-8")
    log(f"fertility: tokenizers {sorted(tokenizers)}")
    table = fertility(pl.read_parquet(parallel), tokenizers, english=job.english)
    _publish({out: table}, statistics=False)
    log(table.select("tokenizer", "lang", "tokens_per_sentence", "relative_to_english"))


def perplexity_job(params: PerplexityJob | dict, *, mixture: str | Path, out: str | Path, tokens_out: str | Path,
                   rows_out: str | Path | None = None) -> None:
    """Held-out CE / KL of every distilled student and its teacher (`hybridlab.eval.perplexity`): the table to
    `out`, tokens-to-baseline to `tokens_out`, per-row CE / KL to `rows_out` (None: not written)."""
    from hybridlab.eval.perplexity import perplexity_tables

    ppl, tokens, rows = perplexity_tables(str(mixture), job_settings(PerplexityJob, params, "eval_perplexity.py"))
    _publish({out: ppl, tokens_out: tokens, rows_out: rows})


def position_loss_job(params: PositionLossJob | dict, *, models: Sequence[str | Path], mixture: str | Path,
                      tokenizer: str | Path, out: str | Path, summary: str | Path, pg19_local: str | None = None,
                      evaluator_model: str | Path | None = None) -> None:
    """Loss by position and LongPPL of every BLD-NL arm (`hybridlab.eval.position_loss`): per bucket to `out`,
    per model to `summary`."""
    from hybridlab.eval.position_loss import position_loss_tables

    buckets, per_model = position_loss_tables(models, job_settings(PositionLossJob, params, "eval_position_loss.py"),
                                              mixture=mixture, tokenizer=tokenizer, pg19_local=pg19_local or None,
                                              evaluator_model=evaluator_model)
    _publish({out: buckets, summary: per_model})


def retrieval_heads_job(params: RetrievalHeadsJob | dict, *, models: Sequence[str | Path], mixture: str | Path,
                        tokenizer: str | Path, work: str | Path, out: str | Path, curve: str | Path) -> None:
    """Retrieval heads of every BLD-NL arm (`hybridlab.eval.retrieval_heads`): the head gates to `out`, the
    masking curve to `curve`; the gate-training runs live in `work`."""
    from hybridlab.eval.retrieval_heads import retrieval_heads_tables

    alphas, masking = retrieval_heads_tables(models, job_settings(RetrievalHeadsJob, params, "eval_retrieval_heads.py"),
                                             mixture=mixture, tokenizer=tokenizer, work=work)
    _publish({out: alphas, curve: masking})


def retrieval_score_job(params: RetrievalScoreJob | dict, *, arms: Sequence[str | Path], test: str | Path,
                        out: str | Path, log=print) -> None:
    """The per-layer retrieval score of every BLD-SR arm's checkpoints by activation patching
    (`hybridlab.eval.retrieval_score`) to `out`."""
    from hybridlab.eval.retrieval_score import retrieval_score_table

    table = retrieval_score_table(arms, test, job_settings(RetrievalScoreJob, params, "eval_retrieval_score.py"))
    _publish({out: table})
    log(f"{table.height} rows from {len(arms)} arms")


def gather_job(kind: str, params: GatherJob | dict, *, inputs: Sequence[str | Path], out: str | Path,
               examples: str | Path | None = None) -> None:
    """One table from the per-model jobs' tables of `kind`: softcka (pairs re-attached,
    `eval.softcka.gather_softcka`), layer_importance (concatenated), lm_benchmarks (`eval.lm_eval.gather_tables`)
    or niah (`eval.niah.gather_niah`: the per-example table to `examples`, the summary to `out`)."""
    import polars as pl

    job = job_settings(GatherJob, params, "gather_eval.py")
    if kind == "softcka":
        from hybridlab.eval.softcka import gather_softcka

        tables = {out: gather_softcka(inputs, pairs=job.pairs or None)}
    elif kind == "layer_importance":
        tables = {out: pl.concat([pl.read_parquet(p) for p in inputs])}
    elif kind == "lm_benchmarks":
        from hybridlab.eval.lm_eval import gather_tables

        tables = {out: gather_tables(inputs)}
    elif kind == "niah":
        if not examples:
            raise HybridlabError("gather_eval.py niah: give --examples (the per-example table)")
        from hybridlab.eval.niah import gather_niah

        per_example, summary = gather_niah(inputs)
        tables = {examples: per_example, out: summary}
    else:
        raise HybridlabError(f"gather_eval.py: unknown kind {kind!r}; use softcka, niah, lm_benchmarks or "
                             "layer_importance")
    _publish(tables, statistics=False)


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

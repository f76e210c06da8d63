"""The results tables of the two studies, each built from the tidy eval / metrics tables, the shared readers
of those input tables (`require`, `concat_runs`) and `write_table`, which writes a table as CSV + Markdown.

Training logs of several runs enter as one "runs" table: the rows of every run's `metrics.parquet`
concatenated with a `run` column (`concat_runs`); the run label is the rule's name for it
(`<teacher>/<placement>-<mixer>` for distillation, the arm name for BLD). Rows and columns are sorted
explicitly, never taken from row order, so the same inputs always give the same text.

Tables (the registry, `hybridlab.plots.registry`, names them):
- `perplexity_table`: per-language perplexity of every placement, the best placement per language and
  its relative change against the baseline placement (standard periodic by default);
- `kl_reduction_table`: languages ranked by the KL reduction of their best placement;
- `softcka_first_fa_table`: SoftCKA change at each hybrid's first FA layer, hybrid vs dense;
- `bld_nl_table`: final held-out CE, long-document perplexity and LongPPL per BLD-NL arm;
- `lm_benchmarks_table`: lm-eval scores per model (paper preset).
"""

from __future__ import annotations

import math
from pathlib import Path

import polars as pl

from hybridlab.atomic import atomic_file, write_text
from hybridlab.errors import HybridlabError
from hybridlab.eval import stats
from hybridlab.models.placements import FULL_ATTENTION
from hybridlab.plots.uncertainty import nl_runs, spread_columns


# --- reading the input tables ---------------------------------------------------------------------


def require(df: pl.DataFrame, columns, table: str) -> pl.DataFrame:
    """Fail with one line when `table` lacks columns or rows (a figure of nothing hides a broken rule)."""
    missing = [c for c in columns if c not in df.columns]
    if missing:
        raise HybridlabError(f"table '{table}' lacks columns {missing} (has {df.columns}); rebuild it with "
                             "the current eval script")
    if df.height == 0:
        raise HybridlabError(f"table '{table}' has no rows; check the rule that writes it")
    return df


def split_seed(label: str) -> tuple[str, int | None]:
    """A run label `seed<N>/<run>` -> (run, N); a label without the prefix -> (label, None)."""
    head, sep, rest = label.partition("/")
    if sep and head.startswith("seed") and head[4:].isdigit():
        return rest, int(head[4:])
    return label, None


def concat_runs(frames: dict[str, pl.DataFrame]) -> pl.DataFrame:
    """Rows of every run's metrics with `run` and `seed` columns; columns missing in a run are null there.

    A label `seed<N>/<run>` (the rules' form: one run per arm x replicate seed) gives run `<run>`, seed N;
    a label without the prefix has a null seed."""
    if not frames:
        raise HybridlabError("no metrics files given; pass at least one run")
    parts = []
    for label, df in sorted(frames.items()):
        run, seed = split_seed(label)
        parts.append(df.with_columns(pl.lit(run).alias("run"), pl.lit(seed, pl.Int64).alias("seed")))
    return pl.concat(parts, how="diagonal_relaxed")


def _sorted(df: pl.DataFrame, col: str) -> list:
    return sorted(df[col].drop_nulls().unique().to_list())


def _melt_prefix(df: pl.DataFrame, prefix: str, name: str, table: str) -> pl.DataFrame:
    """Columns `<prefix><x>` to long rows (x in column `name`, value in `value`), nulls dropped."""
    cols = sorted(c for c in df.columns if c.startswith(prefix) and "/" not in c[len(prefix):])
    if not cols:
        raise HybridlabError(f"table '{table}' has no '{prefix}*' columns; was it written by the current trainer?")
    index = ["run", "seed", "step"] if "seed" in df.columns else ["run", "step"]
    long = df.select([*index, *cols]).unpivot(index=index, on=cols, variable_name=name)
    return long.drop_nulls("value").with_columns(pl.col(name).str.slice(len(prefix)))


# --- tables ---------------------------------------------------------------------------------------


def _with_seed(df: pl.DataFrame) -> pl.DataFrame:
    """The table with a `seed` column (a table written before replicate seeds is one seed, null)."""
    return df if "seed" in df.columns else df.with_columns(seed=pl.lit(None, pl.Int64))


def _paired_by_seed(df: pl.DataFrame, keys: list[str], value: str, fn) -> pl.DataFrame:
    """Per group of `keys`: fn(best, baseline) per seed (columns `value` and `base`), spread across seeds."""
    rows = []
    for key, g in df.sort(keys + ["seed"], nulls_last=True).group_by(keys, maintain_order=True):
        vals = [fn(v, b) for v, b in g.select(value, "base").iter_rows() if v is not None and b is not None]
        rows.append({**dict(zip(keys, key)), **spread_columns(vals, "x")})
    return pl.DataFrame(rows, orient="row", schema={**{k: df.schema[k] for k in keys}, "x": pl.Float64,
                                                    "x_lo": pl.Float64, "x_hi": pl.Float64, "n_seeds": pl.Int64})


def perplexity_table(ppl: pl.DataFrame, baseline: str = "standard_periodic") -> pl.DataFrame:
    """Per (teacher, mixer, lang): teacher and per-placement perplexity, best placement, change vs baseline.

    Placement columns are the mean perplexity over the replicate seeds. The best placement has the lowest
    mean (ties: the alphabetically first). `best_vs_baseline` = mean over seeds of ppl(best, s) /
    ppl(baseline, s) - 1 (negative = better than the baseline placement), `best_vs_baseline_lo/_hi` its
    t-interval across the seeds (NaN with one seed), `n_seeds` the seeds paired.
    """
    df = _with_seed(require(ppl, ["teacher", "placement", "mixer", "lang", "ppl"], "perplexity"))
    teach = df.filter(pl.col("placement").is_null()).select("teacher", "lang", teacher_ppl="ppl")
    stud = df.filter(pl.col("placement").is_not_null())
    if baseline not in stud["placement"].to_list():
        raise HybridlabError(f"baseline placement '{baseline}' has no rows in table 'perplexity'; set "
                             "experiments.distill.baseline_placement to a distilled placement")
    keys = ["teacher", "mixer", "lang"]
    mean = stud.group_by(keys + ["placement"]).agg(pl.col("ppl").mean())
    wide = mean.pivot(on="placement", index=keys, values="ppl", sort_columns=True)
    best = (mean.sort(["ppl", "placement"]).group_by(keys, maintain_order=True)
            .first().select(*keys, best_placement="placement", best_ppl="ppl"))
    per_seed = (stud.join(best, on=keys).filter(pl.col("placement") == pl.col("best_placement"))
                .join(stud.filter(pl.col("placement") == baseline).select(*keys, "seed", base="ppl"),
                      on=keys + ["seed"], nulls_equal=True))
    change = _paired_by_seed(per_seed, keys, "ppl", lambda v, b: v / b - 1.0).rename(
        {"x": "best_vs_baseline", "x_lo": "best_vs_baseline_lo", "x_hi": "best_vs_baseline_hi"})
    out = (wide.join(best, on=keys).join(teach, on=["teacher", "lang"], how="left").join(change, on=keys))
    # "all" (pooled) last, languages sorted: a stable, readable row order
    return out.sort(["teacher", "mixer", pl.col("lang") == "all", "lang"]).select(
        "teacher", "mixer", "lang", "teacher_ppl", *sorted(_sorted(stud, "placement")), "best_placement",
        "best_ppl", "best_vs_baseline", "best_vs_baseline_lo", "best_vs_baseline_hi", "n_seeds")


def kl_reduction_table(ppl: pl.DataFrame, baseline: str = "standard_periodic") -> pl.DataFrame:
    """Per (teacher, mixer, lang): the placement with the lowest KL and its reduction vs the baseline.

    The best placement has the lowest KL averaged over the replicate seeds. `kl_reduction` = mean over
    seeds of 1 - KL(best, s) / KL(baseline placement, s) (0.25 = a quarter less KL than standard periodic),
    `kl_reduction_lo/_hi` its t-interval across seeds (NaN with one seed); `kl_baseline` and `kl_best` are
    seed means. Rows sorted by reduction, largest first, within each teacher and mixer; the pooled "all"
    row is left out (it is not a language).
    """
    df = _with_seed(require(ppl, ["teacher", "placement", "mixer", "lang", "kl"], "perplexity"))
    stud = df.filter(pl.col("placement").is_not_null() & pl.col("kl").is_not_null() & (pl.col("lang") != "all"))
    keys = ["teacher", "mixer", "lang"]
    base_seed = stud.filter(pl.col("placement") == baseline).select(*keys, "seed", base="kl")
    if base_seed.is_empty():
        raise HybridlabError(f"baseline placement '{baseline}' has no KL rows in table 'perplexity'; set "
                             "experiments.distill.baseline_placement to a distilled placement")
    mean = stud.group_by(keys + ["placement"]).agg(pl.col("kl").mean())
    base = mean.filter(pl.col("placement") == baseline).select(*keys, kl_baseline="kl")
    best = (mean.filter(pl.col("placement") != baseline).sort(["kl", "placement"])
            .group_by(keys, maintain_order=True).first()
            .select(*keys, best_placement="placement", kl_best="kl"))
    per_seed = (stud.join(best, on=keys).filter(pl.col("placement") == pl.col("best_placement"))
                .join(base_seed, on=keys + ["seed"], nulls_equal=True))
    red = _paired_by_seed(per_seed, keys, "kl", lambda v, b: 1.0 - v / b).rename(
        {"x": "kl_reduction", "x_lo": "kl_reduction_lo", "x_hi": "kl_reduction_hi"})
    out = best.join(base, on=keys).join(red, on=keys)
    return out.sort(["teacher", "mixer", "kl_reduction", "lang"], descending=[False, False, True, False]).select(
        "teacher", "mixer", "lang", "kl_baseline", "best_placement", "kl_best", "kl_reduction", "kl_reduction_lo",
        "kl_reduction_hi", "n_seeds")


def softcka_first_fa_table(softcka: pl.DataFrame) -> pl.DataFrame:
    """SoftCKA (hidden states) just before and just after each hybrid's first full-attention layer.

    Hidden-state row `layer` i is the output of decoder layer i-1 (row 0 = embeddings) and carries that
    layer's type. For each pair, `first_fa_layer` is the first hidden row of the hybrid whose layer is
    full attention. For the pair alignment (the headline quantity), the language offset (where the table has
    it) and the sentence-set CKA (a second view): `<metric>_before` at row first_fa_layer - 1, `<metric>_after` at
    first_fa_layer (with their sentence-bootstrap bounds where the table has them), and `<metric>_change`
    = after - before, for the hybrid and, at the same depth, for its dense partner. Whether the largest
    change across layers sits at this layer is the findings table's test. Pairs whose hybrid has no FA
    layer are left out.
    """
    df = require(softcka, ["pair", "role", "model", "kind", "layer", "layer_type", "lang", "alignment", "cka"],
                 "softcka")
    df = df.filter(pl.col("kind") == "hidden")
    first = (df.filter((pl.col("role") == "hybrid") & (pl.col("layer_type") == FULL_ATTENTION))
             .group_by("pair").agg(first_fa_layer=pl.col("layer").min()))
    if first.is_empty():
        raise HybridlabError("table 'softcka' has no hybrid with a full-attention layer (hidden rows); "
                             "nothing to compare at the first FA layer")
    df = df.join(first, on="pair")
    metrics = ("alignment", "language_offset", "cka") if "language_offset" in df.columns else ("alignment", "cka")
    for m in metrics:
        if f"{m}_lo" not in df.columns:  # a table written without the sentence bootstrap
            df = df.with_columns(pl.lit(math.nan).alias(f"{m}_lo"), pl.lit(math.nan).alias(f"{m}_hi"))

    def side(name: str, offset: int) -> pl.DataFrame:
        cols = {f"{m}_{name}{b}": f"{m}{b}" for m in metrics for b in ("", "_lo", "_hi")}
        return df.filter(pl.col("layer") == pl.col("first_fa_layer") + offset).select(
            "pair", "role", "model", "lang", "first_fa_layer", **{k: pl.col(v) for k, v in cols.items()})

    out = side("after", 0).join(side("before", -1).drop("model", "first_fa_layer"), on=["pair", "role", "lang"])
    out = out.with_columns(**{f"{m}_change": pl.col(f"{m}_after") - pl.col(f"{m}_before") for m in metrics})
    per_metric = [f"{m}_{c}" for m in metrics for c in ("before", "before_lo", "before_hi", "after", "after_lo",
                                                         "after_hi", "change")]
    return out.sort(["pair", "role", "lang"]).select("pair", "role", "model", "lang", "first_fa_layer", *per_metric)


def bld_nl_table(runs: pl.DataFrame, summary: pl.DataFrame) -> pl.DataFrame:
    """BLD on natural language, one row per arm: final held-out CE, long-document perplexity and LongPPL.

    `final_eval_ce` is the last held-out CE of the run's metrics, averaged over the replicate seeds, with
    its t-interval across seeds (`_lo`, `_hi`; NaN with one seed). `ce_vs_baseline` = mean over seeds of
    CE(arm, s) - CE(baseline of the same mixer and size, s) (negative = BLD better), its t-interval, and
    `p_sign` the exact sign test of those per-seed differences (1 for the baseline row). `ppl`, `long_ppl`,
    `n_key_tokens` and `evaluator` come from the position-loss summary of the first seed's arms (LongPPL is
    null when no token qualifies as a key token; every arm is scored on the key tokens of the one
    `evaluator` arm), with their bootstrap intervals over the windows (`ppl_lo/hi`, `long_ppl_lo/hi`).
    """
    r = _with_seed(nl_runs(require(runs, ["run", "eval/ce"], "bld_nl metrics")))
    final = (r.filter(pl.col("eval/ce").is_not_null()).sort("step").group_by(["run", "seed"]).agg(
        ce=pl.col("eval/ce").last(), tokens=pl.col("tokens").last()))
    s = require(summary, ["model", "mixer", "size", "variant", "ppl", "long_ppl", "n_key_tokens", "evaluator"],
                "position_loss_summary")
    per_seed = s.select("model", "mixer", "size", "variant").join(final, left_on="model", right_on="run", how="inner")
    if per_seed.is_empty():
        raise HybridlabError("bld_nl runs and position_loss_summary share no arm; rebuild both from one config")
    base = per_seed.filter(pl.col("variant") == "baseline").select("mixer", "size", "seed", base="ce")
    per_seed = per_seed.join(base, on=["mixer", "size", "seed"], how="left", nulls_equal=True)
    rows = []
    for (model,), g in per_seed.sort(["model", "seed"], nulls_last=True).group_by(["model"], maintain_order=True):
        d = [c - b for c, b in g.select("ce", "base").iter_rows() if b is not None]
        ce, diff = spread_columns(g["ce"].to_list(), "final_eval_ce"), spread_columns(d, "ce_vs_baseline")
        diff.pop("n_seeds")
        rows.append({"model": model, "tokens": float(g["tokens"].mean()), **ce, **diff,
                     "p_sign": stats.sign_test(d).p_value if d else math.nan})
    agg = pl.DataFrame(rows, orient="row")
    for c in ("ppl_lo", "ppl_hi", "long_ppl_lo", "long_ppl_hi"):  # window bootstrap (older summaries lack it)
        if c not in s.columns:
            s = s.with_columns(pl.lit(math.nan).alias(c))
    out = s.join(agg, on="model", how="inner")
    return out.sort(["size", "mixer", "variant"]).select(
        "mixer", "size", "variant", "n_seeds", "tokens", "final_eval_ce", "final_eval_ce_lo", "final_eval_ce_hi",
        "ce_vs_baseline", "ce_vs_baseline_lo", "ce_vs_baseline_hi", "p_sign", "ppl", "ppl_lo", "ppl_hi", "long_ppl",
        "long_ppl_lo", "long_ppl_hi", "n_key_tokens", "evaluator")


def lm_benchmarks_table(bench: pl.DataFrame) -> pl.DataFrame:
    """lm-eval results (paper preset) wide: one row per model, one column per `task/metric` (filter
    `none`, or the first filter of a metric when it has no `none`), columns sorted, each followed by
    `<task/metric>_lo` / `_hi` = value -+ 1.96 x lm-eval's `stderr` (its normal-approximation 95 %
    interval over the task's examples; null where lm-eval reports no stderr, e.g. RULER lengths)."""
    df = require(bench, ["model", "task", "metric", "filter", "value"], "lm_benchmarks")
    if "stderr" not in df.columns:
        df = df.with_columns(stderr=pl.lit(None, pl.Float64))
    se = pl.col("stderr").cast(pl.Float64, strict=False)
    df = (df.sort(["model", "task", "metric", pl.col("filter") != "none", "filter"])
          .group_by(["model", "task", "metric"], maintain_order=True).first()
          .with_columns(column=pl.format("{}/{}", "task", "metric"), lo=pl.col("value") - 1.96 * se,
                        hi=pl.col("value") + 1.96 * se))
    wide = df.pivot(on="column", index="model", values=["value", "lo", "hi"], sort_columns=True)
    cols = sorted(df["column"].unique().to_list())
    named = [pl.col(f"{v}_{c}").alias(c + s) for c in cols for v, s in (("value", ""), ("lo", "_lo"), ("hi", "_hi"))]
    return wide.select("model", *named).sort("model")


def write_table(df: pl.DataFrame, csv_path: str | Path, md_path: str | Path, decimals: int = 4) -> None:
    """Write `df` as CSV and as a Markdown table, floats rounded to `decimals` (stable text, diffable)."""
    df = df.with_columns(pl.col(pl.Float32, pl.Float64).round(decimals))
    with atomic_file(csv_path) as tmp:
        df.write_csv(tmp, float_precision=decimals)
    with pl.Config(tbl_formatting="MARKDOWN", tbl_hide_column_data_types=True, tbl_hide_dataframe_shape=True,
                   tbl_rows=-1, tbl_cols=-1, fmt_str_lengths=200, tbl_width_chars=10_000,
                   float_precision=decimals, fmt_float="full"):
        text = str(df) + "\n"
    write_text(md_path, text)


"""One function per figure of the two studies, each drawn from the tidy eval / metrics tables; table writers.

Every function takes polars DataFrames with the columns documented by the script that writes them
(workflow_scripts/eval_*.py docstrings; `metrics.parquet` of distill.py / train_bld_sr.py /
train_bld_nl.py) and returns a `matplotlib.figure.Figure` in the shared style (`hybridlab.plots.style`);
`save_all` writes it byte-stably. Category orders are sorted explicitly, never taken from row order, so
the same table always gives the same bytes.

Training logs of several runs enter as one "runs" table: the rows of every run's `metrics.parquet`
concatenated with a `run` column (`concat_runs`); the run label is the rule's name for it
(`<teacher>/<placement>-<mixer>` for distillation, the arm name for BLD).

Figures (what each shows):
- `placements`: layer types of every analysed model (`draw_placements`), from SoftCKA's attn_delta rows.
- `softcka_pairs`: SoftCKA by layer, English vs each language (colour), hybrid solid vs dense dashed,
  one panel per pair, the hybrid's full-attention (FA) layers shaded. `kind` picks hidden / attn_delta.
- `recency`: per pair, mean attention distance of each FA layer and the local mass vs window, by role.
- `fertility`: tokens relative to English per language and tokenizer.
- `niah`: NIAH accuracy (mean over tasks) and seconds per example by context length, language and
  role; cells with an OOM are marked.
- `distill_curves`: held-out CE and KL vs tokens per placement (stage 2).
- `tokens_to_baseline`: tokens each placement needs to reach the baseline's final value, as a fraction.
- `sr_accuracy`, `sr_grad_norms`: BLD Spaced Retrieval validation accuracy per gap and gradient norm
  per layer kind vs step, per arm; `retrieval_score`: per-layer score vs training fraction per arm.
- `bld_nl_loss`, `position_loss`, `retrieval_heads`: BLD natural-language curves, loss by position
  bucket, gate (alpha) distribution and passkey accuracy as heads are masked.
- `sr_longgap`: final Spaced Retrieval accuracy per gap vs the long-gap fraction of the sweep arms.
- `perplexity_table`: per-language perplexity of every placement, the best placement per language and
  its relative change against the baseline placement (standard periodic by default);
  `kl_reduction_table`: languages ranked by the KL reduction of their best placement;
  `softcka_first_fa_table`: SoftCKA change at each hybrid's first FA layer, hybrid vs dense;
  `bld_nl_table`: final held-out CE, long-document perplexity and LongPPL per BLD-NL arm;
  `lm_benchmarks_table`: lm-eval scores per model (paper preset).
`CAPTIONS` holds the report caption of every figure and table.
"""

from __future__ import annotations

import inspect
import math
from pathlib import Path

import textwrap
import warnings

import polars as pl

from hybridlab.atomic import atomic_file, write_text
from hybridlab.errors import HybridlabError
from hybridlab.models.placements import FULL_ATTENTION, draw_placements
from hybridlab.eval import stats
from hybridlab.plots.style import FA_COLOR, PALETTE, ROLE_COLORS, LazyModule, new_figure, sns, themed
from hybridlab.plots.uncertainty import (nl_runs, placement_tests_table, retrieval_score_table, seed_band, spread_columns,
                                         sr_accuracy_table, tokens_to_target_table)

ticker = LazyModule("matplotlib.ticker")

ROLE_DASHES = {"hybrid": "", "dense": (4, 2)}


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


def _pd(df: pl.DataFrame):
    return df.to_pandas()


def _sorted(df: pl.DataFrame, col: str) -> list:
    return sorted(df[col].drop_nulls().unique().to_list())


def _title(ax, text: str) -> None:
    """Panel title wrapped to the panel width (model names can be long; titles must not overlap)."""
    ax.set_title(textwrap.fill(text, width=int(ax.get_position().width * ax.figure.get_figwidth() * 12)))


def _tokens_axis(ax) -> None:
    """x axis of training tokens: compact SI labels (50k, 1.2M) that do not run into each other."""
    ax.set_xlabel("training tokens")
    ax.xaxis.set_major_formatter(ticker.EngFormatter(sep=""))
    ax.xaxis.set_major_locator(ticker.MaxNLocator(5))


def _legend_once(axes) -> None:
    """Keep the legend of the last drawn panel only, outside the plot area."""
    for ax in axes[:-1]:
        if ax.get_legend() is not None:
            ax.get_legend().remove()
    if axes[-1].get_legend() is not None:
        sns.move_legend(axes[-1], "upper left", bbox_to_anchor=(1.02, 1), frameon=False)


def _melt_prefix(df: pl.DataFrame, prefix: str, name: str, table: str) -> pl.DataFrame:
    """Columns `<prefix><x>` to long rows (x in column `name`, value in `value`), nulls dropped."""
    cols = sorted(c for c in df.columns if c.startswith(prefix) and "/" not in c[len(prefix):])
    if not cols:
        raise HybridlabError(f"table '{table}' has no '{prefix}*' columns; was it written by the current trainer?")
    index = ["run", "seed", "step"] if "seed" in df.columns else ["run", "step"]
    long = df.select([*index, *cols]).unpivot(index=index, on=cols, variable_name=name)
    return long.drop_nulls("value").with_columns(pl.col(name).str.slice(len(prefix)))


# --- multilinguality -----------------------------------------------------------------------------


def placements(softcka: pl.DataFrame):
    """Layer types of every analysed model (attn_delta rows carry one type per decoder layer)."""
    df = require(softcka, ["model", "kind", "layer", "layer_type"], "softcka").filter(pl.col("kind") == "attn_delta")
    if df.height == 0:
        raise HybridlabError("table 'softcka' has no attn_delta rows; enable the attn_delta kind to draw placements")
    df = df.unique(["model", "layer"]).sort(["model", "layer"])
    rows = {m: g["layer_type"].to_list() for (m,), g in df.group_by(["model"], maintain_order=True)}
    with themed():
        fig, (ax,) = new_figure(1, height=0.45 * len(rows) + 1.2, width=7.0)
        draw_placements(ax, rows)
        _title(ax, "layer types per model")
    return fig


def softcka_pairs(softcka: pl.DataFrame, kind: str = "hidden", metric: str = "cka"):
    """SoftCKA by layer, one panel per pair: colour = language, solid hybrid vs dashed dense, FA shaded."""
    df = require(softcka, ["pair", "role", "kind", "layer", "layer_type", "lang", metric], "softcka")
    df = df.filter(pl.col("kind") == kind)
    if df.height == 0:
        raise HybridlabError(f"table 'softcka' has no rows of kind '{kind}'")
    pairs, langs = _sorted(df, "pair"), _sorted(df, "lang")
    with themed():
        fig, axes = new_figure(len(pairs), sharey=True)
        for ax, pair in zip(axes, pairs):
            d = df.filter(pl.col("pair") == pair)
            fa = d.filter((pl.col("role") == "hybrid") & (pl.col("layer_type") == FULL_ATTENTION))
            for x in sorted(set(fa["layer"].to_list())):
                ax.axvspan(x - 0.5, x + 0.5, color=FA_COLOR, alpha=0.12, lw=0)
            sns.lineplot(data=_pd(d.sort(["role", "lang", "layer"])), x="layer", y=metric, hue="lang",
                         hue_order=langs, style="role", style_order=["hybrid", "dense"], dashes=ROLE_DASHES,
                         palette=PALETTE, marker="o", errorbar=None, ax=ax)
            if f"{metric}_lo" in d.columns:  # bootstrap over sentences (softcka.n_boot), one band per line
                colors = dict(zip(langs, sns.color_palette(PALETTE, len(langs))))
                for (lang, _), g in d.sort(["lang", "role", "layer"]).group_by(["lang", "role"], maintain_order=True):
                    g = g.filter(pl.col(f"{metric}_lo").is_not_nan())
                    if g.height:
                        ax.fill_between(g["layer"].to_list(), g[f"{metric}_lo"].to_list(), g[f"{metric}_hi"].to_list(),
                                        color=colors[lang], alpha=0.15, lw=0)
            _title(ax, pair)
            ax.set_ylabel(f"Soft{metric.upper()} vs English" if metric == "cka" else metric)
            ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))
        fig.suptitle(f"SoftCKA vs English by layer ({kind}); shaded: the hybrid's full-attention layers", fontsize=9)
        _legend_once(axes)
    return fig


def recency(rec: pl.DataFrame):
    """Per pair: mean attention distance per FA layer (top) and local mass vs window (bottom), by role.

    Values are means over heads and languages (and layers, bottom). With the bootstrap columns
    (`mass_lo/hi`, `mean_distance_lo/hi`: per head, over the input sequences) the error bars (top) and
    bands (bottom) span the mean of the aggregated heads' lower and upper bounds: the typical per-head
    95 % interval, not an interval of the average (that needs the per-sequence values)."""
    df = require(rec, ["pair", "role", "layer", "head", "window", "mass", "mean_distance"], "recency")
    pairs = _sorted(df, "pair")
    n = len(pairs)
    roles = ["hybrid", "dense"]
    ci = all(f"{c}_{b}" in df.columns for c in ("mass", "mean_distance") for b in ("lo", "hi"))

    def agg(d, by, value):
        cols = [pl.col(value).mean()] + ([pl.col(f"{value}_lo").mean(), pl.col(f"{value}_hi").mean()] if ci else [])
        return d.group_by(by).agg(cols).sort(by)

    with themed():
        fig, axes = new_figure(2 * n, ncols=n)
        for i, pair in enumerate(pairs):
            d = df.filter(pl.col("pair") == pair)
            dist = agg(d, ["role", "layer"], "mean_distance")
            sns.barplot(data=_pd(dist), x="layer", y="mean_distance", hue="role", hue_order=roles,
                        palette=ROLE_COLORS, errorbar=None, ax=axes[i])
            if ci:  # one container per role (hue order), its bars in layer order
                for container, role in zip(list(axes[i].containers), roles):
                    g = dist.filter(pl.col("role") == role)
                    for bar, (v, lo, hi) in zip(container, g.select("mean_distance", "mean_distance_lo",
                                                                    "mean_distance_hi").iter_rows()):
                        if lo == lo and hi == hi:  # NaN: one sequence, no interval
                            axes[i].errorbar([bar.get_x() + bar.get_width() / 2], [v], yerr=[[v - lo], [hi - v]],
                                             fmt="none", ecolor="black", elinewidth=0.7, capsize=1.5)
            _title(axes[i], f"{pair}: FA layers")
            axes[i].set_ylabel("mean attention distance")
            mass = agg(d, ["role", "window"], "mass")
            sns.lineplot(data=_pd(mass), x="window", y="mass", hue="role", hue_order=roles,
                         palette=ROLE_COLORS, marker="o", errorbar=None, ax=axes[n + i])
            if ci:
                for role in roles:
                    g = mass.filter((pl.col("role") == role) & pl.col("mass_lo").is_not_nan())
                    if g.height:
                        axes[n + i].fill_between(g["window"].to_list(), g["mass_lo"].to_list(), g["mass_hi"].to_list(),
                                                 color=ROLE_COLORS[role], alpha=0.15, lw=0)
            axes[n + i].set_xscale("log", base=2)
            axes[n + i].set_ylabel("attention mass on last w tokens")
            axes[n + i].set_xlabel("window w")
        _legend_once(axes)
    return fig


def _bars(ax) -> list:
    """The bar patches seaborn drew, hue by hue (the order of `_bar_rows`)."""
    return [p for c in ax.containers for p in c]


def _bar_rows(df: pl.DataFrame, order: list, hue_order: list) -> list:
    """(value, lo, hi) of each bar in `_bars` order (hue-major), None where a bar has no row."""
    out = []
    for h in hue_order:
        for x in order:
            r = df.filter((pl.col("tokenizer") == h) & (pl.col("lang") == x))
            out.append(r.select("relative_to_english", "relative_to_english_lo", "relative_to_english_hi").row(0)
                       if r.height else None)
    return out


def fertility(fert: pl.DataFrame):
    """Tokens per sentence relative to English per language (bars) and tokenizer (colour)."""
    df = require(fert, ["tokenizer", "lang", "relative_to_english"], "fertility").sort(["lang", "tokenizer"])
    langs = _sorted(df, "lang")
    with themed():
        fig, (ax,) = new_figure(1, width=max(4.0, 0.55 * len(langs) + 2.5))
        sns.barplot(data=_pd(df), x="lang", y="relative_to_english", hue="tokenizer", order=langs,
                    hue_order=_sorted(df, "tokenizer"), palette=PALETTE, ax=ax)
        if "relative_to_english_lo" in df.columns:  # bootstrap over sentence pairs, one bar per (lang, tokenizer)
            for bar, row in zip(_bars(ax), _bar_rows(df, langs, _sorted(df, "tokenizer"))):
                if row is not None and row[1] == row[1]:
                    x = bar.get_x() + bar.get_width() / 2
                    ax.errorbar([x], [row[0]], yerr=[[row[0] - row[1]], [row[2] - row[0]]], fmt="none",
                                ecolor="black", elinewidth=0.7, capsize=1.5)
        ax.axhline(1.0, color="black", lw=0.8, ls="--")
        ax.set_ylabel("fertility relative to English")
        ax.tick_params(axis="x", rotation=45)
        _legend_once([ax])
    return fig


def niah_cells(df: pl.DataFrame) -> pl.DataFrame:
    """NIAH per (pair, role, lang, context): accuracy over all tasks' examples (k = sum of round(accuracy x n),
    n = sum of n) with its Wilson 95 % interval (`accuracy_lo`, `accuracy_hi`), mean seconds, any OOM."""
    cell = df.with_columns(k=(pl.col("accuracy") * pl.col("n")).round().cast(pl.Int64)).group_by(
        ["pair", "role", "lang", "context_tokens"]).agg(
        pl.col("k").sum(), pl.col("n").sum(), pl.col("seconds").mean(), pl.col("oom").any())
    lo, hi, acc = [], [], []
    for k, n in cell.select("k", "n").iter_rows():
        w = stats.wilson_interval(int(k), int(n)) if n else None
        acc.append(w.estimate if w else math.nan)
        lo.append(w.lo if w else math.nan)
        hi.append(w.hi if w else math.nan)
    return cell.with_columns(accuracy=pl.Series(acc, dtype=pl.Float64), accuracy_lo=pl.Series(lo, dtype=pl.Float64),
                             accuracy_hi=pl.Series(hi, dtype=pl.Float64))


def niah(table: pl.DataFrame):
    """NIAH accuracy (top) and seconds per example (bottom) vs context length, per pair; OOM cells marked."""
    df = require(table, ["pair", "role", "lang", "task", "context_tokens", "accuracy", "seconds", "oom"], "niah")
    pairs, langs = _sorted(df, "pair"), _sorted(df, "lang")
    n = len(pairs)
    cell = niah_cells(df).sort(["pair", "role", "lang", "context_tokens"])
    colors = dict(zip(langs, sns.color_palette(PALETTE, len(langs))))
    with themed():
        fig, axes = new_figure(2 * n, ncols=n)
        for i, pair in enumerate(pairs):
            d = cell.filter(pl.col("pair") == pair)
            sns.lineplot(data=_pd(d), x="context_tokens", y="accuracy", hue="lang", hue_order=langs,
                         style="role", style_order=["hybrid", "dense"], dashes=ROLE_DASHES, palette=PALETTE,
                         marker="o", errorbar=None, ax=axes[i])
            for (lang, role), g in d.group_by(["lang", "role"], maintain_order=True):  # Wilson 95 % bars
                acc = g["accuracy"].to_numpy()
                axes[i].errorbar(g["context_tokens"].to_list(), acc,
                                 yerr=[acc - g["accuracy_lo"].to_numpy(), g["accuracy_hi"].to_numpy() - acc],
                                 fmt="none", ecolor=colors[lang], elinewidth=0.8, capsize=2, alpha=0.7)
            ooms = d.filter(pl.col("oom"))
            if ooms.height:
                axes[i].scatter(ooms["context_tokens"].to_list(), [0.0] * ooms.height, marker="x", color="red",
                                zorder=5, label="OOM")
                for x in sorted(set(ooms["context_tokens"].to_list())):
                    axes[i].annotate("OOM", (x, 0.0), textcoords="offset points", xytext=(0, 6), ha="center",
                                     fontsize=6, color="red")
            _title(axes[i], f"{pair}: accuracy (mean over tasks)")
            axes[i].set_ylim(-0.05, 1.05)
            rt = d.group_by(["role", "context_tokens"]).agg(pl.col("seconds").mean()).sort(["role", "context_tokens"])
            sns.lineplot(data=_pd(rt), x="context_tokens", y="seconds", hue="role", hue_order=["hybrid", "dense"],
                         palette=ROLE_COLORS, marker="o", ax=axes[n + i])
            axes[n + i].set_ylabel("seconds per example")
            for ax in (axes[i], axes[n + i]):
                ax.set_xscale("log", base=2)
                ax.set_xlabel("context tokens")
        _legend_once(axes[:n])
        _legend_once(axes[n:])
    return fig


def _distill_runs(runs: pl.DataFrame) -> pl.DataFrame:
    """Split a distillation run label `<teacher>/<placement>-<mixer>` into columns."""
    last = pl.col("run").str.split("/").list.last()
    return runs.with_columns(
        teacher=pl.col("run").str.split("/").list.first(),
        placement=last.str.replace(r"-[^-]+$", ""),
        mixer=last.str.extract(r"-([^-]+)$"),
    )


def distill_curves(runs: pl.DataFrame):
    """Held-out CE and KL to the teacher vs training tokens, one line per placement (stage 2)."""
    df = _distill_runs(require(runs, ["run", "tokens", "eval/ce", "eval/kl"], "distill metrics"))
    df = df.filter(pl.col("eval/ce").is_not_null()).sort(["run", "tokens"])
    label = "placement" if df["run"].n_unique() == df["placement"].n_unique() else "run"
    with themed():
        fig, axes = new_figure(2)
        for ax, col, name in zip(axes, ["eval/ce", "eval/kl"], ["held-out CE", "held-out KL(teacher || student)"]):
            sns.lineplot(data=_pd(df), x="tokens", y=col, hue=label, hue_order=_sorted(df, label),
                         palette=PALETTE, marker="o", errorbar=seed_band, ax=ax)
            ax.set_ylabel(name)
            _tokens_axis(ax)
        _legend_once(axes)
    return fig


def tokens_to_baseline(tokens: pl.DataFrame, lang: str = "all"):
    """Fraction of the baseline's tokens each placement needs to reach the baseline's final CE / KL."""
    df = require(tokens, ["mixer", "placement", "metric", "lang", "fraction"], "tokens_to_baseline")
    df = df.filter(pl.col("lang") == lang).sort(["metric", "mixer", "placement"])
    if df.height == 0:
        raise HybridlabError(f"table 'tokens_to_baseline' has no rows for lang '{lang}'")
    metrics, placements_ = _sorted(df, "metric"), _sorted(df, "placement")
    with themed():
        fig, axes = new_figure(len(metrics), sharey=True)
        for ax, metric in zip(axes, metrics):
            d = df.filter(pl.col("metric") == metric)
            sns.barplot(data=_pd(d), x="placement", y="fraction", hue="mixer", order=placements_,
                        hue_order=_sorted(d, "mixer"), palette=PALETTE, errorbar=seed_band, capsize=0.15, ax=ax)
            for i, p in enumerate(placements_):
                if d.filter((pl.col("placement") == p) & pl.col("fraction").is_null()).height:
                    ax.annotate("not reached", (i, 0), ha="center", va="bottom", rotation=90, fontsize=6)
            ax.axhline(1.0, color="black", lw=0.8, ls="--")
            _title(ax, f"{metric}: tokens to baseline final ({lang})")
            ax.set_ylabel("fraction of baseline tokens")
            ax.tick_params(axis="x", rotation=45)
        _legend_once(axes)
    return fig


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


# --- competing learning / BLD --------------------------------------------------------------------


def sr_accuracy(runs: pl.DataFrame):
    """Validation accuracy (per answer digit) vs step, one panel per gap, one line per arm."""
    df = _melt_prefix(require(runs, ["run", "step"], "bld_sr metrics"), "eval/acc/gap", "gap", "bld_sr metrics")
    df = df.with_columns(pl.col("gap").cast(pl.Int64)).sort(["gap", "run", "step"])
    gaps, arms = _sorted(df, "gap"), _sorted(df, "run")
    with themed():
        fig, axes = new_figure(len(gaps), sharey=True)
        for ax, g in zip(axes, gaps):
            sns.lineplot(data=_pd(df.filter(pl.col("gap") == g)), x="step", y="value", hue="run", hue_order=arms,
                         palette=PALETTE, errorbar=seed_band, ax=ax)
            _title(ax, f"gap {g}")
            ax.set_ylabel("validation accuracy")
            ax.set_ylim(-0.02, 1.02)
        _legend_once(axes)
    return fig


def sr_grad_norms(runs: pl.DataFrame):
    """Gradient norm of each layer kind (attention first) vs step, one line per arm, log scale."""
    df = _melt_prefix(require(runs, ["run", "step"], "bld_sr metrics"), "grad_norm/", "kind", "bld_sr metrics")
    df = df.filter(~pl.col("kind").str.starts_with("layer")).sort(["kind", "run", "step"])
    kinds = sorted(_sorted(df, "kind"), key=lambda k: (k != FULL_ATTENTION, k))
    with themed():
        fig, axes = new_figure(len(kinds), sharey=True)
        for ax, k in zip(axes, kinds):
            d = df.filter((pl.col("kind") == k) & (pl.col("value") > 0))  # frozen steps log 0: not on log axis
            sns.lineplot(data=_pd(d), x="step", y="value", hue="run", hue_order=_sorted(df, "run"),
                         palette=PALETTE, errorbar=seed_band, ax=ax)
            ax.set_yscale("log")
            _title(ax, f"{k.replace('_', ' ')} gradient norm")
            ax.set_ylabel("grad norm (pre-clip)")
        _legend_once(axes)
    return fig


def retrieval_score(score: pl.DataFrame):
    """Layer Retrieval Ability Score (mean over gaps) vs training fraction, one panel per arm."""
    df = require(score, ["arm", "fraction", "layer", "layer_type", "gap", "score"], "retrieval_score")
    seed = ["seed"] if "seed" in df.columns else []
    df = (df.group_by(["arm", *seed, "fraction", "layer", "layer_type"]).agg(pl.col("score").mean())
          .with_columns(label=pl.format("L{} {}", "layer", "layer_type")).sort(["arm", "layer", "fraction"]))
    arms, labels = _sorted(df, "arm"), df.sort("layer")["label"].unique(maintain_order=True).to_list()
    with themed():
        fig, axes = new_figure(len(arms), sharey=True)
        for ax, arm in zip(axes, arms):
            sns.lineplot(data=_pd(df.filter(pl.col("arm") == arm)), x="fraction", y="score", hue="label",
                         hue_order=labels, palette=PALETTE, marker="o", errorbar=seed_band, ax=ax)
            _title(ax, arm)
            ax.set_xlim(-0.02, 1.02)  # the same axis for every arm, even one scored at a single checkpoint
            ax.set_xlabel("fraction of training")
            ax.set_ylabel("retrieval score")
        _legend_once(axes)
    return fig


def bld_nl_loss(runs: pl.DataFrame):
    """Training loss and held-out CE vs tokens per arm: colour = mixer (and size), solid BLD vs dashed baseline."""
    df = nl_runs(require(runs, ["run", "tokens", "loss", "eval/ce"], "bld_nl metrics")).sort(["run", "tokens"])
    mixers = _sorted(df, "mixer")
    dashes = {"bld": "", "baseline": (4, 2)}
    with themed():
        fig, axes = new_figure(2)
        for ax, col, name in zip(axes, ["loss", "eval/ce"], ["training loss", "held-out CE"]):
            d = df.filter(pl.col(col).is_not_null())
            sns.lineplot(data=_pd(d), x="tokens", y=col, hue="mixer", hue_order=mixers, style="variant",
                         style_order=sorted(dashes), dashes=dashes, palette=PALETTE, errorbar=seed_band, ax=ax)
            ax.set_ylabel(name)
            _tokens_axis(ax)
        _legend_once(axes)
    return fig


def position_loss(buckets: pl.DataFrame):
    """Mean loss per token-position bucket (geometric bucket centre, log axis), one panel per size; with
    `mean_loss_lo/hi` (bootstrap over the documents) a band per arm in its mixer's colour."""
    df = require(buckets, ["mixer", "size", "variant", "bucket_lo", "bucket_hi", "mean_loss"], "position_loss")
    df = df.with_columns(position=(pl.col("bucket_lo") * pl.col("bucket_hi")).sqrt()).sort(
        ["size", "mixer", "variant", "position"])
    sizes, mixers = _sorted(df, "size"), _sorted(df, "mixer")
    dashes = {"bld": "", "baseline": (4, 2)}
    colors = dict(zip(mixers, sns.color_palette(PALETTE, len(mixers))))
    with themed():
        fig, axes = new_figure(len(sizes), sharey=True)
        for ax, size in zip(axes, sizes):
            d = df.filter(pl.col("size") == size)
            sns.lineplot(data=_pd(d), x="position", y="mean_loss", hue="mixer",
                         hue_order=mixers, style="variant", style_order=sorted(dashes),
                         dashes=dashes, palette=PALETTE, marker="o", errorbar=None, ax=ax)
            if "mean_loss_lo" in d.columns:  # one band per arm (mixer x variant)
                for (mixer, _), g in d.group_by(["mixer", "variant"], maintain_order=True):
                    g = g.filter(pl.col("mean_loss_lo").is_not_null() & pl.col("mean_loss_lo").is_not_nan())
                    if g.height:
                        ax.fill_between(g["position"].to_list(), g["mean_loss_lo"].to_list(),
                                        g["mean_loss_hi"].to_list(), color=colors[mixer], alpha=0.15, lw=0)
            ax.set_xscale("log", base=2)
            _title(ax, f"size {size}")
            ax.set_xlabel("token position")
            ax.set_ylabel("mean loss")
        _legend_once(axes)
    return fig


def retrieval_heads(alphas: pl.DataFrame, masking: pl.DataFrame):
    """Gate (alpha) distribution per arm (left) and passkey accuracy as heads are masked (right)."""
    a = require(alphas, ["model", "alpha"], "retrieval_heads").sort(["model", "alpha"])
    m = require(masking, ["model", "frac_masked", "accuracy"], "retrieval_heads_masking").sort(["model", "frac_masked"])
    models = sorted(set(_sorted(a, "model")) | set(_sorted(m, "model")))
    with themed():
        fig, axes = new_figure(2)
        with warnings.catch_warnings():
            # seaborn 0.13 passes matplotlib's deprecated `vert`; harmless, and not ours to fix
            warnings.filterwarnings("ignore", message="vert: bool", category=DeprecationWarning)
            sns.boxplot(data=_pd(a), x="model", y="alpha", order=models, color="#dddddd", fliersize=0, ax=axes[0])
        sns.stripplot(data=_pd(a), x="model", y="alpha", order=models, hue="model", hue_order=models,
                      palette=PALETTE, jitter=False, size=3, legend=False, ax=axes[0])
        axes[0].set_ylim(-0.05, 1.05)
        axes[0].set_ylabel("gate alpha per KV head")
        axes[0].tick_params(axis="x", rotation=45)
        sns.lineplot(data=_pd(m), x="frac_masked", y="accuracy", hue="model", hue_order=models, palette=PALETTE,
                     marker="o", errorbar=None, ax=axes[1])
        if "n" in m.columns:  # Wilson 95 % intervals over the passkey test examples
            colors = dict(zip(models, sns.color_palette(PALETTE, len(models))))
            for (model,), g in m.group_by(["model"], maintain_order=True):
                w = [stats.wilson_interval(int(round(a * n)), int(n)) for a, n in g.select("accuracy", "n").iter_rows()]
                acc = g["accuracy"].to_numpy()
                axes[1].errorbar(g["frac_masked"].to_list(), acc, yerr=[acc - [x.lo for x in w], [x.hi for x in w] - acc],
                                 fmt="none", ecolor=colors[model], elinewidth=0.8, capsize=2, alpha=0.7)
        axes[1].set_xlabel("fraction of heads masked (lowest alpha first)")
        axes[1].set_ylabel("passkey accuracy")
        axes[1].set_ylim(-0.05, 1.05)
        _legend_once(axes[1:])
    return fig


# --- tables and figures added for the report ------------------------------------------------------


def softcka_first_fa_table(softcka: pl.DataFrame) -> pl.DataFrame:
    """SoftCKA (hidden states) just before and just after each hybrid's first full-attention layer.

    Hidden-state row `layer` i is the output of decoder layer i-1 (row 0 = embeddings) and carries that
    layer's type. For each pair, `first_fa_layer` is the first hidden row of the hybrid whose layer is
    full attention; `change` = cka(first_fa_layer) - cka(first_fa_layer - 1), for the hybrid and, at
    the same depth, for its dense partner (the paper's "jump at the first FA layer" is the hybrid's
    change exceeding the dense model's). Pairs whose hybrid has no FA layer are left out.
    """
    df = require(softcka, ["pair", "role", "model", "kind", "layer", "layer_type", "lang", "cka"], "softcka")
    df = df.filter(pl.col("kind") == "hidden")
    first = (df.filter((pl.col("role") == "hybrid") & (pl.col("layer_type") == FULL_ATTENTION))
             .group_by("pair").agg(first_fa_layer=pl.col("layer").min()))
    if first.is_empty():
        raise HybridlabError("table 'softcka' has no hybrid with a full-attention layer (hidden rows); "
                             "nothing to compare at the first FA layer")
    df = df.join(first, on="pair")
    if "cka_lo" not in df.columns:  # a table written before the sentence bootstrap
        df = df.with_columns(cka_lo=pl.lit(math.nan), cka_hi=pl.lit(math.nan))
    at = df.filter(pl.col("layer") == pl.col("first_fa_layer")).select(
        "pair", "role", "model", "lang", "first_fa_layer", cka_after="cka", cka_after_lo="cka_lo",
        cka_after_hi="cka_hi")
    before = df.filter(pl.col("layer") == pl.col("first_fa_layer") - 1).select(
        "pair", "role", "lang", cka_before="cka", cka_before_lo="cka_lo", cka_before_hi="cka_hi")
    out = at.join(before, on=["pair", "role", "lang"]).with_columns(change=pl.col("cka_after") - pl.col("cka_before"))
    return out.sort(["pair", "role", "lang"]).select(
        "pair", "role", "model", "lang", "first_fa_layer", "cka_before", "cka_before_lo", "cka_before_hi",
        "cka_after", "cka_after_lo", "cka_after_hi", "change")


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


def sr_longgap_final(runs: pl.DataFrame) -> pl.DataFrame:
    """Last validation accuracy per gap of each long-gap sweep arm (`longgap<f>`): run, gap, fraction, value."""
    df = require(runs, ["run", "step"], "bld_sr metrics").filter(pl.col("run").str.starts_with("longgap"))
    if df.is_empty():
        raise HybridlabError("no long-gap sweep arms (`longgap<f>`) in the bld_sr runs; set "
                             "experiments.bld_sr.long_gap_fractions")
    df = _melt_prefix(df, "eval/acc/gap", "gap", "bld_sr metrics")
    seed = ["seed"] if "seed" in df.columns else []
    return (df.sort("step").group_by(["run", *seed, "gap"]).agg(pl.col("value").last())
            .with_columns(long_gap_fraction=pl.col("run").str.strip_prefix("longgap").cast(pl.Float64),
                          gap=pl.col("gap").cast(pl.Int64)).sort(["gap", "long_gap_fraction", *seed]))


def sr_longgap(runs: pl.DataFrame):
    """Final validation accuracy per gap vs the long-gap fraction of the training mix (arms `longgap<f>`)."""
    final = sr_longgap_final(runs)
    gaps = [f"gap {g}" for g in _sorted(final, "gap")]
    with themed():
        fig, axes = new_figure(1)
        sns.lineplot(data=_pd(final.with_columns(pl.format("gap {}", "gap").alias("gap"))), x="long_gap_fraction",
                     y="value", hue="gap", hue_order=gaps, palette=PALETTE, marker="o", errorbar=seed_band, ax=axes[0])
        axes[0].set_xlabel("fraction of long-gap training examples")
        axes[0].set_ylabel("final validation accuracy")
        axes[0].set_ylim(-0.02, 1.02)
    return fig


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

# One-paragraph captions for the Snakemake report (the rule adds the preset and the config hash).
CAPTIONS = {
    "fig_placements": "Layer types of every analysed model: full attention (FA) vs the recurrent mixer, per "
                      "decoder layer, for the dense teacher and each converted hybrid.",
    "fig_softcka_pairs": "SoftCKA between English and each language's parallel sentences, per layer (hidden "
                         "states; layer 0 = embeddings). Solid = hybrid, dashed = its dense partner; the "
                         "hybrid's FA layers are shaded. Higher = more cross-lingual alignment. Bands: 95 % bootstrap over sentences.",
    "fig_softcka_attn_delta": "SoftCKA of each mixer / attention block's residual contribution (attn_delta), "
                              "English vs each language, per decoder layer; hybrid FA layers shaded. Bands: 95 % bootstrap over sentences.",
    "fig_recency": "Attention recency of the full-attention layers, hybrid vs dense: mean attention distance "
                   "per FA layer (top) and attention mass on the last w tokens vs w (bottom), means over heads and "
                   "languages. Error bars (top) and bands (bottom): 95 % percentile bootstrap over the input "
                   "sequences, computed per head and averaged over the same heads (a typical head's interval).",
    "fig_fertility": "Tokenizer fertility: tokens per sentence relative to English on the parallel set, per "
                     "language and tokenizer. Error bars: 95 % bootstrap over sentence pairs.",
    "fig_niah": "Multilingual needle-in-a-haystack: accuracy (mean over the OneRULER-style tasks) and seconds "
                "per example vs context length (in the model's tokens), hybrid vs dense; OOM cells marked. Error bars: 95 % Wilson intervals over each cell's examples.",
    "fig_distill_curves": "Distillation stage 2: held-out cross-entropy and KL(teacher || student) vs "
                          "training tokens, one line per full-attention placement. Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_tokens_to_baseline": "Tokens each placement needs to reach the standard-periodic arm's final loss, "
                              "as a fraction of the standard-periodic arm's tokens (lower = faster). Bars: mean over seeds; error bars: 95 % t-interval across seeds.",
    "fig_sr_accuracy": "Spaced Retrieval: validation answer accuracy vs step per gap, one line per BLD arm "
                       "(baseline, freezes of the recurrent layers, long-gap sweep). Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_sr_grad_norms": "Spaced Retrieval: gradient norm of attention and recurrent layers vs step, per arm "
                         "(frozen steps are not drawn). Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_sr_longgap": "Spaced Retrieval long-gap sweep: final validation accuracy per gap vs the fraction of "
                      "long-gap examples in training. Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_retrieval_score": "Layer Retrieval Ability Score by activation patching, per layer, over training "
                           "(baseline, arms freezing the recurrent layers before or after the takeover, long-gap "
                           "sweep). Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_bld_nl_loss": "BLD on natural language: training loss and held-out CE vs tokens; colour = mixer, "
                       "solid = BLD (recurrent layers frozen early), dashed = baseline. Lines: mean over replicate seeds; bands: 95 % t-interval across seeds (none with one seed).",
    "fig_position_loss": "Mean loss by token-position bucket on long documents, BLD vs baseline per mixer. "
                         "Bands: 95 % percentile bootstrap over the documents (evaluation windows) of each "
                         "bucket's token-mean loss.",
    "fig_retrieval_heads": "Retrieval heads (DuoAttention-style gates): alpha per KV head of the attention "
                           "layers (left) and passkey accuracy as heads are masked, lowest alpha first (right). Error bars: 95 % Wilson intervals over the passkey examples.",
    "table_perplexity": "Per-language perplexity of the teacher and of every placement's student, the best "
                        "placement per language and its relative change vs standard periodic.",
    "table_kl_reduction": "Languages ranked by the KL reduction of their best placement vs standard periodic "
                          "(1 - KL(best) / KL(standard periodic)).",
    "table_softcka_first_fa": "SoftCKA just before and after each hybrid's first full-attention layer, for "
                              "the hybrid and its dense partner at the same depth (the jump at the first FA "
                              "layer).",
    "table_lm_benchmarks": "Standard benchmarks (lm-eval; paper preset): one row per model (teachers, "
                           "distilled students, BLD arms), one column per task and metric.",
    "table_bld_nl": "BLD on natural language per arm: final held-out CE (mean over seeds, t-interval across "
                    "seeds), its paired change vs the baseline arm with its interval and sign test, long-document "
                    "perplexity and LongPPL (first seed).",
    "table_placement_tests": "Each placement vs standard periodic per language (and pooled): token-pooled CE / KL "
                             "difference with its t-interval across seeds and its bootstrap CI over held-out rows, "
                             "paired permutation and sign tests over rows, and the verdict.",
    "table_kl_gaps": "Held-out KL to the teacher (and CE) of every distilled student at conversion, after stage 1 and "
                     "after stage 2, per seed; past_baseline_final marks a stage-2 start already at or below the "
                     "standard-periodic baseline's final CE.",
    "table_tokens_to_target": "Tokens to target from smoothed distillation curves over both stages (from the "
                              "converted model): the fraction of standard periodic's tokens each placement needs "
                              "to reach 50 / 80 / 90 / 100 % of the baseline's smoothed improvement, mean and "
                              "t-interval across seeds; seeds already past a target at their first evaluation "
                              "are counted (upper bounds).",
    "table_retrieval_score": "Final Layer Retrieval Ability Score per BLD-SR arm and layer (mean over gaps): mean "
                             "and t-interval across seeds.",
    "table_sr_accuracy": "Final Spaced Retrieval validation accuracy per BLD-SR arm and gap: mean and t-interval "
                         "across seeds (clipped to [0, 1]).",
    "table_findings": "Generated findings table: each finding of both studies, computed from the tables above, "
                      "with its effect, 95 % interval (over seeds, or over evaluation units of one seed) and verdict "
                      "(reproduced / contradicted / inconclusive at this scale; docs/methods.md \"Findings table\" gives the rules).",
}


# name -> (function, the table names it reads, in argument order)
FIGURES = {
    "fig_placements": (placements, ["softcka"]),
    "fig_softcka_pairs": (lambda t: softcka_pairs(t, "hidden"), ["softcka"]),
    "fig_softcka_attn_delta": (lambda t: softcka_pairs(t, "attn_delta"), ["softcka"]),
    "fig_recency": (recency, ["recency"]),
    "fig_fertility": (fertility, ["fertility"]),
    "fig_niah": (niah, ["niah"]),
    "fig_distill_curves": (distill_curves, ["distill"]),
    "fig_tokens_to_baseline": (tokens_to_baseline, ["tokens_to_baseline"]),
    "fig_sr_accuracy": (sr_accuracy, ["bld_sr"]),
    "fig_sr_grad_norms": (sr_grad_norms, ["bld_sr"]),
    "fig_sr_longgap": (sr_longgap, ["bld_sr"]),
    "fig_retrieval_score": (retrieval_score, ["retrieval_score"]),
    "fig_bld_nl_loss": (bld_nl_loss, ["bld_nl"]),
    "fig_position_loss": (position_loss, ["position_loss"]),
    "fig_retrieval_heads": (retrieval_heads, ["retrieval_heads", "retrieval_heads_masking"]),
}
RUN_TABLES = ("distill", "distill_stage1", "bld_sr", "bld_nl", "softcka_seeds")  # one metrics file per run: `<table>/<run>=path`
# Inputs a table reads when they exist (a preset without the BLD study has none of the BLD tables).
OPTIONAL_INPUTS = {"table_findings": ("retrieval_score", "bld_sr", "bld_nl", "softcka_seeds", "recency", "fertility",
                                      "position_loss_summary", "position_loss")}
TABLES = {
    "table_perplexity": (perplexity_table, ["perplexity"]),
    "table_kl_reduction": (kl_reduction_table, ["perplexity"]),
    "table_softcka_first_fa": (softcka_first_fa_table, ["softcka"]),
    "table_bld_nl": (bld_nl_table, ["bld_nl", "position_loss_summary"]),
    "table_lm_benchmarks": (lm_benchmarks_table, ["lm_benchmarks"]),  # paper preset only
    "table_placement_tests": (placement_tests_table, ["perplexity_rows"]),
    "table_tokens_to_target": (tokens_to_target_table, ["distill", "distill_stage1"]),
    "table_retrieval_score": (retrieval_score_table, ["retrieval_score"]),
    "table_sr_accuracy": (sr_accuracy_table, ["bld_sr"]),
    "table_kl_gaps": (lambda *a, **k: _results_page.kl_gap_table(*a, **k), ["distill", "distill_stage1"]),
    # the tables after softcka_seeds are findings_table's keyword arguments
    "table_findings": (lambda *a, **k: _findings.findings_table(
        *a[:9], **dict(zip(("recency", "fertility", "position_loss_summary", "position_loss"), a[9:])), **k),
                       ["perplexity_rows", "distill", "softcka", "niah", "retrieval_score", "bld_sr", "bld_nl",
                        "distill_stage1", "softcka_seeds", "recency", "fertility", "position_loss_summary",
                        "position_loss"]),
}


def render(name: str, tables: dict[str, pl.DataFrame]):
    """The Figure `name` of FIGURES drawn from `tables` (table name -> DataFrame)."""
    if name not in FIGURES:
        raise HybridlabError(f"unknown figure '{name}'; choose one of {sorted(FIGURES)}")
    fn, needs = FIGURES[name]
    missing = [t for t in needs if t not in tables]
    if missing:
        raise HybridlabError(f"figure '{name}' needs tables {missing}; pass them as --tables NAME=PATH")
    return fn(*[tables[t] for t in needs])


def render_table(name: str, tables: dict[str, pl.DataFrame], **kwargs) -> pl.DataFrame:
    """The table `name` of TABLES built from `tables`."""
    if name not in TABLES:
        raise HybridlabError(f"unknown table '{name}'; choose one of {sorted(TABLES)}")
    fn, needs = TABLES[name]
    missing = [t for t in needs if t not in tables and t not in OPTIONAL_INPUTS.get(name, ())]
    if missing:
        raise HybridlabError(f"table '{name}' needs tables {missing}; pass them as --tables NAME=PATH")
    accepted = inspect.signature(_TABLE_SIGNATURES.get(name, fn)).parameters
    return fn(*[tables.get(t) for t in needs], **{k: v for k, v in kwargs.items() if k in accepted})


from hybridlab.plots import findings as _findings  # noqa: E402

from hybridlab.plots import results_page as _results_page  # noqa: E402

_TABLE_SIGNATURES = {"table_findings": _findings.findings_table, "table_kl_gaps": _results_page.kl_gap_table}


# --- the figure and table outputs of the figures rules ---------------------------------------------------

def read_tables(items: list[str]) -> dict[str, pl.DataFrame]:
    """`NAME=PATH` / `NAME/RUN=PATH` items (make_figure.py's --tables) -> {table: DataFrame}.

    NAME=PATH reads one parquet table; NAME/RUN=PATH, NAME one of RUN_TABLES, reads one training log per
    run, and the runs of NAME are concatenated into one table with a `run` column (`concat_runs`). A damaged
    file (truncated, hand-edited, not parquet) raises one line naming it and how to rebuild it."""
    from hybridlab.atomic import rebuild_hint

    def _read_parquet(path: str, name: str) -> pl.DataFrame:
        try:
            return pl.read_parquet(path)
        except Exception as exc:  # polars raises several kinds (ComputeError, OSError, ...) for a bad file
            reason = " ".join(str(exc).split())[:160] or type(exc).__name__
            raise HybridlabError(f"table file {path} (for '{name}') is damaged or not a parquet table ({reason}); "
                                 f"{rebuild_hint(path)}") from exc

    plain, runs = {}, {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise HybridlabError(f"--tables item '{item}' is not NAME=PATH")
        if not Path(path).is_file():
            raise HybridlabError(f"table file {path} (for '{name}') does not exist; build its rule first")
        table, slash, run = name.partition("/")
        if slash:
            if table not in RUN_TABLES:
                raise HybridlabError(f"'{name}': only {list(RUN_TABLES)} take per-run files (NAME/RUN=PATH)")
            runs.setdefault(table, {})[run] = _read_parquet(path, name)
        else:
            if name in plain:
                raise HybridlabError(f"table '{name}' given twice in --tables")
            plain[name] = _read_parquet(path, name)
    for table, frames in runs.items():
        plain[table] = concat_runs(frames)
    return plain


def render_outputs(name: str, tables: dict[str, pl.DataFrame], params: dict | None = None, *,
                   out_png=None, out_pdf=None, out_csv=None, out_md=None) -> str:
    """Render the figure (PNG + PDF, byte-stable: `hybridlab.plots.style.save_all`) or the table (CSV +
    Markdown: `write_table`) `name` from `tables`; returns a one-line report. A table takes
    `params["baseline_placement"]` as its `baseline` when it has that parameter."""
    params = params or {}
    if name in TABLES:
        if not (out_csv and out_md):
            raise HybridlabError(f"table '{name}' needs --out-csv and --out-md")
        kwargs = {"baseline": params["baseline_placement"]} if "baseline_placement" in params else {}
        df = render_table(name, tables, **kwargs)
        write_table(df, out_csv, out_md)
        return f"{name}: {df.height} rows -> {out_csv}, {out_md}"
    if not (out_png and out_pdf):
        raise HybridlabError(f"figure '{name}' needs --out-png and --out-pdf")
    from hybridlab.plots.style import save_all

    save_all(render(name, tables), out_png, out_pdf)
    return f"{name} -> {out_png}, {out_pdf}"

"""One function per figure of the two studies, each drawn from the tidy eval / metrics tables.

Every function takes polars DataFrames with the columns documented by the script that writes them
(workflow_scripts/eval_*.py docstrings; `metrics.parquet` of distill.py / train_bld_sr.py /
train_bld_nl.py; several runs' logs as one table, `hybridlab.plots.tables.concat_runs`) and returns a
`matplotlib.figure.Figure` in the shared style (`hybridlab.plots.style`); `save_all` writes it byte-stably.
Category orders are sorted explicitly, never taken from row order, so the same table always gives the
same bytes. Which figure reads which tables, and its caption, is `hybridlab.plots.registry`.

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
"""

from __future__ import annotations

import math
import textwrap
import warnings
from collections.abc import Mapping, Sequence

import polars as pl

from hybridlab.errors import HybridlabError
from hybridlab.eval import stats
from hybridlab.models.placements import FULL_ATTENTION
from hybridlab.plots.style import FA_COLOR, MAX_COLS, PALETTE, ROLE_COLORS, LazyModule, new_figure, sns, themed
from hybridlab.plots.tables import _melt_prefix, _sorted, require
from hybridlab.plots.uncertainty import nl_runs, seed_band

ticker = LazyModule("matplotlib.ticker")

ROLE_DASHES = {"hybrid": "", "dense": (4, 2)}


def draw_placements(ax, rows: Mapping[str, Sequence[str]], *, colors: Mapping[str, str] | None = None):
    """Draw one row of layer cells per named placement on a matplotlib Axes; returns the Axes.

    FA layers are dark, sliding-window light grey, mixers pale; one legend entry per type present.
    """
    from matplotlib.patches import Patch, Rectangle

    if not rows:
        raise HybridlabError("draw_placements needs at least one named row of layer types")
    palette = {FULL_ATTENTION: "#1f3b73", "sliding_attention": "#9aa5b1"}
    if colors:
        palette.update(colors)
    mixer_color = "#e8c468"
    names = list(rows)
    width = max(len(t) for t in rows.values())
    seen: dict[str, str] = {}
    for r, name in enumerate(names):
        y = len(names) - 1 - r  # first row on top
        for i, t in enumerate(rows[name]):
            color = palette.get(t, mixer_color)
            seen.setdefault(t, color)
            ax.add_patch(Rectangle((i, y + 0.1), 0.9, 0.8, facecolor=color, edgecolor="none"))
    ax.set_xlim(-0.2, width + 0.1)
    ax.set_ylim(0, len(names))
    ax.set_yticks([len(names) - 1 - r + 0.5 for r in range(len(names))])
    ax.set_yticklabels(names)
    step = max(1, width // 12)
    ax.set_xticks([i + 0.45 for i in range(0, width, step)])
    ax.set_xticklabels([str(i) for i in range(0, width, step)])
    ax.set_xlabel("layer")
    for spine in ax.spines.values():
        spine.set_visible(False)
    ax.tick_params(length=0)
    ax.legend(
        handles=[Patch(facecolor=c, label=t.replace("_", " ")) for t, c in seen.items()],
        loc="upper center",
        bbox_to_anchor=(0.5, -0.15 if len(names) > 2 else -0.35),
        ncol=len(seen),
        frameon=False,
    )
    return ax


def _pd(df: pl.DataFrame):
    return df.to_pandas()


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


# --- multilinguality ------------------------------------------------------------------------------


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


SOFTCKA_LABELS = {"alignment": "pair alignment vs English", "language_offset": "language offset from English",
                  "cka": "sentence-set SoftCKA vs English (second view)"}


def softcka_pairs(softcka: pl.DataFrame, kind: str = "hidden", metrics=None):
    """SoftCKA by layer, one panel per (metric, pair): the pair alignment (the headline) in the top rows, the
    language offset below it (when the table has it), the sentence-set CKA (a second view) last; colour =
    language, solid hybrid vs dashed dense, the hybrid's FA layers shaded, bootstrap bands over sentences
    where the table has them."""
    if metrics is None:
        metrics = [m for m in ("alignment", "language_offset", "cka") if m != "language_offset"
                   or m in softcka.columns]
    df = require(softcka, ["pair", "role", "kind", "layer", "layer_type", "lang", *metrics], "softcka")
    df = df.filter(pl.col("kind") == kind)
    if df.height == 0:
        raise HybridlabError(f"table 'softcka' has no rows of kind '{kind}'")
    pairs, langs = _sorted(df, "pair"), _sorted(df, "lang")
    ncols = min(len(pairs), MAX_COLS)
    block = -(-len(pairs) // ncols) * ncols  # panels per metric: whole rows, so each metric starts a row
    with themed():
        fig, grid = new_figure(block * len(metrics), ncols)
        axes = []
        for b, metric in enumerate(metrics):
            for k, pair in enumerate(pairs):
                ax = grid[b * block + k]
                axes.append(ax)
                _softcka_panel(ax, df.filter(pl.col("pair") == pair), metric, langs)
                _title(ax, pair)
                ax.set_ylabel(SOFTCKA_LABELS.get(metric, metric))
            for ax in grid[b * block + len(pairs):(b + 1) * block]:
                ax.set_visible(False)
        fig.suptitle(f"Alignment vs English by layer ({kind}); shaded: the hybrid's FA layers", fontsize=9)
        _legend_once(axes)
    return fig


def _softcka_panel(ax, d: pl.DataFrame, metric: str, langs: list) -> None:
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
    ax.xaxis.set_major_locator(ticker.MaxNLocator(integer=True))


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


# --- competing learning / BLD ---------------------------------------------------------------------


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



def layer_importance(table: pl.DataFrame):
    """Heat map of layer importance (KL score, log colour scale) by language group x layer, one panel per teacher x
    mixer; dots mark the searched placement's FA layers, numbers give each cell's bootstrap top-set frequency."""
    import numpy as np

    df = require(table, ["teacher", "mixer", "group", "layer", "kl", "p_top", "chosen"], "layer_importance")
    panels = df.select("teacher", "mixer").unique(maintain_order=True).rows()
    n_layers = int(df["layer"].max()) + 1
    with themed():
        fig, axes = new_figure(len(panels), ncols=1, width=max(5.0, 0.32 * n_layers + 2.0),
                               height=2.8 * len(panels))
        for ax, (teacher, mixer) in zip(axes, panels):
            g = df.filter((pl.col("teacher") == teacher) & (pl.col("mixer") == mixer))
            groups = g["group"].unique(maintain_order=True).to_list()
            kl = np.full((len(groups), n_layers), np.nan)
            for r in g.iter_rows(named=True):
                kl[groups.index(r["group"]), r["layer"]] = r["kl"]
            image = ax.imshow(np.log10(np.maximum(kl, 1e-6)), aspect="auto", cmap="viridis")
            ax.grid(False)
            for r in g.iter_rows(named=True):
                y, x = groups.index(r["group"]), r["layer"]
                if r["chosen"]:
                    ax.plot(x, y - 0.22, "o", color="white", ms=3.5, mec="black", mew=0.5)
                if n_layers <= 32:
                    ax.text(x, y + 0.2, f"{r['p_top']:.0%}".replace("%", ""), ha="center", va="center",
                            fontsize=5, color="white")
            ax.set_yticks(range(len(groups)))
            ax.set_yticklabels(groups)
            step = max(1, n_layers // 16)
            ax.set_xticks(range(0, n_layers, step))
            ax.set_xlabel("layer")
            ax.set_title(f"{teacher} / {mixer}", fontsize=8)
            fig.colorbar(image, ax=ax, label="log10 KL (nats/token)", shrink=0.8)
    return fig

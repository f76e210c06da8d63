"""The findings table's shared rules: its columns, the verdict rule (`decide`), the row format, and the
helpers every study's rows use (seed spreads, sign tests, analysis pairs and the first-FA margin).
The rules themselves are described in `hybridlab.plots.findings`.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from hybridlab.eval import stats
from hybridlab.plots import uncertainty as U

FA_FIRST = ("reverse_periodic", "sandwich", "interleaved_sandwich", "endpoint_spread")
COLUMNS = {"study": pl.String, "finding": pl.String, "comparison": pl.String, "effect_definition": pl.String,
           "expected": pl.String, "effect": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64,
           "ci_over": pl.String, "n_seeds": pl.Int64, "n_censored": pl.Int64, "n_undefined": pl.Int64,
           "test": pl.String,
           "p_value": pl.Float64, "verdict": pl.String, "note": pl.String, "source": pl.String}
MULTI, BLD = "multilinguality", "competing learning (BLD)"
ENGLISH = "eng_Latn"
ALPHA = 0.05
STUDY_STAGE2_FRACTION = 0.40  # FA-first placements reach the baseline's final loss with about 40 % of its tokens
STUDY_LANGUAGES = (23, 26)  # languages whose loss the FA-first placement improves, of those evaluated
FULL_ATTENTION = "full_attention"


def decide(effect: float, lo: float, hi: float, expected: int, n_seeds: int,
           units: str | None = None) -> tuple[str, str]:
    """(verdict, note). `units` set: fixed published models, decided from the interval over those evaluation
    units; otherwise the seed rule: stats.verdict of an interval across >= 2 seeds, else inconclusive."""
    if effect is None or not math.isfinite(effect):
        return stats.INCONCLUSIVE, "no estimate"
    if units:
        return stats.verdict(effect, (lo, hi), expected), f"fixed published models: interval over {units}"
    if n_seeds < 2:
        return stats.INCONCLUSIVE, "one seed"
    return stats.verdict(effect, (lo, hi), expected), ""


def _row(study, finding, comparison, definition, expected, effect, lo, hi, ci_over, n_seeds, test, p, source,
         note="", *, units=None, verdict=None, n_censored=0, n_undefined=0):
    """One findings row; `verdict` given: already decided by the caller (its reason is in `note`); `expected`
    0: the study's sign is not known for this comparison (shown empty; the caller decides the verdict)."""
    if verdict is None:
        v, why = decide(effect, lo, hi, expected, n_seeds, units)
    else:
        v, why = verdict, ""
    return {"study": study, "finding": finding, "comparison": comparison, "effect_definition": definition,
            "expected": "+" if expected > 0 else "-" if expected < 0 else "", "effect": effect, "ci_lo": lo,
            "ci_hi": hi, "ci_over": ci_over, "n_seeds": n_seeds, "n_censored": n_censored, "n_undefined": n_undefined,
            "test": test, "p_value": p, "verdict": v,
            "note": "; ".join(x for x in (why, note) if x), "source": source}


def _spread(values) -> tuple[float, float, float, int]:
    c = U.spread_columns(values, "x")
    return c["x"], c["x_lo"], c["x_hi"], c["n_seeds"]


def _sign_p(values) -> float:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return stats.sign_test(v).p_value if v else math.nan


def _f(x: float) -> str:
    return f"{x:.2f}"


def _versus_study(lo: float, hi: float, study: float) -> str:
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return ""
    where = "contains" if lo <= study <= hi else "lies below" if hi < study else "lies above"
    return f"the interval {where} the study's {_f(study)}"


def _boot_over(values, seed: int = 0) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size < 2:
        return math.nan, math.nan
    ci = stats.bootstrap_ci(v, np.mean, n_boot=U.N_BOOT, seed=seed)
    return ci.lo, ci.hi


def pair_models(table: pl.DataFrame) -> dict[str, dict[str, str | None]]:
    """{pair: {"hybrid": model, "dense": model or None}} of an analysis table (columns pair, role, model)."""
    out: dict[str, dict[str, str | None]] = {}
    cols = [c for c in ("pair", "role", "model") if c in table.columns]
    for r in table.select(cols).unique().sort(cols).iter_rows(named=True):
        out.setdefault(r["pair"], {"hybrid": None, "dense": None})[r["role"]] = r.get("model", r["pair"])
    return out


def is_published(pair: str, hybrid_model: str | None) -> bool:
    """A hub pair of published models: its hybrid is not named after the pair (a distilled student of the DAG
    is, `eval.pairs.analysis_models`). A table without a `model` column counts as the DAG's (seed rule)."""
    return hybrid_model is not None and hybrid_model != pair


def _analysis_rule(pair: str, models: dict, units: str) -> dict:
    """The verdict rule's arguments of one analysis pair: published -> interval over `units`, n_seeds 0;
    the DAG's -> the first seed's models, n_seeds 1 (inconclusive by the seed rule)."""
    if is_published(pair, models.get("hybrid")):
        return {"n_seeds": 0, "units": units, "ci_over": f"{units} (bootstrap; fixed published models)"}
    return {"n_seeds": 1, "units": None, "ci_over": f"{units} (bootstrap; first seed's models)"}


def _no_dense_row(finding: str, pair: str, source: str, expected: int) -> dict:
    return _row(MULTI, finding, pair, "hybrid minus dense", expected, math.nan, math.nan, math.nan, "none", 0, "",
                math.nan, source, "skipped: the pair has no dense model (a hybrid on its own), so hybrid minus "
                "dense is undefined", verdict=stats.INCONCLUSIVE)


def first_fa_margins(hybrid_hidden: pl.DataFrame, metric: str) -> tuple[int | None, dict[str, float]]:
    """(first FA hidden row, {lang: margin}) of one hybrid's hidden-state rows (columns layer, layer_type,
    lang, `metric`). Hidden row l is decoder layer l-1's output (row 0 the embeddings) and carries its
    type; the change at row l is delta_l = metric(l) - metric(l-1). margin = |delta_f| - max_{l != f}
    |delta_l| at the first FA row f: positive exactly when the largest |change| across layers sits at the
    first FA layer (0 when they are equal up to rounding, 1e-12 of the largest |change|). A language with
    fewer than two changes gets no margin."""
    fa = hybrid_hidden.filter(pl.col("layer_type") == FULL_ATTENTION)["layer"]
    if fa.is_empty():
        return None, {}
    f = int(fa.min())
    out = {}
    for (lang,), g in hybrid_hidden.sort(["lang", "layer"]).group_by(["lang"], maintain_order=True):
        layers, vals = g["layer"].to_list(), g[metric].to_list()
        delta = {layers[i]: vals[i] - vals[i - 1] for i in range(1, len(layers)) if layers[i] == layers[i - 1] + 1}
        if f not in delta or len(delta) < 2 or not all(math.isfinite(x) for x in delta.values()):
            continue
        margin = abs(delta[f]) - max(abs(x) for layer, x in delta.items() if layer != f)
        scale = max(abs(x) for x in delta.values())
        out[lang] = 0.0 if abs(margin) <= 1e-12 * scale else margin  # equal up to rounding: a tie, not a win
    return f, out


def _seed_effects(hid: pl.DataFrame, extra: pl.DataFrame | None, pair: str, effect) -> list[float]:
    """`effect(rows of one pair)` for the first seed's table and each further seed's (`extra`, a `seed`
    column); NaN effects are left out."""
    values = [effect(hid.filter(pl.col("pair") == pair))]
    if extra is not None:
        for (_seed,), g in extra.filter(pl.col("pair") == pair).group_by(["seed"], maintain_order=True):
            values.append(effect(g))
    return [v for v in values if v is not None and math.isfinite(v)]


def _over_seeds(row: dict, values: list[float]) -> dict:
    """A DAG pair's row decided over its replicate seeds (mean, t-interval) when there are two or more."""
    if len(values) < 2:
        return row
    c = U.spread_columns(values, "x")
    v, why = decide(c["x"], c["x_lo"], c["x_hi"], -1 if row["expected"] == "-" else +1, c["n_seeds"])
    note = "; ".join(x for x in (why, f"mean over {c['n_seeds']} seeds of the per-seed effect "
                                      f"({', '.join(f'{x:.3g}' for x in values)})") if x)
    return {**row, "effect": c["x"], "ci_lo": c["x_lo"], "ci_hi": c["x_hi"], "ci_over": "seeds (t-interval)",
            "n_seeds": c["n_seeds"], "verdict": v, "note": note, "test": "", "p_value": math.nan}

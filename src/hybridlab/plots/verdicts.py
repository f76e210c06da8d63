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
           "p_value": pl.Float64, "verdict": pl.String, "note": pl.String, "source": pl.String,
           "students_kl": pl.Float64, "kl_limit": pl.Float64}
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
         note="", *, units=None, verdict=None, n_censored=0, n_undefined=0, students=()):
    """One findings row; `verdict` given: already decided by the caller (its reason is in `note`); `expected`
    0: the study's sign is not known for this comparison (shown empty; the caller decides the verdict).
    `students`: the (teacher, mixer, placement) of each distilled student the row is about (empty for fixed
    models, tokenizers and the BLD study); `gate_convergence` reads them."""
    if verdict is None:
        v, why = decide(effect, lo, hi, expected, n_seeds, units)
    else:
        v, why = verdict, ""
    return {"study": study, "finding": finding, "comparison": comparison, "effect_definition": definition,
            "expected": "+" if expected > 0 else "-" if expected < 0 else "", "effect": effect, "ci_lo": lo,
            "ci_hi": hi, "ci_over": ci_over, "n_seeds": n_seeds, "n_censored": n_censored, "n_undefined": n_undefined,
            "test": test, "p_value": p, "verdict": v,
            "note": "; ".join(x for x in (why, note) if x), "source": source, "students_kl": math.nan,
            "kl_limit": math.nan, STUDENTS: tuple(students)}


# --- convergence: a finding about distilled students is decided only when they are near their teacher ------

STUDENTS = "_students"  # a row's private key: the students it is about (dropped before the table is built)


def student_of_pair(pair: str) -> tuple[str, str, str] | None:
    """(teacher, mixer, placement) of a DAG analysis pair named `<teacher>/<placement>-<mixer>`
    (`eval.pairs.analysis_models`); None for a name of another form."""
    teacher, slash, student = pair.rpartition("/")
    placement, dash, mixer = student.rpartition("-")
    return (teacher, mixer, placement) if slash and dash and teacher and placement else None


def pair_students(pair: str, models: dict) -> tuple[tuple[str, str, str], ...]:
    """The distilled student of an analysis pair, () for published models."""
    if is_published(pair, models.get("hybrid")):
        return ()
    s = student_of_pair(pair)
    return (s,) if s else ()


def placement_students(rows: pl.DataFrame, teacher: str, mixer: str, placements=None) -> tuple:
    """(teacher, mixer, p) for `placements`, or for every placement of that teacher x mixer in `rows`."""
    if placements is None:
        g = rows.filter((pl.col("teacher") == teacher) & (pl.col("mixer") == mixer) & pl.col("placement").is_not_null())
        placements = sorted(g["placement"].unique().to_list())
    return tuple((teacher, mixer, p) for p in placements)


def students_kl(perplexity_rows: pl.DataFrame | None) -> dict[tuple[str, str, str], float]:
    """{(teacher, mixer, placement): held-out KL(teacher || student)}: token-pooled over every held-out row
    and language, then the mean over the student's seeds."""
    need = {"teacher", "mixer", "placement", "kl", "n_tokens"}
    if perplexity_rows is None or not need <= set(perplexity_rows.columns):
        return {}
    r = perplexity_rows.filter(pl.col("placement").is_not_null() & pl.col("kl").is_not_null())
    seed = ["seed"] if "seed" in r.columns else []
    per_seed = (r.group_by(["teacher", "mixer", "placement", *seed])
                .agg(kl=(pl.col("kl") * pl.col("n_tokens")).sum() / pl.col("n_tokens").sum()))
    mean = per_seed.group_by(["teacher", "mixer", "placement"]).agg(pl.col("kl").mean())
    return {(t, m, p): float(k) for t, m, p, k in mean.select("teacher", "mixer", "placement", "kl").iter_rows()}


def gate_convergence(rows: list[dict], kls: dict, limit: float | None) -> list[dict]:
    """Each row about distilled students, decided only when every one of them is within `limit` nats of held-out
    KL to its teacher: otherwise its verdict is "inconclusive" with the note "students not converged: KL x > limit"
    (the largest student KL); a student without a KL counts as not converged. `students_kl` (the largest KL of
    the row's students) and `kl_limit` are recorded on every such row; a row comparing two or more students
    names each one's KL in its note. Rows without students (fixed models, tokenizers, BLD) are unchanged.
    `limit` None: KLs recorded, nothing gated."""
    out = []
    for r in rows:
        r = dict(r)
        students = r.pop(STUDENTS, ())
        if not students:
            out.append(r)
            continue
        values = [kls.get(tuple(s)) for s in students]
        known = [v for v in values if v is not None and math.isfinite(v)]
        worst = max(known) if len(known) == len(values) else math.nan
        r["students_kl"] = worst
        r["kl_limit"] = math.nan if limit is None else float(limit)
        gate = kl_list = ""
        if len(students) >= 2:
            kl_list = "students' KL: " + ", ".join(
                f"{s[2]} {'?' if v is None else f'{v:.2f}'}" for s, v in zip(students, values))
        if limit is not None and not (worst <= limit):
            why = (f"KL {worst:.2f} > {limit:.2f}" if math.isfinite(worst) else
                   f"KL unknown for {', '.join(s[2] for s, v in zip(students, values) if v is None)}")
            gate = f"students not converged: {why}"
            r["verdict"] = stats.INCONCLUSIVE
        r["note"] = "; ".join(x for x in (gate, r["note"], kl_list) if x)
        out.append(r)
    return out


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
    the DAG's -> the first seed's models, n_seeds 1 (inconclusive by the seed rule), and its student."""
    if is_published(pair, models.get("hybrid")):
        return {"n_seeds": 0, "units": units, "ci_over": f"{units} (bootstrap; fixed published models)",
                "students": ()}
    return {"n_seeds": 1, "units": None, "ci_over": f"{units} (bootstrap; first seed's models)",
            "students": pair_students(pair, models)}


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

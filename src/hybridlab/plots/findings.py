"""The findings table: each finding of the two studies computed from the result tables, with its effect, a
CI and a verdict (docs/methods.md "Findings table").

One row per finding and comparison. `effect` is the point estimate (its sign convention is in `effect`'s
definition per finding, `expected` the sign the study reports); `ci_lo` / `ci_hi` the 95 % interval named in
`ci_over`; `verdict` = `stats.verdict(effect, ci, expected)` ("reproduced" / "contradicted" /
"inconclusive") when the interval is across >= 2 replicate seeds. An interval over evaluation units of ONE
seed (sentences, languages, examples) covers the evaluation sample only, not the training run, so such a
finding is "inconclusive" with the note "one seed" whatever its interval: one seed on one machine cannot
carry a verdict (issue 14). A finding whose arms the preset does not run is left out.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from hybridlab.errors import HybridlabError
from hybridlab.eval import stats
from hybridlab.plots import uncertainty as U

FA_FIRST = ("reverse_periodic", "sandwich", "interleaved_sandwich", "endpoint_spread")
COLUMNS = {"study": pl.String, "finding": pl.String, "comparison": pl.String, "effect_definition": pl.String,
           "expected": pl.String, "effect": pl.Float64, "ci_lo": pl.Float64, "ci_hi": pl.Float64,
           "ci_over": pl.String, "n_seeds": pl.Int64, "test": pl.String, "p_value": pl.Float64,
           "verdict": pl.String, "note": pl.String, "source": pl.String}
MULTI, BLD = "multilinguality", "competing learning (BLD)"


def decide(effect: float, lo: float, hi: float, expected: int, n_seeds: int) -> tuple[str, str]:
    """(verdict, note): stats.verdict of the interval when it is across >= 2 seeds, else inconclusive."""
    if effect is None or not math.isfinite(effect):
        return stats.INCONCLUSIVE, "no estimate"
    if n_seeds < 2:
        return stats.INCONCLUSIVE, "one seed"
    return stats.verdict(effect, (lo, hi), expected), ""


def _row(study, finding, comparison, definition, expected, effect, lo, hi, ci_over, n_seeds, test, p, source,
         note=""):
    v, why = decide(effect, lo, hi, expected, n_seeds)
    return {"study": study, "finding": finding, "comparison": comparison, "effect_definition": definition,
            "expected": "+" if expected > 0 else "-", "effect": effect, "ci_lo": lo, "ci_hi": hi, "ci_over": ci_over,
            "n_seeds": n_seeds, "test": test, "p_value": p, "verdict": v,
            "note": "; ".join(x for x in (why, note) if x), "source": source}


def _spread(values) -> tuple[float, float, float, int]:
    c = U.spread_columns(values, "x")
    return c["x"], c["x_lo"], c["x_hi"], c["n_seeds"]


def _sign_p(values) -> float:
    v = [x for x in values if x is not None and math.isfinite(x)]
    return stats.sign_test(v).p_value if v else math.nan


# --- multilinguality ----------------------------------------------------------------------------------


def _placement_rows(rows: pl.DataFrame, distill: pl.DataFrame, baseline: str,
                    stage1: pl.DataFrame | None = None) -> list[dict]:
    out = []
    tt = U.tokens_to_target_table(distill, stage1, baseline)
    full = tt.filter((pl.col("level") == 1.0) & (pl.col("placement") != baseline))
    for r in full.iter_rows(named=True):
        note = f"{r['n_below_at_start']} of {r['n_seeds']} seeds already past the target at their first evaluation " \
               "(fraction is an upper bound)" if r["n_below_at_start"] else ""
        if r["n_reached"] < r["n_seeds"]:
            note = "; ".join(x for x in (note, f"{r['n_seeds'] - r['n_reached']} seeds never reach it") if x)
        out.append(_row(MULTI, "FA-first placements reach standard periodic's final loss with fewer tokens "
                               "(study: 34.5-42.5 % of the tokens)",
                        f"{r['teacher']}/{r['mixer']}: {r['placement']} vs {baseline}",
                        "fraction of the baseline's tokens to reach its smoothed final held-out CE, minus 1 "
                        f"(curves over {'both distillation stages' if r['span'] == 'stage1+2' else 'stage 2'})",
                        -1, r["fraction"] - 1.0, r["fraction_lo"] - 1.0, r["fraction_hi"] - 1.0,
                        "seeds (t-interval)", r["n_reached"], "", math.nan, "table_tokens_to_target", note))
    tests = U.placement_tests_table(rows, baseline)
    pooled = tests.filter((pl.col("metric") == "ce") & (pl.col("lang") == "all"))
    for r in pooled.iter_rows(named=True):
        out.append(_row(MULTI, "an FA-first placement has lower held-out CE than standard periodic",
                        f"{r['teacher']}/{r['mixer']}: {r['placement']} vs {baseline} (all languages)",
                        "token-pooled held-out CE difference (placement - baseline), nats", -1, r["effect"],
                        r["effect_lo"], r["effect_hi"], "seeds (t-interval)", r["n_seeds"],
                        "sign-flip permutation over held-out rows", r["p_perm"], "table_placement_tests"))
    per_lang = tests.filter((pl.col("metric") == "ce") & (pl.col("lang") != "all"))
    for (teacher, mixer, placement), g in per_lang.group_by(["teacher", "mixer", "placement"], maintain_order=True):
        k = int((g["verdict"] == stats.REPRODUCED).sum())
        out.append(_row(MULTI, "the placement gain holds per language", f"{teacher}/{mixer}: {placement} vs {baseline}",
                        f"languages with a reproduced CE gain: {k} of {g.height} (effect: mean per-language "
                        "difference, nats)", -1, float(g["effect"].mean()), math.nan, math.nan,
                        "per-language rows in table_placement_tests", int(g["n_seeds"].min()), "", math.nan,
                        "table_placement_tests", "no interval for the count; read the per-language verdicts"))
    # reverse periodic is the best placement: against every other non-baseline placement
    have = set(rows.filter(pl.col("placement").is_not_null())["placement"].unique().to_list())
    if "reverse_periodic" in have:
        for (teacher, mixer), g in rows.filter(pl.col("placement").is_not_null()).group_by(
                ["teacher", "mixer"], maintain_order=True):
            rev = g.filter(pl.col("placement") == "reverse_periodic")
            for other in sorted(have - {"reverse_periodic", baseline}):
                r = U.paired_row_comparison(rev, g.filter(pl.col("placement") == other), "ce")
                out.append(_row(MULTI, "reverse periodic is the best placement",
                                f"{teacher}/{mixer}: reverse_periodic vs {other} (all languages)",
                                "token-pooled held-out CE difference (reverse periodic - other), nats", -1,
                                r["effect"], r["effect_lo"], r["effect_hi"], "seeds (t-interval)", r["n_seeds"],
                                "sign-flip permutation over held-out rows", r["p_perm"], "perplexity_rows"))
    return out


def _boot_over(values, seed: int = 0) -> tuple[float, float]:
    v = np.asarray([x for x in values if x is not None and math.isfinite(x)], dtype=np.float64)
    if v.size < 2:
        return math.nan, math.nan
    ci = stats.bootstrap_ci(v, np.mean, n_boot=U.N_BOOT, seed=seed)
    return ci.lo, ci.hi


def _softcka_rows(softcka: pl.DataFrame) -> list[dict]:
    from hybridlab.plots import figures

    out = []
    try:
        first = figures.softcka_first_fa_table(softcka)
    except HybridlabError:
        first = None
    if first is not None:
        wide = first.pivot(on="role", index=["pair", "lang"], values="change")
        if {"hybrid", "dense"} <= set(wide.columns):
            for (pair,), g in wide.group_by(["pair"], maintain_order=True):
                d = (g["hybrid"] - g["dense"]).to_list()
                lo, hi = _boot_over(d)
                out.append(_row(MULTI, "SoftCKA jumps at the first FA layer more in the hybrid than in its dense "
                                       "partner", pair,
                                "mean over languages of the SoftCKA change at the hybrid's first FA layer, hybrid "
                                "minus dense", +1, float(np.mean(d)), lo, hi,
                                "languages (bootstrap; first seed's models)", 1, "sign test over languages",
                                _sign_p(d), "table_softcka_first_fa"))
    hid = softcka.filter(pl.col("kind") == "hidden") if "kind" in softcka.columns else softcka
    if {"pair", "role", "lang", "cka"} <= set(hid.columns):
        mean = hid.group_by(["pair", "role", "lang"]).agg(pl.col("cka").mean())
        wide = mean.pivot(on="role", index=["pair", "lang"], values="cka")
        if {"hybrid", "dense"} <= set(wide.columns):
            for (pair,), g in wide.sort(["pair", "lang"]).group_by(["pair"], maintain_order=True):
                d = (g["hybrid"] - g["dense"]).to_list()
                lo, hi = _boot_over(d)
                out.append(_row(MULTI, "hybrids are less cross-lingually aligned than dense models", pair,
                                "mean over languages and layers of SoftCKA vs English, hybrid minus dense", -1,
                                float(np.mean(d)), lo, hi, "languages (bootstrap; first seed's models)", 1,
                                "sign test over languages", _sign_p(d), "softcka"))
    return out


def _niah_rows(niah: pl.DataFrame, seed: int = 0) -> list[dict]:
    from hybridlab.plots import figures

    out = []
    cells = figures.niah_cells(niah)
    for (pair,), g in cells.sort(["pair", "context_tokens"]).group_by(["pair"], maintain_order=True):
        ctx = sorted(g["context_tokens"].unique().to_list())
        if len(ctx) < 2 or set(g["role"]) != {"hybrid", "dense"}:
            continue
        pick = {}
        for role in ("hybrid", "dense"):
            for c in (ctx[0], ctx[-1]):
                r = g.filter((pl.col("role") == role) & (pl.col("context_tokens") == c))
                pick[role, c] = (int(r["k"].sum()), int(r["n"].sum()))
        if any(n == 0 for _, n in pick.values()):
            continue

        def effect(p):
            return (p["hybrid", ctx[-1]] - p["hybrid", ctx[0]]) - (p["dense", ctx[-1]] - p["dense", ctx[0]])

        phat = {key: k / n for key, (k, n) in pick.items()}
        rng = np.random.default_rng(seed)  # parametric bootstrap: each cell's accuracy redrawn as Binomial(n, p)
        reps = [effect({key: rng.binomial(n, phat[key]) / n for key, (k, n) in pick.items()})
                for _ in range(U.N_BOOT)]
        lo, hi = np.quantile(reps, [0.025, 0.975])
        out.append(_row(MULTI, "hybrids degrade less with context length in multilingual NIAH", pair,
                        f"accuracy change {ctx[0]} -> {ctx[-1]} tokens, hybrid minus dense (all languages and tasks)",
                        +1, effect(phat), float(lo), float(hi),
                        "examples (parametric bootstrap of the four cells; first seed's models)", 1, "", math.nan,
                        "niah"))
    return out


# --- competing learning ----------------------------------------------------------------------------


def _bld_sr_rows(score: pl.DataFrame, sr_runs: pl.DataFrame) -> list[dict]:
    out = []
    final = U.final_retrieval_scores(score).filter(pl.col("score").is_not_nan())
    best = final.with_columns(kind=pl.when(pl.col("layer_type") == "full_attention").then(pl.lit("attention"))
                              .otherwise(pl.lit("recurrent"))).group_by(["arm", "seed", "kind"]).agg(
        pl.col("score").max())
    wide = best.pivot(on="kind", index=["arm", "seed"], values="score")
    arms = sorted(wide["arm"].unique().to_list())
    if "baseline" in arms and {"attention", "recurrent"} <= set(wide.columns):
        b = wide.filter(pl.col("arm") == "baseline").sort("seed")
        d = (b["recurrent"] - b["attention"]).to_list()
        e, lo, hi, n = _spread(d)
        out.append(_row(BLD, "without BLD the recurrent layers take the retrieval (competing learning)", "baseline",
                        "final retrieval score: best recurrent layer minus best attention layer", +1, e, lo, hi,
                        "seeds (t-interval)", n, "sign test over seeds", _sign_p(d), "table_retrieval_score"))
        freeze = [a for a in arms if a.startswith(("freeze", "window"))]
        for arm in freeze:
            j = wide.filter(pl.col("arm") == arm).select("seed", a="attention").join(
                b.select("seed", b="attention"), on="seed", nulls_equal=True)
            d = [x - y for x, y in j.select("a", "b").iter_rows() if x is not None and y is not None]
            e, lo, hi, n = _spread(d)
            out.append(_row(BLD, "freezing the recurrent layers early moves the retrieval to attention",
                            f"{arm} vs baseline", "final retrieval score of the best attention layer, arm minus "
                            "baseline (same seed)", +1, e, lo, hi, "seeds (t-interval)", n, "sign test over seeds",
                            _sign_p(d), "table_retrieval_score"))
    acc = U.sr_accuracy_table(sr_runs) if sr_runs is not None else None
    if acc is not None:
        df = sr_runs if "seed" in sr_runs.columns else sr_runs.with_columns(seed=pl.lit(None, pl.Int64))
        cols = sorted(c for c in df.columns if c.startswith("eval/acc/gap"))
        last = (df.select("run", "seed", "step", *cols).unpivot(index=["run", "seed", "step"], on=cols)
                .drop_nulls("value").sort("step").group_by(["run", "seed", "variable"]).agg(pl.col("value").last())
                .group_by(["run", "seed"]).agg(acc=pl.col("value").mean()))
        b = last.filter(pl.col("run") == "baseline").select("seed", b="acc")
        for arm in sorted(a for a in last["run"].unique().to_list() if a.startswith(("freeze", "window"))):
            j = last.filter(pl.col("run") == arm).select("seed", a="acc").join(b, on="seed", nulls_equal=True)
            d = [x - y for x, y in j.select("a", "b").iter_rows()]
            e, lo, hi, n = _spread(d)
            out.append(_row(BLD, "BLD does not cost Spaced Retrieval accuracy (it improves it)", f"{arm} vs baseline",
                            "final validation accuracy (mean over gaps), arm minus baseline (same seed)", +1, e, lo,
                            hi, "seeds (t-interval)", n, "sign test over seeds", _sign_p(d), "table_sr_accuracy"))
    return out


def _bld_nl_rows(nl_runs: pl.DataFrame) -> list[dict]:
    from hybridlab.plots import figures

    out = []
    r = figures._nl_runs(nl_runs)
    r = r if "seed" in r.columns else r.with_columns(seed=pl.lit(None, pl.Int64))
    final = (r.filter(pl.col("eval/ce").is_not_null()).sort("step").group_by(["run", "mixer", "variant", "seed"])
             .agg(ce=pl.col("eval/ce").last()))
    base = final.filter(pl.col("variant") == "baseline").select("mixer", "seed", b="ce")
    for (mixer,), g in final.filter(pl.col("variant") == "bld").sort(["mixer", "seed"]).group_by(
            ["mixer"], maintain_order=True):
        j = g.select("seed", a="ce").join(base.filter(pl.col("mixer") == mixer).drop("mixer"), on="seed",
                                          nulls_equal=True)
        d = [x - y for x, y in j.select("a", "b").iter_rows()]
        e, lo, hi, n = _spread(d)
        out.append(_row(BLD, "BLD lowers the language-modelling loss", f"{mixer}: bld vs baseline",
                        "final held-out CE, BLD minus baseline (same seed), nats", -1, e, lo, hi,
                        "seeds (t-interval)", n, "sign test over seeds", _sign_p(d), "table_bld_nl"))
    return out


def findings_table(perplexity_rows: pl.DataFrame, distill: pl.DataFrame, softcka: pl.DataFrame, niah: pl.DataFrame,
                   retrieval_score: pl.DataFrame, bld_sr: pl.DataFrame, bld_nl: pl.DataFrame,
                   distill_stage1: pl.DataFrame | None = None, baseline: str = "standard_periodic") -> pl.DataFrame:
    """Every finding of both studies with effect, CI and verdict (see the module docstring); tokens to target
    spans both distillation stages when `distill_stage1` is given (`uncertainty.tokens_to_target_table`)."""
    rows = (_placement_rows(perplexity_rows, distill, baseline, distill_stage1) + _softcka_rows(softcka)
            + _niah_rows(niah)
            + _bld_sr_rows(retrieval_score, bld_sr) + _bld_nl_rows(bld_nl))
    if not rows:
        raise HybridlabError("no finding could be computed from the given tables; check that the rules ran")
    return pl.DataFrame(rows, schema=COLUMNS, orient="row")


BEGIN, END = "<!-- findings table: generated, begin -->", "<!-- findings table: generated, end -->"


def splice_into(text: str, table_md: str, source: str) -> str:
    """`text` (the README) with the lines between the BEGIN and END markers replaced by `table_md` as
    generated, preceded by one line naming its `source` file. Idempotent; one-line error without markers."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise HybridlabError(f"the README needs exactly one '{BEGIN}' line followed by one '{END}' line; add "
                             "them where the findings table goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    body = f"\n_Generated from `{source}`; do not edit by hand._\n\n{table_md.rstrip()}\n"
    return f"{head}{BEGIN}{body}{END}{tail}"

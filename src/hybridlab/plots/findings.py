"""The findings table: each finding of the two studies computed from the result tables, with its effect, a
CI and a verdict (docs/methods.md "Findings table").

One row per finding and comparison. `effect` is the point estimate (its sign convention is in `effect`'s
definition per finding, `expected` the sign the study reports); `ci_lo` / `ci_hi` the 95 % interval named in
`ci_over`; `n_seeds` the training seeds run for the arms (0 for published models, which this DAG does not
train), `n_censored` the seeds whose tokens-to-target is censored, `n_undefined` the seeds run whose effect is
undefined (e.g. a retrieval score the model cannot give yet; they are left out of the interval, not dropped
silently). Verdict rules (`decide`):

- arms the DAG trains: `stats.verdict(effect, ci, expected)` ("reproduced" / "contradicted" /
  "inconclusive") when the interval is across >= 2 seeds; an interval over evaluation units of ONE
  seed's models (sentences, languages, examples) covers the evaluation sample only, not the training run,
  so such a row is "inconclusive" with the note "one seed";
- fixed published models (hub analysis pairs: no training seeds, the models are the object of the
  claim): `stats.verdict` of the evaluation-unit interval, note "fixed published models: interval over
  <units>". A pair is the DAG's when its hybrid is named after the pair (`eval.pairs.analysis_models`
  names a distilled student `<teacher>/<placement>-<mixer>`, its pair's name); otherwise it is published;
- tokens to target with a censored seed (already past the target at stage 2's first evaluation, or never
  reaching it): the censoring-aware sign test over seeds (`censored_seed_test`), else "inconclusive" with
  a note "censored: ..." naming the seeds;
- hybrid-vs-dense findings of a pair without a dense model: a note row (no effect, "inconclusive").
A finding whose arms the preset does not run is left out.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from hybridlab.errors import HybridlabError
from hybridlab.eval import stats
from hybridlab.plots import uncertainty as U
from hybridlab.plots.verdicts import (  # noqa: F401  (the shared rules, also used through this module)
    ALPHA,
    BLD,
    COLUMNS,
    ENGLISH,
    FA_FIRST,
    FULL_ATTENTION,
    MULTI,
    STUDY_LANGUAGES,
    STUDY_STAGE2_FRACTION,
    _analysis_rule,
    _boot_over,
    _f,
    _no_dense_row,
    _over_seeds,
    _row,
    _seed_effects,
    _sign_p,
    _spread,
    _versus_study,
    decide,
    first_fa_margins,
    gate_convergence,
    is_published,
    pair_models,
    students_kl,
)

# --- multilinguality: tokens to target ----------------------------------------------------------------

SUCCESS, FAILURE, TIE, UNDETERMINED = "fewer", "more", "tie", "undetermined"


def seed_outcome(status: str, fraction: float, bound: float) -> str:
    """Whether one seed needed fewer stage-2 tokens than the baseline (fraction < 1), from its censoring
    status (`uncertainty.tokens_to_target_seeds`):
    - reached: the sign of fraction - 1 ("fewer", "more" or "tie");
    - past at stage 2's start: the fraction is at most `bound`, so "fewer" only when bound < 1; with
      bound >= 1 the seed is "undetermined" (its true fraction may lie on either side of 1);
    - never reached: the fraction exceeds `bound` (its last evaluation over the baseline's tokens), so
      "more" when bound >= 1; a shorter run than the baseline's crossing is "undetermined";
    - the baseline itself past its target at stage 2's start: "undetermined"."""
    if status == U.REACHED:
        return SUCCESS if fraction < 1 else FAILURE if fraction > 1 else TIE
    if status == U.PAST_AT_START:
        return SUCCESS if bound < 1 else UNDETERMINED
    if status == U.NEVER:
        return FAILURE if bound >= 1 else UNDETERMINED
    return UNDETERMINED


def censored_seed_test(outcomes: list[str]) -> tuple[str, float]:
    """(verdict, p) of the censoring-aware sign test over seeds on the claim "fewer tokens than the baseline".

    Each undetermined seed counts AGAINST the verdict being tested: for "reproduced" the exact two-sided
    sign test of #fewer against #more + #undetermined must give p < ALPHA with #fewer the larger; for
    "contradicted", #more against #fewer + #undetermined. So a never-reaching seed is a failure of the claim,
    and a seed past the target at stage 2's start a success only when its upper bound is below 1. Ties are
    dropped. With m seeds the smallest attainable p is 2 / 2^m (`stats.sign_test_min_p`): 0.25 with 3
    seeds, so at least 6 seeds are needed before this test can decide anything. p is the reproduced
    test's unless the verdict is "contradicted"."""
    k = {o: outcomes.count(o) for o in (SUCCESS, FAILURE, UNDETERMINED)}
    p_for = stats.sign_test_counts(k[SUCCESS], k[FAILURE] + k[UNDETERMINED]).p_value
    p_against = stats.sign_test_counts(k[FAILURE], k[SUCCESS] + k[UNDETERMINED]).p_value
    if p_for < ALPHA and k[SUCCESS] > k[FAILURE] + k[UNDETERMINED]:
        return stats.REPRODUCED, p_for
    if p_against < ALPHA and k[FAILURE] > k[SUCCESS] + k[UNDETERMINED]:
        return stats.CONTRADICTED, p_against
    return stats.INCONCLUSIVE, p_for


def _seed_name(seed) -> str:
    return "the unseeded run" if seed is None else f"seed {seed}"


def _censoring_words(r: dict) -> str:
    if r["status"] == U.PAST_AT_START:
        return (f"{_seed_name(r['seed'])} already past the target at stage 2's first evaluation (stage-2 fraction "
                f"<= {_f(r['bound'])}, an upper bound)")
    if r["status"] == U.NEVER:
        return (f"{_seed_name(r['seed'])} never reaches the target by its last evaluation (stage-2 fraction "
                f"> {_f(r['bound'])}, a lower bound)")
    return f"{_seed_name(r['seed'])}: the baseline is already past its own target at stage 2's first evaluation"


def _tokens_rows(distill: pl.DataFrame, stage1: pl.DataFrame | None, baseline: str) -> list[dict]:
    out = []
    seeds = U.tokens_to_target_seeds(distill, stage1, baseline, level=1.0)
    arms = seeds.filter((pl.col("placement") != baseline) & pl.col("placement").is_in(list(FA_FIRST)))
    for (teacher, mixer, placement), g in arms.group_by(["teacher", "mixer", "placement"], maintain_order=True):
        recs = g.sort("seed", nulls_last=True).to_dicts()
        span = recs[0]["span"]
        clean = [r["fraction_stage2"] for r in recs if r["status"] == U.REACHED]
        censored = [r for r in recs if r["status"] != U.REACHED]
        n = len(recs)
        definition = ("fraction of the baseline's stage-2 tokens needed to reach its smoothed final held-out CE, "
                      "minus 1 (" + ("curves read over both stages, stage-1 tokens taken off both"
                                     if span == "stage1+2" else "stage 2 alone") + ")")
        common = dict(study=MULTI, finding="FA-first placements reach standard periodic's final loss with fewer "
                                           "stage-2 tokens (study: about 40 % of its tokens)",
                      comparison=f"{teacher}/{mixer}: {placement} vs {baseline}", definition=definition,
                      expected=-1, n_seeds=n, source="table_tokens_to_target",
                      students=((teacher, mixer, placement), (teacher, mixer, baseline)))
        if not censored:
            e, lo, hi, _ = _spread(clean)
            vs = _versus_study(lo, hi, STUDY_STAGE2_FRACTION)
            note = (f"stage-2 fraction {_f(e)}" + (f" [{_f(lo)}, {_f(hi)}]" if math.isfinite(lo) else "")
                    + f" (study: about {_f(STUDY_STAGE2_FRACTION)})" + (f"; {vs}" if vs else ""))
            out.append(_row(**common, effect=e - 1.0, lo=lo - 1.0, hi=hi - 1.0, ci_over="seeds (t-interval)",
                            test="sign test over seeds", p=_sign_p([x - 1.0 for x in clean]), note=note))
            continue
        outcomes = [seed_outcome(r["status"], r["fraction_stage2"], r["bound"]) for r in recs]
        v, p = censored_seed_test(outcomes)
        k_fewer = outcomes.count(SUCCESS)
        parts = ["censored: " + "; ".join(_censoring_words(r) for r in censored),
                 f"censoring-aware sign test: {k_fewer} of {n} seeds need fewer tokens, "
                 f"{outcomes.count(UNDETERMINED)} undetermined (counted against the verdict tested)"]
        if stats.sign_test_min_p(n) >= ALPHA:
            parts.append(f"with {n} seeds an exact two-sided sign test cannot reach p < {ALPHA:g} (smallest p "
                         f"{stats.sign_test_min_p(n):.3g}), so the row stays inconclusive")
        if clean:
            parts.append(f"stage-2 fraction of the {len(clean)} uncensored seeds: mean {_f(float(np.mean(clean)))} "
                         f"(study: about {_f(STUDY_STAGE2_FRACTION)})")
        out.append(_row(**common, effect=float(np.mean(clean)) - 1.0 if clean else math.nan, lo=math.nan,
                        hi=math.nan, ci_over="none (censored seeds: no t-interval)",
                        test="censoring-aware sign test over seeds", p=p, note="; ".join(parts), verdict=v,
                        n_censored=len(censored)))
    return out


def _per_language_rows(tests: pl.DataFrame, baseline: str, english: str) -> list[dict]:
    """Per FA-first placement: the share of non-English languages whose CE is below the baseline's."""
    out = []
    per_lang = tests.filter((pl.col("metric") == "ce") & ~pl.col("lang").is_in(["all", english])
                            & pl.col("placement").is_in(list(FA_FIRST)))
    k_study, n_study = STUDY_LANGUAGES
    for (teacher, mixer, placement), g in per_lang.group_by(["teacher", "mixer", "placement"], maintain_order=True):
        eff = [x for x in g["effect"].to_list() if x is not None and math.isfinite(x)]
        better, worse = sum(x < 0 for x in eff), sum(x > 0 for x in eff)
        m = better + worse
        test = stats.sign_test_counts(better, worse)
        if m:
            ci = stats.clopper_pearson_interval(better, m)
            effect, lo, hi = ci.estimate - 0.5, ci.lo - 0.5, ci.hi - 0.5
        else:
            effect = lo = hi = math.nan
        n_seeds = int(g["n_seeds"].min())
        note = (f"{better} of {m} non-English languages improved (study: {k_study} of {n_study}, "
                f"{_f(k_study / n_study)})" + (f", {len(eff) - m} tied" if len(eff) > m else ""))
        vs = _versus_study(lo + 0.5, hi + 0.5, k_study / n_study) if m else ""
        note += (f"; {vs}" if vs else "") + f"; per-language differences averaged over {n_seeds} seed(s)"
        out.append(_row(MULTI, "the placement gain holds per language (study: 23 of 26 languages improved)",
                        f"{teacher}/{mixer}: {placement} vs {baseline}",
                        "share of non-English languages whose held-out CE is below the baseline's (English "
                        "excluded, ties dropped), minus 0.5", +1, effect, lo, hi,
                        "languages (exact Clopper-Pearson interval of the share)", n_seeds,
                        "sign test over languages (English excluded)", test.p_value, "table_placement_tests", note,
                        students=((teacher, mixer, placement), (teacher, mixer, baseline))))
    return out


def _placement_rows(rows: pl.DataFrame, distill: pl.DataFrame, baseline: str,
                    stage1: pl.DataFrame | None = None, english: str = ENGLISH) -> list[dict]:
    out = _tokens_rows(distill, stage1, baseline)
    tests = U.placement_tests_table(rows, baseline)
    pooled = tests.filter((pl.col("metric") == "ce") & (pl.col("lang") == "all")
                          & pl.col("placement").is_in(list(FA_FIRST)))
    for r in pooled.iter_rows(named=True):
        out.append(_row(MULTI, "an FA-first placement has lower held-out CE than standard periodic",
                        f"{r['teacher']}/{r['mixer']}: {r['placement']} vs {baseline} (all languages)",
                        "token-pooled held-out CE difference (placement - baseline), nats", -1, r["effect"],
                        r["effect_lo"], r["effect_hi"], "seeds (t-interval)", r["n_seeds"],
                        "sign-flip permutation over held-out rows", r["p_perm"], "table_placement_tests",
                        students=((r["teacher"], r["mixer"], r["placement"]), (r["teacher"], r["mixer"], baseline))))
    out += _per_language_rows(tests, baseline, english)
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
                                "sign-flip permutation over held-out rows", r["p_perm"], "perplexity_rows",
                                students=((teacher, mixer, "reverse_periodic"), (teacher, mixer, other))))
    return out


# The SoftCKA quantities the findings read, with the label their rows carry: the pair alignment (the headline),
# the language offset (how far apart the languages' mean embeddings lie), and the sentence-set CKA.
SOFTCKA_VIEWS = (("alignment", ""), ("language_offset", " (language offset)"),
                 ("cka", " (second view: sentence-set CKA)"))
SOFTCKA_WHAT = {"alignment": "pair alignment (centred cosine of each translation pair's kernel mean embeddings, each "
                             "language's own mean removed)",
                "language_offset": "language offset (MMD between the languages' mean embeddings over the "
                                   "within-language spread)",
                "cka": "sentence-set SoftCKA (CKA of the two N x N Grams)"}


def _softcka_rows(softcka: pl.DataFrame, softcka_seeds: pl.DataFrame | None = None) -> list[dict]:
    """SoftCKA findings; `softcka_seeds` (the further replicate seeds' SoftCKA of the DAG's students, a `seed`
    column) turns a DAG pair's rows into an effect over seeds with a t-interval."""
    out = []
    hid = softcka.filter(pl.col("kind") == "hidden") if "kind" in softcka.columns else softcka
    if not {"pair", "role", "lang", "layer"} <= set(hid.columns):
        return out
    extra = None
    if softcka_seeds is not None and softcka_seeds.height:
        extra = softcka_seeds.filter(pl.col("kind") == "hidden") if "kind" in softcka_seeds.columns else softcka_seeds
    models = pair_models(hid)
    views = [(m, label) for m, label in SOFTCKA_VIEWS if m in hid.columns]
    # the largest |change| across layers sits at the hybrid's first FA layer
    if "layer_type" in hid.columns:
        for metric, label in views:
            finding = "the largest SoftCKA change across layers is at the hybrid's first FA layer" + label
            for pair in sorted(models):
                if models[pair].get("dense") is None:
                    continue  # a sliding-window model listed alone: its own row (findings_multi.swa_rows)
                rule = _analysis_rule(pair, models[pair], "languages")
                h = hid.filter((pl.col("pair") == pair) & (pl.col("role") == "hybrid"))
                f, margins = first_fa_margins(h, metric)
                if f is None or not margins:
                    out.append(_row(MULTI, finding, pair, "", +1, math.nan, math.nan, math.nan, "none", rule["n_seeds"],
                                    "", math.nan, "softcka", "skipped: " + (
                                        "the hybrid has no full-attention layer" if f is None else
                                        "fewer than two layer-to-layer changes per language"),
                                    verdict=stats.INCONCLUSIVE, students=rule["students"]))
                    continue
                d = [margins[k] for k in sorted(margins)]
                lo, hi = _boot_over(d)
                k = sum(x > 0 for x in d)
                row = _row(MULTI, finding, pair,
                           f"mean over languages of |change of {metric}| at the first FA layer (hidden row {f}) "
                           "minus the largest |change| at any other layer, hybrid only", +1, float(np.mean(d)),
                           lo, hi, rule["ci_over"], rule["n_seeds"], "sign test over languages", _sign_p(d),
                           "softcka", f"largest |change| at the first FA layer in {k} of {len(d)} languages",
                           units=rule["units"], students=rule["students"])

                def margin_mean(rows, metric=metric):
                    m = first_fa_margins(rows.filter(pl.col("role") == "hybrid"), metric)[1]
                    return float(np.mean(list(m.values()))) if m else math.nan

                if not is_published(pair, models[pair].get("hybrid")):
                    row = _over_seeds(row, _seed_effects(hid, extra, pair, margin_mean))
                out.append(row)
    # hybrids are less cross-lingually aligned than their dense partners (for the offset: separate more)
    for metric, label in views:
        sign = +1 if metric == "language_offset" else -1
        finding = "hybrids are less cross-lingually aligned than dense models" + (
            " (language offset: hybrids separate the languages more)" if metric == "language_offset" else label)
        mean = hid.group_by(["pair", "role", "lang"]).agg(pl.col(metric).mean())
        for pair in sorted(models):
            if models[pair].get("dense") is None:
                out.append(_no_dense_row(finding, pair, "softcka", sign))
                continue
            rule = _analysis_rule(pair, models[pair], "languages")
            g = mean.filter(pl.col("pair") == pair)
            wide = g.pivot(on="role", index="lang", values=metric)
            if not {"hybrid", "dense"} <= set(wide.columns):
                continue
            wide = wide.drop_nulls(["hybrid", "dense"]).sort("lang")
            d = (wide["hybrid"] - wide["dense"]).to_list()
            if not d:
                continue
            lo, hi = _boot_over(d)
            row = _row(MULTI, finding, pair, f"mean over languages and layers of the {SOFTCKA_WHAT[metric]} vs "
                       "English, hybrid minus dense", sign, float(np.mean(d)), lo, hi, rule["ci_over"], rule["n_seeds"],
                       "sign test over languages", _sign_p(d), "softcka", units=rule["units"], students=rule["students"])

            def gap(rows, metric=metric):
                w = rows.group_by(["role", "lang"]).agg(pl.col(metric).mean()).pivot(on="role", index="lang",
                                                                                   values=metric)
                if not {"hybrid", "dense"} <= set(w.columns):
                    return math.nan
                w = w.drop_nulls(["hybrid", "dense"])
                return float((w["hybrid"] - w["dense"]).mean()) if w.height else math.nan

            if not is_published(pair, models[pair].get("hybrid")):
                row = _over_seeds(row, _seed_effects(hid, extra, pair, gap))
            out.append(row)
    return out


NIAH_LENGTH = "hybrids degrade less with context length in multilingual NIAH"
NIAH_OOM = "hybrids hit OOM less often than dense models in multilingual NIAH"


def niah_counts(niah: pl.DataFrame) -> pl.DataFrame:
    """Per (pair, role, lang, task, context_tokens): k correct of `done` completed examples and `n_oom` out of
    memory. The NIAH table's `n` counts completed examples and `accuracy` is over them (`n_oom` beside);
    a table without `n_oom` (written when an OOM counted as a wrong answer, n = all examples) is read as
    n_oom = round(oom_rate x n), done = n - n_oom, k = round(accuracy x n)."""
    df = niah
    if "n_oom" not in df.columns:
        rate = pl.col("oom_rate") if "oom_rate" in df.columns else pl.col("oom").cast(pl.Float64)
        df = df.with_columns(n_oom=(rate * pl.col("n")).round().cast(pl.Int64), done=pl.col("n").cast(pl.Int64),
                             k=(pl.col("accuracy").fill_null(0.0) * pl.col("n")).round().cast(pl.Int64))
        df = df.with_columns(done=pl.col("done") - pl.col("n_oom"))
    else:
        df = df.with_columns(done=pl.col("n").cast(pl.Int64), n_oom=pl.col("n_oom").cast(pl.Int64),
                             k=(pl.col("accuracy").fill_null(0.0) * pl.col("n")).round().cast(pl.Int64))
    return (df.group_by(["pair", "role", "lang", "task", "context_tokens"])
            .agg(pl.col("k").sum(), pl.col("done").sum(), pl.col("n_oom").sum()))


def _niah_oom_row(pair: str, g: pl.DataFrame, rule: dict) -> dict:
    """OOM rate over all of the pair's examples (every language, task and length), hybrid minus dense."""
    tot = {r["role"]: (int(r["n_oom"]), int(r["n_oom"] + r["done"]))
           for r in g.group_by("role").agg(pl.col("n_oom").sum(), pl.col("done").sum()).iter_rows(named=True)}
    over = ("examples (Newcombe interval from the two Wilson intervals; "
            + ("fixed published models)" if rule["units"] else "first seed's models)"))
    definition = "OOM rate over all examples (every language, task and length), hybrid minus dense"
    if any(tot.get(role, (0, 0))[1] == 0 for role in ("hybrid", "dense")):
        return _row(MULTI, NIAH_OOM, pair, definition, -1, math.nan, math.nan, math.nan, over, rule["n_seeds"], "",
                    math.nan, "niah", "skipped: a model has no examples", verdict=stats.INCONCLUSIVE)
    (kh, nh), (kd, nd) = tot["hybrid"], tot["dense"]
    d, lo, hi = stats.newcombe_difference(kh, nh, kd, nd)
    return _row(MULTI, NIAH_OOM, pair, definition, -1, d, lo, hi, over, rule["n_seeds"], "", math.nan, "niah",
                f"OOM in {kh} of {nh} hybrid and {kd} of {nd} dense examples (examples skipped after an OOM at a "
                "shorter length count as OOM)", units=rule["units"], students=rule["students"])


def _niah_length_row(pair: str, g: pl.DataFrame, rule: dict, seed: int) -> dict | None:
    """Accuracy change shortest -> longest context, hybrid minus dense, on the (lang, task) strata both models
    completed at both lengths (every example, no OOM); the longest length is the longest with such a
    stratum. Effect: mean over those strata; interval: parametric bootstrap within each stratum (each of
    its four cells redrawn as Binomial(done, k / done), the exact resampling of its examples)."""
    ctx = sorted(g["context_tokens"].unique().to_list())
    if len(ctx) < 2 or set(g["role"]) != {"hybrid", "dense"}:
        return None
    cell = {(r["role"], r["lang"], r["task"], r["context_tokens"]): (r["k"], r["done"], r["n_oom"])
            for r in g.iter_rows(named=True)}

    def completed(lang, task, c):
        return all((v := cell.get((role, lang, task, c))) is not None and v[1] > 0 and v[2] == 0
                   for role in ("hybrid", "dense"))

    strata = sorted({(lang, task) for _, lang, task, _ in cell})
    short, long, use = ctx[0], None, []
    for c in reversed(ctx[1:]):
        use = [s for s in strata if completed(*s, short) and completed(*s, c)]
        if use:
            long = c
            break
    over = ("examples (parametric bootstrap within language x task strata; "
            + ("fixed published models)" if rule["units"] else "first seed's models)"))
    if long is None:
        return _row(MULTI, NIAH_LENGTH, pair, "accuracy change shortest -> longest context both models completed, "
                    "hybrid minus dense", +1, math.nan, math.nan, math.nan, over, rule["n_seeds"], "", math.nan,
                    "niah", "skipped: no language x task completed by both models (no OOM) at the shortest and a "
                    "longer length", verdict=stats.INCONCLUSIVE)
    keys = [(role, *s, c) for s in use for role, c in (("hybrid", long), ("hybrid", short), ("dense", long),
                                                        ("dense", short))]
    k = np.array([cell[key][0] for key in keys], dtype=np.float64).reshape(len(use), 4)
    n = np.array([cell[key][1] for key in keys], dtype=np.int64).reshape(len(use), 4)
    sign = np.array([1.0, -1.0, -1.0, 1.0])  # (h_long - h_short) - (d_long - d_short)

    def effect(acc):  # acc: (..., strata, 4) -> mean over strata
        return (acc * sign).sum(axis=-1).mean(axis=-1)

    p = k / n
    rng = np.random.default_rng(seed)
    reps = effect(rng.binomial(n, p, size=(U.N_BOOT, *n.shape)) / n)
    lo, hi = np.quantile(reps, [0.025, 0.975])
    left = [c for c in ctx if c > long]
    note = f"{len(use)} of {len(strata)} language x task strata completed by both models at {short} and {long}"
    if left:
        note += f"; longer lengths without such a stratum (OOM): {', '.join(map(str, left))}"
    return _row(MULTI, NIAH_LENGTH, pair,
                f"accuracy change {short} -> {long} tokens, hybrid minus dense, mean over language x task strata "
                "completed by both models (accuracy over completed examples)", +1, float(effect(p)), float(lo),
                float(hi), over, rule["n_seeds"], "", math.nan, "niah", note, units=rule["units"],
                students=rule["students"])


def _niah_rows(niah: pl.DataFrame, seed: int = 0) -> list[dict]:
    """The two NIAH findings per pair: the OOM rate (an OOM is its own outcome, not a wrong answer) and the
    length effect on completed cells only."""
    out = []
    models = pair_models(niah)
    counts = niah_counts(niah)
    for (pair,), g in counts.sort(["pair", "context_tokens"]).group_by(["pair"], maintain_order=True):
        if models.get(pair, {}).get("dense") is None:
            out += [_no_dense_row(NIAH_LENGTH, pair, "niah", +1), _no_dense_row(NIAH_OOM, pair, "niah", -1)]
            continue
        if set(g["role"]) != {"hybrid", "dense"}:
            continue
        rule = _analysis_rule(pair, models[pair], "examples")
        out.append(_niah_oom_row(pair, g, rule))
        row = _niah_length_row(pair, g, rule, seed)
        if row is not None:
            out.append(row)
    return out


# --- competing learning ----------------------------------------------------------------------------


def _bld_sr_rows(score: pl.DataFrame, sr_runs: pl.DataFrame) -> list[dict]:
    from hybridlab.plots.findings_bld import bld_sr_rows

    return bld_sr_rows(score, sr_runs)


def _bld_nl_rows(nl_runs: pl.DataFrame) -> list[dict]:
    out = []
    r = U.nl_runs(nl_runs)
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
                   retrieval_score: pl.DataFrame | None, bld_sr: pl.DataFrame | None, bld_nl: pl.DataFrame | None,
                   distill_stage1: pl.DataFrame | None = None, softcka_seeds: pl.DataFrame | None = None,
                   baseline: str = "standard_periodic",
                   english: str = ENGLISH, recency: pl.DataFrame | None = None,
                   fertility: pl.DataFrame | None = None, position_loss_summary: pl.DataFrame | None = None,
                   position_loss: pl.DataFrame | None = None, retrieval_heads_masking: pl.DataFrame | None = None,
                   lm_benchmarks: pl.DataFrame | None = None,
                   layer_importance: pl.DataFrame | None = None, kl_limit: float | None = None) -> pl.DataFrame:
    """Every finding of both studies with effect, CI and verdict (see the module docstring); tokens to target
    is read over both distillation stages when `distill_stage1` is given and counted on stage-2 tokens
    (`uncertainty.tokens_to_target_seeds`); `english` is left out of the per-language count. The BLD tables
    are None for a preset that runs the multilinguality study alone (its BLD rows are then left out). The
    further multilinguality rows (`findings_multi`) read `recency` and `fertility` too when given, the BLD-NL
    long-context rows (`findings_bld`) `position_loss_summary` and `position_loss`, its retrieval-heads rows
    `retrieval_heads_masking`, its recall / RULER rows `lm_benchmarks` (the paper preset and the rehearsal); the
    searched placements' rows (`findings_multi.searched_rows`) `layer_importance`. `kl_limit`: the held-out KL
    (nats per token) within which the distilled students must be of their teacher for a row about them to be
    decided (`verdicts.gate_convergence`; None: no limit, the students' KL is still recorded)."""
    from hybridlab.plots.findings_multi import multilinguality_rows

    rows = (_placement_rows(perplexity_rows, distill, baseline, distill_stage1, english)
            + _softcka_rows(softcka, softcka_seeds)
            + _niah_rows(niah)
            + multilinguality_rows(perplexity_rows, softcka, niah, recency, fertility, softcka_seeds, baseline,
                                   english))
    if layer_importance is not None:
        from hybridlab.plots.findings_multi import searched_rows

        rows += searched_rows(layer_importance, perplexity_rows)
    if retrieval_score is not None and bld_sr is not None:
        rows += _bld_sr_rows(retrieval_score, bld_sr)
    if bld_nl is not None:
        rows += _bld_nl_rows(bld_nl)
    if position_loss_summary is not None:
        from hybridlab.plots.findings_bld import bld_nl_position_rows

        rows += bld_nl_position_rows(position_loss_summary, position_loss)
    if retrieval_heads_masking is not None:
        from hybridlab.plots.findings_bld import retrieval_heads_rows

        rows += retrieval_heads_rows(retrieval_heads_masking)
    if lm_benchmarks is not None:
        from hybridlab.plots.findings_bld import lm_benchmark_rows

        rows += lm_benchmark_rows(lm_benchmarks)
    if not rows:
        raise HybridlabError("no finding could be computed from the given tables; check that the rules ran")
    rows = gate_convergence(rows, students_kl(perplexity_rows), kl_limit)
    return pl.DataFrame(rows, schema=COLUMNS, orient="row")


BEGIN, END = "<!-- findings table: generated, begin -->", "<!-- findings table: generated, end -->"
NARROW = ("finding", "comparison", "effect [95 % CI]", "n_seeds", "verdict", "note")


def _num(x) -> str:
    return "" if x is None or (isinstance(x, float) and not math.isfinite(x)) else f"{x:.3g}"


def narrow_markdown(table: pl.DataFrame, study: str | None = None) -> str:
    """The findings table's narrow view as Markdown: finding, comparison, effect with its interval, seeds,
    verdict and note (the full table stays in the generated file); only `study`'s rows when given."""
    if study is not None:
        table = table.filter(pl.col("study") == study)
    lines = ["| " + " | ".join(NARROW) + " |", "|" + "---|" * len(NARROW)]
    for r in table.iter_rows(named=True):
        ci = f" [{_num(r['ci_lo'])}, {_num(r['ci_hi'])}]" if _num(r["ci_lo"]) and _num(r["ci_hi"]) else ""
        effect = _num(r["effect"]) + ci if _num(r["effect"]) else ""  # no estimate (censored, undefined): blank
        cells = [r["finding"], r["comparison"], effect, str(r["n_seeds"]), r["verdict"], r["note"] or ""]
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in cells) + " |")
    return "\n".join(lines) + "\n"


def verdict_counts_markdown(table: pl.DataFrame) -> str:
    """The findings table's shortest view as Markdown: one row per (study, finding), in the table's order,
    with how many of its comparisons got each verdict (e.g. "2 reproduced, 3 inconclusive")."""
    lines = ["| study | finding | verdicts over its comparisons |", "|---|---|---|"]
    order = [stats.REPRODUCED, stats.CONTRADICTED, stats.INCONCLUSIVE]
    for (study, finding), g in table.group_by(["study", "finding"], maintain_order=True):
        counts = g["verdict"].value_counts()
        n = dict(zip(counts["verdict"].to_list(), counts["count"].to_list()))
        words = ", ".join(f"{n[v]} {v}" for v in order + sorted(set(n) - set(order)) if n.get(v))
        lines.append("| " + " | ".join(str(c).replace("|", "/") for c in (study, finding, words)) + " |")
    return "\n".join(lines) + "\n"


def splice_into(text: str, table_md: str, source: str, about: str = "") -> str:
    """`text` (the README) with the lines between the BEGIN and END markers replaced by `table_md` as
    generated, preceded by one line naming its `source` file (and `about` it: the build it came from).
    Idempotent; one-line error without markers."""
    if text.count(BEGIN) != 1 or text.count(END) != 1 or text.index(BEGIN) > text.index(END):
        raise HybridlabError(f"the README needs exactly one '{BEGIN}' line followed by one '{END}' line; add "
                             "them where the findings table goes")
    head, rest = text.split(BEGIN, 1)
    _, tail = rest.split(END, 1)
    about = f" {about.strip()}" if about.strip() else ""
    body = f"\n_Generated from `{source}`{about}; do not edit by hand._\n\n{table_md.rstrip()}\n"
    return f"{head}{BEGIN}{body}{END}{tail}"

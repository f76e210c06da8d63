"""Uncertainty columns of the results tables: spread across replicate seeds, bootstrap CIs over held-out
rows, paired tests, smoothed tokens-to-target (docs/methods.md "Statistics" and "Uncertainty in the tables").

Every function takes the tidy tables the eval rules write (one row per seed where the metric has seeds,
one row per held-out row in `perplexity_rows`) and returns a polars DataFrame with the interval columns
`<name>`, `<name>_lo`, `<name>_hi` (and `n_seeds`). The statistics come from `hybridlab.eval.stats`:

- seed spread: mean +- t_{0.975, n-1} s / sqrt(n) over the seeds (`stats.seed_spread`); NaN with one seed;
- row bootstrap: percentile bootstrap over the held-out rows shared by every arm and seed (`stats.
  bootstrap_ci_indices`, the same row indices for both arms of a comparison and for every seed), B = 2000,
  seed 0;
- paired tests over rows: `stats.paired_permutation_test` and `stats.sign_test` of the per-row difference
  (averaged over seeds) of an arm against its baseline.
"""

from __future__ import annotations

import math

import numpy as np
import polars as pl

from hybridlab.errors import HybridlabError
from hybridlab.eval import stats

LEVEL = 0.95
N_BOOT = 2000


def seed_band(values) -> tuple[float, float]:
    """seaborn `errorbar=` callable: the t-interval of the mean across the seeds at one x (the mean itself
    when there is one seed, so a single-seed line draws no band)."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return (math.nan, math.nan)
    s = stats.seed_spread(v, LEVEL)
    return (s.mean, s.mean) if s.n == 1 else (s.lo, s.hi)


def _seed_values(df: pl.DataFrame, value: str) -> list[float]:
    return [float(x) for x in df[value].to_list() if x is not None and math.isfinite(float(x))]


def spread_columns(values, name: str) -> dict:
    """Columns name, name_lo, name_hi (t-interval across seeds; NaN for one seed or none) and n_seeds."""
    v = [float(x) for x in values if x is not None and math.isfinite(float(x))]
    if not v:
        return {name: math.nan, f"{name}_lo": math.nan, f"{name}_hi": math.nan, "n_seeds": 0}
    s = stats.seed_spread(v, LEVEL)
    return {name: s.mean, f"{name}_lo": s.lo, f"{name}_hi": s.hi, "n_seeds": s.n}


def seed_summary(df: pl.DataFrame, by: list[str], value: str, name: str | None = None) -> pl.DataFrame:
    """One row per group of `by`: the mean of `value` over its rows (one per seed) with the seed t-interval.

    Every group must hold at most one row per seed (`seed` column; a table without it is one seed)."""
    name = name or value
    if "seed" in df.columns:
        dup = df.group_by(by + ["seed"]).len().filter(pl.col("len") > 1)
        if dup.height:
            raise HybridlabError(f"{dup.height} groups of {by} have several rows for one seed in column "
                                 f"'{value}'; aggregate to one value per seed first")
    rows = []
    for key, g in df.sort(by).group_by(by, maintain_order=True):
        rows.append({**dict(zip(by, key)), **spread_columns(_seed_values(g, value), name)})
    schema = {**{c: df.schema[c] for c in by}, name: pl.Float64, f"{name}_lo": pl.Float64,
              f"{name}_hi": pl.Float64, "n_seeds": pl.Int64}
    return pl.DataFrame(rows, schema=schema, orient="row")


# --- held-out rows: bootstrap over rows and paired tests -------------------------------------------


def row_matrix(rows: pl.DataFrame, value: str = "ce") -> tuple[list, np.ndarray, np.ndarray]:
    """(seeds, V, N) of one model's per-row table: V[s, r] the row's token mean, N[s, r] its tokens.

    The rows of every seed must be the same rows (`row` ids), which the rule guarantees (one teacher's
    held-out rows for every student); a mismatch is an error."""
    seeds = sorted(rows["seed"].unique().to_list(), key=lambda s: -1 if s is None else s)
    ids = None
    vals, ns = [], []
    for s in seeds:
        g = rows.filter(pl.col("seed").is_null() if s is None else pl.col("seed") == s).sort("row")
        if ids is None:
            ids = g["row"].to_list()
        elif g["row"].to_list() != ids:
            raise HybridlabError("per-row tables of one model differ in their rows between seeds; rebuild "
                                 "eval_perplexity from one config")
        vals.append(g[value].to_numpy().astype(np.float64))
        ns.append(g["n_tokens"].to_numpy().astype(np.float64))
    return seeds, np.vstack(vals), np.vstack(ns)


def pooled(V: np.ndarray, N: np.ndarray, idx: np.ndarray | None = None) -> np.ndarray:
    """Token-pooled mean per seed over rows `idx` (all rows by default): sum(N V) / sum(N) -> [seeds]."""
    if idx is not None:
        V, N = V[:, idx], N[:, idx]
    return (V * N).sum(axis=1) / N.sum(axis=1)


def paired_row_comparison(arm: pl.DataFrame, base: pl.DataFrame, value: str = "ce", *, seed: int = 0) -> dict:
    """Arm minus baseline on the held-out rows both were scored on, per seed and pooled over seeds.

    effect = mean over seeds of (pooled(arm, s) - pooled(base, s)); its seed t-interval (`effect_lo/hi`,
    seeds paired by their number) and its row bootstrap CI (`effect_rows_lo/hi`: the same resampled rows
    for both arms and every seed); tests on the per-row differences d_r = mean_s (arm[s, r] - base[s, r]):
    sign test (`p_sign`) and sign-flip permutation test (`p_perm`).
    """
    sa, Va, Na = row_matrix(arm, value)
    sb, Vb, Nb = row_matrix(base, value)
    common = [s for s in sa if s in sb]
    if not common:
        raise HybridlabError("arm and baseline share no seed; pair them on the same replicate seeds")
    ia, ib = [sa.index(s) for s in common], [sb.index(s) for s in common]
    Va, Na, Vb, Nb = Va[ia], Na[ia], Vb[ib], Nb[ib]
    if Va.shape != Vb.shape:
        raise HybridlabError(f"arm has {Va.shape[1]} rows but the baseline {Vb.shape[1]}; score both on the "
                             "same held-out rows")
    per_seed = pooled(Va, Na) - pooled(Vb, Nb)
    out = {"effect": float(per_seed.mean())}
    sp = spread_columns(per_seed.tolist(), "effect")
    out.update({"effect_lo": sp["effect_lo"], "effect_hi": sp["effect_hi"], "n_seeds": sp["n_seeds"]})
    n_rows = Va.shape[1]
    if n_rows >= 2:
        ci = stats.bootstrap_ci_indices(
            n_rows, lambda i: float((pooled(Va, Na, i) - pooled(Vb, Nb, i)).mean()), n_boot=N_BOOT, level=LEVEL,
            seed=seed)
        out.update({"effect_rows_lo": ci.lo, "effect_rows_hi": ci.hi})
    else:
        out.update({"effect_rows_lo": math.nan, "effect_rows_hi": math.nan})
    d = (Va - Vb).mean(axis=0)
    out["p_perm"] = stats.paired_permutation_test(d, np.zeros_like(d), seed=seed).p_value
    out["p_sign"] = stats.sign_test(d).p_value
    out["n_rows"] = n_rows
    return out


def row_ci(model_rows: pl.DataFrame, value: str = "ce", *, seed: int = 0) -> tuple[float, float]:
    """Row-bootstrap CI of a model's token-pooled `value`, averaged over its seeds."""
    _, V, N = row_matrix(model_rows, value)
    if V.shape[1] < 2:
        return math.nan, math.nan
    ci = stats.bootstrap_ci_indices(V.shape[1], lambda i: float(pooled(V, N, i).mean()), n_boot=N_BOOT,
                                    level=LEVEL, seed=seed)
    return ci.lo, ci.hi


# --- tokens to target from smoothed curves ----------------------------------------------------------

TARGET_LEVELS = (0.5, 0.8, 0.9, 1.0)


def curve_targets(tokens, values, levels=TARGET_LEVELS, window: int = 3) -> list[float]:
    """Targets on the baseline's smoothed curve s: s_0 - q (s_0 - s_last) for each level q (q = 1: its
    smoothed final value, taken as s_last itself so that rounding in s_0 - (s_0 - s_last) cannot put it
    below the curve's own last value; q = 0.5: half of its improvement)."""
    s = stats.smooth_curve(tokens, values, window=window) if len(values) > 1 else np.asarray(values, float)
    return [float(s[-1]) if q == 1 else float(s[0] - q * (s[0] - s[-1])) for q in levels]


def join_stages(stage2: pl.DataFrame, stage1: pl.DataFrame) -> pl.DataFrame:
    """One distillation curve per (run, seed) over both stages: stage 1's log as it is, then stage 2's with its
    tokens shifted by stage 1's last token count (stage 2's step-0 evaluation is the stage-1 model, so it
    lands on stage 1's last point and replaces it). Adds column `stage` (1 or 2). One-line error when a
    stage-2 run has no stage-1 log."""
    if stage2.is_empty():
        return stage2.with_columns(stage=pl.lit(2, pl.Int64))
    keys = ["run", "seed"]
    ends = stage1.group_by(keys).agg(offset=pl.col("tokens").max())
    s2 = stage2.join(ends, on=keys, how="left", nulls_equal=True)
    missing = s2.filter(pl.col("offset").is_null()).select(keys).unique().rows()
    if missing:
        run, seed = missing[0]
        raise HybridlabError(f"distillation run {run} (seed {seed}) has no stage-1 metrics; pass its stage-1 "
                             "metrics.parquet as distill_stage1/seed<N>/<run>=PATH")
    s2 = s2.with_columns(tokens=pl.col("tokens") + pl.col("offset"), stage=pl.lit(2, pl.Int64)).drop("offset")
    # only the runs of stage 2 (a stage-1 log of a run without stage 2 is not a curve of this table)
    s1 = stage1.join(stage2.select(keys).unique(), on=keys, how="semi", nulls_equal=True).with_columns(
        stage=pl.lit(1, pl.Int64))
    return pl.concat([s1, s2], how="diagonal_relaxed").sort(keys + ["tokens", "stage"], nulls_last=True)


def tokens_to_targets(runs: pl.DataFrame, baseline: str, column: str = "eval/ce", levels=TARGET_LEVELS,
                      window: int = 3) -> pl.DataFrame:
    """Per (teacher, mixer, placement, seed, level): tokens at which the smoothed curve reaches the same
    seed's baseline target, and `fraction` = tokens / baseline tokens. Columns: teacher, mixer, placement,
    seed, level, target, tokens, baseline_tokens, fraction, below_at_start (the first evaluation is already
    past the target: tokens is an upper bound and the fraction is not a measured speed-up)."""
    df = runs.filter(pl.col(column).is_not_null())
    rows = []
    keys = df.select("teacher", "mixer", "seed").unique().sort(["teacher", "mixer", "seed"], nulls_last=True)
    for teacher, mixer, seed in keys.iter_rows():
        g = df.filter((pl.col("teacher") == teacher) & (pl.col("mixer") == mixer)
                      & (pl.col("seed").is_null() if seed is None else pl.col("seed") == seed))
        # one point per token count (an evaluation logged twice at the same step counts once, the last)
        curves = {p: c.sort("tokens").unique("tokens", keep="last", maintain_order=True)
                  for (p,), c in g.group_by(["placement"])}
        if baseline not in curves:
            raise HybridlabError(f"baseline placement {baseline!r} has no curve for {teacher}/{mixer} seed {seed}; "
                                 "set experiments.distill.baseline_placement to a distilled placement")
        b = curves[baseline]
        targets = curve_targets(b["tokens"], b[column], levels, window)
        base = stats.tokens_to_target(b["tokens"], b[column], targets, window=window)
        for placement in sorted(curves):
            c = curves[placement]
            t = stats.tokens_to_target(c["tokens"], c[column], targets, window=window)
            for q, (target, x, reached, below), bx in zip(levels, t.iter_rows(), base["x"].to_list()):
                frac = x / bx if reached and bx and bx > 0 and math.isfinite(bx) else math.nan
                rows.append({"teacher": teacher, "mixer": mixer, "placement": placement, "seed": seed, "level": q,
                             "target": target, "tokens": x, "baseline_tokens": bx, "fraction": frac,
                             "below_at_start": below})
    schema = {"teacher": pl.String, "mixer": pl.String, "placement": pl.String, "seed": pl.Int64,
              "level": pl.Float64, "target": pl.Float64, "tokens": pl.Float64, "baseline_tokens": pl.Float64,
              "fraction": pl.Float64, "below_at_start": pl.Boolean}
    return pl.DataFrame(rows, schema=schema, orient="row")


# --- tables -----------------------------------------------------------------------------------------


def _seed_eq(seed):
    return pl.col("seed").is_null() if seed is None else pl.col("seed") == seed


def placement_tests_table(rows: pl.DataFrame, baseline: str = "standard_periodic",
                          expected_sign: int = -1) -> pl.DataFrame:
    """Each placement against the baseline placement, per (teacher, mixer, metric, lang), on held-out rows.

    Input: `perplexity_rows.parquet` (one row per model x seed x held-out row). lang "all" pools every
    language's rows. Columns: effect (mean over seeds of the token-pooled metric difference placement -
    baseline; negative = lower CE / KL than the baseline), effect_lo/hi (t-interval across seeds),
    effect_rows_lo/hi (bootstrap over held-out rows), p_perm / p_sign (paired tests of the per-row
    differences averaged over seeds), n_rows, n_seeds and `verdict` (stats.verdict of the seed interval
    against `expected_sign`: -1, the placement beats the baseline; inconclusive with one seed).
    """
    need = ["teacher", "placement", "mixer", "seed", "lang", "row", "n_tokens", "ce", "kl"]
    missing = [c for c in need if c not in rows.columns]
    if missing:
        raise HybridlabError(f"table 'perplexity_rows' lacks columns {missing}; rebuild it with eval_perplexity")
    stud = rows.filter(pl.col("placement").is_not_null())
    if baseline not in stud["placement"].to_list():
        raise HybridlabError(f"baseline placement '{baseline}' has no rows in table 'perplexity_rows'; set "
                             "experiments.distill.baseline_placement to a distilled placement")
    out = []
    for (teacher, mixer), g in stud.sort(["teacher", "mixer"]).group_by(["teacher", "mixer"], maintain_order=True):
        langs = ["all"] + sorted(g["lang"].unique().to_list())
        for metric in ("ce", "kl"):
            for lang in langs:
                # "all": every held-out row of every language (row ids index one teacher's held-out set)
                sel = g if lang == "all" else g.filter(pl.col("lang") == lang)
                base = sel.filter(pl.col("placement") == baseline)
                for placement in sorted(p for p in sel["placement"].unique().to_list() if p != baseline):
                    arm = sel.filter(pl.col("placement") == placement)
                    r = paired_row_comparison(arm, base, metric)
                    v = stats.verdict(r["effect"], (r["effect_lo"], r["effect_hi"]), expected_sign)
                    out.append({"teacher": teacher, "mixer": mixer, "metric": metric, "lang": lang,
                                "placement": placement, "baseline": baseline, **r, "verdict": v})
    cols = ["teacher", "mixer", "metric", "lang", "placement", "baseline", "n_seeds", "n_rows", "effect",
            "effect_lo", "effect_hi", "effect_rows_lo", "effect_rows_hi", "p_perm", "p_sign", "verdict"]
    df = pl.DataFrame(out, orient="row")
    return df.sort(["teacher", "mixer", "metric", pl.col("lang") != "all", "lang", "placement"]).select(cols)


def _distill_columns(runs: pl.DataFrame) -> pl.DataFrame:
    """Distillation run labels `<teacher>/<placement>-<mixer>` split into columns (as figures does)."""
    last = pl.col("run").str.split("/").list.last()
    out = runs.with_columns(teacher=pl.col("run").str.split("/").list.first(),
                            placement=last.str.replace(r"-[^-]+$", ""), mixer=last.str.extract(r"-([^-]+)$"))
    return out if "seed" in out.columns else out.with_columns(seed=pl.lit(None, pl.Int64))


def tokens_to_target_table(runs: pl.DataFrame, stage1: pl.DataFrame | None = None,
                           baseline: str = "standard_periodic", column: str = "eval/ce",
                           levels=TARGET_LEVELS, window: int = 3) -> pl.DataFrame:
    """Tokens to target at several targets, per (teacher, mixer, placement, level), on STAGE-2 tokens with
    each seed's censoring counted (`tokens_to_target_seeds` per level).

    The targets are the baseline's smoothed s_0 - q (s_0 - s_last) for q in `levels` (q = 1: its final loss).
    `fraction_stage2` is the mean over the seeds that reached the target during stage 2 (status "reached");
    its seed t-interval (`_lo`, `_hi`) is given only when no seed is censored, since a censored seed's
    fraction is a bound, not a value (`status` "censored"; "measured" when every seed reached it;
    "undefined" when no seed has a defined stage-2 fraction). `bound_past` is the largest upper bound of
    the seeds already past the target at stage 2's start, `bound_never` the smallest lower bound of those
    that never reach it. `fraction` is the two-stage fraction (stage-1 tokens counted on both sides), a
    second view pulled towards 1 by the tokens both share.
    """
    per = pl.concat([tokens_to_target_seeds(runs, stage1, baseline, column, q, window).with_columns(level=pl.lit(q))
                     for q in levels])
    rows = []
    keys = ["teacher", "mixer", "placement", "level"]
    for key, g in per.sort(keys + ["seed"], nulls_last=True).group_by(keys, maintain_order=True):
        status = g["status"].to_list()
        reached = g.filter(pl.col("status") == REACHED)
        spread = spread_columns(reached["fraction_stage2"].to_list(), "fraction_stage2")
        n_censored = status.count(PAST_AT_START) + status.count(NEVER)
        if n_censored:
            spread["fraction_stage2_lo"] = spread["fraction_stage2_hi"] = math.nan
        past = g.filter(pl.col("status") == PAST_AT_START)["bound"]
        never = g.filter(pl.col("status") == NEVER)["bound"]
        rows.append({**dict(zip(keys, key)), "span": g["span"][0], "target": float(g["target"].mean()),
                     "n_seeds": g.height, "n_reached": reached.height, "n_past_at_start": status.count(PAST_AT_START),
                     "n_never": status.count(NEVER), "n_baseline_past": status.count(BASELINE_PAST),
                     "status": "undefined" if not reached.height and not n_censored
                     else ("censored" if n_censored else "measured"),
                     "fraction_stage2": spread["fraction_stage2"], "fraction_stage2_lo": spread["fraction_stage2_lo"],
                     "fraction_stage2_hi": spread["fraction_stage2_hi"],
                     "bound_past": float(past.max()) if past.len() else math.nan,
                     "bound_never": float(never.min()) if never.len() else math.nan,
                     "fraction": float(reached["fraction"].mean()) if reached.height else math.nan,
                     "tokens": float(reached["tokens"].mean()) if reached.height else math.nan})
    f, i = pl.Float64, pl.Int64
    schema = {"teacher": pl.String, "mixer": pl.String, "placement": pl.String, "level": f, "span": pl.String,
              "target": f, "n_seeds": i, "n_reached": i, "n_past_at_start": i, "n_never": i, "n_baseline_past": i,
              "status": pl.String, "fraction_stage2": f, "fraction_stage2_lo": f, "fraction_stage2_hi": f,
              "bound_past": f, "bound_never": f, "fraction": f, "tokens": f}
    return pl.DataFrame(rows, schema=schema, orient="row")


REACHED, PAST_AT_START, NEVER, BASELINE_PAST = "reached", "past_at_start", "never", "baseline_past_at_start"


def tokens_to_target_seeds(runs: pl.DataFrame, stage1: pl.DataFrame | None = None,
                           baseline: str = "standard_periodic", column: str = "eval/ce", level: float = 1.0,
                           window: int = 3) -> pl.DataFrame:
    """Per (teacher, mixer, placement, seed): tokens to the baseline's target at `level` counted on STAGE-2
    tokens, with the seed's censoring status.

    The curve is read as in `tokens_to_target_table` (both stages when `stage1` is given, so the crossing
    is found), then stage 1 is taken apart: with x the crossing on the two-stage token axis and S the
    run's stage-1 tokens (its stage-1 log's last count; 0 without `stage1`), the stage-2 tokens are x - S
    and `fraction_stage2` = (x_arm - S_arm) / (x_base - S_base). `status`:
    - "reached": the smoothed curve crosses the target after stage 2's first evaluation (a measured value);
    - "past_at_start": it is already at/past the target at stage 2's first evaluation, smoothed (x <= S,
      or the curve's first evaluation without `stage1`) or raw (the centred mean at that point also
      averages stage-1 evaluations, which can hide a stage-2 start already below the target): left-censored,
      the fraction is at most `bound`
      = (first stage-2 evaluation's tokens - S) / baseline stage-2 tokens (0 when stage 2 starts at 0);
    - "never": it does not reach the target by its last evaluation: right-censored, the fraction exceeds
      `bound` = (last evaluation's tokens - S) / baseline stage-2 tokens;
    - "baseline_past_at_start": the baseline itself reaches its target by stage 2's first evaluation, so
      no stage-2 fraction is defined (fraction_stage2 and bound NaN).
    `fraction_stage2` is NaN unless "reached". Columns: teacher, mixer, placement, seed, span, target,
    tokens (two-stage axis), baseline_tokens, stage1_tokens, baseline_stage1_tokens, last_tokens,
    fraction (two-stage, as in `tokens_to_target_table`), fraction_stage2, status, bound.
    """
    if column not in runs.columns:
        raise HybridlabError(f"distill metrics lack column '{column}'; rebuild the distill_stage2 runs")
    span, offsets = "stage2", None
    keys = ["teacher", "mixer", "placement", "seed"]
    if stage1 is not None:
        runs, span = join_stages(runs, stage1), "stage1+2"
        offsets = (_distill_columns(runs).filter(pl.col("stage") == 1).group_by(keys)
                   .agg(stage1_tokens=pl.col("tokens").max()))
    cols = _distill_columns(runs).filter(pl.col(column).is_not_null())
    stage2 = cols.filter(pl.col("stage") == 2) if "stage" in cols.columns else cols
    ends = stage2.sort("tokens").group_by(keys).agg(first_tokens=pl.col("tokens").first(),
                                                     first_value=pl.col(column).first(),
                                                     last_tokens=pl.col("tokens").last())
    per = tokens_to_targets(cols, baseline, column, (level,), window).join(ends, on=keys, how="left",
                                                                           nulls_equal=True)
    if offsets is not None:
        per = per.join(offsets, on=keys, how="left", nulls_equal=True).with_columns(
            pl.col("stage1_tokens").fill_null(0.0).cast(pl.Float64))
    else:
        per = per.with_columns(stage1_tokens=pl.lit(0.0))
    base = per.filter(pl.col("placement") == baseline).select("teacher", "mixer", "seed",
                                                              baseline_stage1_tokens="stage1_tokens")
    per = per.join(base, on=["teacher", "mixer", "seed"], how="left", nulls_equal=True)
    rows = []
    for r in per.sort(keys, nulls_last=True).iter_rows(named=True):
        s_a, s_b = float(r["stage1_tokens"]), float(r["baseline_stage1_tokens"])
        b2 = r["baseline_tokens"] - s_b if r["baseline_tokens"] is not None else math.nan
        x = r["tokens"]
        frac2, bound = math.nan, math.nan
        if not (math.isfinite(b2) and b2 > 0):
            status = BASELINE_PAST
        elif x is None or not math.isfinite(x):
            status, bound = NEVER, (r["last_tokens"] - s_a) / b2
        elif r["below_at_start"] or x <= r["first_tokens"] or r["first_value"] <= r["target"]:
            status, bound = PAST_AT_START, max(r["first_tokens"] - s_a, 0.0) / b2
        else:
            status, frac2 = REACHED, (x - s_a) / b2
        rows.append({**{k: r[k] for k in keys}, "span": span, "target": r["target"], "tokens": x,
                     "baseline_tokens": r["baseline_tokens"], "stage1_tokens": s_a, "baseline_stage1_tokens": s_b,
                     "last_tokens": float(r["last_tokens"]), "fraction": r["fraction"], "fraction_stage2": frac2,
                     "status": status, "bound": bound})
    schema = {"teacher": pl.String, "mixer": pl.String, "placement": pl.String, "seed": pl.Int64, "span": pl.String,
              "target": pl.Float64, "tokens": pl.Float64, "baseline_tokens": pl.Float64, "stage1_tokens": pl.Float64,
              "baseline_stage1_tokens": pl.Float64, "last_tokens": pl.Float64, "fraction": pl.Float64,
              "fraction_stage2": pl.Float64, "status": pl.String, "bound": pl.Float64}
    return pl.DataFrame(rows, schema=schema, orient="row")


def final_retrieval_scores(score: pl.DataFrame) -> pl.DataFrame:
    """Per (arm, seed, layer): the retrieval score at the arm's last scored checkpoint, mean over the gaps
    where it is defined (a gap whose A/B margin is below `min_denominator` has a NaN score and is left out;
    a layer with no defined gap gets no row)."""
    df = score if "seed" in score.columns else score.with_columns(seed=pl.lit(None, pl.Int64))
    last = df.group_by(["arm", "seed"]).agg(last=pl.col("fraction").max())
    return (df.join(last, on=["arm", "seed"], nulls_equal=True).filter(pl.col("fraction") == pl.col("last"))
            .filter(pl.col("score").is_not_nan() & pl.col("score").is_not_null())
            .group_by(["arm", "seed", "layer", "layer_type"]).agg(score=pl.col("score").mean()))


def retrieval_score_table(score: pl.DataFrame) -> pl.DataFrame:
    """Final Layer Retrieval Ability Score per BLD-SR arm and layer (mean over gaps), mean over seeds with its
    t-interval across seeds (`score_lo`, `score_hi`; NaN with one seed) and `n_seeds`. Undefined scores
    (NaN: the model does not tell A from B) are left out of a layer's seeds."""
    need = ["arm", "fraction", "layer", "layer_type", "gap", "score"]
    missing = [c for c in need if c not in score.columns]
    if missing:
        raise HybridlabError(f"table 'retrieval_score' lacks columns {missing}; rebuild it with eval_retrieval_score")
    final = final_retrieval_scores(score)
    return seed_summary(final, ["arm", "layer", "layer_type"], "score").sort(["arm", "layer"])


def sr_accuracy_table(runs: pl.DataFrame) -> pl.DataFrame:
    """Final validation accuracy (per answer digit) of each BLD-SR arm per gap: mean over seeds of the last
    evaluation, its seed t-interval (`accuracy_lo/_hi`, clipped to [0, 1]: with 3 seeds and one that failed
    to learn, the symmetric t-interval reaches past the range an accuracy can take) and `n_seeds`."""
    cols = sorted(c for c in runs.columns if c.startswith("eval/acc/gap"))
    if not cols:
        raise HybridlabError("bld_sr metrics have no 'eval/acc/gap*' columns; rebuild the bld_sr runs")
    df = runs if "seed" in runs.columns else runs.with_columns(seed=pl.lit(None, pl.Int64))
    long = (df.select("run", "seed", "step", *cols).unpivot(index=["run", "seed", "step"], on=cols, variable_name="gap")
            .drop_nulls("value").with_columns(gap=pl.col("gap").str.slice(len("eval/acc/gap")).cast(pl.Int64)))
    last = long.sort("step").group_by(["run", "seed", "gap"]).agg(accuracy=pl.col("value").last())
    table = seed_summary(last.rename({"run": "arm"}), ["arm", "gap"], "accuracy")
    return table.with_columns(pl.col("accuracy_lo", "accuracy_hi").clip(0.0, 1.0)).sort(["arm", "gap"])


def nl_runs(runs: pl.DataFrame) -> pl.DataFrame:
    """Split a BLD-NL arm name `<mixer>[-<size>]-<variant>` into mixer and variant."""
    return runs.with_columns(mixer=pl.col("run").str.replace(r"-[^-]+$", ""),
                             variant=pl.col("run").str.extract(r"-([^-]+)$"))

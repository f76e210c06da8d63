"""The competing-learning (BLD) rows of the findings table (`hybridlab.plots.findings`; docs/methods.md
"Findings table", "BLD on Spaced Retrieval findings").

Spaced Retrieval (BLD-SR), read from the retrieval-score table (per arm, seed, score checkpoint, layer and
gap) and the arms' training metrics:

- **Best layer of a kind** at a checkpoint: a layer's score is its mean over the gaps where it is defined;
  the best recurrent / attention layer is the maximum over the layers of that kind. The score's
  denominator is shared by the layers of one gap, so a checkpoint has either both kinds or neither.
- **Takeover** (per baseline seed): the first checkpoint after the initial one at which the best recurrent
  layer's score exceeds the best attention layer's. Undefined when no checkpoint after the first has a
  defined score; "none" when the recurrent layers never lead.
- **Early / late freeze** (per arm and seed): an arm whose first freeze window starts before the seed's
  takeover update (or in a seed without a takeover) freezes early, one starting at or after it late. The
  study: freezing before the takeover (about update 125) helps, later hurts. An arm early in some seeds
  and late in others has no expected sign (its rows are inconclusive, with the takeovers in the note).
- **Taking the retrieval first**: per baseline seed, at the first checkpoint at which some layer's score
  reaches `TAKE_LEVEL`, best recurrent minus best attention layer.

Every per-seed effect is paired with the baseline of the same seed; a seed whose effect is undefined (no
defined score where the effect is read, no frozen logged update) is counted in `n_undefined` and named in
the note, and the interval is over the other seeds.
"""

from __future__ import annotations

import math
import re

import polars as pl

from hybridlab.eval import stats
from hybridlab.plots import verdicts as F
from hybridlab.plots import uncertainty as U
from hybridlab.train.arms import sr_arm_windows

ATTENTION_KINDS = ("full_attention", "sliding_attention")
ATTENTION, RECURRENT = "attention", "recurrent"
BASELINE = "baseline"
TAKE_LEVEL = 0.5  # a layer "takes" the retrieval when patching it alone moves half the A -> B margin
STUDY_TAKEOVER = 125  # the study: the recurrent layers take the retrieval near update 125
STUDY_GRAD_RATIO = 10.0  # the study: attention's gradient norm about 10x while the recurrent layers are frozen
ATTENTION_GRAD = "grad_norm/full_attention"
SEEDS = "seeds (t-interval)"
SIGN = "sign test over seeds"
EARLY, LATE = "early", "late"
_ARM = re.compile(r"(freeze|window)")


def _with_seed(df: pl.DataFrame) -> pl.DataFrame:
    return df if "seed" in df.columns else df.with_columns(seed=pl.lit(None, pl.Int64))


def best_by_checkpoint(score: pl.DataFrame) -> pl.DataFrame:
    """One row per (arm, seed, step): `attention` and `recurrent`, the best layer of each kind (null where
    no gap has a defined score)."""
    df = _with_seed(score)
    steps = df.select("arm", "seed", "step").unique()
    per_layer = (df.filter(pl.col("score").is_not_nan() & pl.col("score").is_not_null())
                 .group_by(["arm", "seed", "step", "layer", "layer_type"]).agg(pl.col("score").mean())
                 .with_columns(kind=pl.when(pl.col("layer_type").is_in(ATTENTION_KINDS)).then(pl.lit(ATTENTION))
                               .otherwise(pl.lit(RECURRENT))))
    best = per_layer.group_by(["arm", "seed", "step", "kind"]).agg(pl.col("score").max())
    out = steps
    for kind in (ATTENTION, RECURRENT):
        part = best.filter(pl.col("kind") == kind).select("arm", "seed", "step", pl.col("score").alias(kind))
        out = out.join(part, on=["arm", "seed", "step"], how="left", nulls_equal=True)
    return out.sort(["arm", "seed", "step"])


def _defined(r: dict) -> bool:
    return r[ATTENTION] is not None and r[RECURRENT] is not None


def takeovers(best: pl.DataFrame) -> dict:
    """{seed: takeover update, None (the recurrent layers never lead) or "undefined"} of the baseline."""
    out: dict = {}
    base = best.filter(pl.col("arm") == BASELINE)
    for (seed,), g in base.sort("step").group_by(["seed"], maintain_order=True):
        rows = [r for r in g.iter_rows(named=True) if r["step"] > 0 and _defined(r)]
        if not rows:
            out[seed] = "undefined"
            continue
        out[seed] = next((r["step"] for r in rows if r[RECURRENT] > r[ATTENTION]), None)
    return out


def freeze_timing(start: int, takeover) -> str | None:
    """EARLY when the freeze starts before the takeover update (or the recurrent layers never take the
    retrieval), LATE at or after it, None when the takeover is undefined."""
    if takeover == "undefined":
        return None
    return EARLY if takeover is None or start < takeover else LATE


def arm_expectation(timings: list) -> int:
    """+1 when every seed freezes early, -1 when every seed freezes late, 0 otherwise (mixed or unknown)."""
    known = set(timings)
    if known == {EARLY}:
        return +1
    if known == {LATE}:
        return -1
    return 0


def _seed_name(seed) -> str:
    return "the unseeded run" if seed is None else f"seed {seed}"


def _takeover_words(tk: dict) -> str:
    def one(v):
        return "undefined" if v == "undefined" else "none" if v is None else f"update {v}"
    return ("takeover " + ", ".join(f"{_seed_name(s)}: {one(v)}" for s, v in sorted(tk.items(), key=lambda x: str(x[0])))
            + f" (study: about update {STUDY_TAKEOVER})")


def _seed_row(finding, comparison, definition, expected, per_seed: dict, source, why_undefined: str, note="",
              transform=None):
    """A findings row from {seed: value or None}: mean and t-interval over the defined seeds, sign test,
    `n_seeds` = seeds run, `n_undefined` = seeds without a value (named in the note). `expected` 0: no
    expected sign, inconclusive."""
    values = [v for v in per_seed.values() if v is not None and math.isfinite(v)]
    undefined = [s for s, v in per_seed.items() if v is None or not math.isfinite(v)]
    e, lo, hi, _ = F._spread(values)
    notes = [note] if note else []
    if undefined:
        notes.append(", ".join(_seed_name(s) for s in sorted(undefined, key=str)) + f" undefined ({why_undefined})")
    if transform:
        notes.append(transform(e, lo, hi))
    verdict = None
    if expected == 0:
        verdict = stats.INCONCLUSIVE
    elif len(per_seed) >= 2 and len(values) < 2:
        verdict = stats.INCONCLUSIVE
        notes.insert(0, "fewer than two seeds with a defined value")
    return F._row(F.BLD, finding, comparison, definition, expected, e, lo, hi, SEEDS, len(per_seed), SIGN,
                  F._sign_p(values), source, "; ".join(notes), verdict=verdict, n_undefined=len(undefined))


def _total_steps(sr_runs: pl.DataFrame) -> dict:
    return {(r["run"], r["seed"]): r["step"] for r in _with_seed(sr_runs).group_by(["run", "seed"])
            .agg(pl.col("step").max()).iter_rows(named=True)}


def _final_accuracy(sr_runs: pl.DataFrame) -> dict:
    """{(run, seed): last validation accuracy, mean over gaps}."""
    df = _with_seed(sr_runs)
    cols = sorted(c for c in df.columns if c.startswith("eval/acc/gap"))
    if not cols:
        return {}
    last = (df.select("run", "seed", "step", *cols).unpivot(index=["run", "seed", "step"], on=cols)
            .drop_nulls("value").sort("step").group_by(["run", "seed", "variable"]).agg(pl.col("value").last())
            .group_by(["run", "seed"]).agg(acc=pl.col("value").mean()))
    return {(r["run"], r["seed"]): r["acc"] for r in last.iter_rows(named=True)}


def _grad_ratio(sr_runs: pl.DataFrame, arm: str, seed, windows) -> float | None:
    """Mean attention gradient norm over the arm's logged frozen updates over the baseline's on the same
    updates (same seed); None without such an update or column."""
    df = _with_seed(sr_runs)
    if ATTENTION_GRAD not in df.columns:
        return None
    # row `step` logs update step - 1: frozen when start <= step - 1 < end
    frozen = pl.any_horizontal([(pl.col("step") > s) & (pl.col("step") <= e) for s, e in windows])
    pick = df.filter(frozen & pl.col(ATTENTION_GRAD).is_not_null()).select("run", "seed", "step", ATTENTION_GRAD)
    a = pick.filter((pl.col("run") == arm) & (pl.col("seed").eq_missing(seed)))
    b = pick.filter((pl.col("run") == BASELINE) & (pl.col("seed").eq_missing(seed)))
    j = a.join(b, on="step", suffix="_b")
    if j.is_empty():
        return None
    num, den = j[ATTENTION_GRAD].mean(), j[f"{ATTENTION_GRAD}_b"].mean()
    return num / den if den and den > 0 else None


def _ratio_words(e, lo, hi) -> str:
    if not math.isfinite(e):
        return ""
    ci = f" [{10 ** lo:.2g}, {10 ** hi:.2g}]" if math.isfinite(lo) and math.isfinite(hi) else ""
    return f"geometric-mean ratio {10 ** e:.2g}x{ci} (study: about {STUDY_GRAD_RATIO:g}x)"


def bld_sr_rows(score: pl.DataFrame, sr_runs: pl.DataFrame) -> list[dict]:
    """Every BLD-SR finding (module docstring) from the retrieval-score table and the arms' metrics."""
    out: list[dict] = []
    best = best_by_checkpoint(score)
    rows = {(r["arm"], r["seed"], r["step"]): r for r in best.iter_rows(named=True)}
    arms = sorted(best["arm"].unique().to_list())
    if BASELINE not in arms:
        return out
    seeds = sorted(best.filter(pl.col("arm") == BASELINE)["seed"].unique().to_list(), key=str)
    last: dict = {}
    for a, s, st in rows:
        last[(a, s)] = max(st, last.get((a, s), st))
    tk = takeovers(best)

    def diff(a, s, kinds=(ATTENTION, ATTENTION), step=None, arm_b=BASELINE):
        """best[kinds[0]] of (a, s) minus best[kinds[1]] of (arm_b, s) at `step` (None: each run's last)."""
        ra = rows.get((a, s, last.get((a, s)) if step is None else step))
        rb = rows.get((arm_b, s, last.get((arm_b, s)) if step is None else step))
        if ra is None or rb is None or ra[kinds[0]] is None or rb[kinds[1]] is None:
            return None
        return ra[kinds[0]] - rb[kinds[1]]

    takeover_note = _takeover_words(tk)
    out.append(_seed_row(
        "without BLD the recurrent layers take the retrieval (competing learning)", "baseline, last checkpoint",
        "final retrieval score: best recurrent layer minus best attention layer", +1,
        {s: diff(BASELINE, s, (RECURRENT, ATTENTION)) for s in seeds}, "table_retrieval_score",
        "no defined score at the last checkpoint"))

    first = {}
    for s in seeds:
        g = [rows[k] for k in sorted(k for k in rows if k[0] == BASELINE and k[1] == s and k[2] > 0)
             if _defined(rows[k]) and max(rows[k][ATTENTION], rows[k][RECURRENT]) >= TAKE_LEVEL]
        first[s] = g[0][RECURRENT] - g[0][ATTENTION] if g else None
    out.append(_seed_row(
        "the recurrent layers take the retrieval first", f"baseline, first checkpoint with a layer at score >= "
        f"{TAKE_LEVEL:g}", "retrieval score at the first checkpoint where some layer reaches "
        f"{TAKE_LEVEL:g}: best recurrent layer minus best attention layer", +1, first, "table_retrieval_score",
        f"no checkpoint with a layer at {TAKE_LEVEL:g}", takeover_note))

    steps = _total_steps(sr_runs)
    acc = _final_accuracy(sr_runs)
    for arm in (a for a in sorted(set(arms) | {k[0] for k in steps}) if _ARM.match(a)):
        n = steps.get((arm, seeds[0])) or steps.get((BASELINE, seeds[0]))
        windows = sr_arm_windows(arm, n) if n else None
        if not windows:
            continue
        start = min(w[0] for w in windows)
        timing = {s: freeze_timing(start, tk.get(s, "undefined")) for s in seeds}
        expected = arm_expectation(list(timing.values()))
        when = {+1: "before the takeover", -1: "after the takeover"}.get(
            expected, "early in some seeds and late in others, or without a takeover")
        note = f"freeze from update {start}: {when}; {takeover_note}"
        if acc:
            out.append(_seed_row(
                f"freezing the recurrent layers before the takeover helps, after it hurts (study: before about "
                f"update {STUDY_TAKEOVER})", f"{arm} vs baseline", "final validation accuracy (mean over gaps), arm "
                "minus baseline (same seed)", expected,
                {s: (acc[(arm, s)] - acc[(BASELINE, s)]) if (arm, s) in acc and (BASELINE, s) in acc else None
                 for s in seeds}, "table_sr_accuracy", "no validation accuracy", note))
        if expected == +1:
            out.append(_seed_row(
                "freezing the recurrent layers early moves the retrieval to attention", f"{arm} vs baseline",
                "final retrieval score of the best attention layer, arm minus baseline (same seed)", +1,
                {s: diff(arm, s) for s in seeds}, "table_retrieval_score", "no defined score at the last checkpoint",
                note))
            inside = {}
            for s in seeds:
                ck = [k[2] for k in rows if k[0] == arm and k[1] == s
                      and any(a < k[2] <= b for a, b in windows)]
                inside[s] = diff(arm, s, step=max(ck)) if ck else None
            out.append(_seed_row(
                "while the recurrent layers are frozen, attention takes the retrieval", f"{arm} vs baseline",
                "retrieval score of the best attention layer at the last checkpoint inside the freeze, arm minus "
                "baseline (same seed, same update)", +1, inside, "table_retrieval_score",
                "no checkpoint with a defined score inside the freeze", note))
        ratios = {s: _grad_ratio(sr_runs, arm, s, windows) for s in seeds}
        out.append(_seed_row(
            f"attention's gradient norm is larger while the recurrent layers are frozen (study: about "
            f"{STUDY_GRAD_RATIO:g}x)", f"{arm} vs baseline", "log10 of the mean attention gradient norm over the "
            "arm's frozen logged updates over the baseline's on the same updates (same seed)", +1,
            {s: math.log10(r) if r and r > 0 else None for s, r in ratios.items()}, "bld_sr metrics",
            "no logged frozen update", f"freeze updates {windows}", transform=_ratio_words))

    for arm in (a for a in arms if a.startswith("longgap")):
        out.append(_seed_row(
            "training on more long-gap examples shifts the retrieval to attention", f"{arm} vs baseline",
            "final retrieval score of the best attention layer, arm minus baseline (same seed)", +1,
            {s: diff(arm, s) for s in seeds}, "table_retrieval_score", "no defined score at the last checkpoint"))
    return out


# --- BLD on natural language: long-context loss --------------------------------------------------------


def _arm_label(mixer: str, size: str, sizes: set) -> str:
    return mixer if len(sizes) == 1 else f"{mixer}-{size}"


def _interval_words(r: dict, value: str) -> str:
    lo, hi = r.get(f"{value}_lo"), r.get(f"{value}_hi")
    if lo is None or hi is None or not (math.isfinite(lo) and math.isfinite(hi)):
        return f"{r['variant']} {r[value]:.4g}"
    return f"{r['variant']} {r[value]:.4g} [{lo:.4g}, {hi:.4g}]"


def bld_nl_position_rows(summary: pl.DataFrame, buckets: pl.DataFrame | None = None) -> list[dict]:
    """BLD-NL long-context rows of the first seed's arms (the position-loss job reads those only), per mixer
    and size: LongPPL, BLD minus baseline (expected -), and the mean loss in the last (longest-context)
    position bucket, BLD minus baseline (expected -). One seed, so inconclusive by the seed rule; there is
    no paired interval (the tables hold each arm's own bootstrap over the documents, given in the note)."""
    out: list[dict] = []
    s = {(r["mixer"], r["size"], r["variant"]): r for r in summary.iter_rows(named=True)}
    sizes = {k[1] for k in s}
    last = {}
    if buckets is not None and not buckets.is_empty():
        top = buckets.group_by(["mixer", "size"]).agg(pl.col("bucket_lo").max().alias("top"))
        for r in buckets.join(top, on=["mixer", "size"]).filter(pl.col("bucket_lo") == pl.col("top")).iter_rows(
                named=True):
            last[(r["mixer"], r["size"], r["variant"])] = r
    for mixer, size in sorted({(m, z) for m, z, _ in s}):
        base, bld = s.get((mixer, size, "baseline")), s.get((mixer, size, "bld"))
        if base is None or bld is None:
            continue
        label = f"{_arm_label(mixer, size, sizes)}: bld vs baseline"
        a, b = bld["long_ppl"], base["long_ppl"]
        defined = a is not None and b is not None and math.isfinite(a) and math.isfinite(b)
        note = ("first seed's models; no paired interval, each arm's over the documents: "
                + "; ".join(_interval_words(r, "long_ppl") for r in (base, bld)) if defined
                else "LongPPL undefined: no key token (no token gains from long context under the evaluator)")
        out.append(F._row(F.BLD, "BLD lowers LongPPL (the loss on the tokens that need long context)", label,
                          f"LongPPL, BLD minus baseline (key tokens of the evaluator {bld['evaluator']})", -1,
                          a - b if defined else math.nan, math.nan, math.nan, "none (one arm pair)", 1, "", math.nan,
                          "position_loss_summary", note, n_undefined=0 if defined else 1))
        lb, ll = last.get((mixer, size, "baseline")), last.get((mixer, size, "bld"))
        if lb is not None and ll is not None:
            out.append(F._row(
                F.BLD, "BLD lowers the loss at long-context positions", label,
                f"mean loss at positions {lb['bucket_lo']}-{lb['bucket_hi']} (the last bucket), BLD minus baseline, "
                "nats", -1, ll["mean_loss"] - lb["mean_loss"], math.nan, math.nan, "none (one arm pair)", 1, "",
                math.nan, "position_loss", "first seed's models; no paired interval, each arm's over the documents: "
                + "; ".join(_interval_words(r, "mean_loss") for r in (lb, ll))))
    return out


HEADS_KEPT = (3, 1)  # the study compares keeping the last three retrieval heads with keeping one


def retrieval_heads_rows(masking: pl.DataFrame) -> list[dict]:
    """BLD-NL retrieval-heads rows of the first seed's arms, per mixer and size and for k in `HEADS_KEPT`:
    passkey accuracy with every head but the k highest-gate ones masked to streaming attention, BLD minus
    baseline (expected +: BLD's retrieval lives in its attention heads). The interval is Newcombe's over the
    passkey test examples (conservative: both arms see the same examples); one seed, so the seed rule keeps
    it inconclusive. A model with k heads or fewer has no such row."""
    out: list[dict] = []
    need = {"mixer", "size", "variant", "n_masked", "accuracy", "n"}
    if masking is None or masking.is_empty() or not need <= set(masking.columns):
        return out
    sizes = set(masking["size"].to_list())
    curves = {(r["mixer"], r["size"], r["variant"]): r for r in masking.group_by(["mixer", "size", "variant"]).agg(
        n_heads=pl.col("n_masked").max(), acc=pl.col("accuracy"), masked=pl.col("n_masked"), n=pl.col("n").first()
    ).iter_rows(named=True)}
    for mixer, size in sorted({(m, z) for m, z, _ in curves}):
        base, bld = curves.get((mixer, size, "baseline")), curves.get((mixer, size, "bld"))
        if base is None or bld is None or base["n_heads"] != bld["n_heads"]:
            continue
        label = f"{_arm_label(mixer, size, sizes)}: bld vs baseline"
        for keep in HEADS_KEPT:
            if base["n_heads"] <= keep:
                continue
            at = base["n_heads"] - keep
            a = dict(zip(bld["masked"], bld["acc"]))[at]
            b = dict(zip(base["masked"], base["acc"]))[at]
            ka, kb = round(a * bld["n"]), round(b * base["n"])
            d, lo, hi = stats.newcombe_difference(ka, bld["n"], kb, base["n"])
            out.append(F._row(
                F.BLD, "BLD keeps passkey retrieval in its highest-gate attention heads (the study compares "
                       "keeping the last three heads with keeping one)", label,
                f"passkey accuracy with all but the {keep} highest-gate KV head{'s' if keep > 1 else ''} masked "
                f"to streaming ({at} of {base['n_heads']} masked), BLD minus baseline", 1, d, lo, hi,
                "examples (Newcombe interval; first seed's models)", 1, "", math.nan, "retrieval_heads_masking",
                f"passkey {ka} of {bld['n']} (bld) vs {kb} of {base['n']} (baseline)"))
    return out


# lm-eval summary rows read for the recall / RULER findings, in order; the first metric present decides
RECALL_METRICS = (("recall", "mean"), ("hybridlab_local_recall", "contains"))
RULER_METRICS = (("ruler", "mean"),)


def lm_benchmark_rows(bench: pl.DataFrame) -> list[dict]:
    """BLD-NL rows from lm-eval (the paper preset and the rehearsal): in-context recall (the six-task mean,
    or the rehearsal's local recall task) and RULER (mean over its pairs), BLD minus baseline, per mixer
    and size, expected + (the study: BLD gains on both). lm-eval scores the first seed's arms (model
    `bld_nl/seed<N>/<arm>`), so one seed; the note gives lm-eval's normal interval of the difference where
    it reports standard errors (independent-sample, so conservative on shared examples)."""
    out: list[dict] = []
    if bench is None or bench.is_empty():
        return out
    arms = (bench.filter(pl.col("model").str.starts_with("bld_nl/"))
            .with_columns(arm=pl.col("model").str.split("/").list.last()))
    if arms.is_empty():
        return out
    arms = arms.with_columns(mixer_size=pl.col("arm").str.replace(r"-[^-]+$", ""),
                             variant=pl.col("arm").str.extract(r"-([^-]+)$"))
    value = {(r["mixer_size"], r["variant"], r["task"], r["metric"]): (r["value"], r["stderr"])
             for r in arms.iter_rows(named=True)}
    for label, finding, metrics in (("recall", "BLD improves in-context recall", RECALL_METRICS),
                                    ("ruler", "BLD improves long-context retrieval (RULER)", RULER_METRICS)):
        for ms in sorted(set(arms["mixer_size"].to_list())):
            for task, metric in metrics:
                a, b = value.get((ms, "bld", task, metric)), value.get((ms, "baseline", task, metric))
                if a is None or b is None:
                    continue
                d = a[0] - b[0]
                ses = (a[1], b[1])
                note = "first seed's models"
                if all(se is not None and math.isfinite(se) for se in ses):
                    half = 1.96 * math.sqrt(ses[0] ** 2 + ses[1] ** 2)
                    note += f"; lm-eval's normal interval over examples [{d - half:.4g}, {d + half:.4g}]"
                out.append(F._row(F.BLD, finding, f"{ms}: bld vs baseline",
                                  f"lm-eval {task}/{metric} ({label}), BLD minus baseline", 1, d, math.nan, math.nan,
                                  "none (one arm pair)", 1, "", math.nan, "lm_benchmarks", note))
                break
    return out

"""The BLD Spaced Retrieval rows of the findings table (`hybridlab.plots.findings_bld`; docs/methods.md
"Findings table"), one test per rule, on hand-made retrieval-score tables and training metrics. Each test
fails when the rule it covers is reverted."""

import math

import polars as pl
import pytest

from hybridlab.plots import findings_bld as FB, registry
from hybridlab.plots import tables as plot_tables

T975_1 = 12.706204736174707  # t quantile 0.975, 1 degree of freedom


def _score(spec: dict) -> pl.DataFrame:
    """Retrieval-score rows from {(arm, seed, step): (best recurrent, best attention) or None (undefined)}:
    a KDA layer 0 and an attention layer 1 on two gaps, plus a weaker KDA layer 2 (the best is a max)."""
    rows = []
    for (arm, seed, step), v in spec.items():
        for layer, lt, i in ((0, "kda", 0), (1, "full_attention", 1), (2, "kda", None)):
            for gap in (8, 32):
                score = math.nan if v is None else (v[i] if i is not None else v[0] - 0.5)
                rows.append(dict(arm=arm, seed=seed, step=step, fraction=step / 40, long_gap_fraction=None,
                                 layer=layer, layer_type=lt, gap=gap, score=score, n=4))
    return pl.DataFrame(rows, schema_overrides={"long_gap_fraction": pl.Float64})


# baseline: undefined at the initial checkpoint, attention ahead at 10, the recurrent layers ahead from 20 on
BASE = {0: None, 10: (0.1, 0.3), 20: (0.6, 0.2), 30: (0.9, 0.1), 40: (0.9, 0.1)}


def _base(seeds=(0, 1), curve=BASE):
    return {("baseline", s, st): v for s in seeds for st, v in curve.items()}


def _runs(acc: dict, grad: dict | None = None, steps=40) -> pl.DataFrame:
    """Metrics per run `seed<s>/<arm>`: validation accuracy `acc[(arm, seed)]` at the last step, attention
    gradient norm `grad[(arm, seed)](step)` (default 1.0) at every step."""
    frames = {}
    for (arm, s), a in acc.items():
        g = (grad or {}).get((arm, s), lambda step: 1.0)
        frames[f"seed{s}/{arm}"] = pl.DataFrame({
            "step": list(range(1, steps + 1)), "eval/acc/gap8": [None] * (steps - 1) + [a],
            "grad_norm/full_attention": [float(g(st)) for st in range(1, steps + 1)]},
            schema_overrides={"eval/acc/gap8": pl.Float64})
    return plot_tables.concat_runs(frames)


def _get(rows, finding_start, comparison):
    (r,) = [r for r in rows if r["finding"].startswith(finding_start) and r["comparison"] == comparison]
    return r


def test_takeover_is_the_first_checkpoint_where_the_best_recurrent_layer_leads():
    best = FB.best_by_checkpoint(_score({**_base(seeds=(0,)), **{("baseline", 1, st): v for st, v in
                                         {0: None, 10: (0.2, 0.3), 20: (0.2, 0.4)}.items()},
                                         **{("baseline", 2, st): None for st in (0, 10)}}))
    # the initial checkpoint never counts; seed 1's recurrent layers never lead; seed 2 has no defined score
    assert FB.takeovers(best) == {0: 20, 1: None, 2: "undefined"}
    r = best.filter((pl.col("seed") == 0) & (pl.col("step") == 20)).row(0, named=True)
    assert (r["recurrent"], r["attention"]) == pytest.approx((0.6, 0.2))  # max over the two KDA layers
    assert FB.freeze_timing(19, 20) == "early" and FB.freeze_timing(20, 20) == "late"
    assert FB.freeze_timing(500, None) == "early" and FB.freeze_timing(0, "undefined") is None
    assert [FB.arm_expectation(t) for t in (["early"] * 2, ["late"] * 2, ["early", "late"], ["early", None])] == [
        1, -1, 0, 0]


def test_freeze_before_the_takeover_is_expected_to_help_after_it_to_hurt():
    arms = {"freeze0-15u": (0.9, 0.91), "window10u+5u": (0.91, 0.95), "window20u+5u": (0.5, 0.45)}
    spec = _base()
    for a in arms:
        spec.update({(a, s, st): v for (_, s, st), v in _base().items()})
    acc = {("baseline", s): 0.8 for s in (0, 1)}
    acc.update({(a, s): v[s] for a, v in arms.items() for s in (0, 1)})
    rows = FB.bld_sr_rows(_score(spec), _runs(acc))
    f = "freezing the recurrent layers before the takeover helps"
    early, mid, late = (_get(rows, f, f"{a} vs baseline") for a in arms)
    assert early["expected"] == "+" and mid["expected"] == "+" and late["expected"] == "-"  # takeover at 20
    assert early["effect"] == pytest.approx(0.105) and early["verdict"] == "reproduced"
    half = T975_1 * 0.025  # late: -0.3, -0.35 (sd 0.05 / sqrt 2, over sqrt 2 seeds)
    assert late["effect"] == pytest.approx(-0.325) and (late["ci_lo"], late["ci_hi"]) == pytest.approx(
        (-0.325 - half, -0.325 + half))
    assert late["verdict"] == "reproduced" and "freeze from update 20: after the takeover" in late["note"]
    assert "seed 0: update 20, seed 1: update 20" in late["note"]
    # the retrieval-to-attention rows are for the early arms only
    moved = [r["comparison"] for r in rows if r["finding"].startswith("freezing the recurrent layers early")]
    assert moved == ["freeze0-15u vs baseline", "window10u+5u vs baseline"]


def test_an_arm_between_the_seeds_takeovers_has_no_expected_sign():
    later = {**BASE, 20: (0.1, 0.3), 30: (0.1, 0.3)}  # seed 1 takes over at 40
    spec = {**_base(seeds=(0,)), **_base(seeds=(1,), curve=later)}
    spec.update({("window30u+5u", s, st): v for (_, s, st), v in spec.copy().items()})
    acc = {("baseline", 0): 0.8, ("baseline", 1): 0.8, ("window30u+5u", 0): 0.9, ("window30u+5u", 1): 0.95}
    r = _get(FB.bld_sr_rows(_score(spec), _runs(acc)), "freezing the recurrent layers before",
             "window30u+5u vs baseline")
    # the interval lies above 0, but the study's sign is unknown for this arm: inconclusive
    assert r["expected"] == "" and r["verdict"] == "inconclusive" and r["effect"] == pytest.approx(0.125)
    assert "early in some seeds and late in others" in r["note"] and "seed 1: update 40" in r["note"]


def test_recurrent_first_reads_the_first_checkpoint_with_a_layer_at_half_and_counts_undefined_seeds():
    never = {0: None, 10: (0.2, 0.1), 20: (0.3, 0.4), 30: (0.4, 0.3), 40: (0.45, 0.2)}  # no layer reaches 0.5
    spec = {**_base(seeds=(0, 1)), **_base(seeds=(2,), curve={**BASE, 10: (0.1, 0.7)}), **_base(seeds=(3,), curve=never)}
    rows = FB.bld_sr_rows(_score(spec), _runs({("baseline", s): 0.8 for s in range(4)}))
    r = _get(rows, "the recurrent layers take the retrieval first", "baseline, first checkpoint with a layer at "
             "score >= 0.5")
    # seeds 0, 1: 0.6 - 0.2 at update 20; seed 2: attention first at update 10 (0.1 - 0.7); seed 3 undefined
    values = [0.4, 0.4, -0.6]
    assert r["effect"] == pytest.approx(sum(values) / 3) and r["n_seeds"] == 4 and r["n_undefined"] == 1
    assert "seed 3 undefined (no checkpoint with a layer at 0.5)" in r["note"]
    assert r["verdict"] == "inconclusive"
    final = _get(rows, "without BLD the recurrent layers take the retrieval", "baseline, last checkpoint")
    assert final["effect"] == pytest.approx((0.8 * 3 + 0.25) / 4) and final["n_undefined"] == 0


def test_a_seed_undefined_at_the_last_checkpoint_is_counted_not_dropped():
    spec = {**_base(seeds=(0, 1)), ("baseline", 1, 40): None}
    rows = FB.bld_sr_rows(_score(spec), _runs({("baseline", s): 0.8 for s in (0, 1)}))
    final = _get(rows, "without BLD the recurrent layers take the retrieval", "baseline, last checkpoint")
    assert final["n_seeds"] == 2 and final["n_undefined"] == 1 and final["effect"] == pytest.approx(0.8)
    assert final["verdict"] == "inconclusive" and "fewer than two seeds with a defined value" in final["note"]
    assert "seed 1 undefined" in final["note"]


def test_attention_gradient_ratio_is_read_on_the_frozen_updates_only():
    # window10u+5u freezes updates 10..14, logged at steps 11..15: attention's norm 10x (seed 0), 100x (seed 1)
    grad = {("window10u+5u", s): (lambda step, s=s: (10.0 ** (s + 1)) if 10 < step <= 15 else 1000.0)
            for s in (0, 1)}
    spec = _base()
    spec.update({("window10u+5u", s, st): v for (_, s, st), v in _base().items()})
    acc = {(a, s): 0.8 for a in ("baseline", "window10u+5u") for s in (0, 1)}
    r = _get(FB.bld_sr_rows(_score(spec), _runs(acc, grad)), "attention's gradient norm is larger",
             "window10u+5u vs baseline")
    assert r["effect"] == pytest.approx(1.5) and r["expected"] == "+"  # mean of log10 10 and log10 100
    assert "geometric-mean ratio 32x" in r["note"] and "study: about 10x" in r["note"]
    assert r["verdict"] == "inconclusive"  # 1 and 2 with two seeds: the t-interval reaches below 0


def test_attention_score_inside_the_freeze_is_compared_at_the_same_update():
    spec = _base()
    # frozen on updates [0, 15): the checkpoint at update 10 is inside, the one at 20 is not
    arm = {0: None, 10: (0.05, 0.7), 20: (0.1, 0.75), 30: (0.1, 0.9), 40: (0.1, 0.9)}
    spec.update({("freeze0-15u", s, st): v for s in (0, 1) for st, v in arm.items()})
    acc = {(a, s): 0.8 for a in ("baseline", "freeze0-15u") for s in (0, 1)}
    rows = FB.bld_sr_rows(_score(spec), _runs(acc))
    inside = _get(rows, "while the recurrent layers are frozen", "freeze0-15u vs baseline")
    assert inside["effect"] == pytest.approx(0.7 - 0.3) and inside["n_undefined"] == 0
    final = _get(rows, "freezing the recurrent layers early", "freeze0-15u vs baseline")
    assert final["effect"] == pytest.approx(0.9 - 0.1)


def test_long_gap_arms_are_compared_on_the_best_attention_layer():
    spec = _base()
    spec.update({("longgap0.5", s, 40): (0.2, 0.6 + 0.01 * s) for s in (0, 1)})
    rows = FB.bld_sr_rows(_score(spec), _runs({("baseline", s): 0.8 for s in (0, 1)}))
    r = _get(rows, "training on more long-gap examples", "longgap0.5 vs baseline")
    assert r["effect"] == pytest.approx(0.505) and r["expected"] == "+"  # 0.5, 0.51 over the baseline's 0.1
    half = T975_1 * math.sqrt(0.00005) / math.sqrt(2)
    assert (r["ci_lo"], r["ci_hi"]) == pytest.approx((0.505 - half, 0.505 + half)) and r["verdict"] == "reproduced"


def test_bld_nl_long_context_rows_are_one_seed_with_each_arms_interval_in_the_note():
    summary = pl.DataFrame([dict(model=f"kda-{v}", mixer="kda", size="xs", variant=v, evaluator="kda-baseline",
                                 long_ppl=lp, long_ppl_lo=lp - 1, long_ppl_hi=lp + 1)
                            for v, lp in (("baseline", 20.0), ("bld", 17.5))]
                           + [dict(model=f"gdn-{v}", mixer="gdn", size="xs", variant=v, evaluator="kda-baseline",
                                   long_ppl=math.nan, long_ppl_lo=math.nan, long_ppl_hi=math.nan)
                              for v in ("baseline", "bld")])
    buckets = pl.DataFrame([dict(model=f"kda-{v}", mixer="kda", size="xs", variant=v, bucket_lo=lo, bucket_hi=hi,
                                 mean_loss=m + (0.3 if v == "baseline" else 0.0), mean_loss_lo=m - 0.1,
                                 mean_loss_hi=m + 0.4)
                            for v in ("baseline", "bld") for lo, hi, m in ((1, 1, 6.0), (2, 3, 5.0), (4, 7, 4.0))])
    rows = FB.bld_nl_position_rows(summary, buckets)
    lp = _get(rows, "BLD lowers LongPPL", "kda: bld vs baseline")
    assert lp["effect"] == pytest.approx(-2.5) and lp["expected"] == "-" and lp["n_seeds"] == 1
    assert lp["verdict"] == "inconclusive" and lp["note"].startswith("one seed")
    assert "baseline 20 [19, 21]; bld 17.5 [16.5, 18.5]" in lp["note"]
    nan = _get(rows, "BLD lowers LongPPL", "gdn: bld vs baseline")
    assert math.isnan(nan["effect"]) and nan["n_undefined"] == 1 and "no key token" in nan["note"]
    pos = _get(rows, "BLD lowers the loss at long-context positions", "kda: bld vs baseline")
    assert pos["effect"] == pytest.approx(-0.3) and "positions 4-7" in pos["effect_definition"]
    assert [r["comparison"] for r in rows if r["finding"].startswith("BLD lowers the loss")] == [
        "kda: bld vs baseline"]  # gdn has no bucket rows here


def test_the_registry_passes_the_position_loss_tables_to_the_findings_table():
    from test_findings_verdicts import _sr_runs
    from test_plots import _niah, _softcka
    from test_uncertainty_tables import _distill, _nl_runs, _rows, _score as _u_score, _stage1

    summary = pl.DataFrame([dict(model=f"kda-{v}", mixer="kda", size="xs", variant=v, evaluator="kda-baseline",
                                 long_ppl=lp) for v, lp in (("baseline", 20.0), ("bld", 17.5))])
    tables = {"perplexity_rows": _rows(), "distill": _distill(), "softcka": _softcka(), "niah": _niah(),
              "retrieval_score": _u_score(), "bld_sr": _sr_runs(), "bld_nl": _nl_runs(), "distill_stage1": _stage1(),
              "position_loss_summary": summary}
    df = registry.render_table("table_findings", tables)
    (r,) = df.filter(pl.col("finding").str.starts_with("BLD lowers LongPPL")).iter_rows(named=True)
    assert r["effect"] == pytest.approx(-2.5)


def _masking(acc: dict, n=20, heads=4) -> pl.DataFrame:
    """Masking curves: accuracy `acc[variant](n_masked)` of a kda-xs arm with `heads` KV heads, n examples each."""
    return pl.DataFrame([dict(model=f"kda-{v}", mixer="kda", size="xs", variant=v, n_masked=k, frac_masked=k / heads,
                              accuracy=f(k), n=n) for v, f in acc.items() for k in range(heads + 1)])


def test_retrieval_heads_rows_compare_the_last_three_heads_and_the_last_one():
    # bld keeps 0.9 until only one head is left (0.5); the baseline falls to 0.3 once a head is masked, 0.1 at one
    m = _masking({"bld": lambda k: 0.9 if k <= 1 else 0.5 if k == 3 else 0.0,
                  "baseline": lambda k: 0.9 if k == 0 else 0.3 if k == 1 else 0.1 if k == 3 else 0.0})
    rows = FB.retrieval_heads_rows(m)
    three, one = rows
    assert "all but the 3 highest-gate" in three["effect_definition"] and "(1 of 4 masked)" in three["effect_definition"]
    assert three["effect"] == pytest.approx(0.6) and one["effect"] == pytest.approx(0.4)
    # Newcombe from the Wilson intervals of 18/20 and 6/20
    from hybridlab.eval import stats

    a, b = stats.wilson_interval(18, 20), stats.wilson_interval(6, 20)
    assert three["ci_lo"] == pytest.approx(0.6 - math.hypot(a.estimate - a.lo, b.hi - b.estimate))
    assert three["expected"] == "+" and three["n_seeds"] == 1 and three["verdict"] == "inconclusive"
    assert "18 of 20 (bld) vs 6 of 20 (baseline)" in three["note"]
    # two heads: no "last three" row, only the last one
    assert len(FB.retrieval_heads_rows(_masking({"bld": lambda k: 1.0, "baseline": lambda k: 0.0}, heads=2))) == 1


def test_lm_benchmark_rows_read_the_bld_arms_recall_and_ruler():
    rows = []
    for v, rec, rul in (("baseline", 0.40, 0.20), ("bld", 0.45, 0.35)):
        model = f"bld_nl/seed0/gdn-xs-{v}"
        rows += [dict(model=model, task="recall", metric="mean", filter="none", value=rec, stderr=None),
                 dict(model=model, task="ruler", metric="mean", filter="none", value=rul, stderr=None),
                 dict(model=model, task="swde", metric="contains", filter="none", value=0.9, stderr=0.03)]
    rows.append(dict(model="teachers/t", task="recall", metric="mean", filter="none", value=0.8, stderr=None))
    out = FB.lm_benchmark_rows(pl.DataFrame(rows))
    assert [(r["finding"], r["comparison"]) for r in out] == [
        ("BLD improves in-context recall", "gdn-xs: bld vs baseline"),
        ("BLD improves long-context retrieval (RULER)", "gdn-xs: bld vs baseline")]
    assert [r["effect"] for r in out] == pytest.approx([0.05, 0.15])
    assert all(r["verdict"] == "inconclusive" and r["expected"] == "+" for r in out)
    # the rehearsal's local recall task, with lm-eval's standard errors: the normal interval in the note
    local = pl.DataFrame([dict(model=f"bld_nl/seed0/kda-{v}", task="hybridlab_local_recall", metric="contains",
                               filter="none", value=x, stderr=0.03) for v, x in (("baseline", 0.5), ("bld", 0.6))])
    (r,) = FB.lm_benchmark_rows(local)
    half = 1.96 * math.sqrt(2) * 0.03
    assert r["effect"] == pytest.approx(0.1) and f"[{0.1 - half:.4g}, {0.1 + half:.4g}]" in r["note"]


def test_the_registry_passes_masking_and_lm_eval_tables_to_the_findings_table():
    from test_plots import _niah, _softcka
    from test_uncertainty_tables import _distill, _rows, _stage1

    bench = pl.DataFrame([dict(model=f"bld_nl/seed0/kda-{v}", task="recall", metric="mean", filter="none", value=x,
                               stderr=None) for v, x in (("baseline", 0.5), ("bld", 0.6))])
    tables = {"perplexity_rows": _rows(), "distill": _distill(), "softcka": _softcka(), "niah": _niah(),
              "retrieval_heads_masking": _masking({"bld": lambda k: 1.0, "baseline": lambda k: 0.5}),
              "lm_benchmarks": bench, "distill_stage1": _stage1()}
    df = registry.render_table("table_findings", tables)
    assert set(df.filter(pl.col("source") == "retrieval_heads_masking")["effect"].to_list()) == {0.5}
    assert df.filter(pl.col("source") == "lm_benchmarks")["effect"].to_list() == pytest.approx([0.1])

"""The verdict rules of the findings table (docs/methods.md "Findings table"), one test per rule, on small
hand-made tables with the columns the real tables have (distill metrics per run, perplexity_rows, softcka,
niah). Each test fails when the rule it covers is reverted."""

import math

import polars as pl
import pytest

from hybridlab.eval import stats
from hybridlab.plots import findings
from hybridlab.plots import tables as plot_tables
from hybridlab.plots import uncertainty as U

from test_plots import _niah, _softcka
from test_uncertainty_tables import _distill, _nl_runs, _rows, _score, _stage1

LANGS6 = ["fra_Latn", "hin_Deva", "rus_Cyrl", "swh_Latn", "tel_Telu", "zho_Hans"]


def _sr_runs():
    return plot_tables.concat_runs({f"seed{s}/{a}": pl.DataFrame({"step": [1, 2],
                                                                  "eval/acc/gap8": [0.1, acc + 0.01 * s]})
                                    for s in (0, 1) for a, acc in (("baseline", 0.9), ("freeze0-0.2", 1.0))})


def _table(rows=None, distill=None, softcka=None, niah=None, stage1=None):
    """The findings table from the toy tables of tests/plots, with the given ones swapped in."""
    return findings.findings_table(_rows() if rows is None else rows, _distill() if distill is None else distill,
                                   _softcka() if softcka is None else softcka, _niah() if niah is None else niah,
                                   _score(), _sr_runs(), _nl_runs(), distill_stage1=stage1)


def _one(df, finding, comparison):
    (row,) = [r for r in df.iter_rows(named=True) if r["finding"] == finding and r["comparison"] == comparison]
    return row


TT = ("FA-first placements reach standard periodic's final loss with fewer stage-2 tokens (study: about 40 % of "
      "its tokens)")


def _curves(arm_by_seed: dict[int, list[float]], tokens=(0, 100, 200, 300, 400)):
    """Stage-2 distill metrics (run labels seed<N>/t/<placement>-gdn): the baseline 5 -> 1 straight, the
    sandwich arm's curve per seed as given."""
    frames = {}
    for s, arm in arm_by_seed.items():
        for p, ys in (("standard_periodic", [5.0, 4.0, 3.0, 2.0, 1.0]), ("sandwich", arm)):
            frames[f"seed{s}/t/{p}-gdn"] = pl.DataFrame({"step": list(range(len(tokens))), "tokens": list(tokens),
                                                         "eval/ce": [float(y) for y in ys], "eval/kl": [0.1] * len(ys)})
    return plot_tables.concat_runs(frames)


def test_seeds_already_past_the_target_are_censored_not_reproduced():
    # every seed of the arm starts below the baseline's final loss (1.0): fraction 0 is only an upper bound
    distill = _curves({s: [0.9, 0.8, 0.7, 0.6, 0.5] for s in (0, 1, 2)})
    r = _one(_table(distill=distill), TT, "t/gdn: sandwich vs standard_periodic")
    assert r["verdict"] == "inconclusive" and r["n_seeds"] == 3 and r["n_censored"] == 3
    assert math.isnan(r["ci_lo"]) and math.isnan(r["ci_hi"])  # no zero-width [-1, -1] interval
    assert r["note"].startswith("censored: seed 0 already past the target") and "seed 2 already past" in r["note"]
    # the censoring-aware sign test counts them as successes (bound 0 < 1), but 3 seeds cannot reach p < 0.05
    assert r["p_value"] == pytest.approx(0.25) and "cannot reach p < 0.05" in r["note"]
    assert r["test"] == "censoring-aware sign test over seeds"
    # over both stages: endpoint_spread starts stage 2 at 0.9, below the baseline's final 1.0; the centred mean
    # at that point also averages a stage-1 evaluation (4.95) and crosses later, but the seed is still censored
    r = _one(_table(stage1=_stage1()), TT, "t/gdn: endpoint_spread vs standard_periodic")
    assert r["verdict"] == "inconclusive" and r["n_censored"] == 2 and math.isnan(r["effect"])
    assert "already past the target at stage 2's first evaluation" in r["note"]


def test_censoring_aware_sign_test_rules():
    past = findings.seed_outcome(U.PAST_AT_START, math.nan, 0.0)
    assert past == findings.SUCCESS and findings.seed_outcome(U.PAST_AT_START, math.nan, 1.2) == findings.UNDETERMINED
    assert findings.seed_outcome(U.NEVER, math.nan, 1.0) == findings.FAILURE
    assert findings.seed_outcome(U.NEVER, math.nan, 0.8) == findings.UNDETERMINED
    # 6 seeds all fewer: p = 2 / 64 decides; one undetermined seed counts against and leaves it open
    assert findings.censored_seed_test([findings.SUCCESS] * 6) == ("reproduced", pytest.approx(1 / 32))
    assert findings.censored_seed_test([findings.SUCCESS] * 5 + [findings.UNDETERMINED])[0] == "inconclusive"
    assert findings.censored_seed_test([findings.FAILURE] * 6)[0] == "contradicted"
    assert stats.sign_test_min_p(3) == 0.25 and stats.sign_test_min_p(6) == pytest.approx(0.03125)


def test_a_never_reaching_seed_counts_in_n_seeds_and_blocks_reproduced():
    # seeds 0 and 1 reach the baseline's final loss at 300 of its 400 tokens; seed 2 stays above it
    distill = _curves({0: [4, 3, 2, 1, 0], 1: [4, 3, 2, 1, 0], 2: [5, 4.5, 4, 3.5, 3]})
    r = _one(_table(distill=distill), TT, "t/gdn: sandwich vs standard_periodic")
    assert r["n_seeds"] == 3 and r["n_censored"] == 1  # seeds run, not seeds that reached the target
    assert r["verdict"] == "inconclusive" and "seed 2 never reaches the target" in r["note"]
    assert "fraction > 1.00, a lower bound" in r["note"]  # its last evaluation is the baseline's crossing
    assert r["effect"] == pytest.approx(-0.25) and math.isnan(r["ci_lo"])  # mean of the uncensored seeds only


def test_seeds_cleanly_reaching_give_a_verdict_on_stage2_tokens():
    # stage 1: 0, 100, 200 tokens (20 -> 16) for both; stage 2: 800 tokens. Baseline 16 -> 12 straight, so its
    # smoothed final 12 is reached at stage-2 token 800; the arm falls 1 per 80 * (1 + 0.125 k) stage-2 tokens and
    # crosses 12 at 320, 360, 400 stage-2 tokens (seeds 0, 1, 2): stage-2 fractions 0.40, 0.45, 0.50
    stage1, stage2 = {}, {}
    t2 = list(range(0, 900, 100))
    for s in (0, 1, 2):
        rate = 80 * (1 + 0.125 * s)
        for p, ys in (("standard_periodic", [16 - t / 200 for t in t2]), ("sandwich", [16 - t / rate for t in t2])):
            stage1[f"seed{s}/t/{p}-gdn"] = pl.DataFrame({"step": [0, 1, 2], "tokens": [0, 100, 200],
                                                         "eval/ce": [20.0, 18.0, 16.0]})
            stage2[f"seed{s}/t/{p}-gdn"] = pl.DataFrame({"step": list(range(9)), "tokens": t2, "eval/ce": ys})
    r = _one(_table(distill=plot_tables.concat_runs(stage2), stage1=plot_tables.concat_runs(stage1)), TT,
             "t/gdn: sandwich vs standard_periodic")
    # on the two-stage axis the fractions would be (200 + 320) / 1000 ... = 0.52, 0.56, 0.60 (mean 0.56)
    assert r["effect"] == pytest.approx(0.45 - 1.0)
    half = 4.302652729911275 * 0.05 / math.sqrt(3)
    assert (r["ci_lo"], r["ci_hi"]) == pytest.approx((-0.55 - half, -0.55 + half))
    assert r["verdict"] == "reproduced" and r["n_seeds"] == 3 and r["n_censored"] == 0
    assert "stage-2 fraction 0.45" in r["note"] and "contains the study's 0.40" in r["note"]


def _softcka_table(pairs, values):
    """softcka.parquet rows (hidden kind): pairs = [(pair, role, model, layer_types)], values(model, lang, layer)
    -> (alignment, cka). Hidden row l carries decoder layer l-1's type (row 0 the embeddings)."""
    rows = []
    for pair, role, model, types in pairs:
        for layer in range(len(types) + 1):
            for lang in LANGS6:
                a, c = values(model, lang, layer)
                rows.append(dict(model=model, pair=pair, role=role, kind="hidden", layer=layer,
                                 layer_type="embedding" if layer == 0 else types[layer - 1], lang=lang, cka=c,
                                 cka_lo=c - 0.01, cka_hi=c + 0.01, cka_debiased=c - 0.1, alignment=a,
                                 alignment_lo=a - 0.01, alignment_hi=a + 0.01, alignment_method="kme",
                                 alignment_gram_rows=a, n_sentences=32, method="exact", sigma_eng=1.0, sigma_x=1.0,
                                 sigma_pair=1.0, sigma_convention="median_distance"))
    return pl.DataFrame(rows)


HYB_T = ["gdn", "gdn", "full_attention", "gdn", "full_attention"]
DENSE_T = ["full_attention"] * 5
ALIGNED = "hybrids are less cross-lingually aligned than dense models"
FIRST_FA = "the largest SoftCKA change across layers is at the hybrid's first FA layer"


def test_a_pair_without_a_dense_model_is_noted_not_a_crash():
    pairs = [("qwen-hub", "hybrid", "org/hybrid", HYB_T), ("qwen-hub", "dense", "org/dense", DENSE_T),
             ("swa-hub", "hybrid", "org/swa", ["sliding_attention", "full_attention"] * 2 + ["sliding_attention"])]
    sc = _softcka_table(pairs, lambda m, lang, layer: (0.5 - 0.01 * layer, 0.6))
    niah = _niah()
    niah = pl.concat([niah, niah.filter(pl.col("role") == "hybrid").with_columns(pair=pl.lit("swa-hub"),
                                                                                  model=pl.lit("org/swa"))])
    df = _table(softcka=sc, niah=niah)
    for finding in (ALIGNED, ALIGNED + " (second view: sentence-set CKA)",
                    "hybrids degrade less with context length in multilingual NIAH", findings.NIAH_OOM):
        r = _one(df, finding, "swa-hub")
        assert r["verdict"] == "inconclusive" and "no dense model" in r["note"] and math.isnan(r["effect"])
    # a sliding-window model gets the no-reorganisation row (expected -) instead of the hybrids' first-FA row
    from hybridlab.plots.findings_multi import SWA_FLAT

    r = _one(df, SWA_FLAT, "swa-hub")
    assert r["expected"] == "-" and r["effect"] == pytest.approx(0.0) and r["verdict"] == "inconclusive"
    assert not df.filter((pl.col("finding") == FIRST_FA) & (pl.col("comparison") == "swa-hub")).height


def test_fixed_published_models_decide_from_their_unit_interval():
    # the hybrid's alignment is 0.2 + small per-language noise below the dense model's at every layer
    def values(model, lang, layer):
        i = LANGS6.index(lang)
        return (0.6 - (0.2 + 0.01 * i) * (model in ("org/hybrid", "t/sandwich-gdn")), 0.5)

    hub = [("qwen-hub", "hybrid", "org/hybrid", HYB_T), ("qwen-hub", "dense", "org/dense", DENSE_T)]
    dag = [("t/sandwich-gdn", "hybrid", "t/sandwich-gdn", HYB_T), ("t/sandwich-gdn", "dense", "t", DENSE_T)]
    df = _table(softcka=_softcka_table(hub + dag, values))
    r = _one(df, ALIGNED, "qwen-hub")
    assert r["effect"] == pytest.approx(-0.225) and r["ci_hi"] < 0
    assert r["verdict"] == "reproduced" and r["n_seeds"] == 0
    assert r["note"] == "fixed published models: interval over languages"
    # the same numbers for a distilled pair of the DAG (one seed's models): the seed rule keeps it open
    d = _one(df, ALIGNED, "t/sandwich-gdn")
    assert d["effect"] == pytest.approx(-0.225) and d["verdict"] == "inconclusive" and d["note"] == "one seed"
    # the headline is the per-pair alignment; the sentence-set CKA (0 difference here) is its second view
    assert _one(df, ALIGNED + " (second view: sentence-set CKA)", "qwen-hub")["effect"] == pytest.approx(0.0)


def test_first_fa_row_tests_where_the_largest_absolute_change_is():
    # hybrid hidden rows 0..5, first FA at row 3: alignment 0.5, 0.55, 0.6, then a DROP of 0.3 + 0.01 i, then
    # +0.02 per row: |change| 0.05, 0.05, 0.3 + 0.01 i, 0.02, 0.02 -> margin 0.25 + 0.01 i (mean 0.275)
    def drop_at_first_fa(model, lang, layer):
        i = LANGS6.index(lang)
        a = [0.5, 0.55, 0.6, 0.3 - 0.01 * i, 0.32 - 0.01 * i, 0.34 - 0.01 * i][layer]
        return a, 0.5

    # the largest change at row 1 instead (0.4), 0.1 at the first FA row: margin 0.1 - 0.4 = -0.3
    def jump_at_row_1(model, lang, layer):
        return [0.1, 0.5, 0.55, 0.65, 0.66, 0.67][layer], 0.5

    pairs = [("qwen-hub", "hybrid", "org/hybrid", HYB_T), ("qwen-hub", "dense", "org/dense", DENSE_T)]
    r = _one(_table(softcka=_softcka_table(pairs, drop_at_first_fa)), FIRST_FA, "qwen-hub")
    assert r["effect"] == pytest.approx(0.275) and r["ci_lo"] > 0 and r["verdict"] == "reproduced"
    assert r["expected"] == "+" and "in 6 of 6 languages" in r["note"] and "hidden row 3" in r["effect_definition"]
    r = _one(_table(softcka=_softcka_table(pairs, jump_at_row_1)), FIRST_FA, "qwen-hub")
    assert r["effect"] == pytest.approx(-0.3) and r["verdict"] == "contradicted" and "in 0 of 6" in r["note"]
    f, m = findings.first_fa_margins(_softcka_table(pairs[:1], drop_at_first_fa), "alignment")
    assert f == 3 and m["fra_Latn"] == pytest.approx(0.25)


def _lang_rows(eng_diff=0.1, diffs=(-0.1, -0.11, -0.12, -0.13, -0.14, -0.15)):
    """perplexity_rows: 3 seeds, English + six languages, 2 rows each; the sandwich's CE is the baseline's 2.0
    plus eng_diff on English and diffs[j] on language j (plus 0.01 per seed)."""
    out = []
    for s in range(3):
        r = 0
        for lang, d in [("eng_Latn", eng_diff), *zip(LANGS6, diffs)]:
            for _ in range(2):
                for p, ce in (("standard_periodic", 2.0), ("sandwich", 2.0 + d + 0.01 * s)):
                    out.append(dict(model=f"t/{p}-gdn", teacher="t", placement=p, mixer="gdn", seed=s, lang=lang,
                                    row=r, n_tokens=10, ce=ce, kl=ce / 10))
                r += 1
    return pl.DataFrame(out)


def test_per_language_sign_test_excludes_english():
    # English worse, all six others better: 6 of 6 (p = 2/64), not 6 of 7 (p = 0.125)
    r = _one(_table(rows=_lang_rows()), "the placement gain holds per language (study: 23 of 26 languages improved)",
             "t/gdn: sandwich vs standard_periodic")
    assert r["p_value"] == pytest.approx(0.03125) and r["verdict"] == "reproduced"
    ci = stats.clopper_pearson_interval(6, 6)
    assert r["effect"] == pytest.approx(0.5) and (r["ci_lo"], r["ci_hi"]) == pytest.approx((ci.lo - 0.5, 0.5))
    assert "6 of 6 non-English languages improved (study: 23 of 26" in r["note"]
    # one of the six worse: 5 of 6, p = 0.21875, the exact interval contains one half
    r = _one(_table(rows=_lang_rows(diffs=(-0.1, -0.11, -0.12, -0.13, -0.14, 0.15))),
             "the placement gain holds per language (study: 23 of 26 languages improved)",
             "t/gdn: sandwich vs standard_periodic")
    assert r["p_value"] == pytest.approx(0.21875) and r["verdict"] == "inconclusive" and "5 of 6" in r["note"]


def test_clopper_pearson_is_dual_to_the_sign_test():
    ci = stats.clopper_pearson_interval(23, 26)
    assert (ci.lo, ci.hi) == pytest.approx((0.6985, 0.9755), abs=1e-4)
    for n in range(1, 16):
        for k in range(n + 1):
            ci = stats.clopper_pearson_interval(k, n)
            assert (ci.lo > 0.5 or ci.hi < 0.5) == (stats.sign_test_counts(k, n - k).p_value < 0.05)


def _niah_table(cells, pairs=(("hub", "org/hybrid", "org/dense"),)):
    """niah.parquet summary rows: cells = {(role, lang, task, context): (k correct, n completed, n_oom)}, the
    same for every pair in `pairs` = [(pair, hybrid model, dense model)]; n is the completed examples and
    accuracy k / n (null when none completed)."""
    rows = []
    for pair, hybrid, dense in pairs:
        for (role, lang, task, ctx), (k, n, n_oom) in cells.items():
            rows.append(dict(model=hybrid if role == "hybrid" else dense, pair=pair, role=role, lang=lang, task=task,
                             context_tokens=ctx, n=n, accuracy=k / n if n else None, n_oom=n_oom, oom=n_oom > 0,
                             oom_rate=n_oom / (n + n_oom), seconds=0.1))
    return pl.DataFrame(rows)


def _niah_findings(table):
    return {(r["finding"], r["comparison"]): r for r in findings._niah_rows(table)}


def test_niah_oom_rate_is_its_own_finding_with_a_newcombe_interval():
    # hybrid: 0 OOM of 40 examples; dense: 20 of 40 (it runs out of memory at the longer length)
    cells = {(role, "fra_Latn", task, ctx): (5, 10, 0) for role in ("hybrid", "dense")
             for task in ("niah_single", "niah_none") for ctx in (100, 200)}
    for task in ("niah_single", "niah_none"):
        cells["dense", "fra_Latn", task, 200] = (0, 0, 10)
    pairs = (("hub", "org/hybrid", "org/dense"), ("t/sandwich-gdn", "t/sandwich-gdn", "t"))
    rows = _niah_findings(_niah_table(cells, pairs))
    r = rows[findings.NIAH_OOM, "hub"]
    # Wilson 0/40: [0, 0.08762]; 20/40: 0.5 -+ 0.14801. Newcombe: -0.5 - 0.14801, -0.5 + sqrt(0.08762^2 + 0.14801^2)
    assert r["effect"] == pytest.approx(-0.5) and r["expected"] == "-"
    assert (r["ci_lo"], r["ci_hi"]) == pytest.approx((-0.64801, -0.32800), abs=1e-4)
    assert r["verdict"] == "reproduced" and r["n_seeds"] == 0 and "interval over examples" in r["note"]
    assert "OOM in 0 of 40 hybrid and 20 of 40 dense" in r["note"]
    d = rows[findings.NIAH_OOM, "t/sandwich-gdn"]  # the DAG's own student: the seed rule of the table
    assert d["effect"] == pytest.approx(-0.5) and d["verdict"] == "inconclusive" and "one seed" in d["note"]
    # the OOM cells are not wrong answers: the length effect is read where both completed (100 -> no longer length)
    assert math.isnan(rows[findings.NIAH_LENGTH, "hub"]["effect"])
    assert "no language x task completed by both" in rows[findings.NIAH_LENGTH, "hub"]["note"]


def test_niah_length_effect_uses_only_cells_both_models_completed():
    # lengths 100, 200, 400; at 400 the dense model runs out of memory in every stratum, the hybrid answers 2/10
    cells = {}
    for lang in ("fra_Latn", "hin_Deva"):
        for task in ("niah_single", "niah_none"):
            cells["hybrid", lang, task, 100] = (10, 10, 0)
            cells["hybrid", lang, task, 200] = (9, 10, 0)
            cells["hybrid", lang, task, 400] = (2, 10, 0)
            cells["dense", lang, task, 100] = (10, 10, 0)
            cells["dense", lang, task, 200] = (6, 10, 0)
            cells["dense", lang, task, 400] = (0, 0, 10)
    # one stratum where the dense model also ran out of memory at 200: left out at 200 as well
    cells["dense", "hin_Deva", "niah_none", 200] = (0, 0, 10)
    r = _niah_findings(_niah_table(cells))[findings.NIAH_LENGTH, "hub"]
    # (0.9 - 1.0) - (0.6 - 1.0) = 0.3 in the 3 strata both completed at 100 and 200
    assert r["effect"] == pytest.approx(0.3) and "100 -> 200 tokens" in r["effect_definition"]
    assert "3 of 4 language x task strata" in r["note"] and "(OOM): 400" in r["note"]
    # counting OOM as wrong (accuracy 0 at 400) would have given (0.2 - 1.0) - (0 - 1.0) = +0.2 at 400


def test_niah_bootstrap_resamples_within_language_x_task_strata():
    # two strata, each with accuracy 1.0 (fra) or 0.0 (hin) in every cell: every within-stratum resample is the
    # same, so the interval is [0, 0]; pooling the strata (accuracy 0.5 per cell) would give a wide interval
    cells = {(role, lang, "niah_single", ctx): (10 if lang == "fra_Latn" else 0, 10, 0)
             for role in ("hybrid", "dense") for lang in ("fra_Latn", "hin_Deva") for ctx in (100, 400)}
    r = _niah_findings(_niah_table(cells))[findings.NIAH_LENGTH, "hub"]
    assert r["effect"] == 0.0 and (r["ci_lo"], r["ci_hi"]) == (0.0, 0.0)
    assert "within language x task strata" in r["ci_over"] and r["verdict"] == "inconclusive"
    # a mixed stratum does vary: the interval widens around the same effect
    cells["hybrid", "hin_Deva", "niah_single", 400] = (5, 10, 0)
    r = _niah_findings(_niah_table(cells))[findings.NIAH_LENGTH, "hub"]
    assert r["effect"] == pytest.approx(0.25) and r["ci_lo"] < 0.25 < r["ci_hi"]


def test_niah_tables_without_n_oom_are_read_as_oom_counted_wrong():
    # an older table: n = all examples, accuracy with OOM as wrong, oom_rate beside it
    old = pl.DataFrame([dict(model="org/d", pair="hub", role="dense", lang="x", task="t", context_tokens=100, n=10,
                             accuracy=0.3, oom=True, oom_rate=0.5, seconds=0.1)])
    c = findings.niah_counts(old).row(0, named=True)
    assert (c["k"], c["done"], c["n_oom"]) == (3, 5, 5)


def test_softcka_rows_of_a_dag_pair_decide_over_replicate_seeds():
    """The DAG's own pair with a second seed's SoftCKA table: the hybrid-minus-dense gap is the mean of the
    per-seed gaps with a t-interval over seeds, and two seeds that agree decide it."""
    dag = _softcka().with_columns(pair=pl.lit("teacher/sp-gdn"))  # the pair named after its hybrid: the DAG's
    # seed 0: hybrid 0.3 - 0.1 lower than dense; seed 1 (the further seed's table): 0.12 lower
    first = dag.with_columns(alignment=pl.when(pl.col("role") == "hybrid").then(0.2).otherwise(0.3))
    second = plot_tables.concat_runs({"seed1/all": dag.with_columns(
        alignment=pl.when(pl.col("role") == "hybrid").then(0.18).otherwise(0.3))})
    one = _one(_table(softcka=first), "hybrids are less cross-lingually aligned than dense models", "teacher/sp-gdn")
    assert one["n_seeds"] == 1 and one["verdict"] == stats.INCONCLUSIVE
    df = findings.findings_table(_rows(), _distill(), first, _niah(), _score(), _sr_runs(), _nl_runs(),
                                 softcka_seeds=second)
    two = _one(df, "hybrids are less cross-lingually aligned than dense models", "teacher/sp-gdn")
    c = U.spread_columns([-0.1, -0.12], "x")
    assert two["n_seeds"] == 2 and two["ci_over"] == "seeds (t-interval)"
    assert (two["effect"], two["ci_lo"], two["ci_hi"]) == pytest.approx((-0.11, c["x_lo"], c["x_hi"]))
    assert two["verdict"] == stats.verdict(-0.11, (c["x_lo"], c["x_hi"]), -1)

"""Uncertainty columns of the results tables and the generated findings table, on toy tables with
hand-computed values (docs/methods.md "Uncertainty in the tables" and "Findings table")."""

import math

import polars as pl
import pytest

from hybridlab.errors import HybridlabError
from hybridlab.plots import figures, findings
from hybridlab.plots import tables as plot_tables
from hybridlab.plots import uncertainty as U

T975_2 = 4.302652729911275  # Student t quantile 0.975, df 2
T975_1 = 12.706204736174707  # df 1


def _rows(diffs=(0.2, 0.21, 0.22), langs=("hin_Deva", "rus_Cyrl"), rows_per_lang=2):
    """Per-row CE: standard periodic 2.0 on every row; sandwich 2.0 - diffs[seed] on every row (10 tokens each)."""
    out = []
    for s, d in enumerate(diffs):
        r = 0
        for lang in langs:
            for _ in range(rows_per_lang):
                for p, ce in (("standard_periodic", 2.0), ("sandwich", 2.0 - d)):
                    out.append(dict(model=f"t/{p}-gdn", teacher="t", placement=p, mixer="gdn", seed=s, lang=lang,
                                    row=r, n_tokens=10, ce=ce, kl=ce / 10))
                r += 1
    return pl.DataFrame(out)


def test_placement_tests_hand_computed():
    df = U.placement_tests_table(_rows())
    ce = df.filter(pl.col("metric") == "ce")
    assert ce["lang"].to_list() == ["all", "hin_Deva", "rus_Cyrl"]
    allr = ce.row(0, named=True)
    # per-seed differences -0.2, -0.21, -0.22: mean -0.21, sd 0.01, t-interval +- t(0.975, 2) * 0.01 / sqrt(3)
    half = T975_2 * 0.01 / math.sqrt(3)
    assert allr["effect"] == pytest.approx(-0.21)
    assert (allr["effect_lo"], allr["effect_hi"]) == pytest.approx((-0.21 - half, -0.21 + half))
    # every row has the same difference in a seed, so every row resample gives the same mean
    assert (allr["effect_rows_lo"], allr["effect_rows_hi"]) == pytest.approx((-0.21, -0.21))
    # 4 rows, all negative: exact sign-flip p = 2/16, sign test p = 2 * (1/2)^4
    assert allr["p_perm"] == pytest.approx(2 / 16) and allr["p_sign"] == pytest.approx(2 / 16)
    assert allr["n_rows"] == 4 and allr["n_seeds"] == 3 and allr["verdict"] == "reproduced"
    hin = ce.row(1, named=True)
    assert hin["n_rows"] == 2 and hin["p_perm"] == pytest.approx(0.5) and hin["p_sign"] == pytest.approx(0.5)
    kl = df.filter((pl.col("metric") == "kl") & (pl.col("lang") == "all")).row(0, named=True)
    assert kl["effect"] == pytest.approx(-0.021)
    with pytest.raises(HybridlabError, match="baseline placement 'reverse_periodic'"):
        U.placement_tests_table(_rows(), baseline="reverse_periodic")


def test_placement_tests_one_seed_is_inconclusive():
    r = U.placement_tests_table(_rows(diffs=(0.5,))).row(0, named=True)
    assert r["effect"] == pytest.approx(-0.5) and math.isnan(r["effect_lo"]) and r["verdict"] == "inconclusive"


def _distill(seeds=(0, 1)):
    """Linear toy curves at tokens 0..400: baseline 5 -> 1, sandwich 4 -> 0, endpoint_spread 0.9 -> 0.5."""
    frames = {}
    curves = {"standard_periodic": [5, 4, 3, 2, 1], "sandwich": [4, 3, 2, 1, 0],
              "endpoint_spread": [0.9, 0.8, 0.7, 0.6, 0.5]}
    for s in seeds:
        for p, ys in curves.items():
            frames[f"seed{s}/t/{p}-gdn"] = pl.DataFrame({"step": [0, 1, 2, 3, 4], "tokens": [0, 100, 200, 300, 400],
                                                         "eval/ce": [float(y) for y in ys], "eval/kl": [0.1] * 5})
    return plot_tables.concat_runs(frames)


def test_concat_runs_splits_the_seed_prefix():
    d = _distill()
    assert sorted(d["seed"].unique().to_list()) == [0, 1]
    assert sorted(d["run"].unique().to_list()) == ["t/endpoint_spread-gdn", "t/sandwich-gdn", "t/standard_periodic-gdn"]
    assert plot_tables.split_seed("seed12/a/b") == ("a/b", 12)
    assert plot_tables.split_seed("seedling/x") == ("seedling/x", None)


def test_tokens_to_target_from_smoothed_curves_hand_computed():
    df = U.tokens_to_target_table(_distill())
    sw = df.filter(pl.col("placement") == "sandwich").sort("level")
    # a straight line is unchanged by the centred running mean; targets 5 - 4q: 3, 1.8, 1.4, 1 for q = .5 .8 .9 1
    assert sw["target"].to_list() == pytest.approx([3.0, 1.8, 1.4, 1.0])
    # baseline reaches them at 200, 320, 360, 400 tokens; sandwich (one lower) at 100, 220, 260, 300
    # stage 2 alone: the stage-2 fraction is the fraction
    assert sw["fraction_stage2"].to_list() == pytest.approx([0.5, 220 / 320, 260 / 360, 0.75])
    assert sw["fraction"].to_list() == pytest.approx(sw["fraction_stage2"].to_list())
    # identical seeds, none censored: a zero-width interval
    assert sw["fraction_stage2_lo"].to_list() == pytest.approx(sw["fraction_stage2"].to_list())
    assert sw["n_seeds"].to_list() == [2] * 4 and sw["n_reached"].to_list() == [2] * 4
    assert sw["status"].to_list() == ["measured"] * 4
    ep = df.filter(pl.col("placement") == "endpoint_spread")
    # already below every target at stage 2's first evaluation: censored, no value and no interval, bound 0
    assert ep["status"].to_list() == ["censored"] * 4 and ep["n_past_at_start"].to_list() == [2] * 4
    assert ep["n_reached"].to_list() == [0] * 4 and ep["bound_past"].to_list() == [0.0] * 4
    assert all(math.isnan(v) for v in ep["fraction_stage2"].to_list() + ep["fraction_stage2_lo"].to_list())
    base = df.filter(pl.col("placement") == "standard_periodic")
    assert base["fraction_stage2"].to_list() == pytest.approx([1.0] * 4)


def test_tokens_to_target_table_gives_no_interval_when_a_seed_is_censored():
    d = _distill()
    # seed 1's sandwich curve never comes down to the baseline's final 1.0: right-censored at 400 / 400 tokens
    never = (pl.col("seed") == 1) & (pl.col("run") == "t/sandwich-gdn")
    d = d.with_columns(pl.when(never).then(pl.col("eval/ce") + 2.0).otherwise(pl.col("eval/ce")).alias("eval/ce"))
    r = U.tokens_to_target_table(d).filter((pl.col("placement") == "sandwich") & (pl.col("level") == 1.0)).row(
        0, named=True)
    assert (r["n_seeds"], r["n_reached"], r["n_never"], r["status"]) == (2, 1, 1, "censored")
    assert r["fraction_stage2"] == pytest.approx(0.75) and r["bound_never"] == pytest.approx(1.0)
    assert math.isnan(r["fraction_stage2_lo"]) and math.isnan(r["fraction_stage2_hi"])


def _stage1(seeds=(0, 1)):
    """Stage-1 logs at tokens 0, 50, 100 ending where `_distill`'s stage 2 starts: every placement from 9."""
    frames = {}
    starts = {"standard_periodic": 5.0, "sandwich": 4.0, "endpoint_spread": 0.9}
    for s in seeds:
        for p, end in starts.items():
            frames[f"seed{s}/t/{p}-gdn"] = pl.DataFrame({"step": [0, 1, 2], "tokens": [0, 50, 100],
                                                         "eval/ce": [9.0, (9.0 + end) / 2, end]})
    return plot_tables.concat_runs(frames)


def test_tokens_to_target_over_both_stages_is_not_degenerate():
    joined = U.join_stages(_distill(), _stage1())
    ep = joined.filter((pl.col("run") == "t/endpoint_spread-gdn") & (pl.col("seed") == 0)).sort("tokens")
    # stage 2 shifted by stage 1's 100 tokens; its step-0 row sits on stage 1's last point (7 points, not 8)
    assert ep["tokens"].to_list() == [0, 50, 100, 100, 200, 300, 400, 500]
    assert ep["stage"].to_list() == [1, 1, 1, 2, 2, 2, 2, 2]
    df = U.tokens_to_target_table(_distill(), _stage1(), window=1)
    assert set(df["span"].to_list()) == {"stage1+2"}
    full = df.filter(pl.col("level") == 1.0)
    # baseline: 9 at 0 -> 7 at 50 -> 5 at 100, then 4, 3, 2, 1 at 200..500: s_0 - (s_0 - s_last) = 1 at 500 tokens
    assert full.filter(pl.col("placement") == "standard_periodic")["target"].item() == pytest.approx(1.0)
    # endpoint_spread: 9 -> 4.95 at 50 -> 0.9 at 100: crosses 1 at 50 + 50 * (4.95 - 1) / (4.95 - 0.9) tokens
    x = 50 + 50 * (4.95 - 1.0) / (4.95 - 0.9)
    # that is inside stage 1 (x < 100 tokens), so on stage-2 tokens the seed is past the target at its start
    assert x < 100
    r = full.filter(pl.col("placement") == "endpoint_spread").row(0, named=True)
    assert (r["status"], r["n_past_at_start"], r["bound_past"]) == ("censored", 2, 0.0) and math.isnan(r["fraction"])
    # sandwich: 9 -> 6.5 -> 4 at 100, then 3, 2, 1 at 200, 300, 400: two-stage 400 / 500, stage-2 300 / 400
    sw = full.filter(pl.col("placement") == "sandwich").row(0, named=True)
    assert sw["fraction"] == pytest.approx(400 / 500) and sw["fraction_stage2"] == pytest.approx(300 / 400)
    # at q = 0.5 the baseline's target (5) is its own stage-2 start: no stage-2 fraction is defined
    half = df.filter((pl.col("level") == 0.5) & (pl.col("placement") == "sandwich")).row(0, named=True)
    assert (half["status"], half["n_baseline_past"]) == ("undefined", 2)
    with pytest.raises(HybridlabError, match="no stage-1 metrics"):
        U.join_stages(_distill(), _stage1(seeds=(0,)))


def _score():
    rows = []
    for s in (0, 1):
        for arm in ("baseline", "freeze0-0.2"):
            for f in (0.5, 1.0):
                for layer, lt in ((0, "kda"), (1, "full_attention")):
                    if arm == "baseline":
                        v = (0.8 + 0.1 * s) if layer == 0 else 0.1
                    else:
                        v = 0.0 if layer == 0 else 0.9 + 0.05 * s
                    for g in (8, 32):
                        rows.append(dict(arm=arm, seed=s, step=int(f * 10), fraction=f, long_gap_fraction=0.0,
                                         layer=layer, layer_type=lt, gap=g, score=v if f == 1.0 else 0.0, n=4))
    return pl.DataFrame(rows)


def test_retrieval_score_table_seed_interval():
    df = U.retrieval_score_table(_score())
    b0 = df.filter((pl.col("arm") == "baseline") & (pl.col("layer") == 0)).row(0, named=True)
    half = T975_1 * math.sqrt(0.005) / math.sqrt(2)  # seeds 0.8, 0.9: sd sqrt(0.005)
    assert b0["score"] == pytest.approx(0.85) and b0["n_seeds"] == 2
    assert (b0["score_lo"], b0["score_hi"]) == pytest.approx((0.85 - half, 0.85 + half))
    # an undefined gap (NaN: the model does not tell A from B there) is left out of the mean over gaps
    s = _score()
    s = s.with_columns(score=pl.when((pl.col("seed") == 1) & (pl.col("gap") == 8) & (pl.col("arm") == "baseline"))
                       .then(float("nan")).otherwise(pl.col("score")))
    b0 = U.retrieval_score_table(s).filter((pl.col("arm") == "baseline") & (pl.col("layer") == 0)).row(0, named=True)
    assert b0["score"] == pytest.approx(0.85) and b0["n_seeds"] == 2


def _nl_runs(diffs=(-0.2, -0.19, -0.21)):
    frames = {}
    for s, d in enumerate(diffs):
        for v, ce in (("baseline", 5.0 + 0.1 * s), ("bld", 5.0 + 0.1 * s + d)):
            frames[f"seed{s}/kda-{v}"] = pl.DataFrame({"step": [1, 2], "tokens": [10, 20], "loss": [6.0, 5.5],
                                                       "eval/ce": [6.0, ce]})
    return plot_tables.concat_runs(frames)


def test_bld_nl_table_paired_over_seeds():
    summary = pl.DataFrame([dict(model=f"kda-{v}", mixer="kda", size="xs", variant=v, ppl=1.0, long_ppl=1.0,
                                 n_key_tokens=1, evaluator="kda-baseline") for v in ("baseline", "bld")])
    df = plot_tables.bld_nl_table(_nl_runs(), summary)
    bld = df.filter(pl.col("variant") == "bld").row(0, named=True)
    half = T975_2 * 0.01 / math.sqrt(3)
    assert bld["ce_vs_baseline"] == pytest.approx(-0.2) and bld["n_seeds"] == 3
    assert (bld["ce_vs_baseline_lo"], bld["ce_vs_baseline_hi"]) == pytest.approx((-0.2 - half, -0.2 + half))
    assert bld["p_sign"] == pytest.approx(0.25)  # 3 of 3 negative: 2 / 8
    base = df.filter(pl.col("variant") == "baseline").row(0, named=True)
    assert base["final_eval_ce"] == pytest.approx(5.1) and base["ce_vs_baseline"] == pytest.approx(0.0)


def test_perplexity_and_kl_tables_pair_seeds():
    rows = []
    for s in (0, 1, 2):
        for p, (ppl, kl) in {"standard_periodic": (20.0, 0.4), "sandwich": (16.0 + s, 0.1 + 0.1 * s)}.items():
            rows.append(dict(model=f"t/{p}-gdn", teacher="t", placement=p, mixer="gdn", seed=s, lang="hin_Deva",
                             n_tokens=10, ce=1.0, ppl=ppl, kl=kl))
    rows.append(dict(model="t", teacher="t", placement=None, mixer=None, seed=None, lang="hin_Deva", n_tokens=10,
                     ce=1.0, ppl=10.0, kl=None))
    ppl = pl.DataFrame(rows)
    t = plot_tables.perplexity_table(ppl).row(0, named=True)
    # per seed 16/20 - 1, 17/20 - 1, 18/20 - 1 = -0.2, -0.15, -0.1: mean -0.15, sd 0.05
    half = T975_2 * 0.05 / math.sqrt(3)
    assert t["sandwich"] == pytest.approx(17.0) and t["best_placement"] == "sandwich"
    assert t["best_vs_baseline"] == pytest.approx(-0.15) and t["n_seeds"] == 3
    assert (t["best_vs_baseline_lo"], t["best_vs_baseline_hi"]) == pytest.approx((-0.15 - half, -0.15 + half))
    k = plot_tables.kl_reduction_table(ppl).row(0, named=True)
    # 1 - (0.1, 0.2, 0.3) / 0.4 = 0.75, 0.5, 0.25: mean 0.5, sd 0.25
    half = T975_2 * 0.25 / math.sqrt(3)
    assert k["kl_reduction"] == pytest.approx(0.5)
    assert (k["kl_reduction_lo"], k["kl_reduction_hi"]) == pytest.approx((0.5 - half, 0.5 + half))


def test_niah_cells_wilson():
    df = pl.DataFrame([dict(pair="p", role="hybrid", lang="eng_Latn", task=t, context_tokens=64, n=5, accuracy=a,
                            seconds=0.1, oom=False) for t, a in (("a", 0.8), ("b", 0.8))])
    c = figures.niah_cells(df).row(0, named=True)
    assert (c["k"], c["n"]) == (8, 10)
    assert (c["accuracy_lo"], c["accuracy_hi"]) == pytest.approx((0.4902, 0.9433), abs=1e-4)  # 8/10


def test_sr_accuracy_table_last_eval_over_seeds():
    frames = {f"seed{s}/baseline": pl.DataFrame({"step": [1, 2], "eval/acc/gap8": [0.1, 0.5 + 0.1 * s]})
              for s in (0, 1)}
    r = U.sr_accuracy_table(plot_tables.concat_runs(frames)).row(0, named=True)
    assert (r["arm"], r["gap"], r["n_seeds"]) == ("baseline", 8, 2) and r["accuracy"] == pytest.approx(0.55)


def test_sr_accuracy_interval_is_clipped_to_the_accuracy_range():
    # seeds 1.0, 1.0, 0.4: mean 0.8, sd sqrt(0.12), t-interval 0.8 -+ 4.303 * 0.3464 / sqrt(3) = [-0.06, 1.66]
    frames = {f"seed{s}/baseline": pl.DataFrame({"step": [1, 2], "eval/acc/gap8": [0.1, acc]})
              for s, acc in enumerate((1.0, 1.0, 0.4))}
    r = U.sr_accuracy_table(plot_tables.concat_runs(frames)).row(0, named=True)
    assert r["accuracy"] == pytest.approx(0.8) and (r["accuracy_lo"], r["accuracy_hi"]) == (0.0, 1.0)
    frames["seed2/baseline"] = pl.DataFrame({"step": [1, 2], "eval/acc/gap8": [0.1, 0.98]})
    r = U.sr_accuracy_table(plot_tables.concat_runs(frames)).row(0, named=True)
    half = 4.302653 * math.sqrt(((1 - 0.99333) ** 2 * 2 + (0.98 - 0.99333) ** 2) / 2) / math.sqrt(3)
    assert r["accuracy_lo"] == pytest.approx(0.99333 - half, abs=1e-4) and r["accuracy_hi"] == 1.0


def test_findings_table_effects_cis_and_verdicts():
    from test_plots import _niah, _softcka

    sr_runs = plot_tables.concat_runs({f"seed{s}/{a}": pl.DataFrame({"step": [1, 2],
                                                                     "eval/acc/gap8": [0.1, acc + 0.01 * s]})
                                       for s in (0, 1) for a, acc in (("baseline", 0.9), ("freeze0-0.2", 1.0))})
    # analysis pairs named as the DAG names a distilled pair (the hybrid is named after it): the seed rule applies
    dag = pl.col("pair").str.replace(" vs ", "/")
    df = findings.findings_table(_rows(), _distill(), _softcka().with_columns(pair=dag),
                                 _niah().with_columns(pair=dag), _score(), sr_runs, _nl_runs())
    assert set(df.columns) == set(findings.COLUMNS)
    assert set(df["verdict"]) <= {"reproduced", "contradicted", "inconclusive"}
    by = {(r["finding"], r["comparison"]): r for r in df.iter_rows(named=True)}

    def get(finding_start, comparison_part):
        (row,) = [r for (f, c), r in by.items() if f.startswith(finding_start) and comparison_part in c]
        return row

    ce = get("an FA-first placement has lower", "sandwich")
    assert ce["effect"] == pytest.approx(-0.21) and ce["verdict"] == "reproduced" and ce["p_value"] == pytest.approx(0.125)
    tt = get("FA-first placements reach", "sandwich")
    assert tt["effect"] == pytest.approx(-0.25) and tt["n_seeds"] == 2  # fraction 0.75 at the final-loss target
    ep = get("FA-first placements reach", "endpoint_spread")
    # both seeds already past the target at their first evaluation: censored, no effect or interval, no verdict
    assert math.isnan(ep["effect"]) and math.isnan(ep["ci_lo"]) and ep["verdict"] == "inconclusive"
    assert ep["n_seeds"] == 2 and ep["n_censored"] == 2 and "censored" in ep["note"] and "upper bound" in ep["note"]
    comp = get("without BLD", "baseline")
    half = T975_1 * math.sqrt(0.005) / math.sqrt(2)
    assert comp["effect"] == pytest.approx(0.75) and (comp["ci_lo"], comp["ci_hi"]) == pytest.approx((0.75 - half, 0.75 + half))
    assert comp["verdict"] == "reproduced"
    mv = get("freezing the recurrent layers early", "freeze0-0.2")
    assert mv["effect"] == pytest.approx(0.825) and mv["verdict"] == "reproduced"
    acc = get("freezing the recurrent layers before the takeover", "freeze0-0.2")
    assert acc["effect"] == pytest.approx(0.1) and acc["expected"] == "+"  # frozen from update 0, takeover at 10
    nl = get("BLD lowers", "kda")
    half = T975_2 * 0.01 / math.sqrt(3)
    assert nl["effect"] == pytest.approx(-0.2) and (nl["ci_lo"], nl["ci_hi"]) == pytest.approx((-0.2 - half, -0.2 + half))
    assert nl["verdict"] == "reproduced"
    # one seed's models (SoftCKA, NIAH): inconclusive whatever the interval over languages / examples
    (sc,) = [r for (f, c), r in by.items() if c == "teacher/sp-gdn"
             and f == "the largest SoftCKA change across layers is at the hybrid's first FA layer"]
    assert sc["effect"] == pytest.approx(0.0) and sc["verdict"] == "inconclusive" and "one seed" in sc["note"]
    ni = get("hybrids degrade less", "teacher/sp-gdn")
    # synthetic NIAH: the dense model runs out of memory at 256, so the length effect is read on the cells both
    # completed (an OOM is its own outcome, not a wrong answer): no change with length for either model
    assert ni["effect"] == pytest.approx(0.0) and ni["verdict"] == "inconclusive" and "one seed" in ni["note"]


def test_decide_needs_two_seeds():
    assert findings.decide(-0.1, -0.2, -0.05, -1, 2) == ("reproduced", "")
    assert findings.decide(-0.1, -0.2, -0.05, +1, 3) == ("contradicted", "")
    assert findings.decide(-0.1, -0.2, 0.05, -1, 3) == ("inconclusive", "")
    assert findings.decide(-0.1, -0.2, -0.05, -1, 1) == ("inconclusive", "one seed")


def test_readme_splice_is_exact_and_idempotent(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    readme = tmp_path / "README.md"
    readme.write_text(f"# x\n\n{findings.BEGIN}\nold\n{findings.END}\n\nafter\n")
    table = tmp_path / "table_findings.md"
    table.write_text("| a | b |\n|---|---|\n| 1 | 2 |\n")
    script = Path(__file__).resolve().parents[2] / "workflow_scripts/readme_findings.py"
    for _ in range(2):
        r = subprocess.run([sys.executable, str(script), "--table", str(table), "--readme", str(readme)],
                           capture_output=True, text=True)
        assert r.returncode == 0, r.stderr
    text = readme.read_text()
    assert "old" not in text and "| 1 | 2 |" in text and text.endswith("\n\nafter\n") and text.count("| a |") == 1
    readme.write_text("no markers\n")
    r = subprocess.run([sys.executable, str(script), "--table", str(table), "--readme", str(readme)],
                       capture_output=True, text=True)
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and "needs exactly one" in r.stderr


def test_readme_counts_view_counts_each_findings_verdicts(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    rows = [("multi", "f1", "reproduced"), ("multi", "f1", "inconclusive"), ("multi", "f1", "inconclusive"),
            ("bld", "f2", "contradicted")]
    table = tmp_path / "table_findings.csv"
    pl.DataFrame(rows, schema=["study", "finding", "verdict"], orient="row").write_csv(table)
    page = tmp_path / "results.md"
    page.write_text(f"{findings.BEGIN}\n{findings.END}\n")
    script = Path(__file__).resolve().parents[2] / "workflow_scripts/readme_findings.py"
    r = subprocess.run([sys.executable, str(script), "--table", str(table), "--readme", str(page), "--view", "counts",
                        "--about", "from make all at commit abc1234"], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    text = page.read_text()
    assert "| multi | f1 | 1 reproduced, 2 inconclusive |" in text and "| bld | f2 | 1 contradicted |" in text
    assert f"_Generated from `{table}` from make all at commit abc1234; do not edit by hand._" in text


def test_softcka_sentence_bootstrap():
    import torch

    from hybridlab.eval.softcka import cka_bootstrap, cka_from_grams, soft_cka

    g = torch.Generator().manual_seed(0)
    X = torch.randn(12, 5, generator=g, dtype=torch.float64)
    K = X @ X.T
    same = cka_bootstrap(K, K, 200)
    assert same.estimate == pytest.approx(1.0) and (same.lo, same.hi) == pytest.approx((1.0, 1.0))
    L = K + 0.5 * torch.eye(12, dtype=torch.float64)
    ci = cka_bootstrap(L, K, 200, seed=3)
    assert ci.estimate == pytest.approx(cka_from_grams(L, K)) and ci.lo <= ci.hi <= 1.0
    # the same sentence indices for both Grams: a resample duplicating sentences of identical Grams stays 1
    sets = [torch.randn(3, 4, generator=g) for _ in range(10)]
    r = soft_cka(sets, sets, n_boot=100)
    assert (r.cka_lo, r.cka_hi) == pytest.approx((1.0, 1.0)) and r.alignment_lo == pytest.approx(1.0)
    assert math.isnan(soft_cka(sets, sets).cka_lo)  # n_boot 0: no interval


def test_softcka_first_fa_table_carries_the_bootstrap():
    from test_plots import _softcka

    t = plot_tables.softcka_first_fa_table(_softcka().with_columns(cka_lo=pl.col("cka") - 0.01,
                                                                   cka_hi=pl.col("cka") + 0.02))
    row = t.filter((pl.col("role") == "hybrid") & (pl.col("lang") == "rus_Cyrl")).row(0, named=True)
    assert (row["cka_after_lo"], row["cka_after_hi"]) == pytest.approx((0.64, 0.67))
    assert (row["cka_before_lo"], row["cka_before_hi"]) == pytest.approx((0.74, 0.77))
    assert math.isnan(row["alignment_after_lo"])  # no alignment bootstrap in this table


def test_figures_draw_uncertainty():
    from matplotlib.collections import PolyCollection

    from test_plots import _niah, _softcka

    def bands(fig):
        return sum(isinstance(c, PolyCollection) for ax in fig.axes for c in ax.collections)

    soft = _softcka().with_columns(cka_lo=pl.col("cka") - 0.01, cka_hi=pl.col("cka") + 0.01)
    assert bands(figures.softcka_pairs(soft)) == 4  # 2 languages x hybrid / dense, in the CKA panel
    both = soft.with_columns(alignment_lo=pl.col("alignment") - 0.01, alignment_hi=pl.col("alignment") + 0.01)
    fig = figures.softcka_pairs(both)
    assert bands(fig) == 8  # and in the alignment panel above it
    assert [ax.get_ylabel() for ax in fig.axes if ax.get_visible()] == [figures.SOFTCKA_LABELS["alignment"],
                                                                        figures.SOFTCKA_LABELS["cka"]]
    assert bands(figures.softcka_pairs(_softcka())) == 0
    # three seeds of the same two curves: one band per placement and panel (CE, KL)
    assert bands(figures.distill_curves(_distill(seeds=(0, 1, 2)))) >= 2
    fig = figures.niah(_niah())
    assert any(c.__class__.__name__ == "LineCollection" for c in fig.axes[0].collections)  # Wilson error bars
    from test_plots import _fertility

    fert = _fertility().with_columns(relative_to_english_lo=pl.col("relative_to_english") - 0.1,
                                     relative_to_english_hi=pl.col("relative_to_english") + 0.1)
    from test_plots import _heads

    alphas, curve = _heads()
    fig = figures.retrieval_heads(alphas, curve.with_columns(n=pl.lit(4)))
    assert sum(c.__class__.__name__ == "LineCollection" for c in fig.axes[1].collections) == 2  # one per model
    ax = figures.fertility(fert).axes[0]
    assert sum(c.__class__.__name__ == "LineCollection" for c in ax.collections) == fert.height  # one bar each


def test_position_loss_window_bootstrap_hand_computed():
    import torch

    from hybridlab.eval.position_loss import window_bootstrap

    # two windows with token-mean NLL 1 and 3 (equal lengths): resamples give means 1, 2 or 3, the extremes
    # with probability 1/4 each, so the 95 % interval of ppl is (e^1, e^3); the key tokens lie in window 2 only
    nll = torch.tensor([[1.0, 1.0], [3.0, 3.0]])
    mask = torch.tensor([[False, False], [True, False]])
    (plo, phi), (klo, khi) = window_bootstrap(nll, mask, n_boot=2000)
    assert (plo, phi) == pytest.approx((math.e, math.e ** 3))
    assert (klo, khi) == pytest.approx((math.e ** 3, math.e ** 3))  # replicates without window 2 are dropped
    assert all(math.isnan(x) for x in sum(window_bootstrap(nll[:1], mask[:1]), ()))

"""The further multilinguality findings (hybridlab.plots.findings_multi), one test per verdict rule on small
hand-made tables with the columns the real tables have (softcka, recency, fertility, niah, perplexity_rows)."""

import math

import numpy as np
import polars as pl
import pytest

from hybridlab.eval import stats
from hybridlab.plots import findings, registry
from hybridlab.plots import findings_multi as M
from hybridlab.plots import uncertainty as U

from test_findings_verdicts import HYB_T, LANGS6, _one, _softcka_table, _sr_runs
from test_plots import _niah, _softcka
from test_uncertainty_tables import _distill, _nl_runs, _rows, _score, _stage1

HUB = [("hub", "hybrid", "org/hybrid", HYB_T), ("hub", "dense", "org/dense", ["full_attention"] * 5)]
DAG = [("t/sandwich-gdn", "hybrid", "t/sandwich-gdn", HYB_T), ("t/sandwich-gdn", "dense", "t", ["full_attention"] * 5)]


def _attn_delta(pairs, value):
    """softcka attn_delta rows: decoder layer l carries its own type; value(model, lang, layer) -> alignment."""
    rows = []
    for pair, role, model, types in pairs:
        for layer, t in enumerate(types):
            for lang in LANGS6:
                a = value(model, lang, layer)
                rows.append(dict(model=model, pair=pair, role=role, kind="attn_delta", layer=layer, layer_type=t,
                                 lang=lang, alignment=a, cka=0.5))
    return pl.DataFrame(rows)


def test_attn_delta_row_asks_whether_the_first_fa_output_is_the_most_extreme_layer():
    # first FA = decoder layer 2: 0.9 + 0.01 i there, 0.5 elsewhere (median 0.5): margin 0.4 + 0.01 i, mean 0.425
    def spike(model, lang, layer):
        return 0.9 + 0.01 * LANGS6.index(lang) if layer == 2 else 0.5

    rows = {r["comparison"]: r for r in M.attn_delta_rows(_attn_delta(HUB + DAG, spike))}
    hub = rows["hub"]
    assert hub["effect"] == pytest.approx(0.425) and hub["ci_lo"] > 0 and hub["verdict"] == "reproduced"
    assert hub["n_seeds"] == 0 and "in 6 of 6 languages" in hub["note"] and "decoder layer 2" in hub["effect_definition"]
    dag = rows["t/sandwich-gdn"]
    assert dag["effect"] == pytest.approx(0.425) and dag["verdict"] == "inconclusive" and "one seed" in dag["note"]

    # a larger spike at a recurrent layer: the first FA output is not the extreme one (0.4 - 0.6 per language)
    def elsewhere(model, lang, layer):
        return {2: 0.9, 3: 1.1}.get(layer, 0.5)

    hub = {r["comparison"]: r for r in M.attn_delta_rows(_attn_delta(HUB, elsewhere))}["hub"]
    assert hub["effect"] == pytest.approx(-0.2) and hub["verdict"] == "contradicted"
    # a hybrid without an FA layer is a note, never a verdict
    nofa = [("x", "hybrid", "org/x", ["gdn"] * 4), ("x", "dense", "org/xd", ["full_attention"] * 4)]
    r = M.attn_delta_rows(_attn_delta(nofa, spike))[0]
    assert r["verdict"] == "inconclusive" and math.isnan(r["effect"]) and "no full-attention layer" in r["note"]


SWA_T = ["sliding_attention", "sliding_attention", "full_attention", "sliding_attention", "full_attention"]


def test_sliding_window_models_are_tested_for_no_reorganisation():
    swa = [("swa-hub", "hybrid", "org/swa", SWA_T)]
    # the largest change (0.3) at a sliding layer (hidden row 1), 0.02 at the first global layer (row 3): -0.28
    sc = _softcka_table(swa, lambda m, lang, layer: ([0.5, 0.8, 0.8, 0.82, 0.82, 0.82][layer], 0.5))
    (r,) = M.swa_rows(sc)
    assert r["comparison"] == "swa-hub" and r["expected"] == "-" and r["effect"] == pytest.approx(-0.28)
    assert r["verdict"] == "reproduced" and r["note"].startswith("fixed published models: interval over languages")
    # a jump at the first global layer (row 3) is the reorganisation the study does not see in SWA models
    sc = _softcka_table(swa, lambda m, lang, layer: ([0.5, 0.5, 0.5, 0.9, 0.9, 0.9][layer], 0.5))
    (r,) = M.swa_rows(sc)
    assert r["effect"] == pytest.approx(0.4) and r["verdict"] == "contradicted"
    # in the full table the SWA pair has this row and no hybrid first-FA row (expected + for hybrids)
    df = findings.findings_table(_rows(), _distill(), pl.concat([_softcka(), sc], how="diagonal_relaxed"), _niah(),
                                 None, None, None)
    assert _one(df, M.SWA_FLAT, "swa-hub")["verdict"] == "contradicted"
    assert not df.filter((pl.col("comparison") == "swa-hub") & pl.col("finding").str.starts_with("the largest")).height


def _recency(pairs, mass, windows=(4, 16), langs=("eng_Latn", "fra_Latn", "zho_Hans")):
    """recency rows: pairs = [(pair, role, model, FA layers)], mass(model, lang, layer, window) per head 0, 1."""
    rows = []
    for pair, role, model, layers in pairs:
        for lang in langs:
            for layer in layers:
                for head in (0, 1):
                    for w in windows:
                        rows.append(dict(model=model, pair=pair, role=role, lang=lang, layer=layer, head=head,
                                         window=w, mass=mass(model, lang, layer, w)))
    return pl.DataFrame(rows)


def test_recency_compares_fa_layers_at_the_same_depth_and_the_smallest_window():
    langs = ["eng_Latn", "fra_Latn", "zho_Hans"]

    def mass(model, lang, layer, w):
        if w != 4:
            return 0.0  # the larger window is not read
        if model == "org/hybrid":
            return 0.6 + 0.01 * langs.index(lang)
        return 0.4 if layer in (2, 4) else 0.9  # dense: 0.4 at the hybrid's FA depths, 0.9 elsewhere

    pairs = [("hub", "hybrid", "org/hybrid", [2, 4]), ("hub", "dense", "org/dense", [0, 1, 2, 3, 4]),
             ("swa", "hybrid", "org/swa", [1])]
    rows = {r["comparison"]: r for r in M.recency_rows(_recency(pairs, mass))}
    r = rows["hub"]
    assert r["effect"] == pytest.approx(0.21) and r["verdict"] == "reproduced" and "window 4" in r["note"]
    assert "same layers" in r["note"]
    assert rows["swa"]["verdict"] == "inconclusive" and "no dense model" in rows["swa"]["note"]
    # a dense model without the hybrid's layer 4: all its layers are compared (mean 0.7), and the note says so
    pairs[1] = ("hub", "dense", "org/dense", [0, 1, 2, 3])
    r = {x["comparison"]: x for x in M.recency_rows(_recency(pairs, mass))}["hub"]
    assert r["effect"] == pytest.approx(0.61 - (0.4 + 0.9 * 3) / 4) and "lacks some" in r["note"]


def _fertility(rows):
    return pl.DataFrame([dict(tokenizer=t, lang=lang, n_sentences=100, tokens_per_sentence=20.0 * r,
                              relative_to_english=r, mean_sentence_ratio=r, relative_to_english_lo=lo,
                              relative_to_english_hi=hi) for t, lang, r, lo, hi in rows])


def test_fertility_rows_decide_from_the_sentence_interval_of_a_fixed_tokenizer():
    tab = _fertility([("Qwen/Qwen3.5-4B-Base", "eng_Latn", 1.0, 1.0, 1.0),
                      ("Qwen/Qwen3.5-4B-Base", "yor_Latn", 2.6, 2.4, 2.8),
                      ("Qwen/Qwen3.5-4B-Base", "amh_Ethi", 3.0, 2.8, 3.3),
                      ("allenai/Olmo-Hybrid-7B", "eng_Latn", 1.0, 1.0, 1.0),
                      ("allenai/Olmo-Hybrid-7B", "amh_Ethi", 10.5, 9.0, 12.0),
                      ("project", "eng_Latn", 1.0, 1.0, 1.0), ("project", "yor_Latn", 1.05, 0.97, 1.12),
                      ("utf8_bytes", "amh_Ethi", 2.5, 2.4, 2.6)])
    rows = {(r["finding"], r["comparison"]): r for r in M.fertility_rows(tab)}
    assert not [k for k in rows if "utf8_bytes" in k[1]]  # the byte reference is not a model's tokenizer
    y = rows[M.FERTILITY_YOR, "tokenizer Qwen/Qwen3.5-4B-Base: yor_Latn"]
    assert (y["effect"], y["ci_lo"], y["ci_hi"]) == pytest.approx((1.6, 1.4, 1.8)) and y["verdict"] == "reproduced"
    assert y["n_seeds"] == 0 and "contains the study's 2.60" in y["note"] and y["note"].startswith("fixed tokenizer")
    top = rows[M.FERTILITY_MAX, "tokenizer allenai/Olmo-Hybrid-7B: amh_Ethi"]
    assert top["effect"] == pytest.approx(9.5) and "contains the study's 10.00" in top["note"]
    assert rows[M.FERTILITY_MAX, "tokenizer Qwen/Qwen3.5-4B-Base: amh_Ethi"]["effect"] == pytest.approx(2.0)
    # an interval reaching 1 (no extra cost) is not a reproduction; no interval (n_boot 0) is no verdict
    assert rows[M.FERTILITY_YOR, "tokenizer project: yor_Latn"]["verdict"] == "inconclusive"
    nan = M.fertility_rows(_fertility([("t", "eng_Latn", 1.0, 1.0, 1.0), ("t", "yor_Latn", 3.0, math.nan, math.nan)]))
    assert {r["verdict"] for r in nan} == {"inconclusive"}


def _niah_cells(cells):
    """niah summary rows of pair `hub`: {(role, lang, task, ctx): (n completed, n_oom, seconds)}."""
    return pl.DataFrame([dict(model="org/hybrid" if role == "hybrid" else "org/dense", pair="hub", role=role,
                              lang=lang, task=task, context_tokens=ctx, n=n, accuracy=1.0 if n else None, n_oom=n_oom,
                              oom=n_oom > 0, oom_rate=n_oom / (n + n_oom), seconds=sec)
                         for (role, lang, task, ctx), (n, n_oom, sec) in cells.items()])


def test_niah_runtime_uses_the_longest_context_both_models_completed():
    cells = {("hybrid", "eng", "single", 1024): (2, 0, 1.0), ("dense", "eng", "single", 1024): (2, 0, 1.0),
             ("hybrid", "eng", "single", 4096): (2, 0, 2.0), ("dense", "eng", "single", 4096): (2, 0, 8.0),
             ("hybrid", "eng", "none", 4096): (2, 0, 1.0), ("dense", "eng", "none", 4096): (2, 0, 3.0),
             # an OOM cell is left out (its time is the time to fail)
             ("hybrid", "fra", "single", 4096): (2, 0, 1.0), ("dense", "fra", "single", 4096): (1, 1, 0.5)}
    (r,) = M.niah_runtime_rows(_niah_cells(cells))
    logs = [math.log(2 / 8), math.log(1 / 3)]
    assert r["effect"] == pytest.approx(np.mean(logs)) and logs[0] <= r["ci_lo"] <= r["ci_hi"] <= logs[1]
    assert r["verdict"] == "reproduced" and "at 4096 tokens over 2 cells" in r["note"]
    # every 4096 cell with an OOM: the row falls back to 1024, where the two are equally fast
    cells[("dense", "eng", "single", 4096)] = (1, 1, 8.0)
    cells[("dense", "eng", "none", 4096)] = (1, 1, 3.0)
    (r,) = M.niah_runtime_rows(_niah_cells(cells))
    assert r["effect"] == pytest.approx(0.0) and "1024" in r["effect_definition"] and r["verdict"] == "inconclusive"


def _kl_rows(reductions, seeds=(0, 1, 2), placements=("standard_periodic", "sandwich")):
    """perplexity_rows: reductions = {teacher: {lang: r}}; the baseline's KL is 1 on every row, the sandwich's
    1 - r (one row of 10 tokens per language, CE unused)."""
    out = []
    for t, red in reductions.items():
        for s in seeds:
            for i, (lang, r) in enumerate(red.items()):
                for p in placements:
                    kl = 1.0 if p == "standard_periodic" else 1.0 - r
                    out.append(dict(model=f"{t}/{p}-gdn", teacher=t, placement=p, mixer="gdn", seed=s, lang=lang,
                                    row=i, n_tokens=10, ce=2.0, kl=kl))
    return pl.DataFrame(out)


LANGS16 = [f"x{i:02d}_Latn" for i in range(16)]


def test_top_kl_languages_overlap_between_teachers_against_chance():
    assert M.hypergeometric_tail(1, 4, 2) == pytest.approx(5 / 6)
    assert M.hypergeometric_tail(8, 16, 8) == pytest.approx(1 / math.comb(16, 8))
    same = {lang: 0.01 * i for i, lang in enumerate(LANGS16)}
    rows = _kl_rows({"A": same, "B": {k: v + 0.5 for k, v in same.items()}})
    (r,) = M.top_kl_rows(rows, "standard_periodic")
    # top 8 identical in every seed: share 1 - chance 8/16
    assert r["effect"] == pytest.approx(0.5) and r["verdict"] == "reproduced" and r["n_seeds"] == 3
    assert r["p_value"] == pytest.approx(1 / 12870) and "8 of 8 shared" in r["note"]
    rows = _kl_rows({"A": same, "B": {k: -v for k, v in same.items()}})
    (r,) = M.top_kl_rows(rows, "standard_periodic")
    assert r["effect"] == pytest.approx(-0.5) and r["verdict"] == "contradicted" and "0 of 8 shared" in r["note"]
    # one seed: the seed rule keeps it open; one teacher: no row
    (r,) = M.top_kl_rows(_kl_rows({"A": same, "B": same}, seeds=(0,)), "standard_periodic")
    assert r["verdict"] == "inconclusive" and "one seed" in r["note"]
    assert M.top_kl_rows(_kl_rows({"A": same}), "standard_periodic") == []


def test_non_latin_gain_is_a_difference_of_script_means_over_seeds():
    out = []
    for s in range(3):
        red = {"eng_Latn": 0.9, "fra_Latn": 0.1, "swh_Latn": 0.1, "hin_Deva": 0.3 + 0.01 * s,
               "zho_Hans": 0.3 + 0.01 * s, "tel_Telu": 0.3 + 0.01 * s}
        out.append(_kl_rows({"t": red}, seeds=(s,)))
    (r,) = M.non_latin_rows(pl.concat(out), "standard_periodic")
    # per seed 0.2 + 0.01 s (English left out): mean 0.21, t-interval +- t(0.975, 2) 0.01 / sqrt(3)
    half = stats.t_quantile(0.975, 2) * 0.01 / math.sqrt(3)
    assert r["effect"] == pytest.approx(0.21) and (r["ci_lo"], r["ci_hi"]) == pytest.approx((0.21 - half, 0.21 + half))
    assert r["verdict"] == "reproduced" and "3 non-Latin and 2 Latin-script" in r["note"]
    (r,) = M.non_latin_rows(_kl_rows({"t": {"hin_Deva": 0.3, "zho_Hans": 0.2}}), "standard_periodic")
    assert r["verdict"] == "inconclusive" and math.isnan(r["effect"]) and "0 Latin-script" in r["note"]


def _teacher_rows(rev_by_seed, others=(("standard_periodic", 2.10), ("sandwich", 2.06)), seeds=(0, 1, 2),
                  langs=("eng_Latn", *LANGS6)):
    """perplexity_rows: the teacher's CE 2.0 on every row (placement and seed null), the other placements' as
    given, reverse periodic's rev_by_seed[s]; one 10-token row per language."""
    out = [dict(model="t", teacher="t", placement=None, mixer=None, seed=None, lang=lang, row=i, n_tokens=10,
                ce=2.0, kl=None) for i, lang in enumerate(langs)]
    for s in seeds:
        for p, ce in (*others, ("reverse_periodic", rev_by_seed[s])):
            out += [dict(model=f"t/{p}-gdn", teacher="t", placement=p, mixer="gdn", seed=s, lang=lang, row=i,
                         n_tokens=10, ce=ce, kl=0.1) for i, lang in enumerate(langs)]
    return pl.DataFrame(out)


def test_reverse_periodic_against_the_teacher():
    rev = {0: 2.005, 1: 2.006, 2: 2.007}
    rows = {r["finding"]: r for r in M.reverse_teacher_rows(_teacher_rows(rev))}
    gap = rows[M.REV_GAP]
    # gaps 0.005..0.007 minus 0.01: mean -0.004, every seed below the study's 0.01
    assert gap["effect"] == pytest.approx(-0.004) and gap["ci_hi"] < 0 and gap["verdict"] == "reproduced"
    closer = rows[M.REV_CLOSER]
    # the other placements' mean gap is 0.08: 1 - gap / 0.08 per seed
    assert closer["effect"] == pytest.approx(np.mean([1 - g / 0.08 for g in (0.005, 0.006, 0.007)]))
    assert closer["verdict"] == "reproduced" and "lies above the study's 0.10" in closer["note"]
    low = rows[M.REV_LOWEST]
    ci = stats.clopper_pearson_interval(6, 6)
    assert (low["effect"], low["ci_lo"]) == pytest.approx((1 - 1 / 3, ci.lo - 1 / 3)) and low["verdict"] == "reproduced"
    assert "lowest in 6 of 6 languages (study: 16 of 26" in low["note"]
    # 0.03 nat behind the teacher: contradicted; one seed: inconclusive
    far = {r["finding"]: r for r in M.reverse_teacher_rows(_teacher_rows({0: 2.03, 1: 2.031, 2: 2.032}))}
    assert far[M.REV_GAP]["verdict"] == "contradicted"
    one = {r["finding"]: r for r in M.reverse_teacher_rows(_teacher_rows(rev, seeds=(0,)))}
    assert {one[f]["verdict"] for f in (M.REV_GAP, M.REV_CLOSER, M.REV_LOWEST)} == {"inconclusive"}
    # without reverse periodic (e.g. the rehearsal's placements) there is no row
    assert M.reverse_teacher_rows(_rows()) == []


def test_the_registry_passes_recency_and_fertility_to_the_findings_table():
    fert = _fertility([("tok", "eng_Latn", 1.0, 1.0, 1.0), ("tok", "yor_Latn", 2.0, 1.8, 2.2)])
    tables = {"perplexity_rows": _rows(), "distill": _distill(), "softcka": _softcka(), "niah": _niah(),
              "retrieval_score": _score(), "bld_sr": _sr_runs(), "bld_nl": _nl_runs(), "distill_stage1": _stage1(),
              "fertility": fert}
    df = registry.render_table("table_findings", tables)
    assert _one(df, M.FERTILITY_YOR, "tokenizer tok: yor_Latn")["effect"] == pytest.approx(1.0)
    assert U.N_BOOT > 0 and not df.filter(pl.col("finding") == M.RECENCY).height  # no recency table given


def test_closer_compares_with_the_placements_run_on_every_seed():
    # sandwich ran seed 0 only: seeds 0 and 1 both compare with standard periodic alone (gap 0.10)
    rows = _teacher_rows({0: 2.005, 1: 2.005}, seeds=(0, 1))
    rows = rows.filter(~((pl.col("placement") == "sandwich") & (pl.col("seed") == 1)).fill_null(False))
    r = {x["finding"]: x for x in M.reverse_teacher_rows(rows)}[M.REV_CLOSER]
    assert r["effect"] == pytest.approx(1 - 0.005 / 0.10) and r["n_seeds"] == 2


def _importance(p0_all, chosen_all):
    """A layer_importance table of one teacher: groups all and nonlatin, 3 layers, layer 0's p_top as given."""
    out = []
    for group, p0, chosen in (("all", p0_all, chosen_all), ("nonlatin", 0.01, False)):
        for layer in range(3):
            out.append(dict(teacher="t", mixer="gdn", group=group, layer=layer, kl=1.0, kl_lo=0.9, kl_hi=1.1,
                            residual=0.1, residual_rel=0.1, p_top=p0 if layer == 0 else 0.5,
                            chosen=chosen if layer == 0 else layer == 1, n_fa=1, n_languages=3, n_sentences=30))
    return pl.DataFrame(out)


def test_searched_rows_layer_zero_and_the_comparisons():
    # searched beats reverse periodic by 0.05 nat and standard periodic by 0.10 on every row of every seed
    rows = _teacher_rows({0: 2.05, 1: 2.05, 2: 2.05}, others=(("standard_periodic", 2.10), ("searched", 2.00)))
    out = M.searched_rows(_importance(0.97, True), rows)
    layer0 = {r["comparison"]: r for r in out if r["finding"] == M.SEARCH_LAYER0}
    assert layer0["t/gdn: group all"]["effect"] == pytest.approx(0.97)
    assert "layer 0 in the top 1" in layer0["t/gdn: group all"]["note"]
    assert "settled: yes" in layer0["t/gdn: group all"]["note"]
    assert "settled: no" in layer0["t/gdn: group nonlatin"]["note"]
    # one stage-1 run chose the layers: never more than inconclusive
    assert {r["verdict"] for r in layer0.values()} == {stats.INCONCLUSIVE}
    vs = {r["comparison"]: r for r in out if r["finding"] == M.SEARCH_VS}
    ce_rev = vs["t/gdn: searched vs reverse_periodic (ce, all languages)"]
    assert ce_rev["effect"] == pytest.approx(-0.05) and ce_rev["n_seeds"] == 3
    assert ce_rev["verdict"] == stats.REPRODUCED
    assert vs["t/gdn: searched vs standard_periodic (ce, all languages)"]["effect"] == pytest.approx(-0.10)
    assert vs["t/gdn: searched vs standard_periodic (kl, all languages)"]["effect"] == pytest.approx(0.0)
    assert len(vs) == 4


def test_searched_rows_reach_the_findings_table_through_the_registry():
    rows = _teacher_rows({0: 2.05, 1: 2.05, 2: 2.05}, others=(("standard_periodic", 2.10), ("searched", 2.00)))
    tables = {"perplexity_rows": rows, "distill": _distill(), "softcka": _softcka(), "niah": _niah(),
              "distill_stage1": _stage1(), "layer_importance": _importance(0.5, False)}
    table = registry.render_table("table_findings", tables)
    assert table.filter(pl.col("finding") == M.SEARCH_LAYER0).height == 2
    # the FA-first finding is about the study's four FA-first placements, not the searched one
    assert not table.filter(pl.col("comparison").str.contains("searched")
                            & pl.col("finding").str.starts_with("an FA-first")).height

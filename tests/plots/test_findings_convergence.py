"""Convergence in the verdict rules and the two alignment quantities in the findings (docs/methods.md "Findings
table"), on hand-made tables: a row about distilled students is decided only when they are within the
preset's held-out KL of their teacher; rows about fixed models are not touched."""

import math

import polars as pl
import pytest

from hybridlab.eval import stats
from hybridlab.plots import findings
from hybridlab.plots import findings_multi as M
from hybridlab.plots import registry
from hybridlab.plots import verdicts as F

from test_findings_multi import _teacher_rows
from test_findings_verdicts import DENSE_T, HYB_T, LANGS6, _one, _softcka_table, _sr_runs
from test_plots import _niah, _softcka
from test_uncertainty_tables import _distill, _nl_runs, _rows, _score, _stage1

FA_CE = "an FA-first placement has lower held-out CE than standard periodic"
FA_CE_ROW = "t/gdn: sandwich vs standard_periodic (all languages)"


def _table(rows=None, softcka=None, kl_limit=None):
    return findings.findings_table(_rows() if rows is None else rows, _distill(),
                                   _softcka() if softcka is None else softcka, _niah(), _score(), _sr_runs(),
                                   _nl_runs(), kl_limit=kl_limit)


def test_students_kl_is_token_pooled_then_averaged_over_seeds():
    rows = pl.DataFrame([
        dict(teacher="t", mixer="gdn", placement="sandwich", seed=0, n_tokens=10, kl=1.0),
        dict(teacher="t", mixer="gdn", placement="sandwich", seed=0, n_tokens=30, kl=2.0),  # seed 0: 1.75
        dict(teacher="t", mixer="gdn", placement="sandwich", seed=1, n_tokens=5, kl=0.25),  # seed 1: 0.25
        dict(teacher="t", mixer=None, placement=None, seed=None, n_tokens=5, kl=None),  # the teacher itself
    ])
    assert F.students_kl(rows) == {("t", "gdn", "sandwich"): pytest.approx(1.0)}


def test_a_contradicted_row_turns_inconclusive_when_the_students_are_over_the_limit():
    # reverse periodic 0.03 nat behind the teacher on every seed: contradicted; its KL is 0.1 on every row
    table = _teacher_rows({0: 2.03, 1: 2.031, 2: 2.032})
    rows = M.reverse_teacher_rows(table)
    kls = F.students_kl(table)
    near = {r["finding"]: r for r in F.gate_convergence(rows, kls, 0.5)}[M.REV_GAP]
    assert near["verdict"] == stats.CONTRADICTED
    assert near["students_kl"] == pytest.approx(0.1) and near["kl_limit"] == 0.5
    assert "students not converged" not in near["note"]
    far = {r["finding"]: r for r in F.gate_convergence(rows, kls, 0.05)}[M.REV_GAP]
    assert far["verdict"] == stats.INCONCLUSIVE
    assert far["note"].startswith("students not converged: KL 0.10 > 0.05")
    assert (far["effect"], far["ci_lo"], far["ci_hi"]) == (near["effect"], near["ci_lo"], near["ci_hi"])
    # no limit: the KL is recorded, the verdict stays
    free = {r["finding"]: r for r in F.gate_convergence(rows, kls, None)}[M.REV_GAP]
    assert free["verdict"] == stats.CONTRADICTED and free["students_kl"] == pytest.approx(0.1)
    assert math.isnan(free["kl_limit"])


def test_the_limit_gates_placement_rows_and_ordering_rows_name_each_students_kl():
    # _rows: standard periodic CE 2.0 (KL 0.2), sandwich 2.0 - 0.21 on average (KL ~0.179); sandwich is better
    decided = _one(_table(kl_limit=0.5), FA_CE, FA_CE_ROW)
    assert decided["verdict"] == stats.REPRODUCED and decided["students_kl"] == pytest.approx(0.2)
    assert "students' KL: sandwich 0.18, standard_periodic 0.20" in decided["note"]
    # the same table, a limit between the two students' KL: the worse student decides
    gated = _one(_table(kl_limit=0.19), FA_CE, FA_CE_ROW)
    assert gated["verdict"] == stats.INCONCLUSIVE and gated["kl_limit"] == pytest.approx(0.19)
    assert gated["note"].startswith("students not converged: KL 0.20 > 0.19")
    assert gated["effect"] == pytest.approx(decided["effect"])


def test_fixed_published_models_and_the_bld_study_are_not_gated():
    def values(model, lang, layer):
        return (0.6 - (0.2 + 0.01 * LANGS6.index(lang)) * (model == "org/hybrid"), 0.5)

    hub = [("qwen-hub", "hybrid", "org/hybrid", HYB_T), ("qwen-hub", "dense", "org/dense", DENSE_T)]
    df = _table(softcka=_softcka_table(hub, values), kl_limit=0.0)
    r = _one(df, "hybrids are less cross-lingually aligned than dense models", "qwen-hub")
    assert r["verdict"] == stats.REPRODUCED and math.isnan(r["students_kl"]) and math.isnan(r["kl_limit"])
    bld = df.filter(pl.col("study") == findings.BLD)
    assert bld.height and bld["students_kl"].is_nan().all()
    # every row about the DAG's students is gated at limit 0
    students = df.filter(pl.col("students_kl").is_not_nan())
    assert students.height and (students["verdict"] == stats.INCONCLUSIVE).all()


def test_a_student_without_a_kl_is_not_taken_as_converged():
    rows = [F._row(F.MULTI, "f", "c", "", -1, -0.5, -0.6, -0.4, "seeds", 3, "", math.nan, "s",
                   students=(("t", "gdn", "sandwich"), ("t", "gdn", "lost")))]
    (r,) = F.gate_convergence(rows, {("t", "gdn", "sandwich"): 0.1}, 0.5)
    assert r["verdict"] == stats.INCONCLUSIVE and "KL unknown for lost" in r["note"] and math.isnan(r["students_kl"])
    assert F.STUDENTS not in r


def test_pair_names_give_their_student():
    assert F.student_of_pair("teacher/reverse_periodic-gdn") == ("teacher", "gdn", "reverse_periodic")
    assert F.student_of_pair("org/SmolLM2-135M/sandwich-kda") == ("org/SmolLM2-135M", "kda", "sandwich")
    assert F.student_of_pair("qwen-hub") is None


def test_the_registry_passes_the_presets_limit(tmp_path):
    tables = {"perplexity_rows": _rows(), "distill": _distill(), "softcka": _softcka(), "niah": _niah(),
              "retrieval_score": _score(), "bld_sr": _sr_runs(), "bld_nl": _nl_runs(), "distill_stage1": _stage1()}
    out = {k: tmp_path / f"t.{k}" for k in ("csv", "md")}
    registry.render_outputs("table_findings", tables, {"converged_kl": 0.1}, out_csv=out["csv"], out_md=out["md"])
    r = _one(pl.read_csv(out["csv"]), FA_CE, FA_CE_ROW)
    assert r["verdict"] == stats.INCONCLUSIVE and r["kl_limit"] == pytest.approx(0.1)


def _offset_table(pairs, values):
    """_softcka_table with a language_offset column: values(model, lang, layer) -> (alignment, cka, offset)."""
    base = _softcka_table(pairs, lambda m, lang, layer: values(m, lang, layer)[:2])
    offs = [values(r["model"], r["lang"], r["layer"])[2] for r in base.iter_rows(named=True)]
    return base.with_columns(language_offset=pl.Series(offs))


def test_each_alignment_quantity_gets_its_own_rows():
    # the hybrid keeps its pairs aligned (same alignment as dense) but separates the languages more
    def values(model, lang, layer):
        i = LANGS6.index(lang)
        return (0.4, 0.5, 0.3 + (0.2 + 0.01 * i) * (model == "org/hybrid"))

    hub = [("qwen-hub", "hybrid", "org/hybrid", HYB_T), ("qwen-hub", "dense", "org/dense", DENSE_T)]
    df = _table(softcka=_offset_table(hub, values))
    pair = _one(df, "hybrids are less cross-lingually aligned than dense models", "qwen-hub")
    assert pair["effect"] == pytest.approx(0.0) and pair["verdict"] == stats.INCONCLUSIVE
    offset = _one(df, "hybrids are less cross-lingually aligned than dense models (language offset: hybrids "
                      "separate the languages more)", "qwen-hub")
    assert offset["expected"] == "+" and offset["effect"] == pytest.approx(0.225)
    assert offset["verdict"] == stats.REPRODUCED and "language offset" in offset["effect_definition"]
    first = df.filter(pl.col("finding") == "the largest SoftCKA change across layers is at the hybrid's first FA "
                                           "layer (language offset)")
    assert first.height == 1

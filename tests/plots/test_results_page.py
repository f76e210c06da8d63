"""The results page: the alignment summary by model against hand-computed means, and the page's sections."""

import polars as pl
import pytest

from hybridlab.plots import findings
from hybridlab.plots.results_page import alignment_summary, job_times, results_markdown


def _softcka():
    """Teacher (in two pairs: the same rows twice) and one student; 3 hidden rows, 2 languages, and one attn_delta
    row that the summary leaves out."""
    rows = []
    for pair in ("t/a-gdn", "t/b-gdn"):
        for layer in range(3):
            for i, lang in enumerate(("fra_Latn", "hin_Deva")):
                rows.append(dict(model="t", pair=pair, role="dense", kind="hidden", layer=layer, lang=lang,
                                 alignment=0.2 + 0.1 * layer + 0.1 * i, language_offset=1.0 + i,
                                 alignment_pooled=-0.5, cka=0.9))
    for layer in range(3):
        for i, lang in enumerate(("fra_Latn", "hin_Deva")):
            rows.append(dict(model="t/a-gdn", pair="t/a-gdn", role="hybrid", kind="hidden", layer=layer, lang=lang,
                             alignment=[0.5, 0.1, 0.3][layer], language_offset=2.0, alignment_pooled=-0.7, cka=0.8))
    rows.append(dict(model="t/a-gdn", pair="t/a-gdn", role="hybrid", kind="attn_delta", layer=0, lang="fra_Latn",
                     alignment=9.0, language_offset=9.0, alignment_pooled=9.0, cka=9.0))
    return pl.DataFrame(rows)


def test_alignment_summary_means_over_layers_and_languages_once_per_model():
    s = {r["model"]: r for r in alignment_summary(_softcka()).iter_rows(named=True)}
    assert set(s) == {"t", "t/a-gdn"}
    # teacher: alignment 0.2 + 0.1 layer + 0.1 lang -> mean 0.35; peak at layer 2 (0.45)
    assert s["t"]["alignment"] == pytest.approx(0.35) and s["t"]["language_offset"] == pytest.approx(1.5)
    assert (s["t"]["peak_layer"], s["t"]["peak_alignment"]) == (2, pytest.approx(0.45))
    st = s["t/a-gdn"]
    assert st["alignment"] == pytest.approx(0.3) and st["alignment_pooled"] == pytest.approx(-0.7)
    assert (st["peak_layer"], st["peak_alignment"]) == (0, pytest.approx(0.5)) and st["cka"] == pytest.approx(0.8)


def test_results_page_states_the_limit_and_shows_the_alignment_by_model():
    fnd = pl.DataFrame({c: [] for c in findings.COLUMNS}, schema=findings.COLUMNS)
    gaps = pl.DataFrame([dict(teacher="t", placement=p, seed=0, stage="stage2", tokens=10, kl=kl, ce=3.0,
                              past_baseline_final=False) for p, kl in (("a-gdn", 0.3), ("b-gdn", 1.2))])
    page = results_markdown(fnd, gaps, job_times([]), scale="real", alignment=alignment_summary(_softcka()),
                            kl_limit=0.5)
    assert "within 0.5 nat of held-out KL of its teacher; 1 of 2 students are not" in page
    assert "## Cross-lingual alignment by model" in page
    assert "| t/a-gdn | hybrid | 0.300 | 2.000 | -0.700 | 0.800 | 0 | 0.500 |" in page
    assert "Cross-lingual alignment" not in results_markdown(fnd, gaps, job_times([]), scale="real")

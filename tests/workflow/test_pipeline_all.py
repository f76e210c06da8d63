"""The whole smoke DAG: `snakemake all` builds every figure and table with provenance, a second run has
nothing to do, and `snakemake --report` writes one HTML with every result, captioned with the preset and
the config hash."""

import json

import pytest
import yaml

from smoke import build, run_snakemake
from hybridlab.config import config_hash, resolve
from hybridlab.plots.registry import CAPTIONS, FIGURES, TABLES

pytestmark = [pytest.mark.slow, pytest.mark.smoke_dag]
# lm-eval (and so its table) runs at the paper preset only (rules/eval.smk)
SMOKE_TABLES = sorted(set(TABLES) - {"table_lm_benchmarks"})
# the smoke preset runs no searched placement, so it draws no layer importance heat map
SMOKE_FIGURES = sorted(set(FIGURES) - {"fig_layer_importance"})


def _preset_hash(work) -> str:
    cfg = yaml.safe_load((work / "config.yaml").read_text())
    cfg["scale"] = "smoke"
    return config_hash(resolve(cfg))


def test_all_builds_every_figure_and_table_then_is_a_no_op(smoke_workdir):
    work = smoke_workdir
    build(work, "all")
    out = work / "results/figures/smoke"
    expected = _preset_hash(work)
    for name in SMOKE_FIGURES:
        png, pdf = out / f"{name}.png", out / f"{name}.pdf"
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and pdf.read_bytes()[:5] == b"%PDF-", name
        prov = json.loads((out / f"{name}.png.provenance.json").read_text())
        assert prov["params"] == {"preset": "smoke", "config_hash": expected}
        assert prov["git_commit"] != "unknown" and prov["packages"]["torch"].startswith("2.")
    assert not (out / "table_lm_benchmarks.csv").exists() and not (out / "fig_layer_importance.png").exists()
    for name in SMOKE_TABLES:
        csv, md = (out / f"{name}.csv").read_text(), (out / f"{name}.md").read_text()
        assert csv.count("\n") >= 2 and md.startswith("|"), name
        assert json.loads((out / f"{name}.csv.provenance.json").read_text())["params"]["config_hash"] == expected

    again = run_snakemake(work, "-n", "all", "--config", "scale=smoke")
    assert again.returncode == 0 and "Nothing to be done" in again.stdout + again.stderr, again.stdout[-2000:]


def test_report_has_every_result_with_its_caption_preset_and_hash(smoke_workdir, tmp_path):
    work = smoke_workdir
    build(work, "all")
    report = tmp_path / "report.html"
    proc = run_snakemake(work, "--report", str(report), "--config", "scale=smoke")
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-3000:]
    html = report.read_text()
    for name in [*SMOKE_FIGURES, *SMOKE_TABLES]:
        assert CAPTIONS[name][:30] in html, f"caption of {name} missing from the report"
    for name in SMOKE_FIGURES:
        assert f"{name}.png" in html
    for name in SMOKE_TABLES:
        assert f"{name}.csv" in html
    # one caption per figure and table names the preset's config hash
    assert html.count(_preset_hash(work)) >= len(SMOKE_FIGURES) + len(SMOKE_TABLES)
    assert "Competing learning (BLD)" in html and "Multilinguality" in html

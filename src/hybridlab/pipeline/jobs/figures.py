"""The figures phase's jobs: one figure or table rendered from the evaluation tables and training logs, and the
build's results page. One function per rule, called by its thin workflow script; what each figure shows is
registered in `hybridlab.plots.registry`, the page's sections in `hybridlab.plots.results_page`."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hybridlab.config_spec import FigureJob, ResultsPageJob, job_settings
from hybridlab.config_spec.fields import UNSET


def figure_job(params: FigureJob | dict, *, fig: str, tables: Sequence[str], out_png: str | None = None,
               out_pdf: str | None = None, out_csv: str | None = None, out_md: str | None = None) -> str:
    """Render figure or table `fig` from `tables` (NAME=PATH or NAME/RUN=PATH, `registry.read_tables`) to the
    given outputs (byte-stable saves); returns the renderer's one-line summary."""
    from hybridlab.plots import registry

    job = job_settings(FigureJob, params, "make_figure.py")
    return registry.render_outputs(fig, registry.read_tables(tables), job, out_png=out_png, out_pdf=out_pdf,
                                   out_csv=out_csv, out_md=out_md)


def results_page_job(params: ResultsPageJob | dict, *, findings: str | Path, gaps: str | Path, out: str | Path,
                     softcka: str | Path | None = None, benchmarks: Sequence[str | Path] = ()) -> None:
    """The results page (Markdown) at `out`: the findings table, the students' KL gaps, the alignment by model
    (from `softcka`, when given) and the job times of the Snakemake benchmark files under `benchmarks`."""
    import polars as pl

    from hybridlab.atomic import write_text
    from hybridlab.plots.registry import read_tables
    from hybridlab.plots.results_page import alignment_summary, job_times, results_markdown

    job = job_settings(ResultsPageJob, params, "make_results_page.py")
    files = sorted(f for d in benchmarks for f in Path(d).rglob("*.tsv"))
    alignment = alignment_summary(read_tables([f"softcka={softcka}"])["softcka"]) if softcka else None
    page = results_markdown(pl.read_csv(findings), pl.read_csv(gaps), job_times(files), scale=job.preset,
                            header=job.header, alignment=alignment,
                            kl_limit=job.converged_kl if job.converged_kl is not UNSET else None)
    write_text(out, page)

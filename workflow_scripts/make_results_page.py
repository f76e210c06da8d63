"""Write the build's results page (Markdown): the multilinguality findings next to the study's numbers, the
students' distance to the teacher by stage, the alignment quantities by model, and the job times
(`hybridlab.plots.results_page`)."""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import ResultsPageJob
    from hybridlab.config_spec.fields import UNSET

    p = _common.parser(__doc__, ResultsPageJob)
    p.add_argument("--findings", required=True, help="table_findings.csv")
    p.add_argument("--gaps", required=True, help="table_kl_gaps.csv")
    p.add_argument("--softcka", help="softcka.parquet (the alignment by model)")
    p.add_argument("--benchmarks", nargs="*", default=[], help="Snakemake benchmark directories (job times)")
    p.add_argument("--out", required=True, help="the page (results.md)")
    args = p.parse_args()
    job = _common.load_job(ResultsPageJob, args.params)

    import polars as pl

    from hybridlab.atomic import write_text
    from hybridlab.plots.registry import read_tables
    from hybridlab.plots.results_page import alignment_summary, job_times, results_markdown

    files = sorted(f for d in args.benchmarks for f in Path(d).rglob("*.tsv"))
    alignment = alignment_summary(read_tables([f"softcka={args.softcka}"])["softcka"]) if args.softcka else None
    page = results_markdown(pl.read_csv(args.findings), pl.read_csv(args.gaps), job_times(files),
                            scale=job.preset, header=job.header, alignment=alignment,
                            kl_limit=job.converged_kl if job.converged_kl is not UNSET else None)
    write_text(args.out, page)
    print(f"results page -> {args.out}")


if __name__ == "__main__":
    _common.run(main)

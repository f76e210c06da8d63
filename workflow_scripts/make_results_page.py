"""Write the build's results page (Markdown): the multilinguality findings next to the study's numbers, the
students' distance to the teacher by stage, the alignment quantities by model, and the job times
(`hybridlab.plots.results_page`)."""

import _common

def main() -> None:
    from hybridlab.config_spec import ResultsPageJob

    p = _common.parser(__doc__, ResultsPageJob)
    p.add_argument("--findings", required=True, help="table_findings.csv")
    p.add_argument("--gaps", required=True, help="table_kl_gaps.csv")
    p.add_argument("--softcka", help="softcka.parquet (the alignment by model)")
    p.add_argument("--benchmarks", nargs="*", default=[], help="Snakemake benchmark directories (job times)")
    p.add_argument("--out", required=True, help="the page (results.md)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.figures import results_page_job

    results_page_job(_common.load_job(ResultsPageJob, args.params), findings=args.findings, gaps=args.gaps,
                     out=args.out, softcka=args.softcka, benchmarks=args.benchmarks)
    print(f"results page -> {args.out}")


if __name__ == "__main__":
    _common.run(main)

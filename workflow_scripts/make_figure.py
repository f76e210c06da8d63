"""Render one figure (PNG + PDF) or one table (CSV + Markdown) from eval tables and training logs.

    make_figure.py --params '{}' --fig fig_niah --tables niah=results/eval/tiny/niah.parquet \
        --out-png fig.png --out-pdf fig.pdf
    make_figure.py --params '{"baseline_placement": "standard_periodic"}' --fig table_perplexity \
        --tables perplexity=... --out-csv t.csv --out-md t.md

`--tables NAME=PATH` (parquet). Training logs come one file per run as `NAME/RUN=PATH` with NAME one of
`hybridlab.plots.registry.RUN_TABLES` (distill, distill_stage1, bld_sr, bld_nl); they are concatenated into table NAME
with a `run` column (e.g. `distill/teacher/sandwich-gdn=.../metrics.parquet`). Figures and tables are
registered in `hybridlab.plots.registry` (`read_tables`, `render_outputs`); saving is byte-stable.
"""

import _common

def main() -> None:
    from hybridlab.config_spec import FigureJob

    p = _common.parser(__doc__, FigureJob)
    p.add_argument("--fig", required=True, help="figure or table name (hybridlab.plots.registry FIGURES / TABLES)")
    p.add_argument("--tables", nargs="+", required=True, help="NAME=PATH or NAME/RUN=PATH parquet inputs")
    p.add_argument("--out-png", help="figure PNG")
    p.add_argument("--out-pdf", help="figure PDF")
    p.add_argument("--out-csv", help="table CSV")
    p.add_argument("--out-md", help="table Markdown")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.figures import figure_job

    print(figure_job(_common.load_job(FigureJob, args.params), fig=args.fig, tables=args.tables, out_png=args.out_png,
                     out_pdf=args.out_pdf, out_csv=args.out_csv, out_md=args.out_md))


if __name__ == "__main__":
    _common.run(main)

"""Render one figure (PNG + PDF) or one table (CSV + Markdown) from eval tables and training logs.

    make_figure.py --params '{}' --fig fig_niah --tables niah=results/eval/tiny/niah.parquet \
        --out-png fig.png --out-pdf fig.pdf
    make_figure.py --params '{"baseline_placement": "standard_periodic"}' --fig table_perplexity \
        --tables perplexity=... --out-csv t.csv --out-md t.md

`--tables NAME=PATH` (parquet). Training logs come one file per run as `NAME/RUN=PATH` with NAME one of
`hybridlab.plots.figures.RUN_TABLES` (distill, bld_sr, bld_nl); they are concatenated into table NAME
with a `run` column (e.g. `distill/teacher/sandwich-gdn=.../metrics.parquet`). Figures and tables are
defined in `hybridlab.plots.figures`; saving is byte-stable (`hybridlab.plots.style`).
"""

from pathlib import Path

import _common


def parse_tables(items: list[str]) -> dict:
    """`NAME=PATH` / `NAME/RUN=PATH` items -> {table: DataFrame}, run logs concatenated."""
    import polars as pl

    from hybridlab.errors import HybridlabError
    from hybridlab.plots.figures import RUN_TABLES, concat_runs

    plain, runs = {}, {}
    for item in items:
        name, sep, path = item.partition("=")
        if not sep or not name or not path:
            raise HybridlabError(f"--tables item '{item}' is not NAME=PATH")
        if not Path(path).is_file():
            raise HybridlabError(f"table file {path} (for '{name}') does not exist; build its rule first")
        table, slash, run = name.partition("/")
        if slash:
            if table not in RUN_TABLES:
                raise HybridlabError(f"'{name}': only {list(RUN_TABLES)} take per-run files (NAME/RUN=PATH)")
            runs.setdefault(table, {})[run] = pl.read_parquet(path)
        else:
            if name in plain:
                raise HybridlabError(f"table '{name}' given twice in --tables")
            plain[name] = pl.read_parquet(path)
    for table, frames in runs.items():
        plain[table] = concat_runs(frames)
    return plain


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--fig", required=True, help="figure or table name (hybridlab.plots.figures FIGURES / TABLES)")
    p.add_argument("--tables", nargs="+", required=True, help="NAME=PATH or NAME/RUN=PATH parquet inputs")
    p.add_argument("--out-png")
    p.add_argument("--out-pdf")
    p.add_argument("--out-csv")
    p.add_argument("--out-md")
    args = p.parse_args()
    params = _common.load_params(args.params)

    from hybridlab.errors import HybridlabError
    from hybridlab.plots import figures
    from hybridlab.plots.style import save_all

    tables = parse_tables(args.tables)
    if args.fig in figures.TABLES:
        if not (args.out_csv and args.out_md):
            raise HybridlabError(f"table '{args.fig}' needs --out-csv and --out-md")
        kwargs = {"baseline": params["baseline_placement"]} if "baseline_placement" in params else {}
        df = figures.render_table(args.fig, tables, **kwargs)
        figures.write_table(df, args.out_csv, args.out_md)
        print(f"{args.fig}: {df.height} rows -> {args.out_csv}, {args.out_md}")
        return
    if not (args.out_png and args.out_pdf):
        raise HybridlabError(f"figure '{args.fig}' needs --out-png and --out-pdf")
    fig = figures.render(args.fig, tables)
    save_all(fig, args.out_png, args.out_pdf)
    print(f"{args.fig} -> {args.out_png}, {args.out_pdf}")


if __name__ == "__main__":
    _common.run(main)

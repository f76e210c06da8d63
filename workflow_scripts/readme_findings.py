"""Copy a generated findings table into a page between its findings markers (hybridlab.plots.findings).

    python workflow_scripts/readme_findings.py --table results/figures/tiny/table_findings.csv --readme README.md \
        --view counts --about "from make all at commit abc1234 (fresh clone, 2-core Xeon)"
    python workflow_scripts/readme_findings.py --table results/figures/tiny/table_findings.csv \
        --readme docs/results.md --view narrow

A `.csv` table is spliced as its verdict counts per finding (`--view counts`: `findings.verdict_counts_markdown`,
the README's view) or its narrow view (`--view narrow`, the default: finding, comparison, effect with interval,
seeds, verdict, note: `findings.narrow_markdown`); a `.md` table exactly as `table_findings` wrote it.
Nothing is typed by hand. Idempotent: a second run with the same table changes nothing.
"""

import argparse
from pathlib import Path

import _common


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--table", required=True, help="the generated table_findings.csv (or .md)")
    p.add_argument("--readme", default="README.md", help="the file with the findings markers")
    p.add_argument("--view", choices=("narrow", "counts"), default="narrow", help="view of a .csv table")
    p.add_argument("--about", default="", help="the build the table came from, written after its file name")
    args = p.parse_args()

    from hybridlab.errors import HybridlabError
    from hybridlab.plots.findings import narrow_markdown, splice_into, verdict_counts_markdown

    table, readme = Path(args.table), Path(args.readme)
    if not table.is_file():
        raise HybridlabError(f"{table} does not exist; build it first: snakemake table_findings --config "
                             "scale=<preset>")
    if not readme.is_file():
        raise HybridlabError(f"{readme} does not exist; pass --readme with the file holding the findings markers")
    if table.suffix == ".csv":
        import polars as pl

        view = verdict_counts_markdown if args.view == "counts" else narrow_markdown
        body = view(pl.read_csv(table))
    else:
        body = table.read_text()
    new = splice_into(readme.read_text(), body, str(table), args.about)
    if new != readme.read_text():
        readme.write_text(new)
        print(f"{readme}: findings table replaced from {table}")
    else:
        print(f"{readme}: already shows {table}")


if __name__ == "__main__":
    _common.run(main)

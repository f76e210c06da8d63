"""Compare the result tables of two builds of the pipeline (e.g. before and after a refactor, same machine).

Walks `<a>/results` and `<b>/results` for tables (.parquet, .csv, .md, .json; training work directories and the
HTML report are skipped) and reports, per file present in both and not byte-identical: for parquet tables the
columns added or removed and, per common column, the largest absolute difference; for text tables the lines
that differ (a results page's job-times section left out). Timing columns and lines are labelled as such, since
they differ between any two runs, and so are provenance lines (the commit that built an output). Files present in
one build only are listed. Determinism holds on one machine only, so compare builds made on the same machine.

    python benchmarks/compare_builds.py BUILD_A BUILD_B [--scale tiny]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

SUFFIXES = (".parquet", ".csv", ".md", ".json")
TIMING_WORDS = ("seconds", "_s", "time", "tokens_per_s", "elapsed", "peak_mem", "rss", "duration")
# which commit built an output (provenance.json): differs between builds of two commits by design
PROVENANCE_WORDS = ('"git_commit"',)
LABELS = (" (timing)", " (provenance)")


def tables(results: Path, scale: str) -> dict[str, Path]:
    """Relative path -> file, for every table of `scale` under `results` (run directories and reports skipped)."""
    out = {}
    for p in sorted(results.rglob("*")):
        rel = p.relative_to(results)
        if (p.is_file() and p.suffix in SUFFIXES and scale in rel.parts
                and not {"runs", "report", "logs"} & set(rel.parts)):
            out[str(rel)] = p
    return out


def compare_parquet(pa: Path, pb: Path) -> list[str]:
    """Differences between two parquet tables, one line each (empty: same columns and values)."""
    da, db = pl.read_parquet(pa), pl.read_parquet(pb)
    lines = []
    added = [c for c in db.columns if c not in da.columns]
    removed = [c for c in da.columns if c not in db.columns]
    if added or removed:
        lines.append(f"columns added {added}, removed {removed}")
    if da.height != db.height:
        return lines + [f"rows {da.height} vs {db.height}"]
    for c in (c for c in da.columns if c in db.columns):
        sa, sb = da[c], db[c]
        if sa.equals(sb, check_names=False):
            continue
        timing = " (timing)" if any(w in c for w in TIMING_WORDS) else ""
        if sa.dtype.is_numeric() and sb.dtype.is_numeric():
            diff = (sa.cast(pl.Float64) - sb.cast(pl.Float64)).abs().max()
            lines.append(f"{c}: max |diff| {diff:.3g}{timing}")
        else:
            lines.append(f"{c}: values differ{timing}")
    return lines


def text_lines(path: Path) -> list[str]:
    """The lines of a text table, without a results page's "Job times" section (its rows are job times,
    ordered by time)."""
    out, timed = [], False
    for line in path.read_text().splitlines():
        if line.startswith("## "):
            timed = line.strip() == "## Job times"
        if not timed:
            out.append(line)
    return out


def compare_text(pa: Path, pb: Path) -> list[str]:
    """Differences between two text tables, one line each (a line pair holding a timing word is labelled)."""
    la, lb = text_lines(pa), text_lines(pb)
    lines = []
    for x, y in zip(la, lb):
        if x != y:
            label = ""
            if any(w in x for w in TIMING_WORDS) and any(w in y for w in TIMING_WORDS):
                label = " (timing)"
            elif any(w in x and w in y for w in PROVENANCE_WORDS):
                label = " (provenance)"
            lines.append(f"{x[:150]!r} vs {y[:150]!r}{label}")
    return lines + ([f"{len(la)} vs {len(lb)} lines"] if len(la) != len(lb) else [])


def differences(a: Path, b: Path, scale: str) -> tuple[list[str], int]:
    """(one line per difference, prefixed by the table's path; the number of byte-identical common tables)
    between the `scale` tables of the results directories `a` and `b`. Timing differences end in "(timing)"."""
    ta, tb = tables(a, scale), tables(b, scale)
    out = [f"only in one build: {sorted(set(ta) ^ set(tb))}"] if set(ta) != set(tb) else []
    same = 0
    for rel in sorted(set(ta) & set(tb)):
        pa, pb = ta[rel], tb[rel]
        if pa.read_bytes() == pb.read_bytes():
            same += 1
            continue
        lines = compare_parquet(pa, pb) if pa.suffix == ".parquet" else compare_text(pa, pb)
        out += [f"{rel}: {line}" for line in lines]  # none: the same values in other bytes
    return out, same


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="repository root of the first build")
    ap.add_argument("b", type=Path, help="repository root of the second build")
    ap.add_argument("--scale", default="tiny", help="preset whose tables are compared")
    args = ap.parse_args()
    for root in (args.a, args.b):
        if not (root / "results").is_dir():
            raise SystemExit(f"error: {root / 'results'} does not exist; build it first (make all SCALE={args.scale})")
    lines, same = differences(args.a / "results", args.b / "results", args.scale)
    print("\n".join(lines))
    n_common = len(set(tables(args.a / "results", args.scale)) & set(tables(args.b / "results", args.scale)))
    print(f"{same} of {n_common} common files byte-identical; "
          f"{sum(not line.endswith(LABELS) for line in lines)} differences beyond timing and provenance")


if __name__ == "__main__":
    main()

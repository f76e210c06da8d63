"""Compare the result tables of two builds of the pipeline (e.g. before and after a refactor, same machine).

Walks `<a>/results` and `<b>/results` for tables (.parquet, .csv, .md, .json; training work directories and the
HTML report are skipped) and reports, per file present in both: byte-identical, or for parquet tables the columns
added or removed and, per common column, the largest absolute difference (timing columns are labelled as such,
since they differ between any two runs). Files present in one build only are listed. Determinism holds on one
machine only, so compare builds made on the same machine.

    python benchmarks/compare_builds.py BUILD_A BUILD_B [--scale tiny]
"""

from __future__ import annotations

import argparse
from pathlib import Path

import polars as pl

SUFFIXES = (".parquet", ".csv", ".md", ".json")
TIMING_WORDS = ("seconds", "_s", "time", "tokens_per_s", "elapsed", "peak_mem", "rss", "duration")


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("a", type=Path, help="repository root of the first build")
    ap.add_argument("b", type=Path, help="repository root of the second build")
    ap.add_argument("--scale", default="tiny", help="preset whose tables are compared")
    args = ap.parse_args()
    for root in (args.a, args.b):
        if not (root / "results").is_dir():
            raise SystemExit(f"error: {root / 'results'} does not exist; build it first (make all SCALE={args.scale})")
    ta, tb = tables(args.a / "results", args.scale), tables(args.b / "results", args.scale)
    print(f"only in {args.a}: {sorted(set(ta) - set(tb))}")
    print(f"only in {args.b}: {sorted(set(tb) - set(ta))}")
    same = 0
    for rel in sorted(set(ta) & set(tb)):
        pa, pb = ta[rel], tb[rel]
        if pa.read_bytes() == pb.read_bytes():
            same += 1
            continue
        if pa.suffix == ".parquet":
            lines = compare_parquet(pa, pb)
            print(f"{rel}: " + ("; ".join(lines) if lines else "same columns and values (bytes differ)"))
        else:
            la, lb = pa.read_text().splitlines(), pb.read_text().splitlines()
            n = sum(x != y for x, y in zip(la, lb)) + abs(len(la) - len(lb))
            print(f"{rel}: {n} of {max(len(la), len(lb))} lines differ")
    print(f"{same} of {len(set(ta) & set(tb))} common files byte-identical")


if __name__ == "__main__":
    main()

"""Build the rehearsal preset's local "hub": hub-layout datasets and random hub-architecture models.

Run once before `snakemake all --config scale=rehearsal` (the `make rehearsal` target does both):

    python workflow_scripts/make_rehearsal_inputs.py --corpus results/data/smoke/corpus --out cache/rehearsal

--corpus is an offline corpus directory (parallel.parquet, mono.parquet; `snakemake corpus --config
scale=smoke` builds one). The preset's `local_sources` point into --out (see hybridlab.rehearsal).
"""

import argparse
import json
import sys
from pathlib import Path

import _common


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--corpus", required=True, help="offline corpus directory (parallel.parquet, mono.parquet)")
    p.add_argument("--out", default="cache/rehearsal", help="output directory (replaced); default cache/rehearsal")
    p.add_argument("--seed", type=int, default=0, help="seed of the random models")
    args = p.parse_args()

    from hybridlab.rehearsal import build_rehearsal_inputs

    manifest = build_rehearsal_inputs(Path(args.corpus), Path(args.out), seed=args.seed)
    json.dump(manifest, sys.stdout, indent=1, sort_keys=True)
    print()


if __name__ == "__main__":
    _common.run(main)

"""Layer Retrieval Ability Score of every BLD Spaced Retrieval arm, per score checkpoint, layer and gap.

For each arm directory (`--arms`), reads `score_checkpoints/index.json` (written by train_bld_sr.py),
loads each checkpoint and scores every layer on A/B pairs built from the test split
(`hybridlab.eval.retrieval_score`) at the positions of params `positions` ("answer_predicting",
the study's definition and the default, or "all_answer"). Writes one tidy parquet with columns
arm, seed (the replicate seed of the arm's run), step, fraction, long_gap_fraction, layer, layer_type, gap,
positions, score, n, items, margin_clean, margin_patched, margin_b.
"""

import json
import time
from pathlib import Path

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--arms", required=True, nargs="+", help="arm output directories of the bld_sr rule")
    p.add_argument("--test", required=True, help="spaced_retrieval test split (parquet)")
    p.add_argument("--out", required=True, help="output parquet")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl
    import torch

    from hybridlab.data import spaced_retrieval as sr
    from hybridlab.errors import HybridlabError
    from hybridlab.eval.retrieval_score import retrieval_scores
    from hybridlab.models.io import load_hybrid
    from hybridlab.train.spaced_retrieval import take_per_gap

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    t0 = time.perf_counter()
    test = take_per_gap(sr.read_split(args.test), params["max_examples_per_gap"])
    records_a, records_b = sr.make_ab_pairs(test, params["seed"])
    device = "cuda" if torch.cuda.is_available() else "cpu"
    frames = []
    for arm_dir in map(Path, args.arms):
        index_path = arm_dir / "score_checkpoints" / "index.json"
        if not index_path.is_file():
            raise HybridlabError(f"{index_path} is missing; rebuild the arm with the bld_sr rule")
        index = json.loads(index_path.read_text())
        for ck in index["checkpoints"]:
            model = load_hybrid(arm_dir / ck["path"], device=device)
            rows = retrieval_scores(model, records_a, records_b, batch_size=params["batch_size"],
                                    min_denominator=params["min_denominator"],
                                    positions=params.get("positions", "answer_predicting"))
            frames.append(rows.with_columns(
                pl.lit(index["arm"]).alias("arm"), pl.lit(index.get("seed"), pl.Int64).alias("seed"),
                pl.lit(ck["step"], pl.Int64).alias("step"),
                pl.lit(ck["fraction"], pl.Float64).alias("fraction"),
                pl.lit(index["long_gap_fraction"], pl.Float64).alias("long_gap_fraction")))
            defined = rows.filter(pl.col("score").is_not_nan())
            if defined.is_empty():
                print(f"{index['arm']} seed {index.get('seed')} step {ck['step']}: score undefined (the model does not tell A from B yet)")
            else:
                best = defined.sort("score", descending=True).row(0, named=True)
                print(f"{index['arm']} seed {index.get('seed')} step {ck['step']}: top layer {best['layer']} ({best['layer_type']}, "
                      f"gap {best['gap']}) score {best['score']:.3f}")
    first = ["arm", "seed", "step", "fraction", "long_gap_fraction"]
    table = pl.concat(frames).select(first + [c for c in frames[0].columns if c not in first])
    table = table.sort(["arm", "seed", "step", "gap", "layer"])
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    table.write_parquet(tmp)
    tmp.rename(out)
    print(f"{table.height} rows from {len(args.arms)} arms in {time.perf_counter() - t0:.1f}s")


if __name__ == "__main__":
    _common.run(main)

"""Layer Retrieval Ability Score of every BLD Spaced Retrieval arm, per score checkpoint, layer and gap.

Reads each arm's `score_checkpoints/index.json` (written by train_bld_sr.py) and scores every layer of each
checkpoint on A/B pairs from the test split (`hybridlab.eval.retrieval_score.retrieval_score_table`).
Writes one tidy parquet with columns arm, seed (the arm's replicate seed), step, fraction, long_gap_fraction,
layer, layer_type, gap, positions, score, n, items, margin_clean, margin_patched, margin_b.
"""

from pathlib import Path

import _common

def main() -> None:
    from hybridlab.config_spec import RetrievalScoreJob

    p = _common.parser(__doc__, RetrievalScoreJob)
    p.add_argument("--arms", type=Path, required=True, nargs="+", help="arm output directories of the bld_sr rule")
    p.add_argument("--test", type=Path, required=True, help="spaced_retrieval test split (parquet)")
    p.add_argument("--out", type=Path, required=True, help="output parquet")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    args = p.parse_args()
    params = _common.load_job(RetrievalScoreJob, args.params)
    _common.set_threads(args.threads)

    from hybridlab.pipeline.jobs.eval import retrieval_score_job

    retrieval_score_job(params, arms=args.arms, test=args.test, out=args.out)


if __name__ == "__main__":
    _common.run(main)

"""Write seeded Spaced Retrieval splits (train/val/test parquet) for the active preset."""

from pathlib import Path

import _common


def main() -> None:
    from hybridlab.config_spec import SpacedRetrievalJob

    p = _common.parser(__doc__, SpacedRetrievalJob)
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args()
    job = _common.load_job(SpacedRetrievalJob, args.params)

    from hybridlab.data import spaced_retrieval as sr

    cfg = sr.SpacedRetrievalConfig(t=job.t, gaps=tuple(job.gaps), gap_weights=tuple(job.gap_weights),
                                   n_train=job.n_train, n_val=job.n_val, n_test=job.n_test, seed=job.seed)
    out = Path(args.out)
    splits = {s: sr.generate_split(cfg, s) for s in sr.SPLITS}
    for split, records in splits.items():
        sr.write_split(out / f"{split}.parquet", records, split=split, seed=cfg.seed)
        print(f"{split}: {len(records)} examples, gaps {sorted(set(records.gaps_N.tolist()))}")
    print(f"test examples also in train: {sr.collision_rate(splits['train'], splits['test']):.4f}")


if __name__ == "__main__":
    _common.run(main)

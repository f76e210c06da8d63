"""Write seeded Spaced Retrieval splits (train/val/test parquet) for the active preset."""

import _common


def main() -> None:
    from hybridlab.config_spec import SpacedRetrievalJob

    p = _common.parser(__doc__, SpacedRetrievalJob)
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.data import spaced_retrieval_job

    spaced_retrieval_job(_common.load_job(SpacedRetrievalJob, args.params), out=args.out)


if __name__ == "__main__":
    _common.run(main)

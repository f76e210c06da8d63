"""Tokenise and pack the training mixture (one language per fixed-length sequence, train/val by document).

Rows are consecutive stretches of one language's document stream, kept together in blocks of
`block_rows` rows (a BLD-NL sequence joins that many rows); per-row document starts are written too.
With `stream` (hub presets, the English mixture) the web source is streamed instead of the
corpus, until the largest BLD-NL arm's token budget (`bld_nl`, counted with this tokenizer's
vocabulary) is packed: data sized to the budget rather than a fixed number of documents
(`hybridlab.pipeline.jobs.train.pack_mixture_job`).
"""

from pathlib import Path

import _common



def main() -> None:
    from hybridlab.config_spec import MixtureJob

    p = _common.parser(__doc__, MixtureJob)
    p.add_argument("--mono", type=Path, required=True, help="mono.parquet of the corpus")
    p.add_argument("--tokenizer", type=Path, required=True, help="tokenizer.json (or its directory)")
    p.add_argument("--parallel", type=Path, help="parallel.parquet of the corpus (--params heldout)")
    p.add_argument("--out", type=Path, required=True, help="output directory")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.data import pack_mixture_job

    pack_mixture_job(_common.load_job(MixtureJob, args.params), mono=args.mono, tokenizer=args.tokenizer, out=args.out,
                     parallel=args.parallel)


if __name__ == "__main__":
    _common.run(main)

"""Train the byte-level BPE on the monolingual corpus (offline presets) or save a hub tokenizer (paper)."""

from pathlib import Path

import _common


def main() -> None:
    from hybridlab.config_spec import TokenizerJob

    p = _common.parser(__doc__, TokenizerJob)
    p.add_argument("--mono", required=True, help="mono.parquet of the corpus")
    p.add_argument("--out", required=True, help="output directory (tokenizer.json is written inside)")
    args = p.parse_args()

    from hybridlab.pipeline.jobs.data import tokenizer_job

    n = tokenizer_job(_common.load_job(TokenizerJob, args.params), mono=args.mono, out=args.out)
    print(f"tokenizer with {n} tokens written to {Path(args.out)}")


if __name__ == "__main__":
    _common.run(main)

"""Train the byte-level BPE on the monolingual corpus (offline presets) or save a hub tokenizer (paper)."""

from pathlib import Path

import _common


def main() -> None:
    from hybridlab.config_spec import TokenizerJob

    p = _common.parser(__doc__, TokenizerJob)
    p.add_argument("--mono", required=True, help="mono.parquet of the corpus")
    p.add_argument("--out", required=True, help="output directory (tokenizer.json is written inside)")
    args = p.parse_args()
    job = _common.load_job(TokenizerJob, args.params)

    import polars as pl

    from hybridlab.atomic import atomic_dir
    from hybridlab.data.tokenizer import load_tokenizer, train_bpe

    out = Path(args.out)
    # Build in a temporary sibling directory and rename: a failed run leaves no half-written tokenizer.
    with atomic_dir(out) as tmp:
        if job.hub_tokenizer:
            tok = load_tokenizer(job.hub_tokenizer)
            tok.save_pretrained(str(tmp))
        else:
            if job.vocab_size is None:
                raise _common.HybridlabError("train_tokenizer.py --params: vocab_size is null and no hub_tokenizer; "
                                             "set data.tokenizer_vocab_size")
            # Sorted by (lang, doc_id) so the same corpus always gives the same merges.
            texts = pl.read_parquet(args.mono, columns=["lang", "doc_id", "text"]).sort(["lang", "doc_id"])["text"]
            tok = train_bpe(iter(texts.to_list()), vocab_size=job.vocab_size, min_frequency=2, out_path=tmp)
    print(f"tokenizer with {len(tok)} tokens written to {out}")


if __name__ == "__main__":
    _common.run(main)

"""Tokenise and pack the training mixture (one language per fixed-length sequence, train/val by document).

Rows are consecutive stretches of one language's document stream, kept together in blocks of
`block_rows` rows (a BLD-NL sequence joins that many rows); per-row document starts are written too.
"""

import json

import _common


def main() -> None:
    p = _common.parser(__doc__)
    p.add_argument("--mono", required=True, help="mono.parquet of the corpus")
    p.add_argument("--tokenizer", required=True, help="tokenizer.json (or its directory)")
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args()
    params = _common.load_params(args.params)

    import polars as pl

    from hybridlab.data.packing import pack_mixture, write_packed
    from hybridlab.data.tokenizer import load_tokenizer

    english = params["english"]
    mono = pl.read_parquet(args.mono)
    available = set(mono["lang"].unique().to_list())
    # Languages the corpus has no text for are reported, not silently dropped.
    wanted = [lang for lang in params["languages"] if lang != english]
    missing = [lang for lang in wanted if lang not in available]
    if missing:
        print(f"warning: no monolingual text for {missing}; the mixture uses the other languages "
              f"(see the corpus manifest)")
    languages = [lang for lang in wanted if lang in available]
    mixture = pack_mixture(mono, load_tokenizer(args.tokenizer), languages=languages,
                           english_share=params["english_share"] if languages else 1.0,
                           seq_len=params["seq_len"], total_tokens=params["total_tokens"],
                           val_fraction=params["val_fraction"], seed=params["seed"],
                           block_rows=params.get("block_rows", 1))
    write_packed(args.out, mixture)
    print(json.dumps(mixture.stats, indent=1)[:4000])


if __name__ == "__main__":
    _common.run(main)

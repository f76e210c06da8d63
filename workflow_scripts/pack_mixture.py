"""Tokenise and pack the training mixture (one language per fixed-length sequence, train/val by document).

Rows are consecutive stretches of one language's document stream, kept together in blocks of
`block_rows` rows (a BLD-NL sequence joins that many rows); per-row document starts are written too.
With params `stream` (hub presets, the English mixture) the web source is streamed instead of the
corpus, until the largest BLD-NL arm's token budget (params `bld_nl`, counted with this tokenizer's
vocabulary) is packed: data sized to the budget rather than a fixed number of documents.
"""

import json
import os

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
    if params.get("stream"):
        _stream_english(params, args)
        return
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


def _stream_english(params: dict, args) -> None:
    """BLD-NL's English mixture at hub presets: stream the web source until the largest arm's budget is packed."""
    from hybridlab.data import hub
    from hybridlab.data.budget import bld_nl_need_tokens
    from hybridlab.data.packing import pack_stream_to_disk
    from hybridlab.data.tokenizer import load_tokenizer

    stream, bld = params["stream"], params["bld_nl"]
    tok = load_tokenizer(args.tokenizer)
    need = bld_nl_need_tokens(bld["sizes"], bld["run"], bld["experiment"], vocab_size=len(tok))
    epochs = bld["run"].get("epochs") or 1
    train_tokens = -(-max(need.values()) // epochs)
    print(f"BLD-NL budgets (tokens): {need}; packing {train_tokens} train tokens ({epochs} epoch(s) of the largest)")
    config = {"dclm": None, "fineweb": hub.FINEWEB_CONFIG}[stream["source"]]
    # `path`: a local copy in the hub's layout (config local_sources), else the HF cache or the hub
    rows = hub.iter_rows(stream["source"], config, "train", local=stream.get("path"), token=os.environ.get("HF_TOKEN"))
    stats = pack_stream_to_disk((r.get("text") for r in rows), tok, args.out, lang=params["english"],
                                seq_len=params["seq_len"], train_tokens=train_tokens,
                                val_fraction=params["val_fraction"], seed=params["seed"],
                                block_rows=params.get("block_rows", 1))
    print(json.dumps(stats, indent=1)[:4000])


if __name__ == "__main__":
    _common.run(main)

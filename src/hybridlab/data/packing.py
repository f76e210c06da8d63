"""Tokenise a multilingual document mix and pack it into fixed-length, single-language sequences.

Definitions:

* Mixture (FineWeb-2 style): ``english_share`` of the token budget goes to ``eng_Latn`` documents, the
  rest to the configured non-English `languages`, evenly or by `weights` (normalised). Budgets are
  whole sequences: language L gets ``round(share_L * total_tokens / seq_len)`` rows, train + val.
* Packing (`pack_stream`): each document's tokens are followed by one EOS (so EOS separates and ends
  documents), the documents are concatenated into one stream per language and cut into rows of
  ``seq_len``; the tail that does not fill a row is dropped. Row r+1 of a language continues row r, so
  a long document spans consecutive rows of one stream and is never cut apart by shuffling (below).
* Blocks: rows are kept together in blocks of ``block_rows`` consecutive rows of one stream (a
  training sequence of ``k * seq_len`` tokens joins k rows; pack with ``block_rows`` a multiple of k).
  Each language's train and val row counts are multiples of ``block_rows``.
* Document boundaries: per row, the positions where a document starts (the first token after an EOS,
  and 0 when the row begins a document) are stored, so a model can keep attention and recurrent state
  inside each document (`segment_lengths`, `position_ids`, `cu_seqlens`, `document_causal_mask`).
* One language per row: every language is packed on its own, so held-out loss can be read per
  language (``meta.parquet``: ``row``, ``lang``, ``split``).
* Determinism: a language's documents are sorted by ``doc_id`` and shuffled with
  ``default_rng([seed, crc32(lang)])`` (adding a language leaves the others unchanged). The
  train blocks of all languages are then shuffled with ``default_rng(seed)``; val rows stay grouped
  and in document order.
* Train/val split by document: in shuffled order, the first documents fill the val rows
  (``max(1, round(val_fraction * rows_L))`` when ``val_fraction > 0``, rounded up to whole blocks),
  the following documents the train rows, so no document is in both.
* Scarce languages (all their text fits in the budget) use what exists: val gets
  ``max(1, round(val_fraction * available_rows))`` rows, train the remaining documents.
  ``stats.json`` records per language the target and achieved token shares (achieved = that
  language's train tokens / all train tokens) and a ``short`` flag; also ``max_token_id`` (checked
  against each model's vocabulary before training, `hybridlab.data.budget`).

* Memory: tokenised documents are held as flat int32 arrays (not Python lists of ints); with
  ``spill_dir`` (the mixture job) each language's rows go to a temporary file as soon as it is packed and
  the final rows are assembled in a memory-mapped file, so one language's text and tokens are in memory
  at a time. The bytes written are the same either way.

Output of `write_packed`: ``tokens.npy`` (int32 [N, seq_len], read with mmap), ``doc_starts.npy``
(int32, every row's document starts concatenated) with ``doc_offsets.npy`` (int64 [N + 1]: row r's
starts are ``doc_starts[doc_offsets[r]:doc_offsets[r + 1]]``), ``meta.parquet`` and ``stats.json``;
all byte-stable for the same inputs and seed.
"""

from __future__ import annotations

import itertools
import zlib
from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
import polars as pl

from hybridlab.atomic import remove_stale, temp_path
# the reading side and the file writers stay importable from here (hybridlab.data.packing.<name>)
from hybridlab.data.packed_dataset import (  # noqa: F401
    Documents,
    PackedDataset,
    batch_rows,
    batch_to,
    check_row_blocks,
    cu_seqlens,
    document_causal_mask,
    documents_from_stream,
    in_document_targets,
    position_ids,
    segment_lengths,
    split_batch,
    val_stream,
)
from hybridlab.data.packed_files import META_SCHEMA, PackedMixture, read_stats, write_packed  # noqa: F401
from hybridlab.errors import HybridlabError

ENGLISH = "eng_Latn"
_TOKENIZE_BATCH = 64


def pack_stream(token_lists: Sequence[Sequence[int]], seq_len: int, eos_id: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """Join documents as ``doc EOS doc EOS ...``, cut into int32 rows of `seq_len` (tail dropped).

    Returns the rows and, per row, the positions at which a document starts inside it.
    """
    return _pack_flat(_Docs.of(token_lists), seq_len, eos_id)


class _Docs:
    """Tokenised documents as one flat int32 array and their lengths: 4 bytes a token (a Python list of ints
    costs about 36), so a language's token pool of the paper preset's mixture fits in a few GB."""

    def __init__(self, flat: np.ndarray | None = None, lens: np.ndarray | None = None):
        self.flat = np.zeros(0, np.int32) if flat is None else flat
        self.lens = np.zeros(0, np.int64) if lens is None else lens

    @classmethod
    def of(cls, token_lists: Iterable[Sequence[int]]) -> "_Docs":
        docs = [np.asarray(d, dtype=np.int64) for d in token_lists]
        flat = np.concatenate(docs).astype(np.int32) if docs else np.zeros(0, np.int32)
        return cls(flat, np.asarray([len(d) for d in docs], dtype=np.int64))

    def __len__(self) -> int:
        return len(self.lens)

    @property
    def tokens_with_eos(self) -> int:
        """Tokens the documents fill in a stream, one EOS each."""
        return int(self.lens.sum()) + len(self.lens)

    def split(self, k: int) -> tuple["_Docs", "_Docs"]:
        """The first k documents and the rest."""
        cut = int(self.lens[:k].sum())
        return _Docs(self.flat[:cut], self.lens[:k]), _Docs(self.flat[cut:], self.lens[k:])

    @staticmethod
    def concat(parts: list["_Docs"]) -> "_Docs":
        parts = [p for p in parts if len(p)]
        if not parts:
            return _Docs()
        return _Docs(np.concatenate([p.flat for p in parts]), np.concatenate([p.lens for p in parts]))


def _pack_flat(docs: _Docs, seq_len: int, eos_id: int) -> tuple[np.ndarray, list[np.ndarray]]:
    """`pack_stream` of documents held as a `_Docs`: rows are a view of one int32 stream (no second copy)."""
    if seq_len < 1:
        raise HybridlabError(f"packing: seq_len={seq_len} must be >= 1")
    size = docs.lens + 1
    ends = np.cumsum(size)
    off = ends - size  # where each document starts in the stream
    stream = np.full(int(ends[-1]) if len(ends) else 0, eos_id, dtype=np.int32)
    is_token = np.ones(len(stream), dtype=bool)
    is_token[ends - 1] = False
    stream[is_token] = docs.flat
    n_rows = len(stream) // seq_len
    rows = stream[: n_rows * seq_len].reshape(n_rows, seq_len)
    off = off[off < n_rows * seq_len]
    row_of = off // seq_len
    cuts = np.searchsorted(row_of, np.arange(n_rows + 1))
    starts = [(off[cuts[r]:cuts[r + 1]] - r * seq_len).astype(np.int32) for r in range(n_rows)]
    return rows, starts


def pack_documents(token_lists: Sequence[Sequence[int]], seq_len: int, eos_id: int) -> np.ndarray:
    """The rows of `pack_stream` alone."""
    return pack_stream(token_lists, seq_len, eos_id)[0]


def _lang_rng(seed: int, lang: str) -> np.random.Generator:
    return np.random.default_rng([seed, zlib.crc32(lang.encode("utf-8"))])


def _target_shares(languages: list[str], english_share: float, weights: dict[str, float] | None) -> dict[str, float]:
    if not 0.0 <= english_share <= 1.0:
        raise HybridlabError(f"packing: english_share={english_share} must be in [0, 1]")
    if ENGLISH in languages:
        raise HybridlabError(f"packing: list only non-English languages; {ENGLISH} gets english_share={english_share}")
    if len(set(languages)) != len(languages):
        raise HybridlabError(f"packing: languages {languages} contain duplicates")
    if not languages and english_share < 1.0:
        raise HybridlabError("packing: no non-English languages given; add languages or set english_share=1")
    if weights is None:
        weights = {lang: 1.0 for lang in languages}
    if set(weights) != set(languages) or any(w <= 0 for w in weights.values()):
        raise HybridlabError(f"packing: weights {weights} must give one positive weight per language of {languages}")
    total_w = sum(weights.values())
    shares = {ENGLISH: english_share} if english_share > 0 else {}
    for lang in languages:
        shares[lang] = (1.0 - english_share) * weights[lang] / total_w
    return shares


def _tokenize_until(texts: list[str], tokenizer, start: int, n_tokens: int) -> tuple[_Docs, int]:
    """Tokenise texts[start:] in batches until the docs (+1 EOS each) hold >= n_tokens; return docs and next index."""
    flats, lens = [], []
    have = 0
    i = start
    while have < n_tokens and i < len(texts):
        batch = texts[i : i + _TOKENIZE_BATCH]
        ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
        kept = []
        for doc in ids:
            i += 1
            if not doc:
                continue
            kept.append(doc)
            lens.append(len(doc))
            have += len(doc) + 1
            if have >= n_tokens:
                break
        if kept:  # one int32 array per batch; the batch's Python lists are dropped here
            flats.append(np.fromiter(itertools.chain.from_iterable(kept), dtype=np.int32,
                                     count=sum(len(d) for d in kept)))
    flat = np.concatenate(flats) if flats else np.zeros(0, np.int32)
    return _Docs(flat, np.asarray(lens, dtype=np.int64)), i


def _prefix_len(docs: _Docs, n_tokens: int) -> int:
    """Number of leading docs whose tokens (+1 EOS each) first reach n_tokens (all docs if never)."""
    if n_tokens <= 0:
        return 0
    reached = np.searchsorted(np.cumsum(docs.lens + 1), n_tokens, side="left") + 1
    return int(min(reached, len(docs)))


def _spill_path(spill_dir: str | Path, tag: str) -> Path:
    """A temporary .npy file of this process in `spill_dir` (atomic.temp_path naming: a killed run's are removed)."""
    path = temp_path(Path(spill_dir) / f"tokens.{tag}.npy")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path


def _spill(spill_dir: str | Path, tag: str, rows: np.ndarray, starts: list) -> tuple[np.ndarray, list]:
    """`rows` written to a temporary file and memory-mapped back (the in-memory copy can go)."""
    path = _spill_path(spill_dir, tag)
    with open(path, "wb") as f:
        np.save(f, rows)
    return np.load(path, mmap_mode="r"), starts


def _drop(rows: np.ndarray) -> None:
    """Delete the temporary file behind a memory-mapped array made by `_spill` / `pack_mixture`."""
    name = getattr(rows, "filename", None) or getattr(getattr(rows, "base", None), "filename", None)
    if name:
        Path(name).unlink(missing_ok=True)


def _whole_blocks(n: int, block_rows: int, up: bool = False) -> int:
    return -(-n // block_rows) * block_rows if up else n // block_rows * block_rows


def _pack_language(
    lang: str, texts: list[str], tokenizer, rows_total: int, val_fraction: float, seq_len: int, eos_id: int,
    block_rows: int = 1,
) -> tuple[tuple[np.ndarray, list], tuple[np.ndarray, list], dict]:
    """Val rows from the first shuffled docs, train rows from the following ones (split by document)."""
    n_val = max(1, int(round(val_fraction * rows_total))) if val_fraction > 0 else 0
    n_val = _whole_blocks(n_val, block_rows, up=True)
    n_train = _whole_blocks(rows_total - n_val, block_rows)
    if n_train < 1:
        raise HybridlabError(
            f"packing: {lang} gets {rows_total} row(s) of {seq_len} tokens, none left for training in whole blocks of "
            f"{block_rows} row(s); raise total_tokens or lower seq_len"
        )
    target_rows = n_val + n_train
    pool, nxt = _tokenize_until(texts, tokenizer, 0, target_rows * seq_len)
    available = pool.tokens_with_eos
    if available < target_rows * seq_len and val_fraction > 0:
        # Scarce language (all its text fits in the budget): size val on what exists, or val would
        # swallow the few documents train needs.
        n_val = _whole_blocks(max(1, int(round(val_fraction * (available // seq_len)))), block_rows, up=True)
    k = _prefix_len(pool, n_val * seq_len)
    val_docs, train_docs = pool.split(k)
    del pool
    more, _ = _tokenize_until(texts, tokenizer, nxt, n_train * seq_len - train_docs.tokens_with_eos)
    train_docs = _Docs.concat([train_docs, more])
    val_rows, val_starts = _pack_flat(val_docs, seq_len, eos_id)
    train_rows, train_starts = _pack_flat(train_docs, seq_len, eos_id)
    n_val_got = min(n_val, _whole_blocks(len(val_rows), block_rows))
    n_train_got = min(n_train, _whole_blocks(len(train_rows), block_rows))
    if n_train_got == 0 or (n_val > 0 and n_val_got == 0):
        raise HybridlabError(
            f"packing: {lang} has too little text for one train and one val block of {block_rows} x {seq_len} "
            f"tokens; add text, lower seq_len, or remove {lang}"
        )
    info = {
        "train_rows": n_train_got,
        "val_rows": n_val_got,
        "train_tokens": n_train_got * seq_len,
        "val_tokens": n_val_got * seq_len,
        "docs_available": len(texts),
        "docs_val": len(val_docs),  # docs consumed (a last doc may be cut by the dropped tail)
        "docs_train": len(train_docs),
        "short": n_train_got + n_val_got < target_rows,
    }
    return ((train_rows[:n_train_got], train_starts[:n_train_got]),
            (val_rows[:n_val_got], val_starts[:n_val_got]), info)


def pack_mixture(
    mono_df: pl.DataFrame,
    tokenizer,
    *,
    languages: list[str],
    english_share: float,
    seq_len: int,
    total_tokens: int,
    val_fraction: float,
    seed: int,
    weights: dict[str, float] | None = None,
    block_rows: int = 1,
    spill_dir: str | Path | None = None,
) -> PackedMixture:
    """Build the packed train/val mixture from mono-schema documents (see module docstring).

    `mono_df` may be a polars LazyFrame (e.g. `pl.scan_parquet`): each language's documents are then read
    when it is packed. `spill_dir` (the output directory): each language's rows go to a temporary file
    there as soon as it is packed and the rows are assembled into a memory-mapped tokens file that
    `write_packed` publishes, so host memory holds one language's text and tokens at a time.
    """
    lazy = isinstance(mono_df, pl.LazyFrame)
    columns = mono_df.collect_schema().names() if lazy else mono_df.columns
    missing = {"doc_id", "lang", "text"} - set(columns)
    if missing:
        raise HybridlabError(f"packing: documents lack columns {sorted(missing)}; pass a mono-schema frame")
    if not 0.0 <= val_fraction < 1.0:
        raise HybridlabError(f"packing: val_fraction={val_fraction} must be in [0, 1)")
    if seq_len < 2 or total_tokens < seq_len:
        raise HybridlabError(f"packing: need seq_len >= 2 and total_tokens >= seq_len (got {seq_len}, {total_tokens})")
    if block_rows < 1:
        raise HybridlabError(f"packing: block_rows={block_rows} must be >= 1")
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise HybridlabError("packing: the tokenizer has no eos_token; use a tokenizer with an EOS token")
    shares = _target_shares(list(languages), english_share, weights)

    per_lang: dict[str, dict] = {}
    packed: dict[str, dict[str, tuple[np.ndarray, list]]] = {}
    if spill_dir is not None:  # temporaries of a killed earlier run
        for tag in ["tokens", "heldout"] + [f"{lang}.{split}" for lang in shares for split in ("train", "val")]:
            remove_stale(Path(spill_dir) / f"tokens.{tag}.npy")
    for lang, share in shares.items():
        docs_df = mono_df.filter(pl.col("lang") == lang).select("doc_id", "text").sort("doc_id")
        docs_df = docs_df.collect() if lazy else docs_df
        if docs_df.height == 0:
            raise HybridlabError(f"packing: no documents for {lang}; add text for it or remove it from the languages")
        if docs_df["doc_id"].n_unique() != docs_df.height:
            raise HybridlabError(f"packing: duplicate doc_id values for {lang}; deduplicate the corpus first")
        texts = docs_df["text"].to_list()
        texts = [texts[j] for j in _lang_rng(seed, lang).permutation(len(texts))]

        rows_total = int(round(share * total_tokens / seq_len))
        del docs_df
        train, val, info = _pack_language(lang, texts, tokenizer, rows_total, val_fraction, seq_len, eos_id, block_rows)
        del texts
        info["max_token_id"] = max([int(r.max()) for r, _ in (train, val) if r.size], default=-1)
        if spill_dir is not None:  # this language's rows to disk now; memory-mapped from here on
            train, val = (_spill(spill_dir, f"{lang}.{split}", rows, starts)
                          for split, (rows, starts) in (("train", train), ("val", val)))
        packed[lang] = {"train": train, "val": val}
        per_lang[lang] = {"target_share": share, "target_rows": rows_total, **info}

    train_total = sum(s["train_tokens"] for s in per_lang.values())
    for s in per_lang.values():
        s["achieved_share"] = s["train_tokens"] / train_total

    max_id = max(s.pop("max_token_id") for s in per_lang.values())
    counts = {split: [len(packed[lang][split][0]) for lang in shares] for split in ("train", "val")}
    n_train, n_val = sum(counts["train"]), sum(counts["val"])
    # Shuffle whole blocks: rows inside a block stay consecutive text of one language stream.
    block_perm = np.random.default_rng(seed).permutation(n_train // block_rows)
    perm = (block_perm[:, None] * block_rows + np.arange(block_rows)[None, :]).reshape(-1)
    shape = (n_train + n_val, seq_len)
    if spill_dir is not None:
        tokens_NS = np.lib.format.open_memmap(_spill_path(spill_dir, "tokens"), mode="w+", dtype=np.int32, shape=shape)
    else:
        tokens_NS = np.empty(shape, dtype=np.int32)
    # Row i of the shuffled train rows is joined train row perm[i] (languages in order); filled language by
    # language, so only one language's rows are read at a time.
    start = 0
    for lang, n in zip(shares, counts["train"]):
        rows = packed[lang]["train"][0]
        where = np.flatnonzero((perm >= start) & (perm < start + n))
        for lo in range(0, len(where), 8192):
            idx = where[lo:lo + 8192]
            tokens_NS[idx] = rows[perm[idx] - start]
        start += n
    at = n_train
    for lang, n in zip(shares, counts["val"]):
        tokens_NS[at:at + n] = packed[lang]["val"][0]
        at += n
    train_starts = [st for lang in shares for st in packed[lang]["train"][1]]
    train_langs = [lang for lang, n in zip(shares, counts["train"]) for _ in range(n)]
    langs = [train_langs[j] for j in perm] + [lang for lang, n in zip(shares, counts["val"]) for _ in range(n)]
    doc_starts = [train_starts[j] for j in perm] + [st for lang in shares for st in packed[lang]["val"][1]]
    splits = ["train"] * n_train + ["val"] * n_val
    if spill_dir is not None:
        tokens_NS.flush()
        for lang in shares:
            for split in ("train", "val"):
                _drop(packed[lang][split][0])
    meta = pl.DataFrame({"row": np.arange(len(tokens_NS)), "lang": langs, "split": splits}, schema=META_SCHEMA)
    stats = {
        "seq_len": seq_len,
        "seed": seed,
        "eos_id": int(eos_id),
        "block_rows": block_rows,
        "max_token_id": max_id,
        "english_share": english_share,
        "val_fraction": val_fraction,
        "total_tokens_requested": total_tokens,
        "train_tokens": train_total,
        "val_tokens": int(n_val * seq_len),
        "languages": per_lang,
    }
    return PackedMixture(tokens_NS=tokens_NS, meta=meta, stats=stats, doc_starts=doc_starts)


def with_parallel_heldout(mixture: PackedMixture, parallel_df: pl.DataFrame, tokenizer, *, languages: list[str],
                          n_sentences: int) -> PackedMixture:
    """`mixture` (packed without val rows) with val rows made of parallel-corpus sentences instead.

    Per language, the sentences are taken in sentence-id order, each followed by EOS, and packed into
    whole rows until the first `n_sentences` lie entirely inside them (the rows' last sentence may be cut;
    ``stats["heldout"]`` counts the whole ones). Training rows never hold parallel text, so a held-out
    score on these rows is on text the model never trained on (as long as the corpora share no sentence).
    """
    if (mixture.meta["split"] == "val").any():
        raise HybridlabError("packing: parallel held-out rows replace the mixture's val rows; pack with "
                             "val_fraction=0")
    seq_len = mixture.tokens_NS.shape[1]
    eos_id = int(mixture.stats["eos_id"])
    rows_all, starts_all, langs_all, info = [], [], [], {}
    for lang in languages:
        texts = parallel_df.filter(pl.col("lang") == lang).sort("sid")["text"].to_list()
        if len(texts) < n_sentences:
            raise HybridlabError(f"packing: the parallel corpus has {len(texts)} sentences of {lang}, fewer than "
                                 f"the {n_sentences} held-out sentences asked for; lower data.heldout.sentences")
        docs = tokenizer(texts, add_special_tokens=False)["input_ids"]
        ends = np.cumsum([len(d) + 1 for d in docs])
        n_rows = -(-int(ends[n_sentences - 1]) // seq_len)
        k = min(len(docs), int(np.searchsorted(ends, n_rows * seq_len)) + 1)
        rows, starts = pack_stream(docs[:k], seq_len, eos_id)
        if len(rows) < n_rows:
            raise HybridlabError(f"packing: {lang}'s parallel text fills {len(rows)} of the {n_rows} held-out rows "
                                 f"of {seq_len} tokens; lower data.heldout.sentences or seq_len")
        rows, starts = rows[:n_rows], starts[:n_rows]
        rows_all.append(rows)
        starts_all += starts
        langs_all += [lang] * n_rows
        info[lang] = {"rows": n_rows, "tokens": n_rows * seq_len,
                      "sentences": int(np.searchsorted(ends, n_rows * seq_len, side="right"))}
    val = np.concatenate(rows_all) if rows_all else np.zeros((0, seq_len), dtype=np.int32)
    n_train = len(mixture.tokens_NS)
    meta = pl.concat([mixture.meta, pl.DataFrame(
        {"row": np.arange(n_train, n_train + len(val)), "lang": langs_all, "split": ["val"] * len(val)},
        schema=META_SCHEMA)])
    stats = {**mixture.stats, "val_tokens": int(val.size), "val_fraction": 0.0,
             "heldout": {"source": "parallel", "sentences": n_sentences, "languages": info}}
    return PackedMixture(tokens_NS=_append_rows(mixture.tokens_NS, val), meta=meta,
                         stats=stats, doc_starts=list(mixture.doc_starts or []) + starts_all)


def _append_rows(tokens: np.ndarray, more: np.ndarray) -> np.ndarray:
    """`tokens` with the rows `more` after them; a memory-mapped `tokens` (pack_mixture's spill_dir) stays
    on disk: copied in chunks into a new temporary file next to it, the old one removed."""
    if not isinstance(tokens, np.memmap):
        return np.ascontiguousarray(np.concatenate([tokens, more]))
    path = _spill_path(Path(tokens.filename).parent, "heldout")
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.int32, shape=(len(tokens) + len(more), tokens.shape[1]))
    for lo in range(0, len(tokens), 8192):
        hi = min(lo + 8192, len(tokens))
        out[lo:hi] = tokens[lo:hi]
    out[len(tokens):] = more
    out.flush()
    _drop(tokens)
    return out

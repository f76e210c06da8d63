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
import json
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
import torch

from hybridlab.atomic import atomic_file, publish, remove_stale, temp_path
from hybridlab.errors import HybridlabError

ENGLISH = "eng_Latn"
META_SCHEMA = {"row": pl.Int64, "lang": pl.Utf8, "split": pl.Utf8}
_TOKENIZE_BATCH = 64


@dataclass(frozen=True)
class PackedMixture:
    tokens_NS: np.ndarray  # int32 [N, seq_len]
    meta: pl.DataFrame  # row, lang, split
    stats: dict
    doc_starts: list[np.ndarray] | None = None  # per row: int32 positions where a document starts


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


def _atomic(path: Path, write) -> None:
    with atomic_file(path) as tmp:
        write(tmp)


def _save_npy(array: np.ndarray):
    def save(p: Path) -> None:
        with open(p, "wb") as f:  # a file object: np.save would append ".npy" to a temporary path
            np.save(f, array)

    return save


def write_packed(out_dir: str | Path, mixture: PackedMixture) -> None:
    """Write tokens.npy, doc_starts.npy, doc_offsets.npy, meta.parquet and stats.json (each atomically)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    starts = mixture.doc_starts
    if starts is None or len(starts) != len(mixture.tokens_NS):
        raise HybridlabError("packing: the mixture has no per-row document starts; build it with pack_mixture")
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in starts])
    flat = np.concatenate(starts).astype(np.int32) if starts else np.zeros(0, dtype=np.int32)
    tokens = mixture.tokens_NS
    if isinstance(tokens, np.memmap) and Path(tokens.filename).parent.resolve() == out.resolve():
        tokens.flush()  # pack_mixture(spill_dir=out) built it on disk: publish the file itself
        publish(tokens.filename, out / "tokens.npy")
    else:
        _atomic(out / "tokens.npy", _save_npy(tokens.astype(np.int32, copy=False)))
    _atomic(out / "doc_starts.npy", _save_npy(flat))
    _atomic(out / "doc_offsets.npy", _save_npy(offsets))
    _atomic(out / "meta.parquet", lambda p: mixture.meta.write_parquet(p))
    _atomic(out / "stats.json", lambda p: p.write_text(json.dumps(mixture.stats, indent=2, sort_keys=True) + "\n"))


def pack_stream_to_disk(
    texts: Iterable[str],
    tokenizer,
    out_dir: str | Path,
    *,
    lang: str,
    seq_len: int,
    train_tokens: int,
    val_fraction: float,
    seed: int,
    block_rows: int = 1,
) -> dict:
    """Stream documents until `train_tokens` (+ val rows) are packed, writing the `write_packed` layout.

    For text too large for memory (BLD-NL's English web stream at the paper preset: tens of billions of
    tokens): tokens.npy is a memory-mapped file filled as documents arrive, in stream order (the source
    is assumed shuffled). The first documents fill ``max(1, round(val_fraction * rows))`` val rows
    (whole blocks), the following ones the train rows; train blocks are then placed in the
    ``default_rng(seed)`` block order of `pack_mixture`. A stream that ends early is a one-line error
    naming both token counts. Returns the stats.
    """
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise HybridlabError("packing: the tokenizer has no eos_token; use a tokenizer with an EOS token")
    if block_rows < 1 or seq_len < 2 or train_tokens < 1:
        raise HybridlabError(f"packing: need block_rows >= 1, seq_len >= 2, train_tokens >= 1 "
                             f"(got {block_rows}, {seq_len}, {train_tokens})")
    n_train = _whole_blocks(-(-train_tokens // seq_len), block_rows, up=True)
    n_val = _whole_blocks(max(1, int(round(val_fraction * n_train))), block_rows, up=True) if val_fraction > 0 else 0
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    remove_stale(out / "tokens.npy")
    tmp = temp_path(out / "tokens.npy")
    tokens = np.lib.format.open_memmap(tmp, mode="w+", dtype=np.int32, shape=(n_val + n_train, seq_len))
    block_perm = np.random.default_rng(seed).permutation(n_train // block_rows)
    slot = np.empty_like(block_perm)
    slot[block_perm] = np.arange(len(block_perm))  # stream block b is stored as train block slot[b]

    def stored_row(k: int) -> int:  # k-th packed row of the stream -> row of tokens.npy
        if k < n_val:
            return n_train + k
        b, r = divmod(k - n_val, block_rows)
        return int(slot[b]) * block_rows + r

    starts: list[np.ndarray] = [np.zeros(0, np.int32)] * (n_val + n_train)
    buf: list[np.ndarray] = []  # pending stream tokens (not yet a whole row)
    buf_starts: list[int] = []  # document starts inside the pending tokens
    buffered, k, max_id, n_docs = 0, 0, -1, 0
    it = iter(texts)
    while k < n_val + n_train:
        batch = [t for t in itertools.islice(it, _TOKENIZE_BATCH) if t]
        if not batch:
            break
        for doc in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            if doc:
                n_docs += 1
                buf_starts.append(buffered)
                buf += [np.asarray(doc, dtype=np.int64), np.array([eos_id], dtype=np.int64)]
                buffered += len(doc) + 1
        stream = np.concatenate(buf) if buf else np.zeros(0, np.int64)
        st = np.asarray(buf_starts, dtype=np.int64)
        while len(stream) >= seq_len and k < n_val + n_train:
            # Whole rows of the current region (val, then train); a document cut at a row's end continues
            # in the next row of the same region.
            limit = n_val - k if k < n_val else n_val + n_train - k
            full = min(len(stream) // seq_len, limit)
            for j in range(full):
                row = stream[j * seq_len:(j + 1) * seq_len]
                tokens[stored_row(k)] = row
                max_id = max(max_id, int(row.max()))
                lo, hi = np.searchsorted(st, [j * seq_len, (j + 1) * seq_len])
                starts[stored_row(k)] = (st[lo:hi] - j * seq_len).astype(np.int32)
                k += 1
            cut = full * seq_len
            if k == n_val and full == limit and n_val > 0:
                # val is full: train starts at the next document start, so no document is in both splits
                nxt = st[st >= cut]
                cut = int(nxt[0]) if len(nxt) else len(stream)
            stream, st = stream[cut:], st[st >= cut] - cut
        buf, buffered, buf_starts = [stream], len(stream), st.tolist()
    if k < n_val + n_train:
        del tokens
        tmp.unlink()
        raise HybridlabError(
            f"packing: the {lang} stream ended after {k * seq_len} tokens but {(n_val + n_train) * seq_len} are needed "
            f"({train_tokens} train + val); use a larger source or lower the training budget"
        )
    tokens.flush()
    del tokens
    publish(tmp, out / "tokens.npy")
    offsets = np.zeros(len(starts) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(x) for x in starts])
    _atomic(out / "doc_starts.npy", _save_npy(np.concatenate(starts).astype(np.int32)))
    _atomic(out / "doc_offsets.npy", _save_npy(offsets))
    meta = pl.DataFrame({"row": np.arange(n_val + n_train), "lang": [lang] * (n_val + n_train),
                         "split": ["train"] * n_train + ["val"] * n_val}, schema=META_SCHEMA)
    _atomic(out / "meta.parquet", lambda p: meta.write_parquet(p))
    info = {"target_share": 1.0, "target_rows": n_val + n_train, "train_rows": n_train, "val_rows": n_val,
            "train_tokens": n_train * seq_len, "val_tokens": n_val * seq_len, "docs_streamed": n_docs,
            "short": False, "achieved_share": 1.0}
    stats = {"seq_len": seq_len, "seed": seed, "eos_id": int(eos_id), "block_rows": block_rows, "max_token_id": max_id,
             "english_share": 1.0, "val_fraction": val_fraction, "total_tokens_requested": train_tokens,
             "train_tokens": n_train * seq_len, "val_tokens": n_val * seq_len, "languages": {lang: info},
             "streamed": True}
    _atomic(out / "stats.json", lambda p: p.write_text(json.dumps(stats, indent=2, sort_keys=True) + "\n"))
    return stats


def read_stats(out_dir: str | Path) -> dict:
    """stats.json of a packed mixture directory."""
    path = Path(out_dir) / "stats.json"
    if not path.is_file():
        raise HybridlabError(f"packed data: {path} is missing; run the packing step first")
    return json.loads(path.read_text())


class Documents(NamedTuple):
    """Packed rows with per-document positions: the input of a document-masked forward.

    ``position_ids`` restart at 0 at every document start; transformers turns them into a block-diagonal
    causal mask and the hybrids' mixers into state resets (``hybridlab.models.convert.packed_documents``).
    Collates with ``default_collate`` and moves with the training loop's device transfer like a tuple.
    """

    input_ids: torch.Tensor  # [..., T]
    position_ids: torch.Tensor  # [..., T]


def split_batch(batch) -> tuple[torch.Tensor, torch.Tensor | None]:
    """(input ids, position ids or None) of a plain id tensor or a :class:`Documents` batch."""
    if isinstance(batch, Documents):
        return batch.input_ids, batch.position_ids
    return batch, None


def batch_rows(batch, start: int, stop: int):
    """Rows ``start:stop`` of a plain id tensor or a :class:`Documents` batch."""
    if isinstance(batch, Documents):
        return Documents(batch.input_ids[start:stop], batch.position_ids[start:stop])
    return batch[start:stop]


def batch_to(batch, device):
    """A plain id tensor or a :class:`Documents` batch on ``device``."""
    if isinstance(batch, Documents):
        return Documents(batch.input_ids.to(device), batch.position_ids.to(device))
    return batch.to(device)


def in_document_targets(batch) -> torch.Tensor:
    """Bool ``[B, T]``: position t has a successor in its own document (so next-token losses score it).

    Plain rows: every position but the last. Documents: also not the last token of each document (its
    successor begins the next document, which the masked forward keeps out of its context).
    """
    ids, pos = split_batch(batch)
    keep = torch.ones_like(ids, dtype=torch.bool)
    keep[..., -1] = False
    if pos is not None:
        keep[..., :-1] &= pos[..., 1:] != 0
    return keep


class PackedDataset(torch.utils.data.Dataset):
    """Rows of one split (optionally one language) of a packed mixture, as int64 LongTensors [seq_len].

    With ``documents=True`` an item is :class:`Documents` (the row and its per-document positions, from
    the mixture's document starts) for document-masked training. `doc_starts(i)` gives the positions
    where a document starts in row i; `block_rows` how many consecutive rows of one stream the packer
    kept together.
    """

    def __init__(self, out_dir: str | Path, split: str, lang: str | None = None, documents: bool = False):
        out = Path(out_dir)
        for name in ("tokens.npy", "meta.parquet"):
            if not (out / name).is_file():
                raise HybridlabError(f"packed data: {out / name} is missing; run the packing step first")
        self.dir = out
        self.tokens = np.load(out / "tokens.npy", mmap_mode="r")
        meta = pl.read_parquet(out / "meta.parquet").filter(pl.col("split") == split)
        if lang is not None:
            meta = meta.filter(pl.col("lang") == lang)
        if meta.height == 0:
            raise HybridlabError(f"packed data: no rows for split={split!r} lang={lang!r} in {out}; check the names")
        self.rows = meta["row"].to_numpy()
        self.langs: list[str] = meta["lang"].to_list()
        self.seq_len = int(self.tokens.shape[1])
        stats = json.loads((out / "stats.json").read_text()) if (out / "stats.json").is_file() else {}
        self.block_rows = int(stats.get("block_rows", 1))
        self.eos_id = stats.get("eos_id")
        self._starts = self._offsets = None
        if (out / "doc_starts.npy").is_file() and (out / "doc_offsets.npy").is_file():
            self._starts = np.load(out / "doc_starts.npy", mmap_mode="r")
            self._offsets = np.load(out / "doc_offsets.npy", mmap_mode="r")
        elif documents:
            raise HybridlabError(f"packed data: {out} has no doc_starts.npy/doc_offsets.npy, which "
                                 "data.packing.document_mask needs; repack the mixture")
        self.documents = documents

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int):
        ids = torch.from_numpy(np.asarray(self.tokens[self.rows[i]], dtype=np.int64))
        if not self.documents:
            return ids
        return Documents(ids, torch.from_numpy(position_ids(self.doc_starts(i), self.seq_len)))

    def doc_starts(self, i: int) -> np.ndarray:
        """Positions (int64, ascending) at which a document starts inside row i of this split."""
        if self._starts is None:
            raise HybridlabError(f"packed data: {self.dir} has no doc_starts.npy/doc_offsets.npy; repack the mixture")
        r = self.rows[i]
        return np.asarray(self._starts[self._offsets[r]:self._offsets[r + 1]], dtype=np.int64)


def val_stream(mixture_dir: str | Path) -> np.ndarray:
    """The English val rows of a packed mixture concatenated: contiguous text in document order."""
    val = PackedDataset(mixture_dir, "val")
    return np.concatenate([np.asarray(val.tokens[r], dtype=np.int64) for r in val.rows])


def documents_from_stream(stream: np.ndarray, eos_id: int) -> list[np.ndarray]:
    """Split a token stream at EOS (packing writes `doc EOS doc EOS ...`); empty pieces dropped."""
    cuts = np.flatnonzero(stream == eos_id)
    pieces = np.split(stream, cuts)
    docs = [p[1:] if len(p) and p[0] == eos_id else p for p in pieces]
    return [d for d in docs if len(d)]


def check_row_blocks(rows: PackedDataset, k: int, what: str) -> None:
    """One-line error unless sequences of `k` joined rows stay inside the packer's blocks (contiguous text)."""
    if k > 1 and rows.block_rows % k:
        raise HybridlabError(
            f"{what}: a sequence joins {k} packed rows but {rows.dir} keeps blocks of {rows.block_rows} consecutive "
            f"rows, so joined rows would be unrelated text; repack with block_rows a multiple of {k}"
        )


# ---------------------------------------------------------------------------------------------------------
# Document masking: what a model needs to keep attention and recurrent state inside each document.
# A sequence of length T with document starts S (ascending, in [0, T)) has segments
# [0, s_1), [s_1, s_2), ..., [s_m, T) (the first one is the tail of a document begun in an earlier row
# when 0 is not in S). fla's varlen kernels take `cu_seqlens` over a batch flattened to [1, B*T];
# HF attention takes `position_ids` that restart at 0 per segment plus a block-diagonal causal mask.


def segment_lengths(starts: Sequence[int], length: int) -> np.ndarray:
    """Lengths of the segments a sequence of `length` tokens with document `starts` splits into."""
    st = np.asarray(starts, dtype=np.int64)
    if st.size and (st[0] < 0 or st[-1] >= length or (np.diff(st) <= 0).any()):
        raise HybridlabError(f"document starts {st.tolist()} must be ascending and inside [0, {length})")
    bounds = np.unique(np.concatenate([[0], st, [length]]))
    return np.diff(bounds)


def position_ids(starts: Sequence[int], length: int) -> np.ndarray:
    """Positions that restart at 0 at every segment start (int64 [length])."""
    lens = segment_lengths(starts, length)
    return np.concatenate([np.arange(n) for n in lens]).astype(np.int64)


def cu_seqlens(batch_starts: Sequence[Sequence[int]], length: int) -> np.ndarray:
    """fla-style cumulative segment boundaries (int32 [n_segments + 1]) of a batch flattened to [1, B*T]."""
    lens = np.concatenate([segment_lengths(s, length) for s in batch_starts]) if len(batch_starts) else np.zeros(0)
    return np.concatenate([[0], np.cumsum(lens)]).astype(np.int32)


def document_causal_mask(starts: Sequence[int], length: int) -> np.ndarray:
    """Bool [length, length]: query i may attend to key j iff j <= i and both lie in one segment."""
    seg = np.repeat(np.arange(len(segment_lengths(starts, length))), segment_lengths(starts, length))
    return (seg[:, None] == seg[None, :]) & np.tri(length, dtype=bool)

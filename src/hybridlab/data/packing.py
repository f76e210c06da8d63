"""Tokenise a multilingual document mix and pack it into fixed-length, single-language sequences.

Definitions:

* Mixture (FineWeb-2 style): ``english_share`` of the token budget goes to ``eng_Latn`` documents, the
  rest to the configured non-English `languages`, evenly or by `weights` (normalised). Budgets are
  whole sequences: language L gets ``round(share_L * total_tokens / seq_len)`` rows, train + val.
* Packing (`pack_documents`): each document's tokens are followed by one EOS (so EOS separates and
  ends documents), the documents are concatenated and cut into rows of ``seq_len``; the tail that does
  not fill a row is dropped. Documents may straddle two rows of the same language.
* One language per row: every language is packed on its own, so held-out loss can be read per
  language (``meta.parquet``: ``row``, ``lang``, ``split``).
* Determinism: a language's documents are sorted by ``doc_id`` and shuffled with
  ``default_rng([seed, crc32(lang)])`` (adding a language leaves the others unchanged). The
  train rows of all languages are then shuffled with ``default_rng(seed)``; val rows stay grouped.
* Train/val split by document: in shuffled order, the first documents fill the val rows
  (``max(1, round(val_fraction * rows_L))`` when ``val_fraction > 0``), the following documents the
  train rows, so no document is in both.
* Scarce languages (all their text fits in the budget) use what exists: val gets
  ``max(1, round(val_fraction * available_rows))`` rows, train the remaining documents.
  ``stats.json`` records per language the target and achieved token shares (achieved = that
  language's train tokens / all train tokens) and a ``short`` flag.

Output of `write_packed`: ``tokens.npy`` (int32 [N, seq_len], read with mmap), ``meta.parquet`` and
``stats.json``; all byte-stable for the same inputs and seed.
"""

from __future__ import annotations

import json
import os
import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch

from hybridlab.errors import HybridlabError

ENGLISH = "eng_Latn"
META_SCHEMA = {"row": pl.Int64, "lang": pl.Utf8, "split": pl.Utf8}
_TOKENIZE_BATCH = 64


@dataclass(frozen=True)
class PackedMixture:
    tokens_NS: np.ndarray  # int32 [N, seq_len]
    meta: pl.DataFrame  # row, lang, split
    stats: dict


def pack_documents(token_lists: Sequence[Sequence[int]], seq_len: int, eos_id: int) -> np.ndarray:
    """Join documents as ``doc EOS doc EOS ...`` and cut into int32 rows of `seq_len` (tail dropped)."""
    if seq_len < 1:
        raise HybridlabError(f"packing: seq_len={seq_len} must be >= 1")
    parts = []
    for doc in token_lists:
        parts.append(np.asarray(doc, dtype=np.int64))
        parts.append(np.array([eos_id], dtype=np.int64))
    stream = np.concatenate(parts) if parts else np.zeros(0, dtype=np.int64)
    n_rows = len(stream) // seq_len
    return stream[: n_rows * seq_len].astype(np.int32).reshape(n_rows, seq_len)


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


def _tokenize_until(texts: list[str], tokenizer, start: int, n_tokens: int) -> tuple[list[list[int]], int]:
    """Tokenise texts[start:] in batches until the docs (+1 EOS each) hold >= n_tokens; return docs and next index."""
    docs: list[list[int]] = []
    have = 0
    i = start
    while have < n_tokens and i < len(texts):
        batch = texts[i : i + _TOKENIZE_BATCH]
        ids = tokenizer(batch, add_special_tokens=False)["input_ids"]
        for doc in ids:
            i += 1
            if not doc:
                continue
            docs.append(doc)
            have += len(doc) + 1
            if have >= n_tokens:
                break
    return docs, i


def _prefix_len(docs: list[list[int]], n_tokens: int) -> int:
    """Number of leading docs whose tokens (+1 EOS each) first reach n_tokens (all docs if never)."""
    have = 0
    for k, doc in enumerate(docs):
        if have >= n_tokens:
            return k
        have += len(doc) + 1
    return len(docs)


def _pack_language(
    lang: str, texts: list[str], tokenizer, rows_total: int, val_fraction: float, seq_len: int, eos_id: int
) -> tuple[np.ndarray, np.ndarray, dict]:
    """Val rows from the first shuffled docs, train rows from the following ones (split by document)."""
    n_val = max(1, int(round(val_fraction * rows_total))) if val_fraction > 0 else 0
    n_train = rows_total - n_val
    if n_train < 1:
        raise HybridlabError(
            f"packing: {lang} gets {rows_total} row(s) of {seq_len} tokens, none left for training; "
            f"raise total_tokens or lower seq_len"
        )
    pool, nxt = _tokenize_until(texts, tokenizer, 0, rows_total * seq_len)
    available = sum(len(d) + 1 for d in pool)
    if available < rows_total * seq_len and val_fraction > 0:
        # Scarce language (all its text fits in the budget): size val on what exists, or val would
        # swallow the few documents train needs.
        n_val = max(1, int(round(val_fraction * (available // seq_len))))
    k = _prefix_len(pool, n_val * seq_len)
    val_docs, train_docs = pool[:k], pool[k:]
    more, _ = _tokenize_until(texts, tokenizer, nxt, n_train * seq_len - sum(len(d) + 1 for d in train_docs))
    train_docs += more
    val_rows = pack_documents(val_docs, seq_len, eos_id)[:n_val]
    train_rows = pack_documents(train_docs, seq_len, eos_id)[:n_train]
    if len(train_rows) == 0 or (n_val > 0 and len(val_rows) == 0):
        raise HybridlabError(
            f"packing: {lang} has too little text for one train and one val row of {seq_len} tokens; "
            f"add text, lower seq_len, or remove {lang}"
        )
    info = {
        "train_rows": len(train_rows),
        "val_rows": len(val_rows),
        "train_tokens": len(train_rows) * seq_len,
        "val_tokens": len(val_rows) * seq_len,
        "docs_available": len(texts),
        "docs_val": len(val_docs),  # docs consumed (a last doc may be cut by the dropped tail)
        "docs_train": len(train_docs),
        "short": len(train_rows) + len(val_rows) < rows_total,
    }
    return train_rows, val_rows, info


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
) -> PackedMixture:
    """Build the packed train/val mixture from mono-schema documents (see module docstring)."""
    missing = {"doc_id", "lang", "text"} - set(mono_df.columns)
    if missing:
        raise HybridlabError(f"packing: documents lack columns {sorted(missing)}; pass a mono-schema frame")
    if not 0.0 <= val_fraction < 1.0:
        raise HybridlabError(f"packing: val_fraction={val_fraction} must be in [0, 1)")
    if seq_len < 2 or total_tokens < seq_len:
        raise HybridlabError(f"packing: need seq_len >= 2 and total_tokens >= seq_len (got {seq_len}, {total_tokens})")
    eos_id = tokenizer.eos_token_id
    if eos_id is None:
        raise HybridlabError("packing: the tokenizer has no eos_token; use a tokenizer with an EOS token")
    shares = _target_shares(list(languages), english_share, weights)

    per_lang: dict[str, dict] = {}
    blocks: dict[str, dict[str, np.ndarray]] = {}
    for lang, share in shares.items():
        docs_df = mono_df.filter(pl.col("lang") == lang).sort("doc_id")
        if docs_df.height == 0:
            raise HybridlabError(f"packing: no documents for {lang}; add text for it or remove it from the languages")
        if docs_df["doc_id"].n_unique() != docs_df.height:
            raise HybridlabError(f"packing: duplicate doc_id values for {lang}; deduplicate the corpus first")
        texts = docs_df["text"].to_list()
        texts = [texts[j] for j in _lang_rng(seed, lang).permutation(len(texts))]

        rows_total = int(round(share * total_tokens / seq_len))
        train_rows, val_rows, info = _pack_language(lang, texts, tokenizer, rows_total, val_fraction, seq_len, eos_id)
        blocks[lang] = {"train": train_rows, "val": val_rows}
        per_lang[lang] = {"target_share": share, "target_rows": rows_total, **info}

    train_total = sum(s["train_tokens"] for s in per_lang.values())
    for s in per_lang.values():
        s["achieved_share"] = s["train_tokens"] / train_total

    train_langs = [lang for lang in shares for _ in range(len(blocks[lang]["train"]))]
    train_all = np.concatenate([blocks[lang]["train"] for lang in shares])
    perm = np.random.default_rng(seed).permutation(len(train_all))
    val_langs = [lang for lang in shares for _ in range(len(blocks[lang]["val"]))]
    val_all = np.concatenate([blocks[lang]["val"] for lang in shares]).reshape(-1, seq_len)
    tokens_NS = np.ascontiguousarray(np.concatenate([train_all[perm], val_all]))
    langs = [train_langs[j] for j in perm] + val_langs
    splits = ["train"] * len(train_all) + ["val"] * len(val_all)
    meta = pl.DataFrame({"row": np.arange(len(tokens_NS)), "lang": langs, "split": splits}, schema=META_SCHEMA)
    stats = {
        "seq_len": seq_len,
        "seed": seed,
        "eos_id": int(eos_id),
        "english_share": english_share,
        "val_fraction": val_fraction,
        "total_tokens_requested": total_tokens,
        "train_tokens": train_total,
        "val_tokens": int(len(val_all) * seq_len),
        "languages": per_lang,
    }
    return PackedMixture(tokens_NS=tokens_NS, meta=meta, stats=stats)


def _atomic(path: Path, write) -> None:
    tmp = path.with_name(path.name + ".tmp")
    write(tmp)
    os.replace(tmp, path)


def write_packed(out_dir: str | Path, mixture: PackedMixture) -> None:
    """Write ``tokens.npy``, ``meta.parquet`` and ``stats.json`` under `out_dir` (each written atomically)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    def save_tokens(p: Path) -> None:
        with open(p, "wb") as f:
            np.save(f, mixture.tokens_NS.astype(np.int32, copy=False))

    _atomic(out / "tokens.npy", save_tokens)
    _atomic(out / "meta.parquet", lambda p: mixture.meta.write_parquet(p))
    _atomic(out / "stats.json", lambda p: p.write_text(json.dumps(mixture.stats, indent=2, sort_keys=True) + "\n"))


class PackedDataset(torch.utils.data.Dataset):
    """Rows of one split (optionally one language) of a packed mixture, as int64 LongTensors [seq_len]."""

    def __init__(self, out_dir: str | Path, split: str, lang: str | None = None):
        out = Path(out_dir)
        for name in ("tokens.npy", "meta.parquet"):
            if not (out / name).is_file():
                raise HybridlabError(f"packed data: {out / name} is missing; run the packing step first")
        self.tokens = np.load(out / "tokens.npy", mmap_mode="r")
        meta = pl.read_parquet(out / "meta.parquet").filter(pl.col("split") == split)
        if lang is not None:
            meta = meta.filter(pl.col("lang") == lang)
        if meta.height == 0:
            raise HybridlabError(f"packed data: no rows for split={split!r} lang={lang!r} in {out}; check the names")
        self.rows = meta["row"].to_numpy()
        self.langs: list[str] = meta["lang"].to_list()
        self.seq_len = int(self.tokens.shape[1])

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.from_numpy(np.asarray(self.tokens[self.rows[i]], dtype=np.int64))

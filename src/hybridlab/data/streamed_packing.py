"""Packing a document stream too large for memory (an English web stream at the paper preset) straight into
the files `write_packed` writes, with the train-block order of `pack_mixture`.
"""

from __future__ import annotations

import itertools
import json
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import polars as pl

from hybridlab.atomic import publish, remove_stale, temp_path
from hybridlab.data.packed_files import META_SCHEMA, _atomic, _save_npy
from hybridlab.data.packing import _TOKENIZE_BATCH, _whole_blocks
from hybridlab.errors import HybridlabError


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

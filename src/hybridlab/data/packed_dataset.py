"""Reading a packed mixture for training and evaluation: `PackedDataset` rows, `Documents` batches with
per-document positions, and the document-mask helpers that keep attention and recurrent state inside a document.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import NamedTuple

import numpy as np
import polars as pl
import torch

from hybridlab.errors import HybridlabError


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

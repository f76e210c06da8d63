"""The files of a packed mixture and the in-memory mixture they are written from: `write_packed` writes
`PackedMixture`'s rows, document starts, meta and stats atomically, `read_stats` reads the stats back.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl

from hybridlab.atomic import atomic_file, publish
from hybridlab.errors import HybridlabError

META_SCHEMA = {"row": pl.Int64, "lang": pl.Utf8, "split": pl.Utf8}


@dataclass(frozen=True)
class PackedMixture:
    tokens_NS: np.ndarray  # int32 [N, seq_len]
    meta: pl.DataFrame  # row, lang, split
    stats: dict
    doc_starts: list[np.ndarray] | None = None  # per row: int32 positions where a document starts


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


def read_stats(out_dir: str | Path) -> dict:
    """stats.json of a packed mixture directory."""
    path = Path(out_dir) / "stats.json"
    if not path.is_file():
        raise HybridlabError(f"packed data: {path} is missing; run the packing step first")
    return json.loads(path.read_text())

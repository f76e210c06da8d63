"""Spaced Retrieval: a synthetic copy-after-a-gap task for studying which layers learn retrieval.

Definitions (this project's; the task follows the BLD / competing-learning setting):

* Sequence for digits X1..Xt and gap g::

      position: 0    1..t       t+1..t+g   t+g+1   t+g+2..2t+g+1
      token:    $    X1..Xt     _ x g      $       X1..Xt

  length T = 2t + g + 2. Digits are drawn uniformly from 0-9, the gap from ``cfg.gaps`` with
  ``cfg.gap_weights``.
* Vocabulary (fixed ids): digits 0-9 are ids 0-9, ``DOLLAR_ID`` = 10, ``FILL_ID`` = 11 (``_``),
  ``PAD_ID`` = 12; ``VOCAB_SIZE`` = 13.
* Labels follow the Hugging Face convention (NOT pre-shifted): ``labels[i]`` is the token at
  position i where that token is an answer digit, -100 everywhere else. The model's loss shifts, i.e.
  logits at position i are scored against ``labels[i + 1]`` (`retrieval_loss` does exactly that, and
  so does ``model(input_ids, labels=labels)`` of any transformers causal LM).
* ``answer_positions(t, g)`` are the positions whose NEXT-token prediction is an answer digit:
  t+g+1 .. 2t+g (the second ``$`` and all answer digits but the last). Evaluators read logits there.
* Batches with mixed gaps are right-padded with ``PAD_ID`` (labels -100, attention_mask 0).
* Splits are stored compactly (digits + gap per example, parquet) and expanded at batch time, so a
  split with gap 8192 costs 5 bytes + 4 bytes per example on disk.
* Determinism: split k of ("train", "val", "test") is drawn from ``np.random.default_rng([seed, k])``,
  so the three splits use distinct streams. The gap mix is exact: ``round`` of n * weight per gap
  (largest remainder), then shuffled. Train/test sequences may coincide (10^t digit strings); use
  `collision_rate` to report how often.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np
import polars as pl
import torch
import torch.nn.functional as F

from hybridlab.errors import HybridlabError

DIGIT_IDS = tuple(range(10))
DOLLAR_ID = 10
FILL_ID = 11
PAD_ID = 12
VOCAB_SIZE = 13
IGNORE_INDEX = -100
ID_TO_STR = ("0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "$", "_", "<pad>")

SPLITS = ("train", "val", "test")
_FORMAT = "hybridlab.spaced_retrieval/v1"


@dataclass(frozen=True)
class SpacedRetrievalConfig:
    """Task shape and split sizes; validated on construction."""

    t: int = 5
    gaps: tuple[int, ...] = (64, 8192)
    gap_weights: tuple[float, ...] = (0.5, 0.5)
    n_train: int = 10_000
    n_val: int = 500
    n_test: int = 500
    seed: int = 0

    def __post_init__(self) -> None:
        object.__setattr__(self, "gaps", tuple(int(g) for g in self.gaps))
        object.__setattr__(self, "gap_weights", tuple(float(w) for w in self.gap_weights))
        if self.t < 1:
            raise HybridlabError(f"spaced retrieval: t={self.t} must be >= 1; set t to the number of digits to copy")
        if not self.gaps or any(g < 0 for g in self.gaps):
            raise HybridlabError(f"spaced retrieval: gaps={self.gaps} must be a non-empty list of gaps >= 0")
        if len(self.gap_weights) != len(self.gaps):
            raise HybridlabError(
                f"spaced retrieval: {len(self.gaps)} gaps but {len(self.gap_weights)} gap_weights; give one weight per gap"
            )
        if any(w < 0 for w in self.gap_weights) or sum(self.gap_weights) <= 0:
            raise HybridlabError(f"spaced retrieval: gap_weights={self.gap_weights} must be >= 0 with a positive sum")
        for name in ("n_train", "n_val", "n_test"):
            if getattr(self, name) < 0:
                raise HybridlabError(f"spaced retrieval: {name}={getattr(self, name)} must be >= 0")

    def n_for(self, split: str) -> int:
        return {"train": self.n_train, "val": self.n_val, "test": self.n_test}[_check_split(split)]


@dataclass(frozen=True)
class RetrievalRecords:
    """Compact examples: ``digits_NK`` (uint8, K = t) and ``gaps_N`` (int64)."""

    digits_NK: np.ndarray
    gaps_N: np.ndarray

    def __post_init__(self) -> None:
        if self.digits_NK.ndim != 2 or self.gaps_N.shape != (self.digits_NK.shape[0],):
            raise HybridlabError(
                f"spaced retrieval records: digits {self.digits_NK.shape} and gaps {self.gaps_N.shape} do not match"
            )

    @property
    def t(self) -> int:
        return int(self.digits_NK.shape[1])

    def __len__(self) -> int:
        return int(self.digits_NK.shape[0])

    def seq_len(self, i: int) -> int:
        return sequence_length(self.t, int(self.gaps_N[i]))


def _check_split(split: str) -> str:
    if split not in SPLITS:
        raise HybridlabError(f"spaced retrieval: unknown split {split!r}; use one of {SPLITS}")
    return split


def sequence_length(t: int, gap: int) -> int:
    return 2 * t + gap + 2


def answer_positions(t: int, gap: int) -> np.ndarray:
    """Positions whose next-token prediction is answer digit k = 0..t-1 (the 2nd `$` onwards)."""
    return np.arange(t + gap + 1, 2 * t + gap + 1)


def _exact_gap_counts(n: int, weights: tuple[float, ...]) -> np.ndarray:
    # Largest-remainder rounding so a 1:1 mix is exactly 1:1 (up to one example), not just in expectation.
    w = np.asarray(weights, dtype=np.float64) / sum(weights)
    raw = n * w
    counts = np.floor(raw).astype(np.int64)
    order = np.argsort(-(raw - counts), kind="stable")
    counts[order[: n - int(counts.sum())]] += 1
    return counts


def generate_split(cfg: SpacedRetrievalConfig, split: str) -> RetrievalRecords:
    """Draw split `split` deterministically from ``cfg.seed`` (distinct stream per split)."""
    rng = np.random.default_rng([cfg.seed, SPLITS.index(_check_split(split))])
    n = cfg.n_for(split)
    digits_NK = rng.integers(0, 10, size=(n, cfg.t), dtype=np.uint8)
    counts = _exact_gap_counts(n, cfg.gap_weights)
    gaps_N = np.repeat(np.asarray(cfg.gaps, dtype=np.int64), counts)
    rng.shuffle(gaps_N)
    return RetrievalRecords(digits_NK=digits_NK, gaps_N=gaps_N)


def build_example(digits_K: np.ndarray, gap: int) -> dict[str, torch.Tensor]:
    """Expand one record to ``input_ids``/``labels`` (length T) plus its answer positions."""
    t = len(digits_K)
    d = torch.as_tensor(np.asarray(digits_K, dtype=np.int64))
    dollar = torch.tensor([DOLLAR_ID])
    input_ids_T = torch.cat([dollar, d, torch.full((gap,), FILL_ID), dollar, d])
    labels_T = torch.full_like(input_ids_T, IGNORE_INDEX)
    labels_T[t + gap + 2 :] = d
    return {
        "input_ids": input_ids_T,
        "labels": labels_T,
        "answer_pos": torch.as_tensor(answer_positions(t, gap)),
        "answer_digits": d,
        "gap": torch.tensor(gap),
    }


def collate(examples: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Right-pad examples of different gaps: PAD_ID inputs, -100 labels, attention_mask 0."""
    if not examples:
        raise HybridlabError("spaced retrieval: cannot collate an empty batch; pass at least one example")
    lengths = [len(e["input_ids"]) for e in examples]
    T = max(lengths)
    B = len(examples)
    input_ids_BT = torch.full((B, T), PAD_ID, dtype=torch.long)
    labels_BT = torch.full((B, T), IGNORE_INDEX, dtype=torch.long)
    mask_BT = torch.zeros((B, T), dtype=torch.long)
    for b, (e, n) in enumerate(zip(examples, lengths)):
        input_ids_BT[b, :n] = e["input_ids"]
        labels_BT[b, :n] = e["labels"]
        mask_BT[b, :n] = 1
    return {
        "input_ids": input_ids_BT,
        "labels": labels_BT,
        "attention_mask": mask_BT,
        "answer_pos": torch.stack([e["answer_pos"] for e in examples]),
        "answer_digits": torch.stack([e["answer_digits"] for e in examples]),
        "gap": torch.stack([e["gap"] for e in examples]),
        "length": torch.tensor(lengths),
    }


def make_batch(records: RetrievalRecords, idx) -> dict[str, torch.Tensor]:
    """Expand the records at `idx` (ints, array or tensor) into one padded batch."""
    idx = [int(i) for i in np.asarray(idx).reshape(-1)]
    return collate([build_example(records.digits_NK[i], int(records.gaps_N[i])) for i in idx])


class SpacedRetrievalDataset(torch.utils.data.Dataset):
    """Map-style dataset of expanded examples; use with ``DataLoader(..., collate_fn=collate)``."""

    def __init__(self, records: RetrievalRecords):
        self.records = records

    def __len__(self) -> int:
        return len(self.records)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return build_example(self.records.digits_NK[i], int(self.records.gaps_N[i]))


def make_ab_pairs(records: RetrievalRecords, seed: int) -> tuple[RetrievalRecords, RetrievalRecords]:
    """A = `records`; B has the same gaps and every digit changed (so correct_A != correct_B everywhere).

    Used by the activation-patching retrieval score: the two inputs differ only in the stored digits
    (both the stored copy and, consistently, the answer copy).
    """
    rng = np.random.default_rng([seed, 7])
    offset_NK = rng.integers(1, 10, size=records.digits_NK.shape, dtype=np.uint8)
    digits_b = ((records.digits_NK.astype(np.int64) + offset_NK) % 10).astype(np.uint8)
    return records, RetrievalRecords(digits_NK=digits_b, gaps_N=records.gaps_N.copy())


def collision_rate(reference: RetrievalRecords, other: RetrievalRecords, *, match_gap: bool = True) -> float:
    """Fraction of `other`'s examples whose digits (and gap, if `match_gap`) also occur in `reference`."""
    if len(other) == 0:
        return 0.0

    def keys(r: RetrievalRecords) -> list[bytes]:
        return [r.digits_NK[i].tobytes() + (r.gaps_N[i].tobytes() if match_gap else b"") for i in range(len(r))]

    seen = set(keys(reference))
    return sum(k in seen for k in keys(other)) / len(other)


def write_split(path: str | Path, records: RetrievalRecords, *, split: str, seed: int) -> None:
    """Write records as parquet (``digits``: Utf8 like "04721", ``gap``: Int64); byte-stable."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    digit_strings = ["".join(map(str, row)) for row in records.digits_NK.tolist()]
    df = pl.DataFrame({"digits": digit_strings, "gap": records.gaps_N}, schema={"digits": pl.Utf8, "gap": pl.Int64})
    meta = {"format": _FORMAT, "t": str(records.t), "split": _check_split(split), "seed": str(seed)}
    df.write_parquet(path, metadata=meta)


def read_split(path: str | Path) -> RetrievalRecords:
    path = Path(path)
    if not path.is_file():
        raise HybridlabError(f"spaced retrieval: no split file at {path}; run the data phase that writes it")
    meta = pl.read_parquet_metadata(path)
    if meta.get("format") != _FORMAT:
        raise HybridlabError(f"spaced retrieval: {path} is not a spaced-retrieval split (format {meta.get('format')!r})")
    t = int(meta["t"])
    df = pl.read_parquet(path)
    flat = "".join(df["digits"].to_list()).encode("ascii")
    digits_NK = (np.frombuffer(flat, dtype=np.uint8) - ord("0")).reshape(len(df), t).copy()
    return RetrievalRecords(digits_NK=digits_NK, gaps_N=df["gap"].to_numpy().astype(np.int64))


def retrieval_loss(logits_BTV: torch.Tensor, labels_BT: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over answer digits (logits at i scored against labels[i+1])."""
    logits = logits_BTV[:, :-1].reshape(-1, logits_BTV.shape[-1]).float()
    return F.cross_entropy(logits, labels_BT[:, 1:].reshape(-1), ignore_index=IGNORE_INDEX)


def retrieval_accuracy(logits_BTV: torch.Tensor, batch: dict[str, torch.Tensor]) -> dict[str, float]:
    """Greedy (teacher-forced) accuracy: per digit and whole-sequence exact match."""
    pos_BK = batch["answer_pos"]
    logits_BKV = torch.gather(logits_BTV, 1, pos_BK.unsqueeze(-1).expand(-1, -1, logits_BTV.shape[-1]))
    correct_BK = logits_BKV.argmax(-1) == batch["answer_digits"]
    return {
        "digit_acc": correct_BK.float().mean().item(),
        "seq_acc": correct_BK.all(dim=1).float().mean().item(),
    }


def decode(ids) -> str:
    """Human-readable string for a sequence of ids (for debugging and docs)."""
    return " ".join(ID_TO_STR[int(i)] for i in ids)

"""BLD on Spaced Retrieval: the small hybrid, the training task, the arms and their data mix.

Follows the competing-learning / Better Layer Division setting (a 2 KDA + 2 attention model trained on
`$ X1..Xt _xg $ X1..Xt` with the loss on the answer digits only; `hybridlab.data.spaced_retrieval`).

Definitions (this project's):

- **Model.** A Qwen3 decoder (RoPE, RMSNorm, SwiGLU) built from a local config with
  `vocab_size = spaced_retrieval.VOCAB_SIZE`, converted with `convert_to_hybrid` so that the layers
  marked `"mixer"` in `pattern` get a recurrent mixer (KDA by default) and the `"full_attention"` ones
  keep attention. The default pattern is KDA, attn, KDA, attn: the two types alternate, so each
  occurs once in the lower and once in the upper half of the stack and neither gets the advantage of
  depth. The recurrent mixers keep the q/k/v/o of the randomly initialised attention they replace
  (conversion inherits them), so both types start from the same projections.
- **Task.** `SpacedRetrievalTask.loss` is the mean next-token cross-entropy over answer digits (as
  `retrieval_loss`), on right-padded batches with `attention_mask` (the hybrid's mixers and the
  attention mask both ignore padding); by default each sequence length of the batch runs as its own
  trimmed forward (same loss, much cheaper with very different gaps). Its logged scalars are per-gap
  COUNTS over the micro-batch (`sr/correct/gap<g>`, `sr/digits/gap<g>`, `sr/seq_correct/gap<g>`,
  `sr/seqs/gap<g>`), because a batch may miss a gap; the loop averages each over the micro-batches of
  an update, and `add_accuracy_columns` turns them into `acc/gap<g>` (digit accuracy = correct /
  digits) and `seq_acc/gap<g>` (all t digits right), null where the update had no example of that
  gap. Accuracy is greedy and teacher-forced. `num_tokens` counts real (non-pad) tokens.
- **Arm.** A `SRArm`: a BLD `FreezeArm` (which recurrent blocks freeze when) and a long-gap fraction.
  `None` trains on the train split as written by the data phase (its configured gap mix); a number f
  **resamples** the split to a new one of the same size with exactly `round(f * N)` examples of the
  longest gap and the rest from the pool of all shorter-gap examples (so their mutual mix follows
  the split's). Each pool is used whole (shuffled) as often as it fits and then sampled without
  replacement for the remainder, seeded, so only the mix changes, not the examples' distribution.
- **Score checkpoints.** `score_steps(fractions, N, updates)` = `round_half_up(f * N)` for each fraction
  of training (0 = the initial model, 1 = the final one) and each listed update count; the trainer saves
  the model *before* update `s` (i.e. after s updates) in `save_hybrid` layout for the retrieval-score
  analysis. Every arm of a study gets the same steps (`hybridlab.train.arms.sr_score_points`), which
  include the end of every arm's freeze windows, so arms are compared at the same steps.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction
from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from hybridlab.data import spaced_retrieval as sr
from hybridlab.atomic import atomic_dir
from hybridlab.errors import HybridlabError
from hybridlab.train.bld import FreezeArm

PATTERN_ITEMS = ("mixer", "full_attention")


@dataclass(frozen=True)
class SRModelConfig:
    """Shape of the Spaced Retrieval hybrid; `pattern` lists one entry per layer."""

    hidden_size: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    intermediate_size: int
    pattern: tuple[str, ...] = ("mixer", "full_attention", "mixer", "full_attention")
    mixer: str = "kda"
    max_position_embeddings: int = 512
    # free MixerConfig fields, e.g. {"chunk_size": 16} (CPU speed; results do not depend on it)
    mixer_overrides: dict = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "pattern", tuple(self.pattern))
        bad = [p for p in self.pattern if p not in PATTERN_ITEMS]
        if not self.pattern or bad:
            raise HybridlabError(f"bld_sr pattern {list(self.pattern)}: use a non-empty list of {PATTERN_ITEMS}")
        if "full_attention" not in self.pattern or "mixer" not in self.pattern:
            raise HybridlabError(f"bld_sr pattern {list(self.pattern)} must contain both 'mixer' and 'full_attention'")
        if self.num_attention_heads % self.num_key_value_heads:
            raise HybridlabError(
                f"bld_sr model: num_attention_heads={self.num_attention_heads} is not a multiple of "
                f"num_key_value_heads={self.num_key_value_heads}"
            )

    @property
    def fa_layers(self) -> list[int]:
        return [i for i, p in enumerate(self.pattern) if p == "full_attention"]


def build_sr_model(cfg: SRModelConfig, seed: int) -> nn.Module:
    """The hybrid of `cfg` (fresh weights drawn from `seed`), a transformers model with `hybridlab_spec`."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    from hybridlab.models.convert import convert_to_hybrid

    config = Qwen3Config(
        vocab_size=sr.VOCAB_SIZE,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=len(cfg.pattern),
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=cfg.head_dim,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=False,
        bos_token_id=sr.DOLLAR_ID,
        eos_token_id=sr.DOLLAR_ID,
        pad_token_id=sr.PAD_ID,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        dense = Qwen3ForCausalLM(config)
    model = convert_to_hybrid(dense, cfg.fa_layers, cfg.mixer, mixer_overrides=cfg.mixer_overrides, seed=seed,
                              inplace=True)
    model.hybridlab_spec.extra = {"task": "spaced_retrieval", "pattern": list(cfg.pattern)}
    return model


def _gap_key(gap: int) -> str:
    return f"gap{int(gap)}"


class SpacedRetrievalTask:
    """Answer-digit cross-entropy on SR batches (`spaced_retrieval.collate`), per-gap accuracy counts.

    `by_length=True` (default) runs one forward per sequence length in the batch, each trimmed to its
    length, instead of one forward over the right-padded batch: the same loss (padding never changes
    a causal model's real tokens, and every row of a group is full length) at a fraction of the cost
    when gaps differ a lot (gap 16 rows no longer pay for gap 256 padding).
    """

    def __init__(self, gaps: Sequence[int], by_length: bool = True):
        self.gaps = tuple(sorted({int(g) for g in gaps}))
        self.by_length = by_length

    def _groups(self, batch):
        if not self.by_length:
            return [(torch.arange(batch["input_ids"].shape[0], device=batch["input_ids"].device),
                     batch["input_ids"].shape[1])]
        lengths = batch["length"]
        return [((lengths == n).nonzero().squeeze(1).to(batch["input_ids"].device), n)
                for n in sorted(set(lengths.tolist()))]

    def loss(self, model: nn.Module, batch: dict[str, torch.Tensor]):
        unknown = set(batch["gap"].tolist()) - set(self.gaps)
        if unknown:
            raise HybridlabError(f"batch has gaps {sorted(unknown)} not declared to the task {list(self.gaps)}")
        nll = torch.zeros((), device=batch["input_ids"].device)
        n_answer = 0
        right_BK = torch.zeros_like(batch["answer_digits"], dtype=torch.bool)
        for rows, n in self._groups(batch):
            labels_BT = batch["labels"][rows, :n]
            logits_BTV = model(input_ids=batch["input_ids"][rows, :n],
                               attention_mask=batch["attention_mask"][rows, :n]).logits
            # token-sum CE here, divided once by all answer digits below = the batch's token mean
            nll = nll + F.cross_entropy(logits_BTV[:, :-1].reshape(-1, logits_BTV.shape[-1]).float(),
                                        labels_BT[:, 1:].reshape(-1), ignore_index=sr.IGNORE_INDEX, reduction="sum")
            n_answer += int((labels_BT[:, 1:] != sr.IGNORE_INDEX).sum())
            with torch.no_grad():
                pred_BK = torch.gather(logits_BTV.argmax(-1), 1, batch["answer_pos"][rows])
                right_BK[rows] = pred_BK == batch["answer_digits"][rows]
        if n_answer == 0:
            raise HybridlabError("spaced retrieval batch has no answer digits; check the labels")
        scalars = {}
        for g in self.gaps:
            sel_BK = right_BK[batch["gap"] == g]
            k = _gap_key(g)
            scalars[f"sr/correct/{k}"] = float(sel_BK.sum())
            scalars[f"sr/digits/{k}"] = float(sel_BK.numel())
            scalars[f"sr/seq_correct/{k}"] = float(sel_BK.all(dim=1).sum())
            scalars[f"sr/seqs/{k}"] = float(sel_BK.shape[0])
        return nll / n_answer, scalars

    def num_tokens(self, batch: dict[str, torch.Tensor]) -> int:
        return int(batch["attention_mask"].sum())


def add_accuracy_columns(df, gaps: Sequence[int]):
    """`acc/gap<g>` and `seq_acc/gap<g>` from the per-gap count columns (null where the count is 0)."""
    import polars as pl

    cols = []
    for g in sorted({int(x) for x in gaps}):
        k = _gap_key(g)
        for name, num, den in (("acc", "correct", "digits"), ("seq_acc", "seq_correct", "seqs")):
            n, d = pl.col(f"sr/{num}/{k}"), pl.col(f"sr/{den}/{k}")
            cols.append(pl.when(d > 0).then(n / d).otherwise(None).alias(f"{name}/{k}"))
    return df.with_columns(cols)


def take_per_gap(records: sr.RetrievalRecords, max_per_gap: int | None) -> sr.RetrievalRecords:
    """The first `max_per_gap` examples of each gap (all if None), in their original order."""
    if max_per_gap is None:
        return records
    keep = np.zeros(len(records), dtype=bool)
    for g in set(records.gaps_N.tolist()):
        keep[np.flatnonzero(records.gaps_N == g)[:max_per_gap]] = True
    return sr.RetrievalRecords(digits_NK=records.digits_NK[keep].copy(), gaps_N=records.gaps_N[keep].copy())


@torch.no_grad()
def accuracy_by_gap(model: nn.Module, records: sr.RetrievalRecords, *, max_per_gap: int | None = None,
                    batch_size: int = 64) -> dict[str, float]:
    """Greedy teacher-forced accuracy per gap on the first `max_per_gap` examples of each gap.

    Returns {"acc/gap<g>": digit accuracy, "seq_acc/gap<g>": exact match of all t digits}.
    """
    device = next(model.parameters()).device
    out: dict[str, float] = {}
    for g in sorted(set(records.gaps_N.tolist())):
        idx = np.flatnonzero(records.gaps_N == g)[:max_per_gap]
        right, seqs = [], []
        for s in range(0, len(idx), batch_size):
            batch = sr.make_batch(records, idx[s:s + batch_size])
            logits = model(input_ids=batch["input_ids"].to(device),
                           attention_mask=batch["attention_mask"].to(device)).logits
            pred_BK = torch.gather(logits.argmax(-1).cpu(), 1, batch["answer_pos"])
            right_BK = pred_BK == batch["answer_digits"]
            right.append(right_BK.float().mean(1))
            seqs.append(right_BK.all(1).float())
        k = _gap_key(g)
        out[f"acc/{k}"] = float(torch.cat(right).mean())
        out[f"seq_acc/{k}"] = float(torch.cat(seqs).mean())
    return out


@dataclass(frozen=True)
class SRArm:
    """One arm of the study: a freezing recipe and an optional long-gap fraction of the train mix."""

    freeze: FreezeArm
    long_gap_fraction: float | None = None

    @property
    def name(self) -> str:
        return self.freeze.name

    @classmethod
    def from_dict(cls, d: dict) -> "SRArm":
        """From `{"name", "windows": [[s, e], ...] (fractions), "update_windows": [[s, e], ...] (updates),
        "long_gap_fraction", "scope", "optimizer_after_unfreeze"}`."""
        known = {"name", "windows", "update_windows", "long_gap_fraction", "scope", "optimizer_after_unfreeze"}
        unknown = sorted(set(d) - known)
        if unknown or "name" not in d:
            raise HybridlabError(f"bld_sr arm spec {d!r}: needs 'name'; allowed keys {sorted(known)}")
        f = d.get("long_gap_fraction")
        if f is not None and not 0 <= f <= 1:
            raise HybridlabError(f"bld_sr arm {d['name']!r}: long_gap_fraction={f} must be in [0, 1]")
        freeze = FreezeArm(d["name"], tuple(tuple(w) for w in d.get("windows", ())), d.get("scope", "block"),
                           d.get("optimizer_after_unfreeze"), tuple(tuple(w) for w in d.get("update_windows", ())))
        return cls(freeze, None if f is None else float(f))



def resample_long_gap(records: sr.RetrievalRecords, fraction: float, seed: int) -> sr.RetrievalRecords:
    """A train mix of the same size with exactly round(fraction * N) longest-gap examples (module docstring)."""
    gaps = sorted(set(records.gaps_N.tolist()))
    if len(gaps) < 2:
        raise HybridlabError(f"long-gap resampling needs at least two gaps in the train split, found {gaps}")
    if not 0 <= fraction <= 1:
        raise HybridlabError(f"long_gap_fraction={fraction} must be in [0, 1]")
    n = len(records)
    n_long = int((Fraction(str(fraction)) * n + Fraction(1, 2)).__floor__())
    rng = np.random.default_rng([seed, 11])
    long_pool = np.flatnonzero(records.gaps_N == gaps[-1])
    short_pool = np.flatnonzero(records.gaps_N != gaps[-1])
    idx = np.concatenate([_draw(long_pool, n_long, rng), _draw(short_pool, n - n_long, rng)])
    idx = idx[rng.permutation(n)]
    return sr.RetrievalRecords(digits_NK=records.digits_NK[idx].copy(), gaps_N=records.gaps_N[idx].copy())


def _draw(pool: np.ndarray, k: int, rng: np.random.Generator) -> np.ndarray:
    if k == 0:
        return pool[:0]
    if len(pool) == 0:
        raise HybridlabError("long-gap resampling: a gap pool is empty; the train split lacks that gap")
    # the whole pool (shuffled) as often as it fits, then a sample without replacement for the rest
    reps, rest = divmod(k, len(pool))
    parts = [rng.permutation(pool) for _ in range(reps)] + [rng.choice(pool, size=rest, replace=False)]
    return np.concatenate(parts)


def score_steps(fractions: Sequence[float], total_steps: int, updates: Sequence[int] = ()) -> list[int]:
    """Update counts at which score checkpoints are taken (sorted, unique): the fractions of training
    (rounded half up) and the given update counts."""
    out = set()
    for f in fractions:
        if not 0 <= f <= 1:
            raise HybridlabError(f"score checkpoint fraction {f} must be in [0, 1]")
        out.add(int((Fraction(str(f)) * total_steps + Fraction(1, 2)).__floor__()))
    for u in updates:
        if not 0 <= u <= total_steps:
            raise HybridlabError(f"score checkpoint at update {u} is outside the run of {total_steps} updates; "
                                 "lower it or train longer")
        out.add(int(u))
    return sorted(out)


@dataclass
class ScoreCheckpointer:
    """`on_step_start` hook writing the model before update `s` for each s in `steps` (rank 0 only).

    A checkpoint directory is written to a temp name and renamed; an existing one is left alone, so a
    resumed run does not rewrite what it already saved (it would be bitwise identical on CPU anyway).
    """

    out_dir: str
    steps: Sequence[int]
    written: list[int] = field(default_factory=list)

    def path(self, step: int):
        from pathlib import Path

        return Path(self.out_dir) / f"step_{step:06d}"

    def save(self, step: int, model: nn.Module) -> None:
        from hybridlab.models.io import save_hybrid

        final = self.path(step)
        if final.exists():
            return
        with atomic_dir(final) as tmp:
            save_hybrid(model, tmp)
        self.written.append(step)

    def __call__(self, step: int, model: nn.Module, optimizer=None) -> None:
        import torch.distributed as dist

        if step in self.steps and (not dist.is_initialized() or dist.get_rank() == 0):
            self.save(step, model)

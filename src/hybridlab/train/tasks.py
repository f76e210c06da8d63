"""Tasks: what a trainer plugs into the shared loop (`hybridlab.train.loop.train`).

A task turns a batch into `(loss, scalars)` and counts the tokens it trains on. Tasks here:

* `CausalLMTask` — next-token cross-entropy on packed fixed-length rows (teacher pre-training and
  BLD natural-language pre-training). Every position but the last predicts its successor.
* `heldout_ce_by_language` — the evaluation used for learning curves: token-mean CE on held-out
  packed rows, overall and per language (a fixed, deterministic subset of rows).
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
from torch import nn

from hybridlab.train.losses import masked_ce


def _logits(model: nn.Module, input_ids_BT: torch.Tensor) -> torch.Tensor:
    out = model(input_ids=input_ids_BT)
    return out.logits if hasattr(out, "logits") else out


class CausalLMTask:
    """Next-token CE over all positions of packed rows `[B, T]`."""

    def loss(self, model: nn.Module, batch: torch.Tensor):
        logits_BTV = _logits(model, batch)
        loss = masked_ce(logits_BTV[:, :-1], batch[:, 1:])
        return loss, {}

    def num_tokens(self, batch: torch.Tensor) -> int:
        return int(batch.shape[0] * (batch.shape[1] - 1))


@torch.no_grad()
def heldout_ce_by_language(model: nn.Module, dataset, *, max_rows_per_language: int, batch_size: int = 8,
                           device: torch.device | str = "cpu") -> dict[str, float]:
    """Token-mean CE on the first `max_rows_per_language` held-out rows of each language.

    `dataset` indexes to LongTensor rows and has `.langs` (one language per row), like
    `hybridlab.data.packing.PackedDataset`. Returns {"ce": overall, "ce/<lang>": ...}.
    """
    rows_by_lang: dict[str, list[int]] = defaultdict(list)
    for i, lang in enumerate(dataset.langs):
        if len(rows_by_lang[lang]) < max_rows_per_language:
            rows_by_lang[lang].append(i)
    total_nll, total_n = 0.0, 0
    out: dict[str, float] = {}
    for lang in sorted(rows_by_lang):
        idx = rows_by_lang[lang]
        nll, n = 0.0, 0
        for s in range(0, len(idx), batch_size):
            batch = torch.stack([dataset[i] for i in idx[s:s + batch_size]]).to(device)
            logits = _logits(model, batch)[:, :-1].float()
            targets = batch[:, 1:]
            nll += torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1),
                                                     reduction="sum").item()
            n += targets.numel()
        out[f"ce/{lang}"] = nll / n
        total_nll, total_n = total_nll + nll, total_n + n
    out["ce"] = total_nll / max(total_n, 1)
    return out


def unigram_entropy(tokens, vocab_size: int) -> float:
    """Cross-entropy (nats) of the train-set unigram distribution on itself: the no-context baseline."""
    counts = torch.bincount(torch.as_tensor(tokens, dtype=torch.long).reshape(-1), minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum()) if p.numel() else math.nan

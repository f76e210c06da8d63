"""Tasks: what a trainer plugs into the shared loop (`hybridlab.train.loop.train`).

A task turns a batch into `(loss, scalars)` and counts the tokens it trains on. Tasks here:

* `CausalLMTask` — next-token cross-entropy on packed fixed-length rows (teacher pre-training and
  BLD natural-language pre-training). Every position but the last predicts its successor.
* `heldout_ce_by_language` — the evaluation used for learning curves: token-mean CE on held-out
  packed rows, overall and per language (a fixed, deterministic subset of rows).

Neither materialises `[B, T, V]` logits for a transformers causal LM (`logits_side`): the decoder
stack runs alone and the CE comes from `Projected(final hidden, lm_head)` chunk by chunk
(`losses.ce_chunked` / `token_nll_chunked`; at 8 x 16K tokens and a 151936 vocabulary, full fp32
logits would be ~80 GB). Other modules (plain `nn.Module`s returning logits, heads that soft-cap
their logits) keep the logits path.
"""

from __future__ import annotations

import math
from collections import defaultdict

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.data import default_collate

from hybridlab.data.packed_dataset import batch_to, in_document_targets, split_batch
from hybridlab.errors import HybridlabError
from hybridlab.train.losses import Projected, Side, ce_chunked, token_nll_chunked


def lm_head_side(model: nn.Module, hidden_BTD: torch.Tensor) -> Projected:
    """The model's logits for final hidden states, as a `Projected` (see module docstring)."""
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    if getattr(config, "final_logit_softcapping", None):
        raise HybridlabError(f"{type(model).__name__} soft-caps its logits (final_logit_softcapping), which the "
                             "chunked KL does not model; distil a model without logit soft-capping")
    head = model.get_output_embeddings()
    if not isinstance(head, nn.Linear):
        raise HybridlabError(f"{type(model).__name__}'s output head is {type(head).__name__}, not a Linear; "
                             "the chunked KL needs a linear vocabulary projection")
    scaling = getattr(config, "logits_scaling", None)
    return Projected(hidden_BTD, head.weight, head.bias, 1.0 / scaling if scaling else 1.0)


def final_hidden(model: nn.Module, batch) -> torch.Tensor:
    """Final (post-norm) hidden states from the decoder stack alone; the head is never applied.

    ``batch``: input ids ``[B, T]``, or ``hybridlab.data.packed_dataset.Documents`` whose ``position_ids`` keep
    attention (transformers' packed-sequence mask) and the mixers' state inside each document.
    """
    ids, pos = split_batch(batch)
    extra = {} if pos is None else {"position_ids": pos}
    return model.get_decoder()(input_ids=ids, use_cache=False, **extra).last_hidden_state


def projects_logits(model: nn.Module) -> bool:
    """True for transformers causal LMs whose logits are a linear head on the decoder's output."""
    if not (callable(getattr(model, "get_decoder", None)) and callable(getattr(model, "get_output_embeddings", None))
            and hasattr(model, "config")):
        return False
    config = model.config.get_text_config(decoder=True) if hasattr(model.config, "get_text_config") else model.config
    return isinstance(model.get_output_embeddings(), nn.Linear) and not getattr(config, "final_logit_softcapping", None)


def logits_side(model: nn.Module, batch, **kwargs) -> Side:
    """The model's logits at every position as a loss side (see module docstring); kwargs go to forward.

    ``batch``: input ids ``[B, T]`` or ``hybridlab.data.packed_dataset.Documents`` (document-masked forward).
    """
    if projects_logits(model):
        return lm_head_side(model, final_hidden(model, batch))
    ids, pos = split_batch(batch)
    out = model(input_ids=ids, **({} if pos is None else {"position_ids": pos}), **kwargs)
    return out.logits if hasattr(out, "logits") else out


def next_token_labels(batch, ignore_index: int = -100) -> torch.Tensor:
    """labels[:, t] = input_ids[:, t + 1], or ignore_index where t has no successor in its document.

    Plain rows: only the last position. ``Documents``: also each document's last token, whose successor
    starts the next document (outside the masked context).
    """
    ids, pos = split_batch(batch)
    labels = F.pad(ids[:, 1:], (0, 1), value=ignore_index)
    return labels if pos is None else labels.masked_fill(~in_document_targets(batch), ignore_index)


class CausalLMTask:
    """Next-token CE over all positions of packed rows `[B, T]`, chunked (see module docstring)."""

    def __init__(self, chunk_tokens: int = 1024, vocab_chunk: int | None = None):
        self.chunk_tokens, self.vocab_chunk = chunk_tokens, vocab_chunk

    def loss(self, model: nn.Module, batch: torch.Tensor):
        side = logits_side(model, batch)
        loss = ce_chunked(side, next_token_labels(batch), chunk_tokens=self.chunk_tokens, vocab_chunk=self.vocab_chunk)
        return loss, {}

    def num_tokens(self, batch) -> int:
        return int(in_document_targets(batch).sum())


@torch.no_grad()
def heldout_ce_by_language(model: nn.Module, dataset, *, max_rows_per_language: int, batch_size: int = 8,
                           device: torch.device | str = "cpu", chunk_tokens: int = 1024,
                           vocab_chunk: int | None = None) -> dict[str, float]:
    """Token-mean CE on the first `max_rows_per_language` held-out rows of each language.

    `dataset` indexes to LongTensor rows and has `.langs` (one language per row), like
    `hybridlab.data.packed_dataset.PackedDataset`. Returns {"ce": overall, "ce/<lang>": ...}.
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
            batch = batch_to(default_collate([dataset[i] for i in idx[s:s + batch_size]]), device)
            # Every position is scored against a dummy successor where it has none (dropped below), so
            # the side is never sliced (a slice of full logits would be copied whole).
            targets = next_token_labels(batch, ignore_index=0)
            keep = in_document_targets(batch)
            nll_BT = token_nll_chunked(logits_side(model, batch), targets, chunk_tokens, vocab_chunk)
            nll += float(nll_BT[keep].double().sum())
            n += int(keep.sum())
        out[f"ce/{lang}"] = nll / n
        total_nll, total_n = total_nll + nll, total_n + n
    out["ce"] = total_nll / max(total_n, 1)
    return out


def unigram_entropy(tokens, vocab_size: int) -> float:
    """Cross-entropy (nats) of the train-set unigram distribution on itself: the no-context baseline."""
    counts = torch.bincount(torch.as_tensor(tokens, dtype=torch.long).reshape(-1), minlength=vocab_size).double()
    p = counts[counts > 0] / counts.sum()
    return float(-(p * p.log()).sum()) if p.numel() else math.nan

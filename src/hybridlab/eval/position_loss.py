"""Per-position loss on long documents and LongPPL (key tokens that need long context).

Definitions (positions are target indices t = 1..T-1 of a document x_0..x_{T-1}: x_t is predicted
from its t preceding tokens, so t is also the context length):

- Buckets: `log2` edges [1, 2), [2, 4), [4, 8), ... or `fixed` edges [0, w), [w, 2w), ... (position 0
  is never a target, so the first fixed bucket holds w-1 positions), clipped to [1, T).
  loss_by_position = token-mean NLL per bucket, pooled over documents.
- Short-window loss (Fang et al. 2024, "What is Wrong with Perplexity for Long-context Language
  Modeling?", LongPPL): l_short(t) = -log p(x_t | x_{t-w..t-1}), only the last w tokens as context.
  Computed exactly for any model (attention or recurrent) by re-running it on windows: with stride
  k = 1 every target t > w gets its own window of exactly w context tokens; with k > 1 a window
  x[s : s + w + k] scores k targets whose contexts hold w..w+k-1 tokens (k times cheaper, a slightly
  longer "short" context). Targets t <= w have the full prefix either way, so l_short(t) = l_long(t).
- Key tokens: gain(t) = l_short(t) - l_long(t) = log p_long - log p_short > `threshold` (the paper's
  long-short difference, alpha = 2 there), optionally also log p_long(x_t) > `min_long_logprob`
  (the paper's long-context likelihood filter, beta = -2 there; off by default).
- LongPPL = exp(mean l_long over key tokens), None when there are no key tokens. The paper identifies
  key tokens with a strong evaluator model and scores the evaluated model on them: pass `evaluator`
  to do the same; by default the evaluated model identifies its own key tokens.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import polars as pl
import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.eval.perplexity import token_nll

BUCKET_SCHEMA = {"bucket_lo": pl.Int64, "bucket_hi": pl.Int64, "n_tokens": pl.Int64, "mean_loss": pl.Float64}


def bucket_edges(seq_len: int, scheme: str = "log2", width: int | None = None) -> list[int]:
    """Bucket edges over target positions 1..seq_len-1: [e_0, e_1), [e_1, e_2), ..."""
    if seq_len < 2:
        raise HybridlabError(f"documents need at least 2 tokens for a per-position loss, got {seq_len}")
    if scheme == "log2":
        edges = [1]
        while edges[-1] < seq_len:
            edges.append(min(edges[-1] * 2, seq_len))
        return edges
    if scheme == "fixed":
        if width is None or width < 1:
            raise HybridlabError(f"fixed-width buckets need width >= 1, got {width}")
        edges = [1] + list(range(width, seq_len, width)) + [seq_len]
        return sorted(set(edges))
    raise HybridlabError(f"unknown bucket scheme {scheme!r}; use 'log2' or 'fixed'")


def loss_by_position(nll_NP: torch.Tensor, edges: Sequence[int], mask_NP: torch.Tensor | None = None) -> pl.DataFrame:
    """Token-mean loss per position bucket; column j of nll_NP is target position j + 1."""
    if nll_NP.dim() != 2:
        raise HybridlabError(f"per-token losses must be [N, T-1], got {tuple(nll_NP.shape)}")
    if edges[0] < 1 or edges[-1] > nll_NP.shape[1] + 1 or any(b <= a for a, b in zip(edges, edges[1:])):
        raise HybridlabError(f"bucket edges {list(edges)} must increase within [1, {nll_NP.shape[1] + 1}]")
    mask_NP = torch.ones_like(nll_NP, dtype=torch.bool) if mask_NP is None else mask_NP.bool()
    rows = []
    for lo, hi in zip(edges, edges[1:]):
        m = mask_NP[:, lo - 1:hi - 1]
        n = int(m.sum())
        mean = float(nll_NP[:, lo - 1:hi - 1][m].double().mean()) if n else None
        rows.append({"bucket_lo": lo, "bucket_hi": hi, "n_tokens": n, "mean_loss": mean})
    return pl.DataFrame(rows, schema=BUCKET_SCHEMA)


def key_token_mask(long_nll: torch.Tensor, short_nll: torch.Tensor, threshold: float = 2.0,
                   min_long_logprob: float | None = None) -> torch.Tensor:
    """Tokens whose log-prob gains more than `threshold` from the long context (and pass the optional filter)."""
    if long_nll.shape != short_nll.shape:
        raise HybridlabError(f"long and short losses differ in shape: {tuple(long_nll.shape)} vs "
                             f"{tuple(short_nll.shape)}")
    key = (short_nll - long_nll) > threshold
    if min_long_logprob is not None:
        key &= -long_nll > min_long_logprob
    return key


def long_ppl(long_nll: torch.Tensor, key_mask: torch.Tensor) -> float | None:
    """exp(mean long-context loss over key tokens); None if there are none."""
    if long_nll.shape != key_mask.shape:
        raise HybridlabError("key mask and losses differ in shape")
    if not bool(key_mask.any()):
        return None
    return math.exp(float(long_nll[key_mask].double().mean()))


def _forward_nll(model: nn.Module, ids_BT: torch.Tensor, dev: torch.device) -> torch.Tensor:
    with torch.inference_mode():
        logits = model(input_ids=ids_BT.to(dev), use_cache=False).logits
        return token_nll(logits, ids_BT.to(dev)).float().cpu()


def short_window_nll(model: nn.Module, ids_T: torch.Tensor, window: int, *, stride: int = 1,
                     batch_size: int = 16, device: str | torch.device | None = None) -> torch.Tensor:
    """l_short for targets 1..T-1 of one document ([T-1]); see the module docstring for the contexts."""
    if window < 1 or stride < 1:
        raise HybridlabError(f"short window and stride must be >= 1, got window={window}, stride={stride}")
    T = ids_T.shape[0]
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    out_P = torch.empty(T - 1)
    # chunk 0 = x[0 : w + k] scores targets 1..w+k-1; chunk at s = jk scores targets s+w .. s+w+k-1
    chunks = [(0, min(window + stride, T), 1)]
    chunks += [(s, min(s + window + stride, T), s + window) for s in range(stride, T - window, stride)]
    for c0 in range(0, len(chunks), batch_size):
        group = chunks[c0:c0 + batch_size]
        t_max = max(e - s for s, e, _ in group)
        ids_BT = torch.zeros(len(group), t_max, dtype=torch.long)  # right padding: never seen by scored targets
        for r, (s, e, _) in enumerate(group):
            ids_BT[r, :e - s] = ids_T[s:e]
        nll_BP = _forward_nll(model, ids_BT, dev)
        for r, (s, e, first) in enumerate(group):
            # target t sits at chunk position t - s, i.e. column t - s - 1 of nll
            out_P[first - 1:e - 1] = nll_BP[r, first - s - 1:e - s - 1]
    return out_P


@dataclass(frozen=True)
class PositionLossResult:
    buckets: pl.DataFrame  # bucket_lo, bucket_hi, n_tokens, mean_loss (long context)
    ppl: float  # exp(mean long-context loss over all targets)
    long_ppl: float | None  # exp(mean long-context loss over key tokens); None without key tokens
    n_tokens: int
    n_key_tokens: int
    long_nll: torch.Tensor  # [N, T-1]
    short_nll: torch.Tensor  # [N, T-1] of the key-token identifier (the evaluator if given)


def run_position_loss(model: nn.Module, documents: torch.Tensor, *, short_window: int, short_stride: int = 1,
                      scheme: str = "log2", width: int | None = None, threshold: float = 2.0,
                      min_long_logprob: float | None = None, evaluator: nn.Module | None = None,
                      batch_size: int = 4, device: str | torch.device | None = None) -> PositionLossResult:
    """Per-position loss and LongPPL of `model` on equal-length documents [N, T]."""
    if documents.dim() != 2:
        raise HybridlabError(f"documents must be [N, T] token ids of equal length, got {tuple(documents.shape)}")
    N, T = documents.shape
    if short_window >= T - 1:
        raise HybridlabError(f"short_window {short_window} must be shorter than the documents ({T} tokens) "
                             "for any token to have a long context")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    models = [m for m in (model, evaluator) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        long_NP = torch.cat([_forward_nll(model, documents[b:b + batch_size], dev) for b in range(0, N, batch_size)])
        judge = evaluator if evaluator is not None else model
        judge_long = long_NP if evaluator is None else torch.cat(
            [_forward_nll(judge, documents[b:b + batch_size], dev) for b in range(0, N, batch_size)])
        short_NP = torch.stack([short_window_nll(judge, documents[i], short_window, stride=short_stride,
                                                 batch_size=4 * batch_size, device=dev) for i in range(N)])
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)
    key = key_token_mask(judge_long, short_NP, threshold, min_long_logprob)
    return PositionLossResult(buckets=loss_by_position(long_NP, bucket_edges(T, scheme, width)),
                              ppl=math.exp(float(long_NP.double().mean())), long_ppl=long_ppl(long_NP, key),
                              n_tokens=long_NP.numel(), n_key_tokens=int(key.sum()),
                              long_nll=long_NP, short_nll=short_NP)

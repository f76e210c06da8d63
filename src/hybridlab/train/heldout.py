"""Per-language held-out CE / perplexity and KL to a teacher on packed sequences; tokens-to-target-loss.

Definitions:

- Rows are packed held-out sequences x_0..x_{T-1} of one language each (`lang` per row). Scored
  positions predict x_t from x_<t for t = 1..T-1 (targets equal to `pad_id` are skipped when given).
- ce(lang) = token mean over all scored positions of that language's rows of -log p(x_t | x_<t)
  (pooled over rows, not a mean of row means); ppl = exp(ce).
- kl(lang) = token mean over the same positions of KL(teacher || student) of the next-token
  distributions, sum_v p_T(v) (log p_T(v) - log p_S(v)), the stage-2 distillation objective's direction.
- `evaluate_perplexity` never builds `[B, T, V]` logits for transformers causal LMs: ce and kl come
  from the final hidden states and the head, chunk by chunk (`train.losses.token_nll_chunked` /
  `token_kl_chunked`, fp32 reductions); `hybridlab.eval.perplexity.token_nll` / `token_kl` are the
  full-logits references.
- tokens_to_reach(tokens, loss, target): the first training-token count at which the logged loss curve
  reaches loss <= target, linearly interpolated between the two logged points around the first
  crossing; the first point itself if it is already <= target; None if never. Smooth noisy curves
  first (a single noisy dip counts as a crossing).
- fraction_of_baseline_tokens: tokens_to_reach(model, target) / tokens_to_reach(baseline, target) with
  target = the baseline's final logged loss unless given; < 1 means the model gets there faster.

In the train layer because training evaluates its held-out curves with them (`hybridlab.train.distill`);
the evaluation tables use them too.
"""

from __future__ import annotations

import math
from typing import Sequence

import polars as pl
import torch
from torch import nn

from hybridlab.errors import HybridlabError

ROW_SCHEMA = {"model": pl.String, "lang": pl.String, "n_tokens": pl.Int64, "ce": pl.Float64,
              "ppl": pl.Float64, "kl": pl.Float64}


def _chunked_nll_kl(model: nn.Module, teacher: nn.Module | None, batch, chunk_tokens: int,
                    vocab_chunk: int | None, teacher_memo: dict | None = None,
                    key=None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """token_nll and token_kl ([B, T-1] each) without full logits where the models allow it.

    ``batch``: input ids ``[B, T]`` or ``hybridlab.data.packed_dataset.Documents``. `teacher_memo` keeps the
    frozen teacher's final hidden states under `key`, so a teacher scored on the same rows again (every
    student, every curve point) runs only its head."""
    from hybridlab.data.packed_dataset import split_batch
    from hybridlab.train.losses import token_kl_chunked, token_nll_chunked
    from hybridlab.train.tasks import final_hidden, lm_head_side, logits_side, next_token_labels, projects_logits

    # Every position is scored (the last against a dummy target) and then dropped: no side is sliced.
    ids_BT = split_batch(batch)[0]
    side = logits_side(model, batch, use_cache=False)
    if isinstance(side, torch.Tensor) and side.shape[:2] != ids_BT.shape:
        raise HybridlabError(f"logits {tuple(side.shape)} do not match input ids {tuple(ids_BT.shape)}")
    nll_BT = token_nll_chunked(side, next_token_labels(batch, ignore_index=0), chunk_tokens, vocab_chunk)
    if teacher is None:
        return nll_BT[:, :-1].float(), None
    if teacher_memo is not None and projects_logits(teacher):
        if key not in teacher_memo:
            teacher_memo[key] = final_hidden(teacher, batch)
        teacher_side = lm_head_side(teacher, teacher_memo[key])
    else:
        teacher_side = logits_side(teacher, batch, use_cache=False)
    kl_BT = token_kl_chunked(teacher_side, side, chunk_tokens, vocab_chunk)
    return nll_BT[:, :-1].float(), kl_BT[:, :-1].float()


def evaluate_perplexity(model: nn.Module, input_ids: torch.Tensor, langs: Sequence[str], *,
                        model_name: str, teacher: nn.Module | None = None, pad_id: int | None = None,
                        batch_size: int = 8, device: str | torch.device | None = None, chunk_tokens: int = 1024,
                        vocab_chunk: int | None = None, per_row: list | None = None,
                        teacher_memo: dict | None = None) -> pl.DataFrame:
    """Tidy rows (model, lang, n_tokens, ce, ppl, kl) over packed rows [N, T]; kl is null without a teacher.

    ``input_ids`` may be ``hybridlab.data.packed_dataset.Documents``: both models then run document-masked and
    only positions whose successor lies in their own document are scored (CE and KL alike).

    `per_row` (a list) receives one dict per input row: row (its index), lang, n_tokens, ce and kl (that
    row's token means; kl None without a teacher), the units of the bootstrap CIs and paired tests.

    `teacher_memo` (a dict the caller keeps): the teacher's final hidden states of each batch are kept in
    it and reused by later calls on the same `input_ids` and `batch_size` (the teacher is frozen).

    Transformers causal LMs are scored from their final hidden states chunk by chunk
    (`hybridlab.train.tasks.logits_side`, `chunk_tokens` rows x `vocab_chunk` columns of logits at a
    time), so no `[B, T, V]` tensor is built; other modules' full logits are scored as given.
    """
    from hybridlab.data.packed_dataset import batch_rows, batch_to, in_document_targets, split_batch

    rows_NT = split_batch(input_ids)[0]
    if rows_NT.dim() != 2 or rows_NT.shape[1] < 2:
        raise HybridlabError(f"input_ids must be [N, T] with T >= 2, got {tuple(rows_NT.shape)}")
    if len(langs) != rows_NT.shape[0]:
        raise HybridlabError(f"{len(langs)} languages for {rows_NT.shape[0]} rows; pass one lang per row")
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    nll_sum: dict[str, float] = {}
    kl_sum: dict[str, float] = {}
    count: dict[str, int] = {}
    models = [m for m in (model, teacher) if m is not None]
    modes = [m.training for m in models]
    for m in models:
        m.eval()
    try:
        for b0 in range(0, rows_NT.shape[0], batch_size):
            batch = batch_to(batch_rows(input_ids, b0, b0 + batch_size), dev)
            ids_BT = split_batch(batch)[0]
            # no_grad, not inference_mode: inside a sharded run FSDP's gathered parameters would become
            # inference tensors, which the training step's next all-gather may not write into.
            with torch.no_grad():
                nll_BT, kl_BT = _chunked_nll_kl(model, teacher, batch, chunk_tokens, vocab_chunk, teacher_memo,
                                                (b0, batch_size))
            keep_BT = (ids_BT[:, 1:] != pad_id) if pad_id is not None else torch.ones_like(nll_BT, dtype=torch.bool)
            keep_BT = keep_BT & in_document_targets(batch)[:, :-1]
            for r, lang in enumerate(langs[b0:b0 + batch_size]):
                row_nll, row_n = float(nll_BT[r][keep_BT[r]].double().sum()), int(keep_BT[r].sum())
                row_kl = float(kl_BT[r][keep_BT[r]].double().sum()) if kl_BT is not None else None
                nll_sum[lang] = nll_sum.get(lang, 0.0) + row_nll
                count[lang] = count.get(lang, 0) + row_n
                if kl_BT is not None:
                    kl_sum[lang] = kl_sum.get(lang, 0.0) + row_kl
                if per_row is not None and row_n:
                    per_row.append({"row": b0 + r, "lang": lang, "n_tokens": row_n, "ce": row_nll / row_n,
                                    "kl": None if row_kl is None else row_kl / row_n})
    finally:
        for m, mode in zip(models, modes):
            m.train(mode)
    rows = []
    for lang in sorted(count):
        if count[lang] == 0:
            raise HybridlabError(f"language {lang!r} has no scored tokens (all padding?)")
        ce = nll_sum[lang] / count[lang]
        rows.append({"model": model_name, "lang": lang, "n_tokens": count[lang], "ce": ce, "ppl": math.exp(ce),
                     "kl": kl_sum[lang] / count[lang] if teacher is not None else None})
    return pl.DataFrame(rows, schema=ROW_SCHEMA)


def _check_curve(tokens: Sequence[float], loss: Sequence[float]) -> None:
    if len(tokens) != len(loss) or len(tokens) == 0:
        raise HybridlabError(f"a loss curve needs equally many tokens and losses (> 0), got {len(tokens)} "
                             f"and {len(loss)}")
    if any(b <= a for a, b in zip(tokens, tokens[1:])):
        raise HybridlabError("curve tokens must be strictly increasing; sort the logged points by step")
    if not all(math.isfinite(x) for x in loss):
        raise HybridlabError("the loss curve has NaN/Inf values; drop or fix those logged points")


def tokens_to_reach(curve_tokens: Sequence[float], curve_loss: Sequence[float], target_loss: float) -> float | None:
    """First (interpolated) token count where loss <= target_loss; None if the curve never gets there."""
    _check_curve(curve_tokens, curve_loss)
    if curve_loss[0] <= target_loss:
        return float(curve_tokens[0])
    for i in range(1, len(curve_loss)):
        if curve_loss[i] <= target_loss:
            t0, t1, l0, l1 = curve_tokens[i - 1], curve_tokens[i], curve_loss[i - 1], curve_loss[i]
            return float(t0 + (l0 - target_loss) / (l0 - l1) * (t1 - t0))
    return None


def fraction_of_baseline_tokens(curve_tokens: Sequence[float], curve_loss: Sequence[float],
                                baseline_tokens: Sequence[float], baseline_loss: Sequence[float],
                                target_loss: float | None = None) -> float | None:
    """tokens_to_reach(model) / tokens_to_reach(baseline) at the baseline's final loss (or target_loss)."""
    _check_curve(baseline_tokens, baseline_loss)
    target = float(baseline_loss[-1]) if target_loss is None else float(target_loss)
    base = tokens_to_reach(baseline_tokens, baseline_loss, target)
    if base is None:
        raise HybridlabError(f"the baseline never reaches loss {target}; choose a target it reaches")
    if base == 0:
        raise HybridlabError("the baseline reaches the target at 0 tokens; the fraction is undefined")
    mine = tokens_to_reach(curve_tokens, curve_loss, target)
    return None if mine is None else mine / base

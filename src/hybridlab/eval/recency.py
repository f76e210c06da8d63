"""Attention recency of full-attention (FA) layers: local attention mass and mean attention distance.

Definitions, per layer and head, for causal attention probabilities A[q, k] (rows sum to 1, k <= q):

- Recency mass at window w: for each query q >= w (so the window holds w real keys and at least one
  key lies outside it), m_w(q) = sum_{k in (q - w, q]} A[q, k]; averaged over all such queries, pooled
  over sequences (padding queries excluded). m_w = 1 means the head only looks at the last w tokens.
- Mean attention distance: d(q) = sum_k A[q, k] (q - k), averaged over all (non-padding) queries
  q >= 0, pooled over sequences. It grows with the context length, so compare at equal lengths.
- Uncertainty (`n_boot` > 0): `mass_lo/hi`, `mean_distance_lo/hi`, the 95 % percentile bootstrap over the
  input sequences (the sampling unit; queries of one sequence are correlated). Replicate b draws n
  sequence indices I_b with replacement and recomputes the pooled mean sum_{s in I_b} S_s / sum_{s in
  I_b} n_s (S_s: the sequence's sum over its eligible queries, n_s: their number), `stats.pooled_mean_ci`.

The runner reads the attention probabilities of the requested FA layers with forward hooks on their
attention modules, which return (output, weights) under `attn_implementation="eager"` (the model is
also called with `output_attentions=True` for models that only return weights when asked). Hooks
rather than `outputs.attentions` because in a converted hybrid only the FA layers record attentions,
so tuple positions would not match layer indices. Each batch is reduced to per-head sums at once, so
only one batch's [B, H, T, T] weights per FA layer exist at a time. Used to compare hybrid and
non-hybrid models: do the FA layers of hybrids attend further back than those of dense models?
"""

from __future__ import annotations

from typing import Sequence

import math

import numpy as np
import polars as pl
import torch
from torch import nn

from hybridlab.device import resolve_device
from hybridlab.errors import HybridlabError
from hybridlab.eval import stats
from hybridlab.models.sites import find_decoder_layers

ROW_SCHEMA = {"layer": pl.Int64, "head": pl.Int64, "window": pl.Int64, "mass": pl.Float64,
              "mean_distance": pl.Float64}
CI_SCHEMA = {"mass_lo": pl.Float64, "mass_hi": pl.Float64, "mean_distance_lo": pl.Float64,
             "mean_distance_hi": pl.Float64}
N_BOOT = 1000  # bootstrap replicates over sequences of the recency table (recency_table's default)


def _check_attn(attn_BHTT: torch.Tensor, query_mask_BT: torch.Tensor | None) -> torch.Tensor:
    if attn_BHTT.dim() != 4 or attn_BHTT.shape[-1] != attn_BHTT.shape[-2]:
        raise HybridlabError(f"attention probabilities must be [B, H, T, T], got {tuple(attn_BHTT.shape)}")
    B, _, T, _ = attn_BHTT.shape
    if query_mask_BT is None:
        return torch.ones(B, T, dtype=torch.bool, device=attn_BHTT.device)
    if query_mask_BT.shape != (B, T):
        raise HybridlabError(f"query mask must be [B, T] = [{B}, {T}], got {tuple(query_mask_BT.shape)}")
    return query_mask_BT.to(attn_BHTT.device, torch.bool)


def _mass_terms(attn_BHTT: torch.Tensor, window: int,
                query_mask_BT: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(m_w(q) of eligible queries, 0 elsewhere [B, H, T]; eligible queries [B, T])."""
    if window < 1:
        raise HybridlabError(f"recency window must be >= 1, got {window}")
    valid_BT = _check_attn(attn_BHTT, query_mask_BT)
    T = attn_BHTT.shape[-1]
    q_T1 = torch.arange(T, device=attn_BHTT.device)[:, None]
    k_1T = torch.arange(T, device=attn_BHTT.device)[None, :]
    in_window_TT = (k_1T <= q_T1) & (k_1T > q_T1 - window)
    mass_BHT = (attn_BHTT.float() * in_window_TT).sum(-1)
    eligible_BT = valid_BT & (torch.arange(T, device=attn_BHTT.device) >= window)[None, :]
    return mass_BHT * eligible_BT[:, None, :], eligible_BT


def _distance_terms(attn_BHTT: torch.Tensor, query_mask_BT: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """(d(q) of valid queries, 0 elsewhere [B, H, T]; valid queries [B, T])."""
    valid_BT = _check_attn(attn_BHTT, query_mask_BT)
    T = attn_BHTT.shape[-1]
    pos_T = torch.arange(T, device=attn_BHTT.device, dtype=torch.float32)
    dist_TT = (pos_T[:, None] - pos_T[None, :]).clamp_min(0.0)
    dist_BHT = (attn_BHTT.float() * dist_TT).sum(-1)
    return dist_BHT * valid_BT[:, None, :], valid_BT


def _pooled(terms_BHT: torch.Tensor, counted_BT: torch.Tensor) -> tuple[torch.Tensor, int]:
    return terms_BHT.sum((0, 2)).double().cpu(), int(counted_BT.sum())


def _per_sequence(terms_BHT: torch.Tensor, counted_BT: torch.Tensor) -> tuple[np.ndarray, np.ndarray]:
    """(per-sequence sums [B, H] float64, per-sequence counts [B]) for the bootstrap over sequences."""
    return terms_BHT.sum(2).double().cpu().numpy(), counted_BT.sum(1).cpu().numpy().astype(np.int64)


def recency_mass_sums(attn_BHTT: torch.Tensor, window: int,
                      query_mask_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """(sum over eligible queries of m_w(q) per head [H], number of eligible queries)."""
    return _pooled(*_mass_terms(attn_BHTT, window, query_mask_BT))


def distance_sums(attn_BHTT: torch.Tensor, query_mask_BT: torch.Tensor | None = None) -> tuple[torch.Tensor, int]:
    """(sum over valid queries of d(q) per head [H], number of valid queries)."""
    return _pooled(*_distance_terms(attn_BHTT, query_mask_BT))


def recency_mass(attn_BHTT: torch.Tensor, window: int, query_mask_BT: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head mean over queries q >= window of the attention mass on the last `window` keys; [H]."""
    total_H, n = recency_mass_sums(attn_BHTT, window, query_mask_BT)
    if n == 0:
        raise HybridlabError(f"no query position >= window {window}; use longer sequences or a smaller window")
    return total_H / n


def mean_attention_distance(attn_BHTT: torch.Tensor, query_mask_BT: torch.Tensor | None = None) -> torch.Tensor:
    """Per-head mean over queries of sum_k A[q, k] (q - k); [H]."""
    total_H, n = distance_sums(attn_BHTT, query_mask_BT)
    if n == 0:
        raise HybridlabError("no valid query positions (the query mask is all False)")
    return total_H / n


def attention_recency(model: nn.Module, sequences: Sequence[Sequence[int]] | torch.Tensor,
                      fa_layers: Sequence[int], windows: Sequence[int], *,
                      device: str | torch.device | None = None, batch_size: int = 4, n_boot: int = 0,
                      seed: int = 0) -> pl.DataFrame:
    """Recency mass per window and mean distance for every head of the given FA layers (tidy rows:
    ROW_SCHEMA). `n_boot` > 0 adds CI_SCHEMA's columns mass_lo/hi and mean_distance_lo/hi, the 95 %
    percentile bootstrap over the sequences (`stats.pooled_mean_ci`, `n_boot` replicates from `seed`; the same
    sequence draws for every head, layer and window; NaN with one sequence)."""
    if not fa_layers:
        raise HybridlabError("fa_layers is empty; pass the indices of the full-attention layers")
    if not windows:
        raise HybridlabError("windows is empty; pass at least one recency window (e.g. [16, 64])")
    impl = getattr(model.config, "_attn_implementation", None)
    if impl != "eager":
        raise HybridlabError(f"attention recency needs attention probabilities but the model uses "
                             f"attn_implementation={impl!r}; load it with attn_implementation='eager'")
    _, decoder = find_decoder_layers(model)
    for layer in fa_layers:
        if not 0 <= layer < len(decoder) or not isinstance(getattr(decoder[layer], "self_attn", None), nn.Module):
            raise HybridlabError(f"layer {layer} is not a full-attention layer with a self_attn module "
                                 f"(model has {len(decoder)} layers); check the FA layer indices")
    seqs = [list(map(int, s)) for s in (sequences.tolist() if torch.is_tensor(sequences) else sequences)]
    if not seqs or min(len(s) for s in seqs) == 0:
        raise HybridlabError("attention recency needs at least one non-empty sequence")
    dev = torch.device(device) if device is not None else next(model.parameters()).device

    weights: dict[int, torch.Tensor | None] = {}
    handles = []
    for layer in fa_layers:
        def hook(_m, _a, out, layer=layer):
            weights[layer] = out[1] if isinstance(out, (tuple, list)) and len(out) > 1 else None
        handles.append(decoder[layer].self_attn.register_forward_hook(hook))
    mass_sum = {(la, w): 0.0 for la in fa_layers for w in windows}
    mass_n = dict.fromkeys(mass_sum, 0)
    dist_sum: dict[int, torch.Tensor | float] = dict.fromkeys(fa_layers, 0.0)
    dist_n = dict.fromkeys(fa_layers, 0)
    # per-sequence sums [B, H] and counts [B] of every batch, for the bootstrap over sequences
    mass_rows: dict = {k: [] for k in mass_sum}
    dist_rows: dict = {la: [] for la in fa_layers}
    was_training = model.training
    model.eval()
    try:
        for b0 in range(0, len(seqs), batch_size):
            batch = seqs[b0:b0 + batch_size]
            t_max = max(len(s) for s in batch)
            ids_BT = torch.zeros(len(batch), t_max, dtype=torch.long)
            mask_BT = torch.zeros(len(batch), t_max, dtype=torch.long)
            for r, s in enumerate(batch):  # right padding: real queries never see padded keys
                ids_BT[r, :len(s)] = torch.tensor(s)
                mask_BT[r, :len(s)] = 1
            weights.clear()
            with torch.inference_mode():
                model(input_ids=ids_BT.to(dev), attention_mask=mask_BT.to(dev), output_attentions=True,
                      use_cache=False)
            for layer in fa_layers:
                attn = weights.get(layer)
                if attn is None:
                    raise HybridlabError(f"layer {layer} returned no attention weights; is it a full-attention "
                                         "layer run with attn_implementation='eager'?")
                for w in windows:
                    terms = _mass_terms(attn, w, mask_BT)
                    s_H, n = _pooled(*terms)
                    mass_sum[(layer, w)] = mass_sum[(layer, w)] + s_H
                    mass_n[(layer, w)] += n
                    if n_boot:
                        mass_rows[(layer, w)].append(_per_sequence(*terms))
                terms = _distance_terms(attn, mask_BT)
                s_H, n = _pooled(*terms)
                dist_sum[layer] = dist_sum[layer] + s_H
                dist_n[layer] += n
                if n_boot:
                    dist_rows[layer].append(_per_sequence(*terms))
            weights.clear()
    finally:
        for h in handles:
            h.remove()
        model.train(was_training)
    def intervals(parts):  # per head (lo, hi) of the bootstrap over the sequences
        S_SH = np.concatenate([p[0] for p in parts])
        n_S = np.concatenate([p[1] for p in parts])
        return [stats.pooled_mean_ci(S_SH[:, h], n_S, n_boot=n_boot, seed=seed) for h in range(S_SH.shape[1])]

    rows = []
    for layer in fa_layers:
        dist_H = dist_sum[layer] / dist_n[layer]
        dist_ci = intervals(dist_rows[layer]) if n_boot else None
        for w in windows:
            if mass_n[(layer, w)] == 0:
                raise HybridlabError(f"no query position >= window {w}; use longer sequences or a smaller window")
            mass_H = mass_sum[(layer, w)] / mass_n[(layer, w)]
            mass_ci = intervals(mass_rows[(layer, w)]) if n_boot else None
            for h in range(mass_H.shape[0]):
                row = {"layer": layer, "head": h, "window": w, "mass": float(mass_H[h]),
                       "mean_distance": float(dist_H[h])}
                if n_boot:
                    row.update(mass_lo=mass_ci[h][0], mass_hi=mass_ci[h][1], mean_distance_lo=dist_ci[h][0],
                               mean_distance_hi=dist_ci[h][1])
                rows.append(row)
    return pl.DataFrame(rows, schema={**ROW_SCHEMA, **(CI_SCHEMA if n_boot else {})})


# --- the recency table of the eval_recency rule ----------------------------------------------------------

RECENCY_COLUMNS = ["model", "pair", "role", "lang", "layer", "head", "window", "mass", "mass_lo", "mass_hi",
                   "mean_distance", "mean_distance_lo", "mean_distance_hi", "n_sequences", "input_tokens", "n_boot"]


def recency_table(mono: pl.DataFrame, params: "RecencyJob | dict", *, device: str | None = None, log=print,
                  n_boot: int = N_BOOT) -> pl.DataFrame:
    """Attention-recency table of every analysis model (the eval_recency rule; workflow_scripts/eval_recency.py).

    `mono`: the monolingual corpus (doc_id, lang, text, source). `params`: the job's section
    (`hybridlab.config_spec.RecencyJob`, or its dict): the models, dtype, seed and `eval.analysis.recency`
    (languages, n_sequences, input_tokens, windows, batch_size). For every model (loaded once, eager attention) and
    language, `n_sequences` documents (seeded order, the first with at least `input_tokens` tokens in the
    model's tokenizer: `pairs.token_windows`) are cut to `input_tokens` tokens and every full-attention
    layer's heads give `attention_recency`. One row per (model, pair, lang, layer, head, window) in
    RECENCY_COLUMNS, sorted by model, pair, lang, layer, head, window. A model without an FA layer is an error.
    `mass_lo/hi`, `mean_distance_lo/hi`: 95 % percentile bootstrap over the `n_sequences` sequences of the
    (model, lang) (`n_boot` replicates, default N_BOOT = 1000, recorded in column `n_boot`; seed `seed`;
    NaN with one sequence or n_boot 0).
    """
    import time

    from hybridlab.eval import pairs

    from hybridlab.config_spec import RecencyJob, job_settings, to_dict

    job = job_settings(RecencyJob, params, "eval_recency.py")
    cfg = job.recency
    device = resolve_device(device)
    docs = pairs.mono_documents(mono, cfg.languages, job.seed)
    log(f"recency: {cfg.n_sequences} x {cfg.input_tokens} tokens per language {cfg.languages}, "
        f"windows {cfg.windows}, device {device}")
    tables = []
    for m in pairs.analysis_models(**to_dict(job.models)):
        t0 = time.perf_counter()
        model, tok = pairs.load_analysis_model(m, dtype=job.dtype, device=device, eager_attention=True)
        fa = pairs.fa_layers(model)
        if not fa:
            raise HybridlabError(f"model {m.name} has no full-attention layer; attention recency needs one")
        for lang, texts in docs.items():
            seqs = pairs.token_windows(tok, texts, cfg.n_sequences, cfg.input_tokens, lang)
            df = attention_recency(model, seqs, fa, cfg.windows, device=device, batch_size=cfg.batch_size,
                                   n_boot=n_boot, seed=job.seed)
            if not n_boot:
                df = df.with_columns([pl.lit(math.nan).alias(c) for c in CI_SCHEMA])
            df = df.with_columns(pl.lit(lang).alias("lang"), pl.lit(len(seqs)).alias("n_sequences"),
                                 pl.lit(cfg.input_tokens).alias("input_tokens"), pl.lit(n_boot, pl.Int64).alias("n_boot"))
            tables.append(pl.DataFrame(pairs.pair_rows(m)).join(df, how="cross"))
        del model
        log(f"  {m.name}: FA layers {fa}, {time.perf_counter() - t0:.1f}s")
    table = pl.concat(tables).select(RECENCY_COLUMNS).sort("model", "pair", "lang", "layer", "head", "window")
    log(str(table.group_by("model", "window").agg(pl.col("mass").mean(), pl.col("mean_distance").mean())
            .sort("model", "window")))
    return table

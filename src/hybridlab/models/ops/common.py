"""Shared pieces of the chunked linear-recurrence ops: input checks, chunk layout, stable decays.

Layout follows flash-linear-attention 0.6 (``head_first=False``): q, k are ``[B, T, H, K]``, v is
``[B, T, H, V]``, a scalar log-decay ``g`` is ``[B, T, H]``, a per-channel one ``[B, T, H, K]``,
``beta`` is ``[B, T, H]`` and recurrent states are ``[B, H, K, V]``.

Inside the CPU implementations every tensor is moved to the *chunk layout* ``[N, Z, C, D]``: ``N``
chunks of ``C`` tokens for ``Z = B*H`` independent sequences. The sequence is right-padded to a multiple of
``C`` with neutral tokens: ``k = v = q = 0``, log-decay ``g = 0`` (decay 1) and ``beta = 0``, so a
padded token changes neither the outputs of real tokens nor the final state.

Decays are handled in log space. ``b = cumsum(g)`` within a chunk is non-increasing, so every factor
``exp(b_i - b_j)`` with ``j <= i`` lies in (0, 1]; the code only ever exponentiates such differences
(upper-triangular entries are masked to ``-inf`` *before* ``exp``), which keeps strong decays from
overflowing (the naive factorisation ``exp(b_i) * exp(-b_j)`` overflows once ``-b_j`` > 88 in fp32).

The per-channel-decay op of GLA and KDA (`chunk_per_channel`) is in `hybridlab.models.ops.per_channel`.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from hybridlab.errors import HybridlabError


def compute_dtype(x: Tensor) -> torch.dtype:
    """fp64 stays fp64 (for gradcheck-style tests); everything else is computed in fp32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def resolve_scale(scale: float | None, head_k_dim: int) -> float:
    """Default query scale ``K ** -0.5`` (fla's convention)."""
    return head_k_dim ** -0.5 if scale is None else float(scale)


def l2norm(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(sum(x^2) + eps)`` over the last dim, fla's ``use_qk_l2norm_in_kernel`` definition."""
    return x * torch.rsqrt(x.square().sum(-1, keepdim=True) + eps)


def check_inputs(
    op: str,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor | None,
    initial_state: Tensor | None,
    per_channel_g: bool,
    chunk_size: int | None = None,
    allow_gva: bool = True,
    cu_seqlens: Tensor | None = None,
) -> None:
    """Raise :class:`HybridlabError` for shape mismatches a caller can make.

    With ``cu_seqlens`` (fla's variable-length form, :func:`check_cu_seqlens`) the batch is one row and
    ``initial_state`` holds one state per sequence.

    With ``allow_gva`` (grouped value attention, as in fla and Qwen3.5) v may have ``HV`` heads, a
    multiple of the ``H`` q/k heads; g, beta and the state then follow the ``HV`` value heads.
    """
    if q.dim() != 4 or k.shape != q.shape:
        raise HybridlabError(
            f"{op}: q and k must both be [B, T, H, K], got {tuple(q.shape)} and {tuple(k.shape)}; "
            "pass tensors in fla's [batch, time, heads, dim] layout"
        )
    B, T, H, K = q.shape
    HV = v.shape[2] if v.dim() == 4 else -1
    if v.dim() != 4 or v.shape[:2] != (B, T) or (HV != H and not (allow_gva and HV % H == 0)):
        heads = "HV (a multiple of H)" if allow_gva else "H"
        raise HybridlabError(f"{op}: v must be [B, T, {heads}, V] with B={B}, T={T}, H={H}, got {tuple(v.shape)}")
    g_shape = (B, T, HV, K) if per_channel_g else (B, T, HV)
    if tuple(g.shape) != g_shape:
        kind = "per-channel log-decay [B, T, HV, K]" if per_channel_g else "per-head log-decay [B, T, HV]"
        raise HybridlabError(f"{op}: g must be the {kind} {g_shape}, got {tuple(g.shape)}")
    if beta is not None and tuple(beta.shape) != (B, T, HV):
        raise HybridlabError(f"{op}: beta must be [B, T, HV] = {(B, T, HV)}, got {tuple(beta.shape)}")
    states = check_cu_seqlens(op, cu_seqlens, q, initial_state) if cu_seqlens is not None else B
    if initial_state is not None and tuple(initial_state.shape) != (states, HV, K, v.shape[-1]):
        raise HybridlabError(
            f"{op}: initial_state must be [{'N' if cu_seqlens is not None else 'B'}, HV, K, V] = "
            f"{(states, HV, K, v.shape[-1])}, got {tuple(initial_state.shape)}"
        )
    if chunk_size is not None and (not isinstance(chunk_size, int) or chunk_size < 1):
        raise HybridlabError(f"{op}: chunk_size must be a positive int, got {chunk_size!r}")


def expand_gva(q: Tensor, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
    """Repeat each q/k head over its group of value heads (fla's GVA convention: consecutive groups)."""
    group = v.shape[2] // q.shape[2]
    if group == 1:
        return q, k
    return q.repeat_interleave(group, dim=2), k.repeat_interleave(group, dim=2)


def pad_time(x: Tensor, chunk_size: int) -> Tensor:
    """Right-pad ``[B, T, H, *D]`` with zeros to a multiple of ``chunk_size`` tokens (``x`` itself if it is one)."""
    pad = (-x.shape[1]) % chunk_size
    return F.pad(x, (0, 0) * (x.dim() - 3) + (0, 0, 0, pad)) if pad else x


def chunk_view(x: Tensor, chunk_size: int) -> Tensor:
    """``[B, T, H, *D]`` (T a multiple of ``chunk_size``) as an ``[N, B, H, C, *D]`` view, no copy.

    ``chunk_view(x)[n]`` is chunk ``n`` of every (batch, head) sequence; with ``.view(B * H, C, *D)``
    on a contiguous chunk-layout buffer it is the bridge between fla's layout and the chunk layout,
    one chunk at a time. Splitting the time dim is a view for any strides (also expanded tensors).
    """
    B, T, H = x.shape[:3]
    x = x.view(B, T // chunk_size, chunk_size, H, *x.shape[3:])
    return x.permute(1, 0, 3, 2, *range(4, x.dim()))


def to_chunks(x: Tensor, chunk_size: int, dtype: torch.dtype) -> Tensor:
    """``[B, T, H, *D]`` -> chunk layout ``[N, B*H, C, *D]`` in ``dtype``, right-padded with zeros.

    Chunk-major order makes ``x[n]`` contiguous, so the sequential scan over chunks writes and reads
    whole contiguous ``[Z, ...]`` slabs.
    """
    B, _, H = x.shape[:3]
    x = chunk_view(pad_time(x.to(dtype), chunk_size), chunk_size)  # [N, B, H, C, *D]
    return x.reshape(x.shape[0], B * H, chunk_size, *x.shape[4:]).contiguous()


def from_chunks(x_NZCD: Tensor, batch: int, heads: int, seq_len: int) -> Tensor:
    """Inverse of :func:`to_chunks` for ``[N, Z, C, D]``: drops the padding, returns ``[B, T, H, D]``."""
    N, _, C, D = x_NZCD.shape
    x = x_NZCD.reshape(N, batch, heads, C, D).permute(1, 0, 3, 2, 4).reshape(batch, N * C, heads, D)
    return x[:, :seq_len].contiguous()


def lower_mask(n: int, device: torch.device, diagonal: int = 0) -> Tensor:
    """Boolean ``[n, n]`` mask, True on and below ``diagonal`` (``-1`` = strictly lower)."""
    return torch.ones(n, n, dtype=torch.bool, device=device).tril(diagonal)


def _bmm(a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """``alpha * (a @ b)`` over leading ``[N, Z]`` dims as one batched GEMM (``alpha`` costs no extra pass)."""
    out = a.new_empty(*a.shape[:-1], b.shape[-1])
    flat = out.view(-1, *out.shape[-2:])
    torch.baddbmm(flat, a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), beta=0.0, alpha=alpha, out=flat)
    return out


def _addmm_(out: Tensor, a: Tensor, b: Tensor, alpha: float = 1.0) -> Tensor:
    """``out += alpha * (a @ b)`` over leading ``[N, Z]`` dims without allocating the product."""
    out.view(-1, *out.shape[-2:]).baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]), alpha=alpha)
    return out


def pairwise_decay(b_NZC: Tensor) -> Tensor:
    """``D[i, j] = exp(b_i - b_j)`` for ``j <= i`` and 0 above the diagonal, without overflow."""
    C = b_NZC.shape[-1]
    diff = b_NZC[..., :, None] - b_NZC[..., None, :]
    # clamp, exp, then zero the upper triangle: exp(-inf) is the slow path of the vectorised exp
    return diff.clamp_max_(0.0).exp_().mul_(lower_mask(C, b_NZC.device).to(diff.dtype))


def unit_lower_inverse(L: Tensor, base: int = 16) -> Tensor:
    """Inverse of unit lower-triangular ``[..., C, C]`` matrices; only the strict lower triangle of ``L`` is read.

    The diagonal is taken to be 1 whatever ``L`` holds there, so callers pass ``strict_lower(A)`` for
    ``(I + A)^{-1}`` without writing the identity in.

    Block recursion ``[[L11, 0], [L21, L22]]^-1 = [[T11, 0], [-T22 L21 T11, T22]]`` down to ``base``
    sized blocks solved by LAPACK: about twice as fast on CPU as one batched ``solve_triangular``
    against the identity, because the large off-diagonal blocks become batched matmuls.
    """
    C = L.shape[-1]
    if C <= base:
        eye = torch.eye(C, dtype=L.dtype, device=L.device).expand_as(L)
        return torch.linalg.solve_triangular(L, eye, upper=False, unitriangular=True)
    h = C // 2
    T = L.new_zeros(L.shape)
    T11 = unit_lower_inverse(L[..., :h, :h], base)
    T22 = unit_lower_inverse(L[..., h:, h:], base)
    T[..., :h, :h] = T11
    T[..., h:, h:] = T22
    T[..., h:, :h] = -(T22 @ (L[..., h:, :h] @ T11))
    return T


def sub_chunk_size(chunk_size: int) -> int:
    """The divisor of ``chunk_size`` closest to its square root (balances the two halves of the work)."""
    root = math.sqrt(chunk_size)
    divisors = [d for d in range(1, chunk_size + 1) if chunk_size % d == 0]
    return min(divisors, key=lambda d: (abs(d - root), d))


class Scratch(dict):
    """Per-call scratch buffers, allocated on first use and reused for every chunk of a scan.

    A fresh multi-MB temporary per chunk costs more than the arithmetic that fills it: freed large
    blocks go back to the OS and every reuse page-faults them in again (how much depends on the
    allocator and the kernel, so on the machine). ``get`` hands out the same buffer each time.
    """

    def get(self, name: str, shape, like: Tensor) -> Tensor:
        buf = dict.get(self, name)
        if buf is None or buf.shape != tuple(shape):
            buf = self[name] = like.new_empty(shape)
        return buf

    def mask(self, n: int, diagonal: int, like: Tensor) -> Tensor:
        key = f"mask{n}:{diagonal}"
        if key not in self:
            self[key] = lower_mask(n, like.device, diagonal).to(like.dtype)
        return self[key]


def check_cu_seqlens(op: str, cu_seqlens: Tensor, q: Tensor, initial_state: Tensor | None) -> int:
    """Validate fla-style ``cu_seqlens`` for inputs flattened to ``[1, T, ...]``; returns the sequence count.

    As in fla, variable-length inputs are one row (``B = 1``) split at ``cu_seqlens`` (``[N + 1]``
    ascending integers from 0 to T); ``initial_state``, when given, holds one state per sequence.
    """
    if q.shape[0] != 1:
        raise HybridlabError(f"{op}: with cu_seqlens the batch size must be 1, got {q.shape[0]}; "
                             "flatten the sequences to [1, total_tokens, ...] first")
    T = q.shape[1]
    cu = cu_seqlens.detach().to("cpu", torch.long)
    if cu.dim() != 1 or cu.numel() < 2 or int(cu[0]) != 0 or int(cu[-1]) != T or bool((cu.diff() <= 0).any()):
        raise HybridlabError(f"{op}: cu_seqlens must rise strictly from 0 to T={T}, got {cu.tolist()[:8]}"
                             f"{' ...' if cu.numel() > 8 else ''}; build it from the sequence lengths")
    N = cu.numel() - 1
    if initial_state is not None and initial_state.shape[0] != N:
        raise HybridlabError(f"{op}: with cu_seqlens initial_state needs one state per sequence "
                             f"({N}), got {initial_state.shape[0]}")
    return N


def varlen_cpu(fn, cu_seqlens: Tensor, seqs: list[Tensor], initial_state: Tensor | None,
               output_final_state: bool) -> tuple[Tensor, Tensor | None]:
    """fla's ``cu_seqlens`` semantics on CPU: each sequence of the ``[1, T, ...]`` inputs becomes its own row.

    The sequences are gathered into a ``[N, L_max, ...]`` batch right-padded with zeros, which is neutral for
    every op here (``q = k = v = 0``, log-decay 0, ``beta = 0``: padding changes neither outputs nor states),
    ``fn(*padded, initial_state, output_final_state)`` runs once, and its output is scattered back to
    ``[1, T, ...]``. Exact (the rows never interact); the cost grows with ``N * L_max`` rather than ``T``.
    """
    T, device = seqs[0].shape[1], seqs[0].device
    cu = cu_seqlens.detach().to("cpu", torch.long)
    lens = cu.diff()
    N, L = lens.numel(), int(lens.max())
    offsets = torch.arange(L)
    valid = offsets[None, :] < lens[:, None]  # [N, L]
    gather = torch.where(valid, cu[:-1, None] + offsets, T).to(device)  # T = the appended zero row
    scatter = (torch.arange(N)[:, None] * L + offsets)[valid].to(device)  # flat order = segment-major order
    padded = [torch.cat([x[0], x.new_zeros((1,) + tuple(x.shape[2:]))])[gather] for x in seqs]
    o, final = fn(*padded, initial_state, output_final_state)
    return o.reshape(N * L, *o.shape[2:])[scatter].unsqueeze(0), final


def fla_op(module: str, name: str):
    """Import one of fla's Triton ops; only called for CUDA tensors."""
    import importlib

    try:
        return getattr(importlib.import_module(module), name)
    except ImportError as err:  # pragma: no cover - depends on the environment
        raise HybridlabError(
            f"CUDA tensors need flash-linear-attention ({module}.{name}): {err}; install "
            "`flash-linear-attention>=0.6,<0.7` or move the tensors to CPU"
        ) from err

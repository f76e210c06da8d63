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

:func:`per_channel_scores` computes the intra-chunk score matrices for per-channel decays (GLA, KDA),
``P[i, j] = sum_d x_id k_jd exp(b_id - b_jd)`` for ``j <= i``, with the secondary-chunking idea of
fla's kernels: the chunk is split into ``S`` sub-chunks of ``c`` tokens; a block of rows in sub-chunk
``s`` against all earlier columns factorises through the reference position ``r = s*c`` as
``(x_i exp(b_i - b_r)) . (k_j exp(b_r - b_j))`` (both factors <= 1, one batched matmul), and only the
``c x c`` diagonal blocks are formed element-wise.
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
) -> None:
    """Raise :class:`HybridlabError` for shape mismatches a caller can make.

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
    if initial_state is not None and tuple(initial_state.shape) != (B, HV, K, v.shape[-1]):
        raise HybridlabError(
            f"{op}: initial_state must be [B, HV, K, V] = {(B, HV, K, v.shape[-1])}, got "
            f"{tuple(initial_state.shape)}"
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


def pairwise_decay(b_NZC: Tensor) -> Tensor:
    """``D[i, j] = exp(b_i - b_j)`` for ``j <= i`` and 0 above the diagonal, without overflow."""
    C = b_NZC.shape[-1]
    diff = b_NZC[..., :, None] - b_NZC[..., None, :]
    return diff.masked_fill_(~lower_mask(C, b_NZC.device), float("-inf")).exp_()


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


def _score_parts(b_ZCK: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Decay factors of :func:`per_channel_scores` for one ``[Z, C, K]`` slab of cumulative log-decays.

    Returns ``row_scale [Z, S, c, K] = exp(b_i - b_r)`` (r = first token of i's sub-chunk),
    ``col_exp [Z, S, C, K] = exp(b_r - b_j)`` for columns ``j < r`` of sub-chunk s and 0 elsewhere, and
    the diagonal blocks' ``decay [Z, S, c_i, c_j, K] = exp(b_i - b_j)`` for ``j <= i`` and 0 elsewhere.
    Every exponent is ``<= 0`` (masked to ``-inf`` before ``exp``), so every factor lies in [0, 1].
    """
    Z, C, K = b_ZCK.shape
    c = sub_chunk_size(C)
    S = C // c
    device = b_ZCK.device
    b_blk = b_ZCK.view(Z, S, c, K)
    ref = b_blk[:, :, :1]  # [Z, S, 1, K]
    row_scale = (b_blk - ref).exp_()
    before_ref = torch.arange(C, device=device)[None, :] < (torch.arange(S, device=device) * c)[:, None]
    col_exp = (ref - b_ZCK[:, None]).masked_fill_(~before_ref[None, :, :, None], float("-inf")).exp_()
    decay = b_blk[:, :, :, None, :] - b_blk[:, :, None, :, :]
    decay = decay.masked_fill_(~lower_mask(c, device)[None, None, :, :, None], float("-inf")).exp_()
    return row_scale, col_exp, decay


def _scores(parts, rows: list[Tensor], k_ZCK: Tensor) -> list[Tensor]:
    """``[Z, C, C]`` per-channel scores of each ``[Z, C, K]`` row set against ``k`` (see :func:`per_channel_scores`)."""
    row_scale, col_exp, decay = parts
    Z, S, c, K = row_scale.shape
    C, R = S * c, len(rows)
    k_cols = k_ZCK[:, None] * col_exp  # [Z, S, C, K]
    x_rows = torch.cat([x.view(Z, S, c, K) * row_scale for x in rows], dim=2)  # [Z, S, R*c, K]
    off = torch.matmul(x_rows, k_cols.mT)  # [Z, S, R*c, C]; blocks at and above the diagonal are 0
    k_dec = decay * k_ZCK.view(Z, S, 1, c, K)  # [Z, S, c_i, c_j, K]
    x_stack = torch.stack([x.view(Z, S, c, K) for x in rows], dim=-1)  # [Z, S, c_i, K, R]
    diag = torch.matmul(k_dec, x_stack)  # [Z, S, c_i, c_j, R]
    out = []
    for r in range(R):
        scores = off[:, :, r * c:(r + 1) * c].reshape(Z, S, c, S, c)  # a copy when R > 1
        scores.diagonal(dim1=1, dim2=3).add_(diag[..., r].permute(0, 2, 3, 1))
        out.append(scores.reshape(Z, C, C))
    return out


def _scores_backward(parts, rows: list[Tensor], k_ZCK: Tensor, grads: list[Tensor]):
    """Hand-written backward of :func:`_scores`: ``(d rows, d k, d b)`` from the scores' gradients.

    Entries of ``grads`` above the diagonal are ignored (the factors there are exactly 0). With
    ``P_ij = sum_d x_id k_jd exp(b_id - b_jd)`` the log-decay gradient needs no products of its own:
    ``db = sum_rows x * dx - k * dk``.
    """
    row_scale, col_exp, decay = parts
    Z, S, c, K = row_scale.shape
    C, R = S * c, len(rows)
    k_cols = k_ZCK[:, None] * col_exp
    dP_off = torch.cat([g.reshape(Z, S, c, C) for g in grads], dim=2)  # [Z, S, R*c, C]
    x_rows = torch.cat([x.view(Z, S, c, K) * row_scale for x in rows], dim=2)
    dx_off = torch.matmul(dP_off, k_cols).view(Z, S, R, c, K).mul_(row_scale[:, :, None])
    dk = torch.matmul(dP_off.mT, x_rows).mul_(col_exp).sum(1)  # [Z, C, K]
    # diagonal blocks
    dP_diag = torch.stack([g.reshape(Z, S, c, S, c).diagonal(dim1=1, dim2=3) for g in grads], dim=-1)  # [Z, c_i, c_j, S, R]
    dP_diag = dP_diag.permute(0, 3, 1, 4, 2)  # [Z, S, c_i, R, c_j]
    k_dec = decay * k_ZCK.view(Z, S, 1, c, K)
    dx_diag = torch.matmul(dP_diag, k_dec)  # [Z, S, c_i, R, K]
    x_stack = torch.stack([x.view(Z, S, c, K) for x in rows], dim=3)  # [Z, S, c_i, R, K]
    M = torch.matmul(dP_diag.mT, x_stack)  # [Z, S, c_i, c_j, K]
    dk += M.mul_(decay).sum(2).view(Z, C, K)
    dxs = [(dx_off[:, :, r] + dx_diag[:, :, :, r]).view(Z, C, K) for r in range(R)]
    db = k_ZCK * dk
    db.neg_()
    for x, dx in zip(rows, dxs):
        db.addcmul_(x, dx)
    return dxs, dk, db


def per_channel_scores(rows: list[Tensor], k_NZCK: Tensor, b_NZCK: Tensor) -> list[Tensor]:
    """For each ``x`` in ``rows``: ``P[i, j] = sum_d x_id k_jd exp(b_id - b_jd)`` for ``j <= i``, else 0.

    ``rows`` and ``k_NZCK`` are ``[..., C, K]`` (any leading dims), ``b_NZCK`` the within-chunk
    cumulative log-decay. Returns ``[..., C, C]`` matrices (lower triangle including the diagonal).
    Not differentiable by autograd's own means where it matters: the ops use :func:`_scores` and
    :func:`_scores_backward` inside their hand-written backward.
    """
    lead, (C, K) = k_NZCK.shape[:-2], k_NZCK.shape[-2:]
    flat = [x.reshape(-1, C, K) for x in rows]
    out = _scores(_score_parts(b_NZCK.reshape(-1, C, K)), flat, k_NZCK.reshape(-1, C, K))
    return [p.view(*lead, C, C) for p in out]


def _pc_forward(q, k, v, b, beta, h0, save: bool):
    """Chunked per-channel-decay forward over chunk-layout ``[N, Z, C, D]`` inputs (GLA: ``beta is None``).

    KDA (``beta`` given): ``A = strict_lower(beta_i scores(k, k))``, ``T = (I + A)^{-1}``,
    ``V_new = T (diag(beta) V - K_bg S)`` with ``K_bg = diag(beta) (exp(b) * K)``; GLA: ``V_new = V``.
    Both: ``O = (exp(b) * Q) S + P V_new``, ``S' = Diag(exp(b_C)) S + (exp(b_C - b) * K)^T V_new``.
    The scan runs one chunk at a time so that every decay factor and score matrix stays in cache.
    """
    N, Z, C, K = k.shape
    V = v.shape[-1]
    delta = beta is not None
    O = v.new_empty(N, Z, C, V)
    S_all = k.new_empty(N + 1, Z, K, V)  # S_all[n] = state entering chunk n
    if h0 is None:
        S_all[0].zero_()
    else:
        S_all[0].copy_(h0)
    P_all = k.new_empty(N, Z, C, C) if save else None
    KK_all = Tinv_all = Vn_all = None
    if delta and save:
        KK_all, Tinv_all, Vn_all = k.new_empty(N, Z, C, C), k.new_empty(N, Z, C, C), v.new_empty(N, Z, C, V)
    for n in range(N):
        S = S_all[n]
        b_n, k_n, q_n = b[n], k[n], q[n]
        parts = _score_parts(b_n)
        gam = b_n.exp()
        b_last = b_n[:, -1:]
        Kd = k_n * (b_last - b_n).exp_()
        if delta:
            P, KK = _scores(parts, [q_n, k_n], k_n)
            beta_n = beta[n][..., None]
            Tinv = unit_lower_inverse(KK * beta_n)  # only the strict lower triangle is read
            X = torch.baddbmm(v[n] * beta_n, k_n * gam * beta_n, S, alpha=-1.0)  # V_b - K_bg S
            Vn = torch.bmm(Tinv, X)
            if save:
                KK_all[n], Tinv_all[n], Vn_all[n] = KK, Tinv, Vn
        else:
            (P,) = _scores(parts, [q_n], k_n)
            Vn = v[n]
        if save:
            P_all[n] = P
        torch.bmm(P, Vn, out=O[n]).baddbmm_(q_n * gam, S)
        torch.mul(S, b_last.mT.exp(), out=S_all[n + 1]).baddbmm_(Kd.mT, Vn)
    return O, S_all[N], (S_all, P_all, KK_all, Tinv_all, Vn_all)


def _pc_backward(q, k, v, b, beta, dO, dhT, saved):
    """Hand-written backward of :func:`_pc_forward`: the scan in reverse, one chunk at a time.

    ``dV_new = P^T dO + K_d dS'``; KDA: ``dX = T^T dV_new`` (``dv = beta dX``), ``dK_bg = -dX S^T``,
    ``dA = -strict_lower(dX V_new^T)``; ``dS = Diag(exp(b_C)) dS' + Q_g^T dO - K_bg^T dX``. The score
    gradients go through :func:`_scores_backward`; everything lands in ``db`` (the within-chunk
    cumulative log-decay), whose reverse cumsum autograd takes outside.
    """
    S_all, P_all, KK_all, Tinv_all, Vn_all = saved
    N, Z, C, K = k.shape
    delta = beta is not None
    dq, dk, db, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(b), torch.empty_like(v)
    dbeta = torch.empty_like(beta) if delta else None
    dS = k.new_zeros(Z, K, v.shape[-1]) if dhT is None else dhT.to(k.dtype).reshape(Z, K, -1).clone()
    for n in range(N - 1, -1, -1):
        S, P, dO_n = S_all[n], P_all[n], dO[n]
        b_n, k_n, q_n = b[n], k[n], q[n]
        parts = _score_parts(b_n)
        gam = b_n.exp()
        b_last = b_n[:, -1:]
        e_d = (b_last - b_n).exp_()
        Kd = k_n * e_d
        Qg = q_n * gam
        Vn = Vn_all[n] if delta else v[n]
        dVn = torch.bmm(P.mT, dO_n).baddbmm_(Kd, dS)
        dP = torch.bmm(dO_n, Vn.mT)  # only its lower triangle is read
        dQg = torch.bmm(dO_n, S.mT)
        dKd = torch.bmm(Vn, dS.mT)
        d_last = (S * dS).sum(-1).mul_(b_last[:, 0].exp())  # through Diag(exp(b_C)) S, [Z, K]
        dS_prev = torch.mul(dS, b_last.mT.exp()).baddbmm_(Qg.mT, dO_n)
        if delta:
            beta_n = beta[n][..., None]
            gb = gam * beta_n
            dX = torch.bmm(Tinv_all[n].mT, dVn)
            torch.mul(dX, beta_n, out=dv[n])
            dbeta_n = torch.linalg.vecdot(dX, v[n])
            ndKbg = torch.bmm(dX, S.mT)  # -dK_bg
            ndA = torch.bmm(dX, Vn.mT).tril_(-1)  # -dA (strict lower)
            dbeta_n -= torch.linalg.vecdot(ndA, KK_all[n])
            dKK = ndA.mul_(beta_n).neg_()
            dS_prev.baddbmm_(k_n.mul(gb).mT, dX, alpha=-1.0)
            (dq_s, dk_r), dk_s, db_s = _scores_backward(parts, [q_n, k_n], k_n, [dP, dKK])
            dk_s += dk_r
            dk_s.addcmul_(ndKbg, gb, value=-1.0)
            dbeta_n -= torch.linalg.vecdot(ndKbg, k_n * gam)
            db_s.addcmul_(ndKbg, k_n * gb, value=-1.0)
            dbeta[n] = dbeta_n
        else:
            dv[n] = dVn
            (dq_s,), dk_s, db_s = _scores_backward(parts, [q_n], k_n, [dP])
        torch.addcmul(dq_s, dQg, gam, out=dq[n])
        torch.addcmul(dk_s, dKd, e_d, out=dk[n])
        db_s.addcmul_(dQg, Qg)
        kd_term = dKd.mul_(Kd)
        db_s -= kd_term
        db_s[:, -1] += kd_term.sum(1) + d_last
        db[n] = db_s
        dS = dS_prev
    return dq, dk, dv, db, dbeta, dS


class _PerChannelChunk(torch.autograd.Function):
    """Chunked GLA (``beta=None``) / KDA over chunk-layout inputs, with :func:`_pc_backward`."""

    @staticmethod
    def forward(ctx, q, k, v, b, beta, h0):
        O, hT, saved = _pc_forward(q, k, v, b, beta, h0, save=True)
        S_all, P_all, KK_all, Tinv_all, Vn_all = saved
        ctx.delta = beta is not None
        ctx.has_h0 = h0 is not None
        ctx.save_for_backward(q, k, v, b, beta, S_all, P_all, KK_all, Tinv_all, Vn_all)
        return O, hT

    @staticmethod
    def backward(ctx, dO, dhT):
        q, k, v, b, beta, S_all, P_all, KK_all, Tinv_all, Vn_all = ctx.saved_tensors
        saved = (S_all, P_all, KK_all, Tinv_all, Vn_all)
        dq, dk, dv, db, dbeta, dh0 = _pc_backward(q, k, v, b, beta if ctx.delta else None, dO, dhT, saved)
        return dq, dk, dv, db, dbeta, (dh0 if ctx.has_h0 else None)


def chunk_per_channel(q: Tensor, k: Tensor, v: Tensor, b: Tensor, beta: Tensor | None,
                      h0: Tensor | None) -> tuple[Tensor, Tensor]:
    """Chunked GLA (``beta=None``) or KDA on chunk-layout ``[N, Z, C, D]`` inputs; ``(O [N, Z, C, V], S [Z, K, V])``.

    ``q`` is already scaled, ``b`` is the within-chunk cumulative log-decay, ``h0`` is ``[Z, K, V]``
    or None. Under autograd it runs as one ``autograd.Function`` with a hand-written backward.
    """
    args = [q, k, v, b, beta, h0]
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in args):
        return _PerChannelChunk.apply(*args)
    O, hT, _ = _pc_forward(q, k, v, b, beta, h0, save=False)
    return O, hT


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

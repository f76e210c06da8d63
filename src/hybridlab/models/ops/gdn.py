"""Gated DeltaNet (Yang, Kautz & Hatamizadeh 2024): naive reference, chunked CPU op, dispatch to fla on CUDA.

Recurrence per head, state ``S_t`` in R^{K x V}, scalar decay ``a_t = exp(g_t)`` and ``beta_t``:

    S_t = a_t (I - beta_t k_t k_t^T) S_{t-1} + beta_t k_t v_t^T,        o_t = S_t^T (scale * q_t)

Chunked form (WY / UT representation, as in the paper and fla's kernels). In a chunk of ``C`` tokens
with state ``S`` at its start, ``b = cumsum(g)`` inside the chunk, ``D_ij = exp(b_i - b_j)`` (j <= i):

    A = strict_lower(diag(beta) K K^T * D),   T = (I + A)^{-1}
    U = T diag(beta) V,   W = T diag(beta * exp(b)) K          (delta-rule "new values" and their keys)
    V_new = U - W S
    O = diag(exp(b)) Q S + P V_new,   P = (Q K^T) * D
    S' = exp(b_C) S + K_d^T V_new,    K_d = diag(exp(b_C - b)) K

The forward never forms ``W``: ``V_new = U - W S = T (V_b - K_bg S)`` with ``V_b = diag(beta) V`` and
``K_bg = diag(beta * exp(b)) K``, one C x K product fewer per chunk. The scan over chunks is the only
loop. Products that do not touch the state (``K K^T``, ``Q K^T``) and the element-wise work are
batched over (chunks, batch, heads) in the chunk layout ``[N, B*H, C, D]`` (``common.to_chunks``).
Every product that touches a chunk's state, ``V_new`` or their gradients runs inside the scan, one
``[B*H]`` batch per chunk, while its operands are in cache (about 10 % faster on CPU than batching
them over all chunks afterwards, which streams the ``[N, B*H, K, V]`` states from memory again for
each product). The row scalings ``Q_g``, ``K_bg``, ``K_d`` of q and k are formed per chunk in small
reused buffers (recomputed in the backward, not saved). v, the output and the gradients of q, k and v
never take the chunk layout: they are read and written one chunk at a time through
``common.chunk_view`` (a view of fla's ``[B, T, H, D]`` layout), which saves their layout copies.

The backward is written by hand: the same scan in reverse (``dV_new = P^T dO + K_d dS'``,
``dV_b = T^T dV_new``, ``dS = exp(b_C) dS' + (diag(exp(b)) Q)^T dO - K_bg^T dV_b``), using
``V_new = T (V_b - K_bg S)`` to get ``dK_bg = -dV_b S^T`` and ``dA = -strict_lower(dV_b V_new^T)``
without extra C x C products, and the chunk-decay gradient ``<S_n, dS_{n+1}>`` from per-token terms
(no K x V dot product per chunk). It is several times faster than autograd through a Python
implementation.

Where the CPU time goes (B=4, T=1024, H=4, K=64, V=128, chunk 32, 2 cores; ``benchmarks/mixers.py``):
fwd+bwd takes about 36 ms for about 3.5 GFLOP of matmuls, which would take about 19 ms at this
machine's batched-GEMM rate with operands in cache; the rest is operands streamed from memory (states
written in the forward and read back in the backward), element-wise work and per-op overhead. Tried
without gain (measured in one process, interleaved): stacking operands so that products sharing a
factor run as one GEMM with 2C rows (the GEMMs get ~10 % faster, the strided views cost as much
afterwards), per-chunk views made once with ``unbind``, chunk 16 or 64.

On CUDA tensors the public functions call fla's Triton kernels (``fla.ops.gated_delta_rule``) with
the same arguments (:func:`~hybridlab.models.ops.dispatch.fla_dispatch`); on CPU tensors they run the
PyTorch code here. Triton is never called on CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridlab.models.ops.common import (
    _addmm_,
    _bmm,
    check_inputs,
    compute_dtype,
    expand_gva,
    chunk_view,
    from_chunks,
    l2norm,
    pad_time,
    pairwise_decay,
    resolve_scale,
    to_chunks,
    unit_lower_inverse,
)
from hybridlab.models.ops.common import fla_op  # noqa: F401  (fla_dispatch loads this module's kernels through it)
from hybridlab.models.ops.dispatch import fla_dispatch

FLA_GDN_CHUNK_SIZES = (16, 32, 64)


def naive_recurrent_gdn(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Ground truth: the published recurrence token by token, with the explicit K x K transition."""
    check_inputs("naive_recurrent_gdn", q, k, v, g, beta, initial_state, per_channel_g=False)
    q, k = expand_gva(q, k, v)
    B, T, H, K = q.shape
    dtype = compute_dtype(q)
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * resolve_scale(scale, K)
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    eye = torch.eye(K, dtype=dtype, device=q.device)
    outs = []
    for t in range(T):
        k_t, b_t = k[:, t], beta[:, t, :, None, None]
        transition = g[:, t, :, None, None].exp() * (eye - b_t * k_t[..., :, None] * k_t[..., None, :])
        S = transition @ S + b_t * k_t[..., :, None] * v[:, t, :, None, :]
        outs.append((S * q[:, t, :, :, None]).sum(-2))
    o = torch.stack(outs, dim=1).to(v.dtype)
    return o, (S if output_final_state else None)


def _gdn_forward(q, k, v, g, beta, scale, h0, C):
    """Chunked forward; returns the output ``[B, T, H, V]``, the final state and the saved tensors.

    Inputs are in fla's layout with ``T`` a multiple of ``C``. q, k, g and beta are moved to the chunk
    layout for the batched products; v and the output stay in ``[B, T, H, V]`` and are read and
    written one chunk at a time through :func:`chunk_view` into small reused buffers that stay in cache.
    ``q`` stays unscaled: ``scale`` is folded into the GEMM that forms ``P`` and into ``Q_g``'s gate.
    ``KD`` is kept strictly lower (zero diagonal), which is all ``A`` needs and lets the backward form
    ``dA * KD`` without masking.
    """
    B, T, H, V = v.shape
    q, k, g, beta = (to_chunks(x, C, x.dtype) for x in (q, k, g, beta))
    N, Z, _, K = k.shape
    b = g.cumsum(-1)
    D = pairwise_decay(b)
    gam = b.exp()
    Gam = gam[..., -1].contiguous()  # [N, Z] decay of a whole chunk
    delta = (b[..., -1:] - b).exp()
    KD = (k @ k.mT).mul_(D)
    KD.diagonal(dim1=-2, dim2=-1).zero_()
    Tinv = unit_lower_inverse(KD * beta[..., :, None])  # strict_lower(A) in, (I + A)^{-1} out
    P = _bmm(q, k.mT, scale).mul_(D)
    # Per-token row factors of Q_g = diag(scale exp(b)) Q, K_bg = diag(beta exp(b)) K, K_d = diag(delta) K:
    # the scaled rows are formed one chunk at a time in the scans (small reused buffers that stay in cache)
    fq, fkb, fd = (scale * gam)[..., None], (beta * gam)[..., None], delta[..., None]
    Qg, Kbg, Kd = (k.new_empty(Z, C, K) for _ in range(3))
    XO = v.new_empty(Z, C, V)  # per chunk: V_b, then X = V_b - K_bg S, then the output
    XO4 = XO.view(B, H, C, V)
    Vn = v.new_empty(N, Z, C, V)
    S_all = k.new_empty(N + 1, Z, K, V)  # S_all[n] = state entering chunk n
    if h0 is None:
        S_all[0].zero_()
    else:
        S_all[0].copy_(h0)
    o = v.new_empty(B, T, H, V)
    beta4 = beta.view(N, B, H, C, 1)
    for n, (v_n, o_n) in enumerate(zip(chunk_view(v, C).unbind(0), chunk_view(o, C).unbind(0))):
        S = S_all[n]
        torch.mul(k[n], fkb[n], out=Kbg)
        torch.mul(k[n], fd[n], out=Kd)
        torch.mul(q[n], fq[n], out=Qg)
        torch.mul(v_n, beta4[n], out=XO4)  # V_b = diag(beta) V, gathered from v's own layout
        X = XO.baddbmm_(Kbg, S, alpha=-1.0)  # V_b - K_bg S
        torch.bmm(Tinv[n], X, out=Vn[n])  # V_new = U - W S = T X
        torch.mul(S, Gam[n, :, None, None], out=S_all[n + 1]).baddbmm_(Kd.mT, Vn[n])
        torch.bmm(P[n], Vn[n], out=XO).baddbmm_(Qg, S)  # the output takes X's place
        o_n.copy_(XO4)
    saved = (q, k, v, beta, D, gam, Gam, delta, KD, Tinv, S_all, Vn, P)  # S_all[N]: final state
    return o, S_all[N], saved


def _gdn_backward(dO, dhT, saved, scale: float, need_dh0: bool):
    """Hand-written backward of :func:`_gdn_forward`: gradients in fla's layout, like its inputs."""
    q, k, v, beta, D, gam, Gam, delta, KD, Tinv, S_all, Vn, P = saved
    S = S_all[:-1]  # S[n]: state entering chunk n
    N, Z, C, K = k.shape
    B, T, H, V = v.shape
    P_T, Tinv_T, Vn_T, S_T = P.mT, Tinv.mT, Vn.mT, S.mT
    fq, fkb, fd = (scale * gam)[..., None], (beta * gam)[..., None], delta[..., None]
    Qg, Kbg, Kd = (k.new_empty(Z, C, K) for _ in range(3))  # per-chunk rows, as in the forward
    # Gradient w.r.t. the state leaving the current chunk: everything that reads it runs inside the scan,
    # after which it is turned in place into the gradient w.r.t. the state entering the chunk (one
    # [Z, K, V] buffer instead of one per chunk).
    dS_next = k.new_empty(Z, K, V).copy_(dhT)  # autograd passes zeros when the final state is unused
    # Per-chunk scratch that stays in cache: dO gathered from its own layout (any strides, e.g. the
    # expanded ones of a .sum() loss), and the gradients w.r.t. V_new and V_b.
    dOn, dVn, dVb = (v.new_empty(Z, C, V) for _ in range(3))
    dO_chunks, v_chunks = chunk_view(dO, C), chunk_view(v, C)
    dv = v.new_empty(B, T, H, V)
    dv_chunks = chunk_view(dv, C)
    dKd, dQg, nKbg = torch.empty_like(k), torch.empty_like(k), torch.empty_like(k)
    dP, nA = torch.empty_like(P), torch.empty_like(P)
    dbeta_v = beta.new_empty(N, Z, C)
    # V_new = T X with X = V_b - K_bg S and T = (I + A)^{-1}, so
    #   dV_b = dX = T^T dV_new,  dK_bg = -dV_b S^T,  dS gets -K_bg^T dV_b,
    #   dA = -T^T (dV_new X^T) T^T = -strict_lower(dV_b V_new^T).
    # The minus signs are folded into per-token factors below (nKbg = -dK_bg, nA = -dA).
    for n in range(N - 1, -1, -1):
        dOn.view(B, H, C, V).copy_(dO_chunks[n])
        torch.mul(k[n], fkb[n], out=Kbg)
        torch.mul(k[n], fd[n], out=Kd)
        torch.mul(q[n], fq[n], out=Qg)
        torch.bmm(P_T[n], dOn, out=dVn).baddbmm_(Kd, dS_next)
        torch.bmm(Tinv_T[n], dVn, out=dVb)
        torch.bmm(Vn[n], dS_next.mT, out=dKd[n])
        dS = dS_next.mul_(Gam[n, :, None, None])  # dS' is read for the last time above
        dS.baddbmm_(Qg.mT, dOn).baddbmm_(Kbg.mT, dVb, alpha=-1.0)  # W^T dV_new = K_bg^T dV_b
        torch.bmm(dOn, S_T[n], out=dQg[n])
        torch.bmm(dOn, Vn_T[n], out=dP[n])
        torch.bmm(dVb, S_T[n], out=nKbg[n])
        torch.bmm(dVb, Vn_T[n], out=nA[n])  # only its strict lower triangle is read
        # while dV_b is in cache: dbeta gets v . dV_b, and dv = diag(beta) dV_b goes to its own layout
        dVb4 = dVb.view(B, H, C, V)
        torch.linalg.vecdot(dVb4, v_chunks[n], out=dbeta_v[n].view(B, H, C))
        torch.mul(dVb4, beta[n].view(B, H, C, 1), out=dv_chunks[n])
    # A = diag(beta) KD and P = scale (Q K^T) * D; with D_ij = exp(b_i - b_j) the log-decay gradient is
    # db_i = sum_j E_ij - sum_j E_ji, E = dA * A + dP * P. KD is strictly lower, so E is too.
    E = nA * KD  # -dA * KD
    dbeta = E.sum(-1).neg_()
    E.mul_(-beta[..., :, None]).addcmul_(dP, P)
    db = E.sum(-1) - E.sum(-2)
    dKK = nA.tril_(-1).mul_(D).mul_(-beta[..., :, None])  # the gradient of K K^T through A
    dQK = dP.mul_(D)  # the gradient of Q K^T through P, without the scale
    # dq and dk: the last term of each is written straight into fla's layout
    def as5(x):  # [N, Z, C, D] -> [N, B, H, C, D], the shape of chunk_view
        return x.view(N, B, H, C, x.shape[-1])

    dq = q.new_empty(B, T, H, K)
    torch.addcmul(as5(_bmm(dQK, k, scale)), as5(dQg), as5(fq), out=chunk_view(dq, C))
    dk_c = torch.add(dKK, dKK.mT, out=E) @ k  # E is dead
    _addmm_(dk_c, dQK.mT, q, alpha=scale)
    dk_c.addcmul_(nKbg, fkb, value=-1.0)
    dk = k.new_empty(B, T, H, K)
    torch.addcmul(as5(dk_c), as5(dKd), as5(fd), out=chunk_view(dk, C))
    # Per-token dot products, taken in place on buffers that are dead by now: a fresh temporary of
    # their size would cost a first touch of new memory.
    dbeta += dbeta_v
    t_qg = dQg.mul_(q).sum(-1).mul_(scale * gam)  # Q_g,i . dQ_g,i
    db += t_qg
    t_kbg = nKbg.mul_(k).sum(-1).mul_(-gam)  # gam_i k_i . dK_bg_i
    dbeta += t_kbg
    t_kbg.mul_(beta)  # -K_bg,i . dK_bg,i
    db += t_kbg
    s_kd = dKd.mul_(k).sum(-1).mul_(delta)
    db -= s_kd
    # The last token of a chunk also carries the chunk decay: S_{n+1} = Gam_n S_n + K_d^T V_new, so
    # db_last += <K_d, dK_d> + Gam_n <S_n, dS_{n+1}>. The second term needs no K x V dot product per
    # chunk: from the state recurrences forward and backward,
    #   <S_{n+1}, dS_{n+1}> = Gam_n <S_n, dS_{n+1}> + <K_d, dK_d>                     (forward)
    #   <S_n, dS_n>         = Gam_n <S_n, dS_{n+1}> + <Q_g, dQ_g> - <K_bg, dK_bg>       (backward)
    # so with u_n = <Q_g, dQ_g> - <K_bg, dK_bg> and w_n = <K_d, dK_d> (sums of per-token terms above),
    #   <K_d, dK_d> + Gam_n <S_n, dS_{n+1}> = <S_N, dS_N> + sum_{m > n} (u_m - w_m).
    w = s_kd.sum(-1)
    r = (t_qg + t_kbg).sum(-1).sub_(w)  # u_n - w_n, [N, Z]
    tail = r.flip(0).cumsum(0).flip(0).sub_(r)  # sum over m > n
    tail += torch.linalg.vecdot(S_all[N].flatten(-2), dhT.reshape(Z, -1).to(S_all.dtype))
    db[..., -1] += tail
    dg = db.flip(-1).cumsum(-1).flip(-1)
    dg, dbeta = (from_chunks(x[..., None], B, H, T)[..., 0] for x in (dg, dbeta))
    return dq, dk, dv, dg, dbeta, (dS_next if need_dh0 else None)


class _ChunkGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, h0, C):
        o, hT, saved = _gdn_forward(q, k, v, g, beta, scale, h0, C)
        ctx.save_for_backward(*saved)
        ctx.scale = scale
        ctx.has_h0 = h0 is not None
        return o, hT

    @staticmethod
    def backward(ctx, dO, dhT):
        grads = _gdn_backward(dO, dhT, ctx.saved_tensors, ctx.scale, ctx.has_h0)
        dq, dk, dv, dg, dbeta, dh0 = grads
        return dq, dk, dv, dg, dbeta, None, dh0, None


def _chunk_gdn_cpu(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, C):
    q, k = expand_gva(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    dtype, out_dtype = compute_dtype(q), v.dtype
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    # right-pad to whole chunks with neutral tokens (see common.to_chunks); autograd drops their gradients
    q, k, v, g, beta = (pad_time(x, C) for x in (q, k, v, g, beta))
    scale = resolve_scale(scale, K)
    h0 = None if initial_state is None else initial_state.to(dtype).reshape(B * H, K, V)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (q, k, v, g, beta, h0)):
        o, hT = _ChunkGDN.apply(q, k, v, g, beta, scale, h0, C)
    else:
        o, hT, _ = _gdn_forward(q, k, v, g, beta, scale, h0, C)
    if o.shape[1] != T:  # only when padded: a no-op slice would still make autograd copy dO
        o = o[:, :T]
    o = o.to(out_dtype)
    return o, (hT.reshape(B, H, K, V) if output_final_state else None)


@fla_dispatch("fla.ops.gated_delta_rule", "chunk_gated_delta_rule", per_channel_g=False,
              fla_chunk_sizes=FLA_GDN_CHUNK_SIZES)
def chunk_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla-compatible chunked Gated DeltaNet: ``o [B, T, H, V]``, final state ``[B, H, K, V]`` or None.

    ``g`` is the per-head log-decay ``[B, T, H]``, ``beta`` ``[B, T, H]``. As in fla, v may have
    ``HV`` heads (a multiple of H; grouped value attention): g, beta, o and the state then have HV.
    The result does not depend on ``chunk_size`` (a tiling parameter); on CUDA it is passed to fla
    when fla accepts it (16/32/64), otherwise fla's default tile is used.
    ``cu_seqlens``: fla's variable-length form (one row of several sequences; ``common.varlen_cpu`` on CPU).
    """
    return _chunk_gdn_cpu(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, chunk_size
    )


@fla_dispatch("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule", per_channel_g=False)
def fused_recurrent_gated_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    use_qk_l2norm_in_kernel: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """Token-by-token Gated DeltaNet for decoding (any T); same signature and result as the chunked op.

    CPU: a rank-1 state update per token, ``S <- a S;  S <- S + k (beta (v - S^T k))^T``, O(K V) per
    token and head. CUDA: fla's ``fused_recurrent_gated_delta_rule``. ``chunk_size`` is accepted for
    signature compatibility and unused.
    """
    q, k = expand_gva(q, k, v)
    B, T, H, K = q.shape
    dtype = compute_dtype(q)
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * resolve_scale(scale, K)
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    decay = g.exp()
    outs = []
    for t in range(T):
        k_t = k[:, t]
        S = S * decay[:, t, :, None, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S))
        S = S + k_t[..., :, None] * u[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    o = torch.stack(outs, dim=1).to(v.dtype)
    return o, (S if output_final_state else None)

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

Everything except the state scan is batched over (chunks, batch, heads); the scan over chunks does
two K x V products per chunk (``V_new = U - W S``, ``S' = exp(b_C) S + K_d^T V_new``). The backward
is written by hand: the same scan in reverse (``dV_new = P^T dO + K_d dS'``,
``dS = exp(b_C) dS' + (diag(exp(b)) Q)^T dO - W^T dV_new``) and batched products for the rest, using
``V_new = U - W S`` to get ``dK_bg = -dV_b S^T`` and ``dA = -strict_lower(dV_b V_new^T)`` without
extra C x C products. It is several times faster than autograd through a Python implementation.

On CUDA tensors the public functions call fla's Triton kernels (``fla.ops.gated_delta_rule``) with
the same arguments; on CPU tensors they run the PyTorch code here. Triton is never called on CPU.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridlab.models.ops.common import (
    check_inputs,
    compute_dtype,
    expand_gva,
    fla_op,
    from_chunks,
    l2norm,
    pairwise_decay,
    resolve_scale,
    to_chunks,
    unit_lower_inverse,
)

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


def _addmm_(out: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """``out += a @ b`` over leading ``[N, Z]`` dims without allocating the product."""
    out.view(-1, *out.shape[-2:]).baddbmm_(a.reshape(-1, *a.shape[-2:]), b.reshape(-1, *b.shape[-2:]))
    return out


def _gdn_forward(q, k, v, g, beta, scale, h0):
    """Chunked forward on ``[N, Z, C, *]`` tensors; returns the output, final state and saved tensors.

    Temporaries that die early are reused as ``out=`` buffers of later products: on CPU a fresh
    multi-MB allocation is page-faulted on first touch, which costs about as much as the product.
    """
    N, Z, C, K = k.shape
    V = v.shape[-1]
    b = g.cumsum(-1)
    D = pairwise_decay(b)
    gam = b.exp()
    Gam = gam[..., -1].contiguous()  # [N, Z] decay of a whole chunk
    delta = (b[..., -1:] - b).exp()
    q = q * scale
    KD = (k @ k.mT).mul_(D)
    L = KD * beta[..., :, None]
    L.diagonal(dim1=-2, dim2=-1).fill_(1.0)  # I + strict_lower(A); the upper triangle is never read
    Tinv = unit_lower_inverse(L)
    k_buf = k * (beta * gam)[..., None]  # K_bg
    W = Tinv @ k_buf
    v_buf = v * beta[..., None]  # V_b
    Vn = Tinv @ v_buf  # U = T V_b; the scan turns it into V_new = U - W S in place
    Kd = k * delta[..., None]
    Kd_T = Kd.mT
    S_all = k.new_empty(N + 1, Z, K, V)  # S_all[n] = state entering chunk n
    if h0 is None:
        S_all[0].zero_()
    else:
        S_all[0].copy_(h0)
    for n in range(N):
        Vn[n].baddbmm_(W[n], S_all[n], alpha=-1.0)
        torch.mul(S_all[n], Gam[n, :, None, None], out=S_all[n + 1])
        S_all[n + 1].baddbmm_(Kd_T[n], Vn[n])
    S = S_all[:N]
    P = torch.matmul(q, k.mT, out=L).mul_(D)  # L is dead once T is known
    Qg = torch.mul(q, gam[..., None], out=k_buf)
    O = _addmm_(torch.matmul(P, Vn, out=v_buf), Qg, S)
    saved = (q, k, v, beta, D, gam, Gam, delta, KD, Tinv, W, Kd, S, Vn, P, Qg)
    return O, S_all[N], saved


def _gdn_backward(dO, dhT, saved, scale: float, need_dh0: bool):
    """Hand-written backward of :func:`_gdn_forward` (same chunk layout)."""
    q, k, v, beta, D, gam, Gam, delta, KD, Tinv, W, Kd, S, Vn, P, Qg = saved
    N, Z, C, K = k.shape
    V = v.shape[-1]
    W_T = W.mT
    dVn = P.mT @ dO  # intra-chunk part of dV_new; the scan adds the state part in place
    Yq = Qg.mT @ dO  # read-out part of dS
    dS_all = k.new_empty(N + 1, Z, K, V)  # dS_all[n] = gradient w.r.t. the state entering chunk n
    if dhT is None:
        dS_all[N].zero_()
    else:
        dS_all[N].copy_(dhT)
    for n in range(N - 1, -1, -1):
        dVn[n].baddbmm_(Kd[n], dS_all[n + 1])
        torch.addcmul(Yq[n], dS_all[n + 1], Gam[n, :, None, None], out=dS_all[n])
        dS_all[n].baddbmm_(W_T[n], dVn[n], alpha=-1.0)
    dS_next = dS_all[1:]
    S_T = S.mT
    dQg = dO @ S_T
    dP = dO @ Vn.mT
    dKd = Vn @ dS_next.mT
    dGam = (S * dS_next).sum((-2, -1))
    # U = T V_b and W = T K_bg with T = (I + A)^{-1}, and dW = -dV_new S^T, so
    #   dV_b = T^T dV_new,  dK_bg = T^T dW = -dV_b S^T,
    #   dA = -strict_lower(dV_b U^T + dK_bg W^T) = -strict_lower(dV_b V_new^T).
    dVb = Tinv.mT @ dVn
    dKbg = (dVb @ S_T).neg_()
    dA = (dVb @ Vn.mT).neg_().tril_(-1)
    # A = beta_i (K K^T * D) and P = (Q K^T) * D; with D_ij = exp(b_i - b_j) the log-decay gradient is
    # db_i = sum_j E_ij - sum_j E_ji, E = dA * A + dP * P.
    E = dA * KD
    dbeta = E.sum(-1)
    E.mul_(beta[..., :, None]).addcmul_(dP, P)
    db = E.sum(-1) - E.sum(-2)
    dKK = dA.mul_(D).mul_(beta[..., :, None])
    dQK = dP.mul_(D)
    dq = (dQK @ k).addcmul_(dQg, gam[..., None])
    dk = (dKK + dKK.mT) @ k
    _addmm_(dk, dQK.mT, q)
    dk.addcmul_(dKbg, (beta * gam)[..., None]).addcmul_(dKd, delta[..., None])
    db += gam * torch.linalg.vecdot(q, dQg)
    t_kbg = torch.linalg.vecdot(k, dKbg)
    dbeta += gam * t_kbg
    db += beta * gam * t_kbg
    dbeta += torch.linalg.vecdot(v, dVb)
    dv = dVb.mul_(beta[..., None])
    s_kd = delta * torch.linalg.vecdot(k, dKd)
    db -= s_kd
    db[..., -1] += s_kd.sum(-1) + Gam * dGam
    dg = db.flip(-1).cumsum(-1).flip(-1)
    dq *= scale
    return dq, dk, dv, dg, dbeta, (dS_all[0] if need_dh0 else None)


class _ChunkGDN(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, g, beta, scale, h0):
        O, hT, saved = _gdn_forward(q, k, v, g, beta, scale, h0)
        ctx.save_for_backward(*saved)
        ctx.scale = scale
        ctx.has_h0 = h0 is not None
        return O, hT

    @staticmethod
    def backward(ctx, dO, dhT):
        grads = _gdn_backward(dO.contiguous(), dhT, ctx.saved_tensors, ctx.scale, ctx.has_h0)
        dq, dk, dv, dg, dbeta, dh0 = grads
        return dq, dk, dv, dg, dbeta, None, dh0


def _chunk_gdn_cpu(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, C):
    q, k = expand_gva(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    dtype = compute_dtype(q)
    q, k = q.to(dtype), k.to(dtype)
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    chunks = [to_chunks(x, C, dtype) for x in (q, k, v, g, beta)]
    scale = resolve_scale(scale, K)
    h0 = None if initial_state is None else initial_state.to(dtype).reshape(B * H, K, V)
    if torch.is_grad_enabled() and any(x is not None and x.requires_grad for x in (*chunks, h0)):
        O, hT = _ChunkGDN.apply(*chunks, scale, h0)
    else:
        O, hT, _ = _gdn_forward(*chunks, scale, h0)
    o = from_chunks(O, B, H, T).to(v.dtype)
    return o, (hT.reshape(B, H, K, V) if output_final_state else None)


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
) -> tuple[Tensor, Tensor | None]:
    """fla-compatible chunked Gated DeltaNet: ``o [B, T, H, V]``, final state ``[B, H, K, V]`` or None.

    ``g`` is the per-head log-decay ``[B, T, H]``, ``beta`` ``[B, T, H]``. As in fla, v may have
    ``HV`` heads (a multiple of H; grouped value attention): g, beta, o and the state then have HV.
    The result does not depend on ``chunk_size`` (a tiling parameter); on CUDA it is passed to fla
    when fla accepts it (16/32/64), otherwise fla's default tile is used.
    """
    check_inputs("chunk_gated_delta_rule", q, k, v, g, beta, initial_state, False, chunk_size)
    if q.is_cuda:
        fla_chunk = fla_op("fla.ops.gated_delta_rule", "chunk_gated_delta_rule")
        extra = {"chunk_size": chunk_size} if chunk_size in FLA_GDN_CHUNK_SIZES else {}
        return fla_chunk(
            q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **extra,
        )
    return _chunk_gdn_cpu(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, chunk_size
    )


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
    check_inputs("fused_recurrent_gated_delta_rule", q, k, v, g, beta, initial_state, False, chunk_size)
    if q.is_cuda:
        fla_rec = fla_op("fla.ops.gated_delta_rule", "fused_recurrent_gated_delta_rule")
        # keywords matter: fla's positional order is (q, k, v, g, gk, gv, beta, ...)
        return fla_rec(
            q=q, k=k, v=v, g=g, beta=beta, scale=scale, initial_state=initial_state,
            output_final_state=output_final_state, use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel,
        )
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

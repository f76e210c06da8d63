"""Kimi Delta Attention (KDA, Kimi Linear 2025): reference, chunked CPU op, dispatch.

Recurrence per head, state ``S_t`` in R^{K x V}, per-channel decay ``a_t = exp(g_t)`` in R^K:

    S_t = (I - beta_t k_t k_t^T) Diag(a_t) S_{t-1} + beta_t k_t v_t^T,      o_t = S_t^T (scale * q_t)

Chunked form: with ``b = cumsum(g)`` per channel inside a chunk and state ``S`` at its start, the
per-channel analogue of Gated DeltaNet's WY representation (derived by unrolling the recurrence;
it matches fla's ``naive_chunk_kda``):

    A_ij = beta_i sum_d k_id k_jd exp(b_id - b_jd)   (i > j),     T = (I + A)^{-1}
    P_ij = sum_d q_id k_jd exp(b_id - b_jd)           (i >= j)
    W = T diag(beta) (exp(b) * K),   U = T diag(beta) V,   V_new = U - W S
    O = (exp(b) * Q) S + P V_new,    S' = Diag(exp(b_C)) S + (exp(b_C - b) * K)^T V_new

``A`` and ``P`` come from :func:`~hybridlab.models.ops.per_channel.per_channel_scores`' building blocks
(secondary chunking, only decays ``<= 1`` are exponentiated). The CPU op is
:func:`~hybridlab.models.ops.per_channel.chunk_per_channel` (shared with GLA): the scores, ``T`` and the
decay-scaled rows of all chunks at once, then a scan over chunks that forms ``V_new = T (diag(beta) V -
K_bg S)`` without ``W``; a hand-written backward with the same split (the scan in reverse).

CUDA tensors go to fla's ``chunk_kda`` / ``fused_recurrent_kda`` (:func:`~hybridlab.models.ops.dispatch.fla_dispatch`);
CPU tensors never touch Triton.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridlab.models.ops.common import (
    check_inputs,
    compute_dtype,
    expand_gva,
    l2norm,
    resolve_scale,
)
from hybridlab.models.ops.common import fla_op  # noqa: F401  (fla_dispatch loads this module's kernels through it)
from hybridlab.models.ops.dispatch import fla_dispatch
from hybridlab.models.ops.per_channel import chunk_per_channel

FLA_KDA_CHUNK_SIZES = (32, 64)


def _prepare(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel):
    q, k = expand_gva(q, k, v)
    dtype = compute_dtype(q)
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    q = q * resolve_scale(scale, q.shape[-1])
    B, _, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    return q, k, v, g, beta, S


def naive_recurrent_kda(
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
    check_inputs("naive_recurrent_kda", q, k, v, g, beta, initial_state, per_channel_g=True)
    q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel)
    K = q.shape[-1]
    eye = torch.eye(K, dtype=q.dtype, device=q.device)
    outs = []
    for t in range(q.shape[1]):
        k_t, b_t = k[:, t], beta[:, t, :, None, None]
        householder = eye - b_t * k_t[..., :, None] * k_t[..., None, :]
        S = householder @ (g[:, t].exp()[..., :, None] * S) + b_t * k_t[..., :, None] * v[:, t, :, None, :]
        outs.append((S * q[:, t, :, :, None]).sum(-2))
    o = torch.stack(outs, dim=1).to(v.dtype)
    return o, (S if output_final_state else None)


def _chunk_kda_cpu(q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, C):
    q, k = expand_gva(q, k, v)
    B, T, H, K = q.shape
    V = v.shape[-1]
    dtype, out_dtype = compute_dtype(q), v.dtype
    q, k, v, g, beta = (x.to(dtype) for x in (q, k, v, g, beta))
    if use_qk_l2norm_in_kernel:
        q, k = l2norm(q), l2norm(k)
    h0 = None if initial_state is None else initial_state.to(dtype).reshape(B * H, K, V)
    o, S = chunk_per_channel(q, k, v, g, beta, h0, resolve_scale(scale, K), C)
    return o.to(out_dtype), (S.reshape(B, H, K, V) if output_final_state else None)


@fla_dispatch("fla.ops.kda", "chunk_kda", per_channel_g=True, fla_chunk_sizes=FLA_KDA_CHUNK_SIZES)
def chunk_kda(
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
    """fla-compatible chunked KDA: ``o [B, T, H, V]``, final state ``[B, H, K, V]`` or None.

    ``g`` is the per-channel log-decay ``[B, T, H, K]``, ``beta`` ``[B, T, H]``; with grouped value
    heads (v has HV = multiple of H heads, as in fla) g, beta, o and the state have HV. The result
    does not depend on ``chunk_size``; on CUDA it is passed to fla when fla accepts it (32/64).
    ``cu_seqlens``: fla's variable-length form (one row of several sequences; ``common.varlen_cpu`` on CPU).
    """
    return _chunk_kda_cpu(
        q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, chunk_size
    )


@fla_dispatch("fla.ops.kda", "fused_recurrent_kda", per_channel_g=True)
def fused_recurrent_kda(
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
    """Token-by-token KDA for decoding (any T); same signature and result as :func:`chunk_kda`.

    CPU: ``S <- Diag(a) S;  S <- S + k (beta (v - S^T k))^T`` per token (O(K V)). CUDA: fla's
    ``fused_recurrent_kda``. ``chunk_size`` is accepted for signature compatibility and unused.
    """
    q, k, v, g, beta, S = _prepare(q, k, v, g, beta, scale, initial_state, use_qk_l2norm_in_kernel)
    decay = g.exp()
    outs = []
    for t in range(q.shape[1]):
        k_t = k[:, t]
        S = S * decay[:, t, :, :, None]
        u = beta[:, t, :, None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", k_t, S))
        S = S + k_t[..., :, None] * u[..., None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    o = torch.stack(outs, dim=1).to(v.dtype)
    return o, (S if output_final_state else None)

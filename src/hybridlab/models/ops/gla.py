"""Gated Linear Attention (Yang et al. 2023): naive reference, chunked CPU op, dispatch to fla on CUDA.

Recurrence per head, state ``S_t`` in R^{K x V}, per-channel decay ``a_t = exp(g_t)`` in R^K:

    S_t = Diag(a_t) S_{t-1} + k_t v_t^T,        o_t = S_t^T (scale * q_t)

Chunked form with ``b = cumsum(g)`` per channel inside a chunk and state ``S`` at its start:

    P_ij = sum_d q_id k_jd exp(b_id - b_jd)   (i >= j)
    O = (exp(b) * Q) S + P V,     S' = Diag(exp(b_C)) S + (exp(b_C - b) * K)^T V

``P`` comes from :func:`~hybridlab.models.ops.per_channel.per_channel_scores`' building blocks
(secondary chunking, only decays ``<= 1`` are exponentiated). The CPU op is
:func:`~hybridlab.models.ops.per_channel.chunk_per_channel` (shared with KDA): the scores of all chunks at
once, a scan over chunks for the state only, and a hand-written backward.

CUDA tensors go to fla's ``chunk_gla`` / ``fused_recurrent_gla`` (:func:`~hybridlab.models.ops.dispatch.fla_dispatch`);
CPU tensors never touch Triton.
"""

from __future__ import annotations

import torch
from torch import Tensor

from hybridlab.models.ops.common import (
    check_inputs,
    compute_dtype,
    resolve_scale,
)
from hybridlab.models.ops.common import fla_op  # noqa: F401  (fla_dispatch loads this module's kernels through it)
from hybridlab.models.ops.dispatch import fla_dispatch
from hybridlab.models.ops.per_channel import chunk_per_channel


def _prepare(q, k, v, g, scale, initial_state):
    dtype = compute_dtype(q)
    q, k, v, g = (x.to(dtype) for x in (q, k, v, g))
    q = q * resolve_scale(scale, q.shape[-1])
    B, _, H, K = q.shape
    S = q.new_zeros(B, H, K, v.shape[-1]) if initial_state is None else initial_state.to(dtype)
    return q, k, v, g, S


def naive_recurrent_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
) -> tuple[Tensor, Tensor | None]:
    """Ground truth: the published recurrence token by token."""
    check_inputs("naive_recurrent_gla", q, k, v, g, None, initial_state, True, allow_gva=False)
    q, k, v, g, S = _prepare(q, k, v, g, scale, initial_state)
    outs = []
    for t in range(q.shape[1]):
        S = torch.diag_embed(g[:, t].exp()) @ S + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append((S * q[:, t, :, :, None]).sum(-2))
    o = torch.stack(outs, dim=1).to(v.dtype)
    return o, (S if output_final_state else None)


def _chunk_gla_cpu(q, k, v, g, scale, initial_state, output_final_state, C):
    B, T, H, K = q.shape
    V = v.shape[-1]
    dtype, out_dtype = compute_dtype(q), v.dtype
    q, k, v, g = (x.to(dtype) for x in (q, k, v, g))
    h0 = None if initial_state is None else initial_state.to(dtype).reshape(B * H, K, V)
    o, S = chunk_per_channel(q, k, v, g, None, h0, resolve_scale(scale, K), C)
    return o.to(out_dtype), (S.reshape(B, H, K, V) if output_final_state else None)


@fla_dispatch("fla.ops.gla", "chunk_gla", per_channel_g=True, allow_gva=False)
def chunk_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
    cu_seqlens: Tensor | None = None,
) -> tuple[Tensor, Tensor | None]:
    """fla-compatible chunked GLA: ``o [B, T, H, V]``, final state ``[B, H, K, V]`` or None.

    ``g`` is the per-channel log-decay ``[B, T, H, K]``. The result does not depend on ``chunk_size``;
    fla's ``chunk_gla`` has a fixed tile, so on CUDA ``chunk_size`` is not forwarded.
    ``cu_seqlens``: fla's variable-length form (one row of several sequences; ``common.varlen_cpu`` on CPU).
    """
    return _chunk_gla_cpu(q, k, v, g, scale, initial_state, output_final_state, chunk_size)


@fla_dispatch("fla.ops.gla", "fused_recurrent_gla", per_channel_g=True, allow_gva=False, fla_names={"g": "gk"})
def fused_recurrent_gla(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    scale: float | None = None,
    initial_state: Tensor | None = None,
    output_final_state: bool = False,
    chunk_size: int = 64,
) -> tuple[Tensor, Tensor | None]:
    """Token-by-token GLA for decoding (any T); same signature and result as :func:`chunk_gla`.

    CPU: ``S <- Diag(a) S + k v^T`` per token. CUDA: fla's ``fused_recurrent_gla`` (whose decay
    argument is called ``gk``). ``chunk_size`` is accepted for signature compatibility and unused.
    """
    q, k, v, g, S = _prepare(q, k, v, g, scale, initial_state)
    decay = g.exp()
    outs = []
    for t in range(q.shape[1]):
        S = S * decay[:, t, :, :, None] + k[:, t, :, :, None] * v[:, t, :, None, :]
        outs.append(torch.einsum("bhk,bhkv->bhv", q[:, t], S))
    o = torch.stack(outs, dim=1).to(v.dtype)
    return o, (S if output_final_state else None)

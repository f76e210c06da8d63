"""Recurrent mixer ops on CPU: naive references vs fla's own references, chunked/recurrent ops vs naive."""

from __future__ import annotations

import subprocess
import sys
import types
import warnings

import pytest
import torch
import torch.nn.functional as F

from hybridlab.errors import HybridlabError
from hybridlab.models import ops
from hybridlab.models.ops import common, dispatch, gdn, gla, kda, per_channel

with warnings.catch_warnings():  # fla warns that Triton cannot run on this CPU-only machine
    warnings.simplefilter("ignore")
    from fla.ops.gated_delta_rule.naive import naive_recurrent_gated_delta_rule as fla_naive_gdn
    from fla.ops.gla.naive import naive_recurrent_gla as fla_naive_gla
    from fla.ops.kda.naive import naive_chunk_kda as fla_naive_chunk_kda
    from fla.ops.kda.naive import naive_recurrent_kda as fla_naive_kda

KINDS = ("gdn", "kda", "gla")
CHUNK = {"gdn": ops.chunk_gated_delta_rule, "kda": ops.chunk_kda, "gla": ops.chunk_gla}
RECURRENT = {
    "gdn": ops.fused_recurrent_gated_delta_rule, "kda": ops.fused_recurrent_kda, "gla": ops.fused_recurrent_gla
}
NAIVE = {"gdn": ops.naive_recurrent_gdn, "kda": ops.naive_recurrent_kda, "gla": ops.naive_recurrent_gla}


def make_inputs(kind, B=2, T=37, H=3, K=8, V=6, dtype=torch.float64, decay_scale=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, dtype=dtype, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, dtype=dtype, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, dtype=dtype, generator=gen)
    g_shape = (B, T, H) if kind == "gdn" else (B, T, H, K)
    g = F.logsigmoid(torch.randn(g_shape, dtype=dtype, generator=gen)) * decay_scale
    beta = torch.rand(B, T, H, dtype=dtype, generator=gen)
    h0 = torch.randn(B, H, K, V, dtype=dtype, generator=gen)
    return q, k, v, g, beta, h0


def call(fn, kind, q, k, v, g, beta, **kw):
    if kind == "gla":
        kw.pop("use_qk_l2norm_in_kernel", None)
        return fn(q, k, v, g, **kw)
    return fn(q, k, v, g, beta, **kw)


# --- the naive references themselves ---------------------------------------------------------------


def test_naive_gdn_single_step_by_hand():
    # T = 1, H = 1, K = 2, V = 1: S1 = a (I - b k k^T) S0 + b k v^T and o = S1^T (q / sqrt(2)).
    q = torch.tensor([1.0, 2.0]).view(1, 1, 1, 2)
    k = torch.tensor([0.6, 0.8]).view(1, 1, 1, 2)
    v = torch.tensor([3.0]).view(1, 1, 1, 1)
    g = torch.log(torch.tensor(0.5)).view(1, 1, 1)  # a = 0.5
    beta = torch.tensor(0.25).view(1, 1, 1)
    S0 = torch.tensor([[1.0], [-1.0]]).view(1, 1, 2, 1)
    # (I - 0.25 k k^T) S0 = S0 - 0.25 k (k.S0) = [1, -1] - 0.25 * (-0.2) * [0.6, 0.8] = [1.03, -0.96]
    # S1 = 0.5 * [1.03, -0.96] + 0.25 * 3 * [0.6, 0.8] = [0.965, 0.12];  o = (0.965 + 0.24) / sqrt(2)
    o, S1 = ops.naive_recurrent_gdn(q, k, v, g, beta, initial_state=S0, output_final_state=True)
    torch.testing.assert_close(S1.flatten(), torch.tensor([0.965, 0.12]))
    torch.testing.assert_close(o.flatten(), torch.tensor([1.205 / 2**0.5]))


def test_naive_gla_single_step_by_hand():
    q = torch.tensor([1.0, 0.0, 2.0, 0.0]).view(1, 1, 1, 4)
    k = torch.tensor([1.0, 1.0, 1.0, 1.0]).view(1, 1, 1, 4)
    v = torch.tensor([2.0]).view(1, 1, 1, 1)
    g = torch.log(torch.tensor([0.5, 1.0, 0.25, 1.0])).view(1, 1, 1, 4)
    S0 = torch.ones(1, 1, 4, 1)
    o, S1 = ops.naive_recurrent_gla(q, k, v, g, initial_state=S0, output_final_state=True)
    torch.testing.assert_close(S1.flatten(), torch.tensor([2.5, 3.0, 2.25, 3.0]))  # a * 1 + 1 * 2
    torch.testing.assert_close(o.flatten(), torch.tensor([(2.5 + 2 * 2.25) / 2.0]))  # scale 4^-0.5


@pytest.mark.parametrize("kind", KINDS)
def test_naive_matches_fla_reference(kind):
    q, k, v, g, beta, h0 = make_inputs(kind, dtype=torch.float32)
    ours = call(NAIVE[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    if kind == "gdn":
        ref = fla_naive_gdn(q, k, v, beta, g, initial_state=h0, output_final_state=True)
    elif kind == "kda":
        ref = fla_naive_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True)
    else:
        ref = fla_naive_gla(q, k, v, g, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(ours[0], ref[0], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ours[1], ref[1], rtol=1e-5, atol=1e-5)


def test_chunk_kda_matches_fla_naive_chunk():
    q, k, v, g, beta, h0 = make_inputs("kda", T=32, dtype=torch.float32)
    o, S = ops.chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=16)
    o_ref, S_ref = fla_naive_chunk_kda(q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=16)
    torch.testing.assert_close(o, o_ref, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(S, S_ref, rtol=1e-5, atol=1e-5)


# --- chunked and recurrent ops vs the naive reference ----------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_size", [1, 5, 16, 64])
def test_chunk_matches_naive_any_chunk_size(kind, chunk_size):
    q, k, v, g, beta, h0 = make_inputs(kind)  # T = 37: never a multiple of the chunk
    ref_o, ref_S = call(NAIVE[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, S = call(CHUNK[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True,
                chunk_size=chunk_size)
    torch.testing.assert_close(o, ref_o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, ref_S, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", KINDS)
def test_recurrent_matches_naive(kind):
    q, k, v, g, beta, h0 = make_inputs(kind)
    ref_o, ref_S = call(NAIVE[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    o, S = call(RECURRENT[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    torch.testing.assert_close(o, ref_o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(S, ref_S, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_qk_l2norm_in_kernel(kind):
    q, k, v, g, beta, h0 = make_inputs(kind)
    q, k = q * 3.0, k * 0.2
    ref = call(NAIVE[kind], kind, F.normalize(q, dim=-1, eps=0), F.normalize(k, dim=-1, eps=0), v, g, beta)[0]
    for fn in (CHUNK[kind], RECURRENT[kind], NAIVE[kind]):
        o = call(fn, kind, q, k, v, g, beta, use_qk_l2norm_in_kernel=True)[0]
        torch.testing.assert_close(o, ref, rtol=1e-5, atol=1e-5)  # eps = 1e-6 inside the norm


@pytest.mark.parametrize("kind", KINDS)
def test_outputs_without_final_state_and_custom_scale(kind):
    q, k, v, g, beta, h0 = (x.requires_grad_() for x in make_inputs(kind, T=9))
    o, S = call(CHUNK[kind], kind, q, k, v, g, beta, scale=0.3, initial_state=h0, chunk_size=4)
    ref = call(NAIVE[kind], kind, q, k, v, g, beta, scale=0.3, initial_state=h0)[0]
    assert S is None
    torch.testing.assert_close(o, ref, rtol=1e-10, atol=1e-10)
    for got, want in zip(torch.autograd.grad(o.sum(), [q, h0]), torch.autograd.grad(ref.sum(), [q, h0])):
        torch.testing.assert_close(got, want, rtol=1e-10, atol=1e-10)


@pytest.fixture(params=["folded", "element-wise"])
def diagonal_path(request, monkeypatch):
    """Both ways of the per-channel ops' diagonal blocks: folded into the GEMM (mild decays, the default
    here) or element-wise (forced by a negative span limit, as for decays stronger than FOLD_SPAN)."""
    if request.param == "element-wise":
        monkeypatch.setattr(per_channel, "FOLD_SPAN", -1.0)
    return request.param


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("chunk_size", [4, 16])
def test_chunk_gradients_match_naive_fp64(kind, chunk_size, diagonal_path):
    inputs = [x.requires_grad_() for x in make_inputs(kind, T=19)]
    q, k, v, g, beta, h0 = inputs
    wanted = [q, k, v, g, h0] + ([beta] if kind != "gla" else [])
    gen = torch.Generator().manual_seed(1)
    w_o = torch.randn(2, 19, 3, 6, generator=gen, dtype=q.dtype)
    w_S = torch.randn(2, 3, 8, 6, generator=gen, dtype=q.dtype)

    def grads(fn, **kw):
        o, S = call(fn, kind, q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
        return torch.autograd.grad((o * w_o).sum() + (S * w_S).sum(), wanted)

    for got, ref in zip(grads(CHUNK[kind], chunk_size=chunk_size), grads(NAIVE[kind])):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_chunk_gradients_match_naive_fp32(kind):
    inputs = [x.requires_grad_() for x in make_inputs(kind, T=70, dtype=torch.float32)]
    q, k, v, g, beta, h0 = inputs
    wanted = [q, k, v, g, h0] + ([beta] if kind != "gla" else [])

    def grads(fn):
        o, S = call(fn, kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
        return torch.autograd.grad(o.square().sum() + S.sum(), wanted)

    for got, ref in zip(grads(CHUNK[kind]), grads(NAIVE[kind])):
        rel = (got - ref).norm() / ref.norm()
        assert rel < 1e-4, rel


@pytest.mark.parametrize("kind", ["kda", "gla"])
def test_per_channel_scores_in_several_groups_match_naive_fp64(kind, diagonal_path, monkeypatch):
    """A score-buffer budget of one element puts every chunk in its own group (the path of long batches
    with strong decays): outputs, final state and every gradient still match the per-token reference."""
    monkeypatch.setattr(per_channel, "SCORE_BUFFER_ELEMENTS", 1)
    inputs = [x.requires_grad_() for x in make_inputs(kind, T=19)]
    q, k, v, g, beta, h0 = inputs
    b = common.to_chunks(g.detach(), 4, g.dtype).cumsum(2)
    assert len(per_channel._chunk_groups(b)) == 5  # T = 19 -> 5 chunks of 4, one group each
    wanted = [q, k, v, g, h0] + ([beta] if kind != "gla" else [])

    def run(fn, **kw):
        o, S = call(fn, kind, q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
        return [o, S, *torch.autograd.grad(o.square().sum() + S.sum(), wanted)]

    for got, ref in zip(run(CHUNK[kind], chunk_size=4), run(NAIVE[kind])):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("chunk_size", [1, 7, 32])
@pytest.mark.parametrize("with_h0", [False, True])
@pytest.mark.parametrize("final_state_loss", [False, True])
def test_gdn_hand_written_backward_matches_naive_fp64(chunk_size, with_h0, final_state_loss):
    # the custom autograd.Function of the chunked GDN vs autograd through the per-token reference:
    # every input gradient (q, k, v, g, beta and the initial state), odd length T = 45
    q, k, v, g, beta, h0 = make_inputs("gdn", T=45)
    wanted = [x.requires_grad_() for x in (q, k, v, g, beta) + ((h0,) if with_h0 else ())]
    gen = torch.Generator().manual_seed(2)
    w_o = torch.randn(2, 45, 3, 6, generator=gen, dtype=q.dtype)
    w_S = torch.randn(2, 3, 8, 6, generator=gen, dtype=q.dtype)

    def run(fn, **kw):
        o, S = fn(q, k, v, g, beta, initial_state=h0 if with_h0 else None, output_final_state=True, **kw)
        loss = (o * w_o).sum() + ((S * w_S).sum() if final_state_loss else 0.0)
        return (o, S, *torch.autograd.grad(loss, wanted))

    got = run(ops.chunk_gated_delta_rule, chunk_size=chunk_size)
    for a, b in zip(got, run(ops.naive_recurrent_gdn)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("chunk_size", [32, 64])
def test_gdn_gradients_match_naive_fp32(chunk_size):
    # fp32 at the benchmark's K = 64 head size, T = 77 (not a multiple of the chunk), strong-ish decays
    gen = torch.Generator().manual_seed(5)
    q, k, v, g, beta, h0 = make_inputs("gdn", B=1, T=77, H=1, K=64, V=32, dtype=torch.float32, seed=5)
    g = g * 3.0
    wanted = [x.requires_grad_() for x in (q, k, v, g, beta, h0)]
    w_o = torch.randn(1, 77, 1, 32, generator=gen)

    def run(fn, **kw):
        o, S = fn(q, k, v, g, beta, initial_state=h0, output_final_state=True, **kw)
        return (o, S, *torch.autograd.grad((o * w_o).sum() + S.square().sum(), wanted))

    for a, b in zip(run(ops.chunk_gated_delta_rule, chunk_size=chunk_size), run(ops.naive_recurrent_gdn)):
        assert ((a - b).norm() / b.norm()) < 1e-4


@pytest.mark.parametrize("grad_kind", ["transposed", "expanded"])
def test_gdn_non_contiguous_inputs_and_output_gradient(grad_kind):
    # the op reads v and the output gradient chunk by chunk from their own layout, whatever the strides:
    # q/k/v as slices of one fused projection, an output gradient that is a transposed tensor or the
    # expanded ones of a .sum() loss (T a multiple of the chunk, so it reaches the op's backward as it is)
    gen = torch.Generator().manual_seed(6)
    B, T, H, K, V = 2, 48, 3, 8, 6
    qkv = torch.randn(B, T, H, 2 * K + V, dtype=torch.float64, generator=gen)
    q, k, v = qkv[..., :K], F.normalize(qkv[..., K:2 * K], dim=-1), qkv[..., 2 * K:]
    assert not v.is_contiguous()
    g = F.logsigmoid(torch.randn(B, T, H, dtype=torch.float64, generator=gen))
    beta = torch.rand(B, T, H, dtype=torch.float64, generator=gen)
    w_o = torch.randn(B, H, T, V, dtype=torch.float64, generator=gen).transpose(1, 2)  # [B, T, H, V], strided
    if grad_kind == "expanded":
        w_o = torch.ones((), dtype=torch.float64).expand(B, T, H, V)
    wanted = [qkv.requires_grad_(), g.requires_grad_(), beta.requires_grad_()]

    def run(fn, **kw):
        q, k, v = qkv[..., :K], F.normalize(qkv[..., K:2 * K], dim=-1), qkv[..., 2 * K:]
        o = fn(q, k, v, g, beta, **kw)[0]
        return (o, *torch.autograd.grad(o, wanted, grad_outputs=w_o))

    for a, b in zip(run(ops.chunk_gated_delta_rule, chunk_size=16), run(ops.naive_recurrent_gdn)):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("kind", KINDS)
def test_strong_decay_is_stable(kind):
    # log-decays of -40 per token: exp(+b) of the cumulative decay would overflow fp32 within 3 tokens
    q, k, v, g, beta, h0 = make_inputs(kind, T=40, dtype=torch.float32)
    g = torch.full_like(g, -40.0)
    g[:, ::7] = 0.0  # some tokens keep the state, so the values stay non-trivial
    o, S = call(CHUNK[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    ref_o, ref_S = call(NAIVE[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(S).all()
    torch.testing.assert_close(o, ref_o, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(S, ref_S, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("kind", KINDS)
def test_bf16_inputs_keep_their_dtype(kind):
    q, k, v, g, beta, h0 = make_inputs(kind, T=12, dtype=torch.float32)
    o, S = call(CHUNK[kind], kind, q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta, output_final_state=True)
    ref = call(NAIVE[kind], kind, q.bfloat16(), k.bfloat16(), v.bfloat16(), g, beta)[0]
    assert o.dtype == torch.bfloat16 and S.dtype == torch.float32
    torch.testing.assert_close(o.float(), ref.float(), rtol=2e-2, atol=2e-2)


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_grouped_value_heads(kind):
    # GVA: 2 q/k heads serve 4 value heads; equivalent to repeating each q/k head over its group
    q, k, _, _, _, _ = make_inputs(kind, H=2, T=11)
    _, _, v, g, beta, h0 = make_inputs(kind, H=4, T=11, seed=1)
    q_rep, k_rep = q.repeat_interleave(2, dim=2), k.repeat_interleave(2, dim=2)
    ref = call(NAIVE[kind], kind, q_rep, k_rep, v, g, beta, initial_state=h0, output_final_state=True)
    for fn in (CHUNK[kind], RECURRENT[kind], NAIVE[kind]):
        o, S = call(fn, kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
        torch.testing.assert_close(o, ref[0], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(S, ref[1], rtol=1e-10, atol=1e-10)
    if kind == "kda":  # fla's reference supports GVA natively
        fla_o, _ = fla_naive_kda(q, k, v, g, beta, initial_state=h0)
        torch.testing.assert_close(ref[0], fla_o, rtol=1e-6, atol=1e-6)


def test_gla_rejects_grouped_value_heads():
    q, k, _, g, _, _ = make_inputs("gla", H=2, T=5)
    v = torch.randn(2, 5, 4, 6, dtype=q.dtype)
    with pytest.raises(HybridlabError, match="v must be"):
        ops.chunk_gla(q, k, v, g)


# --- building blocks -------------------------------------------------------------------------------


@pytest.mark.parametrize("C", [6, 16, 64])
def test_per_channel_scores_match_brute_force(C, diagonal_path):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 3, C, 5, dtype=torch.float64, generator=gen)
    k = torch.randn(2, 3, C, 5, dtype=torch.float64, generator=gen)
    b = F.logsigmoid(torch.randn(2, 3, C, 5, dtype=torch.float64, generator=gen)).cumsum(2)
    (P,) = per_channel.per_channel_scores([x], k, b)
    brute = torch.einsum("nzid,nzjd,nzijd->nzij", x, k, (b[:, :, :, None] - b[:, :, None, :]).exp())
    torch.testing.assert_close(P, brute.tril(), rtol=1e-12, atol=1e-12)


def test_diagonal_is_folded_only_within_the_span_limit():
    # C = 16: sub-chunks of 16, 8 or 4 tokens span 15, 7 or 3 steps of log-decay
    def parts(step):
        return per_channel._score_parts(torch.full((2, 16, 3), step, dtype=torch.float64).cumsum(1), common.Scratch())

    limit = per_channel.FOLD_SPAN
    assert parts(-limit / 15 + 0.01)[0].shape == (2, 1, 16, 3) and parts(-limit / 15 + 0.01)[3] is None
    assert parts(-limit / 7 + 0.01)[0].shape == (2, 2, 8, 3) and parts(-limit / 7 + 0.01)[3] is None
    assert parts(-limit / 3 + 0.01)[0].shape == (2, 4, 4, 3) and parts(-limit / 3 + 0.01)[3] is None
    strong = parts(-limit / 3 - 0.01)  # too strong for any fold: element-wise diagonal on 4-token sub-chunks
    assert strong[0].shape == (2, 4, 4, 3) and strong[3].shape == (2, 4, 4, 4, 3)


@pytest.mark.parametrize("kind", ["kda", "gla"])
def test_mixed_decay_chunks_gradients_match_naive_fp64(kind):
    # chunk 0 mild (folded), chunk 1 with log-decays of -12 per token (span 36 > 30: element-wise), chunk 2 mild
    q, k, v, g, beta, h0 = make_inputs(kind, T=48)
    g = g.detach().clone()
    g[:, 16:32] = -12.0
    inputs = [x.requires_grad_() for x in (q, k, v, g, beta, h0)]
    wanted = inputs[:4] + ([inputs[4]] if kind == "kda" else [])

    def grads(fn, **kw):
        o, S = call(fn, kind, *inputs[:5], initial_state=inputs[5], output_final_state=True, **kw)
        return torch.autograd.grad(o.square().sum() + S.sum(), wanted)

    for got, ref in zip(grads(CHUNK[kind], chunk_size=16), grads(NAIVE[kind])):
        torch.testing.assert_close(got, ref, rtol=1e-9, atol=1e-9)


def test_chunk_view_is_the_chunk_layout_without_a_copy():
    x = torch.arange(2 * 12 * 3 * 5, dtype=torch.float32).reshape(2, 12, 3, 5)
    view = common.chunk_view(x, 4)  # [N, B, H, C, D]
    assert view.shape == (3, 2, 3, 4, 5) and view.data_ptr() == x.data_ptr()
    torch.testing.assert_close(view.reshape(3, 6, 4, 5), common.to_chunks(x, 4, torch.float32))
    view[1, 0, 2].fill_(-1.0)  # chunk 1 (tokens 4..7) of batch 0, head 2 is written through to x
    assert (x[0, 4:8, 2] == -1).all() and (x[0, :4, 2] != -1).all() and (x[0, 8:, 2] != -1).all()
    padded = common.pad_time(x[:, :10], 4)  # neutral zeros up to a whole chunk, contiguous
    assert padded.shape == (2, 12, 3, 5) and padded.is_contiguous() and (padded[:, 10:] == 0).all()


def test_unit_lower_inverse():
    gen = torch.Generator().manual_seed(4)
    L = torch.randn(3, 40, 40, dtype=torch.float64, generator=gen) * 0.3
    eye = torch.eye(40, dtype=torch.float64)
    strict = L.tril(-1)
    L = strict + 3.0 * eye + 5.0 * torch.ones(40, 40).triu(1)  # the diagonal and upper triangle are not read
    T = common.unit_lower_inverse(L, base=8)
    torch.testing.assert_close(T, torch.linalg.inv(strict + eye), rtol=1e-10, atol=1e-10)
    assert (T.triu(1) == 0).all()


def test_sub_chunk_size_divides():
    assert common.sub_chunk_size(64) == 8
    assert common.sub_chunk_size(7) in (1, 7)
    assert all(C % common.sub_chunk_size(C) == 0 for C in range(1, 100))


# --- dispatch and errors ---------------------------------------------------------------------------


@pytest.mark.parametrize("kind", KINDS)
def test_cpu_tensors_never_reach_fla(kind, monkeypatch):
    def forbidden(module, name):
        raise AssertionError(f"fla's {module}.{name} called for CPU tensors")

    for module in (gdn, kda, gla):
        monkeypatch.setattr(module, "fla_op", forbidden)
    q, k, v, g, beta, _ = make_inputs(kind, T=5)
    call(CHUNK[kind], kind, q, k, v, g, beta)
    call(RECURRENT[kind], kind, q, k, v, g, beta)


@pytest.mark.parametrize("kind", KINDS)
def test_bad_shapes_raise_hybridlab_error(kind):
    q, k, v, g, beta, h0 = make_inputs(kind, T=5)
    with pytest.raises(HybridlabError, match="g must be"):
        call(CHUNK[kind], kind, q, k, v, g[..., :1] if kind != "gdn" else g[..., None], beta)
    with pytest.raises(HybridlabError, match="v must be"):
        call(CHUNK[kind], kind, q, k, v[:, :3], g, beta)
    with pytest.raises(HybridlabError, match="initial_state"):
        call(CHUNK[kind], kind, q, k, v, g, beta, initial_state=h0[:, :, :2])
    with pytest.raises(HybridlabError, match="chunk_size"):
        call(CHUNK[kind], kind, q, k, v, g, beta, chunk_size=0)


# --- the dispatch helper (ops.dispatch.fla_dispatch), on CPU without fla's kernels ------------------

ALL_OPS = [*CHUNK.items(), *RECURRENT.items()]


def fake_fla(monkeypatch, op):
    """Route every call to fla (``uses_fla`` -> True) and put a recording stand-in for ``op``'s kernel in place."""
    calls = []

    def kernel(*args, **kwargs):
        calls.append((args, kwargs))
        return "from fla", None

    module, name = op.fla_kernel
    monkeypatch.setitem(sys.modules, module, types.SimpleNamespace(**{name: kernel}))
    monkeypatch.setattr(dispatch, "uses_fla", lambda q: True)
    return calls


def test_importing_the_ops_does_not_import_fla():
    code = "import sys, hybridlab.models.ops; assert not any(m.split('.')[0] == 'fla' for m in sys.modules)"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("kind,op", ALL_OPS)
def test_cpu_call_runs_the_decorated_cpu_implementation(kind, op):
    q, k, v, g, beta, h0 = make_inputs(kind, T=6)
    got = call(op, kind, q, k, v, g, beta, initial_state=h0, output_final_state=True, scale=0.3)
    ref = call(op.__wrapped__, kind, q, k, v, g, beta, initial_state=h0, output_final_state=True, scale=0.3)
    for a, b in zip(got, ref):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    assert op.__name__ == op.__wrapped__.__name__ and op.__doc__ == op.__wrapped__.__doc__


@pytest.mark.parametrize("kind,op", ALL_OPS)
@pytest.mark.parametrize("chunk_size", [32, 48])
def test_cuda_route_passes_fla_its_arguments_by_keyword(kind, op, chunk_size, monkeypatch):
    calls = fake_fla(monkeypatch, op)
    q, k, v, g, beta, h0 = make_inputs(kind, B=1, T=6)
    varlen = op.__name__.startswith("chunk")
    if varlen:
        h0 = h0.repeat(2, 1, 1, 1)  # one state per sequence
    extra = {"cu_seqlens": torch.tensor([0, 2, 6], dtype=torch.int32)} if varlen else {}
    out = call(op, kind, q, k, v, g, beta, initial_state=h0, output_final_state=True, chunk_size=chunk_size,
               use_qk_l2norm_in_kernel=True, **extra)
    assert out == ("from fla", None) and len(calls) == 1
    args, kwargs = calls[0]
    assert args == ()
    expected = {"q": q, "k": k, "v": v, "gk" if op is ops.fused_recurrent_gla else "g": g,
                "scale": None, "initial_state": h0, "output_final_state": True}
    if kind != "gla":
        expected.update(beta=beta, use_qk_l2norm_in_kernel=True)
    # fla's accepted tiles: GDN 16/32/64, KDA 32/64 (chunk ops only); GLA's chunk op and the recurrent ops get none
    if chunk_size == 32 and varlen and kind != "gla":
        expected["chunk_size"] = 32
    cu = kwargs.pop("cu_seqlens", None)
    assert (cu is not None) == varlen
    if varlen:
        assert cu.dtype == torch.long and cu.tolist() == [0, 2, 6]
    assert kwargs.keys() == expected.keys()
    assert all(kwargs[name] is value for name, value in expected.items())


def test_cuda_route_loads_the_kernel_through_the_op_modules_fla_op(monkeypatch):
    """What tests/models/test_ops_cuda.py relies on: patching ``<module>.fla_op`` intercepts the CUDA route."""
    loaded = []
    for module in (gdn, kda, gla):
        monkeypatch.setattr(module, "fla_op", lambda m, n: loaded.append((m, n)) or (lambda **kw: ("fla", n)))
    monkeypatch.setattr(dispatch, "uses_fla", lambda q: True)
    for kind, op in ALL_OPS:
        q, k, v, g, beta, _ = make_inputs(kind, T=4)
        assert call(op, kind, q, k, v, g, beta) == ("fla", op.__name__)
    assert loaded == [op.fla_kernel for _, op in ALL_OPS]
    assert [n for _, n in loaded] == [op.__name__ for _, op in ALL_OPS]


@pytest.mark.parametrize("kind,op", ALL_OPS)
def test_cuda_route_validates_inputs_before_fla(kind, op, monkeypatch):
    calls = fake_fla(monkeypatch, op)
    q, k, v, g, beta, h0 = make_inputs(kind, T=5)
    with pytest.raises(HybridlabError, match=f"{op.__name__}: initial_state"):
        call(op, kind, q, k, v, g, beta, initial_state=h0[:, :, :2])
    with pytest.raises(HybridlabError, match="chunk_size"):
        call(op, kind, q, k, v, g, beta, chunk_size=0)
    assert calls == []


@pytest.mark.parametrize("kind,op", ALL_OPS)
def test_cuda_route_without_fla_is_a_one_line_error(kind, op, monkeypatch):
    fake_fla(monkeypatch, op)
    module, name = op.fla_kernel
    monkeypatch.setitem(sys.modules, module, None)  # importing it raises ImportError, as without fla/triton
    q, k, v, g, beta, _ = make_inputs(kind, T=4)
    with pytest.raises(HybridlabError, match="CUDA tensors need flash-linear-attention") as err:
        call(op, kind, q, k, v, g, beta)
    assert f"{module}.{name}" in str(err.value) and "\n" not in str(err.value)


def test_dispatch_varlen_runs_the_cpu_implementation_once_on_padded_rows():
    seen = []

    @dispatch.fla_dispatch("fla.ops.nothing", "toy", per_channel_g=False)
    def toy(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False, chunk_size=64,
            cu_seqlens=None):
        """Toy op: o = v, final state = initial state + 1."""
        seen.append((q.shape, beta.shape, initial_state.shape, output_final_state, scale, chunk_size, cu_seqlens))
        return v.clone(), initial_state + 1

    q, k, v, g, beta, h0 = make_inputs("gdn", B=1, T=7)
    h0 = h0.repeat(3, 1, 1, 1)
    o, S = toy(q, k, v, g, beta, 0.5, h0, True, chunk_size=4, cu_seqlens=torch.tensor([0, 1, 5, 7]))
    assert seen == [((3, 4, 3, 8), (3, 4, 3), (3, 3, 8, 6), True, 0.5, 4, None)]  # N=3 rows of L_max=4
    torch.testing.assert_close(o, v)
    torch.testing.assert_close(S, h0 + 1)
    assert toy.__name__ == "toy" and toy.__doc__.startswith("Toy op")
    with pytest.raises(TypeError, match="multiple values for argument 'q'"):
        toy(q, k, v, g, beta, q=q)
    with pytest.raises(TypeError, match="unexpected keyword argument 'gk'"):
        toy(q, k, v, g, beta, gk=g)

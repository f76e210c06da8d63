"""CUDA dispatch: fla's Triton kernels on GPU tensors agree with this package's CPU implementations.

Skipped without a CUDA device. fla's kernels may use TF32 for fp32 matmuls, hence the looser tolerances.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from hybridlab.models import ops
from hybridlab.models.mixers import MixerConfig, build_mixer
from hybridlab.models.ops import gdn, gla, kda

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]

KINDS = ("gdn", "kda", "gla")
CHUNK = {"gdn": ops.chunk_gated_delta_rule, "kda": ops.chunk_kda, "gla": ops.chunk_gla}
RECURRENT = {
    "gdn": ops.fused_recurrent_gated_delta_rule, "kda": ops.fused_recurrent_kda, "gla": ops.fused_recurrent_gla
}
TOL = {"rtol": 2e-2, "atol": 2e-3}


def make_inputs(kind, B=2, T=100, H=2, K=64, V=64, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, T, H, K, generator=gen)
    k = F.normalize(torch.randn(B, T, H, K, generator=gen), dim=-1)
    v = torch.randn(B, T, H, V, generator=gen)
    g_shape = (B, T, H) if kind == "gdn" else (B, T, H, K)
    g = F.logsigmoid(torch.randn(g_shape, generator=gen)) / (1 if kind == "gdn" else 8)
    beta = torch.rand(B, T, H, generator=gen)
    h0 = torch.randn(B, H, K, V, generator=gen) * 0.1
    return q, k, v, g, beta, h0


def call(fn, kind, q, k, v, g, beta, **kw):
    if kind == "gla":
        return fn(q, k, v, g, **kw)
    return fn(q, k, v, g, beta, **kw)


def relative_error(a, b):
    return ((a.float().cpu() - b.float().cpu()).norm() / b.float().cpu().norm()).item()


@pytest.mark.parametrize("kind", KINDS)
def test_cuda_calls_fla(kind, monkeypatch):
    called = []
    for module in (gdn, kda, gla):
        original = module.fla_op
        monkeypatch.setattr(module, "fla_op", lambda m, n, _orig=original: called.append(n) or _orig(m, n))
    q, k, v, g, beta, _ = (x.cuda() for x in make_inputs(kind, T=16))
    call(CHUNK[kind], kind, q, k, v, g, beta)
    call(RECURRENT[kind], kind, q, k, v, g, beta)
    assert len(called) == 2 and called[0].startswith("chunk") and called[1].startswith("fused_recurrent")


@pytest.mark.parametrize("kind", KINDS)
def test_chunk_forward_and_backward_match_cpu(kind):
    cpu = [x.requires_grad_() for x in make_inputs(kind)]
    gpu = [x.detach().cuda().requires_grad_() for x in cpu]
    outs = []
    for q, k, v, g, beta, h0 in (cpu, gpu):
        o, S = call(CHUNK[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
        (o.square().mean() + S.square().mean()).backward()
        outs.append((o, S))
    (o_cpu, S_cpu), (o_gpu, S_gpu) = outs
    torch.testing.assert_close(o_gpu.cpu(), o_cpu, **TOL)
    torch.testing.assert_close(S_gpu.cpu(), S_cpu, **TOL)
    used = range(6) if kind != "gla" else (0, 1, 2, 3, 5)
    for i in used:
        assert relative_error(gpu[i].grad, cpu[i].grad) < 2e-2, i


@pytest.mark.parametrize("kind", KINDS)
def test_fused_recurrent_decode_step_matches_cpu(kind):
    q, k, v, g, beta, h0 = make_inputs(kind, T=3)
    ref = call(RECURRENT[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    got = call(RECURRENT[kind], kind, *(x.cuda() for x in (q, k, v, g, beta)), initial_state=h0.cuda(),
               output_final_state=True)
    torch.testing.assert_close(got[0].cpu(), ref[0], **TOL)
    torch.testing.assert_close(got[1].cpu(), ref[1], **TOL)


def _mixer_pair(kind):
    """The same freshly initialised mixer on CPU and on CUDA."""
    torch.manual_seed(0)
    cfg = MixerConfig(kind=kind, hidden_size=128, num_heads=2, head_k_dim=64, head_v_dim=64)
    m_cpu = build_mixer(cfg, 0)
    m_gpu = build_mixer(cfg, 0).cuda()
    m_gpu.load_state_dict(m_cpu.state_dict())
    return m_cpu, m_gpu


@pytest.mark.parametrize("kind", KINDS)
def test_mixer_on_cuda_matches_cpu(kind):
    m_cpu, m_gpu = _mixer_pair(kind)
    x = torch.randn(2, 80, 128)
    mask = torch.ones(2, 80)
    mask[1, :7] = 0
    y_cpu, s_cpu = m_cpu(x, attention_mask_BT=mask, use_cache=True)
    y_gpu, s_gpu = m_gpu(x.cuda(), attention_mask_BT=mask.cuda(), use_cache=True)
    assert relative_error(y_gpu, y_cpu) < 2e-2
    assert relative_error(s_gpu.recurrent_BHKV, s_cpu.recurrent_BHKV) < 2e-2
    with torch.no_grad():  # one decoding step through fla's fused_recurrent kernels
        x1 = torch.randn(2, 1, 128)
        y1_cpu, _ = m_cpu(x1, state=s_cpu)
        y1_gpu, _ = m_gpu(x1.cuda(), state=s_gpu)
    assert relative_error(y1_gpu, y1_cpu) < 2e-2


@pytest.mark.parametrize("kind", ["gdn", "kda"])
def test_grouped_value_heads_match_cpu(kind):
    q, k, _, _, _, _ = make_inputs(kind, H=2, T=70)
    _, _, v, g, beta, h0 = make_inputs(kind, H=4, T=70, seed=1)
    ref = call(CHUNK[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True)
    got = call(CHUNK[kind], kind, *(x.cuda() for x in (q, k, v, g, beta)), initial_state=h0.cuda(),
               output_final_state=True)
    torch.testing.assert_close(got[0].cpu(), ref[0], **TOL)
    torch.testing.assert_close(got[1].cpu(), ref[1], **TOL)


@pytest.mark.parametrize("kind", KINDS)
def test_varlen_cu_seqlens_match_cpu_forward_and_backward(kind):
    """document_mask on GPU: fla's cu_seqlens kernels against the CPU ops' padded per-sequence rows."""
    cu = torch.tensor([0, 37, 100, 160, 200])
    q, k, v, g, beta, h0 = make_inputs(kind, B=1, T=200)
    h0 = torch.randn(4, *h0.shape[1:]) * 0.1
    cpu = [x.requires_grad_() for x in (q, k, v, g, beta, h0)]
    gpu = [x.detach().cuda().requires_grad_() for x in cpu]
    outs = []
    for (q, k, v, g, beta, h0), c in ((cpu, cu), (gpu, cu.cuda())):
        o, S = call(CHUNK[kind], kind, q, k, v, g, beta, initial_state=h0, output_final_state=True, cu_seqlens=c)
        (o.square().mean() + S.square().mean()).backward()
        outs.append((o, S))
    (o_cpu, S_cpu), (o_gpu, S_gpu) = outs
    torch.testing.assert_close(o_gpu.cpu(), o_cpu, **TOL)
    torch.testing.assert_close(S_gpu.cpu(), S_cpu, **TOL)
    for i in (range(6) if kind != "gla" else (0, 1, 2, 3, 5)):
        assert relative_error(gpu[i].grad, cpu[i].grad) < 2e-2, i


@pytest.mark.parametrize("kind", KINDS)
def test_mixer_documents_on_cuda_match_cpu(kind):
    m_cpu, m_gpu = _mixer_pair(kind)
    x = torch.randn(2, 80, 128)
    docs = torch.tensor([[0] * 30 + [1] * 50, [0] * 3 + [1] * 60 + [2] * 17])
    y_cpu, _ = m_cpu(x, document_ids_BT=docs)
    y_gpu, _ = m_gpu(x.cuda(), document_ids_BT=docs.cuda())
    assert relative_error(y_gpu, y_cpu) < 2e-2

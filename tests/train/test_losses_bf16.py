"""Chunked KL and CE under bf16 autocast (as the training loop calls them): value and gradient equal
autograd of the unchunked loss on the same bf16 logits, at small and large KL, for several chunkings.

The reference computes `logits = F.linear(h, W, b)` under autocast (bf16, like the model's own head),
then `.float()` log-softmax / cross-entropy, and differentiates it with autograd. The loss's backward
runs outside autocast, as in `hybridlab.train.loop`.

Every test runs twice: with these small logits kept for the backward (the small presets' path) and with
`KEPT_LOGITS_ELEMENTS` at 0, so the backward recomputes them (the path of paper-size vocabularies, which the
rehearsal's small vocabularies do not reach).
"""

import pytest
import torch
import torch.nn.functional as F

from hybridlab.train import losses
from hybridlab.train.losses import Projected, ce_chunked, kl_forward_chunked, token_kl_chunked, token_nll_chunked


@pytest.fixture(autouse=True, params=["kept", "recomputed"])
def logits_path(request, monkeypatch):
    if request.param == "recomputed":
        monkeypatch.setattr(losses, "KEPT_LOGITS_ELEMENTS", 0)
    return request.param

N, D, V = 48, 64, 1024
BF16 = dict(device_type="cpu", dtype=torch.bfloat16)


def _close(got, want, what):
    cos = F.cosine_similarity(got.flatten().double(), want.flatten().double(), 0).item()
    ratio = (got.double().norm() / want.double().norm()).item()
    assert cos >= 0.999 and abs(ratio - 1) <= 0.01, f"{what}: cosine {cos:.4f}, norm ratio {ratio:.4f}"


def _pair(noise, seed=0, bias=False):
    """Teacher and student heads with logits of std ~8 (LM-like); the student is the teacher plus noise."""
    g = torch.Generator().manual_seed(seed)
    th, tw = torch.randn(N, D, generator=g), torch.randn(V, D, generator=g)
    sh, sw = th + noise * torch.randn(N, D, generator=g), tw + noise * torch.randn(V, D, generator=g)
    tb, sb = (torch.randn(V, generator=g), torch.randn(V, generator=g)) if bias else (None, None)
    return th, tw, tb, sh, sw, sb


def _ref_kl(th, tw, tb, sh, sw, sb, scale, mask):
    with torch.autocast(**BF16):
        zt, zs = F.linear(th, tw, tb), F.linear(sh, sw, sb)
    assert zt.dtype == zs.dtype == torch.bfloat16
    lt, ls = (zt.float() * scale).log_softmax(-1), (zs.float() * scale).log_softmax(-1)
    kl_N = (lt.exp() * (lt - ls)).sum(-1)
    return (kl_N * mask).sum() / mask.sum()


@pytest.mark.parametrize("noise,kl_range", [(0.003, (2e-4, 5e-3)), (1.0, (5.0, 100.0))], ids=["small_kl", "large_kl"])
@pytest.mark.parametrize("chunk_tokens,vocab_chunk", [(48, None), (7, None), (16, 300), (1, 1000)])
def test_chunked_kl_gradient_equals_unchunked_on_bf16_logits(noise, kl_range, chunk_tokens, vocab_chunk):
    th, tw, _, sh, sw, _ = _pair(noise)
    sh, sw = sh.requires_grad_(), sw.requires_grad_()
    mask = torch.ones(N)
    with torch.autocast(**BF16):
        kl = kl_forward_chunked(Projected(th, tw), Projected(sh, sw), None, chunk_tokens, vocab_chunk)
    got = torch.autograd.grad(kl, [sh, sw])
    ref = _ref_kl(th, tw, None, sh, sw, None, 1.0, mask)
    want = torch.autograd.grad(ref, [sh, sw])
    assert kl_range[0] < ref.item() < kl_range[1]
    torch.testing.assert_close(kl, ref, rtol=1e-4, atol=1e-6)
    for name, a, b in zip(("student hidden", "student weight"), got, want):
        assert a.dtype == torch.float32
        _close(a, b, name)


@pytest.mark.parametrize("noise", [0.003, 1.0])
def test_chunked_kl_teacher_side_bias_scale_and_mask_under_bf16(noise):
    """Gradients reach a teacher that requires grad; bias, a Granite-style scale and a mask are honoured."""
    tensors = [t.requires_grad_() for t in _pair(noise, seed=3, bias=True)]
    th, tw, tb, sh, sw, sb = tensors
    mask = torch.rand(N, generator=torch.Generator().manual_seed(4)) > 0.3
    with torch.autocast(**BF16):
        kl = kl_forward_chunked(Projected(th, tw, tb, 0.5), Projected(sh, sw, sb, 0.5), mask, 5, 256)
    got = torch.autograd.grad(kl, tensors)
    ref = _ref_kl(th, tw, tb, sh, sw, sb, 0.5, mask.float())
    want = torch.autograd.grad(ref, tensors)
    torch.testing.assert_close(kl, ref, rtol=1e-4, atol=1e-6)
    for name, a, b in zip(("t_hidden", "t_weight", "t_bias", "s_hidden", "s_weight", "s_bias"), got, want):
        _close(a, b, name)


def test_backward_inside_autocast_gives_the_same_gradient():
    """The compute dtype is fixed at forward time; where the backward runs does not change it."""
    th, tw, _, sh, sw, _ = _pair(0.003)
    sh = sh.requires_grad_()
    grads = []
    for inside in (False, True):
        with torch.autocast(**BF16):
            kl = kl_forward_chunked(Projected(th, tw), Projected(sh, sw), None, 16, 300)
            if inside:
                grads.append(torch.autograd.grad(kl, [sh])[0])
        if not inside:
            grads.append(torch.autograd.grad(kl, [sh])[0])
    torch.testing.assert_close(grads[0], grads[1], rtol=0, atol=0)


def test_bf16_inputs_without_autocast_compute_in_bf16():
    """A bf16 model (e.g. a bf16 teacher, or FSDP2 bf16 compute) gets bf16 logits and bf16 gradients."""
    th, tw, _, sh, sw, _ = (t.bfloat16() if t is not None else None for t in _pair(0.003, seed=5))
    sh, sw = sh.requires_grad_(), sw.requires_grad_()
    kl = kl_forward_chunked(Projected(th, tw), Projected(sh, sw), None, 16, 300)
    got = torch.autograd.grad(kl, [sh, sw])
    lt, ls = (th @ tw.T).float().log_softmax(-1), (sh @ sw.T).float().log_softmax(-1)
    ref = (lt.exp() * (lt - ls)).sum(-1).mean()
    want = torch.autograd.grad(ref, [sh, sw])
    assert kl.dtype == torch.float32 and all(g.dtype == torch.bfloat16 for g in got)
    torch.testing.assert_close(kl, ref, rtol=1e-4, atol=1e-6)
    for name, a, b in zip(("hidden", "weight"), got, want):
        _close(a, b, name)


def _labels(seed=7):
    g = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, V, (N,), generator=g)
    labels[torch.rand(N, generator=g) < 0.2] = -100
    return labels


@pytest.mark.parametrize("chunk_tokens,vocab_chunk", [(48, None), (5, None), (16, 300), (1, 1000)])
def test_chunked_ce_equals_cross_entropy_on_bf16_logits(chunk_tokens, vocab_chunk):
    h, w, b, *_ = (t.requires_grad_() for t in _pair(0.0, seed=8, bias=True) if t is not None)
    labels = _labels()
    with torch.autocast(**BF16):
        ce = ce_chunked(Projected(h, w, b, 0.25), labels, -100, chunk_tokens, vocab_chunk)
        z = F.linear(h, w, b)
        nll = token_nll_chunked(Projected(h, w, b, 0.25), labels.clamp(min=0), chunk_tokens, vocab_chunk)
    got = torch.autograd.grad(ce, [h, w, b])
    ref = F.cross_entropy(z.float() * 0.25, labels, ignore_index=-100)
    want = torch.autograd.grad(ref, [h, w, b])
    torch.testing.assert_close(ce, ref, rtol=1e-5, atol=1e-6)
    for name, a, bb in zip(("hidden", "weight", "bias"), got, want):
        _close(a, bb, name)
    per_token = F.cross_entropy(z.detach().float() * 0.25, labels.clamp(min=0), reduction="none")
    torch.testing.assert_close(nll, per_token, rtol=1e-5, atol=1e-5)


def test_ce_and_kl_on_bf16_full_logits_match_autograd():
    """Full bf16 logits (a plain module's output): gradients come back bf16 and equal autograd's."""
    th, tw, _, sh, sw, _ = _pair(0.003, seed=9)
    zt = (th @ tw.T).bfloat16()
    zs = (sh @ sw.T).bfloat16().requires_grad_()
    labels = _labels(10)
    (g_ce,) = torch.autograd.grad(ce_chunked(zs, labels, vocab_chunk=300), [zs])
    (w_ce,) = torch.autograd.grad(F.cross_entropy(zs.float(), labels), [zs])
    kl = kl_forward_chunked(zt, zs, None, 16, 300)
    (g_kl,) = torch.autograd.grad(kl, [zs])
    lt, ls = zt.float().log_softmax(-1), zs.float().log_softmax(-1)
    (w_kl,) = torch.autograd.grad((lt.exp() * (lt - ls)).sum(-1).mean(), [zs])
    assert g_ce.dtype == g_kl.dtype == torch.bfloat16
    _close(g_ce, w_ce, "ce logits")
    _close(g_kl, w_kl, "kl logits")
    torch.testing.assert_close(token_kl_chunked(zt, zs, 16, 300), (lt.exp() * (lt - ls)).sum(-1).detach(),
                               rtol=1e-4, atol=2e-5)  # fp32 cancellation in a sum of ~1e-3


def _qwen(vocab=512, seed=0):
    from tiny_models import tiny_qwen3

    return tiny_qwen3(seed=seed, vocab_size=vocab, tie_word_embeddings=True, max_position_embeddings=16)


def test_causal_lm_task_under_bf16_equals_cross_entropy_of_the_models_own_logits():
    """CausalLMTask (decoder stack + chunked CE) vs F.cross_entropy of the model's bf16 logits."""
    from hybridlab.train.tasks import CausalLMTask

    model = _qwen()
    ids = torch.randint(0, 512, (2, 16), generator=torch.Generator().manual_seed(1))
    params = [p for p in model.parameters()]
    with torch.autocast(**BF16):
        loss, _ = CausalLMTask(chunk_tokens=7, vocab_chunk=200).loss(model, ids)
    got = torch.autograd.grad(loss, params)
    with torch.autocast(**BF16):
        logits = model(input_ids=ids).logits
    assert logits.dtype == torch.bfloat16
    ref = F.cross_entropy(logits[:, :-1].float().reshape(-1, 512), ids[:, 1:].reshape(-1))
    want = torch.autograd.grad(ref, params)
    torch.testing.assert_close(loss, ref, rtol=1e-5, atol=1e-5)
    for (name, _), a, b in zip(model.named_parameters(), got, want):
        _close(a, b, name)

"""The fused RMSNorm (hybridlab.models.fused): same output as transformers' RMSNorm bit for bit, gradients
equal to autograd's through the eager chain and to fp64 finite differences, and the class swap that applies
it to a model (and undoes it) touches only the norms it names."""

import pytest
import torch
from torch import nn
from tiny_models import tiny_qwen3
from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm
from transformers.models.smollm3.modeling_smollm3 import SmolLM3RMSNorm

from hybridlab.models.fused import FUSABLE, fuse_rms_norms, rms_norm


def _eager(x, w, eps):
    """transformers' chain, written out: the reference for values and gradients."""
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


@pytest.mark.parametrize("shape", [(3, 17, 64), (2, 9, 4, 16)])
def test_forward_bit_identical_and_gradients_match_autograd(shape):
    g = torch.Generator().manual_seed(0)
    x = (torch.randn(*shape, generator=g) * 3).requires_grad_()
    norm = Qwen3RMSNorm(shape[-1], eps=1e-6)
    with torch.no_grad():
        norm.weight.copy_(torch.randn(shape[-1], generator=g))
    dy = torch.randn(*shape, generator=g)

    ref = norm(x)
    ref_dx, ref_dw = torch.autograd.grad(ref, (x, norm.weight), dy)
    out = rms_norm(x, norm.weight, norm.variance_epsilon)
    dx, dw = torch.autograd.grad(out, (x, norm.weight), dy)

    assert torch.equal(out, ref)  # same ops in the same order
    torch.testing.assert_close(dx, ref_dx, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(dw, ref_dw, rtol=1e-5, atol=1e-5)


def test_gradcheck_fp64():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(4, 5, 8, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(8, generator=g, dtype=torch.float64, requires_grad=True)
    assert torch.autograd.gradcheck(lambda a, b: rms_norm(a, b, 1e-6), (x, w))


def test_frozen_weight_and_frozen_input():
    x = torch.randn(2, 3, 8, requires_grad=True)
    w = torch.randn(8)  # a frozen norm (BLD freezes whole decoder blocks)
    (dx,) = torch.autograd.grad(rms_norm(x, w, 1e-6).sum(), (x,))
    (ref,) = torch.autograd.grad(_eager(x, w, 1e-6).sum(), (x,))
    torch.testing.assert_close(dx, ref, rtol=1e-5, atol=1e-6)
    w2 = torch.randn(8, requires_grad=True)
    (dw,) = torch.autograd.grad(rms_norm(x.detach(), w2, 1e-6).sum(), (w2,))
    torch.testing.assert_close(dw, (x.detach() * torch.rsqrt(x.detach().pow(2).mean(-1, keepdim=True) + 1e-6))
                               .reshape(-1, 8).sum(0), rtol=1e-5, atol=1e-5)


def _tiny_qwen3(seed=0):
    return tiny_qwen3(seed=seed, vocab_size=97, max_position_embeddings=64, tie_word_embeddings=True)


def test_fuse_a_model_same_loss_and_grads_then_restore():
    ref, fused = _tiny_qwen3(), _tiny_qwen3()
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(3))
    keys = list(fused.state_dict())
    restore = fuse_rms_norms(fused)
    names = [type(m).__name__ for m in fused.modules()]
    # per layer input, post-attention, q and k norms, plus the final norm
    assert names.count("FusedQwen3RMSNorm") == 2 * 4 + 1 and "Qwen3RMSNorm" not in names
    assert list(fused.state_dict()) == keys

    loss_ref = ref(input_ids=ids, labels=ids).loss
    loss_ref.backward()
    loss = fused(input_ids=ids, labels=ids).loss
    loss.backward()
    assert torch.equal(loss, loss_ref)  # the forward is bit-identical
    for (n, p), (_, q) in zip(ref.named_parameters(), fused.named_parameters()):
        torch.testing.assert_close(q.grad, p.grad, rtol=1e-4, atol=1e-6, msg=n)

    restore()
    assert [type(m).__name__ for m in fused.modules()].count("Qwen3RMSNorm") == 9
    assert all(not type(m).__name__.startswith("Fused") for m in fused.modules())


def test_only_the_named_norms_are_swapped_and_no_grad_takes_the_original():
    class OtherNorm(nn.Module):  # e.g. Gemma's 1 + w norm: another formula, must stay as it is
        def __init__(self):
            super().__init__()
            self.weight = nn.Parameter(torch.zeros(8))

    model = nn.ModuleList([SmolLM3RMSNorm(8), OtherNorm()])
    assert "SmolLM3RMSNorm" in FUSABLE
    fuse_rms_norms(model)
    assert type(model[0]).__name__ == "FusedSmolLM3RMSNorm" and type(model[1]) is OtherNorm
    assert isinstance(model[0], SmolLM3RMSNorm)
    x = torch.randn(2, 8)
    with torch.no_grad():
        assert model[0](x).grad_fn is None
    assert type(model[0](x.requires_grad_()).grad_fn).__name__ == "_RMSNormFunctionBackward"
    assert type(model[0](x.detach().bfloat16()).grad_fn).__name__ != "_RMSNormFunctionBackward"  # bf16: original


def test_environment_switch_turns_it_off(monkeypatch):
    monkeypatch.setenv("HYBRIDLAB_FUSED_RMSNORM", "0")
    model = nn.ModuleList([Qwen3RMSNorm(8)])
    fuse_rms_norms(model)()
    assert type(model[0]) is Qwen3RMSNorm
    monkeypatch.setenv("HYBRIDLAB_FUSED_RMSNORM", "1")
    fuse_rms_norms(model)
    assert type(model[0]).__name__ == "FusedQwen3RMSNorm"

"""The chunked KL on CUDA under bf16 autocast computes fp32 logits from the bf16 operands (no bf16 rounding of
the logits), so a small KL is measured without the ~1e-3 nat floor that rounded logits put under it."""

import pytest
import torch

from hybridlab.train.losses import Projected, kl_forward_chunked

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def _kl(zt, zs):
    lt, ls = zt.float().log_softmax(-1), zs.float().log_softmax(-1)
    return (lt.exp() * (lt - ls)).sum(-1).mean()


@pytest.mark.parametrize("vocab_chunk", [None, 1000])
def test_kl_under_bf16_autocast_uses_fp32_logits_of_bf16_operands(vocab_chunk):
    g = torch.Generator().manual_seed(0)
    N, D, V = 256, 256, 4096
    th, tw = torch.randn(N, D, generator=g), torch.randn(V, D, generator=g)  # logits of std ~16
    sh, sw = th + 1e-3 * torch.randn(N, D, generator=g), tw + 1e-3 * torch.randn(V, D, generator=g)
    th, tw, sh, sw = (t.cuda() for t in (th, tw, sh, sw))
    bf = [t.bfloat16().float() for t in (th, tw, sh, sw)]  # the operands the bf16 GEMM sees
    exact = _kl(bf[0] @ bf[1].T, bf[2] @ bf[3].T)  # fp32 products of the bf16 operands
    rounded = _kl((bf[0] @ bf[1].T).bfloat16(), (bf[2] @ bf[3].T).bfloat16())  # bf16-rounded logits

    with torch.autocast("cuda", dtype=torch.bfloat16):
        got = kl_forward_chunked(Projected(th, tw), Projected(sh, sw), chunk_tokens=64, vocab_chunk=vocab_chunk)
    assert abs(float(rounded - exact)) > 10 * abs(float(got - exact))  # rounding is visible at this KL
    assert float(got) == pytest.approx(float(exact), rel=1e-2, abs=1e-6)

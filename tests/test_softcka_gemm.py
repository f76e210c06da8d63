"""The optimised exact SoftCKA Gram (padded blocks, augmented GEMM, exp2, oneDNN) against float64 references."""

import math

import pytest
import torch

from hybridlab.eval import softcka
from hybridlab.eval.softcka import rff_sentence_gram, sentence_gram


def _sets(n=30, dim=24, seed=0, lo=1, hi=12):
    g = torch.Generator().manual_seed(seed)
    lengths = torch.randint(lo, hi, (n,), generator=g)
    z = torch.randn(n, dim, generator=g)
    flat = torch.cat([z[i] + 0.7 * torch.randn(int(k), dim, generator=g) for i, k in enumerate(lengths)])
    off = torch.zeros(n + 1, dtype=torch.long)
    off[1:] = lengths.cumsum(0)
    return flat, off


def _reference(flat, off, sigma):
    """Mean RBF kernel over token pairs, float64, straight from the definition."""
    x = flat.double()
    d2 = torch.cdist(x, x).pow(2)
    e = torch.exp(-d2 / (2 * sigma ** 2))
    n = off.numel() - 1
    K = torch.empty(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            K[i, j] = e[off[i]:off[i + 1], off[j]:off[j + 1]].mean()
    return K


@pytest.mark.parametrize("block_tokens", [1, 16, 64, 10_000])
def test_padded_blocks_match_the_float64_definition(block_tokens):
    flat, off = _sets()
    K, sigma = sentence_gram(flat, off, block_tokens=block_tokens)
    assert torch.allclose(K, _reference(flat, off, sigma), atol=2e-6, rtol=0)
    assert torch.equal(K, K.T)


def test_padded_blocks_keep_every_sentence_and_bound_the_padding():
    lengths = [3, 9, 1, 9, 4, 4, 12, 2]
    blocks = softcka._padded_blocks(lengths, 20)
    assert sorted(i for b in blocks for i in b) == list(range(len(lengths)))
    for b in blocks:
        width = lengths[b[0]]
        assert width == max(lengths[i] for i in b)  # the first sentence is the longest
        assert len(b) == 1 or len(b) * width <= 20


def test_onednn_and_plain_gemm_paths_agree(monkeypatch):
    flat, off = _sets(n=40, dim=32, seed=1)
    K1, s1 = sentence_gram(flat, off, block_tokens=64)
    R1, _ = rff_sentence_gram(flat, off, 256, seed=0)
    monkeypatch.setattr(softcka, "_onednn_gemm_available", lambda dev: False)
    K2, s2 = sentence_gram(flat, off, block_tokens=64)
    R2, _ = rff_sentence_gram(flat, off, 256, seed=0)
    assert s1 == s2
    assert torch.allclose(K1, K2, atol=1e-6, rtol=0) and torch.allclose(R1, R2, atol=1e-6, rtol=0)


def test_far_tokens_and_large_norm_outliers_stay_accurate():
    """Outlier tokens far from everything (their kernel terms underflow to 0, where torch.exp is slow
    and a factored exp(2ab) would overflow) and two large-norm near-duplicates (cancellation)."""
    flat, off = _sets(n=12, dim=16, seed=2)
    sigma = sentence_gram(flat, off)[1]
    flat = flat.clone()
    flat[0] += 10 * sigma  # a sentence-initial "massive activation", ~40 sigma from everything
    flat[5, 3] += 40 * sigma
    flat[6, 3] += 40 * sigma  # same direction as token 5: near each other, far from the rest
    K, s = sentence_gram(flat, off, sigma=sigma, block_tokens=32)
    ref = _reference(flat, off, s)
    assert torch.isfinite(K).all()
    assert torch.allclose(K, ref, atol=2e-5, rtol=0)


def test_rff_gram_still_matches_its_feature_definition():
    flat, off = _sets(n=10, dim=8, seed=3)
    K, sigma = rff_sentence_gram(flat, off, 64, seed=5, orthogonal=False)
    w = softcka._rff_weights(8, 32, 5, False).double() / sigma
    x = (flat.double() - flat.double().mean(0))
    proj = x @ w
    phi_tok = torch.cat([proj.cos(), proj.sin()], 1) / math.sqrt(32)
    phi = torch.stack([phi_tok[off[i]:off[i + 1]].mean(0) for i in range(10)])
    assert torch.allclose(K, phi @ phi.T, atol=1e-5, rtol=0)

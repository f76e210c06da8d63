"""The optimised exact SoftCKA Gram (deduplicated rows, augmented GEMM, exp2, oneDNN) against float64 references."""

import math

import pytest
import torch

from hybridlab.eval import softcka_gram
from hybridlab.eval.softcka_gram import rff_sentence_gram, sentence_gram


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
def test_blocks_match_the_float64_definition(block_tokens):
    flat, off = _sets()
    K, sigma = sentence_gram(flat, off, block_tokens=block_tokens)
    assert torch.allclose(K, _reference(flat, off, sigma), atol=2e-6, rtol=0)
    assert torch.equal(K, K.T)


def test_onednn_and_plain_gemm_paths_agree(monkeypatch):
    flat, off = _sets(n=40, dim=32, seed=1)
    K1, s1 = sentence_gram(flat, off, block_tokens=64)
    R1, _ = rff_sentence_gram(flat, off, 256, seed=0)
    monkeypatch.setattr(softcka_gram, "_onednn_gemm_available", lambda dev: False)
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
    w = softcka_gram._rff_weights(8, 32, 5, False).double() / sigma
    x = (flat.double() - flat.double().mean(0))
    proj = x @ w
    phi_tok = torch.cat([proj.cos(), proj.sin()], 1) / math.sqrt(32)
    phi = torch.stack([phi_tok[off[i]:off[i + 1]].mean(0) for i in range(10)])
    assert torch.allclose(K, phi @ phi.T, atol=1e-5, rtol=0)


def _sets_with_shared_vectors():
    """Token sets where many rows repeat across sentences, as a causal model's states do: sentences that
    share a prefix, a sentence repeated verbatim, one made only of shared rows, repeats within a sentence."""
    g = torch.Generator().manual_seed(4)
    pool = torch.randn(6, 16, generator=g)  # "prefix states" reused by several sentences
    sets = []
    for i in range(24):
        n_prefix, n_own = i % 4, 1 + i % 5
        sets.append(torch.cat([pool[:n_prefix], pool[i % 6:i % 6 + 1].repeat(i % 2, 1),
                               torch.randn(n_own, 16, generator=g) + pool[i % 3]]))
    sets.append(sets[5].clone())  # a duplicate sentence
    sets.append(pool[[1, 4, 4]])  # only shared rows, one of them twice
    own = torch.randn(2, 16, generator=g)
    sets.append(own[[0, 1, 0]])  # a vector repeated within its sentence only
    return sets


@pytest.mark.parametrize("block_tokens", [1, 5, 40, 10_000])
def test_shared_vectors_are_counted_like_every_other_token(block_tokens):
    sets = _sets_with_shared_vectors()
    flat = torch.cat(sets)
    off = torch.zeros(len(sets) + 1, dtype=torch.long)
    off[1:] = torch.tensor([len(s) for s in sets]).cumsum(0)
    vec = softcka_gram._distinct_rows(flat)
    assert vec.unique().numel() < flat.shape[0] - 20  # the shared-vector path is really exercised
    K, sigma = sentence_gram(flat, off, block_tokens=block_tokens)
    assert torch.allclose(K, _reference(flat, off, sigma), atol=2e-6, rtol=0)
    assert torch.equal(K, K.T)
    assert torch.allclose(K[5], K[-3], atol=1e-7, rtol=0)  # the duplicate sentence


def test_distinct_rows_merges_exactly_the_bit_identical_rows():
    g = torch.Generator().manual_seed(5)
    base = torch.randn(7, 8, generator=g)
    x = base[torch.randint(0, 7, (40,), generator=g)].clone()
    x[3, 2] = torch.nextafter(x[3, 2], torch.tensor(float("inf")))  # one ulp away from its twin
    # rows 10 and 11 differ only far below the float64 projection's precision, so their projections
    # collide: the row comparison must still tell them apart
    x[10] = 0.0
    x[10, 0] = 1e30
    x[11] = x[10]
    x[11, 5] = 1e-10
    vec = softcka_gram._distinct_rows(x)
    same = (x[:, None, :] == x[None, :, :]).all(-1)
    assert torch.equal(vec[:, None] == vec[None, :], same)
    assert vec[10] != vec[11]


@pytest.mark.parametrize("block_tokens", [3, 1024])
def test_layout_counts_every_token_once(block_tokens):
    sets = _sets_with_shared_vectors()
    flat = torch.cat(sets)
    lengths = torch.tensor([len(s) for s in sets])
    row, blocks = softcka_gram._gram_layout(flat, lengths, block_tokens)
    distinct = torch.unique(flat, dim=0)
    assert row.numel() == distinct.shape[0]  # one row per distinct vector
    # naive [sentence, distinct vector] occurrence counts vs the blocks' count matrices
    sent = torch.repeat_interleave(torch.arange(len(sets)), lengths)
    member = (flat[:, None, :] == distinct[None, :, :]).all(-1).float()  # [T, V]
    expected = torch.zeros(len(sets), distinct.shape[0]).index_add_(0, sent, member)
    got = torch.zeros(len(sets), row.numel())
    for b in blocks:
        assert b.stop - b.start <= block_tokens
        got[b.lo:b.hi, b.start:b.stop] += b.counts.to_dense()
    col = (flat[row][:, None, :] == distinct[None, :, :]).all(-1).float().argmax(1)  # layout row -> vector
    assert torch.equal(got, expected[:, col])
    assert blocks[0].start == 0 and blocks[-1].stop == row.numel()  # the blocks tile the rows
    assert all(a.stop == b.start for a, b in zip(blocks, blocks[1:]))


@pytest.mark.parametrize("onednn", [True, False])
def test_kernel_values_below_the_smallest_normal_float_count_as_it(monkeypatch, onednn):
    """exp2's argument is clamped at -126 (denormal results are slow on Intel CPUs): tokens ~20 sigma apart,
    whose kernel exp(-200) underflows fp32, contribute exactly 2^-126 (the float64 definition: ~1e-87)."""
    if not onednn:
        monkeypatch.setattr(softcka_gram, "_onednn_gemm_available", lambda dev: False)
    flat = torch.zeros(4, 3)
    flat[1, 0], flat[2, 1], flat[3, 2] = 20.0, 20.0, 20.0  # one-token sentences, pairwise >= 20 apart
    off = torch.arange(5)
    K, _ = sentence_gram(flat, off, sigma=1.0)
    # self-distance ~0 up to the expansion's cancellation, ~1e-7 (|a|^2 + |b|^2) in bandwidth units (module docstring)
    assert torch.allclose(K.diagonal(), torch.ones(4, dtype=torch.float64), atol=1e-4, rtol=0)
    off_diag = K[~torch.eye(4, dtype=torch.bool)]
    assert torch.equal(off_diag, torch.full_like(off_diag, 2.0 ** softcka_gram.MIN_LOG2_KERNEL))

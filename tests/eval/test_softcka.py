import math

import pytest
import torch

from hybridlab.errors import HybridlabError
from hybridlab.eval.softcka import (
    center_gram,
    cka_from_grams,
    flatten_sets,
    language_offset,
    median_sigma,
    offset_bootstrap,
    pair_alignment,
    pair_alignment_gram_rows,
    pooled_pair_alignment,
    rff_error_bound,
    rff_sentence_gram,
    sentence_gram,
    soft_cka,
)


def _structured_sets(n_sent=40, dim=16, seed=0, lo=3, hi=9, latent_scale=1.5):
    """Sentences whose tokens share a per-sentence latent direction (so sentences differ in meaning)."""
    g = torch.Generator().manual_seed(seed)
    z = torch.randn(n_sent, dim, generator=g) * latent_scale
    sets = []
    for i in range(n_sent):
        n = int(torch.randint(lo, hi, (1,), generator=g))
        sets.append(z[i] + torch.randn(n, dim, generator=g))
    return sets, z


def _brute_gram(sets, sigma):
    n = len(sets)
    K = torch.zeros(n, n, dtype=torch.float64)
    for i in range(n):
        for j in range(n):
            total = 0.0
            for a in sets[i].double():
                for b in sets[j].double():
                    total += math.exp(-float(((a - b) ** 2).sum()) / (2 * sigma**2))
            K[i, j] = total / (len(sets[i]) * len(sets[j]))
    return K


def _retokenise(sets, seed):
    """Same content, different tokenisation: merge random neighbour pairs (mean) or split a token in two."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for s in sets:
        rows, t = [], 0
        while t < len(s):
            r = float(torch.rand(1, generator=g))
            if r < 0.3 and t + 1 < len(s):
                rows.append((s[t] + s[t + 1]) / 2)
                t += 2
            elif r < 0.5:
                rows += [s[t], s[t]]
                t += 1
            else:
                rows.append(s[t])
                t += 1
        out.append(torch.stack(rows))
    return out


def test_sentence_gram_matches_brute_force_double_loop_across_block_sizes():
    sets, _ = _structured_sets(n_sent=12, dim=5, seed=1, lo=1, hi=6)
    flat, off = flatten_sets(sets)
    sigma = median_sigma(flat)
    K_ref = _brute_gram(sets, sigma)
    for block_tokens in (1, 7, 4096):  # 1 -> one sentence per block; 7 -> mixed blocks; 4096 -> one block
        K, s = sentence_gram(flat, off, block_tokens=block_tokens)
        assert s == pytest.approx(sigma)
        torch.testing.assert_close(K, K_ref, atol=2e-6, rtol=1e-5)
    assert K_ref[0, 0] > K_ref[0, 1]  # the reference itself is not degenerate


def test_median_sigma_uses_all_pairs_when_few_and_a_close_sample_when_many():
    x = torch.randn(50, 4, generator=torch.Generator().manual_seed(0))
    assert median_sigma(x) == pytest.approx(float(torch.pdist(x).median()))
    y = torch.randn(3000, 4, generator=torch.Generator().manual_seed(1))
    exact = float(torch.pdist(y).median())
    sampled = median_sigma(y, median_pairs=20_000, seed=3)
    assert sampled != exact and abs(sampled - exact) / exact < 0.02
    assert median_sigma(y, median_pairs=20_000, seed=3) == sampled  # seeded


def test_cka_from_grams_matches_trace_formula_with_explicit_centring():
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(7, 3, generator=g, dtype=torch.float64), torch.randn(7, 4, generator=g, dtype=torch.float64)
    K, L = A @ A.T, B @ B.T
    H = torch.eye(7, dtype=torch.float64) - 1.0 / 7
    hsic = lambda P, Q: torch.trace(P @ H @ Q @ H)  # noqa: E731
    expected = float(hsic(K, L) / torch.sqrt(hsic(K, K) * hsic(L, L)))
    assert cka_from_grams(K, L) == pytest.approx(expected, rel=1e-10)
    assert cka_from_grams(center_gram(K), center_gram(L), centered=True) == pytest.approx(expected, rel=1e-10)
    # linear CKA of linear kernels is the feature-space formula ||Y^T X||^2 / (||X^T X|| ||Y^T Y||)
    Ac, Bc = A - A.mean(0), B - B.mean(0)
    feat = float((Bc.T @ Ac).norm() ** 2 / ((Ac.T @ Ac).norm() * (Bc.T @ Bc).norm()))
    assert cka_from_grams(K, L) == pytest.approx(feat, rel=1e-10)


def test_identical_inputs_give_one_for_exact_and_rff():
    sets, _ = _structured_sets()
    for method in ("exact", "rff"):
        r = soft_cka(sets, [s.clone() for s in sets], method=method, n_features=256)
        assert r.cka == pytest.approx(1.0, abs=1e-9)
        assert r.cka_debiased == pytest.approx(1.0, abs=1e-9)
        assert r.alignment == pytest.approx(1.0, abs=1e-9)


def test_cka_invariant_to_rotation_and_isotropic_scaling_of_one_language():
    sets, _ = _structured_sets(seed=2)
    x_sets = _retokenise(sets, seed=5)
    base = soft_cka(sets, x_sets)
    Q, _ = torch.linalg.qr(torch.randn(16, 16, generator=torch.Generator().manual_seed(9)))
    moved = soft_cka(sets, [7.5 * s @ Q for s in x_sets])
    assert moved.sigma_x == pytest.approx(7.5 * base.sigma_x, rel=1e-5)
    assert moved.cka == pytest.approx(base.cka, abs=1e-6)
    assert moved.alignment_gram_rows == pytest.approx(base.alignment_gram_rows, abs=1e-6)
    assert moved.cka_debiased == pytest.approx(base.cka_debiased, abs=1e-6)
    # the defined alignment compares both languages in ONE space: moving one language breaks it, moving
    # both together (same rotation and scale) does not
    assert moved.alignment < base.alignment - 0.5
    both = soft_cka([7.5 * s @ Q for s in sets], [7.5 * s @ Q for s in x_sets])
    assert both.alignment == pytest.approx(base.alignment, abs=1e-6)
    assert both.sigma_pair == pytest.approx(7.5 * base.sigma_pair, rel=1e-5)


def test_different_tokenisation_is_handled_and_shuffling_lowers_similarity():
    sets, _ = _structured_sets(n_sent=40, seed=3)
    x_sets = _retokenise(sets, seed=11)
    assert [len(s) for s in x_sets] != [len(s) for s in sets]
    aligned = soft_cka(sets, x_sets)
    perm = torch.randperm(len(sets), generator=torch.Generator().manual_seed(0)).tolist()
    shuffled = soft_cka(sets, [x_sets[i] for i in perm])
    assert aligned.cka > 0.9
    assert shuffled.cka < aligned.cka - 0.3
    assert shuffled.alignment < aligned.alignment - 0.5
    assert abs(shuffled.cka_debiased) < 0.15 < aligned.cka_debiased


def test_debiased_cka_is_near_zero_for_unrelated_data_while_plain_cka_is_biased_up():
    a, _ = _structured_sets(n_sent=60, seed=4)
    b, _ = _structured_sets(n_sent=60, seed=5)
    r = soft_cka(a, b)
    assert r.cka > 0.1
    assert abs(r.cka_debiased) < 0.1


def test_plain_cka_is_biased_upward_on_independent_random_sets_at_n64():
    # independent i.i.d. token sets (no shared structure at all), seeded: the plain estimator is clearly
    # positive at N = 64, the debiased one is ~0
    g = torch.Generator().manual_seed(11)
    a = [torch.randn(int(torch.randint(3, 9, (1,), generator=g)), 8, generator=g) for _ in range(64)]
    b = [torch.randn(int(torch.randint(3, 9, (1,), generator=g)), 8, generator=g) for _ in range(64)]
    r = soft_cka(a, b)
    assert r.cka > 0.05
    assert abs(r.cka_debiased) < 0.04  # 0.209 plain vs 0.022 debiased here
    assert r.cka - r.cka_debiased > 0.05


# --- pair alignment: the defined kernel-mean-embedding cosine vs the Gram-row variant -------------------

# 3 translation pairs, 1-2 token vectors in 2-D per sentence
TOY_EN = [torch.tensor([[0.0, 0.0]]), torch.tensor([[1.0, 0.0], [1.0, 1.0]]), torch.tensor([[0.0, 2.0]])]
TOY_X = [torch.tensor([[0.0, 0.5], [0.5, 0.0]]), torch.tensor([[1.5, 0.5]]), torch.tensor([[-0.5, 2.0], [0.0, 1.5]])]


def _naive_set_kernel(A, B, sigma):
    total = 0.0
    for a in A.tolist():
        for b in B.tolist():
            total += math.exp(-((a[0] - b[0]) ** 2 + (a[1] - b[1]) ** 2) / (2 * sigma**2))
    return total / (len(A) * len(B))


def _naive_pooled_alignment(en, x, sigma):
    """Per pair, by loops: k~(A, B) = k(A, B) - mean_j k(A, S_j) - mean_j k(S_j, B) + mean_jl k(S_j, S_l)
    over the 2N pooled sets, cos_i = k~(E_i, X_i) / sqrt(k~(E_i, E_i) k~(X_i, X_i))."""
    pooled = list(en) + list(x)
    m = len(pooled)

    def k(A, B):
        return _naive_set_kernel(A, B, sigma)

    grand = sum(k(P, Q) for P in pooled for Q in pooled) / m**2

    def kt(A, B):
        return k(A, B) - sum(k(A, S) for S in pooled) / m - sum(k(S, B) for S in pooled) / m + grand

    return [kt(e, xx) / math.sqrt(kt(e, e) * kt(xx, xx)) for e, xx in zip(en, x)]


def _naive_pair_alignment(en, x, sigma):
    """Per pair, by loops, each language centred on its own sets: k~(A, B) = k(A, B) - mean_{S in lang(B)}
    k(A, S) - mean_{S in lang(A)} k(S, B) + mean_{S in lang(A), T in lang(B)} k(S, T)."""
    def k(A, B):
        return _naive_set_kernel(A, B, sigma)

    def kt(A, LA, B, LB):
        return (k(A, B) - sum(k(A, S) for S in LB) / len(LB) - sum(k(S, B) for S in LA) / len(LA)
                + sum(k(S, T) for S in LA for T in LB) / (len(LA) * len(LB)))

    return [kt(e, en, xx, x) / math.sqrt(kt(e, en, e, en) * kt(xx, x, xx, x)) for e, xx in zip(en, x)]


def _naive_median_distance(sets):
    pts = [p for s in sets for p in s.tolist()]
    d = sorted(math.dist(pts[i], pts[j]) for i in range(len(pts)) for j in range(i + 1, len(pts)))
    return d[(len(d) - 1) // 2]  # torch.median: the lower middle value


def test_pair_alignment_and_pooled_variant_match_naive_loops_on_a_2d_toy():
    sigma = 1.0
    want = _naive_pair_alignment(TOY_EN, TOY_X, sigma)
    want_pooled = _naive_pooled_alignment(TOY_EN, TOY_X, sigma)
    flat, off = flatten_sets(TOY_EN + TOY_X)
    G, _ = sentence_gram(flat, off, sigma)
    assert pair_alignment(G).tolist() == pytest.approx(want, rel=1e-5)
    assert pooled_pair_alignment(G).tolist() == pytest.approx(want_pooled, rel=1e-5)
    # a hand check of one entry of the pooled Gram: k(E_1, X_0) = mean of the four token-pair kernels
    d2 = [(1 - 0) ** 2 + (0 - 0.5) ** 2, (1 - 0.5) ** 2, (1 - 0) ** 2 + (1 - 0.5) ** 2, (1 - 0.5) ** 2 + 1]
    assert float(G[1, 3]) == pytest.approx(sum(math.exp(-v / 2) for v in d2) / 4, rel=1e-6)
    # the old Gram-row cosine is another quantity on the same toy (this test fails on the old definition)
    K, _ = sentence_gram(*flatten_sets(TOY_EN), sigma)
    L, _ = sentence_gram(*flatten_sets(TOY_X), sigma)
    Kc, Lc = center_gram(K), center_gram(L)
    old = []
    for i in range(3):
        keep = [j for j in range(3) if j != i]
        u, v = Kc[i, keep], Lc[i, keep]
        old.append(float(u @ v / (u.norm() * v.norm())))
    old = torch.tensor(old, dtype=torch.float64)
    assert old.tolist() == pytest.approx([0.88138, 0.99249, 0.86471], abs=1e-4)
    assert want_pooled == pytest.approx([0.87343, 0.77009, 0.89591], abs=1e-4)
    assert float((old - torch.tensor(want_pooled, dtype=torch.float64)).abs().max()) > 0.2


def _embedding_gram(mu_E, mu_X):
    """The pooled Gram of explicit kernel mean embeddings (rows: English then language X)."""
    phi = torch.cat([mu_E, mu_X]).double()
    return phi @ phi.T


def test_a_constant_shift_of_one_language_keeps_pair_alignment_and_grows_the_offset():
    # explicit embeddings (a linear kernel's feature space): language X = English rotated a little + noise
    g = torch.Generator().manual_seed(0)
    mu_E = torch.randn(12, 5, generator=g, dtype=torch.float64)
    mu_X = mu_E + 0.3 * torch.randn(12, 5, generator=g, dtype=torch.float64)
    base = _embedding_gram(mu_E, mu_X)
    v = torch.tensor([1.0, -2.0, 0.5, 0.0, 1.0], dtype=torch.float64)
    offsets, pooled = [], []
    for c in (0.0, 1.0, 3.0):
        G = _embedding_gram(mu_E, mu_X + c * v)
        torch.testing.assert_close(pair_alignment(G), pair_alignment(base))
        offsets.append(language_offset(G))
        pooled.append(float(pooled_pair_alignment(G).mean()))
    # hand-computed: MMD = ||mean(mu_E) - mean(mu_X) - c v||; spread^2 = mean squared distance to own mean
    for c, o in zip((0.0, 1.0, 3.0), offsets):
        d = mu_E.mean(0) - (mu_X + c * v).mean(0)
        s2 = (((mu_E - mu_E.mean(0)) ** 2).sum(1).mean() + ((mu_X - mu_X.mean(0)) ** 2).sum(1).mean()) / 2
        assert o.mmd == pytest.approx(float(d.norm()), rel=1e-9)
        assert o.offset == pytest.approx(float(d.norm() / s2.sqrt()), rel=1e-9)
    assert offsets[0].offset < offsets[1].offset < offsets[2].offset
    # the pooled centring mistakes the offset for misalignment
    assert pooled[0] > 0.9 and pooled[2] < pooled[0] - 0.3
    # the per-pair values, by hand: cosine of the mean-removed embeddings
    e, x = mu_E - mu_E.mean(0), mu_X - mu_X.mean(0)
    torch.testing.assert_close(pair_alignment(base), (e * x).sum(1) / (e.norm(dim=1) * x.norm(dim=1)))


def test_pair_alignment_identical_inputs_give_one_and_zero_offset_unrelated_near_zero():
    sets, _ = _structured_sets(n_sent=40, seed=12)
    same = soft_cka(sets, sets)
    assert same.alignment == pytest.approx(1.0, abs=1e-9)
    assert same.alignment_pooled == pytest.approx(1.0, abs=1e-9)
    assert same.language_offset == pytest.approx(0.0, abs=1e-6) and same.mmd == pytest.approx(0.0, abs=1e-6)
    a, _ = _structured_sets(n_sent=40, seed=13)
    b, _ = _structured_sets(n_sent=40, seed=14)
    r = soft_cka(a, b)
    assert abs(r.alignment) < 0.05  # ~0 for unrelated pairs


def test_a_token_shift_of_one_language_moves_the_offset_more_than_the_pair_alignment():
    # the RBF kernel: translating one language's token vectors is not a constant shift of its embeddings,
    # so pair alignment moves too, but far less than the pooled form, while the offset grows
    en, _ = _structured_sets(n_sent=48, seed=3)
    x = _retokenise(en, seed=5)
    rs = [soft_cka(en, [t + c for t in x]) for c in (0.0, 1.0, 2.0)]
    assert rs[0].language_offset < rs[1].language_offset < rs[2].language_offset
    drop_pair = rs[0].alignment - rs[2].alignment
    drop_pooled = rs[0].alignment_pooled - rs[2].alignment_pooled
    assert 0 <= drop_pair < 0.5 * drop_pooled


def test_offset_bootstrap_brackets_its_estimate():
    en, _ = _structured_sets(n_sent=32, seed=6)
    x = [t + 0.8 for t in _retokenise(en, seed=7)]
    r = soft_cka(en, x, n_boot=200)
    assert r.language_offset_lo <= r.language_offset <= r.language_offset_hi
    flat, off = flatten_sets(en + x)
    G, _ = sentence_gram(flat, off, r.sigma_pair)
    ci = offset_bootstrap(G, 50, seed=1)
    assert ci.estimate == pytest.approx(language_offset(G).offset, rel=1e-12)


def test_soft_cka_kme_alignment_uses_one_pooled_bandwidth_and_matches_naive_loops():
    en = TOY_EN + [torch.tensor([[2.0, 2.0]])]  # CKA needs N >= 4
    x = TOY_X + [torch.tensor([[2.0, 1.5], [2.5, 2.0]])]
    r = soft_cka(en, x)
    sigma_pair = _naive_median_distance(en + x)
    assert r.sigma_pair == pytest.approx(sigma_pair, rel=1e-6)
    assert r.alignment_method == "kme" and r.sigma_convention == "median_distance"
    assert r.alignment == pytest.approx(sum(_naive_pair_alignment(en, x, sigma_pair)) / 4, rel=1e-5)
    assert r.alignment_pooled == pytest.approx(sum(_naive_pooled_alignment(en, x, sigma_pair)) / 4, rel=1e-5)
    rows = soft_cka(en, x, alignment="gram_rows")
    assert rows.alignment == rows.alignment_gram_rows == pytest.approx(r.alignment_gram_rows, abs=1e-12)
    assert rows.sigma_pair is None and math.isnan(rows.language_offset) and math.isnan(rows.alignment_pooled)
    assert abs(rows.alignment - r.alignment) > 0.05


def test_pair_alignment_gram_rows_matches_per_row_cosine_without_diagonal():
    g = torch.Generator().manual_seed(0)
    A, B = torch.randn(6, 3, generator=g, dtype=torch.float64), torch.randn(6, 3, generator=g, dtype=torch.float64)
    K, L = A @ A.T, B @ B.T
    Kc, Lc = center_gram(K), center_gram(L)
    got = pair_alignment_gram_rows(K, L)
    for i in range(6):
        keep = [j for j in range(6) if j != i]
        u, v = Kc[i, keep], Lc[i, keep]
        assert float(got[i]) == pytest.approx(float(u @ v / (u.norm() * v.norm())), rel=1e-10)
    torch.testing.assert_close(pair_alignment_gram_rows(K, K), torch.ones(6, dtype=torch.float64))


def test_sigma_conventions_hand_computed_and_recorded():
    # 3 points on a line: distances 1, 2, 3 -> median 2; squared 1, 4, 9 -> median 4 -> sigma = sqrt(2)
    x = torch.tensor([[0.0], [1.0], [3.0]])
    assert median_sigma(x) == pytest.approx(2.0)
    assert median_sigma(x, convention="median_sq_distance") == pytest.approx(math.sqrt(2.0))
    sets, _ = _structured_sets(n_sent=30, seed=15)
    x_sets = _retokenise(sets, seed=3)
    a = soft_cka(sets, x_sets)
    b = soft_cka(sets, x_sets, sigma_convention="median_sq_distance")
    assert b.sigma_convention == "median_sq_distance"
    assert b.sigma_eng == pytest.approx(a.sigma_eng / math.sqrt(2.0), rel=1e-6)
    assert b.cka != a.cka
    with pytest.raises(HybridlabError, match="sigma_convention"):
        soft_cka(sets, x_sets, sigma_convention="mean")


def test_english_gram_reuse_gives_the_same_result():
    sets, _ = _structured_sets(seed=6)
    x_sets = _retokenise(sets, seed=1)
    flat, off = flatten_sets(sets)
    K = sentence_gram(flat, off)
    assert soft_cka(sets, x_sets, eng_gram=K) == soft_cka(sets, x_sets)
    assert soft_cka((flat, off), x_sets) == soft_cka(sets, x_sets)


@pytest.mark.parametrize("orthogonal", [False, True])
def test_rff_gram_error_within_hoeffding_bound_and_shrinks_with_features(orthogonal):
    sets, _ = _structured_sets(n_sent=30, seed=7)
    flat, off = flatten_sets(sets)
    K, sigma = sentence_gram(flat, off)
    errs = {}
    for n_features in (128, 8192):
        K_rff, s = rff_sentence_gram(flat, off, n_features, seed=0, orthogonal=orthogonal)
        assert s == sigma
        errs[n_features] = float((K_rff - K).abs().max())
        assert errs[n_features] <= rff_error_bound(30, n_features, delta=0.01)
    assert errs[8192] < errs[128] / 3  # ~ 1/sqrt(F): a 64x feature increase gives ~8x
    assert rff_error_bound(30, 8192) == pytest.approx(math.sqrt(2 * math.log(2 * 900 / 0.01) / 4096))


def test_rff_soft_cka_close_to_exact():
    sets, _ = _structured_sets(n_sent=40, seed=8)
    x_sets = _retokenise(sets, seed=2)
    exact = soft_cka(sets, x_sets)
    approx = soft_cka(sets, x_sets, method="rff", n_features=4096)
    assert approx.method == "rff"
    assert approx.cka == pytest.approx(exact.cka, abs=0.005)
    assert approx.alignment == pytest.approx(exact.alignment, abs=0.005)


def test_user_errors_are_clear():
    sets, _ = _structured_sets(n_sent=6)
    with pytest.raises(HybridlabError, match="same parallel sentences"):
        soft_cka(sets, sets[:5])
    with pytest.raises(HybridlabError, match="non-empty"):
        soft_cka(sets, sets[:5] + [torch.zeros(0, 16)])
    with pytest.raises(HybridlabError, match="even"):
        soft_cka(sets, sets, method="rff", n_features=7)
    with pytest.raises(HybridlabError, match="unknown SoftCKA method"):
        soft_cka(sets, sets, method="kernel")
    with pytest.raises(HybridlabError, match="identical"):
        median_sigma(torch.ones(10, 3))
    with pytest.raises(HybridlabError, match="unknown pair alignment"):
        soft_cka(sets, sets, alignment="rows")
    with pytest.raises(HybridlabError, match="English token sets"):
        soft_cka((), sets, eng_gram=sentence_gram(*flatten_sets(sets)))
    flat, off = flatten_sets(sets)
    with pytest.raises(HybridlabError, match="offsets"):
        sentence_gram(flat, off[:-1])


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_gram_matches_cpu():
    sets, _ = _structured_sets(n_sent=50, seed=9)
    flat, off = flatten_sets(sets)
    K_cpu, s_cpu = sentence_gram(flat, off, block_tokens=64)
    K_gpu, s_gpu = sentence_gram(flat, off, block_tokens=64, device="cuda")
    assert s_gpu == pytest.approx(s_cpu, rel=1e-5)
    torch.testing.assert_close(K_gpu, K_cpu, atol=1e-5, rtol=1e-4)
    R_cpu, _ = rff_sentence_gram(flat, off, 512, seed=0)
    R_gpu, _ = rff_sentence_gram(flat, off, 512, seed=0, device="cuda")
    torch.testing.assert_close(R_gpu, R_cpu, atol=1e-4, rtol=1e-4)


def test_debiased_cka_equals_the_u_statistic_over_distinct_index_tuples():
    """cka_from_grams(debiased=True) against HSIC's U-statistic written from its definition (Song et al. 2012):
    averages over ordered tuples of distinct indices, (n)_m = n (n-1) ... (n-m+1),
    HSIC_u = mean_{i!=j} K_ij L_ij + mean_{i,j,q,r distinct} K_ij L_qr - 2 mean_{i,j,q distinct} K_ij L_iq."""
    from itertools import permutations

    gen = torch.Generator().manual_seed(7)
    x, y = torch.randn(6, 3, generator=gen, dtype=torch.float64), torch.randn(6, 2, generator=gen, dtype=torch.float64)
    y = y + x[:, :2]  # related, so the value is far from 0
    K, L = x @ x.T, y @ y.T

    def hsic_u(A, B):
        n = A.shape[0]
        pairs = list(permutations(range(n), 2))
        triples = list(permutations(range(n), 3))
        quads = list(permutations(range(n), 4))
        t1 = sum(float(A[i, j] * B[i, j]) for i, j in pairs) / len(pairs)
        t2 = sum(float(A[i, j] * B[q, r]) for i, j, q, r in quads) / len(quads)
        t3 = sum(float(A[i, j] * B[i, q]) for i, j, q in triples) / len(triples)
        return t1 + t2 - 2.0 * t3

    expected = hsic_u(K, L) / math.sqrt(hsic_u(K, K) * hsic_u(L, L))
    assert 0.2 < expected < 1.0
    assert cka_from_grams(K, L, debiased=True) == pytest.approx(expected, rel=1e-10)

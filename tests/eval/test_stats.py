"""hybridlab.eval.stats against hand-computed values on toy data (and naive references where a value
depends on random draws)."""

import itertools
import math

import numpy as np
import polars as pl
import pytest
import torch

from hybridlab.errors import HybridlabError
from hybridlab.eval import stats as S

Z = 1.959963984540054  # 0.975 normal quantile


# --- Wilson ---------------------------------------------------------------------------------------


def test_wilson_hand_computed():
    ci = S.wilson_interval(8, 10)
    assert (round(ci.lo, 4), round(ci.hi, 4)) == (0.4902, 0.9433) and ci.estimate == 0.8
    # 10/20 (a NIAH cell of 20 examples): centre 0.5, half z sqrt(0.0125 + z^2/1600) / (1 + z^2/20) = 0.2007
    ci = S.wilson_interval(10, 20)
    assert ci.lo == pytest.approx(0.5 - 0.20070, abs=1e-4) and ci.hi == pytest.approx(0.5 + 0.20070, abs=1e-4)


def test_wilson_edges():
    lo0 = S.wilson_interval(0, 10)
    assert lo0.lo == 0.0 and lo0.hi == pytest.approx(Z**2 / (10 + Z**2))  # 0.2775
    hi = S.wilson_interval(10, 10)
    assert hi.hi == 1.0 and hi.lo == pytest.approx(10 / (10 + Z**2))  # 0.7225
    # a narrower level gives a narrower interval
    assert S.wilson_interval(8, 10, level=0.5).hi < S.wilson_interval(8, 10).hi


@pytest.mark.parametrize("args,match", [((0, 0), "n >= 1"), ((11, 10), "exceed"), ((-1, 10), "successes"),
                                        ((2.5, 10), "integer"), ((1, 10, 1.5), "level")])
def test_wilson_errors(args, match):
    with pytest.raises(HybridlabError, match=match):
        S.wilson_interval(*args)


# --- t quantile and seed spread -------------------------------------------------------------------


@pytest.mark.parametrize("p,df,want", [(0.975, 1, 12.7062), (0.975, 2, 4.3027), (0.975, 3, 3.1824),
                                       (0.975, 4, 2.7764), (0.975, 5, 2.5706), (0.975, 10, 2.2281),
                                       (0.975, 30, 2.0423), (0.95, 5, 2.0150), (0.995, 3, 5.8409),
                                       (0.975, 1000, 1.9623), (0.975, 5000, 1.9604)])
def test_t_quantile_table_values(p, df, want):
    assert round(S.t_quantile(p, df), 4) == want
    assert S.t_quantile(1 - p, df) == pytest.approx(-S.t_quantile(p, df))


def test_t_quantile_closed_forms():
    for p in (0.6, 0.9, 0.99):
        assert S.t_quantile(p, 1) == pytest.approx(math.tan(math.pi * (p - 0.5)), rel=1e-10)  # Cauchy
        assert S.t_quantile(p, 2) == pytest.approx((2 * p - 1) / math.sqrt(2 * p * (1 - p)), rel=1e-10)
    assert S.t_quantile(0.5, 7) == 0.0
    # the Cornish-Fisher branch (df > 1000) agrees with the exact series inverted by bisection
    lo, hi = 0.0, math.pi / 2
    for _ in range(100):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if S._t_two_sided_mass(mid, 1001) < 0.95 else (lo, mid)
    assert S.t_quantile(0.975, 1001) == pytest.approx(math.sqrt(1001) * math.tan(lo), abs=1e-9)
    with pytest.raises(HybridlabError, match="df"):
        S.t_quantile(0.975, 0)


def test_seed_spread_hand_computed():
    sp = S.seed_spread([1.0, 2.0, 3.0])
    half = 4.302652729749464 / math.sqrt(3)  # t_{0.975,2} * std(=1) / sqrt(3)
    assert (sp.n, sp.mean, sp.std, sp.min, sp.max) == (3, 2.0, 1.0, 1.0, 3.0)
    assert sp.lo == pytest.approx(2 - half) and sp.hi == pytest.approx(2 + half)
    assert S.seed_spread({0: 3.0, 1: 1.0, 2: 2.0}) == sp  # {seed: value}
    cols = sp.columns("ce")
    assert cols["ce"] == 2.0 and cols["ce_n_seeds"] == 3 and cols["ce_lo"] == sp.lo


def test_seed_spread_single_seed_and_errors():
    one = S.seed_spread([0.7])
    assert one.mean == 0.7 and one.n == 1 and math.isnan(one.std) and math.isnan(one.lo)
    with pytest.raises(HybridlabError, match="at least 1"):
        S.seed_spread([])
    with pytest.raises(HybridlabError, match="NaN"):
        S.seed_spread([1.0, float("nan")])


# --- sign test ------------------------------------------------------------------------------------


def test_sign_test_hand_computed():
    r = S.sign_test([1.0] * 9 + [-0.5])
    assert r.p_value == 22 / 1024 and r.statistic == 9 and r.n == 10 and r.n_ties == 0  # 2 (1 + 10) / 2^10
    tied = S.sign_test([0.3] * 9 + [-0.5, 0.0, 0.0])  # ties dropped: the same 9 of 10
    assert tied.p_value == 22 / 1024 and tied.n == 10 and tied.n_ties == 2
    assert S.sign_test([2.0] * 5).p_value == 2 / 32
    assert S.sign_test([1.0, -1.0]).p_value == 1.0  # 2 * 3/4 capped at 1
    assert S.sign_test([0.0, 0.0]).p_value == 1.0
    assert S.sign_test(torch.tensor([1.0, 2.0, 3.0])).p_value == 2 / 8


def test_sign_test_matches_naive_binomial():
    rng = np.random.default_rng(3)
    d = rng.normal(0.3, 1, size=17)
    pos, m = int((d > 0).sum()), 17
    # two-sided: total probability of outcomes no more likely than the observed one (symmetric binomial)
    probs = [math.comb(m, i) / 2**m for i in range(m + 1)]
    naive = sum(p for p in probs if p <= probs[pos] * (1 + 1e-12))
    assert S.sign_test(d).p_value == pytest.approx(min(1.0, naive))


# --- paired permutation ---------------------------------------------------------------------------


def test_permutation_hand_computed():
    # d = (1, 2, 3, -1), sum 5: |sum| >= 5 needs the flipped magnitudes to sum <= 1 ({}, {1}, {1'}) or,
    # mirrored, >= 6: 6 of 16 sign vectors
    r = S.paired_permutation_test([1, 2, 3, -1], [0, 0, 0, 0])
    assert r.p_value == 6 / 16 and r.statistic == 1.25 and r.method.endswith("(exact)")
    assert S.paired_permutation_test([2, 3, 4, 5], [1, 1, 1, 1]).p_value == 2 / 16  # all the same sign
    assert S.paired_permutation_test([1, 1], [1, 1]).p_value == 1.0


def test_permutation_exact_matches_naive_enumeration():
    rng = np.random.default_rng(0)
    a, b = rng.normal(0.4, 1, 10), rng.normal(0, 1, 10)
    d = a - b
    naive = np.mean([abs(np.dot(s, d)) >= abs(d.sum()) - 1e-12 for s in itertools.product([1, -1], repeat=10)])
    assert S.paired_permutation_test(a, b).p_value == pytest.approx(naive)


def test_permutation_monte_carlo_close_to_exact_and_deterministic():
    rng = np.random.default_rng(1)
    a, b = rng.normal(0.5, 1, 12), rng.normal(0, 1, 12)
    exact = S.paired_permutation_test(a, b).p_value
    mc = S.paired_permutation_test(a, b, n_perm=20000, seed=5, exact_max=0)
    assert mc.method.startswith("sign-flip permutation (20000")
    assert abs(mc.p_value - exact) < 4 * math.sqrt(exact * (1 - exact) / 20000) + 1e-4
    assert S.paired_permutation_test(a, b, n_perm=20000, seed=5, exact_max=0) == mc
    huge = S.paired_permutation_test(np.full(40, 5.0) + np.arange(40), np.zeros(40), n_perm=999, exact_max=0)
    assert huge.p_value == 1 / 1000  # never 0: (1 + 0) / (1 + n_perm)


def test_permutation_errors():
    with pytest.raises(HybridlabError, match="paired"):
        S.paired_permutation_test([1, 2], [1, 2, 3])
    with pytest.raises(HybridlabError, match="exact_max"):
        S.paired_permutation_test([1, 2], [0, 0], exact_max=30)


# --- bootstrap ------------------------------------------------------------------------------------


def test_bootstrap_two_points_hand_computed():
    # resample means of (0, 1): 0, 0.5, 1 with probabilities 1/4, 1/2, 1/4
    assert S.bootstrap_ci([0.0, 1.0], level=0.4, n_boot=4000).columns("m") == {"m": 0.5, "m_lo": 0.5, "m_hi": 0.5}
    wide = S.bootstrap_ci([0.0, 1.0], n_boot=4000)
    assert (wide.lo, wide.hi) == (0.0, 1.0)
    # a non-vectorised statistic: max is 0 with probability 1/4, else 1
    mx = S.bootstrap_ci([0.0, 1.0], stat=lambda x: float(np.max(x)), n_boot=4000, level=0.4)
    assert (mx.estimate, mx.lo, mx.hi) == (1.0, 1.0, 1.0)
    assert S.bootstrap_ci([0.0, 1.0], stat=lambda x: float(np.max(x)), n_boot=4000).lo == 0.0
    const = S.bootstrap_ci(np.full(7, 2.5))
    assert (const.lo, const.hi) == (2.5, 2.5)


def test_bootstrap_equals_naive_loop_and_is_deterministic():
    x = np.random.default_rng(2).exponential(size=50)
    ci = S.bootstrap_ci(x, n_boot=300, seed=11)
    rng = np.random.default_rng(11)
    reps = [x[rng.integers(0, 50, size=50)].mean() for _ in range(300)]
    assert ci.lo == pytest.approx(np.quantile(reps, 0.025), rel=1e-12)
    assert ci.hi == pytest.approx(np.quantile(reps, 0.975), rel=1e-12) and ci.estimate == pytest.approx(x.mean())
    assert S.bootstrap_ci(x, n_boot=300, seed=11) == ci and S.bootstrap_ci(x, n_boot=300, seed=12) != ci
    via_idx = S.bootstrap_ci_indices(50, lambda i: x[i].mean(), n_boot=300, seed=11)
    assert (via_idx.lo, via_idx.hi) == pytest.approx((ci.lo, ci.hi), rel=1e-12)


def test_bootstrap_mean_matches_normal_theory():
    x = np.random.default_rng(4).normal(size=1000)
    ci = S.bootstrap_ci(x, n_boot=2000)
    se = x.std(ddof=1) / math.sqrt(1000)
    assert ci.hi - ci.lo == pytest.approx(2 * Z * se, rel=0.1)


def test_bootstrap_paired():
    b = np.random.default_rng(5).normal(size=30)
    shifted = S.bootstrap_ci(b + 1.0, paired_with=b)
    assert shifted.estimate == pytest.approx(1.0) and shifted.method.endswith("(paired)")
    assert (shifted.lo, shifted.hi) == pytest.approx((1.0, 1.0))  # same indices: the difference never moves
    # correlated arms: the paired CI of the difference is much narrower than one arm's own CI
    a = b + np.random.default_rng(6).normal(0.2, 0.1, size=30)
    paired, alone = S.bootstrap_ci(a, paired_with=b), S.bootstrap_ci(a)
    assert paired.hi - paired.lo < 0.25 * (alone.hi - alone.lo) and paired.lo > 0
    with pytest.raises(HybridlabError, match="aligned"):
        S.bootstrap_ci(a, paired_with=b[:5])


def test_bootstrap_cluster_hand_computed():
    # groups A (three tokens of 0) and B (one token of 1); token mean over drawn groups: AA 0 (1/4),
    # AB 1/4 (1/2), BB 1 (1/4)
    v = np.array([0.0, 0.0, 1.0, 0.0])
    g = ["A", "A", "B", "A"]
    ci = S.bootstrap_ci_indices(4, lambda i: v[i].mean(), groups=g, level=0.4, n_boot=4000)
    assert (ci.estimate, ci.lo, ci.hi, ci.n) == (0.25, 0.25, 0.25, 2)
    wide = S.bootstrap_ci_indices(4, lambda i: v[i].mean(), groups=pl.Series(g), n_boot=4000)
    assert (wide.lo, wide.hi) == (0.0, 1.0)
    with pytest.raises(HybridlabError, match="one label per unit"):
        S.bootstrap_ci_indices(4, lambda i: v[i].mean(), groups=g[:3])


def test_bootstrap_indices_cka_over_sentences():
    """The unit is the sentence: the statistic is recomputed from the resampled Gram rows and columns."""
    def cka(K, L):
        H = np.eye(len(K)) - 1.0 / len(K)
        Kc, Lc = H @ K @ H, H @ L @ H
        return (Kc * Lc).sum() / math.sqrt((Kc * Kc).sum() * (Lc * Lc).sum())

    X = np.random.default_rng(7).normal(size=(20, 4))
    K = X @ X.T
    same = S.bootstrap_ci_indices(20, lambda i: cka(K[np.ix_(i, i)], K[np.ix_(i, i)]), n_boot=200)
    assert (same.estimate, same.lo, same.hi) == pytest.approx((1.0, 1.0, 1.0))
    L = (X * [1, 1, 0.1, 0.1]) @ (X * [1, 1, 0.1, 0.1]).T
    part = S.bootstrap_ci_indices(20, lambda i: cka(K[np.ix_(i, i)], L[np.ix_(i, i)]), n_boot=200)
    assert part.lo < part.estimate < part.hi < 1.0 and part.estimate == pytest.approx(cka(K, L))


def test_batched_bootstrap_draws_the_same_replicates_as_row_by_row():
    """softcka.cka_bootstrap's vectorised CKA (batched=True; weighted centring) against the per-row loop over
    the same index sets (H K H centring of the resampled Grams, written independently here)."""
    from hybridlab.eval import softcka

    def cka(K, L):
        H = np.eye(len(K)) - 1.0 / len(K)
        Kc, Lc = H @ K @ H, H @ L @ H
        return (Kc * Lc).sum() / math.sqrt((Kc * Kc).sum() * (Lc * Lc).sum())

    X = np.random.default_rng(3).normal(size=(12, 5))
    K, L = X @ X.T, np.tanh(X[:, :3]) @ np.tanh(X[:, :3]).T
    loop = S.bootstrap_ci_indices(12, lambda i: cka(K[np.ix_(i, i)], L[np.ix_(i, i)]), n_boot=300, seed=5)
    vec = softcka.cka_bootstrap(torch.from_numpy(K), torch.from_numpy(L), n_boot=300, seed=5)
    assert (vec.estimate, vec.lo, vec.hi) == pytest.approx((loop.estimate, loop.lo, loop.hi), rel=1e-10)
    assert vec.lo < vec.estimate < vec.hi and vec.n_failed == loop.n_failed == 0
    with pytest.raises(HybridlabError, match="batched"):
        S.bootstrap_ci_indices(12, lambda i: 0.0, batched=True, groups=np.arange(12) % 3)


def test_bootstrap_failed_replicates():
    x = np.array([0.0, 1.0, 2.0])  # a constant resample (probability 3/27) has no spread

    def inv_std(i):
        s = x[i].std()
        return 1.0 / s if s > 0 else float("nan")

    ci = S.bootstrap_ci_indices(3, inv_std, n_boot=900)
    assert 50 < ci.n_failed < 160  # expected 100
    with pytest.raises(HybridlabError, match="non-finite"):
        S.bootstrap_ci_indices(3, lambda i: float("nan"), n_boot=20)


@pytest.mark.parametrize("kwargs,match", [({"values": [[1, 2]]}, "1-D"), ({"values": [1, float("inf")]}, "NaN"),
                                          ({"values": ["a"]}, "numbers"), ({"values": [1, 2], "n_boot": 5}, "n_boot"),
                                          ({"values": [1, 2], "level": 95}, "level"),
                                          ({"values": [1, 2], "seed": -1}, "seed"), ({"values": []}, "at least 1")])
def test_bootstrap_errors(kwargs, match):
    with pytest.raises(HybridlabError, match=match):
        S.bootstrap_ci(**kwargs)


# --- smoothing and tokens to target --------------------------------------------------------------


def test_smooth_centred_hand_computed():
    s = S.smooth_curve([0, 1, 2, 3, 4], [0, 3, 0, 3, 0], window=3)
    assert s.tolist() == [0.0, 1.0, 2.0, 1.0, 0.0]  # ends: the window shrinks to the raw point
    line = np.arange(7.0) * 2 + 1
    assert S.smooth_curve(np.arange(7), line, window=5) == pytest.approx(line)  # no lag on a straight line
    assert S.smooth_curve([0, 1], [4, 2], window=1).tolist() == [4.0, 2.0]


def test_smooth_ema_token_spaced():
    s = S.smooth_curve([0, 1, 2], [0, 1, 1], method="ema", tau=1.0)
    assert s == pytest.approx([0.0, 1 - math.exp(-1), 1 - math.exp(-2)])
    # one step of 2 tokens equals two steps of 1 token on a constant target
    assert S.smooth_curve([0, 2], [0, 1], method="ema", tau=1.0)[1] == pytest.approx(1 - math.exp(-2))
    # irregular spacing: each step decays by exp(-gap / tau); after gaps 1 and 2, 1 - e^-3
    assert S.smooth_curve([0, 1, 3], [0, 1, 1], method="ema", tau=1.0)[2] == pytest.approx(1 - math.exp(-3))


@pytest.mark.parametrize("kwargs,match", [({"window": 4}, "odd"), ({"method": "ema"}, "tau"),
                                          ({"method": "loess"}, "unknown smoothing"),
                                          ({"x": [0, 2, 1]}, "increasing"), ({"x": [0, 1]}, "one y")])
def test_smooth_errors(kwargs, match):
    args = {"x": [0, 1, 2], "y": [3, 2, 1], **kwargs}
    with pytest.raises(HybridlabError, match=match):
        S.smooth_curve(args.pop("x"), args.pop("y"), **args)


def test_tokens_to_target_raw_hand_computed():
    x, y = [0, 10, 20, 30, 40], [5.0, 4.0, 3.0, 2.0, 1.0]
    t = S.tokens_to_target(x, y, [3.5, 3.0, 0.5, 6.0], smooth="none")
    assert t.columns == ["target", "x", "reached", "below_at_start"]
    rows = t.rows()
    assert rows[0] == (3.5, 15.0, True, False) and rows[1] == (3.0, 20.0, True, False)
    assert math.isnan(rows[2][1]) and rows[2][2:] == (False, False)  # never reached
    assert rows[3] == (6.0, 0.0, True, True)  # already below at the first evaluation
    assert S.tokens_to_target(x, y, 3.5, smooth="none")["x"].to_list() == [15.0]  # a single target


def test_tokens_to_target_smoothed_hand_computed():
    # raw: 5 -> 3 at x=10 reaches 3.0 by noise; centred window 3: 5, 4.1667, 3.4667, 3.4, 2.8 reaches it
    # between x=30 (3.4) and x=40 (2.8): 30 + 10 * 0.4 / 0.6
    x, y = [0, 10, 20, 30, 40], [5.0, 3.0, 4.5, 2.9, 2.8]
    assert S.tokens_to_target(x, y, [3.0], smooth="none")["x"][0] == 10.0
    assert S.tokens_to_target(x, y, [3.0], window=3)["x"][0] == pytest.approx(30 + 10 * 0.4 / 0.6)


def test_tokens_to_target_higher_is_better():
    t = S.tokens_to_target([0, 1, 2], [0.1, 0.5, 0.9], [0.7, 0.05], smooth="none", lower_is_better=False)
    assert t.rows() == [(0.7, 1.5, True, False), (0.05, 0.0, True, True)]


# --- verdict --------------------------------------------------------------------------------------


def test_verdict():
    assert S.verdict(0.2, (0.1, 0.3), +1) == "reproduced"
    assert S.verdict(0.2, (0.1, 0.3), "-") == "contradicted"
    assert S.verdict(-0.2, (-0.3, -0.1), "negative") == "reproduced"
    assert S.verdict(0.05, (-0.1, 0.2), 1) == "inconclusive"
    assert S.verdict(0.1, (0.0, 0.3), 1) == "inconclusive"  # touching 0 does not exclude it
    assert S.verdict(0.8, S.wilson_interval(8, 10), 1) == "reproduced"
    assert S.verdict(0.7, S.seed_spread([0.7]), 1) == "inconclusive"  # one seed: no interval


@pytest.mark.parametrize("args,match", [((0.1, (0.3, 0.1), 1), "exceeds"), ((0.1, (0.0, 0.3), 0), "expected_sign"),
                                        ((float("nan"), (0.0, 0.3), 1), "finite"), ((0.1, (0, 1), True), "expected_sign")])
def test_verdict_errors(args, match):
    with pytest.raises(HybridlabError, match=match):
        S.verdict(*args)

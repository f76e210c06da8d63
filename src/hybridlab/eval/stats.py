"""Uncertainty for the tables and figures: bootstrap and Wilson intervals, paired tests, seed spread,
smoothed tokens-to-target and a three-way verdict.

Pure functions on per-unit values (numpy arrays, lists, torch tensors or polars Series); no scipy. The
caller chooses the resampling unit and passes one value per unit (a sentence, an example, a document).
Tokens of one document are not independent, so a token-level metric is bootstrapped over documents or
rows with `bootstrap_ci_indices(..., groups=doc_id)`, never over tokens as if they were independent.
Every random function takes a `seed` and draws from `numpy.random.default_rng(seed)` only, so the same
inputs and seed give the same interval on every machine with the same numpy.

Definitions (docs/methods.md, "Statistics", has the formulas):
- `bootstrap_ci`, `bootstrap_ci_indices`: percentile bootstrap (quantiles (1-level)/2 and (1+level)/2 of
  the replicate statistics, numpy's linear interpolation); the point estimate is the statistic of the
  full sample. Paired: both arms resampled with the same indices. Cluster: whole groups resampled.
- `wilson_interval`: Wilson score interval for a binomial proportion; `clopper_pearson_interval` the exact
  one (dual to the exact sign test); `newcombe_difference` the interval of a difference of two proportions.
- `sign_test`: exact two-sided binomial test of the signs, ties (zero differences) dropped; `sign_test_counts`
  the same from counts, `sign_test_min_p` its smallest attainable p-value.
- `paired_permutation_test`: random sign flips of the paired differences, statistic |mean difference|,
  exact enumeration for n <= `exact_max`.
- `seed_spread`: mean, sample std, min, max and the Student-t interval of the mean across seeds.
- `smooth_curve`, `tokens_to_target`: a centred running mean (default) or a token-spaced EMA, then the
  first x where the smoothed curve reaches each target, linearly interpolated.
- `verdict`: "reproduced" / "contradicted" / "inconclusive" from a CI and the expected sign.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from fractions import Fraction
from statistics import NormalDist
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import polars as pl

from hybridlab.errors import HybridlabError

REPRODUCED, CONTRADICTED, INCONCLUSIVE = "reproduced", "contradicted", "inconclusive"
_VECTOR_STATS = (np.mean, np.median, np.sum, np.nanmean, np.nanmedian)  # called with axis=-1 on a batch
_BATCH_ELEMENTS = 1 << 22  # bootstrap indices drawn per batch (memory bound, not a result knob)


@dataclass(frozen=True)
class Interval:
    """A point estimate and its interval [lo, hi] at `level`; `n` = resampling units, `n_failed` =
    replicates whose statistic was not finite (left out of the quantiles)."""
    estimate: float
    lo: float
    hi: float
    level: float
    n: int
    method: str
    n_failed: int = 0

    def columns(self, name: str) -> dict[str, float]:
        """Table columns `name`, `name_lo`, `name_hi` (how every table carries a CI)."""
        return {name: self.estimate, f"{name}_lo": self.lo, f"{name}_hi": self.hi}


@dataclass(frozen=True)
class TestResult:
    """A test's statistic, two-sided p-value, units used (`n`) and ties dropped (`n_ties`)."""
    statistic: float
    p_value: float
    n: int
    n_ties: int
    method: str


# --- input checks ---------------------------------------------------------------------------------


def _array(values: Any, name: str, *, min_len: int = 1) -> np.ndarray:
    """`values` as a finite 1-D float64 array of at least `min_len` entries."""
    if hasattr(values, "detach"):  # torch tensor
        values = values.detach().cpu().numpy()
    elif isinstance(values, pl.Series):
        values = values.to_numpy()
    try:
        arr = np.asarray(values, dtype=np.float64)
    except (TypeError, ValueError):
        raise HybridlabError(f"{name} must be numbers (got {type(values).__name__}); pass a 1-D list or array "
                             "of per-unit values") from None
    if arr.ndim != 1:
        raise HybridlabError(f"{name} must be 1-D (got shape {arr.shape}); pass one value per unit")
    if arr.size < min_len:
        raise HybridlabError(f"{name} has {arr.size} values, at least {min_len} needed")
    if not np.isfinite(arr).all():
        raise HybridlabError(f"{name} has {int((~np.isfinite(arr)).sum())} NaN/inf values; drop or fill "
                             "them before computing the statistic")
    return arr


def _level(level: float) -> float:
    if not isinstance(level, (int, float)) or not 0.0 < float(level) < 1.0:
        raise HybridlabError(f"level must be a number in (0, 1) (got {level!r}); e.g. 0.95 for a 95 % interval")
    return float(level)


def _int(value: Any, name: str, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise HybridlabError(f"{name} must be an integer >= {minimum} (got {value!r})")
    return int(value)


# --- bootstrap ------------------------------------------------------------------------------------


def _percentile(reps: np.ndarray, estimate: float, level: float, n: int, method: str) -> Interval:
    ok = np.isfinite(reps)
    failed = int((~ok).sum())
    if failed * 2 > reps.size:
        raise HybridlabError(f"{failed} of {reps.size} bootstrap replicates gave a non-finite statistic; the "
                             "statistic is undefined on most resamples (too few units or a constant input)")
    lo, hi = np.quantile(reps[ok], [(1.0 - level) / 2.0, (1.0 + level) / 2.0])
    return Interval(float(estimate), float(lo), float(hi), level, n, method, failed)


def _draw(rng: np.random.Generator, n: int, n_boot: int):
    """Yield (k, n) index batches, n_boot rows in all; the stream equals one (n_boot, n) draw."""
    per = max(1, _BATCH_ELEMENTS // n)
    for start in range(0, n_boot, per):
        yield rng.integers(0, n, size=(min(per, n_boot - start), n))


def bootstrap_ci(values: Any, stat: Callable[[np.ndarray], float] = np.mean, *, n_boot: int = 2000,
                 level: float = 0.95, seed: int = 0, paired_with: Any = None) -> Interval:
    """Percentile bootstrap CI of `stat(values)` over the units of `values` (one value per unit).

    With `paired_with` (an array aligned with `values`: the same examples under another arm), the
    statistic is `stat(values[idx]) - stat(paired_with[idx])` with ONE index set per replicate, so the
    CI of the difference keeps the pairing (narrower than two independent CIs when the arms correlate).
    Replicate r resamples `len(values)` units with replacement from `default_rng(seed)`.
    """
    a = _array(values, "values")
    b = None if paired_with is None else _array(paired_with, "paired_with")
    if b is not None and b.size != a.size:
        raise HybridlabError(f"paired_with has {b.size} values but values has {a.size}; pass arrays aligned "
                             "on the same units")
    n_boot, level = _int(n_boot, "n_boot", 10), _level(level)
    _int(seed, "seed", 0)
    if not callable(stat):
        raise HybridlabError(f"stat must be a function of a 1-D array (got {type(stat).__name__})")
    vector = stat in _VECTOR_STATS

    def apply(x):  # x: (k, n) resampled values
        if vector:
            return np.asarray(stat(x, axis=-1), dtype=np.float64)
        return np.array([stat(row) for row in x], dtype=np.float64)

    rng, reps = np.random.default_rng(seed), []
    for idx in _draw(rng, a.size, n_boot):
        r = apply(a[idx])
        reps.append(r if b is None else r - apply(b[idx]))
    estimate = float(stat(a)) if b is None else float(stat(a)) - float(stat(b))
    return _percentile(np.concatenate(reps), estimate, level, a.size,
                       "percentile bootstrap" + (" (paired)" if b is not None else ""))


def bootstrap_ci_indices(n: int, fn: Callable[[np.ndarray], float], *, n_boot: int = 2000, level: float = 0.95,
                         seed: int = 0, groups: Any = None, batched: bool = False) -> Interval:
    """Percentile bootstrap CI of `fn(idx)`, resampling index sets of `n` units; estimate = `fn(arange(n))`.

    For a statistic recomputed from the resampled units, e.g. a CKA over N sentences:
    `fn = lambda i: cka(K[np.ix_(i, i)], L[np.ix_(i, i)])` (the sentence is the unit; a sentence drawn
    twice appears twice in the Gram rows and columns). With `groups` (one label per unit), whole groups
    are resampled and `idx` holds every member of each drawn group in turn (the cluster bootstrap, e.g.
    tokens grouped by document). Non-finite replicates are dropped and counted in `n_failed`.
    Caution: a debiased (U-statistic) CKA treats duplicated rows as distinct samples, so it is biased
    upward on bootstrap resamples; bootstrap the plain estimator or read the debiased CI as approximate.
    `batched=True` (without groups): `fn` takes a (k, n) array of k index sets and returns their k values,
    the same replicates as row by row, for statistics that vectorise over replicates.
    """
    n = _int(n, "n", 1)
    n_boot, level = _int(n_boot, "n_boot", 10), _level(level)
    _int(seed, "seed", 0)
    if not callable(fn):
        raise HybridlabError(f"fn must be a function of an index array (got {type(fn).__name__})")
    rng = np.random.default_rng(seed)
    if batched and groups is not None:
        raise HybridlabError("batched=True resamples single units; pass groups=None or a per-row fn")
    if groups is None:
        batches = _draw(rng, n, n_boot)
        reps = [float(v) for b in batches for v in fn(b)] if batched else [float(fn(i)) for b in batches for i in b]
        method = "percentile bootstrap"
    else:
        g = np.asarray(groups.to_numpy() if isinstance(groups, pl.Series) else groups)
        if g.ndim != 1 or g.size != n:
            raise HybridlabError(f"groups must hold one label per unit ({n}), got shape {g.shape}")
        labels, inverse = np.unique(g, return_inverse=True)
        order = np.argsort(inverse, kind="stable")
        members = np.split(order, np.cumsum(np.bincount(inverse))[:-1])  # members[j]: units of group j
        reps = [float(fn(np.concatenate([members[j] for j in row])))
                for batch in _draw(rng, labels.size, n_boot) for row in batch]
        method = f"cluster bootstrap ({labels.size} groups)"
    estimate = float(np.asarray(fn(np.arange(n)[None]))[0]) if batched else float(fn(np.arange(n)))
    return _percentile(np.asarray(reps), estimate, level, n if groups is None else labels.size, method)


# --- intervals for proportions and across seeds ----------------------------------------------------


def normal_quantile(p: float) -> float:
    """Standard normal quantile (stdlib `statistics.NormalDist`)."""
    if not 0.0 < p < 1.0:
        raise HybridlabError(f"a quantile needs p in (0, 1), got {p!r}")
    return NormalDist().inv_cdf(p)


def wilson_interval(successes: int, n: int, level: float = 0.95) -> Interval:
    """Wilson score interval of the proportion successes / n.

    With p = k/n and z the (1+level)/2 normal quantile:
    centre = (p + z^2/(2n)) / (1 + z^2/n), half = z sqrt(p(1-p)/n + z^2/(4n^2)) / (1 + z^2/n).
    Unlike the Wald interval it stays inside [0, 1] and is not zero-width at 0/n or n/n.
    """
    k, n = _int(successes, "successes", 0), _int(n, "n", 0)
    if n == 0:
        raise HybridlabError("wilson_interval needs n >= 1 trials (got n=0); a cell with no examples has no accuracy")
    if k > n:
        raise HybridlabError(f"successes ({k}) exceed trials n ({n}); pass the number of correct examples and the total")
    level = _level(level)
    z = normal_quantile((1.0 + level) / 2.0)
    p, z2 = k / n, z * z
    denom = 1.0 + z2 / n
    centre = (p + z2 / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z2 / (4 * n * n)) / denom
    lo = 0.0 if k == 0 else max(0.0, centre - half)  # exact bounds at the edges (no rounding residue)
    hi = 1.0 if k == n else min(1.0, centre + half)
    return Interval(p, lo, hi, level, n, "wilson")


def newcombe_difference(k1: int, n1: int, k2: int, n2: int, level: float = 0.95) -> tuple[float, float, float]:
    """(p1 - p2, lo, hi): Newcombe's hybrid score interval of a difference of two independent proportions,
    from the Wilson intervals (l_i, u_i) of each: lo = d - sqrt((p1 - l1)^2 + (u2 - p2)^2),
    hi = d + sqrt((u1 - p1)^2 + (p2 - l2)^2). On paired examples it is conservative (wider)."""
    a, b = wilson_interval(k1, n1, level), wilson_interval(k2, n2, level)
    d = a.estimate - b.estimate
    return (d, d - math.sqrt((a.estimate - a.lo) ** 2 + (b.hi - b.estimate) ** 2),
            d + math.sqrt((a.hi - a.estimate) ** 2 + (b.estimate - b.lo) ** 2))


def _binom_cdf(k: int, n: int, p: float) -> float:
    """P(X <= k) for X ~ Binomial(n, p), summed in log space (lgamma), for 0 <= k <= n."""
    if p <= 0.0:
        return 1.0
    if p >= 1.0:
        return 1.0 if k >= n else 0.0
    lp, lq = math.log(p), math.log1p(-p)
    logs = [math.lgamma(n + 1) - math.lgamma(i + 1) - math.lgamma(n - i + 1) + i * lp + (n - i) * lq
            for i in range(k + 1)]
    top = max(logs)
    return min(1.0, math.exp(top) * sum(math.exp(x - top) for x in logs))


def clopper_pearson_interval(successes: int, n: int, level: float = 0.95) -> Interval:
    """Exact (Clopper-Pearson) interval of the proportion successes / n: lo solves P(X >= k | lo) = (1-level)/2
    (0 when k = 0), hi solves P(X <= k | hi) = (1-level)/2 (1 when k = n), X ~ Binomial(n, p), each by
    bisection. It is the interval dual to the exact two-sided binomial test that doubles the smaller tail:
    p0 = 0.5 lies outside it exactly when `sign_test_counts(k, n - k)` gives p < 1 - level."""
    k, n = _int(successes, "successes", 0), _int(n, "n", 0)
    if n == 0:
        raise HybridlabError("clopper_pearson_interval needs n >= 1 trials (got n=0)")
    if k > n:
        raise HybridlabError(f"successes ({k}) exceed trials n ({n}); pass the number of successes and the total")
    alpha = (1.0 - _level(level)) / 2.0

    def solve(f) -> float:  # f increasing in p; the p where f(p) = alpha
        lo, hi = 0.0, 1.0
        for _ in range(200):
            mid = 0.5 * (lo + hi)
            if mid in (lo, hi):
                break
            lo, hi = (mid, hi) if f(mid) < alpha else (lo, mid)
        return 0.5 * (lo + hi)

    lo = 0.0 if k == 0 else solve(lambda p: 1.0 - _binom_cdf(k - 1, n, p))  # P(X >= k) rises with p
    hi = 1.0 if k == n else solve(lambda p: 2 * alpha - _binom_cdf(k, n, p))  # P(X <= k) falls with p
    return Interval(k / n, lo, hi, level, n, "clopper-pearson")


def _t_two_sided_mass(theta: float, df: int) -> float:
    """P(|T| < sqrt(df) tan(theta)) for Student's t with integer df (Abramowitz & Stegun 26.7.3-4)."""
    s, c = math.sin(theta), math.cos(theta)
    c2 = c * c
    if df % 2 == 0:  # sin(t) [1 + 1/2 cos^2 + 1*3/(2*4) cos^4 + ... up to cos^(df-2)]
        term, total = 1.0, 1.0
        for k in range(1, df // 2):
            term *= c2 * (2 * k - 1) / (2 * k)
            total += term
        return s * total
    if df == 1:
        return 2.0 * theta / math.pi
    term, total = c, c  # odd: 2/pi [theta + sin (cos + 2/3 cos^3 + ... up to cos^(df-2))]
    for k in range(1, (df - 1) // 2):
        term *= c2 * (2 * k) / (2 * k + 1)
        total += term
    return 2.0 / math.pi * (theta + s * total)


def t_quantile(p: float, df: int) -> float:
    """Quantile of Student's t with integer `df`: exact series inverted by bisection for df <= 1000, the
    Cornish-Fisher expansion (A&S 26.7.5, error < 1e-9 there) above. E.g. t_quantile(0.975, 2) = 4.3027."""
    df = _int(df, "df", 1)
    if not 0.0 < p < 1.0:
        raise HybridlabError(f"a quantile needs p in (0, 1), got {p!r}")
    if p < 0.5:
        return -t_quantile(1.0 - p, df)
    if p == 0.5:
        return 0.0
    if df > 1000:
        z = normal_quantile(p)
        g1 = (z ** 3 + z) / 4
        g2 = (5 * z ** 5 + 16 * z ** 3 + 3 * z) / 96
        g3 = (3 * z ** 7 + 19 * z ** 5 + 17 * z ** 3 - 15 * z) / 384
        return z + g1 / df + g2 / df ** 2 + g3 / df ** 3
    target, lo, hi = 2.0 * p - 1.0, 0.0, math.pi / 2
    for _ in range(200):  # the mass is increasing in theta; bisect to float resolution
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        lo, hi = (mid, hi) if _t_two_sided_mass(mid, df) < target else (lo, mid)
    return math.sqrt(df) * math.tan(0.5 * (lo + hi))


@dataclass(frozen=True)
class SeedSpread:
    """Across-seed summary: n seeds, mean, sample std (ddof 1), min, max and the t-interval [lo, hi]."""
    n: int
    mean: float
    std: float
    min: float
    max: float
    lo: float
    hi: float
    level: float

    def columns(self, name: str) -> dict[str, float]:
        """Table columns `name` (mean), `name_lo`, `name_hi`, `name_std`, `name_n_seeds`."""
        return {name: self.mean, f"{name}_lo": self.lo, f"{name}_hi": self.hi, f"{name}_std": self.std,
                f"{name}_n_seeds": self.n}

    def as_dict(self) -> dict[str, float]:
        return asdict(self)


def seed_spread(values_by_seed: Sequence[float] | Mapping[Any, float], level: float = 0.95) -> SeedSpread:
    """Spread of one statistic across replicate seeds (a list, or a {seed: value} mapping).

    Interval: mean +- t_{(1+level)/2, n-1} * std / sqrt(n) (seeds as independent replicates). One seed has
    no spread: std, lo and hi are NaN (a table still shows the value; its verdict is then inconclusive).
    """
    vals = values_by_seed.values() if isinstance(values_by_seed, Mapping) else values_by_seed
    x = _array(list(vals) if not hasattr(vals, "shape") else vals, "values_by_seed")
    level = _level(level)
    n, mean = x.size, float(x.mean())
    if n == 1:
        nan = float("nan")
        return SeedSpread(1, mean, nan, mean, mean, nan, nan, level)
    std = float(x.std(ddof=1))
    half = t_quantile((1.0 + level) / 2.0, n - 1) * std / math.sqrt(n)
    return SeedSpread(n, mean, std, float(x.min()), float(x.max()), mean - half, mean + half, level)


# --- paired tests ---------------------------------------------------------------------------------


def sign_test(diffs: Any) -> TestResult:
    """Exact two-sided sign test of paired differences (H0: positive and negative equally likely).

    Zero differences (ties) are dropped; with m non-zero differences and k = min(#pos, #neg),
    p = min(1, 2 * sum_{i<=k} C(m, i) / 2^m), computed in exact rationals. The statistic is #pos.
    All differences zero leaves no evidence: p = 1.
    """
    d = _array(diffs, "diffs")
    pos, neg = int((d > 0).sum()), int((d < 0).sum())
    return sign_test_counts(pos, neg, ties=int(d.size - pos - neg))


def sign_test_counts(n_pos: int, n_neg: int, *, ties: int = 0) -> TestResult:
    """`sign_test` from the counts of positive and negative units (e.g. seeds classified as successes and
    failures without a numeric difference): p = min(1, 2 * sum_{i<=min(pos, neg)} C(m, i) / 2^m), m = pos + neg."""
    pos, neg = _int(n_pos, "n_pos", 0), _int(n_neg, "n_neg", 0)
    ties = _int(ties, "ties", 0)
    m = pos + neg
    if m == 0:
        return TestResult(0.0, 1.0, 0, ties, "sign test (exact)")
    k = min(pos, neg)
    tail = Fraction(sum(math.comb(m, i) for i in range(k + 1)), 2 ** m)
    return TestResult(float(pos), float(min(Fraction(1), 2 * tail)), m, ties, "sign test (exact)")


def sign_test_min_p(m: int) -> float:
    """The smallest p-value the exact two-sided sign test can give with m non-zero units: 2 / 2^m (all of one
    sign), 1 for m <= 1. E.g. 0.25 with 3 seeds, 0.0625 with 5, 0.03125 with 6: below 6 units no outcome
    reaches p < 0.05."""
    m = _int(m, "m", 0)
    return 1.0 if m <= 1 else float(Fraction(2, 2 ** m))


def paired_permutation_test(a: Any, b: Any, *, n_perm: int = 10000, seed: int = 0,
                            exact_max: int = 16) -> TestResult:
    """Two-sided paired permutation (sign-flip) test of mean(a - b) = 0.

    Under H0 each difference d_i = a_i - b_i is as likely to be -d_i. Statistic |mean d|. For n <= exact_max
    all 2^n sign vectors are enumerated: p = #{s : |sum s_i d_i| >= |sum d_i|} / 2^n (the identity is one of
    them). Above, `n_perm` random sign vectors from default_rng(seed): p = (1 + #{>=}) / (1 + n_perm), a
    valid (never zero) Monte Carlo p-value. Zero differences are kept; they change no sum.
    """
    x, y = _array(a, "a"), _array(b, "b")
    if x.size != y.size:
        raise HybridlabError(f"a has {x.size} values but b has {y.size}; pass paired arrays aligned on the same units")
    n_perm, exact_max = _int(n_perm, "n_perm", 1), _int(exact_max, "exact_max", 0)
    _int(seed, "seed", 0)
    if exact_max > 24:
        raise HybridlabError(f"exact_max={exact_max} would enumerate 2^{exact_max} sign vectors; use <= 24")
    d = x - y
    obs = abs(d.sum())
    tol = 1e-9 * max(1.0, float(np.abs(d).sum()))  # equal sums up to rounding count as ties with the observed
    ties = int((d == 0).sum())
    if d.size <= exact_max:
        bits = (np.arange(2 ** d.size)[:, None] >> np.arange(d.size)) & 1
        sums = (1 - 2 * bits) @ d
        p = float(np.mean(np.abs(sums) >= obs - tol))
        method = "sign-flip permutation (exact)"
    else:
        rng, count, per = np.random.default_rng(seed), 0, max(1, _BATCH_ELEMENTS // d.size)
        for start in range(0, n_perm, per):
            signs = 1 - 2 * rng.integers(0, 2, size=(min(per, n_perm - start), d.size))
            count += int((np.abs(signs @ d) >= obs - tol).sum())
        p = (1 + count) / (1 + n_perm)
        method = f"sign-flip permutation ({n_perm} draws)"
    return TestResult(float(d.mean()), p, int(d.size), ties, method)


# --- curves ---------------------------------------------------------------------------------------


def _curve(x: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    xs, ys = _array(x, "x"), _array(y, "y")
    if xs.size != ys.size:
        raise HybridlabError(f"x has {xs.size} points but y has {ys.size}; pass one y per evaluation point")
    if xs.size > 1 and not (np.diff(xs) > 0).all():
        raise HybridlabError("x must be strictly increasing (sort the curve by tokens and drop duplicate evaluations)")
    return xs, ys


def smooth_curve(x: Any, y: Any, *, method: str = "centred", window: int = 5, tau: float | None = None) -> np.ndarray:
    """Smoothed y of a training curve evaluated at increasing x (tokens).

    - "centred" (default): running mean over `window` (odd) consecutive evaluation points centred on each
      point; near the ends the window shrinks symmetrically (point i averages i-h..i+h, h = min(window//2,
      i, last-i)), so the smoothed curve has no lag anywhere and its first and last points are the raw ones.
    - "ema": exponential moving average in token space, s_0 = y_0, s_i = s_{i-1} + (1 - exp(-(x_i -
      x_{i-1})/tau)) (y_i - s_{i-1}); irregular spacing is handled, but it lags a falling curve by ~tau
      tokens (a later tokens-to-target), which is why it is not the default.
    """
    xs, ys = _curve(x, y)
    if method == "centred":
        w = _int(window, "window", 1)
        if w % 2 == 0:
            raise HybridlabError(f"window must be odd for a centred running mean (got {w}); e.g. 5")
        csum = np.concatenate([[0.0], np.cumsum(ys)])
        i = np.arange(ys.size)
        h = np.minimum(np.minimum(w // 2, i), ys.size - 1 - i)
        return (csum[i + h + 1] - csum[i - h]) / (2 * h + 1)
    if method == "ema":
        if tau is None or not isinstance(tau, (int, float)) or not tau > 0:
            raise HybridlabError(f"method 'ema' needs tau > 0 in x units (tokens), got {tau!r}")
        out = np.empty_like(ys)
        out[0] = ys[0]
        alpha = 1.0 - np.exp(-np.diff(xs) / float(tau))
        for i in range(1, ys.size):
            out[i] = out[i - 1] + alpha[i - 1] * (ys[i] - out[i - 1])
        return out
    raise HybridlabError(f"unknown smoothing method {method!r}; choose 'centred', 'ema' or 'none'")


def tokens_to_target(x: Any, y: Any, targets: Any, *, smooth: str = "centred", window: int = 5,
                     tau: float | None = None, lower_is_better: bool = True) -> pl.DataFrame:
    """First x at which the smoothed curve reaches each target: one row per target.

    Columns: target, x (linear interpolation between the last evaluation before and the first at/past the
    target; NaN when never reached), reached, below_at_start. "Reached" means y_s <= target
    (`lower_is_better`, losses) or y_s >= target (accuracies). A curve already at/past a target at its
    first evaluation reports its first x with below_at_start = True: the crossing happened before the
    first evaluation, so x is an upper bound and a fraction read from it is not a measured speed-up.
    `smooth`: "centred" / "ema" (see `smooth_curve`) or "none" for the raw curve.
    """
    xs, ys = _curve(x, y)
    t = _array([targets] if isinstance(targets, (int, float)) else targets, "targets")
    s = ys if smooth == "none" else smooth_curve(xs, ys, method=smooth, window=window, tau=tau)
    sign = 1.0 if lower_is_better else -1.0  # reach: sign * s <= sign * target
    rows = []
    for target in t:
        hit = np.flatnonzero(sign * s <= sign * target)
        if hit.size == 0:
            rows.append((float(target), float("nan"), False, False))
            continue
        i = int(hit[0])
        if i == 0:
            rows.append((float(target), float(xs[0]), True, True))
            continue
        frac = (target - s[i - 1]) / (s[i] - s[i - 1])  # s[i-1] strictly before, s[i] at/past: denominator != 0
        rows.append((float(target), float(xs[i - 1] + frac * (xs[i] - xs[i - 1])), True, False))
    return pl.DataFrame(rows, schema={"target": pl.Float64, "x": pl.Float64, "reached": pl.Boolean,
                                      "below_at_start": pl.Boolean}, orient="row")


# --- verdicts -------------------------------------------------------------------------------------


def verdict(effect: float, ci: Interval | SeedSpread | Sequence[float], expected_sign: int | str) -> str:
    """"reproduced" when the CI excludes 0 on the expected side, "contradicted" when it excludes 0 on the
    other side, "inconclusive" when it contains 0 or is undefined (NaN, e.g. a single seed).

    `effect` is the point estimate (checked to be finite and reported by the caller; a percentile CI may
    exclude it for a skewed statistic, so it does not decide). `expected_sign`: +1 / -1 or "+" / "-".
    """
    signs = {1: 1, -1: -1, "+": 1, "-": -1, "positive": 1, "negative": -1}
    if isinstance(expected_sign, bool) or expected_sign not in signs:
        raise HybridlabError(f"expected_sign must be +1 or -1 (or '+' / '-'), got {expected_sign!r}")
    if not isinstance(effect, (int, float, np.floating, np.integer)) or not math.isfinite(effect):
        raise HybridlabError(f"effect must be a finite number, got {effect!r}")
    lo, hi = (ci.lo, ci.hi) if isinstance(ci, (Interval, SeedSpread)) else tuple(ci)
    if math.isnan(lo) or math.isnan(hi):
        return INCONCLUSIVE
    if lo > hi:
        raise HybridlabError(f"CI lower bound {lo} exceeds its upper bound {hi}; pass (lo, hi)")
    side = 1 if lo > 0 else -1 if hi < 0 else 0
    if side == 0:
        return INCONCLUSIVE
    return REPRODUCED if side == signs[expected_sign] else CONTRADICTED


def pooled_mean_ci(sums, counts, *, n_boot: int, seed: int = 0, level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap over units of the pooled mean sum(S) / sum(n): `sums` S_u and `counts` n_u, one
    per unit (a sequence, a document). Replicate b draws the unit indices I_b (`default_rng(seed)`) and
    recomputes sum(S[I_b]) / sum(n[I_b]). When every unit has the same count n this is the mean of S_u / n
    over I_b, drawn with the same I_b by the vectorised `bootstrap_ci`; otherwise
    `bootstrap_ci_indices` (replicates without a counted item, 0/0, are dropped). (lo, hi); NaN with
    fewer than 2 units, `n_boot` 0, no counted item, or when most replicates have none."""
    s = np.asarray(sums, dtype=np.float64)
    n = np.asarray(counts, dtype=np.float64)
    if s.shape != n.shape or s.ndim != 1:
        raise HybridlabError(f"sums and counts must be 1-D and aligned, got {s.shape} and {n.shape}")
    if isinstance(n_boot, bool) or not isinstance(n_boot, (int, np.integer)) or n_boot < 0 or 0 < n_boot < 10:
        raise HybridlabError(f"n_boot must be 0 (no interval) or an integer >= 10, got {n_boot!r}")
    if not n_boot or s.size < 2 or n.sum() <= 0:
        return math.nan, math.nan
    if (n == n[0]).all():
        ci = bootstrap_ci(s / n[0], np.mean, n_boot=n_boot, level=level, seed=seed)
        return ci.lo, ci.hi
    try:
        with np.errstate(invalid="ignore", divide="ignore"):
            ci = bootstrap_ci_indices(s.size, lambda i: s[i].sum() / n[i].sum(), n_boot=n_boot,
                                            level=level, seed=seed)
    except HybridlabError:  # most replicates hold no counted item (0/0): no interval
        return math.nan, math.nan
    return ci.lo, ci.hi

"""Selection-aware count intervals and noise quantiles (accounting/intervals.py).

Statistical tests use fixed seeds; each states its Monte Carlo error and the chance a
correct construction fails it."""
import math

import numpy as np
import pytest

from thresher.accounting import intervals as iv
from thresher.transforms.randomness import samplers

ALPHA = 0.05


def _brute_pmf(noise, scale, radius):
    """The noise pmf on [-radius, radius], summed directly (independent of NoiseTail)."""
    z = np.arange(-radius, radius + 1)
    w = np.exp(-z * z / (2.0 * scale * scale)) if noise == iv.GAUSSIAN else \
        np.exp(-np.abs(z) / scale)
    return z, w / w.sum()


def _brute_interval(y, noise, scale, floor, threshold, alpha, n_max):
    """{n in [floor, n_max] : both one-sided tail tests of y accept}, by direct sums."""
    z, p = _brute_pmf(noise, scale, int(60 * scale) + n_max + 50)
    accepted = []
    for n in range(floor, n_max + 1):
        values = n + z
        released = values >= threshold if threshold is not None else np.ones_like(values, bool)
        mass = p[released].sum()
        upper = p[released & (values >= y)].sum() / mass
        lower = p[released & (values <= y)].sum() / mass
        if upper > alpha / 2 and lower > alpha / 2:
            accepted.append(n)
    return accepted


@pytest.mark.parametrize("noise,scale,floor,threshold", [
    (iv.GAUSSIAN, 3.0, 1, 14), (iv.GAUSSIAN, 1.2, 2, 7), (iv.LAPLACE, 2.0, 1, 12),
    (iv.LAPLACE, 0.7, 3, 6), (iv.GAUSSIAN, 2.5, 0, None), (iv.LAPLACE, 1.5, 0, None)])
def test_count_bounds_are_the_brute_force_neyman_sets(noise, scale, floor, threshold):
    """The bisection finds exactly the set of accepted n, and that set is an interval
    (the monotone likelihood ratio argument), for every y checked."""
    start = threshold if threshold is not None else -1
    ys = np.arange(start, start + 40)
    reach = 0 if threshold is None else threshold - floor
    lo, hi = iv.count_bounds(ys, iv.NoiseTail(noise, scale, reach=reach), ALPHA, floor, threshold)
    for y, a, b in zip(ys, lo, hi):
        accepted = _brute_interval(int(y), noise, scale, floor, threshold, ALPHA, int(y) + 80)
        assert accepted, f"empty set at y={y}: the case would only test the fallback"
        assert accepted == list(range(accepted[0], accepted[-1] + 1)), f"not an interval at y={y}"
        assert (a, b) == (accepted[0], accepted[-1]), (y, a, b, accepted[0], accepted[-1])


@pytest.mark.parametrize("noise,scale", [(iv.GAUSSIAN, 14.4), (iv.GAUSSIAN, 0.6),
                                         (iv.GAUSSIAN, 3.0), (iv.LAPLACE, 8.0),
                                         (iv.LAPLACE, 0.3)])
@pytest.mark.parametrize("floor", [0, 3])
@pytest.mark.parametrize("clamped", [False, True])
def test_untruncated_bounds_by_translation_are_the_bisections(noise, scale, floor, clamped):
    """Without a threshold (public keys) a batch of more than ``_SHIFT_MIN`` values is
    answered by shifting one Neyman set (issue 36 D13: 2.9 s -> 0.04 s of CPU per 1e6
    keys): every y of a range that crosses the floor, 0 and large counts gets exactly the
    bisection's interval, and a sample of them the brute-force set."""
    tail = iv.NoiseTail(noise, scale)
    ys = np.concatenate([np.arange(-200, 400), [10 ** 6, 10 ** 9]]).astype(np.int64)
    assert ys.size > iv._SHIFT_MIN
    lo, hi = iv.count_bounds(ys, tail, ALPHA, floor, None, clamped_at_zero=clamped)
    want_lo, want_hi = iv._neyman_bounds(ys, tail, ALPHA, floor, None, clamped)
    np.testing.assert_array_equal(lo, want_lo)
    np.testing.assert_array_equal(hi, want_hi)
    if not clamped:
        for y in (-3, floor, floor + 1, 25, 150):
            accepted = _brute_interval(y, noise, scale, floor, None, ALPHA, y + 200)
            i = int(np.flatnonzero(ys == y)[0])
            if accepted:
                assert (lo[i], hi[i]) == (accepted[0], accepted[-1]), (y, accepted)


def test_empty_neyman_sets_get_the_flat_likelihood_fallback():
    """A wide discrete Laplace puts < alpha/2 on tau* itself, so y = tau* is rejected by
    every n: the published interval is then [pre_threshold, tau*] (every n <= tau* gives
    the same memoryless overshoot, so all are equally likely), a superset of the empty
    Neyman set (coverage is kept)."""
    floor, threshold = 1, 200
    tail = iv.NoiseTail(iv.LAPLACE, 60.0)
    assert not _brute_interval(threshold, iv.LAPLACE, 60.0, floor, threshold, ALPHA, 400)
    lo, hi = iv.count_bounds(np.array([threshold]), tail, ALPHA, floor, threshold)
    assert (lo[0], hi[0]) == (floor, threshold)


def test_tails_match_direct_sums():
    z = np.arange(-70, 90)
    for noise, scale in ((iv.GAUSSIAN, 7.3), (iv.LAPLACE, 3.0), (iv.GAUSSIAN, 0.8)):
        support, p = _brute_pmf(noise, scale, 3000)
        sf = np.array([p[support >= k].sum() for k in z])
        got = np.exp(iv.NoiseTail(noise, scale, reach=40).log_sf(z))
        assert np.max(np.abs(got - sf)) < 1e-12


@pytest.mark.parametrize("noise,scale", [(iv.GAUSSIAN, 10.0), (iv.GAUSSIAN, 4096 * 10.35),
                                         (iv.LAPLACE, 3.0), (iv.LAPLACE, 40000.0)])
def test_symmetric_quantile_is_the_least_k(noise, scale):
    k = iv.symmetric_quantile(noise, scale, ALPHA)
    tail = iv.NoiseTail(noise, scale) if scale < 100 else None
    if tail is None:   # large scales: continuous reference (discrete differs by < 1 unit)
        ref = scale * (1.959964 if noise == iv.GAUSSIAN else math.log(1.0 / ALPHA))
        assert abs(k - ref) < 2 + 1e-4 * scale
        return
    two = lambda j: 2 * math.exp(tail.log_sf(np.array([j + 1]))[0])  # noqa: E731
    assert two(k) <= ALPHA < two(k - 1)


def _brute_binomial_interval(x, p, threshold, alpha, n_max):
    accepted = []
    for n in range(max(x, 1), n_max + 1):
        k = np.arange(n + 1)
        log_comb = np.array([math.lgamma(n + 1) - math.lgamma(j + 1) - math.lgamma(n - j + 1)
                             for j in k])
        pmf = np.exp(log_comb + k * math.log(p) + (n - k) * math.log1p(-p))   # direct pmf
        mass = pmf[threshold:].sum()
        upper, lower = pmf[x:].sum() / mass, pmf[threshold:x + 1].sum() / mass
        if upper > alpha / 2 and lower > alpha / 2:
            accepted.append(n)
    return accepted


@pytest.mark.parametrize("p,threshold", [(0.3, 4), (0.105, 3), (0.6, 8)])
def test_binomial_bounds_are_the_brute_force_neyman_sets(p, threshold):
    xs = np.arange(threshold, threshold + 12)
    lo, hi = iv.binomial_bounds(xs, p, ALPHA, threshold)
    for x, a, b in zip(xs, lo, hi):
        accepted = _brute_binomial_interval(int(x), p, threshold, ALPHA, int(3 * (x + 10) / p))
        assert accepted == list(range(accepted[0], accepted[-1] + 1)), f"not an interval at x={x}"
        assert (a, b) == (accepted[0], accepted[-1]), (x, a, b, accepted[0], accepted[-1])


# --------------------------------------------------------------------------------------
# Coverage given release, with the samplers thresher draws from.

def _released_draws(noise, scale, n, threshold, draws, seed):
    rng = np.random.default_rng(seed)
    z = (samplers.discrete_gaussian(rng, scale, draws) if noise == iv.GAUSSIAN
         else samplers.discrete_laplace(rng, scale, draws))
    y = n + np.asarray(z, dtype=np.int64)
    return y[y >= threshold]


def _truncated_draws(noise, scale, n, threshold, size, seed):
    """Draws of n + Z given n + Z >= tau*, from the direct pmf (for n so far below tau*
    that rejection from the sampler would take too long)."""
    z, p = _brute_pmf(noise, scale, int(60 * scale) + abs(threshold - n) + 10)
    keep = n + z >= threshold
    return np.random.default_rng(seed).choice(n + z[keep], size=size, p=p[keep] / p[keep].sum())


def _coverage(y, n, lo_hi):
    u, inv = np.unique(y, return_inverse=True)
    lo, hi = lo_hi(u)
    return float(np.mean((lo[inv] <= n) & (n <= hi[inv])))


# Coverage is checked at 0.95 - 4 SE with SE = sqrt(0.95 * 0.05 / m) for m released
# draws: a construction with coverage >= 0.95 fails a case with probability <= 3.2e-5.
CASES = [(iv.GAUSSIAN, 5.0, 1, 20), (iv.LAPLACE, 3.0, 1, 15)]


@pytest.mark.parametrize("noise,scale,floor,threshold", CASES)
def test_coverage_given_release_near_and_far_from_the_threshold(noise, scale, floor, threshold):
    tail = iv.NoiseTail(noise, scale, reach=threshold - floor)
    lo_hi = lambda u: iv.count_bounds(u, tail, ALPHA, floor, threshold)  # noqa: E731
    checked = []
    for i, n in enumerate([threshold - 2 * int(scale), threshold - int(scale), threshold,
                           threshold + 3 * int(scale)]):
        y = _released_draws(noise, scale, n, threshold, 2_000_000, seed=100 + i)
        checked.append((n, len(y), _coverage(y, n, lo_hi)))
    for i, n in enumerate([floor, max(floor + 1, threshold - 3 * int(scale))]):
        y = _truncated_draws(noise, scale, n, threshold, 40_000, seed=200 + i)
        checked.append((n, len(y), _coverage(y, n, lo_hi)))
    for n, m, cov in checked:
        se = math.sqrt(0.95 * 0.05 / m)
        assert m >= 20_000 and cov >= 0.95 - 4 * se, (n, m, cov)


def test_plain_interval_fails_the_near_threshold_check():
    """y +- z sigma ignores the selection: for a true count sigma below tau*, every
    released y is at least sigma above it, and the plain 95% interval covers only about
    P(sigma <= Z <= 1.96 sigma) / P(Z >= sigma) = 0.84 for continuous noise (0.904 here:
    sigma 5, integer endpoints rounded outwards) -- the check above (0.95 - 4 SE = 0.9486
    at 320,000 released draws) rejects it, while the selection-aware interval passes."""
    noise, scale, floor, threshold = CASES[0]
    n = threshold - int(scale)
    y = _released_draws(noise, scale, n, threshold, 2_000_000, seed=101)
    z = 1.959964
    plain = _coverage(y, n, lambda u: (np.floor(u - z * scale), np.ceil(u + z * scale)))
    se = math.sqrt(0.95 * 0.05 / len(y))
    assert plain < 0.95 - 4 * se, plain
    tail = iv.NoiseTail(noise, scale, reach=threshold - floor)
    aware = _coverage(y, n, lambda u: iv.count_bounds(u, tail, ALPHA, floor, threshold))
    assert aware >= 0.95 - 4 * se, aware


def test_correlated_noise_tail_is_the_convolution_of_its_parts():
    """NoiseTail with a shared component (noise: correlated) tabulates log P(S + X >= z):
    against the convolution summed directly in linear space, and the count intervals it
    gives are wider than those of X alone (the shared part adds noise)."""
    from thresher.accounting import discrete_gaussian as dg
    sigma, shared = 3.0, 2.0
    tail = iv.NoiseTail(iv.GAUSSIAN, sigma, reach=20, shared=shared)
    x = np.arange(-200, 201)
    s = np.arange(-100, 101)
    pmf = np.convolve(dg.pmf(x, sigma), dg.pmf(s, shared))      # support -300 .. 300
    values = np.arange(-300, 301)
    sf = np.cumsum(pmf[::-1])[::-1]
    z = np.arange(-30, 45)
    want = sf[z - values[0]]
    got = np.exp(tail.log_sf(z))
    assert np.allclose(got, want, rtol=1e-10, atol=1e-300)
    y = np.array([30, 40, 60])
    lo_c, hi_c = iv.count_bounds(y, tail, 0.05, 1, threshold=25)
    lo_i, hi_i = iv.count_bounds(y, iv.NoiseTail(iv.GAUSSIAN, sigma, reach=24), 0.05, 1,
                                 threshold=25)
    assert (hi_c - lo_c >= hi_i - lo_i).all() and (hi_c - lo_c > hi_i - lo_i).any()

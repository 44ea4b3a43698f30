"""Each sampler's pmf, by chi-square tests over 10**6 draws against the exact pmf.

False-failure probability: each chi-square/binomial test rejects an exact sampler with
probability gof.ALPHA = 1e-4; seeds are fixed, so the outcome is deterministic. The
variants with 8-bit prefixes and short tables force the exact slow paths (ties settled
by further random bits, tails by memorylessness or rejection) on thousands of draws,
and the tests assert they were taken.
"""
from fractions import Fraction

import numpy as np
import pytest
from scipy import stats

from tests.transforms.randomness import gof
from thresher.transforms.randomness import samplers

N = 10**6


def _rng(seed):
    return np.random.default_rng(seed)


@pytest.fixture
def slow_path_calls(monkeypatch):
    """Counts exact slow-path resolutions of ties."""
    calls = {"resolve": 0}
    original = samplers._InversionTable._resolve

    def counting(self, rng, prefix, k):
        calls["resolve"] += 1
        return original(self, rng, prefix, k)
    monkeypatch.setattr(samplers._InversionTable, "_resolve", counting)
    return calls


@pytest.mark.parametrize("sigma", [0.5, 1.0, 3.7, 10.0, 1000.0])
def test_discrete_gaussian_pmf(sigma):
    draws = samplers.discrete_gaussian(_rng(int(sigma * 10)), sigma, N)
    assert draws.dtype == np.int64
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_gaussian_pmf(sigma, x)) > gof.ALPHA


@pytest.mark.parametrize("scale", [0.5, 3.0, 1000.0, 1e5])
def test_discrete_laplace_pmf(scale):
    # scale 1e5 exceeds one table and uses the split G = m V + U
    draws = samplers.discrete_laplace(_rng(int(scale * 2)), scale, N)
    assert draws.dtype == np.int64
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_laplace_pmf(scale, x)) > gof.ALPHA


@pytest.mark.parametrize("q", [0.5, 0.9, 0.9999])
def test_geometric_pmf_for_a_rational_ratio(q):
    draws = samplers.geometric(_rng(7), q, N)
    assert draws.min() >= 0
    assert gof.chi_square_pvalue(draws, lambda x: gof.geometric_pmf(q, np.maximum(x, 0)) * (x >= 0)) > gof.ALPHA


def test_chi_square_rejects_a_two_percent_wrong_sigma():
    """Power check: the same test sees sigma 10 vs 10.2 (so the tests above can fail)."""
    draws = samplers.discrete_gaussian(_rng(3), 10.0, N)
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_gaussian_pmf(10.2, x)) < gof.ALPHA


def test_discrete_gaussian_ties_resolved_exactly_with_8_bit_prefixes(slow_path_calls):
    sigma = 3.0
    sampler = samplers._DiscreteGaussianSampler(Fraction(sigma) ** 2, bits=8)
    draws = sampler.sample(_rng(11), 200_000)
    assert slow_path_calls["resolve"] > 5_000
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_gaussian_pmf(sigma, x)) > gof.ALPHA


def test_discrete_gaussian_tail_sampler_exact_with_a_short_table(monkeypatch, fresh_caches):
    monkeypatch.setattr(samplers, "_GAUSSIAN_TAIL_BITS", 1)   # table to ~1.2 sigma
    sigma = 4.0
    sampler = samplers._DiscreteGaussianSampler(Fraction(sigma) ** 2, samplers.PREFIX_BITS)
    draws = sampler.sample(_rng(12), 200_000)
    tail = np.abs(draws) >= sampler.tail_start
    assert tail.sum() > 10_000
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_gaussian_pmf(sigma, x)) > gof.ALPHA


def test_geometric_ties_and_tails_exact_with_8_bit_prefixes(monkeypatch, slow_path_calls, fresh_caches):
    monkeypatch.setattr(samplers, "_GEOMETRIC_TAIL_BITS", 2)  # P(tail) = 1/4: recursion
    lam = Fraction(1, 3)
    sampler = samplers._GeometricSampler(samplers._ExpRatio(lam), bits=8)
    draws = sampler.sample(_rng(13), 200_000)
    assert slow_path_calls["resolve"] > 1_000
    assert (draws >= sampler.table.size).sum() > 20_000
    q = float(np.exp(-1 / 3))
    assert gof.chi_square_pvalue(draws, lambda x: gof.geometric_pmf(q, np.maximum(x, 0)) * (x >= 0)) > gof.ALPHA


def test_geometric_split_into_truncated_and_outer_parts_is_exact(monkeypatch, fresh_caches):
    monkeypatch.setattr(samplers, "_GEOMETRIC_MAX_TABLE", 8)  # three nested splits
    sampler = samplers._GeometricSampler(samplers._ExpRatio(Fraction(1, 50)), samplers.PREFIX_BITS)
    assert sampler.split == 8 and sampler.outer.split == 8
    draws = sampler.sample(_rng(14), N)
    q = float(np.exp(-1 / 50))
    assert gof.chi_square_pvalue(draws, lambda x: gof.geometric_pmf(q, np.maximum(x, 0)) * (x >= 0)) > gof.ALPHA


@pytest.mark.parametrize("p", [0.5, 0.105, 1e-3, 3 * 2.0 ** -12])
def test_bernoulli_frequency(p):
    coins = samplers.bernoulli(_rng(21), p, N)
    assert coins.dtype == bool
    assert stats.binomtest(int(coins.sum()), N, p).pvalue > gof.ALPHA


def test_bernoulli_array_of_probabilities_broadcasts_and_edges_are_exact():
    p = np.array([0.0, 1.0, 0.25, 0.75])
    coins = samplers.bernoulli(_rng(22), np.tile(p, 250_000))
    by_p = coins.reshape(-1, 4)
    assert not by_p[:, 0].any() and by_p[:, 1].all()
    for j in (2, 3):
        assert stats.binomtest(int(by_p[:, j].sum()), 250_000, p[j]).pvalue > gof.ALPHA


@pytest.mark.parametrize("bad", [-0.1, 1.5, float("nan")])
def test_bernoulli_rejects_probabilities_outside_0_1(bad):
    with pytest.raises(ValueError, match="p must be in"):
        samplers.bernoulli(_rng(0), bad, 3)


def _binomial_chi_square(counts, n, p):
    support = np.arange(n + 1)
    expected = stats.binom.pmf(support, n, p) * counts.size
    observed = np.bincount(counts, minlength=n + 1)
    keep = expected >= 20
    obs, exp = observed[keep], expected[keep]
    if (~keep).any():                      # the rare outcomes merged into one bin
        obs = np.append(obs, observed[~keep].sum())
        exp = np.append(exp, expected[~keep].sum())
    return stats.chisquare(obs, exp * obs.sum() / exp.sum()).pvalue


@pytest.mark.parametrize("n,p", [(20, 0.105), (30, 0.7), (400, 0.5), (60, 1e-3)])
def test_binomial_pmf_against_scipy(n, p):
    """Scalar p: exact geometric gaps (p > 1/2 through n - Bin(n, 1 - p))."""
    counts = samplers.binomial(_rng(31), np.full(100_000, n), p)
    assert _binomial_chi_square(counts, n, p) > gof.ALPHA


def test_binomial_with_tiny_chunks_continues_rows_exactly():
    """chunk = 64 words forces rows through many continuation rounds."""
    n = np.array([0, 5, 37, 1000] * 3_000)
    counts = samplers.binomial(_rng(34), n, 0.3, chunk=64)
    assert not counts[n == 0].any()
    assert _binomial_chi_square(counts[n == 5], 5, 0.3) > gof.ALPHA
    assert _binomial_chi_square(counts[n == 37], 37, 0.3) > gof.ALPHA
    big = counts[n == 1000]
    assert abs(big.mean() - 300) < 4.5 * np.sqrt(1000 * 0.21 / big.size)   # false failure 7e-6


def test_binomial_with_a_probability_per_key_uses_exact_coins():
    n = np.tile([12, 12], 50_000)
    p = np.tile([0.25, 0.8], 50_000)
    counts = samplers.binomial(_rng(35), n, p)
    assert _binomial_chi_square(counts[0::2], 12, 0.25) > gof.ALPHA
    assert _binomial_chi_square(counts[1::2], 12, 0.8) > gof.ALPHA


def test_binomial_chunks_keep_keys_apart():
    """Keys larger and smaller than a chunk: totals per key are exact sums of coins."""
    n = np.array([0, 3, 50, 7, 1, 0, 40] * 2000)
    ones = samplers.binomial(_rng(32), n, 1.0, chunk=16)
    zeros = samplers.binomial(_rng(32), n, 0.0, chunk=16)
    assert ones.tolist() == n.tolist() and not zeros.any()
    half = samplers.binomial(_rng(33), n, np.full(n.shape, 0.5), chunk=16)
    assert np.all(half <= n)
    for size in (3, 50, 40):
        got = half[n == size]
        assert stats.binomtest(int(got.sum()), size * got.size, 0.5).pvalue > gof.ALPHA


@pytest.mark.parametrize("fn,arg", [(samplers.discrete_gaussian, 0.0), (samplers.discrete_gaussian, -1.0),
                                    (samplers.discrete_gaussian, float("inf")),
                                    (samplers.discrete_gaussian, float("nan")),
                                    (samplers.discrete_gaussian, 2.0 * samplers.SIGMA_MAX),
                                    (samplers.discrete_laplace, 0.0), (samplers.discrete_laplace, float("nan"))])
def test_bad_noise_parameters_are_rejected_by_name(fn, arg):
    with pytest.raises(ValueError, match="sigma|scale"):
        fn(_rng(0), arg, 3)


def test_geometric_rejects_q_outside_0_1():
    with pytest.raises(ValueError, match="q must be in"):
        samplers.geometric(_rng(0), 1.0, 3)
    assert samplers.geometric(_rng(0), 0.0, 4).tolist() == [0, 0, 0, 0]


def test_zero_draws_and_shapes():
    rng = _rng(5)
    assert samplers.discrete_gaussian(rng, 2.0, 0).shape == (0,)
    assert samplers.discrete_laplace(rng, 2.0, (3, 4)).shape == (3, 4)
    assert samplers.bernoulli(rng, 0.5, (2, 5)).shape == (2, 5)
    assert samplers.uniform_priorities(rng, 7).dtype == np.uint64


def test_geometric_split_path_moments():
    """Scale 1e5 (split G = m V + U): the mean q/(1-q) to within 4.5 standard errors
    (false failure 7e-6) -- a second check, on the first moment, of the split path."""
    q = float(np.exp(-1e-5))
    draws = samplers.discrete_laplace(_rng(41), 1e5, N)  # a difference of two split geometrics
    sd = np.sqrt(2 * q) / (1 - q)
    assert abs(draws.mean()) < 4.5 * sd / np.sqrt(N)
    assert abs(draws.var() / sd**2 - 1) < 4.5 * np.sqrt(5.0 / N)   # kurtosis 6 for Laplace


@pytest.mark.slow
@pytest.mark.parametrize("sampler,param,pmf", [
    (samplers.discrete_gaussian, 2.5, gof.discrete_gaussian_pmf),
    (samplers.discrete_gaussian, 40.0, gof.discrete_gaussian_pmf),
    (samplers.discrete_laplace, 1.0, gof.discrete_laplace_pmf),
    (samplers.discrete_laplace, 25.0, gof.discrete_laplace_pmf),
])
def test_pmf_at_ten_million_draws(sampler, param, pmf):
    """10x the draws of the default tests: relative pmf errors of ~1e-3 become visible."""
    draws = sampler(_rng(51), param, 10 * N)
    assert gof.chi_square_pvalue(draws, lambda x: pmf(param, x)) > gof.ALPHA

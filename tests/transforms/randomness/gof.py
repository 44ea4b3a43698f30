"""Goodness-of-fit helpers for the sampler tests: chi-square against an exact pmf.

The reference pmfs here are written from the distributions' definitions with plain
float64 arithmetic and direct normalisation, independently of the certified integer
arithmetic in transforms/randomness/samplers.py; at 10**6 draws their rounding (about 1e-16
relative) is far below what a chi-square test can see.
"""
import numpy as np
from scipy import stats

# Each chi-square test below fails with probability ALPHA when the sampler is exact
# (seeds are fixed, so a given seed either passes or fails deterministically).
ALPHA = 1e-4


def discrete_gaussian_pmf(sigma, support):
    """P(X = x) proportional to exp(-x^2 / (2 sigma^2)), normalised over |x| <= 40 sigma + 40."""
    wide = np.arange(-int(40 * sigma) - 40, int(40 * sigma) + 41)
    z = np.exp(-wide.astype(np.float64) ** 2 / (2.0 * sigma * sigma)).sum()
    return np.exp(-np.asarray(support, dtype=np.float64) ** 2 / (2.0 * sigma * sigma)) / z


def discrete_laplace_pmf(scale, support):
    """P(X = x) = (1 - q) / (1 + q) q^|x|, q = exp(-1/scale)."""
    q = np.exp(-1.0 / scale)
    return (1 - q) / (1 + q) * q ** np.abs(np.asarray(support, dtype=np.float64))


def geometric_pmf(q, support):
    """P(G = k) = (1 - q) q^k."""
    return (1 - q) * q ** np.asarray(support, dtype=np.float64)


def chi_square_pvalue(draws, pmf, *, min_expected=20.0):
    """Chi-square p-value of integer ``draws`` against ``pmf(support_array)``.

    Support values are merged left to right into bins of expected count >= min_expected;
    everything below the first and above the last bin goes into two tail bins, so the
    test also sees mass in the far tails."""
    draws = np.asarray(draws, dtype=np.int64)
    n = draws.size
    lo, hi = int(draws.min()), int(draws.max())
    span = 2 * max(abs(lo), abs(hi)) + 10   # mass beyond is about 1/n or less
    support = np.arange(-span, span + 1)
    probs = pmf(support)
    expected = n * probs
    # bin edges over the support where expected mass accumulates to min_expected
    cum = np.cumsum(expected)
    bin_of = np.floor(cum / min_expected).astype(np.int64)
    bin_of = np.minimum(bin_of, bin_of[-1] - 1 if bin_of[-1] > 0 else 0)
    n_bins = int(bin_of.max()) + 1
    exp_bins = np.bincount(bin_of, weights=expected, minlength=n_bins)
    obs_bins = np.bincount(bin_of[draws + span], minlength=n_bins).astype(np.float64)
    keep = exp_bins > 0
    exp_bins, obs_bins = exp_bins[keep], obs_bins[keep]
    exp_bins *= n / exp_bins.sum()
    return stats.chisquare(obs_bins, exp_bins).pvalue

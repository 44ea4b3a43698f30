"""accounting.plain_gshm (the forward check of cached gaussian calibrations, plain math)
against the exact accounting it bounds (accounting.gshm.delta with discrete Gaussian noise
and accounting.discrete_gaussian.composed_shift_delta): never below it, and within 1e-9
of it where the accounting uses the same lemma (sigma >= 1.5)."""
import itertools
import sys

import pytest

from thresher.accounting import discrete_gaussian, gshm, plain_gshm

GRID = list(itertools.product([1.6, 3.3, 7.9, 16.0], [0, 3, 10, 40], [1, 2, 8, 20],
                              [0.1, 1.0, 3.0]))


@pytest.mark.parametrize("sigma, gap, c, eps", GRID)
def test_the_plain_bound_is_the_exact_delta_from_above(sigma, gap, c, eps):
    exact = gshm.delta(eps, sigma, gap, c, noise="discrete_gaussian")
    upper = plain_gshm.delta_upper(eps, sigma, gap, c)
    assert upper is not None
    assert upper >= exact * (1 - 1e-13)          # the accounting's own float error only
    if exact < 1.0:
        assert upper <= exact * (1 + 1e-9) + 1e-300


@pytest.mark.parametrize("sigma, c, eps", [(0.4, 3, 1.0), (0.9, 8, 0.5), (1.2, 20, 2.0)])
def test_below_sigma_one_and_a_half_the_bound_stays_above(sigma, c, eps):
    """There the accounting convolves exactly and Lemma A is loose: still an upper bound."""
    for gap in (0, 2, 6):
        exact = gshm.delta(eps, sigma, gap, c, noise="discrete_gaussian")
        assert plain_gshm.delta_upper(eps, sigma, gap, c) >= exact


@pytest.mark.parametrize("sigma, c, eps", [(2.0, 5, 1.0), (30.0, 8, 0.25), (700.0, 40, 0.01),
                                           (1e5, 8, 0.01)])
def test_the_shift_bound_against_the_accounting(sigma, c, eps):
    """Against the accounting's bound (Lemma A; above sd = 50 with Euler-Maclaurin's tail
    bound, within a relative 1e-7 above its sum) and, where affordable, the exact
    convolution."""
    exact = discrete_gaussian.composed_shift_delta(eps, sigma, c, method="bound")
    upper = plain_gshm.shift_delta_upper(eps, sigma, c)
    assert exact * (1 - 1e-7) <= upper <= exact * (1 + 1e-9) + 1e-300
    if sigma <= 30:
        assert upper >= discrete_gaussian.composed_shift_delta(eps, sigma, c, method="exact")
    assert plain_gshm.gaussian_fits(eps, exact * (1 + 1e-6) + 1e-300, c, sigma)
    assert not plain_gshm.gaussian_fits(eps, exact * (1 - 1e-6), c, sigma) or exact == 0


def test_no_scipy_and_a_cost_cap():
    """The check imports no SciPy and takes no exp/log from NumPy (its terms are math.exp's,
    the C library's, as before it summed a block at a time), and gives up (None: recompute)
    past its cost bound instead of running long."""
    assert "scipy" not in plain_gshm.__dict__
    source = open(plain_gshm.__file__, encoding="utf-8").read()
    assert "scipy" not in source.split('"""', 2)[2]
    for name in ("np.exp", "np.log", "np.expm1", "np.log1p", "fixed_order"):
        assert name not in source
    assert plain_gshm.delta_upper(1e-4, 2000.0, 0, 200) is None

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


@pytest.mark.parametrize("sigma, gap, c, eps", GRID[::3])
def test_the_pruned_bound_decides_as_delta_upper(sigma, gap, c, eps):
    """delta_upper_below(level) against delta_upper: never above it, and delta_upper is
    never above max(it, level) (so "<= delta" with level <= delta answers as delta_upper
    does); at level 0 it is delta_upper, bit for bit; and the exact accounting is below
    max(it, level)."""
    full = plain_gshm.delta_upper(eps, sigma, gap, c)
    exact = gshm.delta(eps, sigma, gap, c, noise="discrete_gaussian")
    assert plain_gshm.delta_upper_below(eps, sigma, gap, c, 0.0) == full
    for level in (full * 0.5, full * (1 - 1e-9), full, full * 2, 1.0):
        pruned = plain_gshm.delta_upper_below(eps, sigma, gap, c, level)
        assert pruned <= full
        assert max(pruned, level) >= full
        assert max(pruned, level) >= exact * (1 - 1e-13)


@pytest.mark.parametrize("c", [64, 128])
def test_the_pruned_bound_reaches_large_bounds(c):
    """At C = 64 and 128 (an automatic bound's largest candidates) delta_upper gives up
    (its term budget), the pruned bound does not; it stays above the exact accounting
    (the accounting's bound method, Lemma A, at the calibrated sigma and threshold)."""
    from thresher.pipelines.kinds import gaussian
    eps, delta = 0.9, 1e-8
    params = gaussian.calibrate({"kind": "gaussian", "pre_threshold": 1}, epsilon=eps,
                                delta=delta, max_keys_per_user=c, model="l0")
    sigma, gap = params["sigma"], params["threshold"] - 1
    assert plain_gshm.delta_upper(eps, sigma, gap, c) is None
    pruned = plain_gshm.delta_upper_below(eps, sigma, gap, c, params["delta_achieved"])
    assert pruned is not None and pruned <= delta
    exact = gshm.delta(eps, sigma, gap, c, noise="discrete_gaussian")
    assert max(pruned, params["delta_achieved"]) >= exact * (1 - 1e-13)
    assert params["delta_achieved"] * (1 - 1e-9) <= pruned
    # one threshold step lower fails the exact accounting and the pruned check alike
    assert gshm.delta(eps, sigma, gap - 1, c, noise="discrete_gaussian") > delta
    assert plain_gshm.delta_upper_below(eps, sigma, gap - 1, c, params["delta_achieved"]) > delta

"""accounting.gshm: paper 004's exact GSHM accounting and its calibration.

Checked against the paper's case-study numbers (Section 6, Fig. 1), Corollary 5.4.1's
bounds, brute-force sums over every joint output of small discrete-Gaussian releases
(tests/accounting/threshold_brute_force.py), and search-minimality properties."""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import optimize

from thresher.accounting import discrete_gaussian, gaussian, gshm
from tests.accounting import threshold_brute_force as brute

C_URL, EPS_URL, DELTA_URL = 51914, 0.349, 1e-5  # paper 004, Section 6


# --- paper 004, Section 6 ---------------------------------------------------------------

def test_paper_sigma_2396_minimal_gaps():
    """'... at sigma = 2396 (the necessary value of tau* - tau is 15,148 under "add the
    deltas" and 14,998 under Theorem 5.4).'"""
    exact = gshm.min_threshold_gap(EPS_URL, DELTA_URL, 2396, C_URL, method="exact")
    add = gshm.min_threshold_gap(EPS_URL, DELTA_URL, 2396, C_URL, method="add_deltas")
    assert abs(exact - 14998) <= 1.0
    assert abs(add - 15148) <= 1.0


def test_paper_sigma_2699_minimal_gaps():
    """'... at sigma = 2699 (... about 16,910 under "add the deltas" and 16,894 Thm 5.4).'"""
    exact = gshm.min_threshold_gap(EPS_URL, DELTA_URL, 2699, C_URL, method="exact")
    add = gshm.min_threshold_gap(EPS_URL, DELTA_URL, 2699, C_URL, method="add_deltas")
    assert abs(exact - 16894) <= 2.0
    assert abs(add - 16910) <= 3.0


def test_paper_gap_16176_gives_delta_infinite_1e8():
    """Section 6.2: sigma = 2228 and tau* - tau = 16176 'meets delta_infinite = 1e-8'."""
    d_inf = -math.expm1(C_URL * gshm.log_beta(2228, 16176, "gaussian"))
    assert d_inf == pytest.approx(1e-8, rel=5e-3)


@pytest.mark.parametrize("delta_gshm, ratio", [(1e-7, 1.10), (1e-6, 1.01), (1e-5, 1.001)])
def test_paper_figure_1b_add_the_deltas_ratio(delta_gshm, ratio):
    """Fig. 1b (sigma = 2228, gap 16176): add-the-deltas is 10% / 1% / 0.1% above the
    exact delta where the exact delta is 1e-7 / 1e-6 / 1e-5."""
    def gap(e):
        return math.log(gshm.delta(e, 2228, 16176, C_URL)) - math.log(delta_gshm)
    eps = optimize.brentq(gap, 0.05, 2.0, xtol=1e-12)
    add = gshm.delta(eps, 2228, 16176, C_URL, method="add_deltas")
    assert add / delta_gshm == pytest.approx(ratio, rel=2e-3)


def test_paper_figure_1b_factor_two_near_delta_infinite():
    """Fig. 1b: 'double that of GSHM at delta_GSHM = 1e-8' (the curve's floor is
    delta_infinite = 1.002e-8; just above it the ratio tends to 2)."""
    target = 1.01e-8
    eps = optimize.brentq(lambda e: math.log(gshm.delta(e, 2228, 16176, C_URL) / target),
                          0.05, 2.0, xtol=1e-12)
    assert gshm.delta(eps, 2228, 16176, C_URL, method="add_deltas") / target == pytest.approx(2.0, rel=0.01)


def test_paper_smallest_sigma_and_its_threshold():
    """Section 6.1: no threshold works below the Gaussian mechanism's sigma (2228); there
    the paper's tau* is 13948 (we find gap 13950 at sigma = 2228.48, tau* = 13951)."""
    sigma = gshm.default_sigma(EPS_URL, DELTA_URL, C_URL, noise="gaussian")
    assert round(sigma) == 2228
    assert gshm.min_threshold_gap(EPS_URL, DELTA_URL, sigma * (1 - 1e-6), C_URL) is None
    gap = gshm.min_threshold_gap(EPS_URL, DELTA_URL, sigma, C_URL)
    assert abs(gap + 1 - 13948) <= 5


# --- structure of the bound -------------------------------------------------------------

@settings(max_examples=60, deadline=None)
@given(eps=st.floats(0.05, 3.0), sigma=st.floats(0.5, 50.0), gap=st.floats(0.0, 200.0),
       c_u=st.integers(1, 300))
def test_corollary_5_4_1_bounds_and_method_order(eps, sigma, gap, c_u):
    exact = gshm.delta(eps, sigma, gap, c_u)
    fdp = gshm.delta(eps, sigma, gap, c_u, method="fdp")
    add = gshm.delta(eps, sigma, gap, c_u, method="add_deltas")
    d_inf = -math.expm1(c_u * gshm.log_beta(sigma, gap, "gaussian"))
    d_gauss = gaussian.delta_for_epsilon(math.sqrt(c_u) / sigma, eps)
    tol = 1e-12
    assert max(d_inf, d_gauss) <= exact + tol
    assert exact <= min(1.0, d_inf + d_gauss) + tol
    assert exact <= fdp + tol and fdp <= add + tol  # Section 7
    if c_u == 1:
        assert exact == pytest.approx(max(d_inf, d_gauss), rel=1e-12, abs=1e-300)


@pytest.mark.parametrize("sigma, gap, c_u, eps", [
    (1.3, 4, 1, 0.5), (1.3, 5, 2, 1.0), (1.3, 4, 3, 1.5), (2.0, 7, 2, 0.7),
    (2.0, 9, 3, 1.0), (0.8, 3, 3, 2.0), (3.0, 6, 2, 0.3)])
def test_discrete_exact_delta_equals_brute_force_over_all_outputs(sigma, gap, c_u, eps):
    """Every configuration of a_= keys at the pre-threshold and a_+ keys far above it,
    both directions, all joint outputs: the max equals Thm 5.4 with discrete beta and
    discrete delta_+ (the bound is tight when the a_+ keys are never suppressed)."""
    tau = 2
    half = int(12 * sigma) + 2  # noise mass past 12 sigma is below 1e-31
    noise = brute.noise_table(lambda x: -x * x / (2 * sigma * sigma), half)
    high = tau + gap + half + 2
    configs = brute.l0_configurations(c_u, tau, high)
    expected = brute.worst_delta(configs, noise, tau, tau + gap, eps)
    got = gshm.delta(eps, sigma, gap, c_u, noise="discrete_gaussian")
    assert expected > 1e-9  # a regime where the comparison has digits
    assert got == pytest.approx(expected, rel=1e-8)


def test_discrete_delta_bounds_keys_near_the_threshold():
    """a_+ keys just above the pre-threshold are partly suppressed: post-processing, so
    the true delta is at most the formula's."""
    sigma, gap, tau, c_u, eps = 1.5, 5, 1, 2, 0.8
    half = int(12 * sigma) + 2
    noise = brute.noise_table(lambda x: -x * x / (2 * sigma * sigma), half)
    worst = 0.0
    for near in [tau + 1, tau + 3, tau + gap]:
        configs = [([tau, near], [tau - 1, near - 1]), ([near, near], [near - 1, near - 1])]
        worst = max(worst, brute.worst_delta(configs, noise, tau, tau + gap, eps))
    assert worst <= gshm.delta(eps, sigma, gap, c_u, noise="discrete_gaussian") * (1 + 1e-9)


def test_discrete_beta_is_the_exact_discrete_cdf():
    sigma, gap = 2.5, 6
    x = np.arange(-200, 201)
    p = np.exp(-x * x / (2 * sigma * sigma))
    p /= p.sum()
    assert math.exp(gshm.log_beta(sigma, gap, "discrete_gaussian")) == pytest.approx(p[x < gap].sum(), rel=1e-13)
    # A fractional gap releases exactly when v >= ceil(gap).
    assert gshm.log_beta(sigma, 5.2, "discrete_gaussian") == gshm.log_beta(sigma, 6, "discrete_gaussian")


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.1, 3.0), sigma=st.floats(2.0, 40.0), gap=st.integers(0, 150),
       c_u=st.integers(1, 64), noise=st.sampled_from(gshm.NOISES))
def test_delta_in_unit_interval_and_falls_with_gap(eps, sigma, gap, c_u, noise):
    d = gshm.delta(eps, sigma, gap, c_u, noise=noise)
    assert 0.0 <= d <= 1.0
    assert gshm.delta(eps, sigma, gap + 1, c_u, noise=noise) <= d + 1e-15


# --- calibration ------------------------------------------------------------------------

@settings(max_examples=25, deadline=None)
@given(eps=st.floats(0.2, 3.0), log10_delta=st.floats(-12, -4), c_u=st.integers(1, 200),
       sigma_factor=st.floats(1.0, 3.0), noise=st.sampled_from(gshm.NOISES))
def test_min_threshold_gap_is_the_smallest_qualifying_gap(eps, log10_delta, c_u, sigma_factor, noise):
    target = 10.0 ** log10_delta
    sigma = gshm.default_sigma(eps, target, c_u, noise=noise) * sigma_factor
    gap = gshm.min_threshold_gap(eps, target, sigma, c_u, noise=noise)
    assert gap is not None
    assert gshm.delta(eps, sigma, gap, c_u, noise=noise) <= target
    smaller = gap - 1 if noise == "discrete_gaussian" else gap * (1 - 1e-6)
    assert gshm.delta(eps, sigma, smaller, c_u, noise=noise) > target


@settings(max_examples=20, deadline=None)
@given(eps=st.floats(0.2, 3.0), log10_delta=st.floats(-12, -4), c_u=st.integers(1, 100),
       extra=st.floats(1.0, 2.0), noise=st.sampled_from(gshm.NOISES))
def test_min_sigma_is_the_smallest_qualifying_sigma(eps, log10_delta, c_u, extra, noise):
    target = 10.0 ** log10_delta
    floor = gshm.default_sigma(eps, target, c_u, noise=noise)
    gap = gshm.min_threshold_gap(eps, target, floor, c_u, noise=noise) * extra
    sigma = gshm.min_sigma(eps, target, gap, c_u, noise=noise)
    assert sigma is not None
    assert gshm.delta(eps, sigma, gap, c_u, noise=noise) <= target
    if sigma > floor:
        assert gshm.delta(eps, sigma * (1 - 1e-6), gap, c_u, noise=noise) > target
    # No sigma on a fine grid below the answer qualifies (the single-crossing assumption).
    for s in np.linspace(floor * 0.5, sigma, 40)[:-1]:
        assert gshm.delta(eps, s, gap, c_u, noise=noise) > target


@pytest.mark.parametrize("noise", gshm.NOISES)
@pytest.mark.parametrize("c_u", [1, 8, 100])
def test_default_sigma_also_minimises_the_threshold(noise, c_u):
    """The documented default: under exact accounting the minimal tau* grows with sigma
    (paper 004 Fig. 1a), so the smallest workable sigma is best on both counts."""
    floor = gshm.default_sigma(1.0, 1e-8, c_u, noise=noise)
    gaps = [gshm.min_threshold_gap(1.0, 1e-8, floor * f, c_u, noise=noise)
            for f in (1.0, 1.001, 1.01, 1.1, 1.5, 3.0)]
    assert all(later >= earlier for earlier, later in zip(gaps, gaps[1:]))


def test_calibrate_default_meets_the_budget_with_integer_threshold():
    params = gshm.calibrate(1.0, 1e-8, 8)
    assert params.noise == "discrete_gaussian" and isinstance(params.threshold, int)
    assert params.delta <= 1e-8
    assert params.delta == gshm.delta(1.0, params.sigma, params.threshold - 1, 8,
                                      noise="discrete_gaussian")
    assert gshm.delta(1.0, params.sigma, params.threshold - 2, 8, noise="discrete_gaussian") > 1e-8
    with pytest.raises(Exception):
        params.sigma = 1.0  # frozen


def test_calibrate_given_one_parameter_calibrates_the_other():
    by_sigma = gshm.calibrate(1.0, 1e-8, 8, sigma=20.0, pre_threshold=3)
    assert by_sigma.sigma == 20.0 and by_sigma.pre_threshold == 3
    assert by_sigma.threshold == 3 + gshm.min_threshold_gap(1.0, 1e-8, 20.0, 8, noise="discrete_gaussian")
    by_threshold = gshm.calibrate(1.0, 1e-8, 8, threshold=150)
    assert by_threshold.threshold == 150 and by_threshold.delta <= 1e-8
    both = gshm.calibrate(1.0, 1e-8, 8, sigma=20.0, threshold=200)
    assert both.delta == gshm.delta(1.0, 20.0, 199, 8, noise="discrete_gaussian") <= 1e-8


@pytest.mark.parametrize("kwargs, message", [
    (dict(sigma=10.0), "too small"),
    (dict(threshold=50), "too low"),
    (dict(sigma=16.0, threshold=80), "threshold >= "),
])
def test_calibrate_refuses_budgets_it_cannot_meet_and_says_what_would(kwargs, message):
    with pytest.raises(ValueError, match=message):
        gshm.calibrate(1.0, 1e-8, 8, **kwargs)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="max_keys_per_user"):
        gshm.delta(1.0, 1.0, 1.0, 0)
    with pytest.raises(ValueError, match="noise"):
        gshm.delta(1.0, 1.0, 1.0, 1, noise="laplace")
    with pytest.raises(ValueError, match="method"):
        gshm.delta(1.0, 1.0, 1.0, 1, method="rdp")
    with pytest.raises(ValueError, match="extra_mu"):
        gshm.delta(1.0, 1.0, 1.0, 1, extra_mu=0.1, noise="discrete_gaussian")
    with pytest.raises(ValueError, match="pre_threshold"):
        gshm.calibrate(1.0, 1e-8, 1, pre_threshold=0)

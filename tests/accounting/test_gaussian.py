"""accounting.gaussian: the analytic Gaussian mechanism (Balle & Wang 2018; paper 004 Thm 2.2).

Checked against numerical integration of the hockey-stick divergence, a 60-digit
evaluation of the formula (mpmath), dp_accounting's Gaussian privacy loss distribution,
and paper 004's case-study sigma."""
import math

import mpmath
import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from hypothesis import given, settings, strategies as st
from scipy import integrate, stats

from thresher.accounting import gaussian


def hockey_stick_by_quadrature(mu, eps):
    """int max(phi(x - mu) - e^eps phi(x), 0) dx: the definition, integrated numerically."""
    def integrand(x):
        return max(stats.norm.pdf(x - mu) - math.exp(eps) * stats.norm.pdf(x), 0.0)
    # P > e^eps Q exactly when x > eps/mu + mu/2; integrate from there.
    start = eps / mu + mu / 2
    value, _ = integrate.quad(integrand, start, np.inf, epsabs=0, epsrel=1e-12, limit=200)
    return value


@pytest.mark.parametrize("mu, eps", [(0.5, 0.1), (1.0, 1.0), (2.0, 0.5), (0.3, 2.0),
                                     (1.0, -0.5), (3.0, -2.0), (0.1, 0.0)])
def test_delta_matches_quadrature_including_negative_epsilon(mu, eps):
    expected = hockey_stick_by_quadrature(mu, eps)
    assert gaussian.delta_for_epsilon(mu, eps) == pytest.approx(expected, rel=1e-8, abs=1e-15)


@pytest.mark.parametrize("mu, eps", [(0.05, 1.0), (0.03, 1.0), (0.3, 10.0), (0.2, 3.0)])
def test_tiny_deltas_keep_their_digits(mu, eps):
    """Deltas down to 1e-300 against a 60-digit evaluation of the same formula."""
    with mpmath.workdps(60):
        m, e = mpmath.mpf(mu), mpmath.mpf(eps)
        expected = mpmath.ncdf(m / 2 - e / m) - mpmath.exp(e) * mpmath.ncdf(-m / 2 - e / m)
    got = gaussian.delta_for_epsilon(mu, eps)
    assert float(expected) > 0
    assert got == pytest.approx(float(expected), rel=1e-9)


def test_matches_dp_accounting_gaussian_pld():
    for sigma, eps in [(3.0, 1.0), (1.0, 0.5), (0.7, 2.0)]:
        peer = pld.from_gaussian_mechanism(sigma, value_discretization_interval=1e-4)
        ours = gaussian.delta_for_epsilon(1.0 / sigma, eps)
        # dp_accounting's (pessimistic, discretised) estimate agrees to ~1e-12 here.
        assert peer.get_delta_for_epsilon(eps) == pytest.approx(ours, rel=1e-9)


def test_limits_and_broadcasting():
    assert gaussian.delta_for_epsilon(0.0, 1.0) == 0.0
    assert gaussian.delta_for_epsilon(0.0, -1.0) == pytest.approx(1 - math.exp(-1.0))
    assert gaussian.delta_for_epsilon(math.inf, 1.0) == 1.0
    out = gaussian.delta_for_epsilon(np.array([0.5, 1.0, 2.0]), np.array([[0.1], [1.0]]))
    assert out.shape == (2, 3)
    assert out[1, 1] == pytest.approx(gaussian.delta_for_epsilon(1.0, 1.0))
    with pytest.raises(ValueError, match="mu"):
        gaussian.delta_for_epsilon(-1.0, 1.0)


def test_paper_case_study_sigma():
    """Paper 004 Section 6: sigma = 2228 makes the views column an (0.349, 1e-5)-DP
    Gaussian mechanism for C_u = 51914 (mu = sqrt(C_u) / sigma)."""
    sigma = gaussian.sigma_for(0.349, 1e-5, math.sqrt(51914))
    assert round(sigma) == 2228


@settings(max_examples=60, deadline=None)
@given(eps=st.floats(0.01, 5.0), log10_delta=st.floats(-12, -2),
       sensitivity=st.floats(0.5, 100.0))
def test_sigma_for_is_the_smallest_qualifying_sigma(eps, log10_delta, sensitivity):
    target = 10.0 ** log10_delta
    sigma = gaussian.sigma_for(eps, target, sensitivity)
    assert gaussian.delta_for_epsilon(sensitivity / sigma, eps) <= target
    assert gaussian.delta_for_epsilon(sensitivity / (sigma * (1 - 1e-6)), eps) > target


@settings(max_examples=80, deadline=None)
@given(mu=st.floats(1e-3, 20.0), eps=st.floats(-5.0, 10.0), d=st.floats(1e-4, 1.0))
def test_delta_in_unit_interval_increasing_in_mu_decreasing_in_eps(mu, eps, d):
    value = gaussian.delta_for_epsilon(mu, eps)
    assert 0.0 <= value <= 1.0
    assert gaussian.delta_for_epsilon(mu + d, eps) >= value - 1e-15
    assert gaussian.delta_for_epsilon(mu, eps + d) <= value + 1e-15

"""accounting.tradeoff_composition: the pessimistic pair of a profile and the f-DP
composition, against independent computations.

- Gaussian profiles delta_G(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2)
  compose to delta_G(eps; sqrt(sum mu_r^2)) (Dong, Roth & Su 2022, Cor. 3.3): the
  computed delta is an upper bound within a stated gap of that closed form (written here
  with scipy's normal cdf, not the project's ``accounting.gaussian``).
- Discrete Gaussian stages (``discrete_gaussian.composed_shift_delta`` profiles) against
  dp-accounting's privacy loss distributions (test-only oracle): at least its optimistic
  estimate (a lower bound of the truth), within a few percent of its pessimistic one.
- The pair: H_{e^eps}(P || Q) equals the profile at every grid point of a profile that
  is convex in e^eps (a real mechanism's), is the linear interpolation in e^eps between
  them (connect the dots), dominates the true profile between them; for random valid
  profiles (hypothesis) P and Q are distributions and the pair never exceeds the
  profile at a grid point, in either order (it is a mechanism with that profile; note
  H <= delta_i, with equality on the profile's convex hull, not >=).
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import norm

from accounting import tradeoff_composition as tc
from accounting import discrete_gaussian as dg


def gaussian_delta(eps, mu):
    eps = np.asarray(eps, dtype=float)
    return norm.cdf(-eps / mu + mu / 2) - np.exp(eps) * norm.cdf(-eps / mu - mu / 2)


GRID = np.linspace(0.0, 3.0, 129)


@pytest.mark.parametrize("mus, eps", [((0.1, 0.15, 0.2), 1.0), ((0.3, 0.4), 0.5),
                                      ((0.5, 0.5, 0.5), 2.0), ((0.05, 0.25), 0.8)])
def test_composed_gaussians_match_the_closed_form_within_five_percent(mus, eps):
    pairs = [tc.pessimistic_pair(GRID, gaussian_delta(GRID, m)) for m in mus]
    got = tc.composed_delta(pairs, eps, step=1e-4)
    exact = float(gaussian_delta(eps, math.sqrt(sum(m * m for m in mus))))
    assert exact <= got <= 1.05 * exact + 1e-10, (got, exact)   # grid step 3/128


def test_composition_is_tighter_than_basic_composition():
    """Three Gaussian stages at eps/3 each, summed (basic composition), against the f-DP
    composition at eps: the latter is far smaller."""
    mus, eps = (0.15, 0.15, 0.15), 1.0
    basic = sum(float(gaussian_delta(eps / 3, m)) for m in mus)
    pairs = [tc.pessimistic_pair(GRID, gaussian_delta(GRID, m)) for m in mus]
    assert tc.composed_delta(pairs, eps) < basic / 100


@pytest.mark.parametrize("sigmas, eps", [((3.0, 3.0), 1.0), ((2.0, 4.0, 5.0), 1.5),
                                         ((8.0, 8.0), 0.3)])
def test_discrete_gaussian_stages_against_dp_accounting(sigmas, eps):
    pld = pytest.importorskip("dp_accounting.pld.privacy_loss_distribution")
    pairs, pess, opt = [], None, None
    for s in sigmas:
        pairs.append(tc.pessimistic_pair(GRID, dg.composed_shift_delta(GRID, s, 1)))
        a = pld.from_discrete_gaussian_mechanism(s, sensitivity=1,
                                                 value_discretization_interval=1e-4)
        b = pld.from_discrete_gaussian_mechanism(s, sensitivity=1,
                                                 value_discretization_interval=1e-4,
                                                 pessimistic_estimate=False)
        pess = a if pess is None else pess.compose(a)
        opt = b if opt is None else opt.compose(b)
    got = tc.composed_delta(pairs, eps, step=1e-4)
    lower = opt.get_delta_for_epsilon(eps)
    upper = pess.get_delta_for_epsilon(eps)
    assert lower <= got <= 1.05 * upper, (lower, got, upper)


def test_pair_reproduces_a_convex_profile_and_interpolates_between_its_points():
    mu = 0.7
    grid = np.linspace(0.0, 4.0, 33)
    deltas = gaussian_delta(grid, mu)      # convex in e^eps (a real mechanism's profile)
    pair = tc.pessimistic_pair(grid, deltas)
    assert math.isclose(pair.p.sum() + pair.p_only, 1.0, abs_tol=1e-12)
    assert math.isclose(pair.q.sum() + pair.q_only, 1.0, abs_tol=1e-12)
    assert np.allclose(pair.hockey_stick(grid), deltas, atol=1e-13, rtol=0)
    mid = 0.5 * (grid[:-1] + grid[1:])
    x0, x1, xm = np.exp(grid[:-1]), np.exp(grid[1:]), np.exp(mid)
    line = deltas[:-1] + (deltas[1:] - deltas[:-1]) * (xm - x0) / (x1 - x0)
    assert np.allclose(pair.hockey_stick(mid), line, atol=1e-13, rtol=0)
    assert np.all(pair.hockey_stick(mid) >= gaussian_delta(mid, mu) - 1e-13)
    # beyond the grid: delta(eps_n) of outcomes of P alone, and the pair is symmetric
    assert math.isclose(pair.p_only, deltas[-1], abs_tol=1e-15)
    assert math.isclose(pair.q_only, pair.p_only, abs_tol=1e-12)
    assert np.allclose(np.sort(pair.losses), np.sort(-pair.losses))


def test_pair_of_a_pure_dp_profile_is_randomised_response():
    pair = tc.pessimistic_pair([0.0, 1.0], [0.5, 0.0])
    rr = math.exp(1.0) / (1 + math.exp(1.0))
    assert pair.p_only == 0.0
    assert np.allclose(sorted(pair.p), [1 - rr, rr]) and set(np.round(pair.losses, 12)) == {-1.0, 1.0}


_profiles = st.lists(st.tuples(st.floats(0.01, 1.0), st.floats(0.0, 1.0)), min_size=1,
                     max_size=8)


@settings(max_examples=80, deadline=None)
@given(raw=_profiles, first=st.floats(0.0, 1.0))
def test_pair_of_any_valid_profile_respects_it_and_is_a_distribution_pair(raw, first):
    """Random grids and (non-increasing) deltas: P and Q have mass 1, the pair's
    divergence never exceeds the profile at a grid point (the pair is (eps_i, delta_i)-DP)
    in either order, and equals it at the points on the lower convex hull of the profile
    in e^eps (the first and the last always are)."""
    eps = np.concatenate(([0.0], np.cumsum([e for e, _ in raw])))
    deltas = np.minimum.accumulate(np.concatenate(([first], [d for _, d in raw])))
    pair = tc.pessimistic_pair(eps, deltas)
    assert math.isclose(pair.p.sum() + pair.p_only, 1.0, abs_tol=1e-9)
    assert math.isclose(pair.q.sum() + pair.q_only, 1.0, abs_tol=1e-9)
    assert np.all(pair.p >= 0) and np.all(pair.q >= 0)
    h = pair.hockey_stick(eps)
    reverse = np.maximum(pair.q - np.exp(eps)[:, None] * pair.p, 0).sum(axis=1) + pair.q_only
    assert np.all(h <= deltas + 1e-9) and np.all(reverse <= deltas + 1e-9)
    assert math.isclose(h[-1], deltas[-1], abs_tol=1e-9)
    # equality at eps_0 = 0 iff (1, delta_0) is on the hull from (e^eps_i, delta_i)
    hull_at_0 = min([deltas[0]] + [deltas[i] for i in range(1, len(eps))])
    assert h[0] <= deltas[0] + 1e-9 and h[0] >= hull_at_0 - 1e-9


@settings(max_examples=40, deadline=None)
@given(mus=st.lists(st.floats(0.05, 0.8), min_size=1, max_size=4), eps=st.floats(0.1, 3.0))
def test_composition_upper_bounds_the_gaussian_closed_form(mus, eps):
    pairs = [tc.pessimistic_pair(GRID, gaussian_delta(GRID, m)) for m in mus]
    exact = float(gaussian_delta(eps, math.sqrt(sum(m * m for m in mus))))
    assert tc.composed_delta(pairs, eps, step=1e-3) >= exact


def test_bad_profiles_are_refused():
    with pytest.raises(ValueError, match="start at 0"):
        tc.pessimistic_pair([0.5, 1.0], [0.1, 0.0])
    with pytest.raises(ValueError, match=r"\[0, 1\]"):
        tc.pessimistic_pair([0.0, 1.0], [0.1, -0.1])

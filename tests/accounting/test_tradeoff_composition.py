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
- The direction privacy needs (the pair is not more optimistic than the profile): for
  random profiles (hypothesis: non-convex, ties, zero and tiny deltas) the pair's
  trade-off T(Q, P), computed by Neyman-Pearson over its outcomes, equals
  max_i f_{eps_i, delta_i} on a fine alpha grid to 1e-12.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy.stats import norm

from thresher.accounting import tradeoff_composition as tc
from thresher.accounting import discrete_gaussian as dg


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


def pair_tradeoff(pair, alpha):
    """T(Q, P)(alpha) = inf {1 - E_P phi : E_Q phi <= alpha} of a finite pair, by
    Neyman-Pearson: reject the outcomes in decreasing order of P/Q (the +inf outcome
    first, then decreasing finite loss, Q's own outcome last), randomising inside the
    outcome where E_Q phi reaches alpha (linear interpolation between the cumulative
    (Q-mass, P-mass) corners). Written here from the masses, not from the module's hull."""
    order = np.argsort(-pair.losses, kind="stable")
    x = np.concatenate(([0.0], np.cumsum(pair.q[order]), [1.0]))
    y = pair.p_only + np.concatenate(([0.0], np.cumsum(pair.p[order]), [pair.p.sum()]))
    x[-2] = min(x[-2], 1.0)
    return 1.0 - np.interp(alpha, x, y)


def profile_tradeoff(eps, deltas, alpha):
    """max_i f_{eps_i, delta_i}(alpha), f_{e, d}(a) = max(0, 1 - d - e^e a, e^-e (1 - d - a))."""
    a = np.asarray(alpha)[:, None]
    e, d = np.asarray(eps)[None, :], np.asarray(deltas)[None, :]
    lines = np.maximum(1 - d - np.exp(e) * a, np.exp(-e) * (1 - d - a))
    return np.maximum(lines.max(axis=1), 0.0)


_delta_values = st.one_of(st.just(0.0), st.floats(1e-300, 1e-10), st.floats(1e-10, 1e-3),
                          st.floats(0.0, 1.0))
_eps_steps = st.one_of(st.floats(1e-6, 1e-3), st.floats(0.01, 1.5))
_raw_profiles = st.lists(st.tuples(_eps_steps, _delta_values, st.booleans()), min_size=1,
                         max_size=10)
ALPHAS = np.linspace(0.0, 1.0, 20_001)


@settings(max_examples=150, deadline=None)
@given(raw=_raw_profiles, first=_delta_values)
def test_pair_tradeoff_equals_the_profile_envelope_not_more_optimistic(raw, first):
    """The direction privacy needs: T(Q, P) of the pair equals f~ = max_i f_{eps_i,
    delta_i} (deltas after the running minimum pessimistic_pair applies) everywhere, so
    the pair is not more optimistic (larger trade-off) than the profile allows; checked on
    a 1/20000 alpha grid with the trade-off computed by Neyman-Pearson over the pair's
    outcomes. Random profiles are non-convex in e^eps, with ties (a True flag repeats the
    previous delta), zero, tiny (down to 1e-300) and close eps grid points."""
    eps = np.concatenate(([0.0], np.cumsum([e for e, _, _ in raw])))
    deltas = [first]
    for _, d, tie in raw:
        deltas.append(deltas[-1] if tie else d)
    deltas = np.minimum.accumulate(np.array(deltas))
    pair = tc.pessimistic_pair(eps, deltas)
    got = pair_tradeoff(pair, ALPHAS)
    want = profile_tradeoff(eps, deltas, ALPHAS)
    assert np.max(np.abs(got - want)) <= 1e-12, (np.max(np.abs(got - want)), eps, deltas)

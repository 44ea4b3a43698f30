"""accounting.known_domain: calibration over a public key domain checked against
independent computations (brute-force hockey-stick sums over the discrete Gaussian pmf,
brute-force privacy-loss maxima of the discrete Laplace), the bounded-domain rules
(paper 002 Lemma 4.2 / Thm 4.3) and vectorised Algorithm 5."""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thresher.accounting import contribution_bound, known_domain


def _dgauss_pmf(sigma, half_width):
    """pmf of N_Z(0, sigma^2) on [-half_width, half_width], normalised by a direct sum over
    a much wider range (independent of accounting.discrete_gaussian)."""
    wide = np.arange(-40 * int(math.ceil(sigma)) - 60, 40 * int(math.ceil(sigma)) + 61)
    z = np.exp(-wide.astype(float) ** 2 / (2 * sigma * sigma)).sum()
    x = np.arange(-half_width, half_width + 1)
    return x, np.exp(-x.astype(float) ** 2 / (2 * sigma * sigma)) / z


def _brute_delta(epsilon, sigma, count):
    """sum over the integer grid of max(0, P(x) - e^eps Q(x)) with P = N_Z(1, s^2)^count,
    Q = N_Z(0, s^2)^count, in both directions (max), by explicit enumeration."""
    half = int(math.ceil(12 * sigma)) + 2
    x, q1 = _dgauss_pmf(sigma, half)
    p1 = np.exp(-(x - 1.0) ** 2 / (2 * sigma * sigma)) * (q1 / np.exp(-x.astype(float) ** 2 / (2 * sigma * sigma)))
    p, q = np.ones(1), np.ones(1)
    for _ in range(count):
        p = np.multiply.outer(p, p1).ravel()
        q = np.multiply.outer(q, q1).ravel()
    forward = np.maximum(0.0, p - math.exp(epsilon) * q).sum()
    backward = np.maximum(0.0, q - math.exp(epsilon) * p).sum()
    return max(forward, backward)


@pytest.mark.parametrize("count, sigma, epsilon", [
    (1, 0.8, 0.5), (1, 2.0, 1.0), (2, 1.0, 0.5), (2, 1.7, 1.0), (3, 1.2, 0.8), (3, 0.6, 2.0)])
def test_gaussian_delta_equals_brute_force_hockey_stick(count, sigma, epsilon):
    got = known_domain.gaussian_delta(epsilon, sigma, count)
    want = _brute_delta(epsilon, sigma, count)
    assert got == pytest.approx(want, rel=1e-6, abs=1e-15)


@pytest.mark.parametrize("count, epsilon, delta", [(1, 1.0, 1e-3), (2, 0.5, 1e-2), (3, 1.0, 1e-3)])
def test_calibrated_sigma_is_the_smallest_meeting_delta_by_brute_force(count, epsilon, delta):
    sigma = known_domain.gaussian_sigma(epsilon, delta, count)
    assert _brute_delta(epsilon, sigma, count) <= delta
    assert _brute_delta(epsilon, sigma * (1 - 1e-3), count) > delta


def test_fewer_shifted_keys_never_cost_more_delta():
    """The worst case of a user in a <= C keys is a = C (post-processing argument in the
    module docstring), checked by brute force for C = 3."""
    deltas = [_brute_delta(0.7, 1.1, a) for a in (1, 2, 3)]
    assert deltas[0] < deltas[1] < deltas[2]


def test_discrete_gaussian_needs_more_than_the_continuous_formula_sometimes():
    """At small sigma the continuous analytic-Gaussian delta (mu = sqrt(C)/sigma) differs
    from the exact discrete one, which is what thresher reports and calibrates with."""
    from thresher.accounting.gaussian import delta_for_epsilon
    exact = known_domain.gaussian_delta(1.0, 0.6, 2)
    continuous = delta_for_epsilon(math.sqrt(2) / 0.6, 1.0)
    assert abs(exact - continuous) / exact > 1e-3
    assert exact == pytest.approx(_brute_delta(1.0, 0.6, 2), rel=1e-6)


def _dlap_logpmf(x, b):
    return -np.abs(x) / b   # unnormalised: the normaliser cancels in ratios


@pytest.mark.parametrize("c, epsilon", [(1, 1.0), (2, 0.5), (3, 2.0)])
def test_laplace_scale_gives_exactly_epsilon_over_every_l1_shift(c, epsilon):
    """Max over outputs x and shifts Delta with ||Delta||_1 <= C (2 keys) of the privacy
    loss log P(x - Delta) / P(x) is C / b: the calibrated b = C/epsilon meets epsilon
    exactly (closed form), checked by enumeration."""
    params = known_domain.calibrate("laplace", epsilon, 1e-6, c, "l1")
    b = params.scale
    assert b == c / epsilon and params.delta == 0.0
    grid = np.arange(-3 * c - 3, 3 * c + 4)
    worst = -np.inf
    for d1 in range(-c, c + 1):
        for d2 in range(-(c - abs(d1)), c - abs(d1) + 1):
            x1, x2 = np.meshgrid(grid, grid)
            loss = (_dlap_logpmf(x1 - d1, b) + _dlap_logpmf(x2 - d2, b)
                    - _dlap_logpmf(x1, b) - _dlap_logpmf(x2, b))
            worst = max(worst, loss.max())
    assert worst == pytest.approx(epsilon, rel=1e-12)
    assert known_domain.laplace_epsilon(b, c) == pytest.approx(epsilon)


def test_given_noise_that_misses_the_budget_is_refused():
    with pytest.raises(ValueError, match="scale >= 4"):
        known_domain.calibrate("laplace", 1.0, 1e-6, 4, "l1", scale=3.0)
    with pytest.raises(ValueError, match="sigma >="):
        known_domain.calibrate("gaussian", 1.0, 1e-8, 4, "l0", sigma=2.0)
    ok = known_domain.calibrate("gaussian", 1.0, 1e-8, 4, "l0", sigma=20.0)
    assert ok.delta_achieved <= 1e-8
    with pytest.raises(ValueError, match="l0"):
        known_domain.calibrate("gaussian", 1.0, 1e-8, 4, "l1")


# ---- the bounded-domain rules -------------------------------------------------------------

def test_rank_counts_and_tail_sums_against_brute_force():
    rng = np.random.default_rng(3)
    w = rng.integers(1, 40, size=300)
    cands = [1, 2, 3, 5, 8, 13, 21, 34, 40]
    assert known_domain.rank_counts(w, cands).tolist() == [int((w >= c).sum()) for c in cands]
    s = 16
    want = [sum(min(math.sqrt(x), math.sqrt(s)) for x in w if x > c) for c in cands]
    np.testing.assert_allclose(known_domain.tail_sums(w, cands, s), want, rtol=1e-12)


def test_laplace_rule_scores_are_lemma_4_2s():
    rng = np.random.default_rng(4)
    w = rng.integers(1, 100, size=500)
    cands = list(range(1, 101))
    rule = known_domain.domain_bound_rule("laplace", cands, 30, epsilon=0.5)
    assert rule.rank == 60
    np.testing.assert_array_equal(
        np.array([float(x) for x in rule.scores(rule.statistic(w))]),
        contribution_bound.laplace_bound_scores(w, 30, 0.5, cands))
    # With a huge selection epsilon the draw is Lemma 4.2's C* (the 60th largest weight).
    best = contribution_bound.laplace_best_bound(w, 30, 0.5)
    chosen, _ = rule.choose(rule.statistic(w), 1e4, np.random.default_rng(0))
    assert rank_gap(w, chosen, 60) <= rank_gap(w, best, 60)


def rank_gap(w, c, k):
    return abs(int((np.asarray(w) >= c).sum()) - k)


def test_gaussian_rule_is_thm_4_3_on_deduplicated_histograms():
    """Scores are -|S(C) - M(C)| with S from contribution_bound.gaussian_tail_sum on
    (l1, l2) = (k, sqrt k) at B = sqrt(C), and M(C) = d sigma(C)/sqrt(C) sqrt(2/pi)."""
    rng = np.random.default_rng(5)
    k = rng.integers(1, 30, size=400)
    cands = (1, 2, 4, 8, 16)
    params = {c: {"sigma": known_domain.gaussian_sigma(1.0, 1e-8, c)} for c in cands}
    rule = known_domain.domain_bound_rule("gaussian", cands, 50, params_by_bound=params,
                                          sparsity=16)
    tail = contribution_bound.gaussian_tail_sum(k, np.sqrt(k), np.sqrt(cands), 16)
    m = [50 * params[c]["sigma"] / math.sqrt(c) * math.sqrt(2 / math.pi) for c in cands]
    # exact scores: each user's ratio is rounded down by < 2^-20 (400 users here)
    got = np.array([float(x) for x in rule.scores(rule.statistic(k))])
    np.testing.assert_allclose(got, -np.abs(tail - np.array(m)), rtol=0, atol=400 * 2.0 ** -20)
    assert rule.sensitivity == 4.0 and rule.selection_sensitivity == 4


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 60), min_size=1, max_size=80), st.integers(1, 60),
       st.sampled_from(["laplace", "gaussian"]))
def test_removing_a_user_moves_each_score_by_at_most_the_sensitivity(weights, extra, kind):
    cands = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 60)
    params = {c: {"sigma": 5.0 * math.sqrt(c)} for c in cands}
    rule = known_domain.domain_bound_rule(kind, cands, 20, epsilon=1.0, params_by_bound=params,
                                          sparsity=60)
    with_user = rule.scores(rule.statistic(weights + [extra]))
    without = rule.scores(rule.statistic(weights))
    # exact Fractions: the bound holds with no tolerance
    assert all(abs(a - b) <= rule.selection_sensitivity for a, b in zip(with_user, without))
    # the statistic adds over disjoint sets of users (what the Beam stage relies on)
    np.testing.assert_array_equal(rule.statistic(weights + [extra]),
                                  rule.statistic(weights) + rule.statistic([extra]))


# ---- Algorithm 5 ------------------------------------------------------------------------------

def test_vectorised_debias_equals_the_scalar_algorithm_5():
    y = np.array([-5, 0, 1, 7, 80, 150, 199, 200, 10**5], dtype=np.int64)
    got = known_domain.poisson_debias_counts(y, 100, 2)
    for value, g in zip(y, got):
        if value <= 0:
            assert g == 0.0
        elif value >= 200:
            assert g == math.inf
        else:
            assert g == pytest.approx(contribution_bound.poisson_debias(value, 100, 2), rel=1e-9)
    # bound 1 (the l0 model's per-key clip) has the closed form -n log(1 - y/n)
    y1 = np.array([1, 10, 50, 99])
    np.testing.assert_allclose(known_domain.poisson_debias_counts(y1, 100, 1),
                               -100 * np.log1p(-y1 / 100), rtol=1e-9)


def test_debias_recovers_poisson_totals_in_simulation():
    """n = 50 000 users with N_i ~ Poisson(1.2) clipped at C = 2 lose 13.7% of the total
    (E min(X, 2) = 2 - 3.2 e^-1.2 = 1.036);
    Alg. 5 on the clipped sum plus discrete Laplace(2/1) noise is within 1% of the truth
    (the Poisson sampling sd of the total is ~245 = 0.4%; false failure < 1e-4, seed 11)."""
    from thresher.transforms.randomness import samplers
    rng = np.random.default_rng(11)
    counts = rng.poisson(1.2, size=50_000)
    clipped = np.minimum(counts, 2).sum()
    noisy = clipped + samplers.discrete_laplace(rng, 2.0, 1)[0]
    estimate = known_domain.poisson_debias_counts(np.array([noisy]), 50_000, 2)[0]
    assert abs(clipped - counts.sum()) / counts.sum() > 0.1
    assert abs(estimate - counts.sum()) / counts.sum() < 0.01

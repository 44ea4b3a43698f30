"""The auditor itself: its confidence bounds, its power, and that it cannot be fooled by
choosing events on the data it evaluates.

False-failure probabilities: each audit's bound is valid with probability >= 0.999
(auditor.audit's confidence), so a test asserting "not violated" on a correct mechanism
fails with probability <= 1e-3; seeds are fixed, so outcomes are deterministic."""
import math

import numpy as np
import pytest
from scipy import stats

from tests.audit import auditor

pytestmark = pytest.mark.audit


@pytest.mark.parametrize("k,n", [(0, 100), (1, 100), (37, 100), (100, 100), (12, 500_000)])
def test_clopper_pearson_matches_scipy_exact_interval(k, n):
    alpha = 0.01
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
    assert math.isclose(float(auditor.clopper_pearson_lower(k, n, alpha)), ci.low, rel_tol=1e-6, abs_tol=1e-15)  # scipy finds roots to ~1e-8
    assert math.isclose(float(auditor.clopper_pearson_upper(k, n, alpha)), ci.high, rel_tol=1e-6)


def test_clopper_pearson_bounds_cover_the_true_proportion():
    """Coverage over 10^5 simulated experiments (n = 200, p = 0.03): each one-sided bound
    must hold at least 1 - alpha = 95% of the time; 94% allows for simulation noise
    (binomial sd of the coverage 0.07%: false failure < 1e-9)."""
    rng = np.random.default_rng(1)
    k = rng.binomial(200, 0.03, size=100_000)
    assert np.mean(auditor.clopper_pearson_lower(k, 200, 0.05) <= 0.03) >= 0.94
    assert np.mean(auditor.clopper_pearson_upper(k, 200, 0.05) >= 0.03) >= 0.94


def _randomized_response(epsilon):
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    return (lambda rng, n: (rng.random(n) < p).astype(np.int64),
            lambda rng, n: (rng.random(n) < 1 - p).astype(np.int64))


def test_auditor_is_nearly_tight_on_randomized_response():
    run_d, run_d_prime = _randomized_response(1.0)
    result = auditor.audit(run_d, run_d_prime, claimed_epsilon=1.0, claimed_delta=0.0, seed=2)
    assert not result.violated
    assert result.epsilon_lower_bound >= 0.95


def test_auditor_flags_randomized_response_claimed_below_its_epsilon():
    run_d, run_d_prime = _randomized_response(1.1)
    result = auditor.audit(run_d, run_d_prime, claimed_epsilon=1.0, claimed_delta=0.0, seed=3)
    assert result.violated, result.summary()


def _leak(probability):
    """D: outputs 1 ("the user's secret") with the given probability, else 0; D': always 0."""
    return (lambda rng, n: (rng.random(n) < probability).astype(np.int64),
            lambda rng, n: np.zeros(n, dtype=np.int64))


def test_auditor_charges_delta_sized_events_against_the_claimed_delta():
    run_d, run_d_prime = _leak(2e-3)
    flagged = auditor.audit(run_d, run_d_prime, claimed_epsilon=1.0, claimed_delta=1e-3, seed=4)
    assert flagged.violated and flagged.event == "{1}", flagged.summary()
    covered = auditor.audit(run_d, run_d_prime, claimed_epsilon=1.0, claimed_delta=3e-3, seed=4)
    assert not covered.violated


def test_held_out_events_do_not_overfit_identical_distributions():
    """10^4 equally likely outcomes under both D and D': choosing the 'best' outcomes on
    the same data would find large spurious ratios (checked below); the held-out bound
    must not."""
    same = lambda rng, n: rng.integers(0, 10_000, size=n)
    result = auditor.audit(same, same, claimed_epsilon=0.05, claimed_delta=0.0, trials=200_000, seed=5)
    assert not result.violated
    # the in-sample optimum on the selection half alone is a false alarm
    rng = np.random.default_rng(6)
    a, b = same(rng, 100_000), same(rng, 100_000)
    in_sample, _ = auditor._likelihood_events(a, b, a.size, b.size, 0.0, 0.05)
    assert in_sample > 0.05


def test_threshold_events_find_a_shifted_integer_gaussian():
    """Discrete Gaussian sigma = 2 shifted by one: the exact delta(eps) is known
    (accounting.discrete_gaussian.shift_delta); at that delta the audit must not exceed
    eps, and must see most of it."""
    from thresher.accounting import discrete_gaussian
    from thresher.transforms.randomness import samplers
    sigma, eps = 2.0, 1.0
    delta = discrete_gaussian.shift_delta(eps, sigma)
    run_d = lambda rng, n: samplers.discrete_gaussian(rng, sigma, n) + 1
    run_d_prime = lambda rng, n: samplers.discrete_gaussian(rng, sigma, n)
    result = auditor.audit(run_d, run_d_prime, claimed_epsilon=eps, claimed_delta=delta,
                           events="threshold", seed=7)
    assert not result.violated
    assert result.epsilon_lower_bound > 0.5 * eps, result.summary()


def test_combined_codes_separate_distinct_rows():
    codes = auditor.combine_codes([1, 1, 2, 1], [5, 6, 5, 5])
    assert codes[0] == codes[3] and len(set(codes.tolist())) == 3


def test_audit_rejects_a_mechanism_returning_the_wrong_number_of_codes():
    with pytest.raises(ValueError, match="codes for"):
        auditor.audit(lambda rng, n: np.zeros(n - 1, np.int64), lambda rng, n: np.zeros(n, np.int64),
                      claimed_epsilon=1.0, claimed_delta=0.0, trials=10)

"""plain_gshm.delta_upper_below (the branch and bound behind the gaussian cache check)
against an independent brute force of paper 004 Thm 5.4 (``gshm_brute_force``: mpmath,
explicit convolutions, no Lemma A): each range bound is above every true term of its range
(the docstring's monotonicity in the count and in x), max(B, level) is above the true delta
at any level, and a tampered cached calibration is accepted only when the true delta at its
sigma and threshold is within the budget. Deterministic (no sampling)."""
import math

import mpmath
import pytest

from thresher.accounting import plain_gshm
from thresher.pipelines.kinds import gaussian

from tests.accounting.gshm_brute_force import GshmBruteForce

# (sigma, gap, C, eps): Lemma A's factor loose (sigma < 1.5) and tight, deltas from ~0.8
# down to ~1e-9, so that ranges are both dismissed and halved.
POINTS = [(0.8, 3, 6, 1.0), (1.2, 5, 6, 2.0), (1.6, 8, 6, 1.0), (2.0, 10, 5, 2.0),
          (1.6, 3, 6, 0.1), (2.5, 12, 4, 1.5), (1.1, 1, 6, 0.5)]

_ORACLES = {}


def oracle(sigma, gap, c):
    if (sigma, gap, c) not in _ORACLES:
        _ORACLES[sigma, gap, c] = GshmBruteForce(sigma, gap, c)
    return _ORACLES[sigma, gap, c]


@pytest.mark.parametrize("sigma, gap, c, eps", POINTS)
def test_every_range_bound_is_above_the_true_terms_of_its_range(sigma, gap, c, eps):
    """The one claim the pruning rests on: for a_eq in [a1, a2], the terms evaluated at
    count C - a1 and x = a2 lb (1 + 4u) bound both Thm 5.4 terms of every a_eq in the range
    (delta_+ non-decreasing in the count, g_n and delta_+ non-increasing in x). Checked over
    every range, not only those the bisection visits."""
    truth = oracle(sigma, gap, c).terms(eps)
    budget = plain_gshm._Budget(plain_gshm.PRUNED_MAX_TERMS)
    lb = plain_gshm.log_beta_lower(sigma, gap, budget)
    assert lb <= oracle(sigma, gap, c).log_beta
    for a1 in range(c):
        for a2 in range(a1, c):
            bound = max(plain_gshm._terms(eps, sigma, c, a1, a2 * lb * (1.0 + 4.0 * plain_gshm.U),
                                          budget))
            worst = max(max(truth[a]) for a in range(a1, a2 + 1))
            assert mpmath.mpf(bound) >= worst, (a1, a2, bound, worst)


@pytest.mark.parametrize("sigma, gap, c, eps", POINTS)
def test_the_pruned_bound_and_its_level_cover_the_brute_force_delta(sigma, gap, c, eps):
    """max(B, level) >= the true delta at every level (0, just below / at / above each true
    term, the true delta itself, 1), and B never above delta_upper."""
    o = oracle(sigma, gap, c)
    true = o.delta(eps)
    full = plain_gshm.delta_upper(eps, sigma, gap, c)
    values = sorted({float(v) for pair in o.terms(eps) for v in pair} | {float(true)})
    levels = [0.0, 1.0] + [v * f for v in values for f in (1 - 1e-9, 1.0, 1 + 1e-9)]
    for level in levels:
        pruned = plain_gshm.delta_upper_below(eps, sigma, gap, c, level)
        assert pruned is not None and pruned <= full
        assert mpmath.mpf(max(pruned, level)) >= true, (level, pruned, true)
        if level < true:
            assert mpmath.mpf(pruned) >= true, (level, pruned, true)


@pytest.mark.parametrize("c, eps, delta", [(3, 2.0, 1e-3), (5, 4.0, 1e-3)])
def test_a_tampered_cached_calibration_is_refused_when_the_true_delta_exceeds_the_budget(
        c, eps, delta):
    """The gaussian cache check accepts (sigma, threshold, delta_achieved) only when the
    brute-force delta at that sigma and threshold is within delta: the honest calibration
    (tight to ~1e-8 of delta) and tampered ones (sigma lowered by 1e-2 .. 1e-10 relative,
    threshold lowered, delta_achieved lowered or raised up to delta)."""
    mech = {"kind": "gaussian", "pre_threshold": 1}
    kw = dict(epsilon=eps, delta=delta, max_keys_per_user=c, model="l0")
    honest = gaussian.calibrate(mech, **kw)
    tampered = [honest, {**honest, "threshold": honest["threshold"] - 1},
                {**honest, "delta_achieved": delta},
                {**honest, "delta_achieved": honest["delta_achieved"] * (1 - 1e-5)},
                {**honest, "delta_achieved": math.nextafter(delta, 2.0)}]
    tampered += [{**honest, "sigma": honest["sigma"] * (1 - 10.0 ** -k)}
                 for k in (2, 5, 7, 8, 9, 10)]
    tampered += [{**honest, "sigma": honest["sigma"] * (1 - 1e-7), "delta_achieved": delta}]
    accepted = 0
    for params in tampered:
        ok = gaussian.verify_calibration(params, mech, **kw)
        true = GshmBruteForce(params["sigma"], params["threshold"] - 1, c).delta(eps)
        if ok:
            accepted += 1
            assert true <= delta and params["delta_achieved"] <= delta, params
        if true > delta:
            assert not ok, params
    assert gaussian.verify_calibration(honest, mech, **kw)
    assert 1 < accepted < len(tampered)


@pytest.mark.parametrize("sigma, gap, c, eps", POINTS[:3])
def test_a_range_dismissed_at_once_is_bounded_at_its_first_count_and_last_x(
        sigma, gap, c, eps, monkeypatch):
    """At a level above every bound the whole range a_eq = 0..C-1 is dismissed by one
    evaluation: it must be at count C (a_first = 0) and x <= (C - 1) ln beta (the largest
    a_eq's x, rounded down), and its value above every true term; then B is 1 - beta^C's
    bound alone. (Where the maximum sits at a_eq = 0, as at these points, B itself cannot
    show a bound taken at the wrong end of a range; this looks at the call.)"""
    o = oracle(sigma, gap, c)
    calls = []
    real = plain_gshm._terms

    def spy(eps_, sigma_, c_, a_first, x, budget):
        out = real(eps_, sigma_, c_, a_first, x, budget)
        calls.append((a_first, x, max(out)))
        return out
    monkeypatch.setattr(plain_gshm, "_terms", spy)
    pruned = plain_gshm.delta_upper_below(eps, sigma, gap, c, 1.0)
    assert len(calls) == 1
    a_first, x, bound = calls[0]
    assert a_first == 0 and mpmath.mpf(x) <= (c - 1) * o.log_beta
    assert mpmath.mpf(bound) >= max(max(t) for t in o.terms(eps))
    assert mpmath.mpf(pruned) >= 1 - o.beta ** c


def test_a_nan_level_dismisses_nothing():
    """The contract "gshm delta <= max(B, level)" cannot lean on a NaN level (Python's
    max(B, nan) is B): with one, no range is dismissed and B is delta_upper's value, above
    the brute-force delta. (verify_calibration refuses a NaN delta_achieved before this;
    without the guard B was 5.8e-6 here against a true delta of 0.33.)"""
    sigma, gap, c, eps = POINTS[2]
    pruned = plain_gshm.delta_upper_below(eps, sigma, gap, c, math.nan)
    assert pruned == plain_gshm.delta_upper(eps, sigma, gap, c)
    assert mpmath.mpf(pruned) >= oracle(sigma, gap, c).delta(eps)

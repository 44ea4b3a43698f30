"""Tests of accounting.selection (the exponential mechanism).

Independent computations: probabilities from math.exp / math.fsum in plain Python, the
privacy-loss ratio checked on neighbouring score vectors, the sampler's output
distribution checked by a chi-square test.
"""
import math
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from thresher.accounting import selection
from thresher.transforms.randomness import samplers


def _direct_probabilities(scores, epsilon, sensitivity, factor=2.0):
    weights = [math.exp(epsilon * s / (factor * sensitivity)) for s in scores]
    total = math.fsum(weights)
    return [w / total for w in weights]


def test_probabilities_match_the_direct_formula():
    scores = [-3.0, 0.0, 2.5, -10.0, 1.0]
    got = selection.exponential_mechanism_probabilities(scores, 0.7, 1.5)
    np.testing.assert_allclose(got, _direct_probabilities(scores, 0.7, 1.5), rtol=1e-12)
    assert math.isclose(got.sum(), 1.0, rel_tol=1e-12)


def test_monotone_variant_drops_the_factor_two():
    scores = [-3.0, 0.0, 2.5]
    got = selection.exponential_mechanism_probabilities(scores, 0.7, 1.5, monotone=True)
    np.testing.assert_allclose(got, _direct_probabilities(scores, 0.7, 1.5, factor=1.0),
                               rtol=1e-12)


def test_scores_spanning_1e6_do_not_underflow_or_overflow():
    # epsilon / (2 * sensitivity) = 1, so log p_i = s_i - log(sum_j exp(s_j)).
    scores = np.array([0.0, -1e6, -10.0, -5e5, -1e6 + 1.0])
    log_p = selection.exponential_mechanism_log_probabilities(scores, 2.0, 1.0)
    assert np.all(np.isfinite(log_p))
    lse = math.log(1.0 + math.exp(-10.0))          # the other terms are below 1e-200000
    np.testing.assert_allclose(log_p, scores - lse, rtol=1e-15, atol=1e-12)
    p = selection.exponential_mechanism_probabilities(scores, 2.0, 1.0)
    assert not np.any(np.isnan(p))
    assert p[1] == 0.0 and p[3] == 0.0
    assert math.isclose(p.sum(), 1.0, rel_tol=1e-12)
    # A common shift of 1e6 (e.g. V(C) of a big dataset) changes nothing.
    np.testing.assert_allclose(
        selection.exponential_mechanism_probabilities(scores + 1e6, 2.0, 1.0), p, rtol=1e-9)
    # Sampling never draws a probability-0 candidate.
    rng = np.random.default_rng(0)
    draws = {selection.exponential_mechanism(scores, 2.0, 1.0, rng) for _ in range(200)}
    assert draws <= {0, 2}


class _ScriptedWords:
    """An rng whose 64-bit words are given in advance (``bits`` protocol)."""

    def __init__(self, words):
        self._words = list(words)

    def bits(self, n):
        out, self._words = self._words[:n], self._words[n:]
        return np.array(out, dtype=np.uint64)


def test_rational_coin_is_exact_over_every_value_of_its_random_bits():
    """bernoulli_rational(3/7) reads 3 random bits (the top bits of one word): values 0-2
    say yes, 3-6 say no and 7 is rejected and redrawn, so P[yes] = 3/7 exactly -- not a
    53-bit grid approximation of it."""
    outcomes = []
    for value in range(8):
        word = value << 61
        rng = _ScriptedWords([word, 0])          # a rejected 7 is followed by a 0 ("yes")
        outcomes.append(selection.bernoulli_rational(rng, Fraction(3, 7)))
    assert outcomes == [True, True, True, False, False, False, False, True]


def test_tiny_probability_candidates_keep_their_exact_exponent():
    """The realised law is exp(-x_r) for the exact rational exponents: a candidate 1000
    nats below the best keeps exponent exactly 1000 (a float CDF gave it probability 0 or
    2^-53, an unbounded ratio between neighbouring datasets)."""
    x = selection.exact_exponents([0.0, -2000.0, -1999.0], 1.0, 1.0)
    assert x == [Fraction(0), Fraction(1000), Fraction(1999, 2)]
    # The best candidate is accepted with probability exactly 1.
    assert selection.bernoulli_exp(np.random.default_rng(0), x[0]) is True


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2), 7.25])
def test_exp_coin_frequency_matches_exp_minus_gamma(gamma):
    """20000 exact Bernoulli(exp(-gamma)) coins against exp(-gamma): a two-sided binomial
    test at p < 1e-5 (false failure 1e-5 per case; fixed seed)."""
    rng = np.random.default_rng(20261123)
    hits = sum(selection.bernoulli_exp(rng, gamma) for _ in range(20000))
    assert stats.binomtest(hits, 20000, math.exp(-float(gamma))).pvalue > 1e-5


def _chi_square_pvalue(draws, probabilities):
    counts = np.bincount(draws, minlength=len(probabilities))
    return stats.chisquare(counts, len(draws) * np.asarray(probabilities)).pvalue


@pytest.mark.parametrize("monotone", [False, True])
def test_output_distribution_matches_exp_score(monotone):
    """Chi-square goodness of fit of 20000 draws against exp(eps s / (2 Delta))
    (or exp(eps s / Delta)), computed independently. Rejecting at p < 1e-4: a correct
    sampler fails with probability 1e-4 (fixed seed, so the outcome is reproducible)."""
    scores = [-4.0, -1.0, 0.0, -2.5, -0.5]
    epsilon, sensitivity = 1.3, 1.0
    factor = 1.0 if monotone else 2.0
    expected = _direct_probabilities(scores, epsilon, sensitivity, factor)
    assert min(expected) * 20000 > 50
    rng = np.random.default_rng(20240601)
    draws = np.array([selection.exponential_mechanism(scores, epsilon, sensitivity, rng,
                                                      monotone=monotone)
                      for _ in range(20000)])
    assert _chi_square_pvalue(draws, expected) > 1e-4


def test_output_distribution_with_the_csprng():
    """Same fit with the pipeline's SecureRandom (not seedable): threshold p < 1e-6, so
    a correct sampler fails this test once in a million runs."""
    scores = [-3.0, 0.0, -1.0, -0.2]
    expected = _direct_probabilities(scores, 1.0, 1.0)
    rng = samplers.secure_random()
    draws = np.array([selection.exponential_mechanism(scores, 1.0, 1.0, rng)
                      for _ in range(20000)])
    assert _chi_square_pvalue(draws, expected) > 1e-6


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=12),
       st.data(), st.floats(0.01, 5.0), st.floats(0.1, 100.0))
def test_neighbouring_scores_change_log_probabilities_by_at_most_epsilon(
        scores, data, epsilon, sensitivity):
    """epsilon-DP of the exponential mechanism: any perturbation of every score by at
    most Delta changes every log-probability by at most epsilon."""
    shifts = data.draw(st.lists(st.floats(-1.0, 1.0), min_size=len(scores),
                                max_size=len(scores)))
    neighbour = np.asarray(scores) + sensitivity * np.asarray(shifts)
    a = selection.exponential_mechanism_log_probabilities(scores, epsilon, sensitivity)
    b = selection.exponential_mechanism_log_probabilities(neighbour, epsilon, sensitivity)
    assert np.max(np.abs(a - b)) <= epsilon * (1 + 1e-9) + 1e-9


@settings(max_examples=200, deadline=None)
@given(st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=12),
       st.data(), st.floats(0.01, 5.0), st.floats(0.1, 100.0), st.booleans())
def test_monotone_neighbours_change_log_probabilities_by_at_most_epsilon(
        scores, data, epsilon, sensitivity, upward):
    """The monotone variant is epsilon-DP when all scores move the same way."""
    shifts = np.asarray(data.draw(st.lists(st.floats(0.0, 1.0), min_size=len(scores),
                                           max_size=len(scores))))
    neighbour = np.asarray(scores) + (1 if upward else -1) * sensitivity * shifts
    a = selection.exponential_mechanism_log_probabilities(scores, epsilon, sensitivity,
                                                          monotone=True)
    b = selection.exponential_mechanism_log_probabilities(neighbour, epsilon, sensitivity,
                                                          monotone=True)
    assert np.max(np.abs(a - b)) <= epsilon * (1 + 1e-9) + 1e-9


def test_monotone_variant_is_not_private_for_non_monotone_scores():
    """Why the monotone flag needs monotone scores: opposite moves break the bound."""
    a = selection.exponential_mechanism_log_probabilities([0.0, 0.0], 1.0, 1.0, monotone=True)
    b = selection.exponential_mechanism_log_probabilities([1.0, -1.0], 1.0, 1.0, monotone=True)
    assert np.max(np.abs(a - b)) > 1.0 + 0.1


@pytest.mark.parametrize("kwargs, field", [
    (dict(scores=[], epsilon=1.0, sensitivity=1.0), "scores"),
    (dict(scores=[0.0, float("nan")], epsilon=1.0, sensitivity=1.0), "scores"),
    (dict(scores=[0.0], epsilon=0.0, sensitivity=1.0), "epsilon"),
    (dict(scores=[0.0], epsilon=1.0, sensitivity=-1.0), "sensitivity"),
    (dict(scores=[1e308, 0.0], epsilon=4.0, sensitivity=1.0), "overflow"),
])
def test_invalid_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        selection.exponential_mechanism_probabilities(**kwargs)


# --------------------------------------------------------------------------------------
# ExponentialMechanism: the exact exponents computed once, each draw as one call.

def _per_call_draw(scores, epsilon, sensitivity, rng, monotone=False):
    """The exponential mechanism's per-call draw as it was written before
    ``ExponentialMechanism`` (f1aefc6): exact exponents on every call, Fraction coins,
    every word fetched as an array. The oracle the sampler must match word for word."""
    exponents = selection.exact_exponents(scores, epsilon, sensitivity, monotone=monotone)

    def random_bits(m):
        words = (m + 63) // 64
        bits = getattr(rng, "bits", None)
        if bits is not None and not isinstance(rng, np.random.Generator):
            draws = np.asarray(bits(words), dtype=np.uint64).reshape(words)
        else:
            draws = rng.integers(0, 1 << 64, size=words, dtype=np.uint64)
        value = 0
        for word in draws:
            value = (value << 64) | int(word)
        return value >> (64 * words - m)

    def uniform_below(n):
        m = max(1, (n - 1).bit_length())
        while True:
            value = random_bits(m)
            if value < n:
                return value

    def coin(p):
        p = Fraction(p)
        if p <= 0:
            return False
        if p >= 1:
            return True
        return uniform_below(p.denominator) < p.numerator

    def exp_unit(gamma):
        k = 1
        while coin(gamma / k):
            k += 1
        return k % 2 == 1

    def exp_coin(gamma):
        gamma = Fraction(gamma)
        whole = math.floor(gamma)
        for _ in range(whole):
            if not exp_unit(Fraction(1)):
                return False
        return exp_unit(gamma - whole)

    while True:
        index = uniform_below(len(exponents))
        if exp_coin(exponents[index]):
            return index


class _WordStream:
    """The ``bits`` protocol of the pipeline's keyed streams, over a seeded generator."""

    def __init__(self, seed):
        self.words = np.random.default_rng(seed)

    def bits(self, n):
        return self.words.integers(0, 1 << 64, size=n, dtype=np.uint64)


_AUDIT_D = [3.0] + [0.0] * 10                  # tests/audit/scenarios.exponential_mechanism
_SCORE_SETS = [
    (_AUDIT_D, 1.0, 3.0, False),
    ([0.0] + [3.0] * 10, 1.0, 3.0, False),
    (_AUDIT_D, 1.0, 3.0, True),
    ([0.0, -25.3, -3.7, -1e3, -1.1], 1.3, 1.0, False),       # whole parts, 2^52 denominators
    ([-Fraction(1, 3), Fraction(0), -Fraction(7, 5), -Fraction(22, 7)], 0.9, Fraction(1, 2),
     True),                                                   # exact scores (exact_scores)
    (list(np.random.default_rng(4).normal(0.0, 1.0, 40)), 0.7, 2.0, False),  # 6-bit proposals
]


@pytest.mark.parametrize("words", ["generator", "bits"])
@pytest.mark.parametrize("case", range(len(_SCORE_SETS)))
def test_sampler_draws_exactly_the_per_call_path(case, words):
    """ExponentialMechanism draws, and exponential_mechanism returns, the same indices as
    the per-call implementation it replaced, from the same randomness, and leave the
    stream at the same word: 200 seeds x 5 draws per score set, from a seeded numpy
    Generator and from the ``bits`` protocol of the keyed streams (deterministic)."""
    scores, epsilon, sensitivity, monotone = _SCORE_SETS[case]
    make = np.random.default_rng if words == "generator" else _WordStream
    sampler = selection.ExponentialMechanism(scores, epsilon, sensitivity, monotone=monotone)
    assert sampler.exponents == selection.exact_exponents(scores, epsilon, sensitivity,
                                                          monotone=monotone)
    for seed in range(200):
        old, new, call = make(seed), make(seed), make(seed)
        want = [_per_call_draw(scores, epsilon, sensitivity, old, monotone) for _ in range(5)]
        assert [sampler.draw(new) for _ in range(5)] == want, seed
        assert [selection.exponential_mechanism(scores, epsilon, sensitivity, call,
                                                monotone=monotone) for _ in range(5)] == want
        after = [(r if words == "generator" else r.words).integers(0, 1 << 64, dtype=np.uint64)
                 for r in (old, new, call)]
        assert after[0] == after[1] == after[2], seed     # the same words were consumed

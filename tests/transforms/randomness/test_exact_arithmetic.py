"""The certified integer arithmetic behind the exact samplers, checked against mpmath.

mpmath (arbitrary precision, 60+ digits here) is an independent oracle: every
(lo, hi) pair the samplers use must bracket the true value, and be tight enough that
the fast path decides almost every draw (hi - lo of a few units)."""
from fractions import Fraction

import mpmath
import numpy as np
import pytest

from thresher.transforms.randomness import samplers



@pytest.fixture(autouse=True)
def _precision_400_bits():
    """400-bit mpmath references, set per test (a global set at import is undone by any
    other test that changes mpmath's precision)."""
    with mpmath.workprec(400):
        yield


def _exact_exp_neg(x, w):
    return mpmath.exp(-mpmath.mpf(x.numerator) / x.denominator) * mpmath.mpf(2) ** w


@pytest.mark.parametrize("x", [Fraction(0), Fraction(1, 10**9), Fraction(1, 3), Fraction(1),
                               Fraction(7, 2), Fraction(4499, 100), Fraction(1000001, 7),
                               Fraction(2396.0) ** -2 / 2])
@pytest.mark.parametrize("w", [64, 128, 300])
def test_exp_neg_bounds_bracket_mpmath_and_are_tight(x, w):
    lo, hi = samplers._exp_neg_bounds(x, w)
    true = _exact_exp_neg(x, w)
    assert lo <= true <= hi
    assert hi - lo <= 8


def _dg_magnitude_cdf(sigma, k):
    sigma = mpmath.mpf(sigma)
    terms = [mpmath.exp(-mpmath.mpf(j) ** 2 / (2 * sigma ** 2)) for j in range(1, int(60 * sigma) + 60)]
    z = 1 + 2 * mpmath.fsum(terms)
    return (1 + 2 * mpmath.fsum(terms[:k])) / z


@pytest.mark.parametrize("sigma", [0.3, 1.0, 2.5, 17.25])
def test_discrete_gaussian_table_brackets_the_magnitude_cdf(sigma):
    sampler = samplers._DiscreteGaussianSampler(Fraction(sigma) ** 2, samplers.PREFIX_BITS)
    table = sampler.table
    scale = mpmath.mpf(2) ** samplers.PREFIX_BITS
    for k in range(table.size):
        true = _dg_magnitude_cdf(sigma, k) * scale
        assert int(table.lo[k]) <= true <= int(table.hi[k]), k
        assert int(table.hi[k]) - int(table.lo[k]) <= 2
    # the high-precision oracle used on ties brackets it too, at 256 bits
    for k in (0, table.size // 2, table.size - 1):
        lo, hi = sampler._oracle(k, 256)
        assert lo <= _dg_magnitude_cdf(sigma, k) * mpmath.mpf(2) ** 256 <= hi
        assert hi - lo <= 4


@pytest.mark.parametrize("ratio", [samplers._ExpRatio(Fraction(1, 3)),
                                   samplers._RationalRatio(*Fraction(0.75).as_integer_ratio())])
def test_geometric_table_brackets_the_cdf(ratio):
    sampler = samplers._GeometricSampler(ratio, samplers.PREFIX_BITS)
    q = (mpmath.exp(-mpmath.mpf(1) / 3) if isinstance(ratio, samplers._ExpRatio)
         else mpmath.mpf(0.75))
    scale = mpmath.mpf(2) ** samplers.PREFIX_BITS
    table = sampler.table
    assert sampler.split is None
    for k in range(table.size):
        true = (1 - q ** (k + 1)) * scale
        assert int(table.lo[k]) <= true <= int(table.hi[k])
        assert int(table.hi[k]) - int(table.lo[k]) <= 2


def test_truncated_geometric_table_of_split_sampler_brackets_its_cdf(monkeypatch):
    monkeypatch.setattr(samplers, "_GEOMETRIC_MAX_TABLE", 16)
    sampler = samplers._GeometricSampler(samplers._ExpRatio(Fraction(1, 40)), samplers.PREFIX_BITS)
    assert sampler.split == 16
    q = mpmath.exp(-mpmath.mpf(1) / 40)
    scale = mpmath.mpf(2) ** samplers.PREFIX_BITS
    for u in range(16):
        true = (1 - q ** (u + 1)) / (1 - q ** 16) * scale
        assert int(sampler.table.lo[u]) <= true <= int(sampler.table.hi[u])
        lo, hi = sampler.table.oracle(u, 200)
        assert lo <= true * mpmath.mpf(2) ** (200 - samplers.PREFIX_BITS) <= hi


class _ScriptedWords:
    """An rng whose words are given in advance (to force the exact tie paths)."""

    def __init__(self, words):
        self.words = list(words)

    def bits(self, n):
        out, self.words = self.words[:n], self.words[n:]
        assert len(out) == n, "test script ran out of words"
        return np.array(out, dtype=np.uint64)


def test_resolve_less_decides_ties_from_further_bits():
    # F = 1/3 exactly; R's first 63 bits equal floor(2^63/3), so only later bits decide.
    third = lambda w: ((1 << w) // 3, -(-(1 << w) // 3))
    prefix = (1 << 63) // 3
    pattern = int("10" * 32, 2)   # bits 1..63 of 1/3 are 0101...0; bits 64.. are 1010...
    below = samplers._resolve_less(_ScriptedWords([pattern - 1]), prefix, 63, third)[0]
    above = samplers._resolve_less(_ScriptedWords([pattern + 1]), prefix, 63, third)[0]
    assert below is True and above is False


def test_resolve_less_with_an_exactly_dyadic_value_terminates():
    half = lambda w: (1 << (w - 1), 1 << (w - 1))
    assert samplers._resolve_less(_ScriptedWords([]), (1 << 62) - 1, 63, half)[0] is True
    assert samplers._resolve_less(_ScriptedWords([]), 1 << 62, 63, half)[0] is False


def test_bernoulli_tie_continues_with_the_exact_fractional_part():
    p = 0.3 * 2.0 ** -20                    # 2^63 p = P + f with 0 < f < 1
    whole = int(np.floor(np.ldexp(p, 63)))
    frac = np.ldexp(p, 63) - whole
    assert 0 < frac < 1
    next_threshold = int(np.floor(np.ldexp(frac, 63)))
    # first word ties (prefix == P); the second decides against floor(2^63 f)
    yes = samplers.bernoulli(_ScriptedWords([whole << 1, (next_threshold - 1) << 1]), p, 1)
    no = samplers.bernoulli(_ScriptedWords([whole << 1, (next_threshold + 1) << 1]), p, 1)
    assert yes.tolist() == [True] and no.tolist() == [False]


def test_bernoulli_of_a_tiny_float_uses_several_rounds_and_stays_exact():
    # 2^63 p = 2^-37 + 2^-77: round 1 threshold 0; then 2^26 + 2^-14: round 2 threshold
    # 2^26; then 2^49: round 3 threshold 2^49 with nothing after it.
    p = 2.0 ** -100 + 2.0 ** -140
    assert p - 2.0 ** -100 == 2.0 ** -140     # both bits are in the float
    coin = lambda words: samplers.bernoulli(_ScriptedWords([w << 1 for w in words]), p, 1)[0]
    assert not coin([1])                      # R >= 2^-63 > p
    assert coin([0, 2**26 - 1])               # R < 2^26 / 2^126 < p
    assert not coin([0, 2**26 + 1])
    assert coin([0, 2**26, 2**49 - 1])        # third round decides
    assert not coin([0, 2**26, 2**49])        # R >= p: nothing left to tie on

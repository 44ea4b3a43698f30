"""The exponential mechanism over a finite candidate set.

McSherry & Talwar (2007), "Mechanism design via differential privacy", Thm 6; Dwork &
Roth (2014), Thm 3.10. Given scores u(D, r) for candidates r with sensitivity
Delta = max over neighbouring D, D' and r of |u(D, r) - u(D', r)|, sampling r with

    Pr[r] proportional to exp(epsilon * u(D, r) / (2 * Delta))

is epsilon-DP (pure, delta = 0), whatever the number of candidates. If in addition the
scores are *monotone* -- for every neighbouring pair all candidates' scores move in the
same direction (u(D', r) - u(D, r) in [0, Delta] for every r, or in [-Delta, 0] for
every r) -- the factor 2 can be dropped: Pr[r] proportional to exp(epsilon * u / Delta)
is epsilon-DP (McSherry & Talwar 2007, Sec. 3 remark; Dwork & Roth Thm 3.10 proof: the
normalising constant then moves against the numerator). See docs/contribution_bound.md.

Numerics: the reported probabilities (operator logs, tests) are formed from log-weights
shifted by their maximum (log-sum-exp), so scores spanning 1e6 or more neither overflow
nor produce NaN.

Sampling is exact (issue 13): a float CDF inverted with one 53-bit uniform realises
probabilities on a 2^-53 grid, so a candidate of true probability 1e-300 is drawn with
probability 0 or 2^-53 -- an infinite ratio between neighbours. Instead,
:func:`exponential_mechanism` works with the exact rational exponents
x_r = epsilon (u_max - u(D, r)) / (2 Delta) of the float scores (every float is a dyadic
rational; ``fractions.Fraction`` keeps them exact), proposes r uniformly and accepts it
with an exact Bernoulli(exp(-x_r)) coin (Canonne, Kamath & Steinke 2020, "The Discrete
Gaussian for Differential Privacy", Algorithm 1 for x <= 1 and exp(-x) = exp(-1)^floor(x)
exp(-frac(x)) above), built from exact Bernoulli(a/b) coins on uniform random integers.
Accepted proposals are distributed exactly as exp(-x_r) / sum_s exp(-x_s), the exponential
mechanism's law for the scores as computed; the expected number of proposals is at most
the number of candidates (the best one is accepted with probability 1). Only uniform
64-bit words are taken from ``rng`` (``rng.bits(n)`` of the pipeline's CSPRNG, or
``rng.integers`` of a seeded numpy Generator in tests).
"""
import math
from fractions import Fraction

import numpy as np


def _validated(scores, epsilon, sensitivity):
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"scores must be a non-empty 1-d array, got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must all be finite (no NaN or infinity)")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be finite and > 0, got {sensitivity}")
    return scores


def exponential_mechanism_log_probabilities(scores, epsilon, sensitivity, *, monotone=False):
    """Natural log of the exponential mechanism's probability of each candidate.

    Args:
      scores: 1-d array of finite scores (higher is better).
      epsilon: the selection's privacy parameter, > 0.
      sensitivity: Delta, the largest change of any candidate's score between
        neighbouring datasets, > 0.
      monotone: True only if the scores are monotone (see module docstring); the
        exponent is then epsilon * u / Delta instead of epsilon * u / (2 Delta).

    Returns:
      float64 array ``log p`` with ``logsumexp(log p) == 0``; every entry finite.
    """
    scores = _validated(scores, epsilon, sensitivity)
    scale = epsilon / (sensitivity if monotone else 2.0 * sensitivity)
    with np.errstate(over="ignore"):
        logits = scale * scores
    if not np.all(np.isfinite(logits)):
        raise ValueError("scores * epsilon / sensitivity overflows a double; rescale the scores")
    shifted = logits - logits.max()          # max term is exp(0) = 1
    return shifted - math.log(math.fsum(np.exp(shifted)))


def exponential_mechanism_probabilities(scores, epsilon, sensitivity, *, monotone=False):
    """Exact (to double precision) probabilities of the exponential mechanism; sum to 1.

    Same arguments as :func:`exponential_mechanism_log_probabilities`."""
    return np.exp(exponential_mechanism_log_probabilities(
        scores, epsilon, sensitivity, monotone=monotone))


def exponential_mechanism(scores, epsilon, sensitivity, rng, *, monotone=False):
    """Draw a candidate index with Pr[i] proportional to exp(epsilon * scores[i] / (2 Delta)),
    exactly (see the module docstring).

    Args:
      scores, epsilon, sensitivity, monotone: as in
        :func:`exponential_mechanism_log_probabilities`.
      rng: a keyed stream of the release secret (``transforms.randomness.keyed_random``) or a seeded
        ``numpy.random.Generator`` (tests); only uniform 64-bit words are used.

    Returns:
      int index into ``scores``. epsilon-DP (pure) for the stated sensitivity. One draw of
      :class:`ExponentialMechanism` (which draws repeatedly from one set of scores).
    """
    return ExponentialMechanism(scores, epsilon, sensitivity, monotone=monotone).draw(rng)


class ExponentialMechanism:
    """The exponential mechanism for one set of scores: the exact exponents x_r of
    :func:`exact_exponents` computed once, then any number of draws, each exactly as one
    call of :func:`exponential_mechanism` (the same words of ``rng``, the same index;
    ``tests/accounting/test_selection.py`` compares them over many seeds). Each draw is
    epsilon-DP (pure) on its own; k draws from the same scores compose to k epsilon.

    A draw proposes r uniformly and accepts it with an exact Bernoulli(exp(-x_r)) coin
    (Canonne, Kamath & Steinke 2020, Algorithm 1 with exp(-x) = exp(-1)^floor(x)
    exp(-frac(x))); the coin's integers (floor(x_r) and frac(x_r) as numerator and
    denominator) are also computed once.
    """

    def __init__(self, scores, epsilon, sensitivity, *, monotone=False):
        self.exponents = exact_exponents(scores, epsilon, sensitivity, monotone=monotone)
        self._coins = [_exp_coin(x) for x in self.exponents]

    def draw(self, rng):
        """One candidate index, Pr[r] = exp(-x_r) / sum_s exp(-x_s) (exactly)."""
        coins = self._coins
        n = len(coins)
        while True:
            index = _uniform_below(rng, n)
            if _bernoulli_exp_coin(rng, *coins[index]):
                return index


def exact_exponents(scores, epsilon, sensitivity, *, monotone=False):
    """x_r = epsilon (max_s u_s - u_r) / (2 Delta) (or / Delta when monotone) as exact
    rationals of the float arguments; Pr[r] is proportional to exp(-x_r). ``scores`` may
    be a list of ``Fraction`` (and ``sensitivity`` a Fraction): the exact scores of
    ``accounting.exact_scores``, used without any rounding."""
    if isinstance(scores, (list, tuple)) and any(isinstance(u, Fraction) for u in scores):
        # exact scores (accounting.exact_scores): drawn from as they are, no float step
        exact = [Fraction(u) for u in scores]
        exponential_mechanism_log_probabilities([float(u) for u in exact], float(epsilon),
                                                float(sensitivity), monotone=monotone)
    else:
        exponential_mechanism_log_probabilities(scores, epsilon, sensitivity, monotone=monotone)
        exact = [Fraction(float(u)) for u in np.asarray(scores, dtype=np.float64)]
    scale = Fraction(epsilon if isinstance(epsilon, Fraction) else float(epsilon)) / (
        Fraction(sensitivity if isinstance(sensitivity, Fraction) else float(sensitivity))
        * (1 if monotone else 2))
    top = max(exact)
    return [scale * (top - u) for u in exact]


def _random_bits(rng, m):
    """A uniform random integer of m bits, from 64-bit words of ``rng``."""
    words = (m + 63) // 64
    bits = getattr(rng, "bits", None)
    if bits is not None and not isinstance(rng, np.random.Generator):
        draws = np.asarray(bits(words), dtype=np.uint64).reshape(words)
    elif words == 1:
        # the same word as size=1 (numpy draws a full-range uint64 as one raw output),
        # without the array: a third of the cost of the call
        return int(rng.integers(0, 1 << 64, dtype=np.uint64)) >> (64 - m)
    else:
        draws = rng.integers(0, 1 << 64, size=words, dtype=np.uint64)
    value = 0
    for word in draws:
        value = (value << 64) | int(word)
    return value >> (64 * words - m)


def _uniform_below(rng, n):
    """A uniform integer in [0, n), by rejection (exact)."""
    m = max(1, (n - 1).bit_length())
    while True:
        value = _random_bits(rng, m)
        if value < n:
            return value


def bernoulli_rational(rng, p):
    """An exact Bernoulli(p) coin for a rational p (clipped to [0, 1])."""
    p = Fraction(p)
    if p <= 0:
        return False
    if p >= 1:
        return True
    return _uniform_below(rng, p.denominator) < p.numerator


def bernoulli_exp(rng, gamma):
    """An exact Bernoulli(exp(-gamma)) coin for a rational gamma >= 0 (Canonne, Kamath &
    Steinke 2020, Algorithm 1, with exp(-gamma) = exp(-1)^floor(gamma) exp(-frac(gamma)))."""
    return _bernoulli_exp_coin(rng, *_exp_coin(gamma))


def _exp_coin(gamma):
    """(floor(gamma), numerator, denominator of frac(gamma)) for a rational gamma >= 0:
    the integers :func:`_bernoulli_exp_coin` flips a Bernoulli(exp(-gamma)) coin with."""
    gamma = Fraction(gamma)
    if gamma < 0:
        raise ValueError(f"gamma must be >= 0, got {float(gamma)}")
    whole = math.floor(gamma)
    fraction = gamma - whole
    return whole, fraction.numerator, fraction.denominator


def _bernoulli_exp_coin(rng, whole, numerator, denominator):
    """Bernoulli(exp(-gamma)), gamma = whole + numerator / denominator (0 <= numerator <
    denominator, in lowest terms): exp(-1) coins, stopping at the first failure (about
    1.6 coins expected), then one exp(-frac(gamma)) coin."""
    for _ in range(whole):
        if not _bernoulli_exp_unit(rng, 1, 1):
            return False
    return _bernoulli_exp_unit(rng, numerator, denominator)


def _bernoulli_exp_unit(rng, numerator, denominator):
    """Bernoulli(exp(-gamma)) for 0 <= gamma = numerator / denominator <= 1: the number K
    of successive successes of Bernoulli(gamma / k), k = 1, 2, ..., is odd with
    probability exp(-gamma). Each Bernoulli(gamma / k) is :func:`bernoulli_rational`'s
    coin on gamma / k in lowest terms, in integers."""
    k = 1
    while True:
        scaled = denominator * k
        g = math.gcd(numerator, scaled)
        p, q = numerator // g, scaled // g       # gamma / k in lowest terms
        if p <= 0 or (p < q and _uniform_below(rng, q) >= p):
            return k % 2 == 1
        k += 1

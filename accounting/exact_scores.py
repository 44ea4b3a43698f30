"""Scores of the private choices summed exactly: per-term fixed point, integer sums.

Why (issue 25, F2): a private choice's score is a sum over users (and keys) that a
pipeline computes in pieces -- per user shard, per key shard -- and adds in whatever order
the runner delivers them. Float addition is not associative, so two runners (or two
bundlings, or two shard counts) produced scores that differed in the last bits, and the
exact exponential-mechanism sampler (``accounting.selection``) turned that into different
draws (C = 6 in-process, C = 8 on two worker processes, same secret, same data). Here
every term of such a sum is rounded *down* to a fixed grid 2^-b, deterministically and
before any summation, and the sums are integers (int64 where a proven bound rules out
overflow, Python ints across shards). Integer addition is associative, so the scores --
and the draw -- are the same whatever the order, bundling, sharding, runner or retry.

The rounding is part of the mechanism, so the privacy claim covers it; the proofs are in
docs/contribution_bound.md, section "Exact scores". In short, for the contribution-bound
score (paper 002, Algorithm 4, with thresher's costs; ``accounting.contribution_bound``):

* the expected bounded count of a (user, key) pair, x_ij = N_ij min(1, C / w_i) (or
  min(x, sqrt x) in user weights), is replaced by x~_ij = 2^-B floor(2^B x_ij), computed
  in integers (:func:`expected_count_units`; B = :data:`COUNT_BITS`). Since
  0 <= x~_ij <= x_ij, one user adds to the h_j (C) at most sum_j x_ij <= min(w_i, C), as
  in the unrounded proof (Prop. 1 / Prop. 3): the rounding costs nothing there; and a user
  moves at most 2^B C of the h_j at all (each moved h_j gains at least one unit 2^-B);
* each key's cost cost_C(h~_j) is evaluated in binary64 on the exact h~_j and rounded
  down to the grid 2^-K (K = ``BoundScore.cost_bits``): f(h) = 2^-K floor(2^K c~(h)),
  where c~ is the floating-point evaluation, |c~(h) - c(h)| <= e (``BoundScore.cost_error``).
  For a >= b, f(a) - f(b) lies in (c(a) - c(b) - 2 e - 2^-K, c(a) - c(b) + 2 e + 2^-K);
* so adding one user changes each candidate's rounded score by an amount in
  [-eta, Delta + eta] (or, for a score that falls as users are added, such as the
  key-count objective's V = -U, in [-Delta - eta, eta]), eta = max_C 2^B C (2^-K + 2 e)
  (:func:`rounding_allowance`), and
  the monotone exponential mechanism with sensitivity Delta + 2 eta is epsilon-DP
  (a change in [-a, b] for every candidate moves each weight exp(-epsilon V / Delta')
  and their sum by factors in [e^{-epsilon b / Delta'}, e^{epsilon a / Delta'}], so a
  probability moves by at most e^{epsilon (a + b) / Delta'} = e^epsilon).

The mechanism then draws from exact rationals (``fractions.Fraction``) of these integer
sums (``selection.exponential_mechanism`` takes Fractions as they are), so no float
rounding enters after the per-term step.

Platforms (what "bit-identical" covers): the integer steps are exact everywhere. The
per-key costs of the l1 objective (min(s h, T(C))) and of sample-and-threshold
(T + sqrt((1 - p) / p max(h, T))) are compositions of IEEE-754 binary64 basic operations
(+, -, *, /, sqrt, min, max), each correctly rounded by the standard on every conforming
platform (numpy's SIMD loops for these are exact-rounded too), so their grid values are
identical on every platform. The key-count objective's Phi (``scipy.special.ndtr``) is
computed by libm-style code that is not correctly rounded and may take different paths
on different CPU families or builds; a value within one ulp of a grid point may round to
a different grid point. Its promise is bit-identical scores across runners, bundlings,
shard counts and retries on one platform (same CPU family, numpy and scipy build): the
case of one release's workers.

Pure Python / numpy; no Beam.
"""
import math
from fractions import Fraction

import numpy as np

# Grid of the expected bounded counts x_ij: 2^-20 of a contribution.
COUNT_BITS = 20
# Finest grid of the per-key costs (coarser when a cost could exceed 2^(61 - COST_BITS)).
COST_BITS = 60
# An integer-valued float64 (and a float64 sum of such values) is exact below 2^53.
EXACT_FLOAT = 1 << 53
# Per-term units must stay below 2^62 (int64 sums below use 31-bit halves).
MAX_UNITS = 1 << 62
# Largest exact h_j in units: its float64 value 2^-B h is exact below 2^53.
MAX_COUNT_UNITS = EXACT_FLOAT - 1


def expected_count_units(pair_counts, pair_weights, candidate, *, user_weighted=False,
                         bits=COUNT_BITS):
    """floor(2^bits x) for each pair, x = N min(1, C / w) (or, ``user_weighted``,
    N min(C / w, sqrt(C / w))), in int64 integer arithmetic (no float: the same value on
    every platform, and x~ = 2^-bits floor(2^bits x) <= x exactly).

    ``pair_counts``: N_ij (int; None means 1 for every pair, the l0 model);
    ``pair_weights``: w_i >= 1 per pair (int); ``candidate``: C (int >= 1)."""
    w = np.maximum(np.asarray(pair_weights, dtype=np.int64), 1)
    c = int(candidate)
    if c < 1 or c >= (1 << 20):
        raise ValueError(f"candidate bounds must be in [1, 2^20), got {c}")
    if len(w) and int(w.max()) >= (1 << 40):
        raise ValueError("a user weight of 2^40 or more is beyond the exact score's range")
    unit = np.int64(1) << np.int64(bits)
    above = w > c
    # x = C / w below 1 (w > C): floor(C 2^b / w); C 2^b < 2^40, so no overflow
    out = np.where(above, (np.int64(c) << np.int64(bits)) // w, unit)
    if user_weighted:
        # w < C: x = sqrt(C / w) > 1, floor(2^b sqrt(C / w)) = isqrt(floor(C 2^2b / w))
        below = ~above & (w < c)
        if np.any(below):
            out[below] = isqrt((np.int64(c) << np.int64(2 * bits)) // w[below])
    if pair_counts is None:
        return out
    n = np.asarray(pair_counts, dtype=np.int64)
    if len(n) and int(n.max()) >= (1 << 40):
        raise ValueError("a record count of 2^40 or more is beyond the exact score's range")
    if user_weighted:
        return n * out   # l0 only in practice (N = 1); N x~ = floor(2^b N x) is not needed
    # N min(1, C / w): N 2^b when w <= C; else floor(N C 2^b / w) from N C = q w + r
    num = n * np.int64(c)
    q, r = np.divmod(num, w)
    return np.where(above, (q << np.int64(bits)) + (r << np.int64(bits)) // w, n * unit)


def isqrt(values):
    """floor(sqrt(y)) of an int64 array of y in [0, 2^62), exactly (a float estimate
    corrected to the integer root)."""
    y = np.asarray(values, dtype=np.int64)
    r = np.floor(np.sqrt(y.astype(np.float64))).astype(np.int64)
    for _ in range(2):   # the float root of y < 2^62 is within 1 of the integer root
        r = np.where(r * r > y, r - 1, r)
        r = np.where((r + 1) * (r + 1) <= y, r + 1, r)
    return r


def exact_bincount(index, units, minlength):
    """Per-bin sums of non-negative int64 ``units`` (an int64 array), exactly: one
    float64 bincount when len * max is below 2^53 (every partial sum is then an exact
    integer), else int64 ``np.add.at``. Raises if a bin's sum could overflow int64."""
    units = np.asarray(units, dtype=np.int64)
    if len(units) == 0:
        return np.zeros(minlength, dtype=np.int64)
    if len(units) * int(units.max()) < EXACT_FLOAT:
        return np.bincount(index, weights=units, minlength=minlength).astype(np.int64)
    if exact_sum(units) >= MAX_UNITS:
        raise ValueError("a score's per-key sum reached 2^62 units: beyond its exact range")
    out = np.zeros(minlength, dtype=np.int64)
    np.add.at(out, index, units)
    return out


def exact_sum(units):
    """The exact sum of an int64 array of values in [0, 2^62), as a Python int: the low
    and high 31-bit halves are summed separately in blocks of 2^31 terms (neither sum
    can overflow int64)."""
    units = np.asarray(units, dtype=np.int64)
    total = 0
    block = 1 << 31
    for lo in range(0, len(units), block):
        part = units[lo:lo + block]
        total += (int(np.sum(part >> np.int64(31))) << 31) + int(np.sum(part & np.int64(block - 1)))
    return total


def times_power_of_two(values, exponent, out=None):
    """``values`` * 2^``exponent`` (float64), bit for bit ``np.ldexp(values, exponent)``
    for |exponent| <= 1000, by one multiplication (issue 43: numpy's ldexp is a scalar
    loop, ~20x the time of a multiply; the automatic bound scales every key's count and
    cost this way). Why the same bits: 2^exponent is an exact binary64 value, and both
    IEEE-754 multiplication and ldexp return the correctly rounded value of the exact
    product x 2^exponent (exact unless it overflows or falls below the normal range),
    so they agree for every x, +-0, +-inf and NaN included; under a flush-to-zero or
    denormals-are-zero mode (never numpy's default) they could differ only on a
    subnormal input or result, and no caller here sees one: :func:`floor_units` scales
    up (a subnormal v gives v 2^K < 1, floored to 0 either way) and the count units
    scaled down are integers (2^-B or more, or 0)."""
    exponent = int(exponent)
    if abs(exponent) > 1000:
        raise ValueError(f"exponent {exponent} beyond +-1000")
    if np.asarray(values).dtype != np.float64:   # a float32 array would multiply in float32
        raise TypeError(f"times_power_of_two takes float64 values, not "
                        f"{np.asarray(values).dtype}")
    return np.multiply(values, 2.0 ** exponent, out=out)


def floor_units(values, bits):
    """floor(2^bits v) of a float64 array as int64 (scaling by 2^bits is exact; the
    values must be finite, >= 0 and below 2^(62 - bits))."""
    scaled = times_power_of_two(np.asarray(values, dtype=np.float64), bits)
    if scaled.size and not (np.all(np.isfinite(scaled)) and float(scaled.min()) >= 0
                            and float(scaled.max()) < MAX_UNITS):
        raise ValueError("a score term is negative, not finite or beyond 2^62 grid units")
    return np.floor(scaled).astype(np.int64)


def floor_units_inplace(values, bits):
    """:func:`floor_units` of a float64 array that may be overwritten (its buffer is
    scaled and floored in place: the same int64 values)."""
    scaled = times_power_of_two(values, bits, out=values)
    if scaled.size and not (float(scaled.min()) >= 0 and float(scaled.max()) < MAX_UNITS):
        raise ValueError("a score term is negative, not finite or beyond 2^62 grid units")
    return np.floor(scaled, out=scaled).astype(np.int64)


def cost_bits(cost_bound):
    """The cost grid exponent K: COST_BITS, or fewer when a cost up to ``cost_bound``
    would reach 2^61 units (so every per-key value stays below 2^62)."""
    if not (math.isfinite(cost_bound) and cost_bound >= 0):
        raise ValueError(f"the per-key cost bound must be finite, got {cost_bound}")
    top = math.frexp(max(cost_bound, 1.0))[1]    # cost_bound < 2^top
    bits = min(COST_BITS, 61 - top)
    if bits < 0:
        raise ValueError(f"a per-key cost of {cost_bound:g} is beyond the exact score's range")
    return bits


def rounding_allowance(max_candidate, cost_bits_, cost_error, count_bits=COUNT_BITS):
    """eta = 2^B C_max (2^-K + 2 e) as an exact Fraction: the most the rounding can move
    one user's effect on one candidate's score beyond the unrounded bound (module
    docstring); the exponential mechanism uses Delta + 2 eta."""
    return (Fraction(int(max_candidate) << count_bits)
            * (Fraction(1, 1 << cost_bits_) + 2 * Fraction(cost_error)))


def upward(value, relative=Fraction(1, 1 << 50)):
    """An exact Fraction at least ``value`` (a float computed with a few roundings) by a
    relative margin of 2^-50 (>= 4 ulps of binary64)."""
    return Fraction(value) * (1 + relative)


class SumExact:
    """Element-wise sum of fixed-length sequences of Python ints (exact; any order,
    any grouping gives the same result). Plain Python: ``transforms`` wraps it in a Beam
    CombineFn."""

    def __init__(self, length):
        self.length = int(length)

    def zero(self):
        return (0,) * self.length

    def add(self, accumulator, vector):
        if len(vector) != self.length:
            raise ValueError(f"expected {self.length} integers, got {len(vector)}")
        return tuple(int(a) + int(b) for a, b in zip(accumulator, vector))

"""Randomness for thresher: a CSPRNG-backed generator and exact integer samplers.

Every coin a release flips (bounding priorities, Poisson sampling, Bernoulli keep coins,
discrete Gaussian and discrete Laplace noise) is drawn through these functions, from an
``rng`` that is keyed streams derived from the release secret (every drawing transform,
in a release or used on its own: ``transforms.randomness.keyed_random``, one stream per key, user
or pair, so recomputations draw the same values), :class:`SecureRandom` (bits from
``os.urandom``; kernels called directly, benchmarks and tests -- no transform accepts
it, ``keyed_random.resolve``) or a seeded ``numpy.random.Generator`` (tests only). The samplers only consume uniform
64-bit words from it (``rng.bits(n)``, ``rng.integers(0, 2**64, dtype=uint64)`` for a
numpy Generator, or one word per row of a view of per-row streams: the slow paths then
continue each row's own stream through :func:`take` and the row's ``element`` view).

Exactness. Each sampler returns draws from exactly its stated distribution, for the
parameter exactly as given (a float ``sigma`` is the dyadic rational it stores): no
float64 uniforms, no float ``exp``/``log`` on the sampling path. Integer outputs whose
law never depends on low-order float bits are what defeats the floating-point attacks on
Laplace sampling (Mironov 2012, "On significance of the least significant bits for
differential privacy"), and exact laws are what the exact accounting (docs/accounting.md)
is computed for. The method is inversion against a uniform real R in [0, 1) whose binary
digits are drawn lazily (Devroye 1986, "Non-Uniform Random Variate Generation", II.2;
the same idea as the exact Bernoulli(exp(-gamma)) of Canonne, Kamath & Steinke 2020,
"The Discrete Gaussian for Differential Privacy", section 5):

* Fast path (vectorised): the first 63 bits of R are one random word; a table holds
  certified integer bounds lo[k] <= 2**63 F(k) <= hi[k] of the CDF F. If
  hi[x-1] <= U < lo[x] then F(x-1) <= R < F(x) for sure and the draw is x. The bounds
  come from integer interval arithmetic (``_exp_neg_bounds``: alternating Taylor series
  with floor/ceil rounding), never from floats.
* Exact slow path (scalar, probability about K * 2**-62 per draw for a table of K
  entries): when U falls in a window [lo[k], hi[k]) the comparison R < F(k) is settled
  by drawing further bits of R and tightening the bounds of F(k) to any precision. Beyond the table (probability about
  2**-16 to 2**-24 per draw) an exact tail sampler takes over: the memoryless property
  for geometric variables, rejection from a geometric envelope with exact
  Bernoulli(exp(-gamma)) acceptance for the discrete Gaussian.

Tests (tests/transforms/randomness/) check the certified bounds against mpmath at 400 bits, and
the pmf of every sampler by chi-square tests over 10**6 draws, including variants with
8-bit prefixes and short tables that force the slow paths on thousands of draws.
docs/privacy_testing.md has the speed figures.
"""
import functools
import math
import os
from fractions import Fraction

import numpy as np

# Bits of R compared in the fast path (one 64-bit word; the spare bit is the sign of a
# discrete Gaussian draw). Tables store bounds of 2**63 F(k), which fit in uint64.
PREFIX_BITS = 63
# Working precision of the tables' interval arithmetic.
_TABLE_BITS = 128
# Geometric tables stop where P(G >= K) is about 2**-16; the tail is K + a fresh draw.
_GEOMETRIC_TAIL_BITS = 16
# Largest geometric table; larger scales are split as G = m * V + U (see below).
_GEOMETRIC_MAX_TABLE = 1 << 15
# Discrete Gaussian tables stop where P(|X| >= K) is about 2**-24.
_GAUSSIAN_TAIL_BITS = 24
# Largest discrete Gaussian sigma: its table holds about 5.8 * sigma entries (16 bytes
# each) and takes about 1.5 microseconds per 0.1 unit of sigma to build, once.
SIGMA_MAX = float(1 << 20)
_ONE_BIT = np.uint64(1)


class SecureRandom:
    """A numpy-Generator-like source whose bits come from the OS CSPRNG (os.urandom).

    Not picklable on purpose: create one in ``DoFn.setup()`` on each worker, never in a
    constructor that is serialised and replayed.
    """

    def bits(self, size):
        """Uniform uint64 words."""
        n = int(np.prod(size)) if size is not None else 1
        words = np.frombuffer(os.urandom(8 * n), dtype=np.uint64)
        return words.reshape(size) if size is not None else words[0]

    def random(self, size=None):
        """Uniform floats on [0, 1) with 53 random bits (multiples of 2**-53).

        For estimates and benchmarks only: privacy coins use :func:`bernoulli` and the
        integer samplers, which are exact."""
        words = self.bits(size if size is not None else 1)
        out = (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        return out if size is not None else float(out[0])

    def integers(self, low, high=None, size=None, dtype=np.int64):
        """Uniform integers in [low, high) (numpy.random.Generator semantics)."""
        if high is None:
            low, high = 0, low
        span = int(high) - int(low)
        if span <= 0:
            raise ValueError("integers: high must be > low")
        shape = size if size is not None else 1
        n = int(np.prod(shape))
        if span > (1 << 63):
            raise ValueError("integers: range too large")
        # Rejection sampling for exact uniformity: accept words below the largest
        # multiple of span that fits in 2**64.
        limit = np.uint64(((1 << 64) // span) * span - 1)
        out = np.empty(n, dtype=np.uint64)
        filled = 0
        while filled < n:
            words = self.bits(max(16, int((n - filled) * 1.1)))
            words = words[words <= limit][: n - filled]
            out[filled:filled + len(words)] = words
            filled += len(words)
        values = (out % np.uint64(span)).astype(np.int64) + int(low)
        values = values.astype(dtype)
        return values.reshape(shape) if size is not None else values[0]

    def __getstate__(self):
        raise TypeError("SecureRandom must be created on the worker (DoFn.setup), not pickled")


def secure_random():
    """The CSPRNG-backed generator every release uses."""
    return SecureRandom()


def _words(rng, n):
    """n uniform uint64 words from a SecureRandom (``bits``), a numpy Generator, or one
    word per element of a view of per-row keyed streams (``transforms.randomness.keyed_random``)."""
    n = int(n)
    element_words = getattr(rng, "element_words", None)
    if element_words is not None:
        return element_words(n)
    bits = getattr(rng, "bits", None)
    if bits is not None and not isinstance(rng, np.random.Generator):
        return np.asarray(bits(n), dtype=np.uint64).reshape(n)
    return rng.integers(0, 1 << 64, size=n, dtype=np.uint64)


def _word(rng):
    return int(_words(rng, 1)[0])


def take(rng, index):
    """The generator for a subset of the current elements (mask or index array): the
    same generator, or the matching rows of per-row streams (``transforms.randomness.keyed_random``),
    so each row keeps drawing from its own stream."""
    select = getattr(rng, "take", None)
    return select(index) if select is not None else rng


def _element(rng, i):
    select = getattr(rng, "element", None)
    return select(i) if select is not None else rng


def _rows(rng, index, counts):
    """Elements ``index`` repeated ``counts`` times (several draws from each row)."""
    select = getattr(rng, "take", None)
    return select(index).repeat(counts) if select is not None else rng


def _count(size):
    return int(np.prod(size)) if size is not None else 1


def _exact(value, name):
    """A positive parameter as the exact rational it stores (floats are dyadic)."""
    if isinstance(value, (Fraction, int, np.integer)) and not isinstance(value, bool):
        value = Fraction(int(value)) if isinstance(value, np.integer) else Fraction(value)
    else:
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{name} must be finite, got {value}")
        value = Fraction(value)
    if value <= 0:
        raise ValueError(f"{name} must be > 0, got {float(value)}")
    return value


# ---------------------------------------------------------------------------------------
# Certified integer interval arithmetic. A pair (lo, hi) of non-negative integers at
# precision W stands for a real number x with lo <= 2**W x <= hi.

def _ceil_shift(a, s):
    return -((-a) >> s)


def _ceil_div(a, b):
    return -((-a) // b)


def _mul(x, y, w):
    return (x[0] * y[0]) >> w, _ceil_shift(x[1] * y[1], w)


def _exp_neg_unit(p, q, w):
    """Bounds of 2**w exp(-p/q) for 0 <= p/q <= 1: alternating Taylor series.

    With T_k = r**k / k! non-increasing (r <= 1), partial sums of odd order are below
    exp(-r) and those of even order above it; each term is rounded down or up so the
    rounded sums keep that side."""
    one = 1 << w
    t_lo = t_hi = one
    low_sum = high_sum = one       # sums rounded towards -inf and +inf
    lower, upper = 0, one
    k = 0
    finishing = False
    while True:
        k += 1
        t_lo = (t_lo * p) // (q * k)
        t_hi = _ceil_div(t_hi * p, q * k)
        if k % 2:
            low_sum -= t_hi
            high_sum -= t_lo
            lower = low_sum
        else:
            low_sum += t_lo
            high_sum += t_hi
            upper = high_sum
        if finishing:
            break
        if t_hi <= 1:
            finishing = True          # one more term so both sides are recent
    return max(lower, 0), min(upper, one)


@functools.lru_cache(maxsize=64)
def _exp_minus_one(w):
    return _exp_neg_unit(1, 1, w)


def _exp_neg_bounds(x, w):
    """(lo, hi) with lo <= 2**w exp(-x) <= hi, for a rational x >= 0 (Fraction)."""
    x = Fraction(x)
    if x < 0:
        raise ValueError("_exp_neg_bounds needs x >= 0")
    n = x.numerator // x.denominator
    r = x - n
    guard = 32 + 2 * n.bit_length()
    p = w + guard
    result = _exp_neg_unit(r.numerator, r.denominator, p)
    base = _exp_minus_one(p)
    while n:
        if n & 1:
            result = _mul(result, base, p)
        n >>= 1
        if n:
            base = _mul(base, base, p)
    return result[0] >> guard, _ceil_shift(result[1], guard)


# ---------------------------------------------------------------------------------------
# Exact comparison of a lazily drawn uniform R with a certified number.

def _resolve_less(rng, prefix, plen, oracle, w_start=None):
    """Decide R < F exactly. R is uniform on [0, 1) with first ``plen`` bits ``prefix``;
    further bits come from ``rng``. ``oracle(W)`` returns (lo, hi), lo <= 2**W F <= hi,
    with hi - lo shrinking as W grows. Returns (R < F, prefix, plen) with the bits of R
    drawn so far, so the same R can be compared with the next F of an inversion."""
    w = max(w_start or _TABLE_BITS, plen + 64)
    bounds = oracle(w)
    while True:
        lo, hi = bounds
        e = max(w, plen)
        r_lo = prefix << (e - plen)
        r_hi = (prefix + 1) << (e - plen)
        f_lo = lo << (e - w)
        f_hi = hi << (e - w)
        if r_hi <= f_lo:
            return True, prefix, plen
        if r_lo >= f_hi:
            return False, prefix, plen
        if f_hi - f_lo < r_hi - r_lo:
            prefix = (prefix << 64) | _word(rng)
            plen += 64
        else:
            w *= 2
            if w > 1 << 20:  # pragma: no cover - would need ~10**5 equal random words
                raise RuntimeError("exact comparison did not converge")
            bounds = oracle(w)


class _InversionTable:
    """Inversion of a CDF F(0) <= F(1) <= ... <= F(K-1) from certified bounds.

    ``lo``/``hi`` are integer bounds of 2**bits F(k); ``oracle(k, W)`` gives bounds of
    2**W F(k) at any precision. ``finite`` means F(K-1) = 1 (no tail)."""

    def __init__(self, lo, hi, oracle, bits, finite):
        top = 1 << bits
        lo = [min(max(v, 0), top) for v in lo]
        hi = [min(max(v, 0), top) for v in hi]
        if finite:
            lo[-1] = hi[-1] = top
        # Monotone envelopes stay valid bounds: F(k) >= F(j) >= lo[j] for j <= k, and
        # F(k) <= F(j) <= hi[j] for j >= k. searchsorted needs them sorted.
        self.lo = np.maximum.accumulate(np.array(lo, dtype=np.uint64))
        self.hi = np.minimum.accumulate(np.array(hi, dtype=np.uint64)[::-1])[::-1].copy()
        self.oracle = oracle
        self.bits = bits
        self.size = len(lo)
        self._bucket_shift, self._bucket_value, self._bucket_settled = self._buckets()

    def _buckets(self):
        """A lookup by the top bits of the prefix, for the buckets of prefixes whose draw
        the table settles alone: every prefix of the bucket has the same x (no ``hi``
        inside it) and is surely below F(x) (the bucket ends below ``lo[x]``) or past the
        table (x = K). Buckets: 2**(bit length of K + 6), 2**10 to 2**16."""
        depth = min(self.bits, max(10, min(16, self.size.bit_length() + 6)))
        shift = self.bits - depth
        first = np.arange(1 << depth, dtype=np.uint64) << np.uint64(shift)
        last = first + np.uint64((1 << shift) - 1)
        x = np.searchsorted(self.hi, first, side="right")
        settled = (x == np.searchsorted(self.hi, last, side="right")) & (
            (x == self.size) | (last < self.lo[np.minimum(x, self.size - 1)]))
        return np.uint64(shift), x.astype(np.int64), settled

    def invert(self, rng, prefixes):
        """Draws for uniform reals whose first ``bits`` bits are ``prefixes``: returns
        (values, tail) with tail marking draws >= K (values there are K).

        A prefix in a settled bucket (:meth:`_buckets`) takes the bucket's value; the
        others are searched in the table, and those between certified bounds resolved by
        more bits, in increasing position (each draw the same as searching them all)."""
        bucket = (prefixes >> self._bucket_shift).astype(np.intp)
        values = self._bucket_value[bucket]
        open_ = np.flatnonzero(~self._bucket_settled[bucket])
        if open_.size:
            p = prefixes[open_]
            x = np.searchsorted(self.hi, p, side="right")     # F(k) <= R for k < x
            in_body = x < self.size
            sure = in_body & (p < self.lo[np.minimum(x, self.size - 1)])
            values[open_] = x
            for i in open_[in_body & ~sure]:
                values[i] = self._resolve(_element(rng, i), int(prefixes[i]), int(values[i]))
        return values, values >= self.size

    def _resolve(self, rng, prefix, k):
        plen = self.bits
        while k < self.size:
            below, prefix, plen = _resolve_less(
                rng, prefix, plen, functools.partial(self.oracle, k))
            if below:
                return k
            k += 1
        return k


# ---------------------------------------------------------------------------------------
# Geometric variables: P(G = k) = (1 - q) q**k, k >= 0.

class _ExpRatio:
    """q = exp(-lam) for a rational lam > 0."""

    def __init__(self, lam):
        self.lam = Fraction(lam)

    def key(self):
        return ("exp", self.lam)

    def neglog(self):
        return float(self.lam)

    def power_bounds(self, k, w):
        return _exp_neg_bounds(k * self.lam, w)

    def power(self, m):
        return _ExpRatio(m * self.lam)


class _RationalRatio:
    """q = (num / den) ** exponent, 0 < num < den (a float q is the dyadic rational it
    stores; powers q**m of a split geometric keep the exponent instead of huge integers)."""

    def __init__(self, num, den, exponent=1):
        self.num, self.den, self.exponent = num, den, exponent

    def key(self):
        return ("rational", self.num, self.den, self.exponent)

    def neglog(self):
        return self.exponent * (math.log(self.den) - math.log(self.num))

    def power_bounds(self, k, w):
        e = k * self.exponent
        if e * max(self.num.bit_length(), self.den.bit_length()) <= 8192:
            num, den = self.num ** e, self.den ** e
            return (num << w) // den, _ceil_div(num << w, den)
        # interval powering at w + guard bits (floor/ceil at every product)
        guard = 64 + 2 * e.bit_length()
        p = w + guard
        base = ((self.num << p) // self.den, _ceil_div(self.num << p, self.den))
        result = (1 << p, 1 << p)
        while e:
            if e & 1:
                result = _mul(result, base, p)
            e >>= 1
            if e:
                base = _mul(base, base, p)
        return result[0] >> guard, _ceil_shift(result[1], guard)

    def power(self, m):
        return _RationalRatio(self.num, self.den, self.exponent * m)


def _power_table(ratio, count, w):
    """Bounds of 2**w q**j for j = 1..count by a rounded recurrence."""
    q = ratio.power_bounds(1, w)
    lows, highs = [], []
    p = q
    for _ in range(count):
        lows.append(p[0])
        highs.append(p[1])
        p = _mul(p, q, w)
    return lows, highs


class _GeometricSampler:
    """Exact Geometric(q). Scales up to about 2**15 / 11 use one table with the tail
    K + Geometric(q) (memoryless). Larger scales split G = m V + U with U ~ Geometric(q)
    truncated to {0..m-1} and V ~ Geometric(q**m), independent: for g = m v + u,
    (1-q) q**g = [(1 - q**m) q**(m v)] [(1-q) q**u / (1 - q**m)]."""

    def __init__(self, ratio, bits):
        self.bits = bits
        w = _TABLE_BITS
        one = 1 << w
        shift = w - bits
        lam = ratio.neglog()
        needed = max(1, math.ceil(_GEOMETRIC_TAIL_BITS * math.log(2) / lam))
        if needed <= _GEOMETRIC_MAX_TABLE:
            self.split = None
            lows, highs = _power_table(ratio, needed, w)     # q**(k+1), k < K
            lo = [(one - h) >> shift for h in highs]
            hi = [_ceil_shift(one - l, shift) for l in lows]

            def oracle(k, w2):
                p_lo, p_hi = ratio.power_bounds(k + 1, w2)
                return (1 << w2) - p_hi, (1 << w2) - p_lo
            self.table = _InversionTable(lo, hi, oracle, bits, finite=False)
        else:
            m = _GEOMETRIC_MAX_TABLE
            self.split = m
            lows, highs = _power_table(ratio, m, w)          # q**(u+1), u < m
            d_lo, d_hi = one - highs[-1], one - lows[-1]      # 1 - q**m
            lo = [((one - h) << bits) // d_hi for h in highs]
            hi = [_ceil_div((one - l) << bits, d_lo) for l in lows]

            def oracle(u, w2):
                if u == m - 1:
                    return 1 << w2, 1 << w2
                g = w2 + 32
                p_lo, p_hi = ratio.power_bounds(u + 1, g)
                m_lo, m_hi = ratio.power_bounds(m, g)
                return (((1 << g) - p_hi) << w2) // ((1 << g) - m_lo), _ceil_div(
                    ((1 << g) - p_lo) << w2, (1 << g) - m_hi)
            self.table = _InversionTable(lo, hi, oracle, bits, finite=True)
            self.outer = _geometric_sampler(ratio.power(m), bits)

    def sample(self, rng, n):
        prefixes = _words(rng, n) >> np.uint64(64 - self.bits)
        values, tail = self.table.invert(rng, prefixes)
        if self.split:
            return values + self.split * self.outer.sample(rng, n)
        if tail.any():
            values[tail] += self.sample(take(rng, tail), int(tail.sum()))
        return values


_SAMPLER_CACHE_SIZE = 32


@functools.lru_cache(maxsize=_SAMPLER_CACHE_SIZE)
def _cached_geometric(key, bits):
    kind = key[0]
    ratio = _ExpRatio(key[1]) if kind == "exp" else _RationalRatio(*key[1:])
    return _GeometricSampler(ratio, bits)


def _geometric_sampler(ratio, bits=PREFIX_BITS):
    return _cached_geometric(ratio.key(), bits)


# ---------------------------------------------------------------------------------------
# Discrete Gaussian: P(X = x) = exp(-x**2 / (2 sigma**2)) / Z over the integers.

def _gaussian_sums(sigma2, w, count):
    """Bounds of 2**w S(k), S(k) = 1 + 2 sum_{1<=j<=k} exp(-j**2/(2 sigma2)), for
    k < count, and of 2**w Z, Z = S(infinity), with absolute error below 2**32 units.

    w_{j+1} = w_j a b**j with a = exp(-1/(2 sigma2)), b = exp(-1/sigma2). Beyond J the
    ratio w_{j+1}/w_j <= exp(-y), y = (2J+3)/(2 sigma2), so sum_{j>J} w_j <=
    w_{J+1} / (1 - exp(-y)) <= w_{J+1} (1 + y) / y."""
    one = 1 << w
    a = _exp_neg_bounds(Fraction(1) / (2 * sigma2), w)
    b = _exp_neg_bounds(Fraction(1) / sigma2, w)
    weight = (one, one)
    ratio = a
    s_lo = s_hi = one
    lows, highs = [one], [one]
    sigma = math.sqrt(float(sigma2))
    check_from = max(count, int(sigma * math.sqrt(2 * (w - 32) * math.log(2))))
    j = 0
    while True:
        weight = _mul(weight, ratio, w)        # w_{j+1}
        ratio = _mul(ratio, b, w)              # r_{j+1} = w_{j+2}/w_{j+1}
        j += 1
        s_lo += 2 * weight[0]
        s_hi += 2 * weight[1]
        if j < count:
            lows.append(s_lo)
            highs.append(s_hi)
        elif j >= check_from and (j - check_from) % 16 == 0:
            nxt = _mul(weight, ratio, w)[1]    # upper bound of w_{j+1}
            y = Fraction(2 * j + 3) / (2 * sigma2)
            tail = _ceil_div(2 * nxt * (y.numerator + y.denominator), y.numerator)
            if tail <= 1 << 32:
                return lows, highs, s_lo, s_hi + tail


class _DiscreteGaussianSampler:
    """Inversion of |X| (P(|X| = 0) = 1/Z, P(|X| = k) = 2 w_k / Z) plus a sign bit; the
    tail |X| >= K by rejection: K + G, G ~ Geometric(exp(-K/sigma**2)), accepted with
    probability exp(-G**2/(2 sigma**2)) (since k**2 - K**2 >= 2K(k - K), the geometric
    envelope dominates exp(-k**2/(2 sigma**2)) and the ratio is that probability)."""

    def __init__(self, sigma2, bits):
        self.sigma2 = sigma2
        self.bits = bits
        sigma = math.sqrt(float(sigma2))
        count = max(2, math.ceil(sigma * math.sqrt(2 * _GAUSSIAN_TAIL_BITS * math.log(2))) + 1)
        lows, highs, z_lo, z_hi = _gaussian_sums(sigma2, _TABLE_BITS, count)
        lo = [(s << bits) // z_hi for s in lows]
        hi = [_ceil_div(s << bits, z_lo) for s in highs]
        self._oracle_cache = {}
        self.table = _InversionTable(lo, hi, self._oracle, bits, finite=False)
        self.tail_start = count

    def _oracle(self, k, w):
        key = w
        if key not in self._oracle_cache:
            g = w + 40
            self._oracle_cache[key] = _gaussian_sums(self.sigma2, g, k + 1) + (g,)
        lows, highs, z_lo, z_hi, g = self._oracle_cache[key]
        if k >= len(lows):
            lows, highs, z_lo, z_hi = _gaussian_sums(self.sigma2, g, k + 1)
        return (lows[k] << w) // z_hi, _ceil_div(highs[k] << w, z_lo)

    def sample(self, rng, n):
        words = _words(rng, n)
        negative = (words & _ONE_BIT).astype(bool)
        magnitude, tail = self.table.invert(rng, words >> np.uint64(64 - self.bits))
        if tail.any():
            magnitude[tail] = self._tail(take(rng, tail), int(tail.sum()))
        return np.where(negative, -magnitude, magnitude)

    def _tail(self, rng, n):
        if n > 1 and hasattr(rng, "element"):     # per-row streams: one row at a time
            return np.concatenate([self._tail(rng.element(i), 1) for i in range(n)])
        envelope = _geometric_sampler(_ExpRatio(Fraction(self.tail_start) / self.sigma2))
        out = []
        while len(out) < n:
            for g in envelope.sample(rng, n - len(out)):
                gamma = Fraction(int(g) ** 2) / (2 * self.sigma2)
                if _bernoulli_exp(rng, gamma):
                    out.append(self.tail_start + int(g))
        return np.array(out, dtype=np.int64)


@functools.lru_cache(maxsize=_SAMPLER_CACHE_SIZE)
def _cached_gaussian(sigma2, bits):
    return _DiscreteGaussianSampler(sigma2, bits)


def _bernoulli_exp(rng, gamma):
    """One exact Bernoulli(exp(-gamma)) coin for a rational gamma >= 0."""
    below, _, _ = _resolve_less(
        rng, _word(rng) >> 1, 63, functools.partial(_exp_neg_bounds, gamma))
    return below


# ---------------------------------------------------------------------------------------
# Public samplers.

def uniform_priorities(rng, size):
    """Uniform random uint64 priorities, for choosing uniform random subsets by sorting."""
    return _words(rng, _count(size)).reshape(size)


def bernoulli(rng, p, size=None):
    """Exact Bernoulli coins: P[True] = p for each float p in [0, 1] (broadcast to size).

    R < p is decided on 63-bit prefixes of R against floor(2**63 p), which is exact for
    a float; on a tie the comparison continues with the next word against the exactly
    computed fractional part frac(2**63 p) (at most 17 rounds for any float)."""
    p = np.asarray(p, dtype=np.float64)
    if p.size and not (np.all(p >= 0.0) and np.all(p <= 1.0)):
        raise ValueError("bernoulli: p must be in [0, 1] (and not NaN)")
    shape = size if size is not None else p.shape
    rest = np.broadcast_to(p, shape).ravel().copy()
    n = rest.size
    out = np.zeros(n, dtype=bool)
    pending = np.arange(n)
    while pending.size:
        frac, whole = np.modf(np.ldexp(rest[pending], PREFIX_BITS))
        threshold = whole.astype(np.uint64)       # < 2**63 exactly, or 2**63 for p = 1
        prefixes = _words(take(rng, pending), pending.size) >> _ONE_BIT
        out[pending] = prefixes < threshold
        tie = (prefixes == threshold) & (frac > 0)
        rest[pending] = frac
        pending = pending[tie]
    return out.reshape(shape)


def cdf_index(rng, cum, prefixes, elements=None):
    """Exact draws from a finite law given by its cumulative probabilities: for each
    element, the first j with U < cum[j] (``len(cum)`` if there is none), U an exact
    uniform real on [0, 1). So P[j] = cum[j] - cum[j - 1] exactly, for the exact (dyadic)
    values of the floats ``cum`` (non-decreasing, clipped to [0, 1]).

    ``prefixes`` are the first 63 bits of each element's U (a word >> 1, drawn by the
    caller, one per element of ``rng``). As in :func:`bernoulli`: U < c is decided on the
    prefix R against floor(2**63 c) (exact for a float): R < floor is below, R > floor
    (or R == floor with no fractional part) is not; only R == floor(2**63 cum[j]) with a
    fractional part left (probability <= len(cum) 2**-63 per element) reads more of the
    element's words, compared exactly against the fractional parts (:func:`_cdf_tie`).
    ``elements``: which elements of ``rng`` the prefixes belong to (default: all, in
    order); only a tie makes the view of its element."""
    c = np.clip(np.asarray(cum, dtype=np.float64), 0.0, 1.0)
    prefixes = np.asarray(prefixes, dtype=np.uint64)
    frac, whole = np.modf(np.ldexp(c, PREFIX_BITS))
    floors = whole.astype(np.uint64)               # <= 2**63 exactly
    first = np.searchsorted(floors, prefixes, side="left")
    out = np.searchsorted(floors, prefixes, side="right")
    with_frac = np.r_[0, np.cumsum(frac > 0)]
    for t in np.flatnonzero(with_frac[out] > with_frac[first]):   # ties: ~never
        a, b = int(first[t]), int(out[t])
        element = t if elements is None else int(elements[t])
        out[t] = a + _cdf_tie(take(rng, [element]), [Fraction(float(x)) for x in frac[a:b]])
    return out


def _cdf_tie(rng, fractions):
    """The first j with V < fractions[j] (len if none), V a fresh exact uniform real read
    63 bits at a time from ``rng``; ``fractions`` non-decreasing dyadics in [0, 1). Ends:
    each round leaves fractional parts of 63 fewer bits (a float has <= 1127)."""
    offset = 0
    xs = list(fractions)
    while True:
        r = _word(rng) >> 1
        scaled = [x * (1 << PREFIX_BITS) for x in xs]
        floors = [int(v) for v in scaled]          # floor: v >= 0
        lo = next((j for j, f in enumerate(floors) if f >= r), len(xs))
        hi = next((j for j, f in enumerate(floors) if f > r), len(xs))
        rest = [v - f for v, f in zip(scaled[lo:hi], floors[lo:hi])]
        if not any(rest):
            return offset + hi
        offset += lo
        xs = rest


def binomial(rng, n, p, *, chunk=1 << 22):
    """Exact Binomial(n, p) counts, one per entry of the int array ``n``: Poisson sampling
    of each of n contributions with probability p (papers 000/003), counted per key.

    Scalar p (the exact rational value of the float): success positions are jumped to
    with exact Geometric gaps, P(gap = g) = p (1 - p)**(g - 1), so the work is about
    n min(p, 1 - p) words plus one per key (for p > 1/2, n - Bin(n, 1 - p)). Array p
    (one per key): the sum of n exact :func:`bernoulli` coins. At most ``chunk`` words
    are drawn at once."""
    n = np.asarray(n, dtype=np.int64)
    if n.size and n.min() < 0:
        raise ValueError("binomial: n must be >= 0")
    if np.ndim(p) == 0:
        p = float(p)
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"binomial: p must be in [0, 1], got {p}")
        if p == 0.0:
            return np.zeros(n.shape, dtype=np.int64)
        if p == 1.0:
            return n.copy()
        rate = Fraction(p)
        if rate > Fraction(1, 2):
            return n - _binomial_by_gaps(rng, n, 1 - rate, chunk)
        return _binomial_by_gaps(rng, n, rate, chunk)
    flat_n = n.ravel()
    flat_p = np.broadcast_to(np.asarray(p, dtype=np.float64), n.shape).ravel()
    out = np.zeros(flat_n.size, dtype=np.int64)
    for i in np.flatnonzero(flat_n > chunk):           # one big key: coins in slices
        remaining = int(flat_n[i])
        while remaining:
            k = min(chunk, remaining)
            out[i] += int(np.count_nonzero(bernoulli(_rows(rng, [i], [k]), flat_p[i], k)))
            remaining -= k
    small = np.flatnonzero(flat_n <= chunk)
    totals = np.cumsum(flat_n[small])
    start = 0
    while start < small.size:                          # keys whose coins fit a chunk
        before = int(totals[start] - flat_n[small[start]])
        stop = max(start + 1, int(np.searchsorted(totals, before + chunk, side="right")))
        keys = small[start:stop]
        owners = np.repeat(np.arange(keys.size), flat_n[keys])
        coins = bernoulli(_rows(rng, keys, flat_n[keys]), flat_p[keys][owners])
        out[keys] = np.bincount(owners[coins], minlength=keys.size)
        start = stop
    return out.reshape(n.shape)


def _binomial_by_gaps(rng, n, rate, chunk):
    """Bin(n, rate) for 0 < rate <= 1/2 (a Fraction): count the success positions
    1 <= S_1 < S_2 < ... <= n, S_j - S_(j-1) ~ 1 + Geometric(1 - rate) i.i.d. A row whose
    drawn gaps all fit continues from its last success (Bernoulli trials are memoryless)."""
    q = 1 - rate
    gaps = _geometric_sampler(_RationalRatio(q.numerator, q.denominator))
    flat = n.ravel()
    out = np.zeros(flat.size, dtype=np.int64)
    remaining = flat.copy()
    rows = np.flatnonzero(remaining > 0)
    p = float(rate)
    while rows.size:
        mean = remaining[rows] * p
        draws = np.minimum(np.ceil(mean + 6.0 * np.sqrt(mean) + 4.0), chunk).astype(np.int64)
        take = max(1, int(np.searchsorted(np.cumsum(draws), chunk, side="right")))
        now, later, draws = rows[:take], rows[take:], draws[:take]
        steps = gaps.sample(_rows(rng, now, draws), int(draws.sum())) + 1
        starts = np.concatenate(([0], np.cumsum(draws)[:-1]))
        position = np.cumsum(steps)
        position -= np.repeat(position[starts] - steps[starts], draws)   # per row
        inside = position <= np.repeat(remaining[now], draws)
        successes = np.add.reduceat(inside.astype(np.int64), starts)
        out[now] += successes
        exhausted = successes == draws
        remaining[now[exhausted]] -= position[(starts + draws - 1)[exhausted]]
        going = now[exhausted]
        rows = np.concatenate((going[remaining[going] > 0], later))
    return out.reshape(n.shape)


def geometric(rng, q, size):
    """Exact geometric on {0, 1, 2, ...}: P[G = k] = (1 - q) q**k for 0 <= q < 1 (the
    rational value of the float q)."""
    q = Fraction(float(q)) if not isinstance(q, Fraction) else q
    if not 0 <= q < 1:
        raise ValueError(f"geometric: q must be in [0, 1), got {float(q)}")
    n = _count(size)
    if q == 0:
        return np.zeros(size, dtype=np.int64)
    sampler = _geometric_sampler(_RationalRatio(q.numerator, q.denominator))
    return sampler.sample(rng, n).reshape(size)


def discrete_laplace(rng, scale, size):
    """Exact integer Laplace: P[X = x] proportional to exp(-|x| / scale) (scale the
    exact rational value of the float given), as the difference of two independent
    Geometric(exp(-1/scale)) variables (Inusah & Kozubowski 2006; CKS20 Algorithm 2)."""
    scale = _exact(scale, "discrete_laplace: scale")
    n = _count(size)
    sampler = _geometric_sampler(_ExpRatio(1 / scale))
    return (sampler.sample(rng, n) - sampler.sample(rng, n)).reshape(size)


def discrete_gaussian(rng, sigma, size):
    """Exact integer Gaussian: P[X = x] proportional to exp(-x**2 / (2 sigma**2)), for
    sigma the exact rational value of the float given (CKS20 Definition 1), 0 < sigma <=
    SIGMA_MAX. The first call for a sigma builds its table (about 6 sigma entries)."""
    sigma = _exact(sigma, "discrete_gaussian: sigma")
    if sigma > SIGMA_MAX:
        raise ValueError(f"discrete_gaussian: sigma must be <= {SIGMA_MAX:g}, got {float(sigma)}")
    n = _count(size)
    return _cached_gaussian(sigma * sigma, PREFIX_BITS).sample(rng, n).reshape(size)

"""Confidence intervals for released noisy values, exact for the noise drawn (issue 27).

Everything here is post-processing: it reads released values and public calibrated
parameters only (docs/intervals.md). Three constructions:

* :func:`count_bounds` -- a count released only when its noisy value reached tau*
  (paper 004 Alg. 1; paper 002 Alg. 3). Given release, Y = n + Z has the law of the
  noise truncated to {Y >= tau*}: P(Y = y | n, released) = p(y - n) / P(Z >= tau* - n).
  The interval is the Neyman construction by inverting two one-sided tests on that
  truncated law (Casella & Berger 2002, Thm 9.2.12 and Sec. 9.2.3):

      C(y) = {n >= floor : P(Y >= y | n, rel) > alpha/2  and  P(Y <= y | n, rel) > alpha/2}.

  Coverage: for the true n, U = P(Y >= Y_obs | n, rel) satisfies P(U <= a) <= a for every
  a (a survival function evaluated at its own variable), and likewise the lower tail, so
  P(n not in C(Y) | released) <= alpha/2 + alpha/2 for EVERY n >= floor. Shape: p is
  log-concave (discrete Gaussian; discrete Laplace), so the location family has monotone
  likelihood ratio, which truncation to a fixed set {y >= tau*} keeps; the truncated laws
  are therefore stochastically increasing in n, the first probability is nondecreasing
  in n and the second nonincreasing, and C(y) is an interval [n_lo, n_hi] found by
  bisection (checked against brute force in tests/accounting/test_intervals.py).
  When C(y) is empty (y is improbable under every n; possible only when the noise puts
  less than alpha/2 on the value tau* itself) any superset keeps the guarantee, and the
  interval published is [floor, the largest n as likely to give Y <= y as n = floor]
  (for the memoryless discrete Laplace, every n <= tau* gives the same truncated law).
  Without a threshold (public keys, the independent count stage of weighted_gaussian
  and adaptive) the same inversion applies with no truncation.
* :func:`symmetric_quantile` -- for noise independent of the selection (sums; counts
  over public keys): the smallest k with P(|Z| <= k) >= 1 - alpha.
* :func:`ratio_range` -- a mean's joint interval: the range of S / n over the box of the
  sum's and the count's intervals (each at half the error rate: union bound).

Numerics: tails are computed in log space (exact sums over the discrete Gaussian pmf,
``accounting.discrete_gaussian``; closed forms for the discrete Laplace), and every
endpoint is an integer decided by comparing probabilities with alpha/2. The intervals are
computed once per release, in the launcher, from the published values
(``pipelines.dataio.intervals``), so every runner publishes the same bytes.
"""
import dataclasses
import math

import numpy as np

from thresher.accounting import discrete_gaussian as dg

GAUSSIAN = "discrete_gaussian"
LAPLACE = "discrete_laplace"
# The discrete Gaussian tail table reaches this many sigmas past what a count interval
# can ask for (tau* - tau): a tail that far out is below e^-112 of the smallest
# probability of release, so it counts as 0 (and as 1 on the left); each tabulated tail
# is summed over this many sigmas of terms (the rest is below e^-112 of its first term).
_TABLE_SIGMAS = 15.0
# Relative tolerance of "as likely as" in the fallback for empty sets (float ties).
_TIE = 1e-9


def _noise_name(noise):
    return {"gaussian": GAUSSIAN, GAUSSIAN: GAUSSIAN, "laplace": LAPLACE, LAPLACE: LAPLACE}[noise]


@dataclasses.dataclass(frozen=True)
class NoiseTail:
    """log P(Z >= z) for integer z, Z the noise drawn: discrete Gaussian N_Z(0, scale^2)
    or discrete Laplace P(z) proportional to exp(-|z| / scale) (``transforms.randomness.samplers``).

    ``reach``: how far past its own _TABLE_SIGMAS sigmas a discrete Gaussian's tail is
    tabulated (tau* - tau for a count interval); past the table the tail counts as 0
    (or as 1 on the left). ``shared`` > 0 (discrete Gaussian only): the noise is
    correlated, V = S + X with S ~ N_Z(0, shared^2) the release's shared component and X
    ~ N_Z(0, scale^2) the key's own (``accounting.correlated_gshm``); the table is of V, the
    exact convolution (summed in log space), which is log-concave like its parts, so the
    intervals' construction is unchanged."""
    noise: str
    scale: float
    reach: int = 0
    shared: float = 0.0

    def __post_init__(self):
        object.__setattr__(self, "noise", _noise_name(self.noise))
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"noise scale must be > 0, got {self.scale}")
        if not (math.isfinite(self.shared) and self.shared >= 0):
            raise ValueError(f"shared noise scale must be >= 0, got {self.shared}")
        if self.shared > 0 and self.noise != GAUSSIAN:
            raise ValueError("a shared component is supported with discrete Gaussian noise only")
        if self.noise == GAUSSIAN:
            spread = math.sqrt(self.scale ** 2 + self.shared ** 2)
            reach = int(self.reach) + int(math.ceil(_TABLE_SIGMAS * spread)) + 2
            span = int(math.ceil(_TABLE_SIGMAS * spread)) + 2
            z = np.arange(-reach, reach + span + 1, dtype=np.float64)
            logpmf = _log_gaussian_pmf(z, self.scale, self.shared)
            # log P(Z >= z) = logsumexp of the pmf from z up (sequential, so deterministic)
            table = np.logaddexp.accumulate(logpmf[::-1])[::-1]
            object.__setattr__(self, "_lo", -reach)
            object.__setattr__(self, "_hi", reach)
            object.__setattr__(self, "_table", np.minimum(table[:2 * reach + 1], 0.0))

    def log_sf(self, z):
        """log P(Z >= z), elementwise over an int64 array."""
        z = np.asarray(z, dtype=np.int64)
        if self.noise == LAPLACE:
            log_q = -1.0 / self.scale
            zf = z.astype(np.float64)
            upper = zf * log_q - math.log1p(math.exp(log_q))          # z >= 1: q^z / (1 + q)
            lower = np.log1p(-np.exp((1.0 - np.minimum(zf, 0.0)) * log_q - math.log1p(math.exp(log_q))))
            return np.where(z >= 1, upper, np.minimum(lower, 0.0))
        out = np.empty(z.shape, dtype=np.float64)
        inside = (z >= self._lo) & (z <= self._hi)
        out[inside] = self._table[z[inside] - self._lo]
        out[z > self._hi] = -np.inf
        out[z < self._lo] = 0.0
        return out


def _log_gaussian_pmf(v, scale, shared):
    """log P(V = v) for V = X (shared 0) or V = S + X, X ~ N_Z(0, scale^2), S ~ N_Z(0,
    shared^2): the convolution sum_s P(S = s) P(X = v - s) over |s| <= 38.6 shared (the
    rest, < 1e-300, underflows), as a log-sum-exp per v."""
    def logpmf(x, sd):
        return -x * x / (2.0 * sd * sd) - dg.log_normalizer(sd)
    if shared == 0:
        return logpmf(v, scale)
    k = int(math.ceil(38.6 * shared)) + 1
    s = np.arange(-k, k + 1, dtype=np.float64)
    log_s = logpmf(s, shared)
    out = np.empty(v.shape, dtype=np.float64)
    for start in range(0, v.size, 256):          # bounded memory: 256 rows at a time
        terms = log_s[None, :] + logpmf(v[start:start + 256, None] - s[None, :], scale)
        top = terms.max(axis=1)
        out[start:start + 256] = top + np.log(np.exp(terms - top[:, None]).sum(axis=1))
    return out


def _first_true(pred, lo, hi):
    """Per element, the least n in [lo, hi] with pred(n) true, for predicates monotone
    (false then true) in n; hi where pred(hi) is the first true (callers make sure
    pred(hi) holds)."""
    lo, hi = lo.copy(), hi.copy()
    done = pred(lo)
    hi = np.where(done, lo, hi)
    lo = np.where(done, lo, lo + 1)       # invariant: pred(hi) true, pred(lo - 1) false
    while True:
        open_ = lo < hi
        if not open_.any():
            return hi
        mid = lo + (hi - lo) // 2
        ok = pred(mid)
        hi = np.where(open_ & ok, mid, hi)
        lo = np.where(open_ & ~ok, mid + 1, lo)


def count_bounds(y, tail, alpha, floor, threshold=None, clamped_at_zero=False):
    """The selection-aware interval [n_lo, n_hi] for each released noisy count (module
    docstring).

    y: int64 released values (each >= threshold when there is one); tail: the NoiseTail
    drawn; floor: the least possible true count (pre_threshold, or 0); threshold: tau*,
    or None when every key is released; clamped_at_zero: released values were
    max(Y, 0) (public keys with clamp_negative: a 0 means Y <= 0). Returns two int64
    arrays."""
    y = np.asarray(y, dtype=np.int64)
    if y.size == 0:
        return y.copy(), y.copy()
    if threshold is None and y.size > _SHIFT_MIN:
        return _untruncated_bounds(y, tail, alpha, floor, clamped_at_zero)
    return _neyman_bounds(y, tail, alpha, floor, threshold, clamped_at_zero)


# Without a threshold, above this many values the interval is found once and shifted
# (:func:`_untruncated_bounds`); below it the bisection per value is as cheap.
_SHIFT_MIN = 64


def _untruncated_bounds(y, tail, alpha, floor, clamped_at_zero):
    """:func:`count_bounds` without a threshold (public keys; the independent count stage
    of weighted_gaussian and adaptive), by translation. With no truncation the two tests
    read the noise's own tails at y - n and y + 1 - n, so away from ``floor`` the Neyman
    set of y is that of any y0 shifted by y - y0: n_lo = max(floor, y - a) and n_hi = y + b
    with (a, b) found once, at a y0 whose set does not reach the floor. Values whose set
    would be empty (y + b < floor) or a clamped 0 take the bisection
    (:func:`_neyman_bounds`), which this equals value for value
    (tests/accounting/test_intervals.py, every y of a range around the floor)."""
    floor = int(floor)
    reach = int(tail._hi) if tail.noise == GAUSSIAN else _laplace_reach(tail.scale)
    y0 = floor + 2 * reach + 2
    lo0, hi0 = _neyman_bounds(np.array([y0], dtype=np.int64), tail, alpha, floor, None,
                              False)
    a, b = y0 - int(lo0[0]), int(hi0[0]) - y0
    if y0 - a <= floor:           # the reference reaches the floor: no shift is exact
        return _neyman_bounds(y, tail, alpha, floor, None, clamped_at_zero)
    # n_lo is the first n >= floor passing a test increasing in n: max(floor, y - a); n_hi
    # the last n before the other test fails, y + b, while that is >= floor (below it the
    # set is empty and the bisection's tie rule applies)
    shifted = y + b >= floor
    if clamped_at_zero:
        shifted &= y != 0
    lo, hi = np.maximum(y - a, floor), y + b
    rest = np.flatnonzero(~shifted)
    if rest.size:
        lo_r, hi_r = _neyman_bounds(y[rest], tail, alpha, floor, None, clamped_at_zero)
        lo[rest], hi[rest] = lo_r, hi_r
    return lo, hi


def _neyman_bounds(y, tail, alpha, floor, threshold, clamped_at_zero):
    """:func:`count_bounds` by bisection per value (the definition)."""
    half = alpha / 2.0
    floor = int(floor)
    reach = int(tail._hi) if tail.noise == GAUSSIAN else _laplace_reach(tail.scale)

    def log_released(n):
        return 0.0 if threshold is None else tail.log_sf(int(math.ceil(threshold)) - n)

    def upper_tail(n):            # P(Y >= y | n, released)
        p = np.exp(np.minimum(tail.log_sf(y - n) - log_released(n), 0.0))
        if clamped_at_zero:
            p = np.where(y == 0, 1.0, p)
        return p

    def lower_tail(n):            # P(Y <= y | n, released)
        return -np.expm1(np.minimum(tail.log_sf(y + 1 - n) - log_released(n), 0.0))

    base = np.full(y.shape, floor, dtype=np.int64)
    top = np.maximum(y, floor) + reach + 1
    return _invert(upper_tail, lower_tail, half, base, top)



def _invert(upper_tail, lower_tail, half, base, top):
    """The equal-tailed Neyman interval [n_lo, n_hi] of each observation, n in [base, top):
    n_lo the first n whose upper tail exceeds ``half``, n_hi the last n whose lower tail
    does (first n with lower_tail <= half, minus one); where that is empty (a tie of the
    discrete law), the n whose lower tail is within _TIE of the largest, down to ``base``."""
    n_lo = _first_true(lambda n: upper_tail(n) > half, base, top)
    n_hi = _first_true(lambda n: lower_tail(n) <= half, base, top) - 1
    empty = n_hi < n_lo
    if empty.any():
        level = lower_tail(base) * (1.0 - _TIE)
        tie_hi = _first_true(lambda n: lower_tail(n) < level, base, top) - 1
        n_hi = np.where(empty, np.maximum(tie_hi, n_lo), n_hi)
        n_lo = np.where(empty, base, n_lo)
    return n_lo, n_hi

def _laplace_reach(scale):
    # P(|Z| > r) = 2 q^(r+1) / (1 + q) < e^-800 for r >= 800 scale
    return int(math.ceil(800.0 * scale)) + 2


def symmetric_quantile(noise, scale, alpha):
    """The least integer k >= 0 with P(|Z| <= k) >= 1 - alpha, i.e. 2 P(Z >= k + 1) <= alpha
    (the noise is symmetric), from the exact tails (no table: sums have sigmas up to 2^20
    grid units)."""
    noise, scale = _noise_name(noise), float(scale)
    if noise == LAPLACE:
        tail = NoiseTail(LAPLACE, scale)
        log_q = -1.0 / scale
        # 2 q^(k+1) / (1 + q) <= alpha  <=>  k + 1 >= log(alpha (1 + q) / 2) / log q
        k = int(max(0, math.ceil(math.log(alpha * (1.0 + math.exp(log_q)) / 2.0) / log_q) - 1))
        # guard float rounding of the closed form with the exact test either side
        while k > 0 and _two_tail(tail, k - 1) <= alpha:
            k -= 1
        while _two_tail(tail, k) > alpha:
            k += 1
        return k
    tail = _ExactGaussianTail(scale)
    lo, hi = 0, int(math.ceil(40.0 * scale)) + 1      # 2 P(Z >= 40 sigma) < 1e-300
    while lo < hi:
        mid = (lo + hi) // 2
        if _two_tail(tail, mid) <= alpha:
            hi = mid
        else:
            lo = mid + 1
    return lo


def _two_tail(tail, k):
    return 2.0 * float(np.exp(tail.log_sf(np.array([k + 1]))[0]))


@dataclasses.dataclass(frozen=True)
class _ExactGaussianTail:
    """log P(Z >= z) of N_Z(0, scale^2) by the exact sums of accounting.discrete_gaussian
    (one sum per value: for the few evaluations of a quantile)."""
    scale: float

    def log_sf(self, z):
        return np.asarray(dg.log_sf(np.asarray(z, dtype=np.int64), self.scale), dtype=np.float64)


def ratio_range(s_lo, s_hi, n_lo, n_hi):
    """The range of S / n over S in [s_lo, s_hi], n in [n_lo, n_hi] (n_lo >= 1):
    S / n is monotone in each coordinate, so the extremes are at corners."""
    s_lo, s_hi = np.asarray(s_lo, dtype=np.float64), np.asarray(s_hi, dtype=np.float64)
    n_lo, n_hi = np.asarray(n_lo, dtype=np.float64), np.asarray(n_hi, dtype=np.float64)
    low = np.where(s_lo >= 0, s_lo / n_hi, s_lo / n_lo)
    high = np.where(s_hi >= 0, s_hi / n_lo, s_hi / n_hi)
    return low, high


def binomial_bounds(x, p, alpha, threshold):
    """Sample-and-threshold (papers 000/003): a key's sampled count X ~ Bin(n, p) (each of
    its n bounded users kept with probability p) is released when X >= tau. The interval
    for n given the released x is the same Neyman inversion on Bin(n, p) truncated to
    {X >= tau}:

        {n >= max(x, 1) : P(X >= x | n, rel) > alpha/2  and  P(X <= x | n, rel) > alpha/2}.

    Bin(n, p) has monotone likelihood ratio in n (P_{n+1}(x) / P_n(x) = (1 - p)(n + 1) /
    (n + 1 - x) grows with x), kept by truncation, so the set is an interval; empty sets
    get the fallback of :func:`count_bounds`. Exact binomial tails (scipy.stats.binom,
    log scale). Returns two int64 arrays."""
    from scipy.stats import binom
    x = np.asarray(x, dtype=np.int64)
    if x.size == 0:
        return x.copy(), x.copy()
    half = alpha / 2.0
    tau = int(math.ceil(threshold))
    p = float(p)

    def log_released(n):
        return binom.logsf(tau - 1, n, p)

    def upper_tail(n):            # P(X >= x | n, released)
        return np.exp(np.minimum(binom.logsf(x - 1, n, p) - log_released(n), 0.0))

    def lower_tail(n):            # P(X <= x | n, released)
        return -np.expm1(np.minimum(binom.logsf(x, n, p) - log_released(n), 0.0))

    base = np.maximum(x, 1)
    # far enough that X <= x has probability ~0 (mean n p, sd sqrt(n p)): n p >= x + 40 sd
    top = np.ceil((x + 40.0 * np.sqrt(x + 1.0) + 1600.0) / p).astype(np.int64) + 1
    with np.errstate(divide="ignore", invalid="ignore"):
        return _invert(upper_tail, lower_tail, half, base, top)

"""Value aggregates beside the count: fixed-point grids and the joint privacy accounting.

A release with ``aggregates`` publishes, per released key, the noisy user count and one
noisy clamped sum per (column, clip) pair. Paper 004 (Karrer et al.) Alg. 1 releases
exactly this vector, ``[count + v, A(X, G_i) + m]``, and Thm 5.4 accounts for it with
mu_o, the privacy cost of the extra columns of one row (Eq. 5.1).

Fixed point (no floating-point privacy holes; Mironov 2012, Casacuberta et al. 2022).
A user's total for a key (their finite values summed) is clamped to [low, high] and put
on the integer grid t = rint(clamp(total) * g) with g = 2**(GRID_BITS - e), where e is
the smallest integer with D = max(|low|, |high|) <= 2**e (so 2**(GRID_BITS-1) < D g <= 2**GRID_BITS). g is a power of two, so
clamp(total) * g is exact, and |t| <= D_g = max(|rint(low g)|, |rint(high g)|) <=
2**GRID_BITS. Per key the grid values are summed in int64: at most MAX_USERS users per key
give |sum| <= 2**(GRID_BITS + MAX_USER_BITS) = 2**62 < 2**63, so no sum can overflow.
Integer noise (discrete Gaussian / discrete Laplace, ``transforms.randomness.samplers``) is added on
the grid; the released float is (sum + noise) / g (post-processing).

Joint accounting, Gaussian (l0 model, each user in <= C keys, once each). For a key the
user is in whose count is >= tau with and without them (an a_+ row of Lemma 5.3), the
released row moves by (1, s_1, ..., s_J) with |s_j| <= D_j (grid units). Every location
family with a log-concave pmf (the discrete Gaussian) has a monotone likelihood ratio, so
the most powerful tests of N_Z(0) against N_Z(s) are the same threshold tests for every
s in (0, D], and their power grows with s: the trade-off function of (N_Z(s), N_Z(0)) lies
above that of (N_Z(D), N_Z(0)), and by Blackwell's theorem the first pair is a
post-processing (one Markov kernel applied to both) of the second; s < 0 is the
reflection y -> -y of -s. Coordinatewise kernels compose, so every a_+ configuration is
a post-processing of the one where every row moves by exactly (1, D_1, ..., D_J), and the
hockey-stick divergence can only fall under post-processing. The a_= rows (keys at the
pre-threshold) are released, aggregates included, only with the user: Thm 5.4's
1 - beta terms cover them whatever the extra columns hold. So Thm 5.4 holds verbatim with

    delta_+(a, e) = H_{e^e}(P_a || Q_a),  P_a = prod over a rows of
                    N_Z(1, sigma^2) x N_Z(D_1, sigma_1^2) x ... ,  Q_a the same at 0,

symmetric in its two arguments (reflect every coordinate about half its shift). Under P_a
the privacy loss is L = (2 S + a)/(2 sigma^2) + sum_j (2 D_j S_j + a D_j^2)/(2 sigma_j^2),
S, S_j sums of a i.i.d. N_Z(0, .) draws, and delta_+ = E[(1 - e^(e - L))_+].

:func:`joint_shift_delta` computes an upper bound on it, rigorously:

1. Lemma A of ``accounting.discrete_gaussian``: P[S = u] <= e^(T_a) P[Y = u] with
   Y ~ N_Z(0, a sigma^2) (T_a <= 1e-9 for sigma >= 1.5, 0 for the aggregates' large
   sigma_j); the integrand is >= 0, so the expectation grows by at most e^(sum T).
2. Each aggregate's loss A_j = (2 D_j Y_j + a D_j^2)/(2 sigma_j^2) is rounded *up* to the
   grid h Z (bin masses bounded from above: exact pmf sums for small sd, else the
   Euler-Maclaurin bounds of Lemma B); (1 - e^(e - l))_+ is non-decreasing in l, so this
   can only raise the expectation. Mass below the lowest bin goes into it (raised), mass
   above the highest bin is counted at loss +infinity (it adds to delta in full).
3. The rounded aggregate losses are convolved (sums of non-negative products), and the
   count coordinate is summed exactly against the result with suffix sums.

So delta_+ <= the value returned, which exceeds it by at most the effect of raising the
loss by J h (h ~ 24 sqrt(a) max_j mu_j / BINS) plus ~1e-14 of float rounding (added).
tests/accounting/test_aggregates.py checks it against brute-force joint sums.

Laplace (and any pure release of the sums): the sums of all keys form a vector that one
user moves by at most C D_j in l1 norm; discrete Laplace noise of scale b_j = C D_j /
epsilon_j on every key makes it epsilon_j-DP (Dwork & Roth Thm 3.6, discrete form), and
the published sums (those of released keys) are a post-processing of that vector and of
the thresholded counts: basic composition, epsilon = epsilon_count + sum_j epsilon_j.
"""
import dataclasses
import functools
import math
from fractions import Fraction

import numpy as np
from thresher.accounting import fixed_order

from thresher.accounting import discrete_gaussian as dg

# Grid: a user's clamped total takes at most 2**GRID_BITS grid steps each way.
GRID_BITS = 12
# At most 2**MAX_USER_BITS users per key; with GRID_BITS the per-key sum fits in int64.
MAX_USER_BITS = 50
MAX_USERS = 1 << MAX_USER_BITS
assert GRID_BITS + MAX_USER_BITS <= 62
# Pessimistic binning of an aggregate's loss: +-TAIL_SDS standard deviations in BINS bins.
TAIL_SDS = 12.0
BINS = 4000
# Allowance for float rounding in the sums of step 3 (absolute, added to delta).
FLOAT_SLACK = 1e-14


@dataclasses.dataclass(frozen=True)
class FixedPointGrid:
    """The fixed-point grid of one clamped sum: ``scale`` g (a power of two) grid steps
    per unit of the value; a clamped total x becomes rint(x g) in [low_units, high_units];
    ``sensitivity`` D_g = max(|low_units|, |high_units|) <= 2**GRID_BITS."""

    low: float
    high: float
    scale: float
    low_units: int
    high_units: int

    @property
    def sensitivity(self):
        return max(abs(self.low_units), abs(self.high_units))

    @property
    def resolution(self):
        """One grid step in the value's unit (1 / g)."""
        return 1.0 / self.scale

    def to_units(self, totals):
        """float64 per-user totals (finite or +-inf; never NaN) -> int64 grid values."""
        x = np.clip(np.asarray(totals, dtype=np.float64), self.low, self.high)
        return np.rint(x * self.scale).astype(np.int64)


def fixed_point_grid(low, high):
    """The grid for clip [low, high] (finite, low < high, not both 0). ValueError if the
    grid is not representable (a bound below ~1e-290 in magnitude)."""
    low, high = float(low), float(high)
    if not (math.isfinite(low) and math.isfinite(high)):
        raise ValueError(f"clip bounds must be finite, got [{low}, {high}]")
    if not low < high:
        raise ValueError(f"clip must have low < high, got [{low:g}, {high:g}]")
    bound = max(abs(low), abs(high))
    m, e = math.frexp(bound)              # bound = m 2**e, 1/2 <= m < 1, so bound <= 2**e
    if m == 0.5:
        e -= 1                            # bound is a power of two: bound = 2**(e-1)
    exponent = GRID_BITS - e
    if exponent > 960 or exponent < -1000:
        raise ValueError(f"clip bounds [{low:g}, {high:g}] are too close to 0 or too large "
                         f"for a fixed-point grid (largest magnitude {bound:g})")
    scale = math.ldexp(1.0, exponent)     # bound * scale <= 2**GRID_BITS, exactly
    lo_u, hi_u = int(np.rint(low * scale)), int(np.rint(high * scale))
    grid = FixedPointGrid(low=low, high=high, scale=scale, low_units=lo_u, high_units=hi_u)
    assert grid.sensitivity <= (1 << GRID_BITS)
    if grid.sensitivity == 0:
        raise ValueError(f"clip [{low:g}, {high:g}] rounds to 0 on its grid")
    return grid


@dataclasses.dataclass(frozen=True)
class SquaredGrid:
    """The grid of a sum of *squares* of clamped totals (``statistic: variance / stddev``):
    a user's total x is clamped to [clip_low, clip_high] first, then x^2 is put on
    ``squares`` (the grid of [min x^2, max x^2] over the clip), so a user moves the sum of
    squares by at most ``sensitivity`` = squares.sensitivity <= 2**GRID_BITS grid units,
    like any sum column (the same joint accounting applies)."""

    clip_low: float
    clip_high: float
    squares: FixedPointGrid

    @property
    def sensitivity(self):
        return self.squares.sensitivity

    @property
    def scale(self):
        return self.squares.scale

    @property
    def resolution(self):
        return self.squares.resolution

    @property
    def low(self):
        return self.squares.low

    @property
    def high(self):
        return self.squares.high

    def to_units(self, totals):
        x = np.clip(np.asarray(totals, dtype=np.float64), self.clip_low, self.clip_high)
        return self.squares.to_units(x * x)


def squared_grid(low, high):
    """The SquaredGrid of clip [low, high]: squares in [0 or min(low^2, high^2), max(...)]."""
    low, high = float(low), float(high)
    sq_low = 0.0 if low <= 0.0 <= high else min(low * low, high * high)
    sq_high = max(low * low, high * high)
    if sq_low == sq_high:
        sq_low = 0.0
    return SquaredGrid(clip_low=low, clip_high=high, squares=fixed_point_grid(sq_low, sq_high))


# ---------------------------------------------------------------------------------------
# Joint count + aggregates hockey-stick divergence (Gaussian).


def _check_columns(columns):
    out = []
    for d, s in columns:
        d, s = int(d), float(s)
        if d < 1 or not (math.isfinite(s) and s > 0):
            raise ValueError(f"aggregate columns need sensitivity >= 1 and sigma > 0, got {(d, s)}")
        out.append((d, s))
    return tuple(out)


def _binned_loss(count, d, sigma_j, h):
    """Upper bounds on the masses of the aggregate's loss A = (2 d Y + a d^2)/(2 s^2),
    Y ~ N_Z(0, a s^2), rounded up to the grid h Z: returns (first bin index k0, masses
    q[k] for loss (k0 + k) h, mass at +infinity)."""
    a = int(count)
    sd = sigma_j * math.sqrt(a)
    alpha = d / (sigma_j * sigma_j)
    beta = a * d * d / (2.0 * sigma_j * sigma_j)
    span = TAIL_SDS * sd
    k_lo = math.floor((beta - alpha * span) / h)
    k_hi = math.ceil((beta + alpha * span) / h)
    # bin k (k_lo < k <= k_hi) holds losses in ((k-1) h, k h]: Y in (v(k-1), v(k)] with
    # v(k) = floor((k h - beta) / alpha); bin k_lo holds everything with loss <= k_lo h.
    ks = np.arange(k_lo, k_hi + 1, dtype=np.float64)
    v = np.floor((ks * h - beta) / alpha)
    if sd < 50.0:
        kk = int(math.ceil(dg._PMF_SIGMAS * sd)) + 1
        y = np.arange(-kk, kk + 1, dtype=np.float64)
        p = fixed_order.exp(-y * y / (2.0 * sd * sd) - dg.log_normalizer(sd))
        cut = 2.0 * math.exp(dg._log_upper_sum(kk + 1, sd) - dg.log_normalizer(sd))
        idx = np.searchsorted(v, y, side="left")      # first k with v(k) >= y
        inside = idx < v.size
        q = np.bincount(idx[inside], weights=p[inside], minlength=v.size)
        q[0] += cut                                    # the cut lower tail, raised
        inf_mass = float(p[~inside].sum()) + cut
        return k_lo, q, inf_mass
    log_z = dg._poisson_log_normalizer(sd)
    # P[Y >= v + 1] bounds at every edge; mass of bin k <= upper(v(k-1)+1) - lower(v(k)+1)
    upper = dg._sf_bound(v + 1.0, sd, log_z, True)
    lower = dg._sf_bound(v + 1.0, sd, log_z, False)
    q = np.empty(v.size)
    q[0] = 1.0 - lower[0]
    q[1:] = upper[:-1] - lower[1:]
    np.maximum(q, 0.0, out=q)
    return k_lo, q, float(min(1.0, upper[-1]))


@functools.lru_cache(maxsize=512)
def _aggregate_loss(count, columns, h):
    """The rounded-up total aggregate loss for ``count`` rows: (k0, q, inf_mass) with
    q[k] an upper bound on P[sum_j A_j rounds to (k0 + k) h]."""
    k0, q, inf_mass = 0, np.ones(1), 0.0
    for d, s in columns:
        kj, qj, infj = _binned_loss(count, d, s, h)
        q = fixed_order.convolve(q, qj)     # direct sums of non-negative products (no BLAS)
        inf_mass = inf_mass + infj          # union bound
        k0 += kj
        nz = np.flatnonzero(q > 0)
        if nz.size:
            k0 += int(nz[0])
            q = q[nz[0]:nz[-1] + 1]
    return k0, q, min(1.0, inf_mass)


# The count's pmf is summed over +-COUNT_SDS standard deviations; the mass outside
# (< 1e-43) is added to delta in full.
COUNT_SDS = 14.0


def _count_pmf(count, sigma):
    """Exact pmf of Y ~ N_Z(0, a sigma^2) on +-COUNT_SDS sd, and the mass cut off."""
    sd = sigma * math.sqrt(count)
    kk = int(math.ceil(COUNT_SDS * sd)) + 1
    u = np.arange(-kk, kk + 1, dtype=np.float64)
    log_z = dg.log_normalizer(sd)
    p = fixed_order.exp(-u * u / (2.0 * sd * sd) - log_z)
    cut = 2.0 * math.exp(dg._log_upper_sum(kk + 1, sd) - log_z)
    return u, p, cut


def loss_step(count, sigma, columns, bins=BINS):
    """The rounding step h for ``count`` rows (loss units)."""
    mu = max(d / s for d, s in columns)
    return 2.0 * TAIL_SDS * math.sqrt(count) * mu / bins


def joint_shift_delta(epsilon, sigma, count, columns, *, bins=BINS):
    """Upper bound on delta_+(count, epsilon): count rows each moved by (1, D_1, ..., D_J)
    under N_Z(0, sigma^2) x N_Z(0, sigma_1^2) x ... noise (module docstring).

    Args:
      epsilon: real (any sign), broadcast with ``count`` (integers >= 1).
      sigma: the count's discrete Gaussian sigma (users).
      columns: tuple of (D_j, sigma_j), sensitivity and noise sigma in grid units.
    Returns delta in [0, 1] (array, or float for scalar arguments).
    """
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be > 0, got {sigma}")
    columns = _check_columns(columns)
    eps_arr, count_arr = np.broadcast_arrays(np.asarray(epsilon, dtype=np.float64),
                                             np.asarray(count))
    if np.any(count_arr != np.round(count_arr)) or np.any(count_arr < 1):
        raise ValueError(f"count must be integers >= 1, got {count}")
    if not columns:
        return dg.composed_shift_delta(epsilon, sigma, count)
    out = np.empty(eps_arr.shape, dtype=np.float64)
    flat_e, flat_out = eps_arr.reshape(-1), out.reshape(-1)
    flat_a = count_arr.reshape(-1).astype(np.int64)
    for a in np.unique(flat_a):
        sel = np.flatnonzero(flat_a == a)
        flat_out[sel] = _joint_delta_at(int(a), flat_e[sel], sigma, columns, bins)
    out = np.clip(out, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def _joint_delta_at(a, epsilons, sigma, columns, bins):
    t_total = float(dg.sum_ratio_bound(a, sigma)) + sum(
        float(dg.sum_ratio_bound(a, s)) for _, s in columns)
    if not math.isfinite(t_total):
        return np.ones(len(epsilons))
    h = loss_step(a, sigma, columns, bins)
    k0, q, inf_mass = _aggregate_loss(a, columns, h)
    x = (k0 + np.arange(q.size, dtype=np.float64)) * h      # aggregate loss values
    x0 = x[0]
    # suffix sums: Q[i] = sum_{k >= i} q_k, W[i] = sum_{k >= i} q_k e^{-(x_k - x0)}
    big_q = np.concatenate((np.cumsum(q[::-1])[::-1], [0.0]))
    big_w = np.concatenate((np.cumsum((q * fixed_order.exp(-(x - x0)))[::-1])[::-1], [0.0]))
    u, p, cut = _count_pmf(a, sigma)
    count_loss = (2.0 * u + a) / (2.0 * sigma * sigma)
    out = np.empty(len(epsilons))
    for i, e in enumerate(epsilons):
        t = e - count_loss                                   # need aggregate loss > t
        idx = np.searchsorted(x, t, side="right")
        inside = idx < x.size
        g = np.zeros(t.size)
        ti, ii = t[inside], idx[inside]
        g[inside] = big_q[ii] - fixed_order.exp(ti - x0) * big_w[ii]
        np.maximum(g, 0.0, out=g)
        g += inf_mass
        value = fixed_order.dot(p, g) + cut + FLOAT_SLACK
        out[i] = min(1.0, math.exp(t_total) * value)
    return out


# ---------------------------------------------------------------------------------------
# Error figures (for ``thresher plan``; no data).


def expected_abs_gaussian(sd):
    """E|N(0, sd^2)| = sd sqrt(2/pi) (the discrete Gaussian's is within 1e-9 for sd >= 2)."""
    return float(sd) * math.sqrt(2.0 / math.pi)


def expected_abs_laplace(scale):
    """E|X| of the discrete Laplace, P[X = x] ~ exp(-|x|/b): 2 q / (1 - q^2), q = e^(-1/b)."""
    q = math.exp(-1.0 / float(scale))
    return 2.0 * q / (1.0 - q * q)


def mean_error(count_sd, sum_sd, users, bound):
    """First-order standard deviation of noisy_sum / noisy_count at ``users`` users for a
    per-user mean m with |m| <= bound (worst case m = bound):
    sqrt(sum_sd^2 + bound^2 count_sd^2) / users."""
    return math.sqrt(sum_sd ** 2 + (bound * count_sd) ** 2) / float(users)


# ---------------------------------------------------------------------------------------
# clip: auto -- a private quantile of the per-(user, key) totals (exponential mechanism).
#
# Candidates are powers of two b = 2**k, so every candidate's grid has the same
# sensitivity D_g = 2**GRID_BITS and one calibration serves them all. With the clip
# [0, b], the statistic of candidate b is F(b) = sum over users u of (1/k_u) #{keys of u
# with total <= b} (k_u the user's number of distinct keys), and N the number of users.
# The score -|F(b) - q N| (paper 003's quantile as an exponential mechanism; Smith 2011)
# moves by at most max(q, 1 - q) <= 1 when one user is added or removed (F by a weight
# in [0, 1], q N by q), for every b: sensitivity 1, not monotone, so the standard
# exponential mechanism exp(epsilon score / 2) (accounting.selection) is epsilon-DP.

DEFAULT_AUTO_QUANTILE = 0.99
DEFAULT_AUTO_MIN_EXPONENT = -10
DEFAULT_AUTO_MAX_EXPONENT = 30


def clip_candidates(min_exponent=DEFAULT_AUTO_MIN_EXPONENT, max_exponent=DEFAULT_AUTO_MAX_EXPONENT):
    """The candidate upper bounds 2**k, k = min_exponent..max_exponent (float64)."""
    return np.ldexp(1.0, np.arange(int(min_exponent), int(max_exponent) + 1))


# F(b) is summed exactly (issue 25, F2): a user's weight 1/k_i is rounded down to units of
# 2^-QUANTILE_BITS and every sum is an integer sum, so the statistic -- and the draw -- is
# the same whatever order the user shards are added in. A user's rounded weights still add
# to a value in [0, 1], so the sensitivity argument above is unchanged (no allowance is
# needed). 2^30 units per user keep a shard's int64 sums exact up to 2^33 users.
QUANTILE_BITS = 30


def quantile_statistic(totals, user_index, candidates):
    """Per-candidate F(b) and N for one set of whole users: ``totals`` per (user, key),
    ``user_index`` their user numbers 0..U-1. Returns int64 [F(b_0), .., F(b_K-1), N]
    with F in units of 2^-QUANTILE_BITS (each (user, key) weighs floor(2^30 / k_i)):
    exact integers, so shards add in any order to the same vector."""
    totals = np.asarray(totals, dtype=np.float64)
    user_index = np.asarray(user_index, dtype=np.int64)
    if totals.size == 0:
        return np.zeros(len(candidates) + 1, dtype=np.int64)
    keys_per_user = np.bincount(user_index)
    weights = (np.int64(1) << np.int64(QUANTILE_BITS)) // keys_per_user[user_index]
    order = np.argsort(totals, kind="stable")
    cumulative = np.concatenate(([0], np.cumsum(weights[order], dtype=np.int64)))
    below = np.searchsorted(totals[order], candidates, side="right")
    n_users = np.count_nonzero(keys_per_user)
    return np.concatenate((cumulative[below], [n_users])).astype(np.int64)


def quantile_scores(statistic, quantile):
    """-|F(b) - q N| per candidate (sensitivity 1), as exact Fractions of the integer
    statistic (F in units of 2^-QUANTILE_BITS, N users; q as the exact binary64 value)."""
    unit = Fraction(1, 1 << QUANTILE_BITS)
    target = Fraction(float(quantile)) * int(statistic[-1])
    return [-abs(unit * int(f) - target) for f in statistic[:-1]]

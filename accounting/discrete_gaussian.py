"""The discrete Gaussian N_Z(0, sigma^2) and the exact privacy of shifting it.

N_Z(0, sigma^2) has P[X = x] = exp(-x^2 / (2 sigma^2)) / Z(sigma) on the integers
(Canonne, Kamath & Steinke 2020, "The Discrete Gaussian for Differential Privacy",
Definition 1); it is what ``transforms.randomness.samplers.discrete_gaussian`` draws. Its tails are
not Phi's, so privacy is computed here from sums over its pmf (design/mechanisms.md,
"Exactness of accounting").

Shifts. Adding one user moves a counts by +1 each (the a_+ rows of paper 004, Lemma 5.3).
For P = N_Z(1, s^2)^a against Q = N_Z(0, s^2)^a the privacy loss at output x is
sum_i (2 x_i - 1) / (2 s^2), linear in every coordinate, so under P it equals
L = (2 S + a) / (2 sigma^2) with S the sum of a i.i.d. N_Z(0, sigma^2), and

    delta(eps) = H_{e^eps}(P || Q) = E_P[(1 - e^(eps - L))_+]
               = sum_u P[S = u] (1 - exp(eps - (2u + a) / (2 sigma^2)))_+ .    (1)

The pair is symmetric (x -> 1 - x), so (1) is delta in both directions, for every real eps.

* ``method="exact"`` evaluates (1) with the pmf of S from direct convolutions of the pmf
  (sums of positive terms; the mass cut off at 38.6 sigma per coordinate, < 1e-300, is
  added to delta).
* ``method="bound"`` uses Lemma A below: P[S = u] <= e^(T_a) P[Y_a = u] for Y_a ~
  N_Z(0, a sigma^2), so delta <= e^(T_a) D_a(eps) where D_a is (1) with Y_a in place of S,
  i.e. D_a = P[Y_a >= u0] - e^eps P[Y_a >= u0 + a], u0 = floor(eps sigma^2 - a/2) + 1.
  D_a is summed exactly when sigma sqrt(a) < 50 and otherwise bounded from above with the
  Euler-Maclaurin formula and its remainder (Lemma B), which is rigorous and within a
  relative 1e-7 of the sum for tails up to 12 standard deviations.

Lemma A (our proof; the same fact gives the tau of CKS20's multivariate theorem). Let S_k be the sum of k i.i.d.
N_Z(0, sigma^2) and Y_k ~ N_Z(0, k sigma^2). Completing the square,
P[Y_{k-1} + X = m] = exp(-m^2/(2 k sigma^2)) theta(c_m) / (Z_{k-1} Z_1) with
theta(c) = sum_x exp(-(x - c)^2 / (2 st^2)), st^2 = sigma^2 (k-1)/k. Poisson summation
gives theta(c) = sqrt(2 pi) st (1 + 2 sum_j e^(-2 pi^2 st^2 j^2) cos(2 pi j c))
<= sqrt(2 pi) st (1 + 2 eta_k), eta_k = sum_{j>=1} exp(-2 pi^2 sigma^2 j^2 (k-1)/k), and
Z_v = sqrt(2 pi v) (1 + 2 eta'_v) with eta'_v = sum_j exp(-2 pi^2 v j^2). Hence
P[Y_{k-1} + X = m] / P[Y_k = m] <= (1 + 2 eta_k)(1 + 2 eta'_k) / ((1 + 2 eta'_{k-1})(1 + 2 eta'_1)),
and by induction (P[S_k = m] = sum_x P[S_{k-1} = x] P[X = m - x]) the ratio
P[S_a = m] / P[Y_a = m] is at most exp(T_a) with
T_a = sum_{k=2..a} log(1 + 2 eta_k) + log(1 + 2 eta'_a) - a log(1 + 2 eta'_1)
    <= sum_{k=2..a} log(1 + 2 eta_k)                       (eta'_a <= eta'_1).
For sigma >= 1.5, T_a <= 1e-9 + a 1e-19: the bound is exact to float precision.

Lemma B (Euler-Maclaurin, p = 5). For f(x) = exp(-x^2/(2 s^2)) and integer t,
sum_{x >= t} f(x) = int_t^inf f + f(t)/2 - f'(t)/12 + f'''(t)/720 + R with
|R| <= 2 zeta(5) / (2 pi)^5 int_t^inf |f^(5)|, and int_t^inf |f^(5)| <= |f''''(t)| +
2 sum_{roots r of He_5, r > t/s} |f''''(r s)| (f^(n)(x) = (-1/s)^n He_n(x/s) f(x)).
"""
import functools
import math

import numpy as np
from thresher.accounting import fixed_order
from thresher.accounting._lazy import special

# Terms of exp(-x^2/(2 sigma^2)) more than 10 sigma past the start of a sum are below
# e^-50 ~ 2e-22 of the first one: for relative quantities (normalising constants, log
# tails) summing to there is exact in double precision.
_SPAN_SIGMAS = 10.0
# Explicit pmfs (for convolutions and exact deltas) run to 38.6 sigma, where
# exp(-x^2/(2 sigma^2)) underflows: the mass they leave out is below 1e-300.
_PMF_SIGMAS = 38.6
# Normalising constants are summed up to this sigma; above it Poisson summation
# Z = sqrt(2 pi) sigma (1 + 2 sum_j exp(-2 pi^2 sigma^2 j^2)) (an identity) is used.
_SUM_LIMIT = 1e4
# Below this standard deviation of Y_a, D_a is summed exactly; above, Lemma B.
_EXACT_SUM_SD = 50.0
# Above this T_a (and when the convolution is affordable) "auto" convolves exactly.
_LOOSE_T = 1e-9
_CONVOLUTION_BUDGET = 4e7
# Cost bound: no explicit sum or pmf here materialises more than this many terms (O(sigma)
# arrays: ~10 sigma for tails, ~77 sigma for a pmf); larger requests raise ValueError
# (pipelines.common.limits keeps specs well inside it: sigma <= 1e5).
MAX_TERMS = 50_000_000
_ZETA5 = 1.0369277551433699
_EM_C5 = 2.0 * _ZETA5 / (2.0 * math.pi) ** 5
_HE5_ROOTS = (math.sqrt(5.0 - math.sqrt(10.0)), math.sqrt(5.0 + math.sqrt(10.0)))


def _check_sigma(sigma):
    sigma = float(sigma)
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be > 0 and finite, got {sigma}")
    return sigma


def _check_terms(terms, sigma):
    if terms > MAX_TERMS:
        raise ValueError(f"sigma={sigma:.6g} needs sums of {terms:.3g} terms, more than the "
                         f"cost bound of {MAX_TERMS:.3g} (use sigma <= ~1e6)")


def _poisson_log_normalizer(sd):
    """log Z for scale sd by Poisson summation (exact identity; array sd)."""
    sd = np.asarray(sd, dtype=np.float64)
    out = 0.5 * math.log(2.0 * math.pi) + fixed_order.log(sd)
    small = sd < 10.0  # above, the correction exp(-2 pi^2 sd^2) < 1e-800 underflows
    if np.any(small):
        s = np.atleast_1d(sd)[np.atleast_1d(small)]
        # terms j with 2 pi^2 sd^2 j^2 > 40 are below 4e-18 of the sum
        j_max = int(math.ceil(math.sqrt(40.0 / (2.0 * math.pi ** 2 * s.min() ** 2)))) + 1
        j = np.arange(1, j_max + 1, dtype=np.float64)
        corr = 2.0 * fixed_order.exp(-2.0 * math.pi ** 2 * s[:, None] ** 2 * j ** 2).sum(axis=1)
        if out.ndim == 0:
            return float(out + fixed_order.log1p(corr[0]))
        out[small] += fixed_order.log1p(corr)
    return out


@functools.lru_cache(maxsize=256)
def log_normalizer(sigma):
    """log Z(sigma), Z(sigma) = sum over integers x of exp(-x^2 / (2 sigma^2)).

    Summed term by term for sigma <= 1e4 (terms past 10 sigma are below 2e-22 of the
    first); above, by the Poisson summation identity (tests check both agree)."""
    sigma = _check_sigma(sigma)
    if sigma > _SUM_LIMIT:
        return float(_poisson_log_normalizer(sigma))
    n = int(math.ceil(_SPAN_SIGMAS * sigma)) + 2
    x = np.arange(1, n + 1, dtype=np.float64)
    return float(math.log1p(2.0 * fixed_order.exp(-x * x / (2.0 * sigma * sigma)).sum()))


def logpmf(x, sigma):
    """log P[X = x] for X ~ N_Z(0, sigma^2) (x integers, array or scalar)."""
    sigma = _check_sigma(sigma)
    x = np.asarray(x, dtype=np.float64)
    out = -x * x / (2.0 * sigma * sigma) - log_normalizer(sigma)
    return float(out) if out.ndim == 0 else out


def pmf(x, sigma):
    """P[X = x] for X ~ N_Z(0, sigma^2)."""
    return fixed_order.exp(logpmf(x, sigma))


def _log_upper_sum(t, sigma):
    """log sum_{x >= t} exp(-x^2/(2 sigma^2)) for one integer t >= 0, summed term by term
    in log space (so tails far below 1e-300 keep their digits)."""
    s2 = 2.0 * sigma * sigma
    # Terms k past the point where (2 t k + k^2) / (2 sigma^2) > 50 are below e^-50 of the
    # first and decay faster than geometrically: they do not change the float sum.
    k_max = int(math.ceil(-t + math.sqrt(t * t + 100.0 * sigma * sigma))) + 1
    _check_terms(k_max, sigma)
    k = np.arange(k_max + 1, dtype=np.float64)
    return -t * t / s2 + float(_logsumexp(-(2.0 * t * k + k * k) / s2))


def _logsumexp(a):
    """log(sum(exp(a))) of a finite 1-D float64 array, computed as
    ``scipy.special.logsumexp`` computes it (SciPy >= 1.15: the largest terms set apart,
    log1p of the others' shifted sum, plus log of their count and the maximum), so the
    value is the same to the last bit (tests/accounting/test_discrete_gaussian.py compares
    them) -- without importing scipy.special, which would cost ``thresher plan`` and
    ``thresher report`` of a gaussian release a third of their time for the release point
    in words (summary.users_at)."""
    a_max = np.max(a)
    top = a == a_max
    count = float(np.count_nonzero(top))
    shifted = np.sum(fixed_order.exp(np.where(top, -np.inf, a) - a_max))
    if shifted != 0:
        shifted = shifted / count
    return fixed_order.log1p(shifted) + fixed_order.log(count) + a_max


def log_sf(x, sigma):
    """log P[X >= x] for X ~ N_Z(0, sigma^2), by exact sums (x integers, array or scalar).

    For x >= 1 the upper tail is summed directly; for x <= 0, P[X >= x] = 1 - P[X >= 1 - x]
    by symmetry, computed with log1p."""
    sigma = _check_sigma(sigma)
    x_arr = np.asarray(x, dtype=np.float64)
    if np.any(x_arr != np.round(x_arr)):
        raise ValueError("x must be integers")
    log_z = log_normalizer(sigma)
    out = np.empty(x_arr.shape, dtype=np.float64)
    flat_x, flat_out = x_arr.reshape(-1), out.reshape(-1)
    cache = {}
    for i, xi in enumerate(flat_x):
        xi = int(xi)
        if xi not in cache:
            if xi >= 1:
                cache[xi] = _log_upper_sum(xi, sigma) - log_z
            else:
                cache[xi] = math.log1p(-math.exp(_log_upper_sum(1 - xi, sigma) - log_z))
        flat_out[i] = cache[xi]
    return float(out) if out.ndim == 0 else out


def sf(x, sigma):
    """P[X >= x] for X ~ N_Z(0, sigma^2) (the survival function including x)."""
    return fixed_order.exp(log_sf(x, sigma))


def log_cdf(x, sigma):
    """log P[X <= x]; P[X <= x] = P[X >= -x] by symmetry."""
    return log_sf(-np.asarray(x), sigma)


def cdf(x, sigma):
    """P[X <= x] for X ~ N_Z(0, sigma^2)."""
    return fixed_order.exp(log_cdf(x, sigma))


# ---------------------------------------------------------------------------------------
# The sum of a i.i.d. discrete Gaussians, exactly (direct convolution).


def sum_pmf(count, sigma):
    """Exact pmf of S = X_1 + ... + X_count, X_i i.i.d. N_Z(0, sigma^2), up to the cut.

    Returns (offset, p, cut_mass): p[i] = P[S = offset + i] for the coordinates limited to
    |X_i| <= ceil(38.6 sigma) + 1 (so p <= the true pmf pointwise) and cut_mass >= the
    mass this leaves out (below 1e-300 per coordinate). Direct convolutions of positive
    arrays keep every entry to a relative accuracy of ~len * 1e-16 (entries below
    ~1e-308 underflow and are dropped; their mass is inside cut_mass)."""
    count = int(count)
    if count < 1:
        raise ValueError(f"count must be >= 1, got {count}")
    return next(iter_sum_pmfs(sigma, [count]))[1:]


def iter_sum_pmfs(sigma, counts):
    """Yield (count, offset, p, cut_mass) of S_count for each of `counts` in increasing
    order, convolving one coordinate at a time (cost ~ 4000 sigma^2 max(count)^1.5)."""
    sigma = _check_sigma(sigma)
    base_offset, base, base_cut = _base_pmf(sigma)
    offset, p, a = base_offset, base, 1
    for target in sorted({int(c) for c in counts}):
        while a < target:
            # a direct sum of positive products: no cancellation (fixed order, no BLAS)
            offset, p = _trimmed(offset + base_offset, fixed_order.convolve(p, base))
            a += 1
        yield a, offset, p, min(1.0, a * base_cut + a * p.size * 1e-300)


def _trimmed(offset, p):
    nz = np.flatnonzero(p)
    return offset + int(nz[0]), p[nz[0]:nz[-1] + 1]


@functools.lru_cache(maxsize=64)
def _base_pmf(sigma):
    k = int(math.ceil(_PMF_SIGMAS * sigma)) + 1
    _check_terms(2 * k + 1, sigma)
    x = np.arange(-k, k + 1, dtype=np.float64)
    p = fixed_order.exp(-x * x / (2.0 * sigma * sigma) - log_normalizer(sigma))
    cut = 2.0 * math.exp(_log_upper_sum(k + 1, sigma) - log_normalizer(sigma))
    p.setflags(write=False)
    return -k, p, cut


def _sequential_cost(max_count, sigma):
    """Float operations of iter_sum_pmfs up to max_count (support ~ +-39 sigma sqrt(a),
    base pmf +-39 sigma)."""
    return 4000.0 * (sigma + 0.1) ** 2 * np.asarray(max_count, dtype=np.float64) ** 1.5


def _delta_from_pmf(offset, p, cut, count, sigma, epsilons):
    """Formula (1) over an explicit pmf of S, for several epsilons; cut mass added."""
    u = offset + np.arange(p.size, dtype=np.float64)
    loss = (2.0 * u + count) / (2.0 * sigma * sigma)
    out = np.empty(len(epsilons))
    for i, e in enumerate(epsilons):
        start = int(np.searchsorted(loss, e, side="right"))
        tail = p[start:] * -np.expm1(e - loss[start:])
        out[i] = min(1.0, float(tail.sum()) + cut)
    return out


# ---------------------------------------------------------------------------------------
# Lemmas A and B: an upper bound through one discrete Gaussian of variance a sigma^2.


def sum_ratio_bound(count, sigma):
    """T_a of Lemma A: log(P[S_a = m] / P[Y_a = m]) <= T_a for all m (array over count)."""
    sigma = _check_sigma(sigma)
    counts = np.asarray(count, dtype=np.int64)
    a_max = int(counts.max()) if counts.size else 1
    if a_max <= 1:
        out = np.zeros(counts.shape)
        return float(out) if out.ndim == 0 else out
    if math.pi ** 2 * sigma * sigma > 800.0:
        # every eta_k <= exp(-pi^2 sigma^2) underflows: T_a = 0 exactly in floats
        out = np.zeros(counts.shape)
        return float(out) if out.ndim == 0 else out
    if sigma < 0.2:
        # eta_k > 0.3 here: the bound is useless (and its series long); callers then get
        # e^inf D = 1 from "bound", and "auto" convolves exactly where affordable.
        out = np.where(counts <= 1, 0.0, np.inf)
        return float(out) if out.ndim == 0 else out
    k = np.arange(2, a_max + 1, dtype=np.float64)
    j_max = max(1, int(math.ceil(math.sqrt(80.0 / (math.pi ** 2 * sigma * sigma)))) + 1)
    eta = np.zeros(k.size)
    for j in range(1, j_max + 1):  # few terms; a loop keeps memory at O(a)
        eta += fixed_order.exp(-2.0 * math.pi ** 2 * sigma * sigma * j * j * (k - 1.0) / k)
    cumulative = np.concatenate(([0.0, 0.0], np.cumsum(fixed_order.log1p(2.0 * eta))))
    out = cumulative[np.clip(counts, 1, a_max)]
    return float(out) if out.ndim == 0 else out


def _em_tail_bound(t, sd, log_z, sign):
    """Lemma B: bound on P[Y >= t] = sum_{x >= t} exp(-x^2/(2 sd^2)) / Z for t >= 0; the
    upper bound where sign = +1, the lower bound where sign = -1 (arrays)."""
    inv = 1.0 / sd
    y = t * inv
    y2 = y * y
    main = special.erfcx(y * math.sqrt(0.5))
    main *= sd * math.sqrt(math.pi / 2.0)
    # Euler-Maclaurin corrections f/2 - f^(1)/12 + f^(3)/720, divided by f(t):
    main += 0.5 + y * inv * (1.0 / 12.0 - (y2 - 3.0) * (inv * inv / 720.0))
    variation = np.abs(y2 * (y2 - 6.0) + 3.0)  # |He_4(y)|
    for r in _HE5_ROOTS:
        below = np.flatnonzero(y < r)
        if below.size:
            he4_r = abs(r ** 4 - 6.0 * r * r + 3.0)
            variation[below] += 2.0 * he4_r * fixed_order.exp(-(r * r - y2[below]) / 2.0)
    variation *= sign * _EM_C5 * inv ** 4
    main += variation
    np.maximum(main, 0.0, out=main)
    y2 *= -0.5
    y2 -= log_z
    return fixed_order.exp(y2, out=y2) * main


def _sf_bound(t, sd, log_z, upper):
    """Bound on P[Y >= t], Y ~ N_Z(0, sd^2), elementwise (t integers): the upper bound
    if `upper` (a bool, or a bool array), else the lower bound. Uses
    P[Y >= t] = 1 - P[Y >= 1 - t] for t <= 0."""
    t = np.asarray(t, dtype=np.float64)
    pos = t >= 1
    tp = np.where(pos, t, 1.0 - t)  # >= 1
    sign = np.where(pos == upper, 1.0, -1.0)  # an upper bound on sf needs an upper tail where t >= 1
    tail = np.minimum(_em_tail_bound(tp, sd, log_z, sign), 1.0)
    return np.where(pos, tail, 1.0 - tail)


def _single_delta_exact(sd, count, epsilons, sigma):
    """D_a(eps) summed exactly: formula (1) with Y ~ N_Z(0, sd^2) in place of S."""
    k = int(math.ceil(_PMF_SIGMAS * sd)) + 1
    u = np.arange(-k, k + 1, dtype=np.float64)
    log_z = log_normalizer(sd)
    p = fixed_order.exp(-u * u / (2.0 * sd * sd) - log_z)
    cut = 2.0 * math.exp(_log_upper_sum(k + 1, sd) - log_z)
    return _delta_from_pmf(-k, p, cut, count, sigma, epsilons)


def _bound_delta(eps, counts, sigma, t_bound):
    """e^(T_a) D_a(eps), vectorised over (eps, count) pairs."""
    sd = sigma * np.sqrt(counts.astype(np.float64))
    out = np.empty(eps.shape)
    small = sd < _EXACT_SUM_SD
    for a in np.unique(counts[small]):
        sel = np.flatnonzero(small & (counts == a))
        out[sel] = _single_delta_exact(sigma * math.sqrt(a), int(a), eps[sel], sigma)
    big = ~small
    if np.any(big):
        e, a, s = eps[big], counts[big].astype(np.float64), sd[big]
        u0 = np.floor(e * sigma * sigma - a / 2.0) + 1.0
        log_z = _poisson_log_normalizer(s)
        out[big] = (_sf_bound(u0, s, log_z, True)
                    - fixed_order.exp(e) * _sf_bound(u0 + a, s, log_z, False))
    with np.errstate(invalid="ignore", over="ignore"):
        bounded = fixed_order.exp(t_bound) * out
    return np.where(np.isfinite(t_bound), np.clip(bounded, 0.0, 1.0), 1.0)


# ---------------------------------------------------------------------------------------
# Public: delta of a shifts by one.


def composed_shift_delta(epsilon, sigma, count=1, *, method="auto"):
    """delta(eps) of `count` independent N_Z(0, sigma^2) coordinates each shifted by 1.

    Equals H_{e^eps}(N_Z(1, sigma^2)^a || N_Z(0, sigma^2)^a) in either direction, for any
    real eps (negative included, as paper 004's eps_3 needs). Broadcasts over epsilon and
    count (integers >= 1).

    method: "exact" sums formula (1) over the convolved pmf of S (cost ~ 4000 sigma^2
    count^1.5); "bound" returns e^(T_a) D_a (Lemmas A and B: an upper bound within a factor
    e^(T_a) <= 1 + 1e-9 of the exact value once sigma >= 1.5); "auto" is exact for
    count = 1 (sigma <= 1e4), and for larger counts whenever T_a > 1e-9 and the
    convolution is affordable, else the bound.
    Returns delta in [0, 1] (array, or float for scalar arguments).
    """
    sigma = _check_sigma(sigma)
    if method not in ("auto", "exact", "bound"):
        raise ValueError(f"method must be 'auto', 'exact' or 'bound', got {method!r}")
    eps_arr, count_arr = np.broadcast_arrays(np.asarray(epsilon, dtype=np.float64),
                                             np.asarray(count))
    if np.any(np.isnan(eps_arr)):
        raise ValueError("epsilon must be a number")
    if np.any(count_arr != np.round(count_arr)) or np.any(count_arr < 1):
        raise ValueError(f"count must be integers >= 1, got {count}")
    out = np.empty(eps_arr.shape, dtype=np.float64)
    flat_e, flat_out = eps_arr.reshape(-1), out.reshape(-1)
    flat_a = count_arr.reshape(-1).astype(np.int64)
    t_bound = np.atleast_1d(sum_ratio_bound(flat_a, sigma))
    if method == "exact":
        use_exact = np.ones(flat_a.size, dtype=bool)
    elif method == "bound":
        use_exact = np.zeros(flat_a.size, dtype=bool)
    else:
        use_exact = (flat_a == 1) & (sigma <= _SUM_LIMIT)
        loose = np.flatnonzero(t_bound > _LOOSE_T)
        use_exact[loose] |= _sequential_cost(flat_a[loose], sigma) <= _CONVOLUTION_BUDGET
    exact = np.flatnonzero(use_exact)
    if exact.size:
        unique_a, inverse = np.unique(flat_a[exact], return_inverse=True)
        for i, (a, offset, p, cut) in enumerate(iter_sum_pmfs(sigma, unique_a)):
            sel = exact[inverse == i]
            flat_out[sel] = _delta_from_pmf(offset, p, cut, a, sigma, flat_e[sel])
    bound = np.flatnonzero(~use_exact)
    if bound.size:
        flat_out[bound] = _bound_delta(flat_e[bound], flat_a[bound], sigma, t_bound[bound])
    out = np.clip(out, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def shift_delta(epsilon, sigma):
    """Exact delta(eps) of one N_Z(0, sigma^2) coordinate shifted by 1 (count = 1)."""
    return composed_shift_delta(epsilon, sigma, 1, method="exact")

"""Exact (epsilon, delta) of the Gaussian sparse histogram mechanism, and its calibration.

Paper 004 (Karrer, Kifer, Wilkins, Zhang, "Exact privacy analysis of the Gaussian
sparse histogram mechanism", /work/shared/papers/004_*.txt), Algorithm 1: a key whose
user count c is below the pre-threshold tau is dropped; otherwise c + v is released when
c + v >= tau* (``threshold``), v ~ N(0, sigma^2) or, as thresher draws it, the discrete
Gaussian N_Z(0, sigma^2). A user is in at most C_u keys, once each (l0/l_inf model).

With beta = P[tau + v < tau*] (the probability that a key at the pre-threshold stays
hidden), a_= + a_+ = C_u, and delta_+(a, e) the hockey-stick divergence of a
coordinates shifted by one (Lemma 5.3):

    delta = max( 1 - beta^C_u,                                          (Lemma 5.1)
                 max_{a_=} 1 - beta^a_= + beta^a_= delta_+(a_+, eps - a_= ln beta),
                 max_{a_=} delta_+(a_+, eps + a_= ln beta) )            (Thm 5.4)

over a_= = 0..C_u-1. "add_deltas" is Thm 4.1 / Cor. 5.4.1: delta_+(C_u, eps) + 1 -
beta^C_u; "fdp" is Thm 7.1: max over a_= = 0..C_u of 1 - beta^a_= + beta^a_=
delta_+(a_+, eps). Report the exact one; the others are comparisons.

The proof of Thm 5.4 uses only that rows are independent, that a row at the
pre-threshold is released by one neighbour and never by the other (probability
1 - beta), and (Lemma 5.3) that thresholding the a_+ shifted rows is post-processing,
which cannot raise a hockey-stick divergence H_gamma for any gamma = e^e > 0, negative e
included. So it holds verbatim for discrete Gaussian noise with

* beta = P[v <= ceil(tau* - tau) - 1], an exact sum over the discrete pmf, and
* delta_+(a, e) the exact divergence of a discrete Gaussian shifts by one
  (``accounting.discrete_gaussian.composed_shift_delta``), not the Gaussian
  delta(sqrt(a)/sigma, e); the reduction a_+ + a_= <= C_u -> = C_u also holds, since
  delta_+ grows with a (marginalising coordinates is post-processing).

Numerics (design/mechanisms.md): 1 - beta^a is -expm1(a log beta) with log beta from a
log-CDF; everything is vectorised over a_=.
"""
import dataclasses
import math

import numpy as np
from thresher.accounting._lazy import special

from thresher.accounting import discrete_gaussian, gaussian
from thresher.accounting.search import smallest_integer, smallest_real
from thresher.accounting.validation import check_calibration_arguments, check_threshold_parameters

NOISES = ("gaussian", "discrete_gaussian")
METHODS = ("exact", "add_deltas", "fdp")
# Searches over sigma start here (in users): noise this small leaves delta at 1.
_SIGMA_FLOOR = 1e-3


# ---------------------------------------------------------------------------------------
# The accounting, generic in the noise (reused by accounting.laplace_threshold).


def sparse_histogram_delta(epsilon, log_beta, max_keys_per_user, shift_delta, method="exact"):
    """delta of a thresholded per-key release where each user is in <= C_u keys.

    Args:
      epsilon: >= 0.
      log_beta: log P[a key at the pre-threshold is not released] (<= 0).
      max_keys_per_user: C_u >= 1.
      shift_delta: f(a, e) -> hockey-stick divergence of a keys each shifted by the user,
        vectorised over integer arrays a >= 1 and real arrays e (any sign).
      method: "exact" (paper 004 Thm 5.4), "add_deltas" (Thm 4.1), "fdp" (Thm 7.1).
    Returns:
      delta in [0, 1].
    """
    c_u = int(max_keys_per_user)
    log_beta = min(float(log_beta), 0.0)
    delta_infinite = -math.expm1(c_u * log_beta)
    if method == "add_deltas":
        gauss = float(np.asarray(shift_delta(np.array([c_u]), np.array([epsilon])))[0])
        return min(1.0, gauss + delta_infinite)
    if method == "fdp":
        a_eq = np.arange(c_u + 1, dtype=np.float64)
        a_plus = c_u - a_eq
        lb = a_eq * log_beta
        shifted = np.zeros(a_eq.size)
        has = a_plus > 0
        shifted[has] = shift_delta(a_plus[has].astype(np.int64),
                                   np.full(int(has.sum()), float(epsilon)))
        return float(np.clip(np.max(-np.expm1(lb) + np.exp(lb) * shifted), 0.0, 1.0))
    if method != "exact":
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    return float(exact_delta_over_log_betas(epsilon, np.array([log_beta]), c_u, shift_delta)[0])


def exact_delta_over_log_betas(epsilon, log_betas, max_keys_per_user, shift_delta):
    """Thm 5.4's delta (the "exact" method of :func:`sparse_histogram_delta`) at each of
    several values of log beta at once (one shift_delta call for all of them): what a
    mixture over thresholds needs (``accounting.correlated_gshm``). Returns an array."""
    c_u = int(max_keys_per_user)
    log_betas = np.minimum(np.asarray(log_betas, dtype=np.float64), 0.0)
    a_eq = np.arange(c_u, dtype=np.float64)
    a_plus = (c_u - a_eq).astype(np.int64)
    lb = log_betas[:, None] * a_eq[None, :]                    # (betas, a_=)
    count = np.tile(a_plus, 2 * len(log_betas))
    both = np.asarray(shift_delta(count, np.concatenate([(epsilon - lb).ravel(),
                                                         (epsilon + lb).ravel()])))
    d2 = both[:lb.size].reshape(lb.shape)
    d3 = both[lb.size:].reshape(lb.shape)
    term2 = -np.expm1(lb) + np.exp(lb) * d2
    delta_infinite = -np.expm1(c_u * log_betas)
    worst = np.maximum(delta_infinite, np.maximum(term2.max(axis=1), d3.max(axis=1)))
    return np.clip(worst, 0.0, 1.0)


# ---------------------------------------------------------------------------------------
# GSHM with Gaussian or discrete Gaussian noise.


def check_release_arguments(epsilon, sigma, max_keys_per_user):
    """The arguments every sparse-histogram accounting takes (also weighted_gaussian's)."""
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if int(max_keys_per_user) != max_keys_per_user or max_keys_per_user < 1:
        raise ValueError(f"max_keys_per_user must be an integer >= 1, got {max_keys_per_user}")


def _check(epsilon, sigma, max_keys_per_user, noise, method, extra_mu, aggregates=()):
    check_release_arguments(epsilon, sigma, max_keys_per_user)
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not (math.isfinite(extra_mu) and extra_mu >= 0):
        raise ValueError(f"extra_mu must be >= 0, got {extra_mu}")
    if noise == "discrete_gaussian" and extra_mu != 0:
        raise ValueError("extra_mu (extra Gaussian aggregate columns) is supported with "
                         "noise='gaussian' only; use aggregates= for discrete noise")
    if aggregates and (noise != "discrete_gaussian" or extra_mu != 0):
        raise ValueError("aggregates (grid columns with discrete Gaussian noise) need "
                         "noise='discrete_gaussian' and extra_mu=0")


def log_beta(sigma, threshold_gap, noise="discrete_gaussian"):
    """log P[tau + v < tau*] for a key at the pre-threshold, gap = tau* - tau.

    Gaussian: log Phi(gap / sigma). Discrete Gaussian: log P[v <= ceil(gap) - 1], an exact
    sum (a key is released iff v >= tau* - tau, and v is an integer)."""
    if noise == "gaussian":
        return float(special.log_ndtr(threshold_gap / sigma))
    return float(discrete_gaussian.log_cdf(math.ceil(threshold_gap) - 1, sigma))


def _shift_delta_fn(sigma, noise, extra_mu, aggregates=()):
    if aggregates:
        # Extra aggregate columns with discrete Gaussian noise on fixed-point grids:
        # (D_j, ratio_j) -> sigma_j = ratio_j D_j sigma grid units (accounting.aggregates).
        from thresher.accounting import aggregates as agg
        columns = tuple((int(d), float(r) * int(d) * sigma) for d, r in aggregates)

        def joint(a, e):
            return agg.joint_shift_delta(e, sigma, a, columns)
        return joint
    if noise == "gaussian":
        per_row = math.sqrt(1.0 / (sigma * sigma) + extra_mu * extra_mu)

        def shift(a, e):
            return gaussian.delta_for_epsilon(np.sqrt(np.asarray(a, dtype=np.float64)) * per_row, e)
        return shift

    def shift(a, e):
        return discrete_gaussian.composed_shift_delta(e, sigma, a)
    return shift


def delta(epsilon, sigma, threshold_gap, max_keys_per_user, *, extra_mu=0.0,
          method="exact", noise="gaussian", aggregates=()):
    """delta(epsilon) of GSHM (paper 004) for noise scale sigma and gap tau* - tau.

    Args:
      epsilon: >= 0. sigma: noise standard deviation (in users), > 0.
      threshold_gap: tau* - tau (any real; with discrete noise ceil(gap) is what counts).
      max_keys_per_user: C_u >= 1.
      extra_mu: mu_o of paper 004 Eq. 5.1 for extra Gaussian aggregate columns
        (continuous noise only).
      method: "exact" (Thm 5.4), "add_deltas" (Thm 4.1), "fdp" (Thm 7.1).
      noise: "gaussian" (continuous) or "discrete_gaussian" (what thresher draws).
      aggregates: ((D_j, ratio_j), ...) extra columns of Alg. 1 with discrete Gaussian
        noise sigma_j = ratio_j D_j sigma on an integer grid where one user moves column j
        by at most D_j (discrete noise only; accounting.aggregates.joint_shift_delta,
        an upper bound on the exact delta_+).
    Returns:
      delta in [0, 1].
    """
    epsilon, sigma = float(epsilon), float(sigma)
    _check(epsilon, sigma, max_keys_per_user, noise, method, extra_mu, aggregates)
    lb = log_beta(sigma, float(threshold_gap), noise)
    return sparse_histogram_delta(epsilon, lb, int(max_keys_per_user),
                                  _shift_delta_fn(sigma, noise, extra_mu, aggregates), method)


def _delta_infinite(sigma, gap, c_u, noise):
    return -math.expm1(c_u * log_beta(sigma, gap, noise))


def min_threshold_gap(epsilon, delta_target, sigma, max_keys_per_user, *, extra_mu=0.0,
                      method="exact", noise="gaussian", rel_tol=1e-9, aggregates=()):
    """Smallest tau* - tau with delta(...) <= delta_target at this sigma.

    delta falls as the gap grows (beta grows: every term of Thm 5.4 falls), so this is a
    monotone search. Returns a float (to rel_tol; the value returned always qualifies)
    for Gaussian noise, an int for discrete Gaussian noise, or None when no gap works
    (the Gaussian part alone, delta_+(C_u, eps), exceeds the target: sigma too small).
    """
    epsilon, sigma = float(epsilon), float(sigma)
    _check(epsilon, sigma, max_keys_per_user, noise, method, extra_mu, aggregates)
    if not (0 < delta_target < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    c_u = int(max_keys_per_user)
    shift = _shift_delta_fn(sigma, noise, extra_mu, aggregates)
    limit = float(np.asarray(shift(np.array([c_u]), np.array([epsilon])))[0])
    if limit >= delta_target if method == "add_deltas" else limit > delta_target:
        return None

    def ok(gap):
        return sparse_histogram_delta(epsilon, log_beta(sigma, gap, noise), c_u, shift,
                                      method) <= delta_target

    # Lower bound: the first term alone, 1 - beta^C_u <= delta, i.e. beta >= (1-delta)^(1/C).
    one_minus_root = -math.expm1(math.log1p(-delta_target) / c_u)
    if noise == "gaussian":
        low = max(0.0, -sigma * float(special.ndtri(one_minus_root)))
        return smallest_real(ok, low, math.inf, rel_tol=rel_tol)
    low = smallest_integer(lambda k: _delta_infinite(sigma, k, c_u, noise) <= delta_target, 0)
    return smallest_integer(ok, low)


def min_sigma(epsilon, delta_target, threshold_gap, max_keys_per_user, *, extra_mu=0.0,
              method="exact", noise="gaussian", rel_tol=1e-9, grid=16, aggregates=()):
    """Smallest sigma with delta(...) <= delta_target at this gap tau* - tau, or None.

    At a fixed gap delta is not monotone in sigma: the Gaussian part falls as sigma grows
    while 1 - beta^C_u rises. The search therefore brackets sigma between sigma_low (the
    smallest sigma with delta_+(C_u, eps) <= delta, necessary) and sigma_high (the largest
    with 1 - beta^C_u <= delta, also necessary), scans a geometric grid of `grid` points
    for the first qualifying sigma, and bisects below it. The returned sigma always
    qualifies; it is the smallest if delta(sigma) crosses the target once below it
    (tests check this against a fine scan). With discrete noise delta_+ itself wobbles
    with sigma (lattice effects of up to ~1% for C_u = 1, eps = 2), so "smallest" holds
    up to that wobble; the privacy claim never relies on it (delta is recomputed at the
    returned parameters).
    """
    epsilon = float(epsilon)
    _check(epsilon, 1.0, max_keys_per_user, noise, method, extra_mu, aggregates)
    if not (0 < delta_target < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    gap = float(threshold_gap)
    c_u = int(max_keys_per_user)

    def gaussian_part(s):
        shift = _shift_delta_fn(s, noise, extra_mu, aggregates)
        return float(np.asarray(shift(np.array([c_u]), np.array([epsilon])))[0])

    def ok(s):
        return delta(epsilon, s, gap, c_u, extra_mu=extra_mu, method=method,
                     noise=noise, aggregates=aggregates) <= delta_target

    if extra_mu > 0 and gaussian.delta_for_epsilon(math.sqrt(c_u) * extra_mu, epsilon) > delta_target:
        return None
    sigma_low = smallest_real(lambda s: gaussian_part(s) <= delta_target, _SIGMA_FLOOR,
                              math.inf, rel_tol=rel_tol)
    if sigma_low is None:
        return None
    if ok(sigma_low):
        return sigma_low
    if _delta_infinite(sigma_low, gap, c_u, noise) > delta_target:
        return None
    sigma_high = smallest_real(
        lambda s: _delta_infinite(s, gap, c_u, noise) > delta_target, sigma_low, math.inf,
        rel_tol=rel_tol)
    if sigma_high is None:
        return None
    return first_qualifying(ok, sigma_low, sigma_high, grid=grid, rel_tol=rel_tol)


def first_qualifying(ok, low, high, *, grid=16, rel_tol=1e-9):
    """Smallest x in (low, high] with ok(x), for an ok that is false at low and may be
    true only on an interval: scan a geometric grid of `grid` points for the first
    qualifying one, then bisect (accounting.search.smallest_real) below it. None if no
    grid point qualifies. The value returned always satisfies ok."""
    previous = low
    for k in range(1, grid + 1):
        x = low * (high / low) ** (k / grid)
        if ok(x):
            return smallest_real(ok, previous, x, rel_tol=rel_tol)
        previous = x
    return None


# ---------------------------------------------------------------------------------------
# Calibration for the pipeline.


@dataclasses.dataclass(frozen=True)
class GshmParameters:
    """Calibrated GSHM: noise sigma, absolute noisy threshold tau* = pre_threshold + gap.

    delta is the exact delta (Thm 5.4, for `noise` as drawn) at `epsilon`."""

    sigma: float
    threshold: float
    pre_threshold: int
    noise: str
    delta: float
    epsilon: float
    method: str = "exact"

    def __post_init__(self):
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        check_threshold_parameters(pre_threshold=self.pre_threshold, threshold=self.threshold,
                                   delta=self.delta, epsilon=self.epsilon)
        if self.noise not in NOISES:
            raise ValueError(f"noise must be one of {NOISES}, got {self.noise!r}")
        if self.method not in METHODS:
            raise ValueError(f"method must be one of {METHODS}, got {self.method!r}")

    @property
    def threshold_gap(self):
        return self.threshold - self.pre_threshold


def default_sigma(epsilon, delta_target, max_keys_per_user, *, noise="discrete_gaussian",
                  aggregates=()):
    """The default sigma: the smallest at which some threshold meets (epsilon, delta).

    That is the smallest sigma with delta_+(C_u, eps) <= delta, the Gaussian mechanism's
    own sigma for all C_u keys. Paper 004, Section 6.1 (Fig. 1a): under exact accounting
    the minimal tau* grows with sigma, so the smallest sigma also gives the smallest
    threshold; no trade-off is left to choose (docs/accounting.md shows the curve).
    """
    c_u = int(max_keys_per_user)

    def fits(s):
        shift = _shift_delta_fn(s, noise, 0.0, aggregates)
        return float(np.asarray(shift(np.array([c_u]), np.array([float(epsilon)])))[0]) <= delta_target

    return smallest_real(fits, _SIGMA_FLOOR, math.inf, rel_tol=1e-9)


def calibrate(epsilon, delta_target, max_keys_per_user, *, pre_threshold=1, sigma=None,
              threshold=None, noise="discrete_gaussian", aggregates=()):
    """GSHM parameters meeting (epsilon, delta_target) exactly (paper 004 Thm 5.4).

    Given neither sigma nor threshold: sigma = default_sigma (smallest workable) and the
    smallest threshold at it. Given one, the other is calibrated (smallest qualifying).
    Given both, they are checked. Raises ValueError naming what would meet the budget.
    Thresholds are integers for discrete Gaussian noise. ``aggregates``: extra grid
    columns ((D_j, ratio_j), ...) calibrated jointly (see :func:`delta`).
    """
    epsilon = float(epsilon)
    check_calibration_arguments(epsilon=epsilon, delta_target=delta_target,
                                max_keys_per_user=max_keys_per_user, pre_threshold=pre_threshold)
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if sigma is not None and not (math.isfinite(sigma) and sigma > 0):
        raise ValueError(f"sigma must be > 0, got {sigma}")
    if threshold is not None and not (math.isfinite(threshold) and threshold >= pre_threshold):
        raise ValueError(f"threshold must be >= pre_threshold ({pre_threshold}), got {threshold}")
    c_u, tau = int(max_keys_per_user), int(pre_threshold)
    budget = f"(epsilon={epsilon:g}, delta={delta_target:g}, max_keys_per_user={c_u})"
    aggregates = tuple(aggregates)
    sigma_floor = default_sigma(epsilon, delta_target, c_u, noise=noise, aggregates=aggregates)

    def gap_at(s):
        return min_threshold_gap(epsilon, delta_target, s, c_u, noise=noise,
                                 aggregates=aggregates)

    if sigma is None and threshold is None:
        sigma = sigma_floor
        gap = gap_at(sigma) if sigma is not None else None
        if gap is None:
            raise ValueError(f"no sigma and threshold meet {budget}: the noise needed is "
                             "beyond what can be represented; use a larger epsilon or delta")
    elif sigma_floor is None:
        raise ValueError(f"no sigma meets {budget}: the noise needed is beyond what can be "
                         "represented; use a larger epsilon or delta")
    elif threshold is None:
        gap = gap_at(float(sigma))
        if gap is None:
            raise ValueError(f"sigma={sigma:g} is too small for {budget}: no threshold "
                             f"works below sigma={sigma_floor:.6g}")
    elif sigma is None:
        gap = threshold - tau
        sigma = min_sigma(epsilon, delta_target, gap, c_u, noise=noise, aggregates=aggregates)
        if sigma is None:
            need = tau + gap_at(sigma_floor)
            raise ValueError(f"threshold={threshold:g} is too low for {budget} with "
                             f"pre_threshold={tau}: no sigma works; the smallest threshold "
                             f"(at sigma={sigma_floor:.6g}) is {need:g}")
    else:
        gap = threshold - tau
        achieved = delta(epsilon, sigma, gap, c_u, noise=noise, aggregates=aggregates)
        if achieved > delta_target:
            hints = []
            g = gap_at(float(sigma))
            if g is not None:
                hints.append(f"threshold >= {tau + g:g} at sigma={sigma:g}")
            s = min_sigma(epsilon, delta_target, gap, c_u, noise=noise, aggregates=aggregates)
            if s is not None:
                hints.append(f"sigma >= {s:.6g} at threshold={threshold:g}")
            hints.append(f"sigma={sigma_floor:.6g} with threshold {tau + gap_at(sigma_floor):g}")
            raise ValueError(f"sigma={sigma:g} with threshold={threshold:g} gives delta="
                             f"{achieved:.3g} > {delta_target:g} for {budget}; use "
                             + "; or ".join(hints))
    if noise == "discrete_gaussian":
        gap = int(math.ceil(gap))
    achieved = delta(epsilon, sigma, gap, c_u, noise=noise, aggregates=aggregates)
    return GshmParameters(sigma=float(sigma), threshold=tau + gap, pre_threshold=tau,
                          noise=noise, delta=achieved, epsilon=epsilon)

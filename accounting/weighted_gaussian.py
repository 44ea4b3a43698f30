"""Weighted Gaussian partition selection on a fixed-point grid, and its exact accounting.

Gopi, Gulhane, Kulkarni, Shen, Shokouhi, Yekhanin, "Differentially Private Set Union",
ICML 2020, Algorithm "Weighted Gaussian" and Theorem 5.1: every user keeps at most
Delta0 of their keys (W_u, |W_u| = t), adds 1/sqrt(t) to each key of W_u, Gaussian noise
is added to every key's total weight and the keys whose noisy weight reaches rho are
released. A user's weight vector has l2 norm 1 whatever t is.

What thresher draws (integer noise everywhere, as ``accounting.gshm``): the weights live
on the grid (1/S) Z with S = WEIGHT_SCALE = 2**WEIGHT_BITS; a user with t kept keys adds
the integer q_t = floor(S / sqrt(t)) = isqrt(floor(S^2 / t)) to each of them, so
t q_t^2 <= S^2 (l2 norm <= S, exactly, in integers), and every key's integer total
H(k) = sum over its users of q_t gets discrete Gaussian noise N_Z(0, (sigma S)^2);
the key is released when H(k) + Z >= T (T an integer, the threshold in grid units;
threshold = T / S in user-weight units).

Privacy (docs/partition_selection.md, "weighted_gaussian", with the proof). For a user u
with t kept keys, paper 004's proof of Thm 5.4 (Karrer, Kifer, Wilkins, Zhang) goes
through row by row: keys of W_u that only u holds (a_= of them) are released with u with
probability 1 - beta_t, beta_t = P[q_t + Z < T], and never without; keys of W_u that
other users hold too (a_+ = t - a_=) move by exactly q_t, and their release is a
post-processing of N_Z(q_t, s^2)^a_+ against N_Z(0, s^2)^a_+ (s = sigma S). So

    delta = max over t = 1..Delta0 of  max( 1 - beta_t^t,
              max_{a_=} 1 - beta_t^a_= + beta_t^a_= delta_q(t - a_=, eps - a_= ln beta_t),
              max_{a_=} delta_q(t - a_=, eps + a_= ln beta_t) )          a_= = 0..t-1,

with delta_q(a, e) = H_{e^e}(N_Z(q, s^2)^a || N_Z(0, s^2)^a) (``shift_delta``); the
inner maximum is ``accounting.gshm.sparse_histogram_delta`` with beta_t and delta_q.

delta_q. The privacy loss of a rows shifted by q is L = (2 q X + a q^2) / (2 s^2), X
the sum of the a noise draws, and delta_q(a, e) = sum_u P[X = u] (1 - e^(e - L(u)))_+.
Lemma A of ``accounting.discrete_gaussian`` bounds P[X = u] <= e^(T_a) P[Y = u] for
Y ~ N_Z(0, a s^2), and for Y the sum has the closed form (completing the square,
P[Y = u] e^(-L(u)) = P[Y = u + a q])

    D_q(a, e) = P[Y >= u0] - e^e P[Y >= u0 + a q],  u0 = floor((2 s^2 e - a q^2)/(2q)) + 1,

so delta_q <= e^(T_a) D_q. D_q is summed exactly for sd = s sqrt(a) < 50 and bounded
from above with Lemma B (Euler-Maclaurin, rigorous) otherwise; FLOAT_SLACK is added for
float rounding. beta_t is bounded from below (P[Z >= T - q_t] from above) the same way;
delta falls as every beta_t grows, so both bounds err on the safe side.
tests/accounting/test_weighted_gaussian.py checks delta_q against direct convolutions
and the whole delta against brute-force sums over every joint outcome of small releases.

The count column: the released keys' counts get a second, independent N_Z(0, sigma_c^2)
each. A user counts in at most C_c = min(Delta0, count_keys_per_user) of its kept keys
(a uniformly random C_c of them; all of them when count_keys_per_user is None), so for a
fixed released set a user moves at most C_c of those counts by 1: that stage is the
discrete Gaussian mechanism of ``discrete_gaussian.composed_shift_delta(eps_c, sigma_c,
C_c)`` and the two stages compose by (adaptive) basic composition.
"""
import dataclasses
import math

import numpy as np

from thresher.accounting import discrete_gaussian as dg
from thresher.accounting import gshm
from thresher.accounting.search import smallest_integer, smallest_real

WEIGHT_BITS = 10
WEIGHT_SCALE = 1 << WEIGHT_BITS
# Below this standard deviation of Y the tails are exact sums; above, Lemma B.
_EXACT_SD = 50.0
# Absolute allowance for float rounding in D_q (added to delta_q).
FLOAT_SLACK = 1e-14
DEFAULT_COUNT_FRACTION = 0.25
_SIGMA_FLOOR = 1e-3


def grid_weight(t, scale=WEIGHT_SCALE):
    """q_t = floor(scale / sqrt(t)) for integer t >= 1, exactly (integer arithmetic).

    ``t`` an int or an integer array; returns int64 of the same shape."""
    scale = int(scale)
    t_arr = np.asarray(t, dtype=np.int64)
    if np.any(t_arr < 1):
        raise ValueError("t must be >= 1")
    s2 = scale * scale
    q = np.floor(scale / np.sqrt(t_arr.astype(np.float64))).astype(np.int64)
    # float sqrt can be one off: fix up so that q^2 t <= S^2 < (q + 1)^2 t exactly
    q = np.where(q * q * t_arr > s2, q - 1, q)
    q = np.where((q + 1) * (q + 1) * t_arr <= s2, q + 1, q)
    return int(q) if q.ndim == 0 else q


def weight_table(max_keys_per_user, scale=WEIGHT_SCALE):
    """int64 array w with w[t] = q_t for t = 1..max_keys_per_user (w[0] = 0)."""
    t = np.arange(1, int(max_keys_per_user) + 1)
    return np.concatenate(([0], grid_weight(t, scale))).astype(np.int64)


# ---------------------------------------------------------------------------------------
# Tails and shifted-row divergences of the discrete Gaussian on the grid.


def sf_upper(x, sd):
    """Upper bound on P[Z >= x], Z ~ N_Z(0, sd^2), elementwise for integer x (exact sums
    below sd = 50, Lemma B above)."""
    x = np.asarray(x, dtype=np.float64)
    flat = np.atleast_1d(x).reshape(-1)
    if sd < _EXACT_SD:
        out = np.minimum(np.atleast_1d(dg.sf(flat, sd)) + FLOAT_SLACK, 1.0)
    else:
        log_z = dg._poisson_log_normalizer(sd)
        out = np.asarray(dg._sf_bound(flat, sd, log_z, True), dtype=np.float64)
    out = out.reshape(x.shape)
    return float(out) if out.ndim == 0 else out


def log_beta_lower(threshold, weight, sd):
    """Lower bound on log beta = log P[weight + Z < threshold] (integers): a key that
    only one user of weight ``weight`` holds stays hidden."""
    p = sf_upper(np.asarray(threshold) - np.asarray(weight), sd)
    with np.errstate(divide="ignore"):
        return np.log1p(-np.minimum(p, 1.0))


def _d_exact(sd, a, q, eps, s):
    """D_q(a, e) summed exactly over the pmf of Y ~ N_Z(0, sd^2), for an array eps."""
    k = int(math.ceil(dg._PMF_SIGMAS * sd)) + 1
    u = np.arange(-k, k + 1, dtype=np.float64)
    log_z = dg.log_normalizer(sd)
    p = np.exp(-u * u / (2.0 * sd * sd) - log_z)
    cut = 2.0 * math.exp(dg._log_upper_sum(k + 1, sd) - log_z)
    loss = (2.0 * q * u + a * q * q) / (2.0 * s * s)
    out = np.empty(len(eps))
    for i, e in enumerate(eps):
        start = int(np.searchsorted(loss, e, side="right"))
        out[i] = float((p[start:] * -np.expm1(e - loss[start:])).sum()) + cut
    return out


def shift_delta(epsilon, count, shift, sigma_grid):
    """Upper bound on delta_q(a, e): ``count`` = a rows each shifted by the integer
    ``shift`` = q under N_Z(0, sigma_grid^2) noise (either direction, any real e).
    Broadcasts over epsilon, count, shift. Returns an array in [0, 1] (float if scalar)."""
    s = float(sigma_grid)
    if not (math.isfinite(s) and s > 0):
        raise ValueError(f"sigma must be > 0, got {sigma_grid}")
    e, a, q = np.broadcast_arrays(np.asarray(epsilon, dtype=np.float64),
                                  np.asarray(count, dtype=np.int64),
                                  np.asarray(shift, dtype=np.int64))
    if np.any(a < 1) or np.any(q < 1):
        raise ValueError("count and shift must be integers >= 1")
    shape = e.shape
    e, a, q = e.reshape(-1), a.reshape(-1), q.reshape(-1)
    af, qf = a.astype(np.float64), q.astype(np.float64)
    sd = s * np.sqrt(af)
    out = np.empty(e.size)
    small = sd < _EXACT_SD
    if np.any(small):
        pairs = np.stack([a[small], q[small]], axis=1)
        uniq, inverse = np.unique(pairs, axis=0, return_inverse=True)
        idx_small = np.flatnonzero(small)
        for j, (aa, qq) in enumerate(uniq):
            sel = idx_small[inverse.reshape(-1) == j]
            out[sel] = _d_exact(s * math.sqrt(aa), int(aa), int(qq), e[sel], s)
    big = ~small
    if np.any(big):
        eb, ab, qb, sb = e[big], af[big], qf[big], sd[big]
        u0 = np.floor((2.0 * s * s * eb - ab * qb * qb) / (2.0 * qb)) + 1.0
        log_z = dg._poisson_log_normalizer(sb)
        out[big] = (dg._sf_bound(u0, sb, log_z, True)
                    - np.exp(eb) * dg._sf_bound(u0 + ab * qb, sb, log_z, False))
    t_bound = np.atleast_1d(dg.sum_ratio_bound(a, s))
    with np.errstate(over="ignore", invalid="ignore"):
        bounded = np.exp(t_bound) * (np.maximum(out, 0.0) + FLOAT_SLACK)
    out = np.where(np.isfinite(bounded), np.clip(bounded, 0.0, 1.0), 1.0).reshape(shape)
    return float(out) if out.ndim == 0 else out


# ---------------------------------------------------------------------------------------
# The selection's delta and its calibration.


def _check(epsilon, sigma, max_keys_per_user, scale):
    gshm.check_release_arguments(epsilon, sigma, max_keys_per_user)
    if int(scale) != scale or scale < 1 or (int(scale) & (int(scale) - 1)):
        raise ValueError(f"scale must be a power of two, got {scale}")


def gaussian_part(epsilon, sigma, max_keys_per_user, scale=WEIGHT_SCALE):
    """max over t <= Delta0 of delta_q_t(t, eps): every kept key of the user shifted (the
    delta no threshold can remove; the analogue of delta_+(C_u, eps) in paper 004)."""
    _check(float(epsilon), float(sigma), max_keys_per_user, scale)
    t = np.arange(1, int(max_keys_per_user) + 1)
    q = grid_weight(t, scale)
    return float(np.max(shift_delta(float(epsilon), t, q, float(sigma) * scale)))


def delta(epsilon, sigma, threshold_grid, max_keys_per_user, *, scale=WEIGHT_SCALE,
          method="exact"):
    """delta(epsilon) of the weighted Gaussian selection (module docstring).

    Args:
      epsilon: >= 0. sigma: noise in user-weight units (the grid noise is sigma * scale).
      threshold_grid: the integer threshold T in grid units.
      max_keys_per_user: Delta0. scale: S, a power of two.
      method: "exact" (paper 004 Thm 5.4, per t) or "add_deltas" (Thm 4.1 per t).
    Returns delta in [0, 1], the maximum over t = 1..Delta0.
    """
    epsilon, sigma = float(epsilon), float(sigma)
    _check(epsilon, sigma, max_keys_per_user, scale)
    if int(threshold_grid) != threshold_grid:
        raise ValueError(f"threshold_grid must be an integer, got {threshold_grid}")
    s = sigma * scale
    t_all = np.arange(1, int(max_keys_per_user) + 1)
    q_all = grid_weight(t_all, scale)
    log_betas = log_beta_lower(int(threshold_grid), q_all, s)
    worst = 0.0
    for t, q, lb in zip(t_all, q_all, log_betas):
        def shifted(a, e, q=int(q)):
            return shift_delta(e, a, q, s)
        worst = max(worst, gshm.sparse_histogram_delta(epsilon, float(lb), int(t), shifted,
                                                       method))
        if worst >= 1.0:
            break
    return float(min(worst, 1.0))


def default_sigma(epsilon, delta_target, max_keys_per_user, scale=WEIGHT_SCALE):
    """The smallest sigma (user-weight units) at which some threshold meets the budget:
    gaussian_part <= delta (as ``gshm.default_sigma``, paper 004 Sec. 6.1)."""
    return smallest_real(
        lambda s: gaussian_part(epsilon, s, max_keys_per_user, scale) <= delta_target,
        _SIGMA_FLOOR, math.inf, rel_tol=1e-7)


def min_threshold(epsilon, delta_target, sigma, max_keys_per_user, scale=WEIGHT_SCALE):
    """Smallest integer grid threshold T with delta <= delta_target at sigma, or None."""
    if gaussian_part(epsilon, sigma, max_keys_per_user, scale) > delta_target:
        return None
    c = int(max_keys_per_user)
    s = float(sigma) * scale
    q_min = grid_weight(c, scale)
    # necessary: the t = Delta0 term 1 - beta^Delta0 <= delta
    low = smallest_integer(
        lambda k: -math.expm1(c * float(log_beta_lower(k, q_min, s))) <= delta_target, 1)
    return smallest_integer(
        lambda k: delta(epsilon, sigma, k, c, scale=scale) <= delta_target, low)


@dataclasses.dataclass(frozen=True)
class WeightedGaussianParameters:
    """Calibrated weighted Gaussian selection plus the count column.

    sigma, threshold: user-weight units (grid noise sigma * scale, grid threshold
    threshold_grid = threshold * scale, an integer). count_sigma: the count's discrete
    Gaussian sigma (users). Each stage's (epsilon, delta target, delta achieved)."""

    sigma: float
    threshold_grid: int
    scale: int
    max_keys_per_user: int
    epsilon: float
    delta: float
    count_sigma: float
    count_epsilon: float
    count_delta: float
    count_keys_per_user: int = None    # C_c: counts a user moves (None: Delta0)

    def __post_init__(self):
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if int(self.threshold_grid) != self.threshold_grid or self.threshold_grid < 1:
            raise ValueError(f"threshold_grid must be an integer >= 1, got {self.threshold_grid}")
        if not (math.isfinite(self.count_sigma) and self.count_sigma > 0):
            raise ValueError(f"count_sigma must be > 0, got {self.count_sigma}")

    @property
    def threshold(self):
        return self.threshold_grid / self.scale

    @property
    def sigma_grid(self):
        return self.sigma * self.scale


def count_budget(epsilon, delta_target, count_fraction):
    """The count stage's (epsilon, delta) beside a selection stage of (epsilon, delta):
    the fraction f of the release's total goes to the count, i.e. f / (1 - f) times the
    selection's (``pipelines.kinds.weighted_gaussian.stage_budget`` spends exactly these)."""
    f = float(count_fraction)
    if not (0.0 < f < 1.0):
        raise ValueError(f"count_fraction must be in (0, 1), got {count_fraction}")
    ratio = f / (1.0 - f)
    return float(epsilon) * ratio, float(delta_target) * ratio


def count_sigma(epsilon, delta_target, max_keys_per_user):
    """Smallest count sigma: composed_shift_delta(eps, sigma, Delta0) <= delta (the
    discrete Gaussian mechanism on <= Delta0 counts moved by 1; gshm.default_sigma)."""
    return gshm.default_sigma(epsilon, delta_target, int(max_keys_per_user))


def count_bound(max_keys_per_user, count_keys_per_user=None):
    """C_c = min(Delta0, count_keys_per_user): how many counts one user moves (Delta0
    when count_keys_per_user is None)."""
    c = int(max_keys_per_user)
    return c if count_keys_per_user is None else min(c, int(count_keys_per_user))


def calibrate(epsilon, delta_target, max_keys_per_user, *, sigma=None, threshold=None,
              count_epsilon, count_delta, count_keys_per_user=None, scale=WEIGHT_SCALE):
    """Selection parameters meeting (epsilon, delta_target) and the count's sigma meeting
    (count_epsilon, count_delta) for counts of which a user moves at most
    ``count_bound(max_keys_per_user, count_keys_per_user)``. Given neither sigma nor
    threshold: the smallest sigma at which a threshold exists and the smallest threshold
    there; given one, the other; given both, checked. ``threshold`` is in user-weight units (rounded up to the grid).
    Raises ValueError("sigma: ..." / "threshold: ...") naming what would work."""
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not (0 < delta_target < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    c = int(max_keys_per_user)
    _check(epsilon, 1.0, c, scale)
    budget = f"(epsilon={epsilon:g}, delta={delta_target:g}, max_keys_per_user={c})"
    floor = default_sigma(epsilon, delta_target, c, scale)
    if floor is None:
        raise ValueError(f"sigma: no noise meets {budget}")
    if sigma is None and threshold is None:
        sigma = floor
        t_grid = min_threshold(epsilon, delta_target, sigma, c, scale)
        if t_grid is None:
            raise ValueError(f"sigma: no threshold meets {budget}")
    elif threshold is None:
        if sigma < floor:
            raise ValueError(f"sigma: {sigma:g} is too small for {budget}; it must be >= "
                             f"{floor:.6g}")
        t_grid = min_threshold(epsilon, delta_target, sigma, c, scale)
        if t_grid is None:
            raise ValueError(f"sigma: {sigma:g} is too small for {budget}")
    else:
        t_grid = int(math.ceil(float(threshold) * scale))
        if sigma is None:
            def ok(x):
                return delta(epsilon, x, t_grid, c, scale=scale) <= delta_target
            # delta is not monotone in sigma at a fixed threshold (as in gshm.min_sigma)
            high = smallest_real(lambda x: -math.expm1(c * float(log_beta_lower(
                t_grid, grid_weight(c, scale), x * scale))) > delta_target, floor, math.inf,
                rel_tol=1e-7)
            sigma = None if high is None else gshm.first_qualifying(ok, floor, high,
                                                                     rel_tol=1e-7)
            if sigma is None:
                need = min_threshold(epsilon, delta_target, floor, c, scale)
                raise ValueError(f"threshold: {threshold:g} is too low for {budget}: no "
                                 f"sigma works; the smallest threshold (at sigma={floor:.6g}) "
                                 f"is {need / scale:g}")
        elif delta(epsilon, sigma, t_grid, c, scale=scale) > delta_target:
            need = min_threshold(epsilon, delta_target, sigma, c, scale) if sigma >= floor \
                else None
            hint = (f"threshold >= {need / scale:g} at sigma={sigma:g}" if need is not None
                    else f"sigma >= {floor:.6g}")
            raise ValueError(f"threshold: {threshold:g} with sigma={sigma:g} does not meet "
                             f"{budget}; use {hint}")
    achieved = delta(epsilon, sigma, t_grid, c, scale=scale)
    if achieved > delta_target:      # never: every branch checked it
        raise ValueError(f"sigma: the calibrated parameters do not meet {budget}")
    c_count = count_bound(c, count_keys_per_user)
    if c_count < 1:
        raise ValueError(f"count_keys_per_user: must be >= 1, got {count_keys_per_user}")
    c_sigma = count_sigma(count_epsilon, count_delta, c_count)
    if c_sigma is None:
        raise ValueError(f"count_fraction: no count noise meets (epsilon={count_epsilon:g}, "
                         f"delta={count_delta:g})")
    c_delta = float(dg.composed_shift_delta(count_epsilon, c_sigma, c_count))
    return WeightedGaussianParameters(
        sigma=float(sigma), threshold_grid=int(t_grid), scale=int(scale),
        max_keys_per_user=c, epsilon=epsilon, delta=achieved, count_sigma=float(c_sigma),
        count_epsilon=float(count_epsilon), count_delta=c_delta,
        count_keys_per_user=c_count)


def gopi_threshold(epsilon, delta_target, max_keys_per_user):
    """Gopi et al. Thm 5.1 with continuous Gaussian noise (a comparison, not used for
    privacy): sigma from the analytic Gaussian mechanism at (epsilon, delta/2) and
    rho = max_{t <= Delta0} 1/sqrt(t) + sigma Phi^-1((1 - delta/2)^(1/t)).
    Returns (sigma, rho) in user-weight units."""
    from scipy import special
    from thresher.accounting import gaussian
    sigma = smallest_real(
        lambda s: gaussian.delta_for_epsilon(1.0 / s, epsilon) <= delta_target / 2.0,
        1e-3, math.inf, rel_tol=1e-9)
    t = np.arange(1, int(max_keys_per_user) + 1, dtype=np.float64)
    root = -np.expm1(np.log1p(-delta_target / 2.0) / t)      # 1 - (1 - delta/2)^(1/t)
    rho = np.max(1.0 / np.sqrt(t) - sigma * special.ndtri(root))
    return sigma, float(rho)

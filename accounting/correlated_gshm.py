"""Correlated discrete Gaussian noise for the counted path, and why it cannot lower GSHM's
threshold when the key space is open.

The mechanism (Lebeda & Retschmeier, "The Correlated Gaussian Sparse Histogram
Mechanism", FORC 2025, LIPIcs 329:23, arXiv 2412.10357, after Lebeda, "Better Gaussian
Mechanism using Correlated Noise", SOSA 2025): one shared component Z ~ N_Z(0, s^2) is
drawn for the whole release, every key with user count c >= tau (``pre_threshold``) gets
its own X ~ N_Z(0, sigma^2), and c + Z + X is released when it reaches tau*
(``threshold``). Only the abstract and the section titles of the paper could be read here
(docs/partition_selection.md, "Correlated noise"); everything below is proved in this
docstring for thresher's setting: add/remove one user, who is in at most C keys once
each, and no bound on how many keys the data holds.

**Theorem 1 (the delta reported).** With g = tau* - tau and delta_004(e, sigma, g', C) the
exact delta of paper 004's Thm 5.4 for independent discrete Gaussian noise
(``accounting.gshm.delta``, noise="discrete_gaussian"), the release is (e, delta)-DP with

    delta = sum_z P[Z = z] delta_004(e, sigma, g - z, C).                          (1)

*Proof.* Given Z = z the keys are independent; a key of count c is released iff
c + X >= tau* - z, with value c + X + z. That is GSHM with noise X, pre-threshold tau and
threshold tau* - z, followed by adding the constant z to every released value (a
bijection fixed by z). For any neighbours D, D' and gamma = e^e, the outputs are the
mixtures P = sum_z P[Z = z] P_z and Q = sum_z P[Z = z] Q_z with the same weights, and the
hockey-stick divergence H_gamma is an f-divergence, jointly convex:
H_gamma(P || Q) <= sum_z P[Z = z] H_gamma(P_z || Q_z) <= sum_z P[Z = z] delta_004(e, sigma,
g - z, C), in both directions. Paper 004's theorem holds for any real gap (the terms are
probabilities of the noise below an integer), so (1) needs no condition on g - z; terms
with g - z < 0 are bounded by 1 here, and the mass of |z| > K by 1 (``cut``). ∎

pre_threshold > 1 is covered as paper 004 covers it (the user moves a key from tau - 1,
dropped, to tau). Extra aggregate columns and public key domains are not analysed here.

**Proposition 2 (no lower threshold in an open key space).** Whatever the split
(sigma, s), (a) delta >= delta_+(C, e; sigma), the divergence of C independent N_Z(0,
sigma^2) shifted by one, and (b) delta >= P[Z + max_{j <= C} X_j >= g].
*Proof.* (b): D has no key of the user's, D' adds the user with C keys at count tau;
the event "some key released" has probability 0 under D and the right side under D'.
(a): D holds N keys with counts far above tau* (released with probability -> 1) and the
user adds one to C of them. From the N - C others an observer learns z exactly as
N -> infinity (the law of X is known; the empirical mean of released minus true counts
converges to z), and given z the C keys are C independent shifted N_Z(0, sigma^2): the
hockey-stick divergence of the pair tends to delta_+(C, e; sigma) (H_gamma is continuous
in total variation). ∎
So sigma must meet the independent mechanism's own Gaussian condition, and the C new keys
are released with the probability of Z + max X instead of max X: a larger tail wherever it
is below 1/4 (Anderson's inequality for C = 1; F^C concave in the tail for C > 1).
The shared component only adds noise. :func:`threshold_lower_bound` computes the smallest
threshold any split can have; it equals the independent mechanism's calibrated threshold
at every (C, delta) tabulated in docs/partition_selection.md. The paper's factor-1/2 gain
needs a public bound on the number of non-zero counts (its "sparsity bound"): then z cannot
be learned from arbitrarily many keys, and Lebeda's lifting applies to the <= k released
coordinates (:func:`bounded_support_threshold`, continuous noise, comparison only).

**Theorem 3 (approximate zCDP record).** For any integer K >= 0 the release is
delta0-approximately rho-zCDP (Bun & Steinke 2016, Def. 8.1) with

    rho    = C max(1 / (2 sigma^2), log(1 / beta(g - K))),
    delta0 = P[|Z| > K] + sum_{|z| <= K} P[Z = z] (1 - beta(g - z)^C),

beta(g') = P[X <= ceil(g') - 1]. *Proof.* Neighbours D (without the user) and D' (with
it): a new keys (count tau - 1 -> tau) and b shifted keys, a + b <= C. Events on the
coins: E' = {|Z| <= K, no new key released} for D', E = {|Z| <= K} for D; each has
probability >= 1 - delta0 (beta(g - z) falls as z grows). Given E', D' outputs only the
common keys. Reveal Z (post-processing cannot raise a Renyi divergence, so bounding the
pair (Z, output) suffices). Z's conditional laws: q'(z) ~ P[Z = z] beta(g - z)^a and
q(z) ~ P[Z = z] on |z| <= K, whose ratio lies in [beta(g - K)^a, beta(g - K)^-a]: both
Renyi divergences of q, q' are <= a log(1 / beta(g - K)) (D_alpha <= D_inf). Given z, the
common keys are independent; b of them are post-processings of N_Z(1, sigma^2) against
N_Z(0, sigma^2), Renyi divergence <= alpha b / (2 sigma^2) (Canonne, Kamath & Steinke
2020, Prop. 5). The chain rule for Renyi divergence adds the two; a constant c is
<= c alpha for alpha >= 1, so D_alpha <= alpha (b / (2 sigma^2) + a L), L = log(1 /
beta(g - K)), and with b <= C - a this is at most alpha C max(1 / (2 sigma^2), L). ∎
(:func:`correlated_privacy_record` picks K; at calibrated parameters L is far below
1 / (2 sigma^2), so rho is the independent part's C / (2 sigma^2).)
"""
import dataclasses
import functools
import math

import numpy as np
from thresher.accounting import fixed_order

from thresher.accounting import discrete_gaussian as dg
from thresher.accounting import gshm
from thresher.accounting.search import smallest_integer
from thresher.accounting.validation import check_calibration_arguments, check_threshold_parameters

NOISE = "correlated"
# The splits the calibration tries: s / sigma, and sigma / sigma_min (sigma_min: the
# smallest sigma at which any threshold works for independent noise, gshm.default_sigma).
SHARED_RATIOS = (0.125, 0.25, 0.5)
SIGMA_STEPS = (1.0, 1.03, 1.1)
# The mass of |Z| > K left out of the sum (1) and counted as delta 1: a fraction of the
# budget small enough to be invisible in the calibrated threshold.
CUT_FRACTION = 1e-6
# Planning limit: the mixture (1) evaluates Thm 5.4 (2C shift divergences) at ~16 s + 1
# gaps per split; above this C a calibration would take minutes.
MAX_KEYS = 1024
# Planning limit on the calibration's work (issue 42: epsilon = 0.001 planned for 12 min 46 s
# with no progress line). Per split the calibration evaluates Thm 5.4 at the ~19 sigma gaps
# the shared draw reaches (:func:`min_threshold_gap`, :class:`_Table`), each gap O(C) shift
# terms plus one O(sigma) pass over the pmf of S (discrete_gaussian._delta_from_pmf), so its
# work grows as sigma (sigma + WORK_PER_KEY C) at the smallest workable sigma (the Gaussian
# condition's, gshm.default_sigma; the splits are within 1.1x of it). Measured, CPU seconds
# at load ~12 on 2 cores: sigma 580, C 16: 1.3 s; sigma 962, C 4: 4.9 s; sigma 1338, C 4:
# 9.6 s; sigma 514, C 1024: 8.8 s (about 5.3e-6 s per unit of work). MAX_WORK keeps a
# calibration to ~5 s: a smallest sigma of ~1000 at small C, ~330 at C = 1024.
WORK_PER_KEY = 2.6
MAX_WORK = 1.0e6


def max_sigma(max_keys_per_user):
    """The largest smallest-workable sigma the calibration takes at C = max_keys_per_user:
    the root of sigma (sigma + WORK_PER_KEY C) = MAX_WORK (the planning limit above)."""
    b = WORK_PER_KEY * int(max_keys_per_user)
    return (math.sqrt(b * b + 4.0 * MAX_WORK) - b) / 2.0


def _shift(sigma):
    def shift(a, e):
        return dg.composed_shift_delta(e, sigma, a)
    return shift


@functools.lru_cache(maxsize=32)
def _upper_log_tail(sigma):
    """log P[X >= x] for x = 1 .. k (k = 38.6 sigma + 2; beyond, the tail is < 1e-300),
    X ~ N_Z(0, sigma^2): the pmf summed from the top in log space (sequential, so the
    same bits every run), each tail to a relative ~k 1e-16."""
    k = int(math.ceil(38.6 * sigma)) + 2
    x = np.arange(1, k + 1, dtype=np.float64)
    table = np.logaddexp.accumulate(dg.logpmf(x, sigma)[::-1])[::-1]
    table.setflags(write=False)
    return table


def _log_beta(sigma, gaps):
    """log P[X <= g - 1] for each integer gap g, from the upper tails of
    :func:`_upper_log_tail`: log1p(-P[X >= g]) for g >= 1 (digits kept when beta ~ 1),
    log P[X >= 1 - g] for g <= 0 (symmetry). A tail past the table (< 1e-300) counts as
    0 for g >= 1 and as e^-1e4 for g <= 0, which changes no term of Thm 5.4 in floats."""
    gaps = np.asarray(gaps, dtype=np.int64)
    table = _upper_log_tail(float(sigma))
    k = table.size

    def tail(x):            # log P[X >= x], x >= 1
        return np.where(x <= k, table[np.clip(x, 1, k) - 1], -1e4)
    with np.errstate(divide="ignore"):
        upper = np.log1p(-np.exp(tail(np.maximum(gaps, 1))))
    return np.where(gaps >= 1, upper, np.maximum(tail(np.maximum(1 - gaps, 1)), -1e4))


def _cut_radius(shared_sigma, cut):
    """The least K >= 0 with P[|Z| > K] <= cut, and that mass (exact tail sums)."""
    def tail(k):
        return 2.0 * float(dg.sf(k + 1, shared_sigma))
    k = smallest_integer(lambda r: tail(r) <= cut, 0)
    return int(k), tail(int(k))


class _Table:
    """delta_004(e, sigma, g', C) at integer gaps g', computed in batches and kept (a
    calibration asks for overlapping windows of gaps)."""

    def __init__(self, epsilon, sigma, max_keys_per_user):
        self.epsilon, self.sigma, self.c = float(epsilon), float(sigma), int(max_keys_per_user)
        self._values = {}

    def __call__(self, gaps):
        gaps = np.asarray(gaps, dtype=np.int64)
        missing = sorted({int(g) for g in gaps if g >= 0} - set(self._values))
        if missing:
            lb = _log_beta(self.sigma, missing)
            vals = gshm.exact_delta_over_log_betas(self.epsilon, lb, self.c, _shift(self.sigma))
            self._values.update(zip(missing, (float(v) for v in vals)))
        # a negative gap (tau* - z below tau) is bounded by 1
        return np.array([self._values.get(int(g), 1.0) for g in gaps], dtype=np.float64)


def _mixture(table, shared_sigma, gap, radius, cut_mass):
    z = np.arange(-radius, radius + 1, dtype=np.int64)
    weights = dg.pmf(z, shared_sigma)
    return min(1.0, fixed_order.dot(weights, table(int(gap) - z)) + cut_mass)


def _check(epsilon, sigma, shared_sigma, max_keys_per_user):
    gshm.check_release_arguments(epsilon, sigma, max_keys_per_user)
    if not (math.isfinite(shared_sigma) and shared_sigma > 0):
        raise ValueError(f"shared_sigma must be > 0, got {shared_sigma}")


def delta(epsilon, sigma, shared_sigma, threshold_gap, max_keys_per_user, *, cut=1e-300):
    """Theorem 1's delta(epsilon) for independent scale ``sigma``, shared scale
    ``shared_sigma`` (both in users, discrete Gaussian) and gap tau* - tau.

    ``cut``: the mass of the shared component left out of the sum (counted as 1); the
    default leaves out nothing a float can hold. Returns delta in [0, 1]."""
    epsilon, sigma, shared_sigma = float(epsilon), float(sigma), float(shared_sigma)
    _check(epsilon, sigma, shared_sigma, max_keys_per_user)
    radius, mass = _cut_radius(shared_sigma, cut)
    table = _Table(epsilon, sigma, max_keys_per_user)
    return _mixture(table, shared_sigma, math.ceil(threshold_gap), radius, mass)


def new_keys_release_probability(sigma, shared_sigma, threshold_gap, max_keys_per_user):
    """P[Z + max_{j <= C} X_j >= g]: the chance that C keys the user alone holds (count tau)
    are released -- the delta of that neighbour pair (Proposition 2 (b)), so a lower bound
    on the delta of any release at these parameters (the mass of |Z| > 38.6 s, < 1e-300,
    is left out). shared_sigma = 0: independent noise, 1 - beta(g)^C."""
    c = int(max_keys_per_user)
    g = int(math.ceil(threshold_gap))
    if shared_sigma == 0:
        return float(-np.expm1(c * _log_beta(sigma, [g])[0]))
    radius, _ = _cut_radius(float(shared_sigma), 1e-300)
    z = np.arange(-radius, radius + 1, dtype=np.int64)
    released = -np.expm1(c * _log_beta(sigma, g - z))
    return fixed_order.dot(dg.pmf(z, shared_sigma), released)


@dataclasses.dataclass(frozen=True)
class CorrelatedParameters:
    """A calibrated correlated release: independent scale ``sigma``, shared scale
    ``shared_sigma``, noisy threshold tau* = ``threshold``; ``delta`` is Theorem 1's at
    ``epsilon``."""

    sigma: float
    shared_sigma: float
    threshold: int
    pre_threshold: int
    delta: float
    epsilon: float

    def __post_init__(self):
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if not (math.isfinite(self.shared_sigma) and self.shared_sigma > 0):
            raise ValueError(f"shared_sigma must be > 0, got {self.shared_sigma}")
        check_threshold_parameters(pre_threshold=self.pre_threshold, threshold=self.threshold,
                                   delta=self.delta, epsilon=self.epsilon)

    @property
    def threshold_gap(self):
        return self.threshold - self.pre_threshold

    @property
    def noise(self):
        return NOISE


def _splits(epsilon, delta_target, c_u):
    """The (sigma, shared_sigma) pairs the calibration tries (SHARED_RATIOS x SIGMA_STEPS
    above gshm.default_sigma), or () when no sigma meets the Gaussian condition."""
    floor = gshm.default_sigma(epsilon, delta_target, c_u)
    if floor is None:
        return ()
    return tuple((floor * m, floor * m * r) for m in SIGMA_STEPS for r in SHARED_RATIOS)


def min_threshold_gap(epsilon, delta_target, sigma, shared_sigma, max_keys_per_user, *,
                      table=None):
    """Smallest integer tau* - tau with Theorem 1's delta <= delta_target, or None.

    delta falls as the gap grows (every delta_004 term does), so this is a monotone
    search; the mass of |Z| > K with P[|Z| > K] <= CUT_FRACTION delta_target counts as 1."""
    epsilon, sigma, shared_sigma = float(epsilon), float(sigma), float(shared_sigma)
    _check(epsilon, sigma, shared_sigma, max_keys_per_user)
    c_u = int(max_keys_per_user)
    table = table or _Table(epsilon, sigma, c_u)
    radius, mass = _cut_radius(shared_sigma, CUT_FRACTION * delta_target)
    if float(dg.composed_shift_delta(epsilon, sigma, c_u)) + mass > delta_target:
        return None      # every term is >= delta_+(C, eps): no gap works at this sigma
    start = gshm.min_threshold_gap(epsilon, delta_target, sigma, c_u, noise="discrete_gaussian")
    low = 0 if start is None else int(start)
    return smallest_integer(
        lambda g: _mixture(table, shared_sigma, g, radius, mass) <= delta_target, low,
        max_high=2**40)


class SharedPartOnlyAddsNoise(ValueError):
    """A user-set threshold that independent noise of the same sigma already meets: the
    shared part would be extra noise only (:func:`calibrate` refuses it)."""


def calibrate(epsilon, delta_target, max_keys_per_user, *, pre_threshold=1, threshold=None):
    """Correlated parameters meeting (epsilon, delta_target) by Theorem 1.

    Tries the splits of :func:`_splits`. Without ``threshold``: the split with the
    smallest threshold (ties: the least total variance sigma^2 + s^2). With ``threshold``
    (tau*): the split of least total variance meeting it, refused
    (:class:`SharedPartOnlyAddsNoise`) when independent noise of that split's sigma meets
    it without the shared part. A user-set sigma is not taken:
    with two noise scales it would not say which (the spec refuses it). Raises
    ValueError naming what would meet the budget."""
    epsilon = float(epsilon)
    check_calibration_arguments(epsilon=epsilon, delta_target=delta_target,
                                max_keys_per_user=max_keys_per_user, pre_threshold=pre_threshold)
    c_u, tau = int(max_keys_per_user), int(pre_threshold)
    if c_u > MAX_KEYS:
        raise ValueError(f"max_keys_per_user must be <= {MAX_KEYS} for correlated noise "
                         f"(the planning limit), got {c_u}")
    budget = f"(epsilon={epsilon:g}, delta={delta_target:g}, max_keys_per_user={c_u})"
    splits = _splits(epsilon, delta_target, c_u)
    if splits and splits[0][0] > max_sigma(c_u):
        # refused before any table is built: the work grows as sigma^2 (MAX_WORK)
        raise ValueError(f"correlated noise at {budget} needs sigma >= {splits[0][0]:.4g}, "
                         f"beyond the planning limit {max_sigma(c_u):.4g} of its calibration "
                         f"at this max_keys_per_user (minutes of work beyond it); use a "
                         f"larger epsilon or delta, or noise: discrete_gaussian")
    best = None
    tables = {}
    for sigma, shared in splits:
        table = tables.setdefault(sigma, _Table(epsilon, sigma, c_u))
        gap = min_threshold_gap(epsilon, delta_target, sigma, shared, c_u, table=table)
        if gap is None:
            continue
        if threshold is not None:
            need = int(math.ceil(threshold)) - tau
            if gap > need:
                continue
            gap = need
        key = (gap if threshold is None else 0, sigma * sigma + shared * shared)
        if best is None or key < best[0]:
            best = (key, sigma, shared, gap)
    if best is None:
        if threshold is not None:
            free = calibrate(epsilon, delta_target, c_u, pre_threshold=tau)
            raise ValueError(f"threshold={threshold:g} is too low for correlated noise at "
                             f"{budget} with pre_threshold={tau}; the smallest threshold is "
                             f"{free.threshold}")
        raise ValueError(f"no correlated split meets {budget}: the noise needed is beyond "
                         "what can be represented; use a larger epsilon or delta")
    _, sigma, shared, gap = best
    if threshold is not None:
        # Every split has a shared part (SHARED_RATIOS > 0), so a threshold the independent
        # noise of the same sigma already meets (paper 004's exact delta, no Z) would get
        # the shared draw as pure extra noise: every released count's variance grows by
        # s^2 for nothing (issue 42). Refused: the user asked for a threshold, not for noise.
        alone = gshm.min_threshold_gap(epsilon, delta_target, sigma, c_u,
                                       noise="discrete_gaussian")
        if alone is not None and alone <= gap:
            raise SharedPartOnlyAddsNoise(
                f"threshold={threshold:g} is met at {budget} by independent noise alone "
                f"(sigma={sigma:.6g} reaches threshold {tau + int(alone)} without a shared "
                f"part), so the shared part of noise: correlated (shared_sigma={shared:.6g}) "
                f"would only add noise to every count; use noise: discrete_gaussian (or "
                f"auto) with this threshold")
    radius, mass = _cut_radius(shared, CUT_FRACTION * delta_target)
    achieved = _mixture(tables[sigma], shared, gap, radius, mass)
    return CorrelatedParameters(sigma=float(sigma), shared_sigma=float(shared),
                                threshold=tau + int(gap), pre_threshold=tau,
                                delta=float(achieved), epsilon=epsilon)


def release_point(threshold):
    """The user count a key needs to be released at least half the time: for symmetric
    integer noise V (independent or Z + X), P[c + V >= tau*] >= 1/2 iff c >= tau*
    (P[V >= 0] > 1/2 > P[V >= 1]). The same for both noises: ``auto`` compares thresholds."""
    return int(math.ceil(threshold))


# ---------------------------------------------------------------------------------------
# Proposition 2: the least threshold any split can have (open key space).


def threshold_lower_bound(epsilon, delta_target, max_keys_per_user, *, pre_threshold=1,
                          scan=200, step=1e-3):
    """The least tau* Proposition 2 leaves to any split: (tau*, sigma_lo).

    (a) asks delta_+(C, e; sigma) <= delta; sigma_lo is the smallest sigma found to meet it
    scanning down from gshm.default_sigma in ``scan`` relative steps of ``step`` (the
    discrete divergence is not exactly monotone in sigma, so the scan looks below the
    bisection's answer). (b) asks P[Z + max_{j <= C} X_j >= g] <= delta; that probability
    grows with sigma (N_Z(0, sigma^2) has monotone likelihood ratio in |x|, so |X| grows
    stochastically) and, wherever it is <= 1/4 (any delta asked for), with the shared part
    (Anderson's inequality for C = 1; for C > 1, F^C is concave in the tail; checked
    numerically in tests/accounting/test_correlated_gshm.py), so its least threshold over
    all splits is at sigma_lo without a shared part.

    A statement about this analysis' reach (docs, the issue's target), not a privacy claim."""
    c_u, tau = int(max_keys_per_user), int(pre_threshold)
    floor = gshm.default_sigma(epsilon, delta_target, c_u)
    sigmas = floor * (1.0 - step * np.arange(scan + 1))
    fits = [float(dg.composed_shift_delta(float(epsilon), float(s), c_u)) <= delta_target
            for s in sigmas]
    sigma_lo = float(min(s for s, ok in zip(sigmas, fits) if ok))
    gap = smallest_integer(
        lambda g: new_keys_release_probability(sigma_lo, 0.0, g, c_u) <= delta_target, 0)
    return tau + gap, sigma_lo


# ---------------------------------------------------------------------------------------
# Theorem 3: the (rho, delta0) record for the ledger's zCDP mode.


def correlated_privacy_record(sigma, shared_sigma, threshold, pre_threshold, max_keys_per_user,
                              *, radius=None):
    """(rho, delta0) of a correlated release: it is delta0-approximately rho-zCDP (Bun &
    Steinke 2016, Def. 8.1) for add/remove of one user in at most C keys (Theorem 3).

    Args:
      sigma, shared_sigma: the independent and shared discrete Gaussian scales (users).
      threshold, pre_threshold: tau* and tau (integers >= 1, tau* >= tau).
      max_keys_per_user: C >= 1.
      radius: K of Theorem 3 (an integer >= 0); default: the least K with
        P[|Z| > K] <= 1e-3 times the thresholding part of delta0.
    Returns:
      (rho, delta0): rho = C max(1 / (2 sigma^2), log(1 / beta(g - K))),
      delta0 = P[|Z| > K] + sum_{|z| <= K} P[Z = z] (1 - beta(g - z)^C), g = tau* - tau.
      shared_sigma = 0 gives independent GSHM's record (C / (2 sigma^2), 1 - beta(g)^C).
    """
    sigma, shared_sigma = float(sigma), float(shared_sigma)
    c = int(max_keys_per_user)
    gshm.check_release_arguments(1.0, sigma, c)
    if not (math.isfinite(shared_sigma) and shared_sigma >= 0):
        raise ValueError(f"shared_sigma must be >= 0, got {shared_sigma}")
    g = int(math.ceil(threshold)) - int(pre_threshold)
    if g < 0:
        raise ValueError(f"threshold must be >= pre_threshold, got {threshold} < {pre_threshold}")
    if shared_sigma == 0:
        lb = float(_log_beta(sigma, [g])[0])
        return c / (2.0 * sigma * sigma), float(-math.expm1(c * lb))
    if radius is None:
        full = new_keys_release_probability(sigma, shared_sigma, g, c)
        radius, out_mass = _cut_radius(shared_sigma, 1e-3 * full)
    else:
        radius = int(radius)
        if radius < 0:
            raise ValueError(f"radius must be >= 0, got {radius}")
        out_mass = 2.0 * float(dg.sf(radius + 1, shared_sigma))
    z = np.arange(-radius, radius + 1, dtype=np.int64)
    lbs = _log_beta(sigma, g - z)
    inside = fixed_order.dot(dg.pmf(z, shared_sigma), -np.expm1(c * lbs))
    tilt = float(-lbs[-1])                   # log(1 / beta(g - K)): z = K is the last
    return c * max(1.0 / (2.0 * sigma * sigma), tilt), min(1.0, out_mass + inside)


# ---------------------------------------------------------------------------------------
# Where correlated noise helps: a public bound on the number of non-zero counts.


def bounded_support_threshold(epsilon, delta_target, keys, *, correlated=True, grid=48):
    """Comparison only (continuous Gaussian noise; not a release thresher runs): the least
    threshold (pre-threshold 1) of the sparse histogram when every histogram has at most
    ``keys`` = k non-zero counts and a user adds one to at most k of them, by
    "add the deltas" in its two-sided form delta_G(mu, e) + e^e P[new key released]
    (valid for both mechanisms). Independent: mu^2 = k / sigma^2, P = 1 - Phi(g/sigma)^k.
    Correlated (Lebeda, SOSA 2025): Sigma = sigma^2 I + s^2 11^T on the <= k released
    coordinates, mu^2 = max_{m <= k} (m - c m^2) / sigma^2, c = s^2 / (sigma^2 + k s^2),
    P = P[Z + max_{j <= k} X_j >= g]. Minimised over sigma, s / sigma and the split of
    delta on grids of ``grid`` points. Returns the threshold 1 + g."""
    from thresher.accounting import gaussian
    from thresher.accounting._lazy import special
    k = int(keys)
    e = float(epsilon)
    nodes, weights = np.polynomial.hermite_e.hermegauss(96)     # E over Z ~ N(0, 1)
    weights = weights / weights.sum()

    def mu_sq(sigma, s):
        if not correlated or s == 0:
            return k / sigma ** 2
        c = s * s / (sigma * sigma + k * s * s)
        m = min(k, max(1, int(round(1.0 / (2.0 * c)))))
        cands = np.array([max(1, m - 1), m, min(k, m + 1), k], dtype=np.float64)
        return float(np.max(cands - c * cands ** 2)) / sigma ** 2

    def new_key(sigma, s, g):
        if not correlated or s == 0:
            return -math.expm1(k * float(special.log_ndtr(g / sigma)))
        vals = -np.expm1(k * special.log_ndtr((g - s * nodes) / sigma))
        return fixed_order.dot(weights, vals)

    best = math.inf
    ratios = np.linspace(0.0, 1.5, grid) if correlated else [0.0]
    for r in ratios:
        for share in (0.5, 0.7, 0.9, 0.97, 0.99):
            budget_g = share * delta_target

            def gauss_ok(sigma):
                return gaussian.delta_for_epsilon(math.sqrt(mu_sq(sigma, r * sigma)), e) <= budget_g
            lo, hi = 1e-3, 1.0
            while not gauss_ok(hi):
                lo, hi = hi, hi * 2
            for _ in range(60):
                mid = 0.5 * (lo + hi)
                lo, hi = (lo, mid) if gauss_ok(mid) else (mid, hi)
            sigma = hi
            rest = (delta_target - budget_g) / math.exp(e)
            lo_g, hi_g = 0.0, sigma
            while new_key(sigma, r * sigma, hi_g) > rest:
                lo_g, hi_g = hi_g, hi_g * 2
            for _ in range(60):
                mid = 0.5 * (lo_g + hi_g)
                lo_g, hi_g = (lo_g, mid) if new_key(sigma, r * sigma, mid) <= rest else (mid, hi_g)
            best = min(best, 1.0 + hi_g)
    return best

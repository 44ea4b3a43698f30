"""Adaptive weighting over rounds (``mechanism.kind: adaptive``) and its accounting.

In the spirit of MAD2R (Chen, Cohen-Addad, Epasto, Zadimoghaddam, *Scalable Private
Partition Selection via Adaptive Weighting*, ICML 2025: the first round guides the
second's weights) and of DP-SIPS (Swanberg, Desfontaines, Haney, "DP-SIPS: A simpler,
more scalable mechanism for differentially private partition selection", PoPETs 2023:
iterate a partition selection, each round over the keys not yet released). thresher does
NOT implement MAD's one-round re-routing: its l2 sensitivity rests on a lemma of the
paper that is not available here, and the naive bound on the change of other users'
weights grows like the l1 norm of the added user's vector. What is built instead:

Round r = 1..R runs the weighted Gaussian selection of ``accounting.weighted_gaussian``
(Gopi et al., ICML 2020, Thm 5.1, grid weights floor(S/sqrt(t)), discrete Gaussian noise
sigma_r S, integer threshold T_r) on every user's distinct keys MINUS the keys released
in rounds < r; each user re-spreads a full unit of l2 weight over at most Delta0 = C of
the keys they have left. The count column ("count") then gives every released key its
distinct-user count plus N_Z(0, sigma_c^2), each user counted in at most
C_c = min(C, count_keys_per_user) of its released keys.

Privacy (docs/partition_selection.md section 6, with the proof). Given the output of the
rounds before it, round r is a weighted Gaussian selection of the users' remaining keys
(a user's round-r input is a function of their own records and earlier public output).
For neighbours D, D' = D - u and EITHER order, round r is (eps, delta_r(eps))-DP for
every eps >= 0 and every history, with

    delta_r(eps) = G_r(eps) + p_r / (1 - p_r),
    G_r(eps) = weighted_gaussian.gaussian_part(eps, sigma_r, C)
             (max over t <= C of the shift of t rows by q_t; keys u shares with others),
    p_r = max_{t <= C} (1 - beta_t^t),  beta_t = P[q_t + Z < T_r] (bounded below by
             weighted_gaussian.log_beta_lower: a key only u holds stays hidden).

The count stage, given the released set, is (eps, delta_c(eps))-DP with delta_c =
``discrete_gaussian.composed_shift_delta(eps, sigma_c, C_c)`` (both orders). Each stage's
profile on a grid of eps is turned into a symmetric f-DP trade-off function and the R + 1
stages are composed by f-DP (Dong, Roth & Su 2022, Thm 3.2, adaptive): the composed
delta(eps) of the whole release is ``tradeoff_composition.composed_delta`` of the stages'
pessimistic pairs (``composed_delta`` here).

Calibration (``calibrate``): one base sigma s. Round r draws sigma_r = s / sqrt((1 - f_c)
w_r) (w_r the round_fractions, f_c the count_fraction), the count sigma_c = s sqrt(C_c) /
sqrt(f_c): the Gaussian parts compose roughly like one Gaussian of mu^2 = sum of the
stages' (sensitivity / sigma)^2 = 1 / s^2, and w_r, f_c are the stages' shares of it.
Round r's threshold T_r is the smallest integer with p_r / (1 - p_r) <= w_r
THRESHOLD_DELTA_SHARE delta. s is the smallest (within CALIBRATION_REL_TOL) at which the
composed delta(eps) <= delta; the returned parameters are always re-checked.
tests/accounting/test_adaptive.py checks the claim against a brute-force computation of
a two-round release's exact divergence; tests/accounting/test_tradeoff_composition.py the
composition against closed forms and dp-accounting.
"""
import dataclasses
import math

import numpy as np

from thresher.accounting import discrete_gaussian as dg
from thresher.accounting import gaussian
from thresher.accounting import tradeoff_composition as tc
from thresher.accounting import weighted_gaussian as wg
from thresher.accounting.search import smallest_integer, smallest_real

ROUNDS_ALLOWED = (2, 3)
DEFAULT_ROUNDS = 2
# Each round's share of the selection's Gaussian budget and of the thresholds' delta: the
# first round only has to find the head keys (docs/partition_selection.md section 6,
# measured on the docstring corpus).
DEFAULT_ROUND_FRACTIONS = {2: (0.1, 0.9), 3: (0.05, 0.15, 0.8)}
# As weighted_gaussian's (docs/partition_selection.md section 5): the count's share of the
# Gaussian budget, and how many of its released keys a user counts in.
DEFAULT_COUNT_FRACTION = 0.1
DEFAULT_COUNT_KEYS_PER_USER = 128
# Share of delta reserved for the rounds' thresholds (the p_r / (1 - p_r) terms).
THRESHOLD_DELTA_SHARE = 0.2
# Profile grid: PROFILE_POINTS + 1 points on [0, top], top the first of 2 eps, 4 eps, ...
# (at most TOP_MAX eps) where the stage's Gaussian part is <= TAIL_SHARE delta; losses
# rounded up to multiples of eps / LOSS_STEPS.
PROFILE_POINTS = 128
TAIL_SHARE = 1e-4
TOP_MAX = 64.0
LOSS_STEPS = 10_000
CALIBRATION_REL_TOL = 1e-3
# Largest noise the plan accepts: sigma_r S of the rounds within the sampler's range
# (transforms.randomness.samplers.SIGMA_MAX), the count's sigma_c within pipelines.common.limits.SIGMA_MAX.
GRID_SIGMA_MAX = float(1 << 20)
COUNT_SIGMA_MAX = 1e5


def check_fractions(fractions, rounds):
    """``fractions``: one positive share per round summing to 1 (1e-9). Returns a tuple."""
    fractions = tuple(float(f) for f in fractions)
    if len(fractions) != int(rounds):
        raise ValueError(f"round_fractions must have one entry per round ({rounds}), got "
                         f"{len(fractions)}")
    if any(not (math.isfinite(f) and 0.0 < f < 1.0) for f in fractions):
        raise ValueError(f"round_fractions must each be in (0, 1), got {list(fractions)}")
    if abs(math.fsum(fractions) - 1.0) > 1e-9:
        raise ValueError(f"round_fractions must sum to 1, got {math.fsum(fractions):.12g}")
    return fractions


def stage_sigmas(base_sigma, fractions, count_fraction, count_keys):
    """(round sigmas in user weights, count sigma in users) for a base sigma s:
    sigma_r = s / sqrt((1 - f_c) w_r), sigma_c = s sqrt(C_c / f_c)."""
    f_c = float(count_fraction)
    rounds = [float(base_sigma) / math.sqrt((1.0 - f_c) * w) for w in fractions]
    return rounds, float(base_sigma) * math.sqrt(int(count_keys) / f_c)


# ---------------------------------------------------------------------------------------
# Each stage's privacy profile.

def round_leak(threshold_grid, sigma, max_keys_per_user, scale=wg.WEIGHT_SCALE):
    """p / (1 - p), p = max_{t <= C} (1 - beta_t^t) (upper bound): the term the threshold
    adds to round r's profile (module docstring)."""
    t = np.arange(1, int(max_keys_per_user) + 1)
    log_beta = wg.log_beta_lower(int(threshold_grid), wg.grid_weight(t, scale),
                                 float(sigma) * scale)
    with np.errstate(invalid="ignore"):
        p = float(np.max(-np.expm1(t * log_beta)))
    if not (p < 1.0):
        return math.inf
    return p / (1.0 - p)


def round_threshold(sigma, max_keys_per_user, leak_target, scale=wg.WEIGHT_SCALE):
    """Smallest integer grid threshold T with round_leak(T) <= leak_target. The search
    starts at half the Gaussian tail's root s sqrt(2 ln(1 / leak_target)), below it: the
    t = 1 term alone needs P[Z >= T - S] <= leak_target."""
    low = max(1, int(0.5 * float(sigma) * scale * math.sqrt(2.0 * math.log(1.0 / leak_target))))
    return smallest_integer(
        lambda k: round_leak(k, sigma, max_keys_per_user, scale) <= leak_target, low)


def round_gaussian_part(epsilons, sigma, max_keys_per_user, scale=wg.WEIGHT_SCALE):
    """G_r on an array of eps: weighted_gaussian.gaussian_part at each (max over t <= C
    of shift_delta(eps, t, q_t, sigma S))."""
    t = np.arange(1, int(max_keys_per_user) + 1)
    q = wg.grid_weight(t, scale)
    e = np.asarray(epsilons, dtype=np.float64).reshape(-1, 1)
    return np.max(wg.shift_delta(e, t[None, :], q[None, :], float(sigma) * scale), axis=1)


def _grid(profile_fn, epsilon, delta_target):
    """The stage's eps grid: [0, top], top the first of 2 eps, 4 eps, ... <= TOP_MAX eps
    with profile_fn(top) <= TAIL_SHARE delta."""
    top = 2.0 * epsilon
    while top < TOP_MAX * epsilon and float(profile_fn(np.array([top]))[0]) > \
            TAIL_SHARE * delta_target:
        top *= 2.0
    return np.linspace(0.0, top, PROFILE_POINTS + 1)


def round_profile(sigma, threshold_grid, max_keys_per_user, epsilon, delta_target,
                  scale=wg.WEIGHT_SCALE):
    """(eps grid, delta_r(eps) = G_r(eps) + p_r / (1 - p_r)) of one round."""
    c = int(max_keys_per_user)
    leak = round_leak(threshold_grid, sigma, c, scale)

    def gauss(e):
        return round_gaussian_part(e, sigma, c, scale)
    grid = _grid(gauss, epsilon, delta_target)
    return grid, np.minimum(gauss(grid) + leak, 1.0)


def count_profile(count_sigma, count_keys, epsilon, delta_target):
    """(eps grid, delta_c(eps)) of the count stage: composed_shift_delta(eps, sigma_c, C_c)."""
    def fn(e):
        return np.atleast_1d(dg.composed_shift_delta(e, float(count_sigma), int(count_keys)))
    grid = _grid(fn, epsilon, delta_target)
    return grid, np.minimum(fn(grid), 1.0)


# ---------------------------------------------------------------------------------------
# Parameters, the composed claim and the calibration.

@dataclasses.dataclass(frozen=True)
class RoundParameters:
    """One round's weighted Gaussian selection: sigma (user weights), the integer grid
    threshold and its leak p / (1 - p) (the threshold's term of the round's profile)."""

    sigma: float
    threshold_grid: int
    leak: float

    def __post_init__(self):
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if int(self.threshold_grid) != self.threshold_grid or self.threshold_grid < 1:
            raise ValueError(f"threshold_grid must be an integer >= 1, got {self.threshold_grid}")


@dataclasses.dataclass(frozen=True)
class AdaptiveParameters:
    """Every round's selection, the count column, and the f-DP composed guarantee
    (epsilon, delta) of the whole release (``composed_delta`` of these parameters)."""

    rounds: tuple
    scale: int
    max_keys_per_user: int
    count_sigma: float
    count_keys_per_user: int
    epsilon: float
    delta: float


def stage_pairs(rounds, count_sigma, count_keys, max_keys_per_user, epsilon, delta_target,
                scale=wg.WEIGHT_SCALE):
    """The pessimistic pairs (``tradeoff_composition.pessimistic_pair``) of every round
    ((sigma, threshold_grid) each) and of the count stage (none when count_sigma is
    None: the rounds alone)."""
    pairs = [tc.pessimistic_pair(*round_profile(s, t, max_keys_per_user, epsilon,
                                                delta_target, scale)) for s, t in rounds]
    if count_sigma is not None:
        pairs.append(tc.pessimistic_pair(*count_profile(count_sigma, count_keys, epsilon,
                                                        delta_target)))
    return pairs


def composed_delta(rounds, count_sigma, count_keys, max_keys_per_user, epsilon, delta_target,
                   scale=wg.WEIGHT_SCALE):
    """delta(epsilon) of the whole release (rounds and count composed by f-DP): an upper
    bound. ``delta_target`` only fixes the profile grids (their tails)."""
    pairs = stage_pairs(rounds, count_sigma, count_keys, max_keys_per_user, epsilon,
                        delta_target, scale)
    return tc.composed_delta(pairs, float(epsilon), step=float(epsilon) / LOSS_STEPS)


def calibrate(epsilon, delta_target, max_keys_per_user, *, fractions,
              count_fraction=DEFAULT_COUNT_FRACTION,
              count_keys_per_user=DEFAULT_COUNT_KEYS_PER_USER, scale=wg.WEIGHT_SCALE):
    """The smallest base sigma (module docstring) at which the whole release is
    (epsilon, delta_target)-DP, with each round's smallest threshold for its leak share.

    Raises ValueError("round_fractions: ..." / "count_fraction: ...") naming what cannot
    be met (noise beyond the drawable range)."""
    epsilon, delta_target = float(epsilon), float(delta_target)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not (0 < delta_target < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    fractions = check_fractions(fractions, len(fractions))
    f_c = float(count_fraction)
    if not (0.0 < f_c < 1.0):
        raise ValueError(f"count_fraction: must be in (0, 1), got {count_fraction}")
    c = int(max_keys_per_user)
    c_count = wg.count_bound(c, count_keys_per_user)
    if c < 1 or c_count < 1:
        raise ValueError(f"max_keys_per_user and count_keys_per_user must be >= 1, got "
                         f"{c}, {count_keys_per_user}")
    leak_targets = [w * THRESHOLD_DELTA_SHARE * delta_target for w in fractions]
    memo = {}

    def build(base):
        if base not in memo:
            sigmas, c_sigma = stage_sigmas(base, fractions, f_c, c_count)
            rounds = [(s, round_threshold(s, c, lt, scale)) for s, lt in zip(sigmas, leak_targets)]
            d = composed_delta(rounds, c_sigma, c_count, c, epsilon, delta_target, scale)
            memo[base] = (rounds, c_sigma, d)
        return memo[base]

    # start from the continuous Gaussian of mu = 1 / s meeting what the thresholds leave
    start = gaussian.sigma_for(epsilon, (1.0 - THRESHOLD_DELTA_SHARE) * delta_target,
                               rel_tol=1e-6)
    # the f-DP composition is within ~0.2% of it (measured): bracket [start, 1.01 start]
    def fits(s):
        return build(s)[2] <= delta_target
    base = smallest_real(fits, start, 1.01 * start, rel_tol=CALIBRATION_REL_TOL)
    if base is None:
        base = smallest_real(fits, 1.01 * start, math.inf, rel_tol=CALIBRATION_REL_TOL)
    if base is None:
        raise ValueError(f"round_fractions: no noise meets (epsilon={epsilon:g}, "
                         f"delta={delta_target:g})")
    rounds, c_sigma, achieved = build(base)
    for i, (s, _) in enumerate(rounds, start=1):
        if s * scale > GRID_SIGMA_MAX:
            raise ValueError(f"round_fractions: round {i} of {len(rounds)} (share "
                             f"{fractions[i - 1]:g}) needs selection noise sigma {s:.4g} user "
                             f"weights, above the sampler's range {GRID_SIGMA_MAX / scale:g}; "
                             "give it a larger share")
    if c_sigma > COUNT_SIGMA_MAX:
        raise ValueError(f"count_fraction: {f_c:g} needs count noise sigma {c_sigma:.4g}, "
                         f"above the planning limit {COUNT_SIGMA_MAX:g}; use a larger "
                         "count_fraction or a smaller count_keys_per_user")
    if not achieved <= delta_target:      # never: smallest_real returns a qualifying point
        raise ValueError("round_fractions: the calibrated release does not meet its budget")
    return AdaptiveParameters(
        rounds=tuple(RoundParameters(sigma=float(s), threshold_grid=int(t),
                                     leak=float(round_leak(t, s, c, scale)))
                     for s, t in rounds),
        scale=int(scale), max_keys_per_user=c, count_sigma=float(c_sigma),
        count_keys_per_user=int(c_count), epsilon=epsilon, delta=float(achieved))

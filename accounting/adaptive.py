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
the keys they have left (t'_u = min(C, |remaining keys|)).

Privacy (docs/partition_selection.md, "adaptive"). The keys released before round r,
R_<r, are outputs of the earlier rounds. Given R_<r, a user's round-r input (their keys
minus R_<r, then the l0 bound with their own randomness) is a function of their own
records and R_<r only; so for neighbours D, D' = D - u every other user's round-r
weights are identical on both sides, and u's round-r weight vector has at most C entries
q_t', t' q_t'^2 <= S^2: exactly the situation of the weighted Gaussian theorem. Round r
is therefore (eps_r, delta_r)-DP for every fixed R_<r, with delta_r =
``weighted_gaussian.delta(eps_r, sigma_r, T_r, C)``, and the rounds compose adaptively:
by basic composition (Dwork & Roth, Thm 3.16 holds for adaptive composition, Dwork,
Rothblum, Vadhan 2010) the selection is (sum eps_r, sum delta_r)-DP. The count column
(stage "count") is the discrete Gaussian mechanism on the released keys' distinct-user
counts, each user bounded to C of their keys in the released set: at most C counts move
by 1, ``discrete_gaussian.composed_shift_delta(eps_c, count_sigma, C)``; basic
composition again.

Only basic composition across the rounds is claimed (what is derived in docs/ and
checked in tests/accounting/test_adaptive.py against a brute-force computation of the
two-round release's exact divergence on a small grid).
"""
import dataclasses
import math

from accounting import discrete_gaussian as dg
from accounting import weighted_gaussian as wg

ROUNDS_ALLOWED = (2, 3)
DEFAULT_ROUNDS = 2
# The share of the selection budget (epsilon and delta) of each round: the first round
# only has to find the head keys (docs/partition_selection.md, "adaptive", measured).
DEFAULT_ROUND_FRACTIONS = {2: (0.1, 0.9), 3: (0.05, 0.15, 0.8)}
DEFAULT_COUNT_FRACTION = wg.DEFAULT_COUNT_FRACTION


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


def stage_budgets(first_epsilon, first_delta, fractions, count_fraction):
    """Each stage's (epsilon, delta) from round 1's: round r gets f_r / f_1 times round
    1's, and the count f_c / (1 - f_c) times the whole selection's (the selection is
    (1 - f_c) of the release, the count f_c). Returns ([(eps_r, delta_r)], (eps_c, delta_c));
    ``pipelines.kinds.adaptive.stage_budget`` spends exactly these."""
    fractions = tuple(float(f) for f in fractions)
    scale_e, scale_d = float(first_epsilon) / fractions[0], float(first_delta) / fractions[0]
    rounds = [(float(first_epsilon), float(first_delta))] + [
        (scale_e * f, scale_d * f) for f in fractions[1:]]
    count = wg.count_budget(scale_e, scale_d, count_fraction)
    return rounds, count


@dataclasses.dataclass(frozen=True)
class RoundParameters:
    """One round's weighted Gaussian selection: sigma (user weights), the integer grid
    threshold, its (epsilon, delta target) and the delta its parameters achieve."""

    sigma: float
    threshold_grid: int
    epsilon: float
    delta_target: float
    delta: float

    def __post_init__(self):
        if not (math.isfinite(self.sigma) and self.sigma > 0):
            raise ValueError(f"sigma must be > 0, got {self.sigma}")
        if int(self.threshold_grid) != self.threshold_grid or self.threshold_grid < 1:
            raise ValueError(f"threshold_grid must be an integer >= 1, got {self.threshold_grid}")


@dataclasses.dataclass(frozen=True)
class AdaptiveParameters:
    """Every round's selection, the count column's sigma and the composed guarantee."""

    rounds: tuple
    scale: int
    max_keys_per_user: int
    count_sigma: float
    count_epsilon: float
    count_delta: float

    @property
    def epsilon(self):
        """Basic composition of the rounds and the count."""
        return math.fsum([r.epsilon for r in self.rounds] + [self.count_epsilon])

    @property
    def delta(self):
        return math.fsum([r.delta for r in self.rounds] + [self.count_delta])


def calibrate_round(epsilon, delta_target, max_keys_per_user, scale=wg.WEIGHT_SCALE):
    """The smallest sigma at which a threshold meets (epsilon, delta_target) and the
    smallest integer threshold there (``weighted_gaussian.default_sigma`` and
    ``min_threshold``). Raises ValueError("sigma: ...") when no noise works."""
    c = int(max_keys_per_user)
    sigma = wg.default_sigma(epsilon, delta_target, c, scale)
    if sigma is None:
        raise ValueError(f"sigma: no noise meets (epsilon={epsilon:g}, delta={delta_target:g}, "
                         f"max_keys_per_user={c})")
    t_grid = wg.min_threshold(epsilon, delta_target, sigma, c, scale)
    if t_grid is None:      # never: default_sigma makes the Gaussian part fit
        raise ValueError(f"sigma: no threshold meets (epsilon={epsilon:g}, "
                         f"delta={delta_target:g}) at sigma={sigma:g}")
    achieved = wg.delta(epsilon, sigma, t_grid, c, scale=scale)
    if achieved > delta_target:
        raise ValueError(f"sigma: the calibrated round does not meet delta={delta_target:g}")
    return RoundParameters(sigma=float(sigma), threshold_grid=int(t_grid), epsilon=float(epsilon),
                           delta_target=float(delta_target), delta=float(achieved))


def calibrate(first_epsilon, first_delta, max_keys_per_user, *, fractions,
              count_fraction=DEFAULT_COUNT_FRACTION, scale=wg.WEIGHT_SCALE):
    """Every round at its share of the budget (``stage_budgets``) and the count column.

    Raises ValueError("round_fractions: ..." / "count_fraction: ...") naming the stage
    that cannot be met."""
    c = int(max_keys_per_user)
    budgets, (count_eps, count_delta) = stage_budgets(first_epsilon, first_delta, fractions,
                                                      count_fraction)
    rounds = []
    for i, (eps, dlt) in enumerate(budgets, start=1):
        try:
            rounds.append(calibrate_round(eps, dlt, c, scale))
        except ValueError as exc:
            raise ValueError(f"round_fractions: round {i} of {len(budgets)} at epsilon={eps:g}, "
                             f"delta={dlt:g}: {str(exc).partition(': ')[2]}") from None
    c_sigma = wg.count_sigma(count_eps, count_delta, c)
    if c_sigma is None:
        raise ValueError(f"count_fraction: no count noise meets (epsilon={count_eps:g}, "
                         f"delta={count_delta:g})")
    c_delta = float(dg.composed_shift_delta(count_eps, c_sigma, c))
    return AdaptiveParameters(rounds=tuple(rounds), scale=int(scale), max_keys_per_user=c,
                              count_sigma=float(c_sigma), count_epsilon=float(count_eps),
                              count_delta=c_delta)

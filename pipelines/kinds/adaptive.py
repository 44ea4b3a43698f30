"""``mechanism.kind: adaptive`` — weighted Gaussian selection over rounds, with counts.

Round r runs the weighted Gaussian selection of ``weighted_gaussian`` (Gopi et al., ICML
2020, Thm 5.1, grid weights and discrete Gaussian noise) on every user's keys minus the
keys released in earlier rounds, so a user's weight moves from the head keys found early
to the keys still hidden (adaptive weighting in the spirit of MAD2R, Chen et al. ICML
2025, and DP-SIPS, Swanberg et al. PoPETs 2023). Each round is a weighted Gaussian
selection for every fixed output of the rounds before it; the rounds and the count
column (each user counted in at most ``count_keys_per_user`` of its released keys)
compose by f-DP (``accounting.adaptive``, ``accounting.tradeoff_composition``;
docs/partition_selection.md section 6): the plan has ONE budget stage, "release", for
all of them, and the report lists every stage's parameters and the composed delta.
MAD's one-round re-routing is not implemented (its sensitivity proof is not reproduced
here): ``rounds: 1`` is refused.
"""
import dataclasses

import pyarrow as pa

from thresher.accounting import adaptive as ad
from thresher.pipelines.common import declare
from thresher.pipelines.common import limits
from thresher.pipelines.kinds._words import number
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.kinds.base import UsersKind
from thresher.pipelines.common.fields import optional_float, optional_int

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "adaptive"

FIELDS = {
    "rounds": declare.integer(low=1, high=3, description=(
        f"number of selection rounds, 2 or 3 (default {ad.DEFAULT_ROUNDS}); round r "
        "selects among the keys not released before it")),
    "round_fractions": declare.array(
        declare.number(low=0, high=1, low_open=True, high_open=True), min_items=1,
        max_items=3, description=(
            "share per round of the selection's noise budget (1 / sigma_r^2) and of the "
            "thresholds' delta, summing to 1 (default "
            + ", ".join(f"{list(v)} for {k} rounds" for k, v in
                        ad.DEFAULT_ROUND_FRACTIONS.items()) + ")")),
    "count_fraction": declare.number(low=0, high=1, low_open=True, high_open=True,
                                     description=(
        "share of the noise budget (1 / sigma^2 per unit of sensitivity) spent on the "
        f"count column, in (0, 1) (default {ad.DEFAULT_COUNT_FRACTION})")),
    "count_keys_per_user": declare.integer(low=1, high=10**7, description=(
        "a user counts in the count column for at most this many of its released keys "
        f"(chosen uniformly at random; default {ad.DEFAULT_COUNT_KEYS_PER_USER})")),
}
OUTPUT_COLUMNS = {"count": pa.int64()}
# The automatic bound's score reads the last round's threshold and sigma like
# weighted_gaussian's (pipelines.planning.plan reads SCORE).
SCORE = "weighted_gaussian"
# Each round is a weighted Gaussian selection, whose noise does not grow with the bound:
# the automatic bound searches as far as weighted_gaussian's (docs/partition_selection.md).
AUTO_MAX_BOUND = 1024
# The automatic bound's share of epsilon (pipelines.spec.auto_epsilon_fraction): 5%, not
# the 10% of the other kinds. Measured (issue 28, docs/partition_selection.md "Keys
# released on a real corpus", same secrets): 2,810 users, eps = 1: 130, 121 keys against
# 125, 107 with 10%; 10,783 users: 687, 675 against 637, 661. The rounds gain more from
# the extra 5% than the choice of C loses.
AUTO_EPSILON_FRACTION = 0.05
# The default candidates start at 128 (the sqrt(2) grid 128, 181, ..., max_bound): a user's
# weights 1/sqrt(t) keep the selection's noise flat in C, and the small bounds only lose
# keys, yet with 20 candidates the exponential mechanism drew C = 45-91 in 3 of 5 draws on
# 2,810 users (82-102 keys against 117-121 from 128 up; issue 28,
# docs/partition_selection.md). Explicit bounding.auto.candidates are used as given.
AUTO_MIN_BOUND = 128


def round_stage(index):
    """The report's names of the rounds: "round_1", "round_2" (, "round_3"). They are
    parts of the plan's one "release" stage (composed by f-DP), not budget stages."""
    return f"round_{index + 1}"



@dataclasses.dataclass(frozen=True)
class AdaptiveParams:
    """The parsed section (:func:`parse`) as its readers outside this module see it."""
    rounds: int
    round_fractions: tuple[float, ...]              # w_r: each round's share of the noise
    count_fraction: float                           # f_c: the count's share
    count_keys_per_user: int                        # C_c: counts per user

def parse(section):
    rounds = section.get("rounds", ad.DEFAULT_ROUNDS)
    if rounds == 1:
        raise SpecError("mechanism.rounds", "1 is not supported: one-round MAD re-routing "
                        "needs a sensitivity proof thresher does not implement; use rounds: 2 "
                        "or 3, or mechanism.kind: weighted_gaussian for one round")
    fractions = section.get("round_fractions")
    if fractions is None:
        fractions = ad.DEFAULT_ROUND_FRACTIONS[rounds]
    try:
        fractions = ad.check_fractions(fractions, rounds)
    except ValueError as exc:
        raise SpecError("mechanism.round_fractions", str(exc).partition(" ")[2]) from None
    fraction = optional_float(section, "count_fraction")
    count_keys = optional_int(section, "count_keys_per_user")
    return {"rounds": int(rounds), "round_fractions": list(fractions),
            "count_fraction": ad.DEFAULT_COUNT_FRACTION if fraction is None else fraction,
            "count_keys_per_user": (ad.DEFAULT_COUNT_KEYS_PER_USER if count_keys is None
                                    else count_keys)}


def check_spec(mechanism, input_spec, bounding, privacy):
    if input_spec.sample is not None:
        raise SpecError("input.sample", "adaptive needs the users' records (its rounds "
                        "re-weight each user's remaining keys); an existing sample has none")


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    """The whole release (every round and the count) at the plan's "release" stage
    (epsilon, delta), composed by f-DP (``accounting.adaptive.calibrate``)."""
    if model != "l0":
        raise SpecError("bounding.model", "adaptive needs bounding.model: l0 (each user "
                        "counted at most once per key)")
    try:
        p = ad.calibrate(epsilon, delta, max_keys_per_user, fractions=mech["round_fractions"],
                         count_fraction=mech["count_fraction"],
                         count_keys_per_user=mech.get("count_keys_per_user",
                                                      ad.DEFAULT_COUNT_KEYS_PER_USER))
    except ValueError as exc:
        raise CalibrationError(f"adaptive release at epsilon={epsilon:g}, delta={delta:g}, "
                               f"max_keys_per_user={max_keys_per_user}: {exc} "
                               "(mechanism.round_fractions / count_fraction)") from None
    rounds = [{"stage": round_stage(i), "sigma": r.sigma, "threshold": r.threshold_grid / p.scale,
               "threshold_grid": r.threshold_grid, "threshold_delta": r.leak}
              for i, r in enumerate(p.rounds)]
    last = rounds[-1]
    return {"kind": NAME, "rounds": rounds, "scale": p.scale,
            "noise": "discrete_gaussian",
            # the last round's selection (the automatic bound's score reads these)
            "sigma": last["sigma"], "threshold": last["threshold"],
            "count_sigma": p.count_sigma,
            "accounting": f"{len(rounds)} rounds of weighted Gaussian selection (Gopi et al. "
                          f"2020, Thm 5.1) with grid weights floor({p.scale}/sqrt(t)) over each "
                          "user's keys not released in earlier rounds, discrete Gaussian noise, "
                          "and a count column (discrete Gaussian mechanism on <= "
                          f"{p.count_keys_per_user} counts per user of released keys): each "
                          "stage's privacy profile for every history (round: Gaussian part + "
                          "threshold term p/(1-p)), composed by f-DP (Dong, Roth & Su 2022, "
                          "Thm 3.2; docs/partition_selection.md section 6)",
            "composition": "f-DP (pessimistic pair of each stage's profile, convolved)",
            "epsilon": p.epsilon,
            # the whole release's delta at epsilon: rounds and count composed by f-DP
            "delta_achieved": p.delta,
            "count_stage": {"sigma": p.count_sigma, "counts_per_user": p.count_keys_per_user},
            "round_fractions": list(mech["round_fractions"]),
            "count_fraction": mech["count_fraction"],
            "count_keys_per_user": mech.get("count_keys_per_user",
                                            ad.DEFAULT_COUNT_KEYS_PER_USER)}


def release_users(users, params, max_keys_per_user, key_columns, num_shards, mechanism,
                  rng_factory=None, spill_dir=None):
    """Whole-user shards (or ``adaptive_rounds.ShardedUsers``: each round concatenates
    them) -> released keys with counts (``pipelines.running.release`` calls this
    instead of bounding once and ``release``). ``mechanism``: the parsed section (the
    number of rounds fixes the pipeline's shape); ``params``: the calibrated section
    (its ``count_stage.counts_per_user`` bounds the count stage);
    ``spill_dir``: the per-key shuffles' spill folder (as ``SumCountsPerKey``'s);
    ``rng_factory``: the release's draws (``keyed_random.KeyedDraws``)."""
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    from thresher.transforms.selection.adaptive_rounds import AdaptiveRelease  # heavy: apache_beam
    return AdaptiveRelease.apply(
        users, "AdaptiveRelease", key_columns, params, max_keys_per_user,
        mechanism["rounds"], num_shards, rng_factory=child(rng_factory, "AdaptiveRelease"),
        spill_dir=spill_dir)


class Adaptive(UsersKind):
    """Weighted Gaussian selection over rounds (module docstring)."""
    name = NAME
    INTERVAL = "count_stage"
    COMPOSITION_NOTE = "its rounds and count, inside its one stage, compose by f-DP"
    FIELDS, OUTPUT_COLUMNS, SCORE = FIELDS, OUTPUT_COLUMNS, SCORE
    AUTO_MAX_BOUND, AUTO_MIN_BOUND = AUTO_MAX_BOUND, AUTO_MIN_BOUND
    AUTO_EPSILON_FRACTION = AUTO_EPSILON_FRACTION
    parse = staticmethod(parse)
    check_spec = staticmethod(check_spec)
    calibrate = staticmethod(calibrate)
    release_users = staticmethod(release_users)
    MAX_KEYS = limits.WEIGHTED_GAUSSIAN_MAX_KEYS
    PARAMS = AdaptiveParams

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        limits.check_adaptive(spec, self.params(spec.mechanism), epsilon, delta,
                              max_keys_per_user)

    def privacy_record(self, mechanism, stages, max_keys_per_user):
        """``accounting.zcdp.adaptive_record``: every round and the count column."""
        from thresher.accounting import zcdp  # heavy: start-up of thresher schema
        return zcdp.adaptive_record(mechanism, stages, max_keys_per_user)

    def noise_words(self, report, key, unit):
        mech = report["mechanism"]
        rounds = mech["rounds"]
        return [f"selection: {len(rounds)} rounds; in each, every user gives each of "
                f"their t kept keys not released before the weight 1/sqrt(t), and a {key} "
                f"is released when its total weight plus discrete Gaussian noise reaches "
                f"the round's threshold (" + ", ".join(
                    f"sigma {number(r['sigma'])}, threshold {number(r['threshold'])}"
                    for r in rounds) + f"); its count of {unit} gets discrete Gaussian "
                f"noise with sigma {number(mech['count_sigma'])}"], unit

    def expected_error_words(self, params):
        # heavy: start-up of thresher schema
        from thresher.accounting.aggregates import expected_abs_gaussian
        if "count_sigma" not in params:
            return []
        return [f"expected error: E|noise| of a count "
                f"{expected_abs_gaussian(params['count_sigma']):.3g}"]


KIND = Adaptive()

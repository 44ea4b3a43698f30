"""``mechanism.kind: adaptive`` — weighted Gaussian selection over rounds, with counts.

Round r runs the weighted Gaussian selection of ``weighted_gaussian`` (Gopi et al., ICML
2020, Thm 5.1, grid weights and discrete Gaussian noise) on every user's keys minus the
keys released in earlier rounds, so a user's weight moves from the head keys found early
to the keys still hidden (adaptive weighting in the spirit of MAD2R, Chen et al. ICML
2025, and DP-SIPS, Swanberg et al. PoPETs 2023). Each round is a weighted Gaussian
selection for every fixed output of the rounds before it; the rounds and the count
column compose by basic composition (``accounting.adaptive``; docs/partition_selection.md,
"adaptive"). MAD's one-round re-routing is not implemented (its sensitivity proof is
not reproduced here): ``rounds: 1`` is refused.
"""
import pyarrow as pa

from accounting import adaptive as ad
from accounting import weighted_gaussian as wg
from pipelines import declare
from pipelines.errors import CalibrationError, SpecError
from pipelines.fields import optional_float

FIELDS = {
    "rounds": declare.integer(low=1, high=3, description=(
        f"number of selection rounds, 2 or 3 (default {ad.DEFAULT_ROUNDS}); round r "
        "selects among the keys not released before it")),
    "round_fractions": declare.array(
        declare.number(low=0, high=1, low_open=True, high_open=True), min_items=1,
        max_items=3, description=(
            "share of the selection's epsilon and delta per round, summing to 1 (default "
            + ", ".join(f"{list(v)} for {k} rounds" for k, v in
                        ad.DEFAULT_ROUND_FRACTIONS.items()) + ")")),
    "count_fraction": declare.number(low=0, high=1, low_open=True, high_open=True,
                                     description=(
        "share of epsilon and delta spent on the count column, in (0, 1) "
        f"(default {ad.DEFAULT_COUNT_FRACTION})")),
}
OUTPUT_COLUMNS = {"count": pa.int64()}
COUNT_STAGE = "count"
# The automatic bound's score reads the last round's threshold and sigma like
# weighted_gaussian's (pipelines.plan reads SCORE).
SCORE = "weighted_gaussian"
# Each round is a weighted Gaussian selection, whose noise does not grow with the bound:
# the automatic bound searches as far as weighted_gaussian's (docs/partition_selection.md).
AUTO_MAX_BOUND = 1024


def round_stage(index):
    """Stage names: round 1 is the plan's "release" stage, then "round_2", "round_3"."""
    return "release" if index == 0 else f"round_{index + 1}"


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
    return {"rounds": int(rounds), "round_fractions": list(fractions),
            "count_fraction": ad.DEFAULT_COUNT_FRACTION if fraction is None else fraction}


def check_spec(mechanism, input_spec, bounding, privacy):
    if input_spec.sample is not None:
        raise SpecError("input.sample", "adaptive needs the users' records (its rounds "
                        "re-weight each user's remaining keys); an existing sample has none")


def stage_budget(budget, mechanism):
    """Stages "release" (round 1), "round_2" (, "round_3") and "count": the count gets
    f_c of what is left, the rounds their round_fractions of the rest, computed as
    ``accounting.adaptive.stage_budgets`` does so the stages are what calibration spends."""
    eps, delta = budget.remaining_epsilon, budget.remaining_delta
    f_c = mechanism["count_fraction"]
    fractions = mechanism["round_fractions"]
    first = budget.spend(round_stage(0), eps * (1.0 - f_c) * fractions[0],
                         delta * (1.0 - f_c) * fractions[0])
    rounds, (count_eps, count_delta) = ad.stage_budgets(first.epsilon, first.delta, fractions, f_c)
    for i, (e, d) in enumerate(rounds[1:], start=1):
        budget.spend(round_stage(i), e, d)
    budget.spend(COUNT_STAGE, count_eps, count_delta)
    return first


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if model != "l0":
        raise SpecError("bounding.model", "adaptive needs bounding.model: l0 (each user "
                        "counted at most once per key)")
    try:
        p = ad.calibrate(epsilon, delta, max_keys_per_user, fractions=mech["round_fractions"],
                         count_fraction=mech["count_fraction"])
    except ValueError as exc:
        raise CalibrationError(f"adaptive release at round 1 epsilon={epsilon:g}, "
                               f"delta={delta:g}, max_keys_per_user={max_keys_per_user}: "
                               f"{exc} (mechanism.round_fractions / count_fraction)") from None
    rounds = [{"stage": round_stage(i), "sigma": r.sigma, "threshold": r.threshold_grid / p.scale,
               "threshold_grid": r.threshold_grid, "epsilon": r.epsilon,
               "delta_achieved": r.delta} for i, r in enumerate(p.rounds)]
    last = rounds[-1]
    return {"kind": "adaptive", "rounds": rounds, "scale": p.scale,
            "noise": "discrete_gaussian",
            # the last round's selection (the automatic bound's score reads these)
            "sigma": last["sigma"], "threshold": last["threshold"],
            "count_sigma": p.count_sigma,
            "accounting": f"{len(rounds)} rounds of weighted Gaussian selection (Gopi et al. "
                          f"2020, Thm 5.1) with grid weights floor({p.scale}/sqrt(t)) over each "
                          "user's keys not released in earlier rounds, discrete Gaussian noise: "
                          "per round exact per-t accounting (paper 004 Thm 5.4) given the "
                          "earlier rounds' output, rounds composed adaptively by basic "
                          "composition (docs/partition_selection.md, adaptive); count column: "
                          f"discrete Gaussian mechanism on <= {max_keys_per_user} counts of "
                          "released keys (stage 'count')",
            # the selection's delta: the rounds compose by basic composition, so the
            # sum of every round's achieved delta (each round's own in ``rounds``)
            "delta_achieved": sum(r["delta_achieved"] for r in rounds),
            "count_stage": {"epsilon": p.count_epsilon, "delta_achieved": p.count_delta},
            "round_fractions": list(mech["round_fractions"]),
            "count_fraction": mech["count_fraction"]}


def release_users(users, params, max_keys_per_user, key_columns, num_shards, mechanism,
                  rng_factory=None, spill_dir=None):
    """Whole-user shards -> released keys with counts (``pipelines.release`` calls this
    instead of bounding once and ``release``). ``mechanism``: the parsed section (the
    number of rounds fixes the pipeline's shape); ``params``: the calibrated section;
    ``spill_dir``: the per-key shuffles' spill folder (as ``SumCountsPerKey``'s)."""
    from transforms.adaptive_rounds import AdaptiveRelease
    return users | "AdaptiveRelease" >> AdaptiveRelease(
        key_columns, params, max_keys_per_user, mechanism["rounds"], num_shards,
        rng_factory=rng_factory, spill_dir=spill_dir)

"""Budget and calibration shared by the kinds built on several sample-and-threshold
histograms (``quantiles``: hierarchy levels or binary-search rounds; ``heavy_hitters``
uses only the stage and field helpers here: its trie is calibrated by
``accounting.sample_threshold.calibrate_trie``, one stage).

Paper 003 Lemma 4.1: L (epsilon_l, delta_l)-DP histograms compose to (L epsilon_l,
L delta_l) (basic composition, adaptive choices allowed). The plan records one stage per
histogram with (epsilon / L, delta / L), so the report's stages add up to the spec's
budget; ``accounting.sample_threshold.calibrate_levels`` then finds one (sampling_rate,
threshold) meeting each level's share exactly (hockey-stick divergence of thresholded
Bin(k, p) vs Bin(k - 1, p) per contribution, group privacy over a user's at most C
contributions to the level) and reports the delta each level actually spends.
"""
import collections

from thresher.accounting import sample_threshold
from thresher.pipelines.common import declare
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.common.fields import integer

StageTotal = collections.namedtuple("StageTotal", "epsilon delta")


def spend_levels(budget, names):
    """Record one stage per name with an equal share of what is left; returns the total."""
    eps, delta = budget.remaining_epsilon, budget.remaining_delta
    n = len(names)
    for name in names:
        budget.spend(name, eps / n, delta / n)
    return StageTotal(eps, delta)


def refuse_auto_bound(bounding, kind):
    if bounding.max_keys_per_user == "auto":
        raise SpecError("bounding.max_keys_per_user",
                        f"must be a positive integer for {kind} (auto is not supported: the "
                        f"private choice of C is defined for per-key counts only)")
    if bounding.model != "l0":
        raise SpecError("bounding.model", f"{kind} needs bounding.model: l0")


SAMPLING_RATE = declare.number(low=0, low_open=True, high=1, description=(
    "p in (0, 1], the same at every level (optional; calibrated if absent)"))
THRESHOLD = declare.integer(low=1, high=10**9, description=(
    "tau >= 1, the same at every level (optional; calibrated if absent; a given one is at "
    "most 100, the planning limit: docs/performance.md)"))


def optional_threshold(section):
    """mechanism.threshold as THRESHOLD declares it (checked here too for a kind that
    declares it by description only)."""
    value = section.get("threshold")
    return None if value is None else integer(value, "mechanism.threshold", low=1, high=10**9)


def fixed_fields(mech):
    """The prefix of a refusal that names the spec's fixed fields that missed the budget
    ("mechanism.sampling_rate, mechanism.threshold: "), or "" when the plan chose them."""
    given = [f"mechanism.{f}" for f in ("sampling_rate", "threshold") if mech.get(f) is not None]
    return ", ".join(given) + ": " if given else ""


def calibrate(mech, *, epsilon, delta, levels, max_keys_per_user, what):
    try:
        return sample_threshold.calibrate_levels(
            epsilon, delta, levels, max_keys_per_user,
            sampling_rate=mech.get("sampling_rate"), threshold=mech.get("threshold"))
    except ValueError as exc:
        raise CalibrationError(f"{what} at epsilon={epsilon:g}, delta={delta:g}, "
                               f"max_keys_per_user={max_keys_per_user} over {levels} "
                               f"level(s): {exc}") from None


def report_section(params):
    """The calibrated parameters of a LevelParams, for the report's mechanism section."""
    return {"levels": params.levels,
            "sampling_rate": params.sampling_rate,
            "threshold": params.threshold,
            "release_point": params.threshold / params.sampling_rate,
            "level_epsilon": params.level_epsilon,
            "level_delta": params.level_delta_spent,
            "unit_epsilon": params.unit.epsilon,
            "unit_delta": params.unit.delta_spent,
            "delta_achieved": params.delta_spent,
            "calibrated": list(params.unit.calibrated)}


def accounting(unit):
    """The report's accounting text; ``unit`` names one contribution, e.g. "(user, key)"."""
    return ("sample-and-threshold (paper 003) per level: exact hockey-stick divergence of "
            f"thresholded Bin(k, p) vs Bin(k-1, p) for one {unit} contribution, group privacy "
            "over a user's contributions to the level (contributions_per_level); levels "
            "composed by basic composition (paper 003 Lemma 4.1), one stage each")

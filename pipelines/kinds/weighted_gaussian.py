"""``mechanism.kind: weighted_gaussian`` — weighted Gaussian partition selection with counts.

Gopi et al., "Differentially Private Set Union" (ICML 2020), Thm 5.1, on a fixed-point
grid with discrete Gaussian noise: each user keeps at most Delta0 = max_keys_per_user
keys and gives each the weight floor(S/sqrt(t))/S (t = keys kept); a key is released
when its noisy total weight reaches ``threshold``. Accounting: ``accounting.weighted_gaussian``
(paper 004's Thm 5.4, per t, for the grid weights and the discrete noise drawn). Every
released key carries ``count``, its distinct-user count plus independent discrete
Gaussian noise: a second stage ("count") of the budget, composed by basic composition
with the selection ("release"); a user counts in at most ``count_keys_per_user`` of its
kept keys. docs/partition_selection.md has the derivation and (section 5) the
measurements behind the defaults: ``bounding.auto.max_bound`` 1024 (AUTO_MAX_BOUND),
``count_fraction`` 0.1 and ``count_keys_per_user`` 128.
"""
import dataclasses

import numpy as np
import pyarrow as pa

from thresher.accounting import weighted_gaussian as wg
from thresher.accounting.weighted_gaussian import grid_weight, sf_upper
from thresher.pipelines.common import limits
from thresher.pipelines.kinds._words import number
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.kinds.base import CountsKind
from thresher.pipelines.common import declare
from thresher.pipelines.common.fields import optional_float, optional_int

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "weighted_gaussian"

# sigma * S must stay within the planning limit of the exact tails (pipelines.common.limits).
SIGMA_MAX = 1e5 / wg.WEIGHT_SCALE
# Defaults of this kind (docs/partition_selection.md section 5, measured on the docstring
# corpus): the selection's noise does not grow with the bound, so the automatic bound
# searches up to 1024 (20 candidates; the plan calibrates them in a few seconds); most of
# the budget goes to the selection (count_fraction 0.1), and the count column, whose
# noise does grow with the keys a user counts in, caps those at 128 (no cap below it:
# at bounds <= 128 the counts are those of every kept key).
AUTO_MAX_BOUND = 1024
DEFAULT_COUNT_FRACTION = 0.1
DEFAULT_COUNT_KEYS_PER_USER = 128

FIELDS = {
    "sigma": declare.number(low=0, low_open=True, high=SIGMA_MAX, description=(
        "selection noise standard deviation in user weights (a user's weights have "
        "l2 norm 1; optional, calibrated if absent)")),
    "threshold": declare.number(low=0, low_open=True, high=1e6, description=(
        "noisy total weight a key needs to be released (optional; calibrated if absent)")),
    "count_fraction": declare.number(low=0, high=1, low_open=True, high_open=True,
                                     description=(
        "share of epsilon and delta spent on the count column, in (0, 1) "
        f"(default {DEFAULT_COUNT_FRACTION})")),
    "count_keys_per_user": declare.integer(low=1, high=10**7, description=(
        "a user counts in the count column for at most this many of its kept keys "
        f"(chosen uniformly at random; default {DEFAULT_COUNT_KEYS_PER_USER})")),
}
OUTPUT_COLUMNS = {"count": pa.int64()}
COUNT_STAGE = "count"


@dataclasses.dataclass(frozen=True)
class WeightedGaussianParams:
    """The parsed section (:func:`parse`) as its readers outside this module see it."""
    count_fraction: float                           # share of (epsilon, delta) for counts
    count_keys_per_user: int                        # C_c: counts per user
    sigma: float | None = None                      # selection noise: given, else calibrated
    threshold: float | None = None                  # in user weights: given, else calibrated


def parse(section):
    sigma = optional_float(section, "sigma")
    threshold = optional_float(section, "threshold")
    fraction = optional_float(section, "count_fraction")
    count_keys = optional_int(section, "count_keys_per_user")
    return {"sigma": sigma, "threshold": threshold,
            "count_fraction": DEFAULT_COUNT_FRACTION if fraction is None else fraction,
            "count_keys_per_user": (DEFAULT_COUNT_KEYS_PER_USER if count_keys is None
                                    else count_keys)}


def bound_options(mechanism):
    """Keyword arguments of WeightedPerUserBound beyond the bound (the kind's
    ``per_user_bound``)."""
    return {"count_keys_per_user": mechanism["count_keys_per_user"]}


def stage_budget(budget, mechanism):
    """Two stages: "release" (the key selection) gets (1 - f) of what is left and
    "count" f of it, computed as ``accounting.weighted_gaussian.count_budget`` does so
    the stages are exactly what the calibration spends."""
    eps, delta = budget.remaining_epsilon, budget.remaining_delta
    f = mechanism["count_fraction"]
    release = budget.spend("release", eps * (1.0 - f), delta * (1.0 - f))
    count_eps, count_delta = wg.count_budget(release.epsilon, release.delta, f)
    budget.spend(COUNT_STAGE, count_eps, count_delta)
    return release


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if model != "l0":
        raise SpecError("bounding.model", "weighted_gaussian needs bounding.model: l0 "
                        "(each user counted at most once per key)")
    count_eps, count_delta = wg.count_budget(epsilon, delta, mech["count_fraction"])
    try:
        p = wg.calibrate(epsilon, delta, max_keys_per_user, sigma=mech.get("sigma"),
                         threshold=mech.get("threshold"), count_epsilon=count_eps,
                         count_delta=count_delta,
                         count_keys_per_user=mech["count_keys_per_user"])
    except ValueError as exc:
        text = str(exc)
        field, _, message = text.partition(": ")
        if field in ("sigma", "threshold", "count_fraction") and mech.get(field) is not None:
            raise SpecError(f"mechanism.{field}", message) from None
        raise CalibrationError(f"weighted_gaussian release at epsilon={epsilon:g}, "
                               f"delta={delta:g}, max_keys_per_user={max_keys_per_user}: "
                               f"{text}") from None
    return {"kind": NAME, "sigma": p.sigma, "threshold": p.threshold,
            "threshold_grid": p.threshold_grid, "scale": p.scale,
            "noise": "discrete_gaussian",
            "count_sigma": p.count_sigma,
            "accounting": "weighted Gaussian selection (Gopi et al. 2020, Thm 5.1) with grid "
                          f"weights floor({p.scale}/sqrt(t)) and discrete Gaussian noise "
                          "sigma*scale: exact per-t Gaussian sparse histogram accounting "
                          "(paper 004 Thm 5.4, docs/partition_selection.md); count column: "
                          f"discrete Gaussian mechanism on <= {p.count_keys_per_user} counts "
                          "(stage 'count')",
            "delta_achieved": p.delta,
            "count_stage": {"epsilon": p.count_epsilon, "delta_achieved": p.count_delta,
                            "counts_per_user": p.count_keys_per_user},
            "count_fraction": mech["count_fraction"],
            "count_keys_per_user": mech["count_keys_per_user"]}


def release(counts, params, key_columns, rng_factory=None):
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    # heavy: apache_beam
    from thresher.transforms.selection.weighted_threshold import WeightedThreshold
    return counts | "WeightedThreshold" >> WeightedThreshold(
        params, rng_factory=child(rng_factory, "WeightedThreshold"))


class WeightedGaussian(CountsKind):
    """Weighted Gaussian partition selection with counts (module docstring)."""
    name = NAME
    INTERVAL = "count_stage"
    FIELDS, OUTPUT_COLUMNS, AUTO_MAX_BOUND = FIELDS, OUTPUT_COLUMNS, AUTO_MAX_BOUND
    parse = staticmethod(parse)
    bound_options = staticmethod(bound_options)
    calibrate = staticmethod(calibrate)
    release = staticmethod(release)
    SCORE = "weighted_gaussian"          # the V(C) score model of the automatic bound
    MAX_KEYS = limits.WEIGHTED_GAUSSIAN_MAX_KEYS
    PARAMS = WeightedGaussianParams

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        limits.check_weighted_gaussian(spec, self.params(spec.mechanism), epsilon, delta,
                                       max_keys_per_user)

    def per_user_bound(self):
        """The bounding with weights,
        ``transforms.selection.weighted_threshold.WeightedPerUserBound`` (imported here: the
        transforms import Beam, which plan, validate and schema never need)."""
        # heavy: apache_beam
        from thresher.transforms.selection.weighted_threshold import WeightedPerUserBound
        return WeightedPerUserBound

    def stage_budget(self, budget, mechanism, *, public_domain=False):
        return stage_budget(budget, mechanism)

    def privacy_record(self, mechanism, stages, max_keys_per_user):
        """``accounting.zcdp.weighted_gaussian_record``: the selection and the count column."""
        from thresher.accounting import zcdp  # heavy: start-up of thresher schema
        return zcdp.weighted_gaussian_record(mechanism, stages, max_keys_per_user)

    def release_probability(self, report, counts):
        """n users that each kept max_keys_per_user keys (the lightest weight, q_C): the
        curve of the heaviest users; lighter users need fewer co-holders."""
        mech = report["mechanism"]
        q = grid_weight(int(report["bounding"]["max_keys_per_user"]), mech["scale"])
        sd = mech["sigma"] * mech["scale"]
        return np.asarray([sf_upper(mech["threshold_grid"] - int(k) * q, sd) if k > 0 else 0.0
                           for k in counts], dtype=np.float64)

    def noise_words(self, report, key, unit):
        mech, c = report["mechanism"], report["bounding"]["max_keys_per_user"]
        return [f"selection: each user gives each of their t kept keys the weight "
                f"1/sqrt(t); a {key} is released when its total weight plus discrete "
                f"Gaussian noise (sigma {number(mech['sigma'])}) reaches "
                f"{number(mech['threshold'])}; its count of {unit} gets discrete Gaussian "
                f"noise with sigma {number(mech['count_sigma'])}"], f"{unit} with {c} keys each"

    def expected_error_words(self, params):
        # heavy: start-up of thresher schema
        from thresher.accounting.aggregates import expected_abs_gaussian
        if "count_sigma" not in params:
            return []
        return [f"expected error: E|noise| of a count "
                f"{expected_abs_gaussian(params['count_sigma']):.3g}"]


KIND = WeightedGaussian()

"""``mechanism.kind: laplace`` — Laplace thresholding (paper 002 Alg. 3, and its l0 form).

l1 model (``bounding.model: l1``): rand-clip each user to C records, add discrete
Laplace noise of scale C/epsilon to every non-zero key count, release above tau*.
l0 model: each user in at most C keys once each; scale C/epsilon, tau* from delta.
Both calibrated by ``accounting.laplace_threshold.calibrate`` for the discrete Laplace
actually drawn.
"""
import dataclasses

import numpy as np
import pyarrow as pa

from thresher.accounting import laplace_threshold
from thresher.accounting.laplace_threshold import log_suppress
from thresher.pipelines.common import limits
from thresher.pipelines.kinds._words import number, threshold_words
from thresher.pipelines.errors import SpecError
from thresher.pipelines.kinds.base import LAPLACE_NOISE, RELEASE_STAGE, CountsKind
from thresher.pipelines.common import declare
from thresher.pipelines.common.fields import optional_float
from thresher.pipelines.kinds._common import (calibration, pre_threshold, pre_threshold_field,
                                     public_domain_calibration)
from thresher.pipelines.dataio.public_keys import MECHANISM_FIELDS, parse_mechanism_fields

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "laplace"

FIELDS = {
    "pre_threshold": pre_threshold_field("keys with fewer users (l0) or records (l1) are "
                                         "never released (integer >= 1, default 1)"),
    "scale": declare.number(low=0, low_open=True, description=(
        "Laplace scale b in users (optional; default sensitivity/epsilon)")),
    "threshold": declare.number(description=(
        "tau*: noisy counts below it are suppressed (optional; calibrated if absent)")),
    **MECHANISM_FIELDS,
}
OUTPUT_COLUMNS = {"count": pa.int64()}



@dataclasses.dataclass(frozen=True)
class LaplaceParams:
    """The parsed section (:func:`parse`, with ``public_keys`` set by the loader for a
    release over ``input.public_keys``) as its readers outside this module see it."""
    pre_threshold: int                      # tau
    scale: float | None = None              # given, else calibrated
    threshold: float | None = None          # tau*: given, else calibrated
    public_keys: bool = False
    debias: str | None = None               # pipelines.dataio.public_keys.MECHANISM_FIELDS
    num_users: int | None = None
    clamp_negative: bool = False

def parse(section):
    tau = pre_threshold(section)
    scale = optional_float(section, "scale")
    threshold = optional_float(section, "threshold")
    if threshold is not None and threshold < tau:
        raise SpecError("mechanism.threshold", f"must be >= pre_threshold ({tau}), got {threshold:g}")
    return {**parse_mechanism_fields(section), "pre_threshold": tau, "scale": scale, "threshold": threshold}


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if mech.get("public_keys"):
        return public_domain_calibration(mech, kind=NAME, noise="laplace", epsilon=epsilon,
                                         delta=delta, max_keys_per_user=max_keys_per_user,
                                         model=model)
    params = calibration(
        lambda: laplace_threshold.calibrate(
            epsilon, delta, max_keys_per_user, model=model, noise="discrete_laplace",
            pre_threshold=mech["pre_threshold"], scale=mech.get("scale"),
            threshold=mech.get("threshold")),
        f"laplace release at epsilon={epsilon:g}, delta={delta:g}, "
        f"max_keys_per_user={max_keys_per_user}, model={model}")
    threshold = float(params.threshold)
    return {"kind": NAME, "pre_threshold": int(params.pre_threshold),
            "scale": float(params.scale),
            "threshold": int(threshold) if threshold.is_integer() else threshold,
            "noise": "discrete_laplace", "model": model,
            "accounting": f"Laplace thresholding, {model} model (paper 002 Alg. 3"
                          f"{'' if model == 'l1' else ', l0/l_inf variant'}), exact for "
                          f"discrete Laplace noise",
            "delta_achieved": float(params.delta)}


def verify_calibration(params, mech, *, epsilon, delta, max_keys_per_user, model):
    """Forward check of a cached calibration (``pipelines.common.calibration_cache``): True only
    if ``params`` has ``calibrate``'s shape and fixed fields and the delta of its scale and
    threshold at ``epsilon`` (``accounting.laplace_threshold.delta``, one evaluation of the
    accounting the calibration searches over) is within ``delta`` and is the one reported.
    """
    if mech.get("public_keys") or type(params) is not dict:
        return False
    if set(params) != {"kind", "pre_threshold", "scale", "threshold", "noise", "model",
                       "accounting", "delta_achieved"}:
        return False
    tau, scale, threshold = params["pre_threshold"], params["scale"], params["threshold"]
    if (params["kind"] != NAME or params["noise"] != "discrete_laplace"
            or params["model"] != model or type(tau) is not int or tau != mech["pre_threshold"]
            or type(scale) is not float or type(threshold) not in (int, float)
            or not params["accounting"].startswith(f"Laplace thresholding, {model} model")):
        return False
    if mech.get("scale") is not None and scale != float(mech["scale"]):
        return False
    if mech.get("threshold") is not None and threshold != float(mech["threshold"]):
        return False
    achieved = laplace_threshold.delta(epsilon, scale, threshold, max_keys_per_user,
                                       model=model, noise="discrete_laplace", pre_threshold=tau)
    reported = params["delta_achieved"]
    return (achieved <= delta and type(reported) is float
            and abs(reported - achieved) <= 1e-9 * achieved)


def release(counts, params, key_columns, rng_factory=None):
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    from thresher.transforms.selection.noisy_threshold import NoisyThreshold  # heavy: apache_beam
    return counts | "NoisyThreshold" >> NoisyThreshold(
        params, rng_factory=child(rng_factory, "NoisyThreshold"))


def stage_budget(budget, mechanism, *, public_domain=False):
    """One stage, ``release``; over a public key domain discrete Laplace is pure
    epsilon-DP, so the release spends no delta."""
    if public_domain:
        return budget.spend(RELEASE_STAGE, budget.remaining_epsilon, 0.0)
    return budget.spend_rest(RELEASE_STAGE)


class Laplace(CountsKind):
    """Laplace thresholding (module docstring)."""
    name = NAME
    INTERVAL = "noisy_count"
    PUBLIC_DOMAIN_NOISE = AGGREGATE_NOISE = LAPLACE_NOISE
    PARAMS = LaplaceParams
    FIELDS, OUTPUT_COLUMNS = FIELDS, OUTPUT_COLUMNS
    parse = staticmethod(parse)
    calibrate = staticmethod(calibrate)
    verify_calibration = staticmethod(verify_calibration)
    release = staticmethod(release)

    def check_limits(self, mechanism):
        limits.check_laplace_fields(self.params(mechanism))

    def stage_budget(self, budget, mechanism, *, public_domain=False):
        return stage_budget(budget, mechanism, public_domain=public_domain)

    def score(self, model):
        """The automatic bound's score of the model: laplace_l1 or laplace_l0."""
        return "laplace_l1" if model == "l1" else "laplace_l0"

    def privacy_record(self, mechanism, stages, max_keys_per_user):
        """``accounting.zcdp.laplace_record`` (l0 and l1, with aggregates' sum columns)."""
        from thresher.accounting import zcdp  # heavy: start-up of thresher schema
        return zcdp.laplace_record(mechanism, stages, max_keys_per_user)

    def release_probability(self, report, counts):
        """n >= pre_threshold and n + Z >= threshold, Z discrete Laplace(scale) (paper 002
        Alg. 3): ``accounting.laplace_threshold.log_suppress``."""
        mech, n = report["mechanism"], counts
        p = -np.expm1(log_suppress(mech["scale"], mech["threshold"] - n, mech.get("noise", "discrete_laplace")))
        return np.where(n >= mech.get("pre_threshold", 1), p, 0.0)

    def public_noise_words(self, mechanism):
        return f"discrete Laplace noise (scale {number(mechanism['scale'])})"

    def noise_words(self, report, key, unit):
        return [threshold_words(report["mechanism"], key, unit,
                                f"discrete Laplace noise with scale "
                                f"{number(report['mechanism']['scale'])}")], unit

    def expected_error_words(self, params):
        # heavy: start-up of thresher schema
        from thresher.accounting.aggregates import expected_abs_laplace
        if "scale" not in params:
            return []
        return [f"expected error: E|noise| of a count {expected_abs_laplace(params['scale']):.3g}"]


KIND = Laplace()

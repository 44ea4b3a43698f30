"""``mechanism.kind: laplace`` — Laplace thresholding (paper 002 Alg. 3, and its l0 form).

l1 model (``bounding.model: l1``): rand-clip each user to C records, add discrete
Laplace noise of scale C/epsilon to every non-zero key count, release above tau*.
l0 model: each user in at most C keys once each; scale C/epsilon, tau* from delta.
Both calibrated by ``accounting.laplace_threshold.calibrate`` for the discrete Laplace
actually drawn.
"""
import pyarrow as pa

from thresher.accounting import laplace_threshold
from thresher.pipelines.errors import SpecError
from thresher.pipelines.specs import declare
from thresher.pipelines.specs.fields import optional_float
from thresher.pipelines.kinds._common import (calibration, pre_threshold, pre_threshold_field,
                                     public_domain_calibration)
from thresher.pipelines.dataio.public_keys import MECHANISM_FIELDS, parse_mechanism_fields
from thresher.transforms.noisy_threshold import NoisyThreshold

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


def parse(section):
    tau = pre_threshold(section)
    scale = optional_float(section, "scale")
    threshold = optional_float(section, "threshold")
    if threshold is not None and threshold < tau:
        raise SpecError("mechanism.threshold", f"must be >= pre_threshold ({tau}), got {threshold:g}")
    return {**parse_mechanism_fields(section), "pre_threshold": tau, "scale": scale, "threshold": threshold}


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if mech.get("public_keys"):
        return public_domain_calibration(mech, kind="laplace", epsilon=epsilon, delta=delta,
                                         max_keys_per_user=max_keys_per_user, model=model)
    params = calibration(
        lambda: laplace_threshold.calibrate(
            epsilon, delta, max_keys_per_user, model=model, noise="discrete_laplace",
            pre_threshold=mech["pre_threshold"], scale=mech.get("scale"),
            threshold=mech.get("threshold")),
        f"laplace release at epsilon={epsilon:g}, delta={delta:g}, "
        f"max_keys_per_user={max_keys_per_user}, model={model}")
    threshold = float(params.threshold)
    return {"kind": "laplace", "pre_threshold": int(params.pre_threshold),
            "scale": float(params.scale),
            "threshold": int(threshold) if threshold.is_integer() else threshold,
            "noise": "discrete_laplace", "model": model,
            "accounting": f"Laplace thresholding, {model} model (paper 002 Alg. 3"
                          f"{'' if model == 'l1' else ', l0/l_inf variant'}), exact for "
                          f"discrete Laplace noise",
            "delta_achieved": float(params.delta)}


def release(counts, params, key_columns):
    return counts | "NoisyThreshold" >> NoisyThreshold(params)

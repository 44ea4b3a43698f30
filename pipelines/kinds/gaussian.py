"""``mechanism.kind: gaussian`` — the Gaussian sparse histogram mechanism (paper 004).

Per key with user count c (after l0/l_inf bounding): dropped if c < pre_threshold;
otherwise c + v with v discrete Gaussian(sigma) is released when it reaches
``threshold`` (tau*). sigma and tau* are calibrated by ``accounting.gshm.calibrate`` with
the exact accounting of Thm 5.4 for the discrete Gaussian actually drawn.
"""
import math

import pyarrow as pa

from thresher.accounting import gshm, plain_gshm
from thresher.pipelines.errors import SpecError
from thresher.pipelines.specs import declare
from thresher.pipelines.specs.fields import optional_float
from thresher.pipelines.kinds._common import (calibration, pre_threshold, pre_threshold_field,
                                     public_domain_calibration)
from thresher.pipelines.dataio.public_keys import MECHANISM_FIELDS, parse_mechanism_fields

FIELDS = {
    "pre_threshold": pre_threshold_field("tau: keys with fewer users are never released "
                                         "(integer >= 1, default 1)"),
    "sigma": declare.number(low=0, low_open=True, description=(
        "noise standard deviation in users (optional; calibrated if absent)")),
    "threshold": declare.number(description=(
        "tau*: noisy counts below it are suppressed (optional; calibrated if absent)")),
    **MECHANISM_FIELDS,
}
OUTPUT_COLUMNS = {"count": pa.int64()}


def parse(section):
    tau = pre_threshold(section)
    sigma = optional_float(section, "sigma")
    threshold = optional_float(section, "threshold")
    if threshold is not None and threshold < tau:
        raise SpecError("mechanism.threshold", f"must be >= pre_threshold ({tau}), got {threshold:g}")
    return {**parse_mechanism_fields(section), "pre_threshold": tau, "sigma": sigma, "threshold": threshold}


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if model != "l0":
        raise SpecError("bounding.model", "the gaussian mechanism needs bounding.model: l0 "
                        "(each user counted at most once per key)")
    if mech.get("public_keys"):
        return public_domain_calibration(mech, kind="gaussian", epsilon=epsilon, delta=delta,
                                         max_keys_per_user=max_keys_per_user, model=model)
    params = calibration(
        lambda: gshm.calibrate(epsilon, delta, max_keys_per_user,
                               pre_threshold=mech["pre_threshold"], sigma=mech.get("sigma"),
                               threshold=mech.get("threshold"), noise="discrete_gaussian"),
        f"gaussian release at epsilon={epsilon:g}, delta={delta:g}, "
        f"max_keys_per_user={max_keys_per_user}")
    out = {"kind": "gaussian", "pre_threshold": int(params.pre_threshold),
           "sigma": float(params.sigma), "threshold": _int_if_whole(params.threshold),
           "noise": "discrete_gaussian", "accounting": ACCOUNTING,
           "delta_achieved": float(params.delta)}
    return out


ACCOUNTING = ("exact Gaussian sparse histogram accounting (paper 004 Thm 5.4) for discrete "
              "Gaussian noise")
# Relative gap allowed between the reported delta_achieved and the plain upper bound
# (they agree to ~1e-12 where the accounting uses Lemma A; a larger gap is recomputed).
_REPORT_TOLERANCE = 1e-6


def verify_calibration(params, mech, *, epsilon, delta, max_keys_per_user, model):
    """Forward check of a cached calibration (``pipelines.calibration_cache``): True only
    if ``params`` is what ``calibrate`` returns in shape and fixed fields and the plain-math
    upper bound on its delta (``accounting.plain_gshm``, paper 004 Thm 5.4; no SciPy) at
    ``epsilon`` is within ``delta``, and its reported delta_achieved is that delta."""
    if model != "l0" or mech.get("public_keys") or type(params) is not dict:
        return False
    if set(params) != {"kind", "pre_threshold", "sigma", "threshold", "noise", "accounting",
                       "delta_achieved"}:
        return False
    tau, sigma, threshold = params["pre_threshold"], params["sigma"], params["threshold"]
    if (params["kind"] != "gaussian" or params["noise"] != "discrete_gaussian"
            or params["accounting"] != ACCOUNTING or type(tau) is not int
            or tau != mech["pre_threshold"] or type(sigma) is not float
            or type(threshold) not in (int, float) or not float(threshold).is_integer()
            or threshold < tau):
        return False
    if mech.get("sigma") is not None and sigma != float(mech["sigma"]):
        return False
    if mech.get("threshold") is not None and threshold != tau + math.ceil(mech["threshold"] - tau):
        return False
    bound = plain_gshm.delta_upper(epsilon, sigma, threshold - tau, max_keys_per_user)
    reported = params["delta_achieved"]
    return (bound is not None and bound <= delta and type(reported) is float
            and bound * (1.0 - _REPORT_TOLERANCE) <= reported <= delta)


def _int_if_whole(x):
    return int(x) if float(x).is_integer() else float(x)


def release(counts, params, key_columns):
    from thresher.transforms.noisy_threshold import NoisyThreshold
    return counts | "NoisyThreshold" >> NoisyThreshold(params)

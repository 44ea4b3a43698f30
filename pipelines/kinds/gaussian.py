"""``mechanism.kind: gaussian`` — the Gaussian sparse histogram mechanism (paper 004).

Per key with user count c (after l0/l_inf bounding): dropped if c < pre_threshold;
otherwise c + v with v discrete Gaussian(sigma) is released when it reaches
``threshold`` (tau*). sigma and tau* are calibrated by ``accounting.gshm.calibrate`` with
the exact accounting of Thm 5.4 for the discrete Gaussian actually drawn.
"""
import pyarrow as pa

from thresher.accounting import gshm
from thresher.pipelines.errors import SpecError
from thresher.pipelines.specs import declare
from thresher.pipelines.specs.fields import optional_float
from thresher.pipelines.kinds._common import (calibration, pre_threshold, pre_threshold_field,
                                     public_domain_calibration)
from thresher.pipelines.dataio.public_keys import MECHANISM_FIELDS, parse_mechanism_fields
from thresher.transforms.noisy_threshold import NoisyThreshold

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
           "noise": "discrete_gaussian",
           "accounting": "exact Gaussian sparse histogram accounting (paper 004 Thm 5.4) "
                         "for discrete Gaussian noise",
           "delta_achieved": float(params.delta)}
    return out


def _int_if_whole(x):
    return int(x) if float(x).is_integer() else float(x)


def release(counts, params, key_columns):
    return counts | "NoisyThreshold" >> NoisyThreshold(params)

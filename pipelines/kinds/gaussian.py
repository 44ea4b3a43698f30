"""``mechanism.kind: gaussian`` — the Gaussian sparse histogram mechanism (paper 004).

Per key with user count c (after l0/l_inf bounding): dropped if c < pre_threshold;
otherwise c + v with v discrete Gaussian(sigma) is released when it reaches
``threshold`` (tau*). sigma and tau* are calibrated by ``accounting.gshm.calibrate`` with
the exact accounting of Thm 5.4 for the discrete Gaussian actually drawn.

``mechanism.noise``: ``discrete_gaussian`` (the default, above), ``correlated`` (v = Z + X:
one shared Z drawn once per release plus an independent X per key,
``accounting.correlated_gshm``; never a lower threshold when the key space is open, see
that module) or ``auto`` (both calibrated from (epsilon, delta, C, tau) alone; the lower
release point wins, discrete_gaussian on ties).
"""
import dataclasses
import math

import numpy as np
import pyarrow as pa

from thresher.accounting import correlated_gshm, fixed_order, gshm, plain_gshm
from thresher.accounting.discrete_gaussian import pmf, sf
from thresher.pipelines.common import limits
from thresher.pipelines.kinds._words import number, threshold_words
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.kinds.base import GAUSSIAN_NOISE, CountsKind
from thresher.pipelines.common import declare
from thresher.pipelines.common.fields import optional_float
from thresher.pipelines.kinds._common import (calibration, pre_threshold, pre_threshold_field,
                                     public_domain_calibration)
from thresher.pipelines.dataio.public_keys import MECHANISM_FIELDS, parse_mechanism_fields

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "gaussian"

NOISES = ("discrete_gaussian", "correlated", "auto")

FIELDS = {
    "pre_threshold": pre_threshold_field("tau: keys with fewer users are never released "
                                         "(integer >= 1, default 1)"),
    "sigma": declare.number(low=0, low_open=True, description=(
        "noise standard deviation in users (optional; calibrated if absent)")),
    "threshold": declare.number(description=(
        "tau*: noisy counts below it are suppressed (optional; calibrated if absent)")),
    "noise": declare.choice(NOISES, default="discrete_gaussian", description=(
        "discrete_gaussian (independent noise per key), correlated (a shared component "
        "drawn once per release plus independent noise per key; sigma not allowed) or auto "
        "(the lower release point of the two, from epsilon, delta, max_keys_per_user and "
        "pre_threshold alone)")),
    **MECHANISM_FIELDS,
}
OUTPUT_COLUMNS = {"count": pa.int64()}


@dataclasses.dataclass(frozen=True)
class GaussianParams:
    """The parsed section (:func:`parse`, with ``public_keys`` set by the loader for a
    release over ``input.public_keys``) as its readers outside this module see it."""
    pre_threshold: int                      # tau
    sigma: float | None = None              # given, else calibrated
    threshold: float | None = None          # tau*: given, else calibrated
    noise: str = "discrete_gaussian"        # one of NOISES
    public_keys: bool = False
    debias: str | None = None               # pipelines.dataio.public_keys.MECHANISM_FIELDS
    num_users: int | None = None
    clamp_negative: bool = False


def parse(section):
    tau = pre_threshold(section)
    sigma = optional_float(section, "sigma")
    threshold = optional_float(section, "threshold")
    if threshold is not None and threshold < tau:
        raise SpecError("mechanism.threshold", f"must be >= pre_threshold ({tau}), got {threshold:g}")
    noise = section.get("noise", "discrete_gaussian")
    if noise == "correlated" and sigma is not None:
        raise SpecError("mechanism.sigma", "does not apply with noise: correlated (two noise "
                        "scales, the shared and the independent one, are calibrated together); "
                        "remove it, or use noise: discrete_gaussian")
    out = {**parse_mechanism_fields(section), "pre_threshold": tau, "sigma": sigma,
           "threshold": threshold}
    if noise != "discrete_gaussian":
        out["noise"] = noise
    return out


def check_spec(mechanism, input_spec, bounding, privacy):
    """noise: correlated / auto is analysed for the counted path only (docs/partition_selection.md,
    "Correlated noise"): refused with input.public_keys."""
    if mechanism.get("noise") in ("correlated", "auto") and input_spec.public_keys is not None:
        raise SpecError("mechanism.noise", f"{mechanism['noise']} applies to a thresholded "
                        "release; with input.public_keys every key is released with "
                        "independent noise (use noise: discrete_gaussian)")
    return None


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if model != "l0":
        raise SpecError("bounding.model", "the gaussian mechanism needs bounding.model: l0 "
                        "(each user counted at most once per key)")
    if mech.get("public_keys"):
        return public_domain_calibration(mech, kind=NAME, noise="gaussian", epsilon=epsilon,
                                         delta=delta, max_keys_per_user=max_keys_per_user,
                                         model=model)
    noise = mech.get("noise", "discrete_gaussian")
    what = (f"gaussian release at epsilon={epsilon:g}, delta={delta:g}, "
            f"max_keys_per_user={max_keys_per_user}")
    if noise == "correlated":
        return _correlated(mech, epsilon, delta, max_keys_per_user, what, asked=True)
    params = calibration(
        lambda: gshm.calibrate(epsilon, delta, max_keys_per_user,
                               pre_threshold=mech["pre_threshold"], sigma=mech.get("sigma"),
                               threshold=mech.get("threshold"), noise="discrete_gaussian"),
        what)
    out = {"kind": NAME, "pre_threshold": int(params.pre_threshold),
           "sigma": float(params.sigma), "threshold": _int_if_whole(params.threshold),
           "noise": "discrete_gaussian", "accounting": ACCOUNTING,
           "delta_achieved": float(params.delta)}
    if noise == "auto":
        return _auto(out, mech, epsilon, delta, max_keys_per_user, what)
    return out


def _correlated(mech, epsilon, delta, max_keys_per_user, what, asked=False):
    """``asked``: the spec says ``noise: correlated`` (not ``auto``, which then compares
    and keeps discrete_gaussian): a threshold the shared part cannot help is the spec's
    error, named by its field (issue 42)."""
    def call():
        try:
            return correlated_gshm.calibrate(epsilon, delta, max_keys_per_user,
                                             pre_threshold=mech["pre_threshold"],
                                             threshold=mech.get("threshold"))
        except correlated_gshm.SharedPartOnlyAddsNoise as exc:
            if asked:
                raise SpecError("mechanism.noise", str(exc)) from None
            raise
    params = calibration(call, what + ", noise correlated")
    return {"kind": NAME, "pre_threshold": int(params.pre_threshold),
            "sigma": float(params.sigma), "shared_sigma": float(params.shared_sigma),
            "threshold": int(params.threshold), "noise": correlated_gshm.NOISE,
            "accounting": CORRELATED_ACCOUNTING, "delta_achieved": float(params.delta)}


def _auto(independent, mech, epsilon, delta, max_keys_per_user, what):
    """noise: auto: the lower release point of the two calibrations (both functions of
    (epsilon, delta, C, tau) and the spec's threshold only); discrete_gaussian on ties, with
    a user-set sigma (it names the independent noise's scale) and above the correlated
    planning limit. The comparison is part of the report (public parameters only)."""
    chosen = independent
    compared = {"discrete_gaussian": correlated_gshm.release_point(independent["threshold"])}
    if mech.get("sigma") is None and max_keys_per_user <= correlated_gshm.MAX_KEYS:
        try:
            other = _correlated(mech, epsilon, delta, max_keys_per_user, what)
        except CalibrationError:
            other = None
        if other is not None:
            compared["correlated"] = correlated_gshm.release_point(other["threshold"])
            if compared["correlated"] < compared["discrete_gaussian"]:
                chosen = other
    return {**chosen, "noise_auto": {"release_points": compared,
                                     "chosen": chosen["noise"]}}


ACCOUNTING = ("exact Gaussian sparse histogram accounting (paper 004 Thm 5.4) for discrete "
              "Gaussian noise")
CORRELATED_ACCOUNTING = (
    "correlated discrete Gaussian noise (Lebeda & Retschmeier, \"The Correlated Gaussian "
    "Sparse Histogram Mechanism\" (FORC 2025)): a shared "
    "component (shared_sigma) drawn once per release plus independent noise (sigma) per key; "
    "delta is the mixture over the shared draw of paper 004 Thm 5.4's exact delta "
    "(accounting.correlated_gshm, Theorem 1)")
# its citation in the text above matches citations.PAPERS["LR25"] (cited_papers finds it)
# Relative gap allowed between the reported delta_achieved and the plain upper bound
# (they agree to ~1e-12 where the accounting uses Lemma A; a larger gap is recomputed).
_REPORT_TOLERANCE = 1e-6


def verify_calibration(params, mech, *, epsilon, delta, max_keys_per_user, model):
    """Forward check of a cached calibration (``pipelines.common.calibration_cache``): True only
    if ``params`` is what ``calibrate`` returns in shape and fixed fields and the plain-math
    upper bound on its delta (``accounting.plain_gshm``, paper 004 Thm 5.4; no SciPy) at
    ``epsilon`` is within ``delta``, and its reported delta_achieved is that delta (the
    bound by ``plain_gshm.delta_upper_below``: the same answer as ``delta_upper``, cheaper,
    and within its term budget at every candidate of an automatic bound)."""
    if model != "l0" or mech.get("public_keys") or type(params) is not dict:
        return False
    if mech.get("noise", "discrete_gaussian") != "discrete_gaussian":
        return False      # correlated / auto: no plain-math check; always recalibrated
    if set(params) != {"kind", "pre_threshold", "sigma", "threshold", "noise", "accounting",
                       "delta_achieved"}:
        return False
    tau, sigma, threshold = params["pre_threshold"], params["sigma"], params["threshold"]
    if (params["kind"] != NAME or params["noise"] != "discrete_gaussian"
            or params["accounting"] != ACCOUNTING or type(tau) is not int
            or tau != mech["pre_threshold"] or type(sigma) is not float
            or type(threshold) not in (int, float) or not float(threshold).is_integer()
            or threshold < tau):
        return False
    if mech.get("sigma") is not None and sigma != float(mech["sigma"]):
        return False
    if mech.get("threshold") is not None and threshold != tau + math.ceil(mech["threshold"] - tau):
        return False
    reported = params["delta_achieved"]
    if type(reported) is not float or not reported <= delta:
        return False
    # plain_gshm.delta_upper by branch and bound: the terms at most ``reported`` are
    # dismissed by range (gshm delta <= max(bound, reported) <= delta), and the bound is
    # delta_upper's value wherever that is above ``reported``, so the check passes exactly
    # when "delta_upper <= delta and reported within _REPORT_TOLERANCE of it" does, and
    # also reaches the large bounds (C >= 64 at delta 1e-8) delta_upper gives up on
    bound = plain_gshm.delta_upper_below(epsilon, sigma, threshold - tau, max_keys_per_user,
                                         level=reported)
    return (bound is not None and bound <= delta
            and bound * (1.0 - _REPORT_TOLERANCE) <= reported)


def _int_if_whole(x):
    return int(x) if float(x).is_integer() else float(x)


def release(counts, params, key_columns, rng_factory=None):
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    from thresher.transforms.selection.noisy_threshold import NoisyThreshold  # heavy: apache_beam
    return counts | "NoisyThreshold" >> NoisyThreshold(
        params, rng_factory=child(rng_factory, "NoisyThreshold"))


class Gaussian(CountsKind):
    """The Gaussian sparse histogram mechanism (module docstring)."""
    name = NAME
    INTERVAL = "noisy_count"
    PUBLIC_DOMAIN_NOISE = AGGREGATE_NOISE = GAUSSIAN_NOISE
    FIELDS, OUTPUT_COLUMNS, NOISES = FIELDS, OUTPUT_COLUMNS, NOISES
    PARAMS = GaussianParams
    parse = staticmethod(parse)
    check_spec = staticmethod(check_spec)
    calibrate = staticmethod(calibrate)
    verify_calibration = staticmethod(verify_calibration)
    release = staticmethod(release)
    SCORE = "gaussian"          # the V(C) score model of the automatic bound
    CONTINUAL = True            # pipelines.continual: its counts, tree-aggregated noise

    def check_limits(self, mechanism):
        limits.check_gaussian_fields(self.params(mechanism))

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        limits.check_gaussian_release(spec, epsilon, delta, max_keys_per_user, field,
                                      self.MAX_KEYS)

    def privacy_record(self, mechanism, stages, max_keys_per_user):
        """``accounting.zcdp.gaussian_record``: independent noise, over public keys, or
        (noise: correlated) the shared draw's own record."""
        from thresher.accounting import zcdp  # heavy: start-up of thresher schema
        return zcdp.gaussian_record(mechanism, stages, max_keys_per_user)

    def release_probability(self, report, counts):
        """n >= pre_threshold and n + Z >= threshold, Z discrete Gaussian(sigma) (paper 004
        Alg. 1): ``accounting.discrete_gaussian.sf``; with correlated noise summed over
        the shared draw z."""
        mech, n = report["mechanism"], counts
        if mech.get("noise") == "correlated":     # sum over the shared draw z
            k = int(np.ceil(38.6 * mech["shared_sigma"])) + 1
            z = np.arange(-k, k + 1)
            grid = mech["threshold"] - n[:, None] - z[None, :]
            p = np.asarray(sf(grid.ravel(), mech["sigma"]), dtype=np.float64).reshape(grid.shape)
            p = fixed_order.matvec(p, pmf(z, mech["shared_sigma"]))   # no BLAS
        else:
            p = np.asarray(sf(mech["threshold"] - n, mech["sigma"]), dtype=np.float64)
        return np.where(n >= mech.get("pre_threshold", 1), p, 0.0)

    def check_aggregates(self, mechanism):
        if self.noise(mechanism) in ("correlated", "auto"):
            raise SpecError("mechanism.noise", f"{mechanism['noise']} is not analysed with "
                            "aggregates (the sums' noise is calibrated with independent count "
                            "noise); use noise: discrete_gaussian")

    def interval_notes(self, mechanism):
        if self.noise(mechanism) not in ("correlated", "auto"):
            return {}
        return {"correlated": (
            "with noise: correlated the noise law is the exact convolution of the shared and "
            "the independent discrete Gaussian; every key's interval holds for that key, but "
            "the errors of different keys share one draw: they are correlated, so misses "
            "come together rather than as independent 1 - confidence fractions (when the "
            "noise chosen by auto is discrete_gaussian the errors are independent)")}

    def public_noise_words(self, mechanism):
        return f"discrete Gaussian noise (sigma {number(mechanism['sigma'])})"

    def noise_words(self, report, key, unit):
        return [threshold_words(report["mechanism"], key, unit,
                                 f"discrete Gaussian noise with sigma "
                                 f"{number(report['mechanism']['sigma'])}")], unit

    def expected_error_words(self, params):
        # heavy: start-up of thresher schema
        from thresher.accounting.aggregates import expected_abs_gaussian
        if "sigma" not in params:
            return []
        sd = math.hypot(params["sigma"], params.get("shared_sigma", 0.0))  # shared + own
        return [f"expected error: E|noise| of a count {expected_abs_gaussian(sd):.3g}"]


KIND = Gaussian()

"""``mechanism.kind: weighted_sampling`` — private weighted sampling (PWS, paper 001).

Per key with user count w (after l0/l_inf bounding): the key is reported with the optimal
end-to-end probability pi_w of PWS Alg. 3 for the chosen sampling scheme (none: a private
histogram; ppswor / priority threshold sampling with threshold t), and, with
``report: keys_and_frequencies``, a sanitized frequency token j drawn from the row
pi_{w,.} of Alg. 4 plus an estimate of w (MLE, eq. 11, or biased-down, Appendix E).
Sampling and sanitizing happen in one step with the end-to-end probabilities.

Each key's sanitizer is (eps0, delta0)-DP between neighbouring counts; a user touches at
most C keys, changing each by one, so the release composes C such mechanisms
(``accounting.pws.per_key_budget``: exact optimal composition, or basic). The tables are
verified exactly for the distributions actually sampled (``accounting.pws.realized_delta``).
``composition: pld`` (the default with ``report: keys``) builds the keep table for a
Gaussian per-key tradeoff instead and composes the keys' privacy-loss distributions
(``accounting.pws.pld``), falling back to the optimal tables where they are not better.

Post-processing path (PWS §1.1): :func:`sanitize_existing_sample` releases the private
version of an existing non-private weighted sample (a table of key columns and a frequency
column, drawn with a declared scheme and threshold), without the original data.
"""
import dataclasses

import numpy as np
import pyarrow as pa

from thresher.accounting import pws
from thresher.pipelines.common import limits
from thresher.pipelines.errors import SpecError
from thresher.pipelines.common import declare
from thresher.pipelines.kinds import _sample_fields
from thresher.pipelines.kinds.base import CountsKind
from thresher.pipelines.kinds._common import calibration

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "weighted_sampling"

FIELDS = {
    "sampling": declare.choice(pws.SAMPLING_SCHEMES, default="none", description=(
        "weighted sampling scheme: none (a private histogram), ppswor or priority (default "
        "none)")),
    "sampling_threshold": declare.number(low=0, low_open=True, description=(
        "t > 0, required for ppswor and priority: a key of count w is sampled with "
        "1 - exp(-w t) (ppswor) or min(1, w t) (priority)")),
    "report": declare.choice(pws.REPORTS, default="keys_and_frequencies", description=(
        "keys or keys_and_frequencies (default keys_and_frequencies: also a sanitized "
        "frequency token and an estimate per key)")),
    "estimator": declare.choice(pws.ESTIMATORS, default="mle", description=(
        "mle or biased_down (default mle): how the estimate column is computed from the "
        "token (paper 001 eq. 11 / Appendix E)")),
    "composition": declare.choice(pws.COMPOSITIONS, description=(
        "pld, optimal or basic (default pld with report: keys, optimal with "
        "keys_and_frequencies): how a user's <= max_keys_per_user keys compose; pld "
        "(report: keys only) composes the keys' privacy-loss distributions (Gaussian-"
        "tradeoff tables, never worse than optimal)")),
    "max_frequency": declare.one_of(
        declare.const("auto"), declare.integer(low=2, high=pws.MAX_KEEP_LENGTH),
        default="auto", description=(
            "auto or an integer >= 2 (default auto): size of the probability tables; larger "
            "counts are treated as this one (auto: where every key is reported)")),
}
# transforms.selection.sanitize_sample.OUTPUT_COLUMNS (not imported here: the transforms import Beam,
# which plan, validate and schema never need; tests/pipelines/test_cli_command_imports.py
# checks the two agree)
OUTPUT_COLUMNS = {"token": pa.int64(), "estimate": pa.float64()}

# input.sample (declared in _sample_fields: the loader reads it without numerics).
SAMPLE_FIELDS = _sample_fields.SAMPLE_FIELDS

_ACCOUNTING = {
    "optimal": "PWS end-to-end probabilities (paper 001 Alg. 3/4) per key at (eps0, delta0), "
               "verified exactly for the sampled distributions; a user's <= C keys composed "
               "exactly (optimal composition, Kairouz-Oh-Viswanath 2015 Thm 3.3)",
    "pld": "PWS reporting probabilities for the per-key tradeoff max(0, G_mu - delta0) "
           "(accounting.pws.pld, eq. (2)), every pair of neighbouring counts verified for the "
           "sampled coins; a user's <= C keys composed by Blackwell domination: delta <= "
           "1 - (1 - delta0)^C + delta_G(eps; mu sqrt C)",
    "pld (optimal tables)": "composition pld fell back to the optimal tables (no better "
           "here): PWS end-to-end probabilities (paper 001 Alg. 3) per key at (eps0, delta0), "
           "verified exactly for the sampled distributions; a user's <= C keys composed "
           "exactly (optimal composition, Kairouz-Oh-Viswanath 2015 Thm 3.3)",
    "basic": "PWS end-to-end probabilities (paper 001 Alg. 3/4) per key at (epsilon/C, delta/C), "
             "verified exactly for the sampled distributions; basic composition over a user's "
             "<= C keys",
    "single key": "PWS end-to-end probabilities (paper 001 Alg. 3/4), verified exactly for the "
                  "sampled distributions; each user touches one key",
}



@dataclasses.dataclass(frozen=True)
class WeightedSamplingParams:
    """The parsed section (:func:`parse`; with ``presampled`` from
    :func:`mechanism_for_sample` for an existing sample) as its readers outside this
    module see it."""
    sampling: str = "none"                          # none, ppswor or priority
    sampling_threshold: float | None = None         # t (ppswor, priority)
    report: str = "keys_and_frequencies"
    estimator: str = "mle"
    composition: str = "optimal"
    max_frequency: int | str = "auto"               # M, or "auto" (where pi reaches 1)
    presampled: bool = False                        # input.sample: the threshold's field

def parse(section):
    sampling = section.get("sampling", "none")
    threshold = section.get("sampling_threshold")
    if sampling == "none":
        if threshold is not None:
            raise SpecError("mechanism.sampling_threshold",
                            "is only allowed with sampling: ppswor or priority")
    else:
        if threshold is None:
            raise SpecError("mechanism.sampling_threshold",
                            f"is required with sampling: {sampling} (a number > 0)")
        threshold = float(threshold)
    report = section.get("report", "keys_and_frequencies")
    estimator = section.get("estimator", "mle")
    if "estimator" in section and report == "keys":
        raise SpecError("mechanism.estimator", "is only used with report: keys_and_frequencies")
    composition = section.get("composition") or ("pld" if report == "keys" else "optimal")
    if composition == "pld" and report != "keys":
        raise SpecError("mechanism.composition", "pld needs report: keys (the frequency tokens "
                        "of Alg. 4 are built for an (eps0, delta0) per-key budget); use "
                        "composition: optimal or basic")
    max_frequency = section.get("max_frequency", "auto")
    if max_frequency != "auto":
        max_frequency = int(max_frequency)
    return {"sampling": sampling, "sampling_threshold": threshold, "report": report,
            "estimator": estimator, "composition": composition, "max_frequency": max_frequency}


def parse_sample(section):
    """``input.sample`` (post-processing path; the schema has checked SAMPLE_FIELDS):
    the threshold rule; returns {frequency, scheme, threshold}."""
    frequency = section["frequency"]
    scheme = section["scheme"]
    threshold = section.get("threshold")
    if scheme == "none":
        if threshold is not None:
            raise SpecError("input.sample.threshold", "is only allowed with scheme: ppswor or priority")
    else:
        if threshold is None:
            raise SpecError("input.sample.threshold", f"is required with scheme: {scheme} (a number > 0)")
        threshold = float(threshold)
    return {"frequency": frequency, "scheme": scheme, "threshold": threshold}


def mechanism_for_sample(mech, sample):
    """The parsed mechanism section for a pre-sampled input: the sample's declared scheme
    replaces ``sampling``/``sampling_threshold`` (which must then be left out)."""
    if mech.get("sampling", "none") != "none" or mech.get("sampling_threshold") is not None:
        raise SpecError("mechanism.sampling", "must be left out when input.sample declares how "
                        "the sample was drawn (input.sample.scheme / threshold)")
    return {**mech, "sampling": sample["scheme"], "sampling_threshold": sample["threshold"],
            "presampled": True}


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if model != "l0":
        raise SpecError("bounding.model", "weighted_sampling needs bounding.model: l0 "
                        "(each user counted at most once per key)")
    max_frequency = mech.get("max_frequency", "auto")
    def calibrate_tables():
        try:
            return pws.calibrate(
                epsilon, delta, max_keys_per_user, sampling=mech.get("sampling", "none"),
                sampling_threshold=mech.get("sampling_threshold"),
                report=mech.get("report", "keys_and_frequencies"),
                estimator=mech.get("estimator", "mle"),
                composition=mech.get("composition") or "optimal",
                max_frequency=None if max_frequency == "auto" else max_frequency,
                presampled=bool(mech.get("presampled", False)))
        except pws.TableTooLarge as exc:     # only an explicit max_frequency raises it
            raise SpecError("mechanism.max_frequency", str(exc)) from None

    params = calibration(
        calibrate_tables,
        f"weighted_sampling release at epsilon={epsilon:g}, delta={delta:g}, "
        f"max_keys_per_user={max_keys_per_user}")
    # The plan reads only the keep table (the threshold below: the automatic bound's score);
    # the estimators' tables are built by the release, for the chosen bound only. Where
    # building them could still fail (pws.release_tables_can_fail), build them now: a table
    # that cannot be built is a calibration error at plan time, not a failure in the pipeline.
    def keep_table():
        if pws.release_tables_can_fail(params):
            return pws.release_tables(params).keep
        return pws.keep_table(params)

    keep = calibration(keep_table,
                       f"weighted_sampling tables for max_keys_per_user={max_keys_per_user}")
    half = np.flatnonzero(keep >= 0.5)
    out = {"kind": NAME, **params.as_dict(),
           "delta_achieved": params.delta_realized,
           "threshold": int(half[0]) if len(half) else params.max_frequency,
           "accounting": _ACCOUNTING[params.composition if params.composition != "pld"
                                     or params.key_mu is not None else "pld (optimal tables)"],
           "comparison": {
               "basic_composition_key_epsilon": epsilon / max_keys_per_user,
               "sbh_threshold": pws.sbh_threshold(params.key_epsilon, params.key_delta),
               "pws_L": pws.pws_L(params.key_epsilon, params.key_delta)}}
    return out


def release(counts, params, key_columns, rng_factory=None):
    # Table(keys, count) -> Table(keys, token, estimate)
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    from thresher.transforms.selection.sanitize_sample import SanitizeSample  # heavy: apache_beam
    return counts | "SanitizeSample" >> SanitizeSample(
        params, key_columns, frequency_column="count",
        rng_factory=child(rng_factory, "SanitizeSample"))


def sanitize_existing_sample(sample, params, key_columns, frequency_column, rng_factory=None):
    """Post-processing path: ``sample`` is a PCollection[pa.Table] of an existing non-private
    sample (key columns + ``frequency_column``), ``params`` the dict from :func:`calibrate`
    of :func:`mechanism_for_sample` (``presampled`` true; side input or plain dict).
    Returns PCollection[pa.Table] of released rows (keys, token, estimate).
    ``rng_factory``: the draws (``keyed_random.KeyedDraws``) of the caller's release."""
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    from thresher.transforms.selection.sanitize_sample import SanitizeSample  # heavy: apache_beam
    return sample | "SanitizeExistingSample" >> SanitizeSample(
        params, key_columns, frequency_column=frequency_column,
        rng_factory=child(rng_factory, "SanitizeExistingSample"))


def release_keep(mech):
    """pi_0..pi_M: the keep table the release draws with (``accounting.pws.release_tables``
    of the report's parameters, as the release builds it)."""
    from thresher.transforms.selection.sanitize_sample import _as_parameters  # heavy: apache_beam
    return np.asarray(pws.release_tables(_as_parameters(mech)).keep, dtype=np.float64)


class WeightedSampling(CountsKind):
    """Private weighted sampling (module docstring); charged from its stages' (epsilon,
    delta) claims (the default privacy_record)."""
    name = NAME
    VALUE_COLUMN = "estimate"
    NO_INTERVAL = ("no interval yet: sanitized sample frequencies (paper 001) have no "
                   "variance statement implemented")
    FIELDS, OUTPUT_COLUMNS = FIELDS, OUTPUT_COLUMNS
    parse = staticmethod(parse)
    calibrate = staticmethod(calibrate)
    release = staticmethod(release)
    SCORE = "weighted_sampling"          # the V(C) score model of the automatic bound
    MAX_KEYS = limits.WEIGHTED_SAMPLING_MAX_KEYS
    PARAMS = WeightedSamplingParams
    NULLABLE_COLUMNS = tuple(OUTPUT_COLUMNS)   # token and estimate: null with report: keys
    SAMPLE_INPUT = True                        # input.sample: an existing sample sanitized
    parse_sample = staticmethod(parse_sample)

    def for_sample(self, mechanism, sample, bounding):
        return mechanism_for_sample(mechanism, sample)

    def check_limits(self, mechanism):
        limits.check_weighted_sampling_fields(self.params(mechanism))

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        limits.check_weighted_sampling_release(spec, epsilon, delta, max_keys_per_user)
    CHEAP_RELEASE_POINT = False    # its release point needs the release tables

    def release_probability(self, report, counts):
        """pi_n, the end-to-end reporting probability (paper 001 Alg. 3)."""
        keep = release_keep(report["mechanism"])
        # The release reads row min(n, M) of the table it used (transforms.selection.sanitize_sample:
        # counts above max_frequency M are treated as M, whether M saturates at pi = 1 or
        # was clipped by an explicit max_frequency), so the curve does too.
        return keep[np.minimum(counts, len(keep) - 1)]

    def release_ceiling(self, report):
        """(M, pi_M) when the table stops at an explicit max_frequency M below saturation."""
        mech = report["mechanism"]
        if "by_max_keys_per_user" in mech:
            return None
        keep = release_keep(mech)
        if keep[-1] >= 1.0:
            return None
        return len(keep) - 1, float(keep[-1])

    def noise_words(self, report, key, unit):
        return [f"sampling: each {key} is reported with a probability that grows with its "
                f"count of users (private weighted sampling); released frequencies are "
                f"sanitized"], unit


KIND = WeightedSampling()

"""``mechanism.kind: sample_and_threshold`` -- sample-and-threshold (papers 000/003).

Per key with user count c (after l0/l_inf bounding): each of its c (user, key)
contributions is kept with probability p (Poisson sampling from the CSPRNG), and the key
is released with its sampled count v when v >= tau. No noise. Output columns: ``count``
(the sampled count v) and ``estimate`` (v / p).

p and tau come from ``accounting.sample_threshold.calibrate``. ``composition: pld`` (the
default with a fixed max_keys_per_user > 1) meets the user's (epsilon, delta) by the
privacy-loss-distribution bound over the user's <= C keys
(``accounting.sample_threshold.pld``: one pair dominating every key's count, composed C
times); ``composition: basic`` (the default with ``max_keys_per_user: auto``, where every
candidate is calibrated at plan time, so pld is refused there) gives each key
(epsilon / C, delta / C). Both are valid
because every (user, key) contribution is sampled independently, so keys are independent
mechanisms; per key, delta is the exact hockey-stick divergence of thresholded Bin(k, p)
vs Bin(k - 1, p) unless ``accounting`` asks for one of the paper's bounds (basic only). For ``thresher plan`` the
report's ``comparison`` gives the paper's thresholds at the same sampling rate and the
paper's own recipe (alpha = 1/6).
"""
import dataclasses
import math

import pyarrow as pa

from thresher.accounting import sample_threshold
from thresher.accounting.sample_threshold.calibration import recheck
from thresher.accounting.sample_threshold.core import _sf
from thresher.pipelines.common import limits
from thresher.pipelines.common.calibration_cache import same
from thresher.pipelines.kinds._words import number
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.kinds import _levels
from thresher.pipelines.kinds.base import CountsKind
from thresher.pipelines.common import declare
from thresher.pipelines.common.fields import optional_float, optional_int

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "sample_and_threshold"

# The PLD calibration costs 0.2-0.6 s of CPU up to C = 64 (15-25 evaluations of the
# composed bound; benchmarks/bench_plan_cache.py): it is the default up to
# PLD_DEFAULT_MAX_KEYS and refused above PLD_MAX_KEYS (issue 18's bounded planning).
PLD_DEFAULT_MAX_KEYS = 64
PLD_MAX_KEYS = 64

FIELDS = {
    "sampling_rate": declare.number(low=0, low_open=True, high=1, description=(
        "p in (0, 1]: each (user, key) contribution is kept with probability p (optional; "
        "calibrated if absent)")),
    "threshold": declare.integer(low=1, high=10**9, description=(
        "tau >= 1: keys whose sampled count is below tau are suppressed (optional; "
        "calibrated if absent; a given one is at most 100, the "
        "planning limit: docs/performance.md)")),
    "accounting": declare.choice(sample_threshold.METHODS, default="exact", description=(
        "exact (default), kl (paper 003 Thm 1) or alpha (paper 003, C_alpha form): how "
        "delta is computed when calibrating")),
    "composition": declare.choice(sample_threshold.COMPOSITIONS, description=(
        "pld or basic: how a user's keys compose (default pld with a fixed "
        "max_keys_per_user of 2 to 64, else basic; pld needs accounting: exact)")),
}
# transforms.selection.sample_and_threshold.OUTPUT_COLUMNS (not imported here: the transforms import
# Beam, which plan, validate and schema never need; tests/pipelines/test_cli_command_imports.py
# checks the two agree)
OUTPUT_COLUMNS = {"count": pa.int64(), "estimate": pa.float64()}

_ACCOUNTING = {
    "exact": "sample-and-threshold (papers 000/003), exact hockey-stick divergence of "
             "thresholded Bin(k, p) vs Bin(k-1, p) maximised over k; (user, key) contributions "
             "Poisson-sampled independently, basic composition over a user's keys",
    "kl": "sample-and-threshold (papers 000/003), paper 003 Thm 1 (KL bound); (user, key) "
          "contributions Poisson-sampled independently, basic composition over a user's keys",
    "alpha": "sample-and-threshold (papers 000/003), paper 003 C_alpha bound; (user, key) "
             "contributions Poisson-sampled independently, basic composition over a user's keys",
}
_PAPER_ALPHA = 1 / 6


@dataclasses.dataclass(frozen=True)
class SampleAndThresholdParams:
    """The parsed section (:func:`parse`; composition basic from :func:`for_auto_bound`
    with ``max_keys_per_user: auto``) as its readers outside this module see it."""
    sampling_rate: float | None = None      # p: given, else calibrated
    threshold: int | None = None            # tau: given, else calibrated
    accounting: str = "exact"               # one of sample_threshold.METHODS
    composition: str | None = None          # pld or basic; None: chosen at calibration


def parse(section):
    rate = optional_float(section, "sampling_rate")
    threshold = optional_int(section, "threshold")
    method = section.get("accounting", "exact")
    composition = section.get("composition")
    if composition is not None:
        if composition == "pld" and method != "exact":
            raise SpecError("mechanism.composition", "pld needs mechanism.accounting: exact "
                            "(it composes the exact per-key privacy-loss distributions)")
    return {"sampling_rate": rate, "threshold": threshold, "accounting": method,
            "composition": composition}


def for_auto_bound(mech):
    """The mechanism section used to calibrate the candidates of an automatic bound:
    composition basic there. An automatic bound calibrates every candidate before the run
    (up to thousands of keys, beyond the PLD limit of 64), so an explicit pld is refused
    (plans stay within seconds)."""
    if mech.get("composition") == "pld":
        raise SpecError("mechanism.composition", "pld is not available with "
                        "bounding.max_keys_per_user: auto (every candidate would need its "
                        "own composed calibration, and candidates go beyond the PLD limit of "
                        f"{PLD_MAX_KEYS} keys); use composition: basic or a fixed "
                        "max_keys_per_user")
    return {**mech, "composition": "basic"}


def _accounting_choice(mech, max_keys_per_user, model):
    """(method, composition) of a calibration; SpecError where the spec cannot have one."""
    if model != "l0":
        raise SpecError("bounding.model", "sample_and_threshold needs bounding.model: l0 "
                        "(each user counted at most once per key)")
    method = mech.get("accounting", "exact")
    composition = mech.get("composition") or (
        "pld" if method == "exact" and 1 < max_keys_per_user <= PLD_DEFAULT_MAX_KEYS else "basic")
    if composition == "pld" and max_keys_per_user > PLD_MAX_KEYS:
        raise SpecError("mechanism.composition", f"pld is available up to max_keys_per_user="
                        f"{PLD_MAX_KEYS} (the planning limit of its calibration), got "
                        f"{max_keys_per_user}; use composition: basic")
    return method, composition


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    method, composition = _accounting_choice(mech, max_keys_per_user, model)
    what = (f"sample_and_threshold release at epsilon={epsilon:g}, delta={delta:g}, "
            f"max_keys_per_user={max_keys_per_user}")
    try:
        params = sample_threshold.calibrate(
            epsilon, delta, max_keys_per_user, sampling_rate=mech.get("sampling_rate"),
            threshold=mech.get("threshold"), method=method, composition=composition)
    except ValueError as exc:
        raise CalibrationError(f"{_levels.fixed_fields(mech)}{what}: {exc}") from None
    return _report(params, method)


def calibrated_fields(sampling_rate, threshold):
    """The fields a calibration chooses (the ones the spec leaves out), as
    accounting.sample_threshold.calibrate records them."""
    return tuple(f for f, given in (("sampling_rate", sampling_rate), ("threshold", threshold))
                 if given is None)


def verify_calibration(params, mech, *, epsilon, delta, max_keys_per_user, model):
    """Forward check of a cached calibration (``pipelines.common.calibration_cache``): True only
    if the delta of its (sampling_rate, threshold), recomputed here
    (accounting.sample_threshold.calibration.recheck: pld.user_delta over the C keys for
    composition pld, the exact one-key delta at epsilon / C for basic), meets the budget,
    the spec's fixed sampling_rate / threshold are the ones cached, and the whole report
    (delta_achieved, comparisons) recomputed from them is the cached one. One delta
    evaluation (~20 ms at C = 16) instead of the search (~15-25 of them)."""
    try:
        method, composition = _accounting_choice(mech, max_keys_per_user, model)
    except SpecError:
        return False
    if type(params) is not dict or params.get("kind") != NAME:
        return False
    p, tau, used = params.get("sampling_rate"), params.get("threshold"), params.get("composition")
    rate, threshold = mech.get("sampling_rate"), mech.get("threshold")
    if (rate is not None and p != float(rate)) or (threshold is not None and tau != threshold):
        return False
    if used != composition:
        return False
    again = recheck(epsilon, delta, max_keys_per_user, p, tau, method=method, composition=used,
                    calibrated=calibrated_fields(rate, threshold))
    if again is None:
        return False
    return same(_report(again, method), params)


def _report(params, method):
    """The plan's parameters dict of a core.SampleThresholdParams."""
    out = {"kind": NAME,
           "sampling_rate": params.sampling_rate,
           "threshold": params.threshold,
           "release_point": params.release_point,
           "composition": params.composition,
           "delta_achieved": params.delta_spent}
    if params.composition == "basic":
        out.update({"per_key_epsilon": params.per_key_epsilon,
                    "per_key_delta": params.per_key_delta_spent,
                    "accounting": _ACCOUNTING[method],
                    "comparison": comparison(params)})
    else:
        out["accounting"] = _PLD_ACCOUNTING
    return out


_PLD_ACCOUNTING = (
    "sample-and-threshold (papers 000/003), exact per-key laws of thresholded Bin(k, p) vs "
    "Bin(k-1, p); (user, key) contributions Poisson-sampled independently, composed over a "
    "user's keys by the privacy-loss distribution of one pair whose privacy profile "
    "dominates every k's, composed exactly on a loss grid (docs/sample_and_threshold.md)")


def comparison(params):
    """Thresholds of the three accountings at the calibrated sampling rate, and the
    paper's recipe (alpha = 1/6) with the exact threshold at the paper's rate. Entries a
    bound cannot give (its hypotheses fail) are None."""
    eps, dlt = params.per_key_epsilon, params.delta / params.max_keys_per_user
    out = {}
    for method in sample_threshold.METHODS:
        if method == params.method and "threshold" in params.calibrated:
            out[f"{method}_threshold"] = params.threshold  # what calibrate just found
            continue
        out[f"{method}_threshold"] = sample_threshold.min_threshold(
            eps, dlt, params.sampling_rate, method=method, max_threshold=10**5)
    paper_rate, paper_tau = sample_threshold.paper_parameters(eps, dlt, _PAPER_ALPHA)
    out["paper_sampling_rate"] = paper_rate
    out["paper_threshold"] = paper_tau if eps <= 1 else None
    out["exact_threshold_at_paper_rate"] = sample_threshold.min_threshold(eps, dlt, paper_rate)
    out["paper_release_point"] = paper_tau / paper_rate if eps <= 1 else None
    return out


def release(counts, params, key_columns, rng_factory=None):
    # Table(keys, count) -> Table(keys, count = sampled count, estimate = count / p)
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    # heavy: apache_beam
    from thresher.transforms.selection.sample_and_threshold import SampleAndThreshold
    return counts | "SampleAndThreshold" >> SampleAndThreshold(
        params, rng_factory=child(rng_factory, "SampleAndThreshold"))


class SampleAndThreshold(CountsKind):
    """Sample-and-threshold (module docstring); charged from its stages' (epsilon, delta)
    claims (the default privacy_record)."""
    name = NAME
    INTERVAL = "sampled_estimate"
    FIELDS, OUTPUT_COLUMNS = FIELDS, OUTPUT_COLUMNS
    parse = staticmethod(parse)
    for_auto_bound = staticmethod(for_auto_bound)
    calibrate = staticmethod(calibrate)
    verify_calibration = staticmethod(verify_calibration)
    release = staticmethod(release)
    SCORE = "sample_and_threshold"          # the V(C) score model of the automatic bound
    PARAMS = SampleAndThresholdParams

    def check_limits(self, mechanism):
        limits.check_sampled_fields(self.name, self.params(mechanism))

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        limits.check_levels(spec, epsilon, delta, max_keys_per_user, field,
                            self.level_structure(spec.mechanism), self.MAX_KEYS)

    def release_probability(self, report, counts):
        """Binomial(n, p) >= threshold (paper 003 Sec. 3.1)."""
        # P[Bin(n, p) >= threshold] by the accounting's own binomial tail (scipy.special's
        # bdtrc; scipy.stats would cost thresher report 0.7-1.4 s to import)
        mech = report["mechanism"]
        return _sf(mech["threshold"] - 1, counts, mech["sampling_rate"])

    def noise_words(self, report, key, unit):
        mech = report["mechanism"]
        return [f"sampling: each user's contribution to a {key} is kept with probability "
                f"{number(mech['sampling_rate'])} (no noise); a {key} is released when its "
                f"sampled count is at least {mech['threshold']}"], unit

    def expected_error_words(self, params):
        if "sampling_rate" not in params:
            return []
        p = float(params["sampling_rate"])
        return [f"expected error: a count n is released as a Binomial(n, {p:.3g}) sample; "
                f"sd of n estimated from it: sqrt(n (1 - p) / p), {math.sqrt((1 - p) / p):.3g} "
                f"sqrt(n)"]


KIND = SampleAndThreshold()

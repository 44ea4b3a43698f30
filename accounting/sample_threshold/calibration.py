"""Sample-and-threshold calibration whichever the composition over a user's keys.

Composition ``basic`` (each key (epsilon / C, delta / C)) is accounting.sample_threshold.core's;
composition ``pld`` searches the same four cases on the composed bound of
accounting.sample_threshold.pld (which builds on core's one-key laws). This module joins the
two and imports both; neither imports it, nor each other back.
"""
import math

from thresher.accounting.sample_threshold import core, pld


def calibrate(epsilon, delta_target, max_keys_per_user, *, sampling_rate=None, threshold=None,
              method="exact", composition="basic"):
    """Sample-and-threshold parameters for a release of budget (epsilon, delta).

    composition "pld" (``method`` "exact" only): the whole user's (epsilon, delta) is met
    by accounting.sample_threshold.pld.composed_delta; the searches below run on it.
    composition "basic": each key gets (epsilon / C, delta / C) (core.per_key_budget). Then:
      - neither given: (p, tau) minimising tau / p (core.best_release_point);
      - sampling_rate given: the smallest threshold (core.min_threshold);
      - threshold given: the largest sampling rate (core.sampling_rate_for);
      - both given: checked; CalibrationInfeasible says which threshold or rate would do.
    Returns a core.SampleThresholdParams; raises CalibrationInfeasible.
    """
    core.check_calibrate_arguments(epsilon, delta_target, method, composition)
    if composition == "pld":
        if method != "exact":
            raise ValueError(f"composition pld needs method exact (the per-key laws), "
                             f"got {method!r}")
        return _calibrate_pld(epsilon, delta_target, core._positive_int(max_keys_per_user,
                              "max_keys_per_user"), sampling_rate, threshold)
    return core.calibrate(epsilon, delta_target, max_keys_per_user, sampling_rate=sampling_rate,
                          threshold=threshold, method=method, composition=composition)


def _calibrate_pld(epsilon, delta_target, c, sampling_rate, threshold):
    """:func:`calibrate` with composition "pld": same four cases, on the composed bound."""
    def spent(p, tau):
        return pld.user_delta(epsilon, p, tau, c)

    hint = {}

    def rate_for(tau, rel_tol):
        """Largest p = e^-y meeting the target at tau, to y within max(rel_tol, 1e-4)
        (the composed bound costs ~0.2 s); bracketed around the last tau's answer."""
        def ok(y):
            return spent(math.exp(-y), tau) <= delta_target

        tol = max(rel_tol, 1e-4)
        y_hi = hint.get("y", 1.0)
        while not ok(y_hi):  # rates meeting the target: y >= y_hi
            y_hi = 2 * y_hi + 0.5
            if math.exp(-y_hi) < core._MIN_SAMPLING_RATE:
                return None
        y_lo = max(0.0, y_hi - 0.5)
        while y_lo > 0 and ok(y_lo):
            y_hi, y_lo = y_lo, max(0.0, 2 * y_lo - y_hi - 0.5)
        if y_lo == 0 and ok(0.0):
            return 1.0
        while y_hi - y_lo > tol:  # ok(y_hi), not ok(y_lo)
            mid = 0.5 * (y_lo + y_hi)
            if ok(mid):
                y_hi = mid
            else:
                y_lo = mid
        hint["y"] = y_hi
        return math.exp(-y_hi)

    def params(p, tau, calibrated):
        return _pld_params(epsilon, delta_target, c, p, tau, calibrated)

    budget = (f"epsilon {epsilon:g}, delta {delta_target:g} over {c} key(s) per user "
              f"(privacy-loss-distribution composition)")
    if sampling_rate is not None:
        core._check(epsilon, sampling_rate, 1, "exact")
    if threshold is not None:
        core._check(epsilon, 0.5, threshold, "exact")

    def min_tau(p):
        return core._min_threshold_by(lambda tau: spent(p, tau) <= delta_target, 100_000)

    if sampling_rate is None and threshold is None:
        # The composed bound costs ~0.2-1 s, so instead of the full search of
        # best_release_point: the basic-composition optimum tau_b, then thresholds
        # 0.5 .. 1 x tau_b (the tight composition needs a lower threshold at a higher
        # rate), each with its largest rate; the best release point wins, and the basic
        # calibration itself when it is better (both are valid guarantees).
        basic = core.calibrate(epsilon, delta_target, c, method="exact", composition="basic")
        best = None
        for factor in (1.0, 0.8, 0.65, 0.5):
            tau = max(2, round(basic.threshold * factor))
            p = rate_for(tau, 1e-2)
            if p is not None and (best is None or tau / p < best[1] / best[0]):
                best = (p, tau)
        if best is None or best[1] / best[0] >= basic.release_point:
            return basic
        return params(best[0], best[1], ("sampling_rate", "threshold"))
    if threshold is None:
        tau = min_tau(sampling_rate)
        if tau is None:
            raise core.CalibrationInfeasible(
                f"sampling_rate {sampling_rate:g} cannot meet {budget} with any threshold "
                f"<= 100000; use a smaller sampling_rate")
        return params(sampling_rate, tau, ("threshold",))
    if sampling_rate is None:
        p = rate_for(threshold, 1e-9)
        if p is None:
            raise core.CalibrationInfeasible(
                f"threshold {threshold} cannot meet {budget} with any sampling_rate; "
                f"use a larger threshold")
        return params(p, threshold, ("sampling_rate",))
    def meets(p, tau):
        # A user holding one key is a neighbour too, so the release's delta is at least the
        # exact one-key delta at the whole epsilon: above the target it decides "misses"
        # in milliseconds, where the composed bound costs seconds at a high rate (9 s at
        # p = 0.9 over 48 cells).
        return one_key_misses(p, tau) is None and spent(p, tau) <= delta_target

    def one_key_misses(p, tau):
        lower = core.delta(epsilon, p, tau)
        return lower if lower > delta_target else None

    lower = one_key_misses(sampling_rate, threshold)
    used = spent(sampling_rate, threshold) if lower is None else None
    if lower is not None or used > delta_target:
        what = (f"delta {used:.3g} > {delta_target:.3g}" if lower is None else
                f"delta >= {lower:.3g} (a user with one key alone) > {delta_target:.3g}")
        tau, p = _nearest_alternatives(epsilon, delta_target, c, sampling_rate, threshold, meets)
        raise core._infeasible(sampling_rate, threshold, what, budget, tau, p,
                               note=_NEAREST_NOTE.format(steps=_NEAREST_STEPS))
    return params(sampling_rate, threshold, ())


_NEAREST_NOTE = ("(found from basic composition's settings, which bound this release too, "
                 "moved towards the given ones by at most {steps} evaluations of the composed "
                 "bound each: a setting a little closer may also meet it)")
# Evaluations of the composed bound (0.1-0.3 s each at 48 cells) spent moving each named
# setting from the basic composition's towards the given one, and the largest threshold
# named (the searches' cost grows with tau: basic's up to 100,000 took 4.3 s at p = 0.9).
_NEAREST_STEPS = 6
_NEAREST_MAX_TAU = 10_000


def _nearest_alternatives(epsilon, delta_target, c, sampling_rate, threshold, meets):
    """(tau, p) to name when a fixed (sampling_rate, threshold) misses the composed budget
    (None where none is found), in seconds: the full searches of the composed bound
    (min_tau, rate_for) took 12 s to minutes over 48 cells.

    Start: basic composition's smallest threshold at this rate and largest rate at this
    threshold (each key (epsilon / C, delta / C), core's searches, milliseconds). They are
    valid for the composed release: pld.user_delta is min(basic, composed), and its basic
    term C x delta_1(epsilon / C, p, tau) is recomputed here (``basic_ok``) for the very
    value named -- the rate as printed, rounded down to 6 digits. Then each is moved
    towards the given setting by bisection between the given one (misses) and it (meets)
    with at most :data:`_NEAREST_STEPS` evaluations of ``meets`` (the composed bound), the
    last setting that meets it kept."""
    eps_key, delta_key = core.per_key_budget(epsilon, delta_target, c)

    def basic_ok(p, tau):   # user_delta's basic term, the same expression
        return c * core.delta(eps_key, p, tau) <= delta_target

    def shown(p):           # the rate as core._infeasible prints it
        return float(core._round_down(p))

    tau = core.min_threshold(eps_key, delta_key, sampling_rate, max_threshold=_NEAREST_MAX_TAU)
    if tau is not None and not basic_ok(sampling_rate, tau):
        tau = None          # the search's early stop and C x delta / C disagree by rounding
    if tau is not None and threshold < tau <= _NEAREST_MAX_TAU:
        lo = threshold      # misses
        for _ in range(_NEAREST_STEPS):
            if tau - lo <= 1:
                break
            mid = (lo + tau) // 2
            if meets(sampling_rate, mid):
                tau = mid
            else:
                lo = mid
    p = core.sampling_rate_for(eps_key, delta_key, threshold)
    if p is not None and not basic_ok(shown(p), threshold):
        p = None
    if p is not None and p < sampling_rate:
        y_lo, y_hi = -math.log(sampling_rate), -math.log(p)   # misses, meets
        for _ in range(_NEAREST_STEPS):
            if y_hi - y_lo <= 1e-3:
                break
            mid = 0.5 * (y_lo + y_hi)
            if meets(shown(math.exp(-mid)), threshold):
                p, y_hi = math.exp(-mid), mid
            else:
                y_lo = mid
    return tau, p


def _pld_params(epsilon, delta_target, c, p, tau, calibrated):
    """The composition-pld parameters of (p, tau): delta_spent = pld.user_delta."""
    return core.SampleThresholdParams(
        sampling_rate=float(p), threshold=int(tau), epsilon=float(epsilon),
        delta=float(delta_target), max_keys_per_user=c, per_key_epsilon=None,
        per_key_delta=None, per_key_delta_spent=None,
        delta_spent=pld.user_delta(epsilon, p, tau, c), method="exact",
        calibrated=tuple(calibrated), composition="pld")


def recheck(epsilon, delta_target, max_keys_per_user, sampling_rate, threshold, *,
            method="exact", composition="basic", calibrated=()):
    """The forward check of a (sampling_rate, threshold) found earlier (a cached
    calibration, pipelines.calibration_cache): the parameters :func:`calibrate` returns
    for it, with its delta recomputed here -- composition "pld": pld.user_delta over the
    C keys <= delta_target; "basic": the one-key delta at epsilon / C <= delta_target / C
    (the check core.calibrate's searches make, by the full search) -- or None when it
    misses the budget. One evaluation, never a search. ``calibrated``: the fields the
    calibration chose (reported as they were)."""
    core.check_calibrate_arguments(epsilon, delta_target, method, composition)
    c = core._positive_int(max_keys_per_user, "max_keys_per_user")
    if type(sampling_rate) is not float or type(threshold) is not int:
        return None
    if composition == "pld" and method != "exact":
        return None
    try:   # SampleThresholdParams itself refuses a delta_spent well above the target
        if composition == "pld":
            out = _pld_params(epsilon, delta_target, c, sampling_rate, threshold, calibrated)
            return out if out.delta_spent <= delta_target else None
        out = core._params(epsilon, delta_target, c, sampling_rate, threshold, method,
                           calibrated)
    except ValueError:
        return None
    return out if out.per_key_delta_spent <= out.per_key_delta else None

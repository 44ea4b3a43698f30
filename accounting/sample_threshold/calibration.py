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
        return core.SampleThresholdParams(
            sampling_rate=float(p), threshold=int(tau), epsilon=float(epsilon),
            delta=float(delta_target), max_keys_per_user=c, per_key_epsilon=None,
            per_key_delta=None, per_key_delta_spent=None, delta_spent=spent(p, tau),
            method="exact", calibrated=tuple(calibrated), composition="pld")

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
    used = spent(sampling_rate, threshold)
    if used > delta_target:
        raise core._infeasible(sampling_rate, threshold, f"delta {used:.3g} > {delta_target:.3g}",
                               budget, min_tau(sampling_rate), rate_for(threshold, 1e-9))
    return params(sampling_rate, threshold, ())

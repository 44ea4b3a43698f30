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
    by accounting.sample_threshold.pld.user_delta (one dominating pair composed over the
    C keys); the searches of :class:`_PldSearch` run on it. composition "basic": each key
    gets (epsilon / C, delta / C) (core.per_key_budget), core's searches. Then:
      - neither given: (p, tau) minimising tau / p;
      - sampling_rate given: the smallest threshold;
      - threshold given: the largest sampling rate;
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


# Tolerances of the rate search, in y = -ln p (relative in p): while choosing the
# threshold, and for the rate returned.
_COARSE_TOL = 1e-3
_FINE_TOL = 1e-4
# Thresholds searched when both are free, for a given sampling rate, and named in the
# refusal of a fixed pair (pipelines.common.limits.THRESHOLD_MAX: a larger given threshold is
# refused by the planning limits, so naming one would not help).
_MAX_FREE_TAU = 1000
_MAX_TAU = 100_000
_NAMED_MAX_TAU = 100


class _PldSearch:
    """The searches of composition "pld" on ``pld.user_delta`` (~10-30 ms per evaluation),
    in as few evaluations as the bound's shape allows: ln delta is close to linear in
    y = -ln p (delta ~ p^tau for the rare large losses that set it), so the largest rate
    at a threshold is found by a bracketing secant (Illinois) search from a guess, and
    neighbouring thresholds' answers guess the next one. Every answer is a rate that was
    evaluated and meets the target: the guesses only save evaluations. Evaluations are
    memoised per (p, tau)."""

    def __init__(self, epsilon, delta_target, c):
        self.epsilon, self.delta, self.c = epsilon, delta_target, c
        self.log_target = math.log(delta_target)
        self.memo = {}
        self.brackets = {}     # tau -> (y meeting, f there, y missing or None, f there)

    def excess(self, p, tau):
        """ln(delta(p, tau) / target): <= 0 meets (-inf when delta is 0)."""
        key = (p, tau)
        if key not in self.memo:
            spent = pld.user_delta(self.epsilon, p, tau, self.c)
            self.memo[key] = math.log(spent) - self.log_target if spent > 0 else -math.inf
        return self.memo[key]

    def meets(self, p, tau):
        return self.excess(p, tau) <= 0

    def guess(self, tau):
        """A guess of y = -ln p*(tau): from the solved thresholds nearest tau (linear in
        tau through the two nearest), else the one-key rate at delta / C (cheap)."""
        solved = sorted(self.brackets, key=lambda t: (abs(t - tau), t))[:2]
        if len(solved) == 2:
            (t1, t2) = solved
            y1, y2 = self.brackets[t1][0], self.brackets[t2][0]
            return y1 + (y2 - y1) * (tau - t1) / (t2 - t1)
        if solved:
            return self.brackets[solved[0]][0] * solved[0] / tau
        p = core.sampling_rate_for(self.epsilon, self.delta / self.c, tau, rel_tol=1e-3)
        return -math.log(p) if p is not None else -math.log(core._MIN_SAMPLING_RATE)

    def rate(self, tau, tol):
        """Largest p = e^-y meeting the target at ``tau`` (y to within ``tol``: the next
        evaluated y - tol misses), or None when none above core._MIN_SAMPLING_RATE does."""
        y_max = -math.log(core._MIN_SAMPLING_RATE)

        def f(y):
            return self.excess(math.exp(-y), tau)

        meet, fail = None, None               # (y, f(y))
        if tau in self.brackets:
            ym, fm, yf, ff = self.brackets[tau]
            meet, fail = (ym, fm), (None if yf is None else (yf, ff))
        else:
            y = min(max(self.guess(tau), 1e-6), y_max)
            fy = f(y)
            if fy <= 0:
                meet = (y, fy)
            else:
                fail = (y, fy)
        slope = float(tau)                    # |d f / d y|, refined by the secants
        step = 0.0
        while meet is None or fail is None:   # bracket: step towards the root, growing
            if meet is None:
                y0, f0 = fail
                step = max(1.2 * f0 / slope, 2 * step, tol)
                y = min(y0 + step, y_max)
            else:
                y0, f0 = meet
                step = max(1.2 * -f0 / slope if math.isfinite(f0) else 0.5 * y0,
                           2 * step, tol)
                y = max(y0 - step, 0.0)
            fy = f(y)
            if math.isfinite(fy) and math.isfinite(f0) and fy != f0:
                slope = max(abs((fy - f0) / (y - y0)), 1e-3)
            if fy <= 0:
                meet = (y, fy)
            else:
                fail = (y, fy)
            if meet is None and y >= y_max:
                return None
            if fail is None and y <= 0.0:     # p = 1 meets: only if delta_target >= 1
                break
        if fail is not None:
            meet, fail = self._illinois(f, meet, fail, tol)
        self.brackets[tau] = (meet[0], meet[1]) + ((fail[0], fail[1]) if fail else (None, None))
        return math.exp(-self._on_grid(f, meet, fail, tol))

    @staticmethod
    def _on_grid(f, meet, fail, tol):
        """The answer on the fixed grid y = k tol: the smallest grid point at or above the
        bracket's missing end that meets the target (issue 42). The secant steps before it
        follow the values of f, whose last bits differ between machines (numpy's float64
        exp/log take an AVX-512 path on CPUs that have it), so the bracket's ends differ in
        their last bits too; the grid point chosen depends only on which grid points meet,
        and a machine can disagree only where delta at a grid point is within float noise
        of the target (about tau * tol apart from one grid point to the next). The bracket
        is at most tol wide, so the second grid point meets wherever delta is monotone in
        p; a few more are tried before falling back to the bracket's meeting end."""
        if fail is None:                      # p = 1 meets
            return meet[0]
        k = math.ceil(fail[0] / tol)
        for _ in range(8):
            y = k * tol
            if f(y) <= 0:
                return y
            k += 1
        return meet[0]

    @staticmethod
    def _illinois(f, meet, fail, tol):
        """Shrink the bracket (fail[0] < meet[0]) to width <= tol by regula falsi with
        the Illinois halving; a trial within tol of an end is moved 0.9 tol inside it, so
        the last step closes the bracket from the other side."""
        (ym, fm), (yf, ff) = meet, fail
        side = 0
        while ym - yf > tol:
            if math.isfinite(fm) and math.isfinite(ff) and ff != fm:
                y = ym - fm * (ym - yf) / (fm - ff)
            else:
                y = 0.5 * (ym + yf)
            if y - yf < tol:
                y = yf + 0.9 * tol
            elif ym - y < tol:
                y = ym - 0.9 * tol
            y = min(max(y, yf + 0.25 * tol), ym - 0.25 * tol)
            fy = f(y)
            if fy <= 0:
                ym, fm = y, fy
                if side == 1:
                    ff *= 0.5
                side = 1
            else:
                yf, ff = y, fy
                if side == -1:
                    fm *= 0.5
                side = -1
        return (ym, f(ym)), (yf, f(yf))

    def min_tau(self, p, max_tau=_MAX_TAU):
        """Smallest threshold meeting the target at rate p (monotone in tau: raising tau
        merges outcomes into 'absent', a post-processing), or None up to ``max_tau``:
        galloping from the one-key threshold at delta / C, then bisection."""
        # a user with one key is a neighbour: below the one-key threshold at the whole
        # (epsilon, delta) nothing meets; start at the one-key threshold at delta / C
        floor = core.min_threshold(self.epsilon, self.delta, p, max_threshold=max_tau)
        if floor is None:
            return None
        start = max(floor, core.min_threshold(self.epsilon, self.delta / self.c, p,
                                              max_threshold=max_tau) or floor)
        lo, hi = None, None                   # lo misses, hi meets
        tau, step = start, 1
        if self.meets(p, tau):
            hi = tau
            while hi > floor:
                tau = max(floor, hi - step)
                if self.meets(p, tau):
                    hi, step = tau, 2 * step
                else:
                    lo = tau
                    break
            if lo is None:
                return hi
        else:
            lo = tau
            while hi is None:
                if lo >= max_tau:
                    return None
                tau = min(max_tau, lo + step)
                if self.meets(p, tau):
                    hi = tau
                else:
                    lo, step = tau, 2 * step
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self.meets(p, mid):
                hi = mid
            else:
                lo = mid
        return hi

    def best_point(self):
        """(p, tau) with the lowest release point tau / p(tau) over tau <= _MAX_FREE_TAU,
        the winner's rate refined to _FINE_TOL; None if no tau has a rate. tau / p(tau)
        is unimodal in tau in every case measured (benchmarks/
        bench_sample_threshold_bound.py): from :func:`_start_tau` the search walks
        downhill by unit steps (doubling after four), then an integer ternary search
        finishes the bracket and the best one's neighbours are checked."""
        points = {}

        def point(tau):
            if tau not in points:
                p = self.rate(tau, _COARSE_TOL) if 1 <= tau <= _MAX_FREE_TAU else None
                points[tau] = math.inf if p is None else tau / p
            return points[tau]

        try:
            start = min(_MAX_FREE_TAU, max(1, _start_tau(self.epsilon, self.delta, self.c)))
        except core.CalibrationInfeasible:
            return None                       # a user with one key cannot meet it: nor C
        direction = 1 if point(start + 1) < point(start) else -1
        here, moves = start, 0
        while True:
            step = 1 if moves < 4 else 2 ** (moves - 3)
            nxt = here + direction * step
            if point(nxt) >= point(here):
                break
            here, moves = nxt, moves + 1
        a, b = sorted((here - direction * (1 if moves < 5 else 2 ** (moves - 4)), nxt))
        a, b = max(1, a), min(_MAX_FREE_TAU, b)
        while b - a > 3:                      # only after doubling steps
            m1, m2 = a + (b - a) // 3, b - (b - a) // 3
            if point(m1) <= point(m2):
                b = m2
            else:
                a = m1
        for tau in range(a, b + 1):
            point(tau)
        best = min(points, key=lambda t: (points[t], t))
        for tau in (best - 1, best + 1):      # a flat stretch cannot hide a better neighbour
            point(tau)
        best = min(points, key=lambda t: (points[t], t))
        if math.isinf(points[best]):
            return None
        return self.rate(best, _FINE_TOL), best


def _start_tau(epsilon, delta_target, c):
    """Where the threshold search starts (only its cost depends on it): the optimal
    threshold of a user with one key at (epsilon, delta) (core.best_release_point, tens
    of ms), times a factor fitted (least squares in logs) to the composed optimum over
    epsilon 0.25 .. 4, delta 1e-4 .. 1e-9, C 2 .. 64 (within 3 of it there)."""
    one = core.best_release_point(epsilon, delta_target, max_threshold=_MAX_FREE_TAU)[1]
    lc, le = math.log(c), math.log(epsilon)
    return round(one * math.exp(0.091 - 0.110 * lc + 0.054 * lc * le + 0.056 * le))


def _calibrate_pld(epsilon, delta_target, c, sampling_rate, threshold):
    """:func:`calibrate` with composition "pld": the same four cases, on pld.user_delta
    (the searches of :class:`_PldSearch`)."""
    search = _PldSearch(epsilon, delta_target, c)

    def params(p, tau, calibrated):
        return _pld_params(epsilon, delta_target, c, p, tau, calibrated)

    budget = (f"epsilon {epsilon:g}, delta {delta_target:g} over {c} key(s) per user "
              f"(privacy-loss-distribution composition)")
    if sampling_rate is not None:
        core._check(epsilon, sampling_rate, 1, "exact")
    if threshold is not None:
        core._check(epsilon, 0.5, threshold, "exact")

    if sampling_rate is None and threshold is None:
        best = search.best_point()
        if best is None or best[0] is None:
            raise core.CalibrationInfeasible(
                f"no sampling rate meets {budget} with a threshold <= {_MAX_FREE_TAU}")
        return params(best[0], best[1], ("sampling_rate", "threshold"))
    if threshold is None:
        tau = search.min_tau(sampling_rate)
        if tau is None:
            raise core.CalibrationInfeasible(
                f"sampling_rate {sampling_rate:g} cannot meet {budget} with any threshold "
                f"<= {_MAX_TAU}; use a smaller sampling_rate")
        return params(sampling_rate, tau, ("threshold",))
    if sampling_rate is None:
        p = search.rate(threshold, _FINE_TOL)
        if p is None:
            raise core.CalibrationInfeasible(
                f"threshold {threshold} cannot meet {budget} with any sampling_rate; "
                f"use a larger threshold")
        return params(p, threshold, ("sampling_rate",))
    # A user holding one key is a neighbour too, so the release's delta is at least the
    # exact one-key delta at the whole epsilon: above the target it decides "misses"
    # without the composed bound.
    lower = core.delta(epsilon, sampling_rate, threshold)
    used = search.excess(sampling_rate, threshold) if lower <= delta_target else None
    if used is not None and used <= 0:
        return params(sampling_rate, threshold, ())
    spent = math.exp(used + search.log_target) if used is not None else None
    what = (f"delta {spent:.3g} > {delta_target:.3g}" if used is not None else
            f"delta >= {lower:.3g} (a user with one key alone) > {delta_target:.3g}")
    tau = search.min_tau(sampling_rate, _NAMED_MAX_TAU) if threshold < _NAMED_MAX_TAU else None
    p = search.rate(threshold, _FINE_TOL)
    raise core._infeasible(sampling_rate, threshold, what, budget, tau,
                           None if p is None else _shown_rate(p, search, threshold))


def _shown_rate(p, search, threshold):
    """The largest rate meeting the target at ``threshold``, as core._infeasible prints it
    (rounded down to 6 digits, which only lowers delta): checked again as printed."""
    shown = float(core._round_down(p))
    return shown if search.meets(shown, threshold) else None


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
    calibration, pipelines.common.calibration_cache): the parameters :func:`calibrate` returns
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

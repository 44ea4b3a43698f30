"""Generic searches over monotone functions, shared by every calibration.

Calibrations ask for the smallest parameter (threshold, sigma, sampling rate) at which a
monotone privacy curve meets its target; they all go through these two searches rather
than re-implementing bisection per mechanism.
"""
import math


def smallest_integer(predicate, low, high=None, *, max_high=2**62):
    """Smallest integer n in [low, high] with predicate(n) true, predicate monotone
    (false ... false true ... true). Doubles ``high`` from ``low`` when it is None.
    Returns None if no n <= max_high qualifies."""
    low = int(low)
    if predicate(low):
        return low
    if high is None:
        step = 1
        high = low + 1
        while not predicate(high):
            if high >= max_high:
                return None
            low = high
            step *= 2
            high = min(low + step, max_high)
    elif not predicate(high):
        return None
    # invariant: predicate(low) false, predicate(high) true
    while high - low > 1:
        mid = (low + high) // 2
        if predicate(mid):
            high = mid
        else:
            low = mid
    return high


def smallest_real(predicate, low, high, *, rel_tol=1e-9, abs_tol=0.0, max_iter=200):
    """Smallest x in [low, high] (up to tolerance) with predicate(x) true for a monotone
    predicate; the returned x always satisfies the predicate. None if predicate(high)
    is false. ``high`` may be math.inf: it is then found by doubling from max(low, 1)."""
    if math.isnan(low) or math.isnan(high):
        return None
    if math.isinf(high):
        high = max(2.0 * low, 1.0)
        # from >= 1 past 1e300 in <= 997 doublings; the count bounds it whatever low is
        for _ in range(1100):
            if predicate(high):
                break
            low, high = high, 2.0 * high
            if high > 1e300:
                return None
        else:
            return None
    elif not predicate(high):
        return None
    if predicate(low):
        return low
    for _ in range(max_iter):
        if high - low <= max(abs_tol, rel_tol * abs(high)):
            break
        mid = 0.5 * (low + high)
        if predicate(mid):
            high = mid
        else:
            low = mid
    return high

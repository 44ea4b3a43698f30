"""An upper bound on GSHM's delta for discrete Gaussian noise, in plain ``math`` (no SciPy;
NumPy only to hold and add the terms a block at a time, every exp is ``math.exp``): the
forward check of a cached calibration (``pipelines.common.calibration_cache``).

What it bounds is exactly what ``accounting.gshm.delta(..., noise="discrete_gaussian")``
computes (paper 004 Thm 5.4, Karrer, Kifer, Wilkins, Zhang): with beta = P[v <= g - 1]
for v ~ N_Z(0, sigma^2) and g = ceil(tau* - tau),

    delta = max( 1 - beta^C,  max_{a=0..C-1} 1 - beta^a + beta^a delta_+(C - a, eps - a ln beta),
                 max_{a=0..C-1} delta_+(C - a, eps + a ln beta) ),

and delta_+(a, e) <= e^(T_a) D_a(e) by Lemma A of ``accounting.discrete_gaussian``,
D_a(e) = sum_{u >= u0} P[Y = u] (1 - exp(e - (2u + a) / (2 sigma^2))), Y ~ N_Z(0, a sigma^2),
u0 the first u with (2u + a) / (2 sigma^2) > e. (For sigma >= 1.5 the accounting itself
uses this bound, T_a <= 1e-9; for a = 1, T_1 = 0 and D_1 is its exact sum.)

Why the value returned is an upper bound (the proof of its margin):

1. Monotonicity in beta. With x = a ln beta <= 0, the middle term is
   g(x) = 1 - E[min(e^x, e^(eps - L))] (L the privacy loss), which falls as x grows; the
   last term delta_+(., eps + x) also falls as x grows, and 1 - beta^C too. So evaluating
   every term at a lower bound beta_lo <= beta (x' = a ln beta_lo <= x) bounds delta from
   above. beta_lo comes from an upper bound on P[v >= g] (item 3) and ln beta_lo is pushed
   down by 4 units in the last place (u = 2^-53) for the rounding of log1p and the
   product a ln beta.
2. Monotonicity in e. delta_+(a, e) falls as e grows, so each e = eps -+ x is lowered by
   8 u (|eps| + |x|) before use: the float subtraction is then never above the real one.
3. Sums. Every sum is of positive terms f(u) = exp(-u^2 / (2 s^2)) (times a weight in
   [0, 1]), added with ``math.fsum`` (correctly rounded). The exponent -u^2/(2 s^2) is
   computed with relative error <= 3u, so absolute error <= 3u |arg|, and ``math.exp`` is
   within 1 ulp (glibc): each term is within (3 |arg| + 2) u <= 2.3e-12 of its value
   relatively, since terms with |arg| > 745 underflow to 0 and are inside the remainder.
   A sum stops at the first u > 0 past which the geometric remainder bound
   f(m + 1) / (1 - r), r = exp(-(2m + 3) / (2 s^2)) (the term ratio beyond m), is below
   2^-70 of the partial sum; upper bounds add that remainder, lower bounds drop it. The
   weight 1 - exp(e - L_u) = -expm1(e - L_u) has absolute error <= e^(e - L_u) 4u (|e| + L_u)
   + 2u, whose maximum over L_u >= e is <= 8u (|e| + 1) + 2u: added times P[Y >= u0].
   Quotients by the normaliser Z use its lower bound. All these relative slacks together
   are below 1e-11, and the result is multiplied by (1 + 1e-11) before comparing.
4. Lemma A's factor: eta_k <= sum_j exp(-pi^2 sigma^2 j^2) (as (k - 1)/k >= 1/2) <=
   exp(-pi^2 sigma^2) / (1 - exp(-3 pi^2 sigma^2)), so T_a <= 2 (a - 1) eta, used as
   exp(T_a)(1 + 4u). Below sigma ~ 1.5 this is looser than the accounting's exact
   convolution, so the check may refuse a sound calibration there (it is then recomputed:
   never the unsafe direction).

So ``delta_upper(...) >= gshm.delta(...)`` up to the accounting's own float error, and the
two agree closely where the accounting uses Lemma A (tests cross-check both; a review fuzz
over 150 points found relative gaps up to 2.3e-10, with the plain bound the tighter one,
still above a brute-force sum).
Cost: the sums run over ~12 sigma sqrt(C) terms for each of 2C+1 evaluations;
``delta_upper`` gives up (returns None) beyond ``MAX_TERMS`` in all.
"""
import math

import numpy as np

U = 2.0 ** -53
SLACK = 1e-11
# The whole check walks at most this many terms (~10 ms a block at a time); a calibration
# needing more is not verified, so it is recomputed rather than read from the cache.
MAX_TERMS = 100_000


class _TooLarge(Exception):
    pass


TooLarge = _TooLarge    # for callers of log_beta_lower (accounting.zcdp)


class _Budget:
    def __init__(self, terms):
        self.left = terms
        self.normalisers = {}

    def spend(self, n):
        self.left -= n
        if self.left < 0:
            raise _TooLarge()


def _exp_each(x):
    """math.exp of each float64 in ``x``, as a float64 array: the C library's exp, the
    function the term-by-term loop used, so every term has the same bits as before (numpy's
    own exp may take another code path and differ in the last bit). map() walks the list in
    C: no Python bytecode per term."""
    return np.fromiter(map(math.exp, x.tolist()), dtype=np.float64, count=len(x))


def _block(lo, size):
    """u = lo .. lo + size - 1 as floats, and u^2 computed exactly in integers and rounded
    once to float (what Python's int u * u then / float does)."""
    if abs(lo) + size < 2 ** 31:             # squares below 2^62: exact in int64
        ui = np.arange(lo, lo + size, dtype=np.int64)
        return ui.astype(np.float64), (ui * ui).astype(np.float64)
    # far out (a huge threshold gap or epsilon sigma^2): Python ints, as the scalar form
    # (and its OverflowError past the float range)
    us = range(lo, lo + size)
    return (np.array([float(v) for v in us], dtype=np.float64),
            np.array([float(v * v) for v in us], dtype=np.float64))


def _tail(t, s, weight, budget):
    """Bounds on sums over u >= t (any integer) of f(u) = exp(-u^2 / (2 s^2)): returns
    (lower, upper) of sum f(u), and the upper bound of sum f(u) weight(u) for a weight in
    [0, 1] (0.0 without one; ``weight`` maps a float64 array of u to an array). Item 3 of
    the module docstring.

    The terms are evaluated a block at a time with elementwise IEEE operations in the order
    the scalar formula uses (u^2 as an exact integer rounded once, as Python's int / float
    does) and ``math.exp`` per term; the stopping rule uses the sequential running sum
    (``np.add.accumulate``, left to right, as the scalar ``running += f``): so the stopping
    u, every term and the fsums are bit for bit those of a term-by-term loop."""
    two_s2 = 2.0 * s * s
    floor = -int(math.ceil(40.0 * s)) - 1       # below, exp(-u^2/(2 s^2)) < 1e-347: 0
    start = t if t >= floor else floor
    # The scalar loop charged the budget 4096 terms per full block it walked past and the
    # rest at the end: n terms cost n, or n - 4096 when n is a multiple of 4096 (the last
    # full block is never charged). So it gives up exactly when that cost exceeds what is
    # left, and no stopping point is ever searched beyond left + 4096 terms.
    limit = budget.left + 4096
    parts_f, parts_w = [], []
    running = 0.0
    # The first block reaches about where the stopping rule fires (f(u) ~ 2^-70 of the mass:
    # u^2 ~ max(t, 0)^2 + 2 s^2 (70 ln 2 + 3)); the block sizes only set how much is
    # evaluated past the stop, never which terms are summed.
    block, later = 64, 64
    if abs(start) < 2 ** 40 and s < 2.0 ** 40:
        reach = math.sqrt(float(max(start, 0)) ** 2 + two_s2 * (70.0 * math.log(2.0) + 3.0))
        block = max(64, int(reach - start) + 9)
        later = max(64, block // 8)
    n = 0
    stop = None
    while stop is None:
        size = min(block, limit - n)
        if size <= 0:
            raise _TooLarge()
        # one u past the block: its term is the remainder's f(u + 1) of the block's last u
        u, square = _block(start + n, size + 1)
        f_all = _exp_each(-square / two_s2)
        u, f = u[:size], f_all[:size]
        run = np.add.accumulate(np.concatenate(([running], f)))[1:]
        if abs(u[0]) < 2.0 ** 52 and abs(u[-1]) < 2.0 ** 52:
            # (u + 1.0)^2 in floats and float((u + 1)^2) are both the exact square rounded
            # once (u + 1.0 is exact here): the scalar form's f(u + 1) is the next term
            following = f_all[1:]
        else:
            following = _exp_each(-((u + 1.0) * (u + 1.0)) / two_s2)
        # The remainder f(u + 1) / (1 - r) is >= f(u + 1) in floats (1 - r is in (0, 1], and
        # rounding is monotone; r >= 1 gives inf): where f(u + 1) alone is above the
        # stopping level the scalar test fails, so r is evaluated only at the other u > 0,
        # in order, until the first that passes.
        level = run * 2.0 ** -70
        candidates = np.flatnonzero((u > 0.0) & (following <= level))
        for k in range(0, len(candidates), 64):
            idx = candidates[k:k + 64]
            r = _exp_each(-(2.0 * u[idx] + 3.0) / two_s2)
            with np.errstate(divide="ignore", invalid="ignore"):
                rem = np.where(r < 1.0, following[idx] / (1.0 - r), math.inf)
            hit = np.flatnonzero(rem <= level[idx])
            if len(hit):
                stop = int(idx[hit[0]])
                remainder = float(rem[hit[0]])
                f, u = f[:stop + 1], u[:stop + 1]
                break
        parts_f.append(f)
        if weight is not None:
            parts_w.append(f * weight(u))
        running = float(run[len(f) - 1])
        n += len(f)
        block, later = later, later * 2
    cost = n - 4096 if n % 4096 == 0 else n
    budget.spend(cost)
    below_floor = 1e-300 if t < floor else 0.0     # the cut lower tail (< 1e-347 a term)
    total = math.fsum(np.concatenate(parts_f).tolist())
    upper = (total + remainder + below_floor) * (1.0 + SLACK)
    weighted_upper = ((math.fsum(np.concatenate(parts_w).tolist()) + remainder + below_floor)
                      * (1.0 + SLACK) if weight is not None else 0.0)
    return total * (1.0 - SLACK), upper, weighted_upper


def _normaliser(s, budget):
    """(lower, upper) bounds on Z(s) = sum over integers of exp(-u^2 / (2 s^2))."""
    if s not in budget.normalisers:
        if s >= 10.0:
            # Poisson summation (an identity): Z = sqrt(2 pi) s (1 + 2 sum_j e^(-2 pi^2 s^2 j^2)),
            # the sum below e^(-1973) here; 4u covers the rounding of the product.
            z = math.sqrt(2.0 * math.pi) * s
            budget.normalisers[s] = (z * (1.0 - 4.0 * U), z * (1.0 + 4.0 * U) + 1e-300)
        else:
            lo, hi, _ = _tail(1, s, None, budget)
            budget.normalisers[s] = (1.0 + 2.0 * lo, 1.0 + 2.0 * hi)
    return budget.normalisers[s]


def _lemma_a_factor(sigma, a):
    """exp(T_a)(1 + 4u) >= the ratio bound of Lemma A (item 4)."""
    if a <= 1:
        return 1.0
    x = math.pi * math.pi * sigma * sigma
    if x < 1.0:
        return math.inf
    eta = math.exp(-x) / (1.0 - math.exp(-3.0 * x))
    return math.exp(2.0 * (a - 1) * eta) * (1.0 + 4.0 * U)


def shift_delta_upper(epsilon, sigma, count, budget=None):
    """An upper bound on delta_+(count, epsilon) of ``accounting.discrete_gaussian``
    (count N_Z(0, sigma^2) coordinates each shifted by one), in plain math."""
    budget = budget or _Budget(MAX_TERMS)
    a = int(count)
    e = float(epsilon)
    sd = sigma * math.sqrt(a)
    two_sigma2 = 2.0 * sigma * sigma
    if not math.isfinite(e) or abs(e) * sigma * sigma > 1e15:
        return 1.0                                   # outside what the sums below cover
    u0 = math.floor(e * sigma * sigma - a / 2.0) + 1
    # (2 u + a) / (2 sigma^2) > e for u >= u0 in exact arithmetic; a float edge case is
    # covered by the weight clamp below (a weight is never negative).

    def weight(u):
        # min(1, max(0, w)) of the scalar form, elementwise with its tie rules
        w = -np.fromiter(map(math.expm1, (e - (2.0 * u + a) / two_sigma2).tolist()),
                         dtype=np.float64, count=len(u))
        w = np.where(w > 0.0, w, 0.0)
        return np.where(w < 1.0, w, 1.0)
    z_lo, _ = _normaliser(sd, budget)
    _, mass_hi, weighted_hi = _tail(u0, sd, weight, budget)
    d = weighted_hi / z_lo + (8.0 * U * (abs(e) + 1.0) + 2.0 * U) * mass_hi / z_lo
    return min(1.0, d * _lemma_a_factor(sigma, a) * (1.0 + SLACK))


def log_beta_lower(sigma, gap, budget=None):
    """A lower bound on log P[v <= ceil(gap) - 1], v ~ N_Z(0, sigma^2) (item 1)."""
    budget = budget or _Budget(MAX_TERMS)
    g = math.ceil(gap)
    z_lo, z_hi = _normaliser(sigma, budget)
    if g >= 1:
        _, tail_hi, _ = _tail(g, sigma, None, budget)
        q_hi = tail_hi / z_lo                      # P[v >= g]
    else:
        tail_lo, _, _ = _tail(1 - g, sigma, None, budget)
        q_hi = 1.0 - tail_lo / z_hi                # P[v >= g] = 1 - P[v >= 1 - g]
    q_hi = q_hi * (1.0 + SLACK)
    if q_hi >= 1.0:
        return -math.inf
    return math.log1p(-q_hi) * (1.0 + 4.0 * U)


def _lower_e(e):
    return e - 8.0 * U * (abs(e) + 1.0)


def delta_upper(epsilon, sigma, threshold_gap, max_keys_per_user):
    """An upper bound on ``accounting.gshm.delta(epsilon, sigma, threshold_gap, C,
    noise="discrete_gaussian")`` (module docstring), or None when it would need more than
    MAX_TERMS terms."""
    eps, sigma, c = float(epsilon), float(sigma), int(max_keys_per_user)
    if not (math.isfinite(eps) and eps >= 0 and math.isfinite(sigma) and sigma > 0 and c >= 1
            and math.isfinite(threshold_gap)):
        return 1.0
    budget = _Budget(MAX_TERMS)
    try:
        lb = log_beta_lower(sigma, threshold_gap, budget)
        if lb == -math.inf:
            return 1.0
        worst = -math.expm1(c * lb) * (1.0 + 4.0 * U)
        for a_eq in range(c):
            x = a_eq * lb * (1.0 + 4.0 * U)        # <= a_eq ln beta (both <= 0)
            worst = max(worst, *_terms(eps, sigma, c, a_eq, x, budget))
        return min(1.0, worst * (1.0 + 4.0 * U))
    except _TooLarge:
        return None


# The pruned check (:func:`delta_upper_below`) walks at most this many terms: ~40
# evaluations of the largest sums at C = 128, sigma ~ 64 (~7,000 terms each), ~30 ms.
PRUNED_MAX_TERMS = 1_000_000


def _terms(eps, sigma, c, a_first, x, budget):
    """(term2, d3) of :func:`delta_upper` at count ``c - a_first`` and x (= a ln beta
    rounded down): for a_first = a_eq and x = a_eq lb (1 + 4u), exactly the terms
    ``delta_upper`` computes for that a_eq."""
    a_plus = c - a_first
    d2 = shift_delta_upper(_lower_e(eps - x), sigma, a_plus, budget)
    term2 = (-math.expm1(x) + math.exp(x) * d2) * (1.0 + 4.0 * U)
    d3 = shift_delta_upper(_lower_e(eps + x), sigma, a_plus, budget)
    return term2, d3


def delta_upper_below(epsilon, sigma, threshold_gap, max_keys_per_user, level):
    """:func:`delta_upper` by branch and bound over a_eq, for a forward check against
    ``level``: returns B with gshm.delta(...) <= max(B, level), and B <= ``delta_upper``
    (B is ``delta_upper``'s value whenever that exceeds ``level``); None when more than
    ``PRUNED_MAX_TERMS`` terms would be needed. So "B <= delta" with level <= delta shows
    gshm.delta <= delta, as "delta_upper <= delta" does, at a fraction of its cost for
    large C (``delta_upper`` evaluates all 2C terms; here whole ranges of a_eq whose
    terms are all at most ``level`` are dismissed by one bound).

    Why a range's bound holds (paper 004 Thm 5.4's terms; module docstring, item 1).
    delta_+(n, e) is non-decreasing in the count n (n - 1 shifted coordinates are a
    post-processing of n: drop one; the hockey-stick divergence cannot grow) and
    non-increasing in e. For a_eq in [a1, a2] and x2 = a2 lb (1 + 4u) <= a_eq ln beta:
    the last term delta_+(C - a_eq, eps + a_eq ln beta) <= delta_+(C - a1, eps + x2); the
    middle term is g_{C - a_eq}(a_eq ln beta), g_n(x) = 1 - e^x + e^x delta_+(n, eps - x),
    non-increasing in x (item 1) and non-decreasing in n, so it is <= g_{C - a1}(x2).
    Both are evaluated as ``delta_upper`` evaluates one a_eq's terms (:func:`_terms` at
    count C - a1 and x2: upper bounds of the real values with the same rounding
    allowances). A range whose bound exceeds ``level`` is halved; a single a_eq is
    computed exactly as ``delta_upper`` does, so each term B takes is one of its terms. A
    range is dismissed only when its bound compares ``<= level`` (a NaN level dismisses
    nothing: B is then ``delta_upper``'s value)."""
    eps, sigma, c = float(epsilon), float(sigma), int(max_keys_per_user)
    if not (math.isfinite(eps) and eps >= 0 and math.isfinite(sigma) and sigma > 0 and c >= 1
            and math.isfinite(threshold_gap)):
        return 1.0
    budget = _Budget(PRUNED_MAX_TERMS)
    try:
        lb = log_beta_lower(sigma, threshold_gap, budget)
        if lb == -math.inf:
            return 1.0
        worst = -math.expm1(c * lb) * (1.0 + 4.0 * U)
        ranges = [(0, c - 1)]
        while ranges:
            a1, a2 = ranges.pop()
            bound = max(_terms(eps, sigma, c, a1, a2 * lb * (1.0 + 4.0 * U), budget))
            if a1 == a2:
                worst = max(worst, bound)
            elif not bound * (1.0 + 4.0 * U) <= level:     # a NaN level dismisses nothing
                mid = (a1 + a2) // 2
                ranges += [(mid + 1, a2), (a1, mid)]   # the lower half first
        return min(1.0, worst * (1.0 + 4.0 * U))
    except _TooLarge:
        return None


def gaussian_fits(epsilon, delta, max_keys_per_user, sigma):
    """True when the plain upper bound shows delta_+(C, epsilon) <= delta at sigma (the
    planning limit ``pipelines.common.limits._gaussian_fits``); False when it cannot show it."""
    try:
        d = shift_delta_upper(float(epsilon), float(sigma), int(max_keys_per_user))
    except _TooLarge:
        return False
    return d <= delta

"""Tight composition of sample-and-threshold over a user's keys: one dominating pair.

The mechanism (accounting/sample_threshold/core.py): each (user, key) contribution is kept
with probability p independently; a key with k contributions is released with its sampled
count v ~ Bin(k, p) when v >= tau. Write P_k for the law of that one-key output ('absent'
or v in {tau..k}). A user with keys j = 1..C (k_j contributions each, counting the user)
moves the output law from the product of P_{k_j - 1} (without the user) to the product of
P_{k_j} (with the user). Basic composition charges (epsilon / C, delta / C) per key; this
module bounds the composed hockey-stick divergence directly, for every vector
(k_1, ..., k_C) at once. docs/sample_and_threshold.md ("Tight composition across a user's
keys") has the proof in full; in short:

1. Privacy profiles. For measures A, B on a countable set and alpha >= 0 let
   H_alpha(A || B) = sum_o (A(o) - alpha B(o))_+; delta(eps) of the pair in the order
   (A, B) is H_{e^eps}(A || B). For probability measures
       H_alpha(A || B) = 1 - alpha + alpha H_{1/alpha}(B || A),                      (1)
   so the curve alpha -> H_alpha(A || B) over ALL alpha > 0 holds both orders. For the
   one-key pair (A_k, B_k) = (P_k, P_{k-1}): h_k(alpha) = add_k(ln alpha) for alpha >= 1
   and 1 - alpha + alpha remove_k(-ln alpha) for alpha < 1, with add_k, remove_k the
   hockey-stick divergences of accounting.sample_threshold.core.divergences.
2. Domination composes. If H_alpha(A_j || B_j) <= H_alpha(A* || B*) for every alpha >= 0
   and every j, then H_alpha(prod A_j || prod B_j) <= H_alpha(A*^C || B*^C) for every
   alpha: for two factors H_alpha(A x A' || B x B') = sum_{o': A'(o') > 0} A'(o')
   H_{alpha B'(o') / A'(o')}(A || B), monotone in the curve of (A, B); the product is
   symmetric, so replace one factor at a time. (The same holds for the reverse order,
   by (1), and for finite measures of any mass.) Untouched keys are common factors and
   drop out; a user with fewer than C keys, or keys with k < tau (both laws 'absent'),
   has trivial factors (curve (1 - alpha)_+, below any curve).
3. The dominating pair. h*(alpha) = sup_{k >= 1} h_k(alpha) is convex (a supremum of
   convex functions), non-increasing, h*(0) = 1. For alpha_j = e^{x_j} on a grid of
   losses x_j = i_j * step, with upper bounds u_j >= h*(alpha_j), the lower convex hull
   of (0, 1) and the points (alpha_j, u_j) is >= h* everywhere (h* is one of the convex
   functions below the points), and it is the curve of an explicit pair: an A*-atom at
   each hull vertex x_j with B*-mass b_j = (change of the hull's slope there) and
   A*-mass a_j = e^{x_j} b_j, A*-mass u_last at loss +inf, B*-mass (u_0 - 1 + alpha_0) /
   alpha_0 (first vertex) where A* has none ("connect the dots": Doroshenko, Ghazi,
   Kamath, Kumar, Manurangsi, PETS 2022, here on the supremum over k of the asymmetric
   profiles). The masses are taken from A's coordinates for x >= 0 and from B's,
   (beta, H_beta(B||A)) with beta = 1 / alpha, for x < 0 ((1) maps lines to lines: same
   hull), so each side's small values keep their digits. Every atom sits on the grid, so
   the C-fold convolution needs no rounding.
4. sup over k. u_j = max_{tau <= k <= K} (divergence at k) and the divergence of the
   UNthresholded pair (Bin(K+1, p), Bin(K, p)), which bounds every k > K: thresholding is
   a post-processing (data processing), and (Bin(k, p), Bin(k-1, p)) is the image of
   (Bin(k-1, p), Bin(k-2, p)) under "add an independent Bernoulli(p)", so the
   unthresholded divergence is non-increasing in k. K grows until that envelope is below
   the maximum found (then u_j is the supremum itself, to float precision). Each tail
   is taken from scipy with relative error at most 1e-9 (tested against summed pmfs),
   and u_j carries that allowance.
5. The delta. delta(eps) <= max(H_{e^eps}(A*^C || B*^C), H_{e^eps}(B*^C || A*^C)), each
   E[(1 - e^{eps - L})_+] + P[L = +inf] over the C-fold convolution of the side's loss
   law, by direct sums of non-negative terms each scaled up by its floating-point bound
   (1 + 2 n u), with mass above eps + _HEADROOM moved to +inf and mass below
   -(eps + _HEADROOM) moved up to that point: every step can only increase the result.
   Each side's curve is linear between its atoms and h* is convex, so the curve is >= h*
   everywhere once it is at every atom and its total mass is 1: both are checked by sums
   of non-negative terms and any float shortfall of the hull is patched upwards
   (:func:`_patch`).

This replaced (issue 38) a bound that dominated the loss of every k by one variable with
the pointwise supremum of the survival functions P[L_k > x]: it ignored that a loss law
must satisfy E[e^-L] = 1 and charged 8.3e-7 where this pair charges 2.6e-10 at the
heavy_hitters example (p = 0.0426, tau = 10, 48 cells, eps = 1; the worst equal-count
vector found has 1.6e-10). ``benchmarks/bench_sample_threshold_bound.py`` prints the
comparison and the decomposition of the old gap.
"""
import functools
import math

import numpy as np
from thresher.accounting import fixed_order
from thresher.accounting._lazy import special

from thresher.accounting.sample_threshold.core import delta as one_key_delta

# The largest threshold accepted (the k scan starts at tau; bounded work).
MAX_TAU = 1 << 20

# Grid (_grid): losses are multiples of a power-of-two step, the largest below
# epsilon / 32, |ln(1 - p)| / 8 (the width of the losses below 0, where h* bends most) and
# 0.01, but at least what keeps the grid within _MAX_POINTS; each key's atoms and the
# composed law live on [-(epsilon + _HEADROOM), epsilon + _HEADROOM], mass beyond moved
# outwards pessimistically (above: +inf; below: up to the lower edge). Measured against a
# grid 4-10x finer: within 1% at the calibrated points, 7% at p = 0.012, eps = 0.05.
_HEADROOM = 2.0
_MAX_POINTS = 4096
# Relative accuracy assumed of scipy's binomial tails (bdtr/bdtrc; tested against pmf
# sums): every divergence carries this allowance on each of its two terms.
_SCIPY_REL = 1e-9
# The k scan stops once the unthresholded envelope is below the maximum found or below
# _FLOOR (divergences this small move delta by less than 1e-30 per key); and at _K_CAP,
# where the envelope is taken as the bound.
_FLOOR = 1e-30
_K_CAP = 1 << 22
# user_delta: below this composed delta, basic composition is computed too.
_BASIC_BELOW = 1e-15
# Largest (epsilon, k) block evaluated at once (bounded memory).
_MAX_CELLS = 1 << 18
_U = np.finfo(np.float64).eps / 2
# Points where h* is computed (_profile_points): every grid index within _DENSE of 0, then
# every _GROWTH of the index, refined where neighbouring values differ by > _REFINE.
_DENSE = 16
_GROWTH = 1.15
_REFINE = 1.1
# Largest relative shortfall of a side's curve patched by scaling its masses (_patch).
_PATCH_REL = 1e-9


# ---- one key: divergences for a column of epsilons and a row of k ---------------------------

def _cdf(t, k, p):
    """P[Bin(k, p) <= t] for a float array t of integers and an int array k >= 0
    (broadcast): scipy's bdtr with t clipped to [0, k] (it returns nan beyond k)."""
    return np.where(t < 0, 0.0, special.bdtr(np.minimum(np.maximum(t, 0.0), k), k, p))


def _sf(t, k, p):
    """P[Bin(k, p) > t], as :func:`_cdf` (scipy's bdtrc)."""
    return np.where(t < 0, 1.0, special.bdtrc(np.minimum(np.maximum(t, 0.0), k), k, p))


def _add_matrix(p, tau, eps, ks):
    """Upper bounds on add_k(eps) (thresholded at tau; tau = 0: unthresholded), shape
    (len(eps), len(ks)): P[Bin(k,p) > t] - e^eps P[Bin(k-1,p) > t], t = max(floor(k q),
    tau - 1) (core.divergences), plus _SCIPY_REL of both terms."""
    e = fixed_order.exp(eps)[:, None]
    q = (-fixed_order.expm1(-eps) + fixed_order.exp(-eps) * p)[:, None]            # core.add_quantile
    k = ks[None, :]
    t = np.minimum(np.maximum(np.floor(k * q), tau - 1), k)
    with_user, without = _sf(t, k, p), _sf(t, k - 1, p)
    out = with_user - e * without + _SCIPY_REL * (with_user + e * without)
    return np.where(k >= max(tau, 1), np.maximum(out, 0.0), 0.0)


def _remove_matrix(p, tau, eps, ks):
    """Upper bounds on remove_k(eps), shape (len(eps), len(ks)) (core.divergences):
    [P[Bin(k-1,p) < tau] - e^eps P[Bin(k,p) < tau]]_+ + sum_{tau <= v <= m}
    (P_{k-1}(v) - e^eps P_k(v)), m = ceil(k r) - 1, r = 1 - e^eps (1 - p) (every term of
    the sum is positive); tau = 0: unthresholded (no absent term). The range sum is
    taken as differences of lower tails (m < k r < k p: below the mean), with
    _SCIPY_REL of every tail added."""
    e = fixed_order.exp(eps)[:, None]
    r = (p * fixed_order.exp(eps) - fixed_order.expm1(eps))[:, None]               # core.remove_quantile
    k = np.broadcast_to(ks[None, :], (len(eps), len(ks)))
    out = np.zeros(k.shape)
    below_without = below_with = np.zeros((1, len(ks)))
    if tau > 0:
        below_without = _cdf(tau - 1, ks - 1, p)[None, :]      # P_{k-1}(absent)
        below_with = _cdf(tau - 1, ks, p)[None, :]             # P_k(absent)
        absent = (below_without - e * below_with
                  + _SCIPY_REL * (below_without + e * below_with))
        out += np.maximum(absent, 0.0)
    m = np.minimum(np.ceil(k * r) - 1, k - 1)
    some = (m >= tau) & (r > 0)
    if some.any():
        kk, mm = k[some], m[some]
        ee = np.broadcast_to(e, k.shape)[some]
        lo_without = np.broadcast_to(below_without, k.shape)[some]
        lo_with = np.broadcast_to(below_with, k.shape)[some]
        without, with_user = _cdf(mm, kk - 1, p), _cdf(mm, kk, p)
        part = ((without - lo_without) - ee * (with_user - lo_with)
                + _SCIPY_REL * (without + lo_without + ee * (with_user + lo_with)))
        out[some] += np.maximum(part, 0.0)
    return np.where((k >= max(tau, 1)) & (r > 0), out, 0.0)


def sup_divergence(p, tau, eps, direction):
    """u(eps) >= sup_{k >= 1} of one key's divergence in ``direction`` ("add": P_k vs
    P_{k-1}; "remove": P_{k-1} vs P_k) at each eps of an array (>= 0): the maximum over
    tau <= k <= K of the bounds of :func:`_add_matrix` / :func:`_remove_matrix`, and the
    unthresholded divergence at K + 1, which bounds every k > K (module docstring,
    point 4). K doubles per eps until that envelope is below the maximum (or _FLOOR, or
    K = _K_CAP)."""
    eps = np.asarray(eps, dtype=np.float64).reshape(-1)
    p, tau = float(p), int(tau)
    matrix = _add_matrix if direction == "add" else _remove_matrix
    best = np.zeros(eps.shape)
    if direction == "remove":
        active = p * fixed_order.exp(eps) - fixed_order.expm1(eps) > 0   # r > 0, else 0 for every k
    else:
        active = np.ones(eps.shape, dtype=bool)
    start = max(tau, 1)
    width = max(64, int(math.ceil(tau / max(p, 1e-12))) // 4)
    while active.any():
        idx = np.flatnonzero(active)
        stop = min(start + max(64, min(width, _MAX_CELLS // len(idx))), _K_CAP)
        ks = np.arange(start, stop, dtype=np.int64)
        best[idx] = np.maximum(best[idx], matrix(p, tau, eps[idx], ks).max(axis=1))
        envelope = matrix(p, 0, eps[idx], np.array([stop], dtype=np.int64))[:, 0]
        done = (envelope <= best[idx]) | (envelope <= _FLOOR) | (stop >= _K_CAP)
        finished = idx[done]                          # the envelope bounds every k >= stop
        best[finished] = np.maximum(best[finished], envelope[done])
        active[finished] = False
        start, width = stop, 2 * width
    return np.minimum(best, 1.0)


# ---- the dominating pair ---------------------------------------------------------------------

def _grid(epsilon, p):
    """(step, top): losses i * step, |i| <= top (see _HEADROOM)."""
    span = epsilon + _HEADROOM
    target = min(epsilon / 32, -math.log1p(-min(p, 0.5)) / 8, 0.01)
    step = max(2.0 ** math.floor(math.log2(target)),
               2.0 ** math.ceil(math.log2(2 * span / _MAX_POINTS)))
    return step, int(math.ceil(span / step))


def _lower_hull(x, y):
    """Indices of the lower convex hull of the points (x_i, y_i), x increasing."""
    hull = []
    for i in range(len(x)):
        while len(hull) >= 2:
            a, b = hull[-2], hull[-1]
            # b is not below the segment a -> i: drop it
            if (y[b] - y[a]) * (x[i] - x[a]) >= (y[i] - y[a]) * (x[b] - x[a]):
                hull.pop()
            else:
                break
        hull.append(i)
    return hull


def _side_curve(index, mass, inf_mass, sign, at, step):
    """(curve, total): inf_mass + sum over the atoms with loss above x of
    mass (1 - e^{x - loss}), for each loss x = at * step (grid indices), the atoms at
    sign * index * step; and inf_mass + all the mass (the curve at alpha = 0). Sums of
    non-negative terms, scaled DOWN by their float error bound (the true curve is at
    least the value returned)."""
    loss = sign * index
    shrink = 1 - 8 * (len(loss) + 8) * _U
    diff = at[:, None] - loss[None, :]            # x - loss, in grid steps
    weights = np.where(diff < 0, -fixed_order.expm1(np.minimum(diff, 0) * step), 0.0)
    curve = inf_mass + fixed_order.matvec(weights, mass) * shrink   # no BLAS: same bits everywhere
    return curve, inf_mass + float(mass.sum()) * shrink


def _profile_points(p, tau, step, top):
    """(idx, value): grid indices from low = floor(ln(1 - p) / step) (below it the remove
    divergence is 0 for every k, so h*(alpha) = 1 - alpha) to top, and at each the
    supremum over k of the divergence that sets h* there (:func:`sup_divergence`): add
    at x = i * step >= 0, remove at -x for x < 0, the larger of both at x = 0 (they are
    equal there: the total variation). Not every index: a coarse set (the ends, every
    index near 0, then every _GROWTH of the index), then the midpoint of every pair of
    neighbours whose values differ by more than the factor _REFINE, until none does.
    Any subset gives a valid pair (the hull of fewer points is still >= h*); the
    refinement only keeps it close to h*."""
    low = max(-top, int(math.floor(math.log1p(-p) / step)))
    start = set(range(max(low, -_DENSE), min(top, _DENSE) + 1)) | {low, top}
    i = _DENSE
    while i < top:
        i = max(i + 1, int(i * _GROWTH))
        start.add(min(i, top))
    i = -_DENSE
    while i > low:
        i = min(i - 1, int(i * _GROWTH))
        start.add(max(i, low))
    values = {}

    def evaluate(indices):
        indices = np.asarray(sorted(indices), dtype=np.int64)
        pos, neg = indices[indices >= 0], indices[indices < 0]
        add = sup_divergence(p, tau, pos * step, "add")
        remove = sup_divergence(p, tau, -np.append(neg, 0) * step, "remove")
        values.update(zip(pos.tolist(), add.tolist()))
        values.update(zip(neg.tolist(), remove[:-1].tolist()))
        if 0 in values:
            values[0] = max(values[0], float(remove[-1]))

    todo = start
    while todo:
        evaluate(todo)
        idx = np.asarray(sorted(values), dtype=np.int64)
        v = np.asarray([values[i] for i in idx])
        hi, lo = np.maximum(v[:-1], v[1:]), np.minimum(v[:-1], v[1:])
        gap = np.diff(idx) > 1
        split = gap & (hi > _REFINE * lo) & (hi > _FLOOR)
        todo = set(((idx[:-1][split] + idx[1:][split]) // 2).tolist())
    return idx, v


@functools.lru_cache(maxsize=256)
def dominating_pair(p, tau, step, top):
    """The pair of the module docstring (point 3) on the loss grid i * step, |i| <= top.

    Returns (index, a, a_inf, b, b_inf): the grid indices of the atoms, their A*-masses
    (the law of the loss under the with-the-user side) and B*-masses, A*'s mass at loss
    +inf and B*'s mass where A* has none (loss -inf for A*, +inf seen from B*).

    The points: every grid index from floor(ln(1 - p) / step) (below it the remove
    divergence is 0 for every k, so h*(alpha) = 1 - alpha there) to top. Each side is
    then checked against the u_j at every point -- A*: H_alpha(A* || B*) >= u_j; B*:
    H_beta(B* || A*) >= the reverse-order values (1) -- and scaled up by any deficit.
    """
    p, tau, step, top = float(p), int(tau), float(step), int(top)
    idx, value = _profile_points(p, tau, step, top)
    x = idx * step
    neg, pos = x < 0, x >= 0
    # Both curves at every point, each rounded up: u_j >= H_alpha(A||B) at alpha = e^{x_j}
    # and g_j >= H_beta(B||A) at beta = e^{-x_j} (for every k), one computed, the other
    # by (1). The computed one is the small number (add: x >= 0, remove: x < 0).
    u, g = np.empty(len(idx)), np.empty(len(idx))
    u[pos], g[neg] = value[pos], value[neg]
    u[neg] = (-fixed_order.expm1(x[neg]) + fixed_order.exp(x[neg]) * g[neg]) * (1 + 4 * _U)
    g[pos] = (-fixed_order.expm1(-x[pos]) + fixed_order.exp(-x[pos]) * u[pos]) * (1 + 4 * _U)
    u = np.minimum(np.minimum.accumulate(u), 1.0)              # h*: non-increasing
    g = np.minimum(np.minimum.accumulate(g[::-1])[::-1], 1.0)
    # The hull, vertices and masses: in A's coordinates (alpha, u) for x >= 0, where its
    # slopes give B*'s masses from small numbers, and in B's (beta, g) for x < 0, where
    # they give A*'s (the perspective map (1) sends lines to lines, so both hulls have
    # the same vertices; computing each from the small side keeps the digits). Where the
    # remove supremum is 0 (the lowest point) h* = 1 - alpha, every pair's curve: that
    # point enters the hulls unrounded.
    exact = neg & (value == 0)
    u_hull = np.where(exact, -fixed_order.expm1(x), u)
    g_hull = np.where(exact, 0.0, g)
    in_a = _lower_hull(np.append(0.0, fixed_order.exp(x)), np.append(1.0, u_hull))[1:]
    in_b = _lower_hull(np.append(0.0, fixed_order.exp(-x[::-1])), np.append(1.0, g_hull[::-1]))[1:]
    in_a = np.asarray(in_a) - 1
    in_b = len(idx) - np.asarray(in_b)                        # positions in idx
    vertices = np.union1d(in_a[pos[in_a]], in_b[neg[in_b]])
    xv = x[vertices]
    b = _slope_changes(fixed_order.exp(xv), u_hull[vertices])
    a = _slope_changes(fixed_order.exp(-xv[::-1]), g_hull[vertices][::-1])[::-1]
    a = np.where(xv >= 0, b * fixed_order.exp(xv), a)
    b = np.where(xv >= 0, b, a * fixed_order.exp(-xv))
    index = idx[vertices]
    a_inf, b_inf = float(u[-1]), float(g[0])                   # the curves at the ends
    # Each side's curve is linear between its atoms and h* is convex, so the curve is
    # >= h* everywhere once it is at every atom and its total mass is 1: checked in
    # float, patched if short (_patch).
    a_curve, a_total = _side_curve(index, a, a_inf, 1, index, step)
    b_curve, b_total = _side_curve(index, b, b_inf, -1, -index, step)
    factor, extra = _patch(u[vertices], a_curve, a_total, a_inf)
    a, a_inf = a * factor, a_inf + extra
    factor, extra = _patch(g[vertices], b_curve, b_total, b_inf)
    b, b_inf = b * factor, b_inf + extra
    return index, a, a_inf, b, b_inf


def _slope_changes(xs, ys):
    """For points (xs, ys), xs increasing, after the point (0, 1): at each point the
    decrease of the (negated) slope, i.e. the mass of the atom there (0 where the points
    are not convex)."""
    prev_x = np.append(0.0, xs[:-1])
    prev_y = np.append(1.0, ys[:-1])
    slopes = (prev_y - ys) / (xs - prev_x)        # -slope of the segment ending there
    return np.maximum(slopes - np.append(slopes[1:], 0.0), 0.0)


def _patch(target, curve, total, inf_mass):
    """(factor, extra): scaling a side's finite masses by ``factor`` and adding ``extra``
    to its infinite-loss mass makes its curve >= target at every vertex and its total
    mass >= 1. Only float rounding of the hull is patched: a relative shortfall up to
    _PATCH_REL by scaling, what remains (tiny values the hull's sums of numbers near 1
    cannot carry, ~1e-16 absolute) by the additive mass, which raises the curve by that
    amount at every point."""
    target = np.append(target, 1.0)
    curve = np.append(curve, total)
    factor = 1.0
    short = (target > curve) & (curve > inf_mass)
    if short.any():
        ratio = (target[short] - inf_mass) / (curve[short] - inf_mass)
        factor = float(np.minimum(ratio, 1 + _PATCH_REL).max()) * (1 + 4 * _U)
    scaled = inf_mass + factor * (curve - inf_mass) * (1 - 4 * _U)
    extra = float(np.maximum(target - scaled, 0.0).max()) * (1 + 4 * _U)
    return factor, extra


# ---- the C-fold composition -------------------------------------------------------------------

def _side_pmf(index, mass, sign, top):
    """Dense vector over grid indices -top..top of atoms at sign * index (all inside)."""
    v = np.zeros(2 * top + 1)
    np.add.at(v, sign * index + top, mass)
    return v


def _convolve(a, a_inf, b, b_inf, top):
    """Law of L_a + L_b on indices -top..top: mass above goes to +inf, mass below to -top.
    Direct sums of non-negative terms (relative error <= n u / (1 - n u)), scaled up."""
    full = fixed_order.convolve(a, b)             # (no BLAS) index i of full: loss (i - 2 top) step
    inflate = 1 + 2 * (len(a) + 2) * _U
    body = full[top:3 * top + 1] * inflate
    body[0] += float(full[:top].sum()) * inflate
    over = float(full[3 * top + 1:].sum()) * inflate
    inf = a_inf + b_inf
    return body, min(1.0, inf + over)


def composed_pmf(p, tau, max_keys, direction, epsilon):
    """The C-fold convolution of one side's loss law (direction "add": A*, "remove": B*)
    on the grid of :func:`_grid`; returns (pmf over indices -top..top, inf mass, step)."""
    step, top = _grid(epsilon, float(p))
    index, a, a_inf, b, b_inf = dominating_pair(float(p), int(tau), step, top)
    if direction == "add":
        base, base_inf = _side_pmf(index, a, 1, top), a_inf
    else:
        base, base_inf = _side_pmf(index, b, -1, top), b_inf
    result, result_inf = None, 0.0
    power, power_inf = base, base_inf
    c = int(max_keys)
    while c:
        if c & 1:
            if result is None:
                result, result_inf = power.copy(), power_inf
            else:
                result, result_inf = _convolve(result, result_inf, power, power_inf, top)
        c >>= 1
        if c:
            power, power_inf = _convolve(power, power_inf, power, power_inf, top)
    return result, result_inf, step


def hockey_stick(pmf, inf_mass, step, epsilon):
    """sum_i pmf_i (1 - e^{eps - x_i})_+ + inf_mass over x_i = (i - top) step."""
    top = (len(pmf) - 1) // 2
    x = (np.arange(len(pmf)) - top) * step
    weights = -fixed_order.expm1(np.minimum(0.0, epsilon - x))
    return float(inf_mass + fixed_order.dot(pmf, weights) * (1 + 2 * (len(pmf) + 4) * _U))


def _check(epsilon, threshold, max_keys_per_user):
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if int(threshold) > MAX_TAU:
        raise ValueError(f"tau must be <= {MAX_TAU}, got {threshold}")
    if int(max_keys_per_user) < 1:
        raise ValueError(f"max_keys_per_user must be >= 1, got {max_keys_per_user}")


def composed_delta(epsilon, sampling_rate, threshold, max_keys_per_user):
    """An upper bound on delta(epsilon) of the sample-and-threshold release when a user
    contributes to at most ``max_keys_per_user`` keys (any counts k_j), maximised over the
    two neighbour orders. See the module docstring."""
    _check(epsilon, threshold, max_keys_per_user)
    if float(sampling_rate) >= 1.0:
        return 1.0       # v = k = tau is released with certainty, never from tau - 1
    out = 0.0
    for direction in ("add", "remove"):
        pmf, inf_mass, step = composed_pmf(sampling_rate, threshold, max_keys_per_user,
                                           direction, epsilon)
        out = max(out, hockey_stick(pmf, inf_mass, step, epsilon))
    return min(1.0, out)


def user_delta(epsilon, sampling_rate, threshold, max_keys_per_user):
    """The delta the release reports for a user's at most C keys: C = 1, the exact one-key
    delta (core.delta: the supremum over k itself); C >= 2, :func:`composed_delta`, and
    below _BASIC_BELOW the smaller of it and basic composition (C times the exact
    one-key delta at epsilon / C: both bound the same release, and basic wins only
    where the composed bound's float allowances, ~1e-16 per key, dominate)."""
    c = int(max_keys_per_user)
    _check(epsilon, threshold, c)
    if c == 1:
        return one_key_delta(epsilon, sampling_rate, threshold)
    composed = composed_delta(epsilon, sampling_rate, threshold, c)
    if composed >= _BASIC_BELOW:
        return composed
    return min(composed, c * one_key_delta(epsilon / c, sampling_rate, threshold))

"""Tight composition of sample-and-threshold over a user's keys (privacy-loss distributions).

The mechanism (accounting/sample_threshold/core.py): each (user, key) contribution is kept with
probability p independently; a key with k contributions is released with its sampled count
v ~ Bin(k, p) when v >= tau. Write P_k for the law of that one-key output ('absent' or
v in {tau..k}). A user with keys j = 1..C (k_j contributions each, counting the user)
changes the output law from the product of P_{k_j - 1} (without the user) to the product
of P_{k_j} (with the user). Basic composition charges (epsilon / C, delta / C) per key;
this module bounds the composed hockey-stick divergence directly (docs/sample_and_threshold.md,
"Tight composition across a user's keys", has the proof).

For a pair (Q, P) write L = ln(Q(o) / P(o)) for o ~ Q (the privacy loss, +inf where
P(o) = 0). Then

    delta_{Q||P}(eps) = E_Q[(1 - e^{eps - L})_+]                                     (1)

(Dwork & Rothblum 2016; Sommer, Meiser, Mohammadi 2019, Lemma 5), and for products
Q = prod Q_j, P = prod P_j the loss is the sum of independent per-key losses L_j. The
function s -> (1 - e^{eps - s})_+ is non-decreasing, so (1) is monotone in the usual
stochastic order: if L_j <=_st L*_j for every j then delta of the composition is at most
E[(1 - e^{eps - sum_j L*_j})_+] (sums of independent variables preserve the stochastic
order). We build one variable L* that stochastically dominates the per-key loss L_k for
EVERY k >= 1, in each direction, by taking the pointwise supremum over k of the survival
functions S_k(x) = P[L_k > x] (an upper bound of it, computed exactly for small k and by
monotone binomial bounds and a Chernoff tail beyond), on a grid x_i = i * step rounded up
(the pessimistic discretisation of Meiser & Mohammadi 2018 / dp_accounting):

    P[L* >= x_{i+1}] = S*(x_i) >= sup_k S_k(x_i),   L* = +inf with probability S*(x_top).

Since sup_k S_k(x) = 1 for every x < 0 (the loss of a key with many users tends to 0), L*
lives on {0, step, 2 step, ...} plus +inf. Its C-fold convolution is computed by direct
(non-FFT) sums of non-negative terms, each result scaled up by the floating-point bound
(1 + 2 n u), and mass above ``epsilon + _HEADROOM`` moved to +inf, both of which can only
increase (1). The release's delta is the larger of the two directions (with / without
the user). The bound holds for every vector (k_1, ..., k_C), i.e. for any data.
"""
import functools
import math

import numpy as np
from thresher.accounting._lazy import special

from thresher.accounting.sample_threshold.core import (_cdf, _sf, add_quantile, kl_divergence,
                                                      remove_quantile)
from thresher.accounting.sample_threshold.core import delta as one_key_delta

# The largest threshold whose per-k remove-direction bounds are computed exactly (k <= 2**20).
MAX_TAU = 1 << 20

# Grid: the composed loss is tracked on [0, epsilon + _HEADROOM]; mass above goes to +inf
# (at most e^-_HEADROOM of that mass is overcharged).
_HEADROOM = 3.0
# Number of grid steps below epsilon: the rounding adds at most C * step to the loss.
_STEPS_PER_EPSILON = 1000
# k <= _EXACT_K_FACTOR * tau / p + 64: survival computed exactly for each k.
_EXACT_K_FACTOR = 4
# Blocks [k_a, k_b] bounded by one binomial tail each, up to k_max(p, tau) =
# max(_K_MAX, 400 (tau + 10) / p); beyond, Chernoff.
_K_MAX = 1 << 18
_BLOCK_WIDTH = 0.1  # block width in standard deviations of Bin(k, p)
_U = np.finfo(np.float64).eps / 2
# Survival values below this are held constant for larger x (still an upper bound); the
# mass then sits at +inf and adds at most C * 1e-25 to delta.
_NEGLIGIBLE = 1e-25


def _k_max(p, tau):
    """Where the blocks end: far enough that the Chernoff bounds beyond are tiny for every
    x not close to 0 (k p >= 400 (tau + 10))."""
    return max(_K_MAX, int(400 * (tau + 10) / p))


def _block_edges(k_start, p, k_max):
    """Block edges from k_start to k_max: block j is [edges[j], edges[j+1]). Each
    block's width is about _BLOCK_WIDTH standard deviations of Bin(k, p) divided by p (so
    the block moves the binomial's mean by that fraction of its spread); near tau the
    blocks are single k (exact)."""
    edges = [int(k_start)]
    k = int(k_start)
    while k < k_max:
        k = min(k_max, k + max(1, int(_BLOCK_WIDTH * math.sqrt(k * (1 - p) / p))))
        edges.append(k)
    return np.asarray(edges, dtype=np.int64)


def block_bounds(p, tau, direction):
    """(k_max, ka, kb, peak, body) of :func:`survival_bound`: block j covers k in
    [ka[j], kb[j]]; ``body(x, blocks)`` is, for each x of an array, the max over the given
    blocks (a slice) of the one-tail bound of each block (survival_bound's docstring), an
    upper bound on P[L_k > x] for every k in those blocks. Module level so that tests can
    check each block's bound against brute-force sums (tests/accounting/
    test_sample_threshold_pld.py)."""
    p, tau = float(p), int(tau)
    k_max = _k_max(p, tau)
    edges = _block_edges(tau, p, k_max)
    ka, kb = edges[:-1], edges[1:] - 1  # inclusive block ends
    peak = int(np.searchsorted(ka, _EXACT_K_FACTOR * tau / p + 64))  # blocks of the bulk
    if direction == "remove":
        # a_k <= -ln(1 - p) always (P[Bin(k,p) < tau] >= (1 - p) P[Bin(k-1,p) < tau]);
        # computed exactly while P[Bin(k-1, p) < tau] is not negligible.
        a_cap = -math.log1p(-p)
        k_top = min(k_max, int(20 * tau / p) + 1000, MAX_TAU)
        ks = np.arange(tau, k_top + 1, dtype=np.int64)
        with np.errstate(divide="ignore", invalid="ignore"):
            a_k = np.log(_cdf(tau - 1, ks - 1, p)) - np.log(_cdf(tau - 1, ks, p))
        a_k = np.where(np.isfinite(a_k), np.minimum(a_k, a_cap), a_cap)
        inside = ka <= k_top
        a_block = np.full(len(ka), a_cap)
        a_block[inside] = np.maximum.reduceat(a_k, ka[inside] - tau)
        a_block[np.flatnonzero(inside)[-1]] = a_cap  # the last one may straddle k_top

    def body(x, blocks):
        """max over the given blocks of the block bounds, for each x (a column)."""
        a, b = ka[blocks][None, :], kb[blocks][None, :]
        x = x[:, None]
        if direction == "add":
            q = 1.0 - (1.0 - p) * np.exp(-x)
            t = np.maximum(np.floor(a * q), tau - 1)
            return _sf(t, np.broadcast_to(b, t.shape), p).max(axis=1, initial=0.0)
        r = 1.0 - (1.0 - p) * np.exp(x)
        m = np.ceil(b * r) - 1  # largest v with v < k r, at the block's end
        absent_counts = a_block[blocks][None, :] > x
        limit = np.where(absent_counts, np.maximum(m, tau - 1), m)
        vals = np.where(absent_counts | (m >= tau),
                        _cdf(limit, np.broadcast_to(a - 1, limit.shape), p), 0.0)
        return vals.max(axis=1, initial=0.0)

    return k_max, ka, kb, peak, body


def survival_bound(p, tau, direction, xs):
    """S*(x) >= sup_{k >= 1} P[L_k > x] for each x in ``xs`` (non-negative, increasing).

    direction "add": Q = P_k (with the user), P = P_{k-1}. The loss of outcome v in
      [tau, k - 1] is ln((1 - p) k / (k - v)), increasing in v and > x exactly when
      v > k q(x), q(x) = 1 - (1 - p) e^-x (paper 003, Lemma 3.1 for the ratio); v = k has
      loss +inf; 'absent' has loss <= 0 (P_k(absent) <= P_{k-1}(absent)). So for x >= 0:
      S_k(x) = P[Bin(k, p) > max(floor(k q(x)), tau - 1)].
    direction "remove": Q = P_{k-1}, P = P_k. Outcome v in [tau, k - 1] has loss
      ln((k - v) / ((1 - p) k)) > x exactly when v < k r(x), r(x) = 1 - (1 - p) e^x;
      'absent' has loss >= 0; v = k never occurs under Q. So
      S_k(x) = [a_k > x] P[Bin(k-1, p) < tau] + P[tau <= Bin(k-1, p) <= m_k],
      m_k = ceil(k r(x)) - 1, a_k = ln(P[Bin(k-1, p) < tau] / P[Bin(k, p) < tau]); so
      S_k(x) <= P[Bin(k-1, p) <= max(tau - 1, m_k)] if a_k > x, else
      [m_k >= tau] P[Bin(k-1, p) <= m_k].
    k < tau: both outputs are always 'absent', S_k = 0 for x >= 0. For k in a block
    [k_a, k_b) (single k near tau) the binomial's monotonicity in k (Bin(k_a, p) is
    stochastically below Bin(k, p), which is below Bin(k_b, p)) and of the thresholds in
    k bounds S_k by one tail at the block's ends:
      add:    S_k(x) <= P[Bin(k_b - 1, p) > max(floor(k_a q), tau - 1)],
      remove: the same with a_k replaced by its maximum over the block, m_k by m_{k_b},
              and Bin(k - 1, p) by Bin(k_a - 1, p) (a lower tail).
    For k >= k_max (:func:`_k_max`) the Chernoff bounds of accounting.sample_threshold.core._tail_bound:
    exp(-k D(q || p)) (add), exp(-(k - 1) D(s || p)) with s >= max(tau, k r) / (k - 1)
    (remove), both decreasing in k.
    """
    xs = np.asarray(xs, dtype=np.float64)
    p, tau = float(p), int(tau)
    if tau > MAX_TAU:
        raise ValueError(f"tau must be <= {MAX_TAU} (the exact per-k range of the remove "
                         f"direction), got {tau}")
    if direction not in ("add", "remove"):
        raise ValueError(f"direction must be 'add' or 'remove', got {direction!r}")
    if p >= 1.0:
        return np.ones_like(xs)  # v = k = tau is released with certainty, never from tau - 1
    k_max, ka, _, peak, body = block_bounds(p, tau, direction)

    def chernoff(x, k):
        """Bound on S_k'(x) for every k' >= k (decreasing in k)."""
        if direction == "add":
            q = 1.0 - (1.0 - p) * math.exp(-x)
            return math.exp(-k * kl_divergence(q, p)) if q > p else 1.0
        r = 1.0 - (1.0 - p) * math.exp(x)
        s = max(tau / (k - 1), r) * k / (k - 1)
        return math.exp(-(k - 1) * kl_divergence(s, p)) if 0 < s < p else 1.0

    out = body(xs, slice(0, peak))  # the bulk, k <= 4 tau / p + 64, for every x at once
    for i, x in enumerate(xs):
        if i and out[i - 1] <= _NEGLIGIBLE:  # S* is non-increasing: hold the last value
            out[i:] = out[i - 1]
            break
        # Blocks beyond the bulk only while the Chernoff bound from their start could
        # still exceed 1e-6 of the maximum found; the bound at the stop covers the rest.
        stop = len(ka)
        for j in range(peak, len(ka), 64):
            if chernoff(x, int(ka[j])) <= 1e-6 * out[i]:
                stop = j
                break
        if stop > peak:
            out[i] = max(out[i], body(np.array([x]), slice(peak, stop))[0])
        k_stop = int(ka[stop]) if stop < len(ka) else k_max
        out[i] = max(out[i], chernoff(x, k_stop), _NEGLIGIBLE)
    out = np.minimum(1.0, out * (1 + 1e-9))  # scipy's tails: relative error << 1e-9
    return np.maximum.accumulate(out[::-1])[::-1]  # the sup is non-increasing in x


def _grid(epsilon, max_keys):
    step = epsilon / _STEPS_PER_EPSILON
    top = int(math.ceil((epsilon + _HEADROOM) / step))
    return step, top


@functools.lru_cache(maxsize=256)
def dominating_pmf(p, tau, direction, step, top):
    """(pmf over x_i = i * step, i = 0..top, mass at +inf): the distribution of L*.

    P[L* >= x_{i+1}] = S*(x_i) (rounded up); mass at x_0 = 0 is 1 - S*(x_0); the mass above
    x_top is at +inf. S* is evaluated on a coarser grid (every few steps) and held
    constant in between (3% of x apart), again an upper bound as S_k is non-increasing.
    """
    # S* at the grid indices 0..15, then every 3% up to x = epsilon and every 10% beyond
    # (a key's loss is rounded up by at most that fraction of itself past 16 steps).
    idx, knee = [0], _STEPS_PER_EPSILON  # the grid index of x = epsilon
    while idx[-1] < top:
        growth = 1.03 if idx[-1] < knee else 1.1
        idx.append(min(top, max(idx[-1] + 1, int(idx[-1] * growth))))
    idx = np.asarray(idx)
    s_coarse = survival_bound(p, tau, direction, idx * step)
    # S*(x_i) <= S*(x_j) for the largest evaluated j <= i (S_k is non-increasing)
    s = s_coarse[np.searchsorted(idx, np.arange(top + 1), side="right") - 1]
    pmf = np.empty(top + 1)
    pmf[0] = 1.0 - s[0]
    pmf[1:] = s[:-1] - s[1:]
    return np.maximum(pmf, 0.0) * (1 + 1e-12), float(s[-1])


def _convolve(a, a_inf, b, b_inf, top):
    """Law of L_a + L_b (independent) truncated to [0, top]: mass above goes to +inf.
    Direct sums of non-negative terms (relative error <= n u / (1 - n u)), scaled up."""
    full = np.convolve(a, b)
    n = min(len(a), len(b))
    inflate = 1 + 2 * n * _U
    body = full[:top + 1] * inflate
    over = float(full[top + 1:].sum()) * inflate
    inf = a_inf + b_inf - a_inf * b_inf
    return body, min(1.0, inf + over)


def composed_pmf(p, tau, max_keys, direction, epsilon):
    """L* convolved with itself max_keys times (binary powers), on the grid of
    :func:`_grid`; returns (pmf, inf_mass, step)."""
    step, top = _grid(epsilon, max_keys)
    base, base_inf = dominating_pmf(float(p), int(tau), direction, step, top)
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
    """(1): sum_i pmf_i (1 - e^{eps - x_i})_+ + inf_mass."""
    x = np.arange(len(pmf)) * step
    weights = -np.expm1(np.minimum(0.0, epsilon - x))
    return float(inf_mass + np.dot(pmf, weights) * (1 + 2 * len(pmf) * _U))


def composed_delta(epsilon, sampling_rate, threshold, max_keys_per_user):
    """An upper bound on delta(epsilon) of the sample-and-threshold release when a user
    contributes to at most ``max_keys_per_user`` keys (any counts k_j), maximised over the
    two directions. See the module docstring."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    out = 0.0
    for direction in ("add", "remove"):
        pmf, inf_mass, step = composed_pmf(sampling_rate, threshold, max_keys_per_user,
                                           direction, epsilon)
        out = max(out, hockey_stick(pmf, inf_mass, step, epsilon))
    return min(1.0, out)


def user_delta(epsilon, sampling_rate, threshold, max_keys_per_user):
    """The smaller of :func:`composed_delta` and basic composition (C times the exact
    one-key delta at epsilon / C): both bound the same release, so their minimum does.
    The PLD bound wins for several keys at small delta; basic can win for one or two
    keys at large delta, where the grid's rounding dominates."""
    c = int(max_keys_per_user)
    basic = c * one_key_delta(epsilon / c, sampling_rate, threshold)
    if basic == 0.0:
        return 0.0
    return min(1.0, basic, composed_delta(epsilon, sampling_rate, threshold, c))

"""Continual release of per-key distinct-user counts over a horizon of T periods: the
tree, its cost, its key selection and its intervals (pure math; numpy only).

**The tree** (the binary mechanism: Chan, Shi & Song, "Private and continual release of
statistics", ACM TISSEC 2011, Sec. 3.4; Dwork, Naor, Pitassi & Rothblum, STOC 2010).
Periods are 1..T. Node (j, a) at level j >= 0 covers periods a 2^j + 1 .. (a + 1) 2^j.
The cumulative count at period t is the sum of the nodes of t's binary decomposition:
for each set bit j of t, the node (j, 2 (t >> (j + 1))) -- always a *left* child (even
index), ending at or before t. Only those nodes ("p-sums", Chan et al.) are ever read,
so only they are noised: node (j, a) is *used* iff a is even and (a + 1) 2^j <= T. A
period's count then lies in L(T) used nodes at most (:func:`levels`, the largest number of
used nodes containing one leaf; 1 + floor(log2 T)), and the cumulative count at t
carries popcount(t) node noises (:func:`nodes_in_prefix`; at most K(T) =
:func:`max_prefix_nodes`).

**Sensitivity and zCDP.** User-level over the whole horizon: a neighbour adds or removes
every record of one user, in every period. Each user contributes to at most C keys over
the horizon, each (user, key) once, at the first period it is counted in (the bounding of
``pipelines.continual``), so per key the user adds 1 to one leaf, hence 1 to at most L(T)
used nodes, and the vector of every key's used node sums moves by an integer vector with
squared l2 norm <= C L(T). Independent discrete Gaussian noise N_Z(0, sigma^2) per node
makes the release rho-zCDP with rho = C L(T) / (2 sigma^2) (Canonne, Kamath & Steinke,
"The discrete Gaussian for differential privacy", NeurIPS 2020, Thm 4 per coordinate;
Renyi divergences of independent coordinates add: ``accounting.zcdp.gaussian_rho``).
Everything published is post-processing of the node values of the keys present.

**Key selection** (keys only grow, as in DP-SQLP's continual key selection, Algorithms
1-4 of the DP-SQLP paper, 2024; here in our own form, thresholding the tree's own noisy
cumulative counts). A key is
released from the first period t at which its noisy cumulative count reaches the
threshold tau, and stays released. Only keys with a true cumulative count >= 1 are
tested. At a period where no user but the added one has reached a key yet, the key is
tested in one neighbour (count 1) and not in the other (count 0); it crosses only if
1 + N_t >= tau, N_t the sum of popcount(t) node noises. By the union bound over periods
and over the user's <= C keys, the probability of any such crossing is at most

    delta_sel = C * sum_{t=1..T} P(S_{popcount(t)} >= tau - 1),

S_k the sum of k i.i.d. N_Z(0, sigma^2), computed exactly by convolution
(``accounting.discrete_gaussian.sum_pmf``, its truncated mass added to each tail).

*The (epsilon, delta) argument.* Let D' = D plus user u, g_S the map from node values to
the published series that evaluates the pairs (key, period) of S (a key's noisy cumulative
count against tau, keys staying once released), so M(D) = g_{S(D)}(tree(D)) with S(D) the
pairs whose true cumulative count in D is >= 1. The node values of the keys present in
either input, tree(D) and tree(D'), differ by the shift above, so for any fixed map g,
g(tree(D)) and g(tree(D')) are (epsilon, delta_conv)-indistinguishable (rho-zCDP and the
CKS conversion). S(D') exceeds S(D) only by pairs (k, t) of u's keys whose count in D is
0 and in D' is 1. (i) M(D') differs from g_{S(D)}(tree(D')) only if one of those pairs
crosses, 1 + N_t >= tau: probability <= delta_sel; so P[M(D') in A] <= e^eps P[M(D) in A]
+ delta_conv + delta_sel. (ii) M(D) differs from g_{S(D')}(tree(D)) only if one of them
crosses at 0 + N_t >= tau: probability <= delta_sel again; so P[M(D) in A] <= e^eps
P[M(D') in A] + delta_conv + delta_sel. The series is (epsilon, delta_conv + delta_sel)-DP.

*The ledger's zcdp record.* A key u reaches before anyone else in D has its early
selection tests and its later node values correlated (the nodes are shared), so
conditioning on "no early crossing" changes the law of the later values and the GSHM-style
record (rho, delta_sel) is not proved here. :func:`privacy_record` therefore charges the
horizon from its (epsilon, delta) claim, (epsilon^2 / 2, delta)
(``zcdp.approximate_record``): sound, and loose under ``composition: zcdp``.

**Calibration** (:func:`calibrate`): delta_sel = ``selection_share`` x delta; rho the
largest whose conversion at delta - delta_sel is <= epsilon (``zcdp.rho_budget``); sigma
from rho; tau the least integer whose union bound is <= delta_sel. The whole horizon's
cost is fixed here, before period 1.

**Accuracy** (:func:`noise_ratio`): the worst-case noise sd of a cumulative count is sigma
sqrt(K(T)) = sqrt(C L(T) K(T) / (2 rho)); re-releasing cumulative counts every period at
the same total rho (T releases, each moved by 1 per key) gives sqrt(C T / (2 rho)). The
ratio sqrt(L(T) K(T) / T) is 0.44 at T = 365, 0.82 at T = 30, 0.30 at T = 1000; at or
above 1 (T <= 3 or so) the tree does not pay and the plan says to release one-shot.

**Intervals** (:class:`PrefixTail`): the noise of the cumulative count at t is exactly
S_{popcount(t)} (log-concave: a convolution of log-concave laws), and every released
count gets the equal-tailed Neyman interval of ``accounting.intervals`` for that law,
untruncated: P(true count outside [count_low, count_high]) <= alpha for each key and
period, over the noise (docs/continual.md says what this does and does not condition on).
"""
import dataclasses
import functools
import math

import numpy as np

from thresher.accounting import discrete_gaussian as dg
from thresher.accounting import intervals
from thresher.accounting import zcdp

DEFAULT_SELECTION_SHARE = 0.5
MAX_HORIZON = 100_000
# sigma is stretched by this relative margin so that its rho, recomputed in floats, stays
# at or below the budget's rho.
_SIGMA_MARGIN = 1e-12


# ---- the tree ---------------------------------------------------------------------------

def _check_horizon(horizon):
    horizon = int(horizon)
    if not 1 <= horizon <= MAX_HORIZON:
        raise ValueError(f"horizon must be in 1..{MAX_HORIZON}, got {horizon}")
    return horizon


def prefix_nodes(t):
    """The used nodes (level, index) whose sums make the cumulative count at period t >= 1:
    one per set bit j of t, (j, 2 (t >> (j + 1)))."""
    t = int(t)
    return [(j, 2 * (t >> (j + 1))) for j in range(t.bit_length()) if (t >> j) & 1]


def nodes_in_prefix(t):
    """How many node noises the cumulative count at period t carries: popcount(t)."""
    return bin(int(t)).count("1")


def node_span(level, index):
    """(first period, last period) of node (level, index)."""
    return index * (1 << level) + 1, (index + 1) * (1 << level)


def leaf_nodes(s, horizon):
    """The used nodes containing period s (at level j: index floor((s-1)/2^j), used iff
    even and ending by the horizon)."""
    out = []
    for j in range(_check_horizon(horizon).bit_length()):
        a = (int(s) - 1) >> j
        if a % 2 == 0 and (a + 1) << j <= horizon:
            out.append((j, a))
    return out


@functools.lru_cache(maxsize=256)
def levels(horizon):
    """L(T): the most used nodes one period lies in (period 1 lies in the most:
    1 + floor(log2 T))."""
    return len(leaf_nodes(1, _check_horizon(horizon)))


@functools.lru_cache(maxsize=256)
def max_prefix_nodes(horizon):
    """K(T): the most node noises a cumulative count carries, max popcount(t) for t <= T."""
    horizon = _check_horizon(horizon)
    return (horizon + 1).bit_length() - 1


@functools.lru_cache(maxsize=256)
def prefix_node_counts(horizon):
    """{k: number of periods t <= T with popcount(t) = k}."""
    horizon = _check_horizon(horizon)
    counts = np.bincount([nodes_in_prefix(t) for t in range(1, horizon + 1)])
    return {int(k): int(n) for k, n in enumerate(counts) if n}


def noise_ratio(horizon):
    """Worst-case noise sd of a cumulative count over the horizon, tree / re-release every
    period at the same total rho: sqrt(L(T) K(T) / T) (module docstring)."""
    horizon = _check_horizon(horizon)
    return math.sqrt(levels(horizon) * max_prefix_nodes(horizon) / horizon)


def noise_units(horizon):
    """(tree, re-release) worst-case noise sd in units of sqrt(C / (2 rho))."""
    horizon = _check_horizon(horizon)
    return math.sqrt(levels(horizon) * max_prefix_nodes(horizon)), math.sqrt(horizon)


# ---- calibration --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Calibration:
    """The horizon's whole cost and its parameters (plain values, the report's)."""
    horizon: int
    max_keys_per_user: int
    epsilon: float                # the spec's total
    delta: float
    sigma: float                  # node noise, discrete Gaussian scale
    threshold: int                # tau: a key is released once 1 + ... reaches it
    rho: float                    # zCDP of the node values
    delta_selection: float        # delta0: union bound of a lone key ever released
    epsilon_achieved: float       # conversion of rho at delta - delta_selection
    levels: int
    max_prefix_nodes: int

    def as_dict(self):
        return dataclasses.asdict(self)

    def sd_at(self, period):
        return self.sigma * math.sqrt(nodes_in_prefix(period))


def gaussian_sum_tail(sigma, k, x):
    """An upper bound on P(S_k >= x), S_k a sum of k i.i.d. N_Z(0, sigma^2): the exact
    convolution's tail plus its truncated mass (``discrete_gaussian.sum_pmf``)."""
    offset, p, cut = _sum_pmf(float(sigma), int(k))
    start = int(x) - offset
    if start <= 0:
        return 1.0
    tail = float(np.sum(p[start:])) if start < p.size else 0.0
    return min(1.0, tail + cut)


@functools.lru_cache(maxsize=64)
def _sum_pmf(sigma, k):
    return dg.sum_pmf(k, sigma)


def selection_delta(sigma, threshold, horizon, max_keys_per_user):
    """delta_sel = C sum_t P(1 + S_{popcount(t)} >= tau) (module docstring)."""
    total = 0.0
    for k, periods in prefix_node_counts(horizon).items():
        total += periods * gaussian_sum_tail(sigma, k, int(threshold) - 1)
    return min(1.0, int(max_keys_per_user) * total)


def _least_threshold(sigma, horizon, max_keys_per_user, target):
    """The least integer tau >= 2 with selection_delta <= target (it decreases in tau)."""
    lo = 2
    hi = 2 + int(math.ceil(40.0 * sigma * math.sqrt(max_prefix_nodes(horizon))))
    if selection_delta(sigma, hi, horizon, max_keys_per_user) > target:
        raise ValueError("no threshold meets the selection delta within 40 sigma")
    while lo < hi:
        mid = (lo + hi) // 2
        if selection_delta(sigma, mid, horizon, max_keys_per_user) <= target:
            hi = mid
        else:
            lo = mid + 1
    return lo


def calibrate(epsilon, delta, max_keys_per_user, horizon,
              selection_share=DEFAULT_SELECTION_SHARE):
    """The horizon's parameters meeting (epsilon, delta) at bound C (module docstring).
    Raises ValueError when none do."""
    horizon = _check_horizon(horizon)
    c = int(max_keys_per_user)
    if not 0 < selection_share < 1:
        raise ValueError(f"selection_share must be in (0, 1), got {selection_share}")
    delta_sel_budget = float(delta) * float(selection_share)
    rho_budget = zcdp.rho_budget(float(epsilon), float(delta) - delta_sel_budget)
    if rho_budget <= 0:
        raise ValueError("no rho fits the budget")
    sensitivity = c * levels(horizon)
    sigma = math.sqrt(sensitivity / (2.0 * rho_budget)) * (1.0 + _SIGMA_MARGIN)
    rho = zcdp.gaussian_rho(sensitivity, sigma)
    if rho > rho_budget:             # cannot happen with the margin; never overspend
        raise ArithmeticError("sigma's rho exceeds the budget")
    threshold = _least_threshold(sigma, horizon, c, delta_sel_budget)
    delta_sel = selection_delta(sigma, threshold, horizon, c)
    eps = zcdp.epsilon_of_rho(rho, float(delta) - delta_sel)
    if eps > float(epsilon) * (1 + 1e-9):
        raise ArithmeticError("the conversion exceeds epsilon")
    return Calibration(horizon=horizon, max_keys_per_user=c, epsilon=float(epsilon),
                       delta=float(delta), sigma=sigma, threshold=int(threshold), rho=rho,
                       delta_selection=delta_sel, epsilon_achieved=eps,
                       levels=levels(horizon), max_prefix_nodes=max_prefix_nodes(horizon))


def privacy_record(calibration):
    """The horizon's approximate-zCDP record, charged once: from its (epsilon, delta)
    claim (module docstring, "The ledger's zcdp record")."""
    return zcdp.approximate_record(calibration.epsilon, calibration.delta)


# ---- intervals ------------------------------------------------------------------------------

class PrefixTail:
    """log P(S_k >= z) of the cumulative count's noise at a period with k = popcount(t)
    node noises, for ``accounting.intervals.count_bounds`` (the interface of its
    ``NoiseTail``: ``noise``, ``_hi``, ``log_sf``), from the exact convolution."""
    noise = intervals.GAUSSIAN

    def __init__(self, sigma, k):
        offset, p, _ = _sum_pmf(float(sigma), int(k))
        with np.errstate(divide="ignore"):
            logp = np.log(p)
        # log P(S >= z) for z = offset .. offset + len - 1, summed from the top
        table = np.logaddexp.accumulate(logp[::-1])[::-1]
        self._offset = int(offset)
        self._table = np.minimum(table, 0.0)
        self._lo = int(offset)
        self._hi = int(offset) + p.size - 1

    def log_sf(self, z):
        z = np.asarray(z, dtype=np.int64)
        out = np.empty(z.shape, dtype=np.float64)
        inside = (z >= self._lo) & (z <= self._hi)
        out[inside] = self._table[z[inside] - self._offset]
        out[z > self._hi] = -np.inf
        out[z < self._lo] = 0.0
        return out


def count_intervals(values, sigma, period, confidence):
    """(count_low, count_high): int64 arrays, the Neyman interval at ``confidence`` of each
    noisy cumulative count released at ``period`` (true counts >= 1)."""
    values = np.asarray(values, dtype=np.int64)
    tail = PrefixTail(sigma, nodes_in_prefix(period))
    return intervals.count_bounds(values, tail, 1.0 - float(confidence), floor=1)

"""Privacy of sample-and-threshold: Poisson-sample contributions, release counts >= tau.

Papers 000 (Bharadwaj & Cormode, short version, App. A) and 003 (full version, Sec. 3).

The mechanism, per key with k contributions (l_inf = 1: one per user): each contribution
is kept independently with probability p (``sampling_rate``); the key is released with
its sampled count v ~ Bin(k, p) when v >= tau (``threshold``), and is absent otherwise.
Neighbouring inputs (add/remove one user) turn k into k - 1 for each of the user's keys.

Three ways to get delta for a given epsilon (``method``):

- ``"exact"`` -- the hockey-stick divergence of the two output distributions, "thresholded
  Bin(k, p)" and "thresholded Bin(k - 1, p)" (all v < tau merged into one 'absent'
  outcome), in both directions, maximised over k >= 1. Not in the papers; see
  :func:`divergences` for the closed forms and :func:`_tail_bound` for why a finite range
  of k suffices. It is the smallest delta any analysis of this mechanism can claim.
- ``"kl"`` -- paper 003, Theorem 1: needs exp(-epsilon) <= 1 - p, then
  delta = exp(-(tau / q) D(q || p)) with q = 1 - exp(-epsilon) (1 - p).
- ``"alpha"`` -- paper 003, Lemma after Thm 1: p = alpha (1 - exp(-epsilon)) with
  0 < alpha <= 1 and epsilon <= 1, delta = exp(-C_alpha tau),
  C_alpha = ln(1/alpha) - 1/(1 + alpha). (epsilon = 1, alpha = 1/6: p = 0.105,
  C_alpha = 0.935, tau = 20 gives delta < 1e-8.)

A bound's hypotheses failing is reported as delta = 1 (the bound says nothing).

Several keys per user: each (user, key) contribution is sampled independently (the
kernel draws Bin(count, p) per key, which has exactly that law), so the release is a
product of independent per-key mechanisms and a user touching at most C keys changes at
most C factors by one contribution each: basic composition (Dwork & Roth 2014,
Thm 3.16) makes the release (C eps_0, C delta_0)-DP when every key is
(eps_0, delta_0)-DP. :func:`calibrate` with ``composition="basic"`` gives each key
(epsilon / C, delta / C); with ``composition="pld"`` (the default of the release kind) it
meets (epsilon, delta) for the whole user by the privacy-loss-distribution bound of
:mod:`accounting.sample_threshold.pld`, which allows a much lower release point
(accounting.sample_threshold.calibration joins the two).
"""
import dataclasses
import math

import numpy as np
from thresher.accounting._lazy import special

from thresher.accounting.search import smallest_integer, smallest_real

METHODS = ("exact", "kl", "alpha")
COMPOSITIONS = ("pld", "basic")

# The exact search over k stops once the tail bound beyond the range is below this
# fraction of the largest divergence found (or below _TAIL_FLOOR in absolute terms).
_TAIL_REL = 1e-6
_TAIL_FLOOR = 1e-300
_K_CHUNK = 1 << 20
_K_MAX = 1 << 23
# sampling_rate_for never returns rates below this (they release nothing useful).
_MIN_SAMPLING_RATE = 1e-12


class CalibrationInfeasible(ValueError):
    """No sampling rate / threshold meets the requested (epsilon, delta)."""


def _check(epsilon, sampling_rate, threshold, method):
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not (0 < sampling_rate <= 1):
        raise ValueError(f"sampling_rate must be in (0, 1], got {sampling_rate}")
    if isinstance(threshold, bool) or int(threshold) != threshold or threshold < 1:
        raise ValueError(f"threshold must be an integer >= 1, got {threshold}")


def kl_divergence(a, b):
    """D(a || b) between Bernoulli(a) and Bernoulli(b), in nats."""
    return float(special.rel_entr(a, b) + special.rel_entr(1.0 - a, 1.0 - b))


def add_quantile(epsilon, sampling_rate):
    """q = 1 - e^-eps (1 - p) (paper 003, eq. 4): for v >= tau the add-direction term
    P_k(v) - e^eps P_{k-1}(v) is positive exactly when v > k q."""
    return -math.expm1(-epsilon) + math.exp(-epsilon) * sampling_rate


def remove_quantile(epsilon, sampling_rate):
    """r = 1 - e^eps (1 - p): remove-direction terms P_{k-1}(v) - e^eps P_k(v) are
    positive exactly when v < k r; r <= 0 (p <= 1 - e^-eps) means that direction is 0."""
    return sampling_rate * math.exp(epsilon) - math.expm1(epsilon)


def _sf(t, k, p):
    """P[Bin(k, p) > t] for integer arrays t, k >= 0 (scipy's bdtrc, with its edges fixed)."""
    t, k = np.broadcast_arrays(np.asarray(t, dtype=np.float64), np.asarray(k, dtype=np.int64))
    inside = (t >= 0) & (t < k)
    out = np.where(t < 0, 1.0, 0.0)
    out[inside] = special.bdtrc(t[inside], k[inside], p)
    return out


def _cdf(t, k, p):
    """P[Bin(k, p) <= t] for integer arrays t, k >= 0 (scipy's bdtr, with its edges fixed)."""
    t, k = np.broadcast_arrays(np.asarray(t, dtype=np.float64), np.asarray(k, dtype=np.int64))
    inside = (t >= 0) & (t < k)
    out = np.where(t >= k, 1.0, 0.0)
    out[inside] = special.bdtr(t[inside], k[inside], p)
    return out


def _range_mass(k, lo, hi, p):
    """P[lo < Bin(k, p) <= hi] for arrays, from whichever tail keeps the digits."""
    cdf_hi = _cdf(hi, k, p)
    by_cdf = cdf_hi - _cdf(lo, k, p)
    by_sf = _sf(lo, k, p) - _sf(hi, k, p)
    return np.where(cdf_hi <= 0.5, by_cdf, by_sf)


def divergences(epsilon, sampling_rate, threshold, k):
    """Hockey-stick divergences of one key's outputs, k versus k - 1 contributions.

    With P_k the law of "Bin(k, p) if >= tau else absent":
      add    = sum_o max(0, P_k(o) - e^eps P_{k-1}(o))
             = P[Bin(k,p) > t] - e^eps P[Bin(k-1,p) > t],   t = max(floor(k q), tau - 1),
      remove = sum_o max(0, P_{k-1}(o) - e^eps P_k(o))
             = [P_{k-1}(absent) - e^eps P_k(absent)]_+
               + sum_{tau <= v < k r} (P_{k-1}(v) - e^eps P_k(v)),
    because for tau <= v < k the likelihood ratio P_k(v)/P_{k-1}(v) = (1 - p) k / (k - v)
    (paper 003, Lemma 3.1) increases in v, crossing e^eps at v = k q and e^-eps at v = k r
    (see :func:`add_quantile`, :func:`remove_quantile`), while v = k has P_{k-1}(k) = 0 and
    P_k(absent) <= P_{k-1}(absent). If k q rounds to the wrong side of an integer, the one
    misplaced term has ratio within float precision of e^eps, so it is 0 to ~1e-16 of
    its probability: the sums stay exact to float precision (checked against
    brute-force enumeration in tests).

    Args: epsilon > 0, sampling_rate p in (0, 1], threshold tau >= 1, k int array >= 1.
    Returns: (add, remove) float arrays, each in [0, 1].
    """
    p, tau = float(sampling_rate), int(threshold)
    k_all = np.asarray(k, dtype=np.int64)
    add_all, remove_all = np.zeros(k_all.shape), np.zeros(k_all.shape)
    live = k_all >= tau  # below tau both outputs are always 'absent'
    k = k_all[live]
    e = math.exp(epsilon)
    t = np.clip(np.floor(k * add_quantile(epsilon, p)), tau - 1, k)
    add = _sf(t, k, p) - e * _sf(t, k - 1, p)
    remove = np.zeros(k.shape)
    r = remove_quantile(epsilon, p)
    if r > 0:
        absent = _cdf(tau - 1, k - 1, p) - e * _cdf(tau - 1, k, p)
        u = np.minimum(np.ceil(k * r) - 1, k - 1)
        partial = np.zeros(k.shape)
        some = u >= tau
        partial[some] = (_range_mass(k[some] - 1, tau - 1, u[some], p)
                         - e * _range_mass(k[some], tau - 1, u[some], p))
        remove = np.maximum(absent, 0.0) + np.maximum(partial, 0.0)
    add_all[live] = np.clip(add, 0.0, 1.0)
    remove_all[live] = np.clip(remove, 0.0, 1.0)
    return add_all, remove_all


def _tail_bound(epsilon, p, tau, K):
    """Upper bound on both divergences for every k > K (Chernoff-Hoeffding).

    add: the positive terms lie in {Bin(k,p) > k q}, so add_k <= P[Bin(k,p) > kq]
      <= exp(-k D(q||p)) (q > p), decreasing in k: bounded by exp(-(K+1) D(q||p)).
    remove (only when r > 0): its outcomes lie in {Bin(k-1,p) < max(tau, k r)} and for
      k >= K + 1, max(tau, k r) <= (k-1) s with s = max(tau/(K+1), r) (K+1)/K, so
      remove_k <= P[Bin(k-1,p) <= (k-1) s] <= exp(-K D(s||p)) once s < p (r < p always).
    """
    q = add_quantile(epsilon, p)
    bound = math.exp(-(K + 1) * kl_divergence(q, p))
    if remove_quantile(epsilon, p) > 0:
        s = max(tau / (K + 1), remove_quantile(epsilon, p)) * (K + 1) / K
        bound = max(bound, math.exp(-K * kl_divergence(s, p)) if s < p else 1.0)
    return bound


def exact_delta_search(epsilon, sampling_rate, threshold, *, target=None):
    """The exact delta with the evidence: (delta, argmax k, last k searched, tail bound).

    Divergences are 0 for k < tau (both outputs are always 'absent'); k runs from tau up
    to K, K growing until :func:`_tail_bound` (K) <= 1e-6 of the maximum found. The value
    returned is max(maximum over [tau, K], tail bound): an upper bound on the supremum
    over all k >= 1 that equals it up to that relative 1e-6.

    With ``target`` the search only decides "delta <= target": it stops as soon as a
    divergence above target is found (returned as delta: a lower bound, already too big)
    or the tail bound is below target (the value returned then still bounds delta).
    """
    p, tau = float(sampling_rate), int(threshold)
    if p == 1.0:  # v = k is always sampled: k = tau is released, k - 1 = tau - 1 never.
        return 1.0, tau, tau, 0.0
    q = add_quantile(epsilon, p)
    best, best_k = 0.0, tau
    # The maximum sits near k = tau / q; each further tau / q multiplies the tail bound
    # by about the KL bound itself, so the range grows by steps of that size (doubling).
    step = int(math.ceil(0.5 * tau / q)) + 64
    lo, K = tau, tau + 3 * step
    while True:
        for start in range(lo, K + 1, _K_CHUNK):
            ks = np.arange(start, min(K, start + _K_CHUNK - 1) + 1, dtype=np.int64)
            add, remove = divergences(epsilon, p, tau, ks)
            both = np.maximum(add, remove)
            i = int(np.argmax(both))
            if both[i] > best:
                best, best_k = float(both[i]), int(ks[i])
            if target is not None and best > target:
                return best, best_k, int(ks[-1]), math.nan
        tail = _tail_bound(epsilon, p, tau, K)
        done = tail <= max(_TAIL_REL * best, _TAIL_FLOOR)
        if done or K >= _K_MAX or (target is not None and tail <= target):
            return min(1.0, max(best, tail)), best_k, K, tail
        lo, K, step = K + 1, min(K + step, _K_MAX), 2 * step


def _meets(epsilon, p, tau, delta_target, method):
    """delta(epsilon, p, tau) <= delta_target, deciding the exact case early."""
    if method == "exact":
        return exact_delta_search(epsilon, p, tau, target=delta_target)[0] <= delta_target
    return delta(epsilon, p, tau, method=method) <= delta_target


def delta(epsilon, sampling_rate, threshold, *, method="exact"):
    """delta(epsilon) of one key's sample-and-threshold release (see module docstring).

    Args:
      epsilon: > 0.
      sampling_rate: p in (0, 1], probability each contribution is kept (Poisson).
      threshold: tau >= 1; sampled counts >= tau are released.
      method: "exact" (default), "kl" (paper 003 Thm 1) or "alpha" (its C_alpha form,
        with alpha = p / (1 - e^-eps)).
    Returns: delta in [0, 1]; 1.0 when the method's hypotheses do not hold.
    """
    _check(epsilon, sampling_rate, threshold, method)
    p, tau = float(sampling_rate), int(threshold)
    if method == "exact":
        return exact_delta_search(epsilon, p, tau)[0]
    if p > -math.expm1(-epsilon):  # both bounds need e^-eps <= 1 - p
        return 1.0
    if method == "kl":
        q = add_quantile(epsilon, p)
        return min(1.0, math.exp(-(tau / q) * kl_divergence(q, p)))
    if epsilon > 1:  # the C_alpha lemma is stated for epsilon <= 1
        return 1.0
    alpha = p / -math.expm1(-epsilon)
    c_alpha = math.log(1 / alpha) - 1 / (1 + alpha)
    return min(1.0, math.exp(-c_alpha * tau)) if c_alpha > 0 else 1.0


def c_alpha(alpha):
    """C_alpha = ln(1/alpha) - 1/(1 + alpha) (paper 003, Lemma after Thm 1)."""
    return math.log(1 / alpha) - 1 / (1 + alpha)


def paper_parameters(epsilon, delta_target, alpha=1 / 6):
    """The paper's recipe (003 Sec. 3.1): p = alpha (1 - e^-eps), tau = ceil(ln(1/delta) / C_alpha).

    Returns (sampling_rate, threshold)."""
    if not 0 < alpha < 1 or c_alpha(alpha) <= 0:
        raise ValueError(f"alpha must be in (0, 1) with C_alpha > 0, got {alpha}")
    return alpha * -math.expm1(-epsilon), int(math.ceil(math.log(1 / delta_target) / c_alpha(alpha)))


def min_threshold(epsilon, delta_target, sampling_rate, *, method="exact", max_threshold=100_000):
    """Smallest integer tau >= 1 with delta(epsilon, p, tau) <= delta_target, or None if
    no tau <= max_threshold qualifies. delta is non-increasing in tau for every method
    (exact: raising tau only merges v = tau into 'absent', a post-processing, so each
    divergence can only shrink by the data-processing inequality)."""
    _check(epsilon, sampling_rate, 1, method)
    if not 0 < delta_target < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")

    return _min_threshold_by(lambda tau: _meets(epsilon, sampling_rate, tau, delta_target, method),
                             max_threshold)


def _min_threshold_by(meets, max_threshold):
    tau = smallest_integer(meets, 1, max_high=max_threshold)
    if tau is None and meets(max_threshold):
        # the doubling search gives up past the last power of two below max_threshold
        tau = smallest_integer(meets, 1, max_threshold)
    return tau


def sampling_rate_for(epsilon, delta_target, threshold, *, method="exact", rel_tol=1e-9):
    """Largest sampling rate p (to about ``rel_tol`` relative) with delta(epsilon, p, tau) <= delta_target,
    or None if none above 1e-12 qualifies.

    Searches p = exp(-y) for the smallest y; delta grows with p (checked on a grid in
    tests/accounting/sample_threshold/test_sample_threshold.py), and the p returned always meets the target
    whether or not that holds."""
    _check(epsilon, 0.5, threshold, method)
    if not 0 < delta_target < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")

    return _rate_by(lambda p: _meets(epsilon, p, threshold, delta_target, method), rel_tol)


def _rate_by(meets_rate, rel_tol):
    """Largest p = exp(-y) with meets_rate(p) (to about rel_tol), or None below 1e-12."""
    def meets(y):
        p = math.exp(-y)
        return p < _MIN_SAMPLING_RATE or meets_rate(p)

    y = smallest_real(meets, 0.0, math.inf, rel_tol=rel_tol, abs_tol=rel_tol * 1e-3)
    if y is None:
        return None
    p = math.exp(-y)
    if p < _MIN_SAMPLING_RATE:
        return None
    return p


def per_key_budget(epsilon, delta_target, max_keys_per_user):
    """(epsilon / C, delta / C): each key's share under basic composition over a user's
    at most C keys (Dwork & Roth 2014, Thm 3.16)."""
    c = _positive_int(max_keys_per_user, "max_keys_per_user")
    return epsilon / c, delta_target / c


def _positive_int(value, name):
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value}")
    return int(value)


def group_privacy(epsilon_unit, delta_unit, group_size):
    """(epsilon, delta) for neighbours that differ in ``group_size`` units when each unit
    is (epsilon_unit, delta_unit)-DP: (g eps, delta sum_{i<g} e^{i eps}) (chaining the DP
    inequality g times; Dwork & Roth 2014, Sec. 2.3 for delta = 0; Vadhan 2017, Lemma 2.2)."""
    g = int(group_size)
    if g < 1:
        raise ValueError(f"group_size must be >= 1, got {group_size}")
    if epsilon_unit == 0:
        return 0.0, g * delta_unit
    return g * epsilon_unit, delta_unit * math.expm1(g * epsilon_unit) / math.expm1(epsilon_unit)


@dataclasses.dataclass(frozen=True)
class SampleThresholdParams:
    """Calibrated sample-and-threshold parameters and the budget they provably meet.

    sampling_rate, threshold: what the kernel uses. composition "basic": per_key_epsilon /
    per_key_delta are each key's budget; per_key_delta_spent: delta(per_key_epsilon, p, tau)
    by ``method``; delta_spent = max_keys_per_user * per_key_delta_spent <= delta.
    composition "pld": the per-key fields are None and delta_spent is the bound of
    accounting.sample_threshold.pld.user_delta(epsilon, p, tau, C) <= delta (one
    dominating pair composed over the C keys; C = 1: the exact one-key delta).
    ``calibrated`` names the fields that were computed rather than given.
    """

    sampling_rate: float
    threshold: int
    epsilon: float
    delta: float
    max_keys_per_user: int
    per_key_epsilon: float
    per_key_delta: float
    per_key_delta_spent: float
    delta_spent: float
    method: str = "exact"
    calibrated: tuple = ()
    composition: str = "basic"

    def __post_init__(self):
        if self.composition not in COMPOSITIONS:
            raise ValueError(f"composition must be one of {COMPOSITIONS}, got {self.composition!r}")
        _check(self.per_key_epsilon if self.composition == "basic" else self.epsilon,
               self.sampling_rate, self.threshold, self.method)
        if self.delta_spent > self.delta * (1 + 1e-12):
            raise ValueError(f"delta_spent {self.delta_spent:g} exceeds delta {self.delta:g}")

    @property
    def release_point(self):
        """tau / p: the population count released about half of the time."""
        return self.threshold / self.sampling_rate

    def as_report(self):
        return {
            "sampling_rate": self.sampling_rate,
            "threshold": self.threshold,
            "per_key_epsilon": self.per_key_epsilon,
            "per_key_delta": self.per_key_delta_spent,
            "delta_spent": self.delta_spent,
            "method": self.method,
            "composition": self.composition,
            "calibrated": list(self.calibrated),
        }


def _infeasible(sampling_rate, threshold, what, budget, tau, p, note=None):
    """The error for a fixed (sampling_rate, threshold) that misses the budget, with the
    nearest settings that meet it (tau: the smallest threshold at this rate; p: the largest
    rate at this threshold; None where there is none; ``note``: how they were found)."""
    options = []
    if tau is not None:
        options.append(f"threshold >= {tau} at sampling_rate {sampling_rate:g}")
    if p is not None:
        options.append(f"sampling_rate <= {_round_down(p)} at threshold {threshold}")
    return CalibrationInfeasible(
        f"sampling_rate {sampling_rate:g} with threshold {threshold} gives {what} for {budget}; "
        + (" or ".join(options) + " would meet it" + (f" {note}" if note else "")
           if options else "no nearby setting meets it"))


def _round_down(x, digits=6):
    """x shortened to ``digits`` significant digits, rounded towards zero (so a printed
    largest-admissible rate is still admissible)."""
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return f"{math.floor(x * scale) / scale:.{digits}g}"


def _params(epsilon, delta_target, c, p, tau, method, calibrated):
    eps_key, delta_key = per_key_budget(epsilon, delta_target, c)
    spent = delta(eps_key, p, tau, method=method)
    return SampleThresholdParams(
        sampling_rate=float(p), threshold=int(tau), epsilon=float(epsilon),
        delta=float(delta_target), max_keys_per_user=int(c), per_key_epsilon=eps_key,
        per_key_delta=delta_key, per_key_delta_spent=spent, delta_spent=c * spent,
        method=method, calibrated=tuple(calibrated))


def best_release_point(epsilon, delta_target, *, method="exact", max_threshold=1000):
    """(p, tau) minimising the release point tau / p over tau <= max_threshold, each tau
    with its largest sampling rate. tau / p is the population count a key needs to be
    released about half the time; at a fixed tau / p a larger p also means smaller
    relative sampling error (sqrt((1 - p) / (c p)))."""
    return _best_release_point_by(
        lambda tau, rel_tol: sampling_rate_for(epsilon, delta_target, tau, method=method,
                                               rel_tol=rel_tol),
        f"epsilon {epsilon:g}, delta {delta_target:g}", max_threshold)


def _best_release_point_by(rate_for, budget, max_threshold):
    """:func:`best_release_point` for any ``rate_for(tau, rel_tol)`` (largest admissible
    sampling rate at threshold tau, or None)."""
    cache = {}

    def point(tau):  # coarse rates to choose tau; the chosen tau's rate is refined below
        if tau not in cache:
            p = rate_for(tau, 1e-2)
            cache[tau] = (math.inf if p is None else tau / p, p)
        return cache[tau]

    # tau / p(tau) is unimodal in practice; a doubling pass brackets the minimum and a
    # golden-section-like integer search inside the bracket finishes it, then the
    # neighbourhood is scanned so a flat staircase cannot hide a better integer.
    tau, best_tau = 1, 1
    while tau <= max_threshold:
        if point(tau)[0] < point(best_tau)[0]:
            best_tau = tau
        elif tau > 2 * best_tau:
            break
        tau *= 2
    lo, hi = max(1, best_tau // 2), min(max_threshold, best_tau * 2)
    while hi - lo > 8:
        m1 = lo + (hi - lo) // 3
        m2 = hi - (hi - lo) // 3
        if point(m1)[0] <= point(m2)[0]:
            hi = m2
        else:
            lo = m1
    for tau in range(max(1, lo - 2), min(max_threshold, hi + 2) + 1):
        point(tau)
    ranked = sorted(cache, key=lambda t: (cache[t][0], t))
    if cache[ranked[0]][1] is None:
        raise CalibrationInfeasible(
            f"no sampling rate meets {budget} with a threshold <= {max_threshold}")
    # The coarse rates are within 1%; the finalists get full precision.
    finals = {}
    for tau in ranked[:3]:
        if cache[tau][1] is not None:
            finals[tau] = rate_for(tau, 1e-9)
    best_tau = min(finals, key=lambda t: (t / finals[t], t))
    return finals[best_tau], best_tau


def check_calibrate_arguments(epsilon, delta_target, method, composition):
    """The checks calibrate runs first (this module's and accounting.sample_threshold's,
    with composition pld), in this order; ValueError naming the argument."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0 < delta_target < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {COMPOSITIONS}, got {composition!r}")


def calibrate(epsilon, delta_target, max_keys_per_user, *, sampling_rate=None, threshold=None,
              method="exact", composition="basic"):
    """Sample-and-threshold parameters for a release of budget (epsilon, delta), composition
    "basic": each key gets (epsilon / C, delta / C) (:func:`per_key_budget`). Composition
    "pld" is accounting.sample_threshold.calibrate's (accounting.sample_threshold.calibration,
    on accounting.sample_threshold.pld's bound, which builds on this module): here it is
    refused. Then:
      - neither given: (p, tau) minimising tau / p (:func:`best_release_point`);
      - sampling_rate given: the smallest threshold (:func:`min_threshold`);
      - threshold given: the largest sampling rate (:func:`sampling_rate_for`);
      - both given: checked; CalibrationInfeasible says which threshold or rate would do.
    Returns a :class:`SampleThresholdParams`; raises CalibrationInfeasible.
    """
    check_calibrate_arguments(epsilon, delta_target, method, composition)
    if composition == "pld":
        raise ValueError("composition pld is calibrated by accounting.sample_threshold.calibrate "
                         "(accounting.sample_threshold.calibration), not its core module")
    eps_key, delta_key = per_key_budget(epsilon, delta_target, max_keys_per_user)
    c = int(max_keys_per_user)
    budget = (f"epsilon {epsilon:g}, delta {delta_target:g} over {c} key(s) per user "
              f"(per key epsilon {eps_key:g}, delta {delta_key:g})")
    if sampling_rate is not None:
        _check(eps_key, sampling_rate, 1, method)
    if threshold is not None:
        _check(eps_key, 0.5, threshold, method)

    if sampling_rate is None and threshold is None:
        p, tau = best_release_point(eps_key, delta_key, method=method)
        return _params(epsilon, delta_target, c, p, tau, method, ("sampling_rate", "threshold"))
    if threshold is None:
        tau = min_threshold(eps_key, delta_key, sampling_rate, method=method)
        if tau is None:
            raise CalibrationInfeasible(
                f"sampling_rate {sampling_rate:g} cannot meet {budget} with any threshold "
                f"<= 100000 by the {method} accounting; use a smaller sampling_rate")
        return _params(epsilon, delta_target, c, sampling_rate, tau, method, ("threshold",))
    if sampling_rate is None:
        p = sampling_rate_for(eps_key, delta_key, threshold, method=method)
        if p is None:
            raise CalibrationInfeasible(
                f"threshold {threshold} cannot meet {budget} with any sampling_rate by the "
                f"{method} accounting; use a larger threshold")
        return _params(epsilon, delta_target, c, p, threshold, method, ("sampling_rate",))
    spent = delta(eps_key, sampling_rate, threshold, method=method)
    if spent > delta_key:
        raise _infeasible(sampling_rate, threshold,
                          f"per-key delta {spent:.3g} > {delta_key:.3g} ({method} accounting)",
                          budget, min_threshold(eps_key, delta_key, sampling_rate, method=method),
                          sampling_rate_for(eps_key, delta_key, threshold, method=method))
    return _params(epsilon, delta_target, c, sampling_rate, threshold, method, ())


@dataclasses.dataclass(frozen=True)
class LevelParams:
    """Parameters of ``levels`` sample-and-threshold histograms released together
    (TrieHH++ prefix levels, hierarchical-histogram levels, binary-search rounds).

    Budget: each level gets (epsilon / L, delta / L) (basic composition, adaptive choices
    of the next level allowed; paper 003 Lemma 4.1). Within a level the unit is one
    (user, key) contribution: a level's cell (prefix, bucket) counts contributions, so a
    user with <= C contributions may put several into one cell. Each contribution is
    Poisson-sampled independently, so the level is (unit_epsilon, unit_delta)-DP per
    contribution, and (C unit_epsilon, unit_delta (e^{C eps_u} - 1)/(e^{eps_u} - 1))-DP
    per user by group privacy (:func:`group_privacy`), whatever cells they fall in.
    ``unit`` holds the single-contribution calibration (sampling_rate, threshold).
    """

    levels: int
    epsilon: float
    delta: float
    max_keys_per_user: int
    level_epsilon: float
    level_delta: float
    unit: SampleThresholdParams
    level_delta_spent: float
    delta_spent: float

    @property
    def sampling_rate(self):
        return self.unit.sampling_rate

    @property
    def threshold(self):
        return self.unit.threshold

    def as_report(self):
        return {"levels": self.levels, "sampling_rate": self.sampling_rate,
                "threshold": self.threshold, "level_epsilon": self.level_epsilon,
                "level_delta": self.level_delta_spent, "unit_epsilon": self.unit.epsilon,
                "unit_delta": self.unit.delta_spent, "delta_spent": self.delta_spent,
                "method": self.unit.method}


def calibrate_levels(epsilon, delta_target, levels, max_keys_per_user=1, *, sampling_rate=None,
                     threshold=None, method="exact"):
    """Sample-and-threshold parameters for ``levels`` histograms over a user's at most
    ``max_keys_per_user`` contributions (see :class:`LevelParams`); one (sampling_rate,
    threshold) for every level. Raises CalibrationInfeasible."""
    levels = _positive_int(levels, "levels")
    c = _positive_int(max_keys_per_user, "max_keys_per_user")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not 0 < delta_target < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    level_eps, level_delta = epsilon / levels, delta_target / levels
    unit_eps = level_eps / c
    # delta_unit * (e^{C eps_u} - 1) / (e^{eps_u} - 1) = level_delta
    unit_delta = level_delta * math.expm1(unit_eps) / math.expm1(level_eps)
    unit = calibrate(unit_eps, unit_delta, 1, sampling_rate=sampling_rate, threshold=threshold,
                     method=method)
    spent = group_privacy(unit_eps, unit.delta_spent, c)[1]
    return LevelParams(levels=int(levels), epsilon=float(epsilon), delta=float(delta_target),
                       max_keys_per_user=c, level_epsilon=level_eps, level_delta=level_delta,
                       unit=unit, level_delta_spent=spent, delta_spent=levels * spent)

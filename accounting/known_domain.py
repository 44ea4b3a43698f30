"""Releasing a histogram over a public (known) key domain: calibration, the bounded-domain
rules for choosing C, and Poisson debiasing. Pure numpy/scipy; no Beam, no I/O.

Paper 002 (Liu, Suresh, Zhu, Kairouz, Gruteser, ICML 2023), Section 4, Algorithm 1: with
a public domain of d keys every key is released with noise and no threshold, so nothing
about which keys occur needs protecting and delta is spent on the noise alone.

Calibration (add/remove one user; thresher's bounding, mechanisms.md "Privacy model"):

* Laplace, l1 model (rand-clip to C records) or l0 model (at most C keys, once each): one
  user changes the count vector by Delta with ||Delta||_1 <= C. With discrete Laplace noise
  P[x] proportional to exp(-|x|/b) per key, the privacy loss at any output is
  sum_j (|x_j| - |x_j - Delta_j|)/b <= ||Delta||_1 / b <= C/b, attained when every
  coordinate of the shift points the same way as x - Delta. So b = C/epsilon is
  (epsilon, 0)-DP exactly (Dwork & Roth Thm 3.6, discrete form; the bound is tight).
* Gaussian, l0 model: one user moves at most C keys by +1 (paper 004, Lemma 5.3 a_+ rows
  with no threshold). The pair N_Z(1, s^2)^a vs N_Z(0, s^2)^a is a post-processing of the
  a = C pair (append fresh noise to C - a unshifted coordinates), so the worst case is
  exactly ``accounting.discrete_gaussian.composed_shift_delta(eps, sigma, count=C)`` --
  the exact discrete accounting (mechanisms.md "Exactness of accounting"), not the
  continuous formula with mu = sqrt(C)/sigma.

Choosing C (``max_keys_per_user: auto``), from per-user weights w_i restricted to the domain
(records m_i in the l1 model, distinct domain keys k_i in the l0 model):

* Laplace: Lemma 4.2, C* = the ceil(d/epsilon)-th largest w_i. The loss of a bound C is
  sum_i (w_i - C)^+ (bounding only removes contributions, so per-key errors are one-sided
  and add up to exactly this) plus d C / epsilon (mean |Lap(C/epsilon)| per key), the
  same form in both models. Private version: the exponential mechanism on
  -|#{i: w_i >= C} - ceil(d/epsilon)| over the candidate grid, sensitivity 1
  (``contribution_bound.laplace_bound_scores``).
* Gaussian: Thm 4.3 on the user's de-duplicated domain histogram (||N_i||_1 = k_i,
  ||N_i||_2 = sqrt(k_i)); bounding to C keys bounds the l2 norm by B = sqrt(C), and the
  noise per unit of l2 norm is sigma(C)/sqrt(C). C* is the smallest C with
  S(C) = sum_{i: k_i > C} min(sqrt(k_i), sqrt(s)) <= M(C) = d (sigma(C)/sqrt(C)) sqrt(2/pi);
  private version: exponential mechanism on -|S(C) - M(C)|, sensitivity sqrt(s) (one user
  moves S(C) by at most its clipped ratio; M(C) does not depend on the data), with
  s = min(``max_bound``, d) (paper 002 Sec. 7.1 clips the ratios to sqrt(s); in the l0
  model k_i <= d, so clipping at d changes no ratio).

Both score vectors are sums over users, so a Beam stage adds per-shard vectors
(:func:`rank_counts`, :func:`tail_sums`) and draws once (``transforms.selection.public_domain``).

Debiasing: Algorithm 5 (Sec. 6), per key, with the per-user clip the bounding enforces on
one key (C records in the l1 model, 1 in the l0 model); vectorised :func:`poisson_debias_counts`.
"""
import dataclasses
import math
from fractions import Fraction

import numpy as np
from thresher.accounting._lazy import stats

from thresher.accounting import contribution_bound, discrete_gaussian, search, selection

KINDS = ("gaussian", "laplace")
DEBIAS_METHODS = ("poisson",)


@dataclasses.dataclass(frozen=True)
class KnownDomainParams:
    """Calibrated noise of a public-domain release for one bound C.

    kind: "gaussian" (discrete Gaussian, ``sigma``) or "laplace" (discrete Laplace,
    ``scale``); epsilon/delta: what the release spends (delta 0 for Laplace);
    delta_achieved: the exact delta at ``epsilon`` for the noise drawn."""

    kind: str
    max_keys_per_user: int
    model: str
    epsilon: float
    delta: float
    sigma: float = None
    scale: float = None
    delta_achieved: float = 0.0


def laplace_epsilon(scale, max_keys_per_user):
    """Pure epsilon of discrete Laplace(scale) on every key when one user moves the count
    vector by at most C in l1 norm: C / scale (tight)."""
    c = _positive_int(max_keys_per_user, "max_keys_per_user")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be > 0, got {scale}")
    return c / float(scale)


def gaussian_delta(epsilon, sigma, max_keys_per_user):
    """Exact delta(epsilon) of discrete Gaussian(sigma) on every key when one user moves at
    most C keys by 1 each: the C-fold composed shift (worst case a = C)."""
    c = _positive_int(max_keys_per_user, "max_keys_per_user")
    return float(discrete_gaussian.composed_shift_delta(epsilon, sigma, c))


def gaussian_sigma(epsilon, delta, max_keys_per_user, *, rel_tol=1e-6):
    """Smallest sigma (to rel_tol, always qualifying) with gaussian_delta <= delta."""
    c = _positive_int(max_keys_per_user, "max_keys_per_user")
    _check_budget(epsilon, delta)
    # sigma = 0.05 sqrt(C) never qualifies for delta < 1 at any sane epsilon; start there.
    low = 0.05 * math.sqrt(c)
    sigma = search.smallest_real(lambda s: gaussian_delta(epsilon, s, c) <= delta,
                                 low, math.inf, rel_tol=rel_tol)
    if sigma is None:
        raise ValueError(f"no sigma meets delta={delta:g} at epsilon={epsilon:g}")
    return sigma


def calibrate(kind, epsilon, delta, max_keys_per_user, model, *, sigma=None, scale=None):
    """Noise for a public-domain release of ``kind`` at the release stage's (epsilon, delta).

    Laplace spends (epsilon, 0): scale = C/epsilon, or the given ``scale`` if
    C/scale <= epsilon. Gaussian (l0 model only) spends (epsilon, delta): the smallest
    sigma with exact discrete delta <= delta, or the given ``sigma`` if it meets it.
    Raises ValueError (naming what would work) when the budget cannot be met."""
    c = _positive_int(max_keys_per_user, "max_keys_per_user")
    if kind not in KINDS:
        raise ValueError(f"public_keys is supported for {' and '.join(KINDS)}, not {kind!r}")
    if kind == "laplace":
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if scale is None:
            scale = c / epsilon
        elif laplace_epsilon(scale, c) > epsilon * (1 + 1e-12):
            raise ValueError(f"scale {scale:g} gives epsilon {c / scale:g} > {epsilon:g}; "
                             f"use scale >= {c / epsilon:g}")
        return KnownDomainParams(kind, c, model, float(epsilon), 0.0, scale=float(scale),
                                 delta_achieved=0.0)
    if model != "l0":
        raise ValueError("the gaussian mechanism needs the l0 model")
    _check_budget(epsilon, delta)
    if sigma is None:
        sigma = gaussian_sigma(epsilon, delta, c)
    achieved = gaussian_delta(epsilon, sigma, c)
    if achieved > delta:
        raise ValueError(f"sigma {sigma:g} gives delta {achieved:.3g} > {delta:g}; use sigma >= "
                         f"{gaussian_sigma(epsilon, delta, c):.6g}")
    return KnownDomainParams(kind, c, model, float(epsilon), float(delta), sigma=float(sigma),
                             delta_achieved=achieved)


# --------------------------------------------------------------------------------------
# Choosing C over a known domain (paper 002 Sec. 4.1-4.2)
# --------------------------------------------------------------------------------------

def laplace_rank(domain_size, epsilon):
    """ceil(d / epsilon): Lemma 4.2's rank."""
    d = _positive_int(domain_size, "domain_size")
    return int(math.ceil(d / float(epsilon)))


def rank_counts(weights, candidates):
    """#{i: w_i >= C} for each candidate C (int64): the statistic of Lemma 4.2's quantile,
    a sum over users (per-shard vectors add)."""
    w = np.sort(np.asarray(weights, dtype=np.int64))
    cands = np.asarray(candidates, dtype=np.int64)
    return (len(w) - np.searchsorted(w, cands, side="left")).astype(np.int64)


def tail_sums(weights, candidates, sparsity):
    """S(C) = sum_{i: w_i > C} min(sqrt(w_i), sqrt(s)) for each candidate C (float64):
    Thm 4.3's sum for de-duplicated histograms (||N_i||_1 / ||N_i||_2 = sqrt(k_i),
    ||N_i||_2 > sqrt(C) iff k_i > C), ratios clipped to sqrt(s)."""
    w = np.asarray(weights, dtype=np.float64)
    return contribution_bound.gaussian_tail_sum(
        w, np.sqrt(w), np.sqrt(np.asarray(candidates, dtype=np.float64)), sparsity)


# Thm 4.3's S(C) in the pipeline is summed exactly (issue 25, F2): each user's ratio
# min(sqrt(k_i), sqrt(s)) is rounded down to units of 2^-TAIL_BITS, computed in integers
# (floor(2^b sqrt(m)) = isqrt(m 4^b)), and the shards' integer vectors add in any order to
# the same statistic. A user still moves S(C) by a value in [0, sqrt(s)], so the
# sensitivity sqrt(s) holds as before (no allowance needed).
TAIL_BITS = 20


def tail_sum_units(weights, candidates, sparsity):
    """sum_{i: w_i > C} floor(2^TAIL_BITS sqrt(min(w_i, s))) for each candidate (int64):
    :func:`tail_sums` in exact integer units of 2^-TAIL_BITS."""
    from thresher.accounting.exact_scores import isqrt
    s = _positive_int(sparsity, "sparsity")
    if s >= (1 << 22):
        raise ValueError(f"sparsity must be below 2^22 for the exact tail sums, got {s}")
    w = np.sort(np.asarray(weights, dtype=np.int64))
    ratio = isqrt(np.minimum(w, s) << np.int64(2 * TAIL_BITS))
    tail = np.concatenate([np.cumsum(ratio[::-1], dtype=np.int64)[::-1], [0]])
    first_above = np.searchsorted(w, np.asarray(candidates, dtype=np.int64), side="right")
    return tail[first_above].astype(np.int64)


def _sqrt_up(value):
    """The smallest binary64 whose exact value is >= sqrt(value) (an exact Fraction)."""
    root = math.sqrt(value)
    while Fraction(root) ** 2 < value:
        root = math.nextafter(root, math.inf)
    return Fraction(root)


def gaussian_targets(domain_size, sigmas, candidates):
    """M(C) = d (sigma(C)/sqrt(C)) sqrt(2/pi) for each candidate (Thm 4.3's M with the
    noise per unit of l2 norm)."""
    d = _positive_int(domain_size, "domain_size")
    c = np.asarray(candidates, dtype=np.float64)
    return d * np.asarray(sigmas, dtype=np.float64) / np.sqrt(c) * math.sqrt(2.0 / math.pi)


@dataclasses.dataclass(frozen=True)
class DomainBoundRule:
    """The private bounded-domain rule for one release: which statistic, its target and
    the exponential mechanism's sensitivity.

    kind "laplace": score(C) = -|rank_counts(C) - rank|, sensitivity 1 (Lemma 4.2).
    kind "gaussian": score(C) = -|tail_sums(C) - targets(C)|, sensitivity sqrt(sparsity)
    (Thm 4.3). Neither score is monotone in the data, so the standard exponential
    mechanism exp(epsilon score / (2 sensitivity)) is used (epsilon-DP)."""

    kind: str
    candidates: tuple
    domain_size: int
    rank: int = None
    targets: tuple = None
    sparsity: int = None

    @property
    def sensitivity(self):
        return 1.0 if self.kind == "laplace" else math.sqrt(self.sparsity)

    @property
    def selection_sensitivity(self):
        """The draw's sensitivity as an exact Fraction: 1, or sqrt(s) rounded up."""
        return Fraction(1) if self.kind == "laplace" else _sqrt_up(self.sparsity)

    def statistic(self, weights):
        """Per-candidate int64 vector for a set of users (adds exactly across disjoint
        sets of users): rank counts, or the tail sums in units of 2^-TAIL_BITS."""
        if self.kind == "laplace":
            return rank_counts(weights, self.candidates)
        return tail_sum_units(weights, self.candidates, self.sparsity)

    def scores(self, statistic):
        """-|statistic - target| per candidate, exact Fractions of the integer statistic."""
        if self.kind == "laplace":
            return [-abs(Fraction(int(x)) - self.rank) for x in statistic]
        unit = Fraction(1, 1 << TAIL_BITS)
        return [-abs(unit * int(x) - Fraction(t)) for x, t in zip(statistic, self.targets)]

    def choose(self, statistic, epsilon, rng):
        """Draw C (epsilon-DP); returns (C, probabilities -- NOT private)."""
        scores = self.scores(statistic)
        probabilities = selection.exponential_mechanism_probabilities(
            [float(u) for u in scores], epsilon, self.sensitivity)
        index = selection.exponential_mechanism(scores, epsilon, self.selection_sensitivity,
                                                rng)
        return int(self.candidates[index]), probabilities


def domain_bound_rule(kind, candidates, domain_size, *, epsilon=None, params_by_bound=None,
                      sparsity=None):
    """The rule for ``kind``: laplace needs the release ``epsilon``; gaussian needs
    ``params_by_bound`` {C: {"sigma": ...}} and ``sparsity`` (s; thresher uses max_bound)."""
    cands = tuple(int(c) for c in candidates)
    d = _positive_int(domain_size, "domain_size")
    if kind == "laplace":
        return DomainBoundRule("laplace", cands, d, rank=laplace_rank(d, epsilon))
    if kind == "gaussian":
        sigmas = [float(params_by_bound[c]["sigma"]) for c in cands]
        return DomainBoundRule("gaussian", cands, d,
                               targets=tuple(float(x) for x in gaussian_targets(d, sigmas, cands)),
                               sparsity=_positive_int(sparsity, "sparsity"))
    raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")


# --------------------------------------------------------------------------------------
# Algorithm 5, vectorised
# --------------------------------------------------------------------------------------

def poisson_debias_counts(noisy_counts, num_users, bound, *, max_iter=200, rel_tol=1e-12):
    """Algorithm 5 for an array of released counts: n * h^{-1}(y / n), h(lambda) =
    E[min(X, C)], X ~ Poisson(lambda). y/n <= 0 gives 0; y/n >= C gives +inf (no finite
    inverse). Post-processing only.

    h is increasing and concave with h'(lambda) = P[X <= C - 1] and h(lambda) <= lambda,
    so Newton's method started at lambda_0 = y/n (where h <= target) increases
    monotonically to the root without overshooting; all keys are solved at once."""
    c = _positive_int(bound, "bound")
    n = _positive_int(num_users, "num_users")
    target = np.asarray(noisy_counts, dtype=np.float64) / n
    out = np.zeros(target.shape, dtype=np.float64)
    inside = (target > 0) & (target < c)
    out[target >= c] = np.inf
    t = target[inside]
    lam = t.copy()
    for _ in range(max_iter):
        gap = t - contribution_bound.poisson_clipped_mean(lam, c)
        slope = stats.poisson.cdf(c - 1, lam)
        step = np.where(gap > 0, gap / np.maximum(slope, 1e-300), 0.0)
        lam = lam + step
        if np.all(step <= rel_tol * np.maximum(lam, 1e-300)):
            break
    out[inside] = n * lam
    return out


# --------------------------------------------------------------------------------------

def _positive_int(value, name):
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _check_budget(epsilon, delta):
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta}")

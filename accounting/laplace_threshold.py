"""Laplace thresholding: exact (epsilon, delta) and calibration, l0 and l1 models.

Release rule (transforms.selection.noisy_threshold): keys with count c < tau (``pre_threshold``)
are dropped; otherwise c + Z is released when c + Z >= T (``threshold``), with Z the
Laplace (density ~ exp(-|z|/b)) or, as thresher draws it, the discrete Laplace
(P[Z = z] ~ exp(-|z|/b) on the integers, ``transforms.randomness.samplers.discrete_laplace``).
Tails: discrete P[Z >= k] = q^k / (1 + q) for integers k >= 0, q = e^(-1/b);
continuous P[Z >= z] = e^(-z/b) / 2 for z >= 0.

**l0/l_inf model** (each user in at most C keys, once each). The structure is paper 004's
(Lemmas 5.1-5.3, Thm 5.4; see accounting.gshm): a_= keys sit at the pre-threshold and
appear/disappear with the user (suppressed with probability beta = P[Z < T - tau]), and
a_+ = C - a_= keys are shifted by one. The proof of Thm 5.4 uses only independence of
rows and post-processing, so it holds for Laplace noise with delta_+(a, e) the
divergence of a Laplace shifts. For the discrete Laplace a shift by one has privacy loss
+1/b (probability 1/(1+q) under the shifted law) or -1/b: exactly randomised response
RR_{1/b}. So with K ~ Bin(a, p), K' ~ Bin(a, 1-p), p = e^(1/b)/(1+e^(1/b)),

    delta_+(a, e) = P[K > k*] - e^e P[K' > k*],   k* = floor((e b + a) / 2),

exactly. For the continuous Laplace every shift is (1/b)-DP, and every (eps0, 0)-DP pair
of distributions is a post-processing of RR_{eps0} (Kairouz, Oh & Viswanath 2015, "The
composition theorem for differential privacy"), so the same formula is an upper bound. With the default b = C/epsilon the shift part never binds: delta_+(a_+, e) = 0 for
e >= a_+/b, and Thm 5.4 collapses to the per-key delta composed over the C keys,
delta = 1 - beta^C = 1 - (1 - P[Z >= T - tau])^C.

**l1 model** (paper 002 Alg. 3: rand-clip to C records; a user adds h_j >= 1 records to
keys j with sum h_j <= C). A key that appears with the user holds at most tau - 1 + h_j
records, so it stays hidden with probability beta(h) = P[Z < T - tau + 1 - h]; the other
keys are shifted by h_j in total at most Delta = C - sum_{appearing} h_j, a (Delta/b)-DP
part dominated by one RR_{Delta/b}. By paper 004's Lemma 5.2 argument,

    delta = max over configurations of max(1 - beta_A + beta_A d(eps - ln beta_A),
                                           d(eps + ln beta_A)),

d the RR_{Delta/b} divergence and beta_A = prod beta(h_j). Both terms grow as beta_A falls
(d/d beta of the first is P_P[L > e] - 1 <= 0), and -log beta(h) is convex in h (the
Laplace and discrete Laplace CDFs are log-concave), so for k appearing keys holding S_A
records the worst split is (S_A - k + 1, 1, ..., 1); we enumerate S_A = 0..C and k. With
b >= C/epsilon this is max_k 1 - beta(C - k + 1) beta(1)^(k-1), at most the paper's
delta: its t = C + (C/eps) ln(C/(2 delta)) (Lemma 5.1) meets delta by a union bound.
"""
import dataclasses
import math

import numpy as np
from thresher.accounting._lazy import special

from thresher.accounting import gshm
from thresher.accounting.search import smallest_integer, smallest_real
from thresher.accounting.validation import check_threshold_parameters

MODELS = ("l0", "l1")
NOISES = ("laplace", "discrete_laplace")
# The l1 enumeration over (S_A, k) has ~C^2/2 configurations; above this C it is only
# done for scale >= C/epsilon, where the closed form over k is exact.
_L1_ENUMERATION_LIMIT = 3000


def _check(epsilon, scale, max_keys_per_user, model, noise, pre_threshold):
    if not (math.isfinite(epsilon) and epsilon >= 0):
        raise ValueError(f"epsilon must be >= 0, got {epsilon}")
    if not (math.isfinite(scale) and scale > 0):
        raise ValueError(f"scale must be > 0, got {scale}")
    if int(max_keys_per_user) != max_keys_per_user or max_keys_per_user < 1:
        raise ValueError(f"max_keys_per_user must be an integer >= 1, got {max_keys_per_user}")
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    if noise not in NOISES:
        raise ValueError(f"noise must be one of {NOISES}, got {noise!r}")
    if int(pre_threshold) != pre_threshold or pre_threshold < 1:
        raise ValueError(f"pre_threshold must be an integer >= 1, got {pre_threshold}")


def log_suppress(scale, gap, noise="discrete_laplace"):
    """log P[Z < gap]: a key at count c is hidden iff c + Z < T, gap = T - c (array ok).

    Discrete: P[Z <= ceil(gap) - 1] from the exact geometric tails; continuous:
    1 - e^(-gap/b)/2 for gap >= 0, e^(gap/b)/2 below."""
    gap = np.asarray(gap, dtype=np.float64)
    if noise == "laplace":
        out = np.where(gap >= 0, np.log1p(-0.5 * np.exp(-np.abs(gap) / scale)),
                       math.log(0.5) - np.abs(gap) / scale)
    else:
        k = np.ceil(gap)
        log_q = -1.0 / scale
        log_tail_norm = -math.log1p(math.exp(log_q))  # log 1/(1+q)
        # k >= 1: 1 - q^k/(1+q);  k <= 0: P[Z <= k-1] = P[Z >= 1-k] = q^(1-k)/(1+q).
        out = np.where(k >= 1,
                       np.log1p(-np.exp(np.maximum(k, 1.0) * log_q + log_tail_norm)),
                       (1.0 - np.minimum(k, 0.0)) * log_q + log_tail_norm)
    return float(out) if out.ndim == 0 else out


def rr_delta(epsilon0, e):
    """Hockey-stick divergence H_{e^e} of randomised response RR_{epsilon0} (any real e):
    P = (p, 1-p), Q = (1-p, p), p = e^eps0 / (1 + e^eps0). Arrays broadcast."""
    x, e = np.broadcast_arrays(np.asarray(epsilon0, dtype=np.float64),
                               np.asarray(e, dtype=np.float64))
    p = special.expit(x)
    out = np.maximum(p - np.exp(e) * (1.0 - p), 0.0) + np.maximum(1.0 - p - np.exp(e) * p, 0.0)
    out = np.clip(out, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def shift_delta(count, e, scale):
    """delta_+(a, e) of a (discrete) Laplace coordinates each shifted by one: exact for the
    discrete Laplace (binomial privacy loss), an upper bound for the continuous one."""
    a, e = np.broadcast_arrays(np.asarray(count, dtype=np.int64), np.asarray(e, dtype=np.float64))
    p = special.expit(1.0 / scale)
    k_star = np.clip(np.floor((e * scale + a) / 2.0), -1.0, a)  # bdtrc wants -1 <= k <= a
    out = special.bdtrc(k_star, a, p) - np.exp(e) * special.bdtrc(k_star, a, 1.0 - p)
    out = np.clip(out, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def _l1_log_beta(scale, threshold, c, tau, noise):
    """lb[h - 1] = log beta(h), h = 1..C: a key appearing with h of the user's records."""
    h = np.arange(1, c + 1, dtype=np.float64)
    return np.minimum(np.atleast_1d(log_suppress(scale, threshold - tau + 1.0 - h, noise)), 0.0)


def _l1_suppression(scale, threshold, c, tau, noise):
    """max_k 1 - beta(C - k + 1) beta(1)^(k-1): the appearing keys alone (S_A = C)."""
    lb = _l1_log_beta(scale, threshold, c, tau, noise)
    k = np.arange(1, c + 1, dtype=np.float64)
    worst = lb[(c - k).astype(int)] + (k - 1.0) * lb[0]
    return float(np.clip(-np.expm1(worst.min()), 0.0, 1.0))


def _l1_delta(epsilon, scale, threshold, c, tau, noise):
    if scale * epsilon >= c:
        # Shift part free: d(e) = 0 for e >= Delta/b, and the third term <= 1 - beta_A.
        return _l1_suppression(scale, threshold, c, tau, noise)
    lb = _l1_log_beta(scale, threshold, c, tau, noise)
    if c > _L1_ENUMERATION_LIMIT:
        raise ValueError(f"the l1 model with max_keys_per_user > {_L1_ENUMERATION_LIMIT} "
                         f"needs scale >= max_keys_per_user/epsilon = {c / epsilon:g}")
    best = float(rr_delta(c / scale, epsilon))  # no appearing key: S_A = 0
    for s_a in range(1, c + 1):
        kk = np.arange(1, s_a + 1, dtype=np.float64)
        lb_a = lb[(s_a - kk).astype(int)] + (kk - 1.0) * lb[0]
        x = (c - s_a) / scale
        term2 = -np.expm1(lb_a) + np.exp(lb_a) * rr_delta(x, epsilon - lb_a)
        term3 = rr_delta(x, epsilon + lb_a)
        best = max(best, float(term2.max()), float(np.max(term3)))
    return float(np.clip(best, 0.0, 1.0))


def delta(epsilon, scale, threshold, max_keys_per_user, *, model="l0",
          noise="discrete_laplace", pre_threshold=1):
    """delta(epsilon) of Laplace thresholding with scale b and noisy threshold T.

    Args:
      epsilon: >= 0. scale: Laplace scale b > 0 (in users or records).
      threshold: T, absolute (a key is released iff count + Z >= T).
      max_keys_per_user: C (l0: keys per user; l1: records per user after rand-clip).
      model: "l0" or "l1" (module docstring). noise: "discrete_laplace" or "laplace".
      pre_threshold: tau >= 1.
    Returns:
      delta in [0, 1]: exact for the discrete Laplace in the l0 model; a proved upper
      bound otherwise (exact whenever the shift part does not bind, e.g. b >= C/eps).
    """
    epsilon, scale, threshold = float(epsilon), float(scale), float(threshold)
    _check(epsilon, scale, max_keys_per_user, model, noise, pre_threshold)
    c, tau = int(max_keys_per_user), int(pre_threshold)
    if model == "l1":
        return _l1_delta(epsilon, scale, threshold, c, tau, noise)
    lb = log_suppress(scale, threshold - tau, noise)
    return gshm.sparse_histogram_delta(epsilon, lb, c,
                                       lambda a, e: shift_delta(a, e, scale), "exact")


def paper_threshold(epsilon, delta_target, max_keys_per_user):
    """Paper 002 Alg. 3 line 3: t = C + (C/eps) ln(C / (2 delta)) (continuous Laplace of
    scale C/eps, pre-threshold 1; Lemma 5.1 shows it meets delta)."""
    c = float(max_keys_per_user)
    return c + (c / epsilon) * math.log(c / (2.0 * delta_target))


def _shift_part(epsilon, scale, c, model):
    """The part no threshold can remove: the divergence of the shifts alone."""
    if model == "l1":
        return float(rr_delta(c / scale, epsilon))
    return float(shift_delta(c, epsilon, scale))


def min_threshold(epsilon, delta_target, scale, max_keys_per_user, *, model="l0",
                  noise="discrete_laplace", pre_threshold=1, rel_tol=1e-9):
    """Smallest T >= pre_threshold with delta(...) <= delta_target (delta falls as T grows),
    an int for discrete noise, a float (to rel_tol) for continuous; None if the shift part
    alone exceeds delta_target (scale too small)."""
    epsilon, scale = float(epsilon), float(scale)
    _check(epsilon, scale, max_keys_per_user, model, noise, pre_threshold)
    if not (0 < delta_target < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    c, tau = int(max_keys_per_user), int(pre_threshold)
    if _shift_part(epsilon, scale, c, model) > delta_target:
        return None

    def ok(t):
        return delta(epsilon, scale, t, c, model=model, noise=noise,
                     pre_threshold=tau) <= delta_target

    if noise == "discrete_laplace":
        return smallest_integer(ok, tau)
    return smallest_real(ok, float(tau), math.inf, rel_tol=rel_tol)


def min_scale(epsilon, delta_target, threshold, max_keys_per_user, *, model="l0",
              noise="discrete_laplace", pre_threshold=1, rel_tol=1e-9):
    """Smallest scale b with delta(...) <= delta_target at this threshold, or None.

    Not monotone in b (the shift part falls, the threshold part rises), so the search
    runs between the smallest b whose shift part fits and the largest b whose
    suppression term 1 - beta^C fits (gshm.first_qualifying)."""
    epsilon = float(epsilon)
    _check(epsilon, 1.0, max_keys_per_user, model, noise, pre_threshold)
    c, tau = int(max_keys_per_user), int(pre_threshold)

    def ok(b):
        return delta(epsilon, b, threshold, c, model=model, noise=noise,
                     pre_threshold=tau) <= delta_target

    def suppression(b):  # a lower bound on delta that grows with b
        if model == "l1":
            return _l1_suppression(b, threshold, c, tau, noise)
        return -math.expm1(c * log_suppress(b, threshold - tau, noise))

    low = smallest_real(lambda b: _shift_part(epsilon, b, c, model) <= delta_target,
                        1e-3, math.inf, rel_tol=rel_tol)
    if low is None:
        return None
    if ok(low):
        return low
    if suppression(low) > delta_target:
        return None
    high = smallest_real(lambda b: suppression(b) > delta_target, low, math.inf,
                         rel_tol=rel_tol)
    if high is None:
        return None
    return gshm.first_qualifying(ok, low, high, rel_tol=rel_tol)


def sensitivity_scale(max_keys_per_user, epsilon):
    """The default scale C/epsilon, rounded up so that scale * epsilon >= C in floats
    (the exact accounting then knows the shift part is free)."""
    b = max_keys_per_user / epsilon
    while b * epsilon < max_keys_per_user:
        b = math.nextafter(b, math.inf)
    return b


@dataclasses.dataclass(frozen=True)
class LaplaceThresholdParameters:
    """Calibrated Laplace thresholding; delta is as computed by `delta` at `epsilon`."""

    scale: float
    threshold: float
    pre_threshold: int
    model: str
    noise: str
    delta: float
    epsilon: float

    def __post_init__(self):
        if not (math.isfinite(self.scale) and self.scale > 0):
            raise ValueError(f"scale must be > 0, got {self.scale}")
        check_threshold_parameters(pre_threshold=self.pre_threshold, threshold=self.threshold,
                                   delta=self.delta, epsilon=self.epsilon)
        if self.model not in MODELS:
            raise ValueError(f"model must be one of {MODELS}, got {self.model!r}")
        if self.noise not in NOISES:
            raise ValueError(f"noise must be one of {NOISES}, got {self.noise!r}")


def calibrate(epsilon, delta_target, max_keys_per_user, *, model="l0",
              noise="discrete_laplace", pre_threshold=1, scale=None, threshold=None):
    """Laplace thresholding parameters meeting (epsilon, delta_target).

    Default scale = C/epsilon (the l1 sensitivity C in both models) and the smallest
    threshold meeting delta; given the threshold only, the smallest workable scale; given
    both, a check. Raises ValueError saying what would meet the budget."""
    epsilon = float(epsilon)
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not (0 < delta_target < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta_target}")
    _check(epsilon, 1.0 if scale is None else scale, max_keys_per_user, model, noise,
           pre_threshold)
    if threshold is not None and not (math.isfinite(threshold) and threshold >= pre_threshold):
        raise ValueError(f"threshold must be >= pre_threshold ({pre_threshold}), got {threshold}")
    c, tau = int(max_keys_per_user), int(pre_threshold)
    kw = dict(model=model, noise=noise, pre_threshold=tau)
    budget = (f"(epsilon={epsilon:g}, delta={delta_target:g}, max_keys_per_user={c}, "
              f"model={model})")
    default_scale = sensitivity_scale(c, epsilon)
    if threshold is None:
        scale = default_scale if scale is None else float(scale)
        threshold = min_threshold(epsilon, delta_target, scale, c, **kw)
        if threshold is None:
            raise ValueError(f"scale={scale:g} is too small for {budget}: the noise alone "
                             f"exceeds delta; use scale >= {default_scale:g}")
    elif scale is None:
        scale = min_scale(epsilon, delta_target, threshold, c, **kw)
        if scale is None:
            need = min_threshold(epsilon, delta_target, default_scale, c, **kw)
            raise ValueError(f"threshold={threshold:g} is too low for {budget}: no scale "
                             f"works; at scale={default_scale:g} the threshold must be >= "
                             f"{need:g}")
    else:
        achieved = delta(epsilon, scale, threshold, c, **kw)
        if achieved > delta_target:
            hints = []
            t = min_threshold(epsilon, delta_target, scale, c, **kw)
            if t is not None:
                hints.append(f"threshold >= {t:g} at scale={scale:g}")
            b = min_scale(epsilon, delta_target, threshold, c, **kw)
            if b is not None:
                hints.append(f"scale >= {b:.6g} at threshold={threshold:g}")
            if not hints:
                t = min_threshold(epsilon, delta_target, default_scale, c, **kw)
                hints.append(f"scale={default_scale:g} with threshold {t:g}")
            raise ValueError(f"scale={scale:g} with threshold={threshold:g} gives delta="
                             f"{achieved:.3g} > {delta_target:g} for {budget}; use "
                             + "; or ".join(hints))
    if noise == "discrete_laplace":
        threshold = tau + int(math.ceil(threshold - tau))
    achieved = delta(epsilon, scale, threshold, c, **kw)
    return LaplaceThresholdParameters(scale=float(scale), threshold=threshold,
                                      pre_threshold=tau, model=model, noise=noise,
                                      delta=achieved, epsilon=epsilon)

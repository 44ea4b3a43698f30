"""The analytic Gaussian mechanism: exact delta(epsilon) of a Gaussian shift.

Balle & Wang (2018), "Improving the Gaussian mechanism for differential privacy",
Theorem 8; restated as Theorem 2.2 of paper 004 (Karrer, Kifer, Wilkins, Zhang,
/work/shared/papers/004_*.txt, Eq. 2.3). For N(0, sigma^2 I) noise on a query whose
l2 sensitivity is Delta, with mu = Delta / sigma,

    delta(epsilon) = Phi(mu/2 - epsilon/mu) - e^epsilon Phi(-mu/2 - epsilon/mu),

the hockey-stick divergence H_{e^epsilon}(N(mu, 1) || N(0, 1)), in both directions (the
pair is symmetric). Paper 004 Observation 2.1: the formula is exact for negative epsilon
too, which the sparse-histogram accounting (``accounting.gshm``) relies on.
"""
import math

import numpy as np
from thresher.accounting._lazy import special

from thresher.accounting.search import smallest_real


def delta_for_epsilon(mu, epsilon):
    """Exact delta(epsilon) of the Gaussian mechanism with privacy parameter mu.

    Args:
      mu: Delta / sigma >= 0 (scalar or array); mu = 0 means identical distributions,
        mu = inf means no noise.
      epsilon: any real (scalar or array); negative values are valid (paper 004, Obs. 2.1).
    Returns:
      delta in [0, 1], broadcast over the arguments (a float for scalar arguments).

    Computed in log space: delta = e^A (1 - e^(B - A)) with A = log Phi(mu/2 - eps/mu) and
    B = eps + log Phi(-mu/2 - eps/mu), so tails down to ~1e-300 keep their digits.
    """
    mu_arr, eps_arr = np.broadcast_arrays(np.asarray(mu, dtype=np.float64),
                                          np.asarray(epsilon, dtype=np.float64))
    if np.any(mu_arr < 0) or np.any(np.isnan(mu_arr)):
        raise ValueError(f"mu must be >= 0, got {mu}")
    if np.any(np.isnan(eps_arr)):
        raise ValueError(f"epsilon must be a number, got {epsilon}")
    out = np.empty(mu_arr.shape, dtype=np.float64)
    zero = mu_arr == 0
    inf = np.isinf(mu_arr)
    mid = ~(zero | inf)
    # mu = 0: P = Q, H_{e^eps}(P||P) = max(0, 1 - e^eps).
    out[zero] = np.maximum(0.0, -np.expm1(eps_arr[zero]))
    out[inf] = 1.0
    if np.any(mid):
        m, e = mu_arr[mid], eps_arr[mid]
        log_a = special.log_ndtr(m / 2 - e / m)
        log_b = e + special.log_ndtr(-m / 2 - e / m)
        diff = np.minimum(log_b - log_a, 0.0)
        out[mid] = np.exp(log_a) * -np.expm1(diff)
    out = np.clip(out, 0.0, 1.0)
    return float(out) if out.ndim == 0 else out


def sigma_for(epsilon, delta, sensitivity=1.0, *, rel_tol=1e-9):
    """Smallest sigma (up to rel_tol) with delta_for_epsilon(sensitivity/sigma, eps) <= delta.

    Args:
      epsilon: > 0. delta: in (0, 1). sensitivity: l2 sensitivity Delta > 0.
    Returns:
      sigma (float); the returned value always meets the target (smallest_real keeps the
      qualifying end of the bracket).
    """
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be > 0, got {sensitivity}")
    # sigma = 1e-9 * sensitivity (mu = 1e9) never qualifies: delta = 1 there.
    return smallest_real(lambda s: delta_for_epsilon(sensitivity / s, epsilon) <= delta,
                         1e-9 * sensitivity, math.inf, rel_tol=rel_tol)

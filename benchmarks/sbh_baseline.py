"""The stability-based histogram baseline (SbH) of paper 001, for comparisons only.

Cohen, Geri, Sarlos & Stemmer, "Differentially Private Weighted Sampling" (AISTATS 2021),
§8.1 and Appendix G (``/work/shared/papers/001_57785b851e794451.txt``): each key's count w
gets Laplace(1/eps) noise, noisy counts j >= T = 1 + ln(1/delta)/eps are kept (Korolova
et al. 2009; Bun et al. 2019), and "sampled-SbH" then samples the kept keys with q_j at the
*noisy* count j, estimating g(w) by g(j)/q_j (eq. 8 applied to the sanitized count).

- :func:`simulate` runs the mechanism (continuous Laplace from a seeded numpy generator:
  this is a benchmark baseline, not a thresher release);
- :func:`estimate_moments` gives E_i and MSE_i of sampled-SbH's estimate of g(w) = w
  (Appendix G eqs. (47), (48), by numerical integration);
- reporting probabilities phi_i live in ``accounting.pws.sbh_keep_probabilities``.
"""
import math

import numpy as np
import scipy.integrate

from thresher.accounting import pws


def _q(j, sampling, t):
    j = np.asarray(j, dtype=np.float64)
    if sampling == "none":
        return np.ones_like(j)
    if sampling == "ppswor":
        return -np.expm1(-t * np.maximum(j, 0.0))
    return np.minimum(1.0, t * np.maximum(j, 0.0))


def simulate(counts, epsilon, delta, rng, *, sampling="none", sampling_threshold=None):
    """One run of sampled-SbH on integer counts: returns (reported mask, estimates of w)."""
    counts = np.asarray(counts, dtype=np.float64)
    noisy = counts + rng.laplace(0.0, 1.0 / epsilon, len(counts))
    kept = noisy >= pws.sbh_threshold(epsilon, delta)
    q = _q(noisy, sampling, sampling_threshold)
    reported = kept & (rng.random(len(counts)) < q)
    estimates = np.where(reported, noisy / np.where(q > 0, q, 1.0), 0.0)
    return reported, estimates


def expected_estimate(epsilon, delta, frequencies):
    """E_i of the estimate g(j)/q_j of g(w) = w (Appendix G eq. (47); independent of q)."""
    e = float(epsilon)
    T = pws.sbh_threshold(epsilon, delta)
    i = np.asarray(frequencies, dtype=np.float64)
    return np.where(i > T, i - 0.5 * np.exp(-e * (i - T)) * (T - 1 / e),
                    0.5 * np.exp(-e * (T - i)) * (T + 1 / e))


def estimate_moments(epsilon, delta, frequencies, *, sampling="none", sampling_threshold=None):
    """(E_i, MSE_i) of sampled-SbH's estimate of g(w) = w at each frequency i:
    MSE_i = i^2 - 2 i E_i + int_T^inf j^2 / q_j Lap_{1/eps}(j - i) dj (Appendix G eq. (48))."""
    e = float(epsilon)
    T = pws.sbh_threshold(epsilon, delta)
    freqs = np.asarray(frequencies, dtype=np.float64)
    expected = expected_estimate(epsilon, delta, freqs)
    kink = 1.0 / sampling_threshold if sampling == "priority" else None
    mse = np.empty(len(freqs))
    for k, i in enumerate(freqs):
        def integrand(j, i=i):
            return j * j / float(_q(j, sampling, sampling_threshold)) * 0.5 * e * math.exp(-e * abs(j - i))
        hi = max(i, T) + 80.0 / e
        points = [x for x in (i, kink) if x is not None and T < x < hi]
        second = scipy.integrate.quad(integrand, T, hi, points=points or None, limit=500)[0]
        mse[k] = i * i - 2 * i * expected[k] + second
    return expected, mse

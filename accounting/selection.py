"""The exponential mechanism over a finite candidate set.

McSherry & Talwar (2007), "Mechanism design via differential privacy", Thm 6; Dwork &
Roth (2014), Thm 3.10. Given scores u(D, r) for candidates r with sensitivity
Delta = max over neighbouring D, D' and r of |u(D, r) - u(D', r)|, sampling r with

    Pr[r] proportional to exp(epsilon * u(D, r) / (2 * Delta))

is epsilon-DP (pure, delta = 0), whatever the number of candidates. If in addition the
scores are *monotone* -- for every neighbouring pair all candidates' scores move in the
same direction (u(D', r) - u(D, r) in [0, Delta] for every r, or in [-Delta, 0] for
every r) -- the factor 2 can be dropped: Pr[r] proportional to exp(epsilon * u / Delta)
is epsilon-DP (McSherry & Talwar 2007, Sec. 3 remark; Dwork & Roth Thm 3.10 proof: the
normalising constant then moves against the numerator). See docs/contribution_bound.md.

Numerics: probabilities are formed from log-weights shifted by their maximum
(log-sum-exp), so scores spanning 1e6 or more neither overflow nor produce NaN; a
candidate whose probability is below the smallest double (about 1e-308) gets
probability exactly 0 and is never drawn. Sampling inverts the cumulative distribution
with one uniform from ``rng.random()`` (53 random bits from the CSPRNG in the pipeline).
"""
import math

import numpy as np


def _validated(scores, epsilon, sensitivity):
    scores = np.asarray(scores, dtype=np.float64)
    if scores.ndim != 1 or scores.size == 0:
        raise ValueError(f"scores must be a non-empty 1-d array, got shape {scores.shape}")
    if not np.all(np.isfinite(scores)):
        raise ValueError("scores must all be finite (no NaN or infinity)")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be finite and > 0, got {epsilon}")
    if not (math.isfinite(sensitivity) and sensitivity > 0):
        raise ValueError(f"sensitivity must be finite and > 0, got {sensitivity}")
    return scores


def exponential_mechanism_log_probabilities(scores, epsilon, sensitivity, *, monotone=False):
    """Natural log of the exponential mechanism's probability of each candidate.

    Args:
      scores: 1-d array of finite scores (higher is better).
      epsilon: the selection's privacy parameter, > 0.
      sensitivity: Delta, the largest change of any candidate's score between
        neighbouring datasets, > 0.
      monotone: True only if the scores are monotone (see module docstring); the
        exponent is then epsilon * u / Delta instead of epsilon * u / (2 Delta).

    Returns:
      float64 array ``log p`` with ``logsumexp(log p) == 0``; every entry finite.
    """
    scores = _validated(scores, epsilon, sensitivity)
    scale = epsilon / (sensitivity if monotone else 2.0 * sensitivity)
    with np.errstate(over="ignore"):
        logits = scale * scores
    if not np.all(np.isfinite(logits)):
        raise ValueError("scores * epsilon / sensitivity overflows a double; rescale the scores")
    shifted = logits - logits.max()          # max term is exp(0) = 1
    return shifted - math.log(math.fsum(np.exp(shifted)))


def exponential_mechanism_probabilities(scores, epsilon, sensitivity, *, monotone=False):
    """Exact (to double precision) probabilities of the exponential mechanism; sum to 1.

    Same arguments as :func:`exponential_mechanism_log_probabilities`."""
    return np.exp(exponential_mechanism_log_probabilities(
        scores, epsilon, sensitivity, monotone=monotone))


def exponential_mechanism(scores, epsilon, sensitivity, rng, *, monotone=False):
    """Draw a candidate index with Pr[i] proportional to exp(epsilon * scores[i] / (2 Delta)).

    Args:
      scores, epsilon, sensitivity, monotone: as in
        :func:`exponential_mechanism_log_probabilities`.
      rng: ``transforms.samplers.SecureRandom`` (pipelines) or a seeded
        ``numpy.random.Generator`` (tests); one ``rng.random()`` uniform is used.

    Returns:
      int index into ``scores``. epsilon-DP (pure) for the stated sensitivity.
    """
    probabilities = exponential_mechanism_probabilities(
        scores, epsilon, sensitivity, monotone=monotone)
    cdf = np.cumsum(probabilities)
    u = float(rng.random())
    index = int(np.searchsorted(cdf, u * cdf[-1], side="right"))
    # u < 1, so index < len(scores) up to rounding of u * cdf[-1]; never return a
    # candidate of probability 0.
    return min(index, int(np.flatnonzero(probabilities > 0)[-1]))

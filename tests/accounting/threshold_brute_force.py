"""Brute-force privacy of a thresholded per-key release, for tests.

Builds, for one user and every key the user touches, the exact distribution of the key's
output (suppressed, or the noisy count) with and without the user, and sums
max(P(w) - e^eps Q(w), 0) over every joint outcome w of the product space: the
hockey-stick divergence from its definition, with no use of the papers' reductions."""
import math

import numpy as np

SUPPRESSED = None


def noise_table(log_weight, half_width):
    """(x, p): integer noise on [-half_width, half_width], p proportional to exp(log_weight(x))."""
    x = np.arange(-half_width, half_width + 1)
    w = np.exp(log_weight(x.astype(float)))
    return x, w / w.sum()


def key_output(count, noise, pre_threshold, threshold, lo, hi):
    """Distribution of one key's output on [suppressed, lo, lo+1, ..., hi]."""
    x, p = noise
    out = np.zeros(hi - lo + 2)
    if count < pre_threshold:
        out[0] = 1.0
        return out
    values = count + x
    released = values >= threshold
    out[0] = p[~released].sum()
    np.add.at(out, 1 + values[released] - lo, p[released])
    return out


def release_pair(counts_with, counts_without, noise, pre_threshold, threshold):
    """Per-key output distributions (with user, without user) on shared outcome grids."""
    x, _ = noise
    pairs = []
    for c1, c0 in zip(counts_with, counts_without):
        lo, hi = min(c1, c0) + int(x[0]), max(c1, c0) + int(x[-1])
        pairs.append((key_output(c1, noise, pre_threshold, threshold, lo, hi),
                      key_output(c0, noise, pre_threshold, threshold, lo, hi)))
    return pairs


def hockey_stick(p_rows, q_rows, eps):
    """sum_w max(P(w) - e^eps Q(w), 0) for product distributions given row by row."""
    p, q = np.ones(1), np.ones(1)
    for pr, qr in zip(p_rows, q_rows):
        p = np.multiply.outer(p, pr).ravel()
        q = np.multiply.outer(q, qr).ravel()
    return float(np.maximum(p - math.exp(eps) * q, 0.0).sum())


def worst_delta(configurations, noise, pre_threshold, threshold, eps):
    """max over configurations (counts_with, counts_without) and both directions."""
    best = 0.0
    for counts_with, counts_without in configurations:
        pairs = release_pair(counts_with, counts_without, noise, pre_threshold, threshold)
        with_rows = [a for a, _ in pairs]
        without_rows = [b for _, b in pairs]
        best = max(best, hockey_stick(with_rows, without_rows, eps),
                   hockey_stick(without_rows, with_rows, eps))
    return best


def l0_configurations(max_keys, pre_threshold, high_count):
    """Every (a_=, a_+) with 1 <= a_= + a_+ <= max_keys: a_= keys at the pre-threshold
    (tau with the user, tau - 1 without) and a_+ keys at high_count (minus one without)."""
    configs = []
    for a_eq in range(max_keys + 1):
        for a_plus in range(max_keys + 1 - a_eq):
            if a_eq + a_plus == 0:
                continue
            with_user = [pre_threshold] * a_eq + [high_count] * a_plus
            without = [pre_threshold - 1] * a_eq + [high_count - 1] * a_plus
            configs.append((with_user, without))
    return configs

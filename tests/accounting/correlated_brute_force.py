"""Brute-force privacy of the correlated sparse histogram, for tests.

The output of a release over a few keys is the mixture, over the shared component z, of
product distributions (given z the keys are independent: each is suppressed, or released
with value c + z + x). These helpers build every key's output distribution for every z on
one outcome grid and sum max(P(w) - e^eps Q(w), 0) over every joint outcome w: the
hockey-stick divergence from its definition, with none of the reductions of
``accounting.correlated_gshm`` (no joint convexity, no paper 004). Truncating the noise to
``width`` standard deviations drops mass that is returned beside the sum, so a test can
compare (sum + dropped) with a claimed delta."""
import math

import numpy as np

from thresher.accounting import discrete_gaussian as dg


def table(sigma, width):
    """(values, pmf, dropped): N_Z(0, sigma^2) on [-k, k], k = ceil(width sigma), with the
    exact pmf and the exact mass outside."""
    k = int(math.ceil(width * sigma))
    x = np.arange(-k, k + 1)
    return x, dg.pmf(x, sigma), 2.0 * float(dg.sf(k + 1, sigma))


def _key_output(count, z, pre_threshold, threshold, noise, lo, hi):
    x, p = noise[0], noise[1]
    out = np.zeros(hi - lo + 2)
    if count < pre_threshold:            # never noised, never released
        out[0] = 1.0
        return out
    values = count + z + x
    released = values >= threshold
    out[0] = p[~released].sum()
    np.add.at(out, 1 + values[released] - lo, p[released])
    return out


def pair_rows(counts_a, counts_b, pre_threshold, threshold, noise, shared, keep=None):
    """For neighbours with per-key counts ``counts_a`` and ``counts_b``: two lists (one per
    neighbour) of arrays rows[j] of shape (len(z), grid_j). ``keep(j, z)`` (optional) masks
    z values (their rows are zero)."""
    zs = shared[0]
    x = noise[0]
    rows_a, rows_b = [], []
    for j, (ca, cb) in enumerate(zip(counts_a, counts_b)):
        lo = min(ca, cb) + int(zs[0]) + int(x[0])
        hi = max(ca, cb) + int(zs[-1]) + int(x[-1])
        lo = max(lo, int(math.floor(threshold)))
        hi = max(hi, lo)
        ra = np.array([_key_output(ca, int(z), pre_threshold, threshold, noise, lo, hi) for z in zs])
        rb = np.array([_key_output(cb, int(z), pre_threshold, threshold, noise, lo, hi) for z in zs])
        rows_a.append(ra)
        rows_b.append(rb)
    return rows_a, rows_b


def joint(rows, weights):
    """sum_z weights[z] prod_j rows[j][z]: the joint output distribution (flattened)."""
    out = None
    for i, w in enumerate(weights):
        if w == 0.0:
            continue
        term = np.full(1, w)
        for r in rows:
            term = np.multiply.outer(term, r[i]).ravel()
        out = term if out is None else out + term
    return out


def hockey_stick(p, q, eps):
    return float(np.maximum(p - math.exp(eps) * q, 0.0).sum())


def worst_delta(configurations, sigma, shared_sigma, pre_threshold, threshold, eps, width=8.0):
    """max over configurations (counts with the user, counts without) and both directions of
    the exact hockey-stick divergence (truncated), and the mass the truncation dropped
    (an upper bound on how much the truncated sums can be below the true ones)."""
    noise = table(sigma, width)
    shared = table(shared_sigma, width)
    best = 0.0
    dropped = 0.0
    for counts_with, counts_without in configurations:
        rows_w, rows_wo = pair_rows(counts_with, counts_without, pre_threshold, threshold,
                                    noise, shared)
        p = joint(rows_w, shared[1])
        q = joint(rows_wo, shared[1])
        best = max(best, hockey_stick(p, q, eps), hockey_stick(q, p, eps))
        dropped = max(dropped, shared[2] + len(counts_with) * noise[2])
    return best, dropped


def configurations(max_keys, pre_threshold, high, witnesses=0, witness_count=None):
    """Every (a_=, a_+) with 1 <= a_= + a_+ <= max_keys (a_= keys at tau with the user and
    tau - 1 without, a_+ keys at ``high`` and high - 1), each with ``witnesses`` further
    keys at ``witness_count`` on both sides (keys of other users that reveal z)."""
    w = witness_count if witness_count is not None else high
    out = []
    for a_eq in range(max_keys + 1):
        for a_plus in range(max_keys + 1 - a_eq):
            if a_eq + a_plus == 0:
                continue
            with_user = [pre_threshold] * a_eq + [high] * a_plus + [w] * witnesses
            without = [pre_threshold - 1] * a_eq + [high - 1] * a_plus + [w] * witnesses
            out.append((with_user, without))
    return out


def renyi(p, q, alpha):
    """D_alpha(P || Q) summed over the outcomes where both truncated laws are positive, and
    the mass of P where Q is 0 (the truncation's edge: a shift moves one value of each key
    past the grid; the tests keep it below 1e-12). Truncation leaves out the terms
    p^alpha q^(1 - alpha) of noise beyond ``width`` sigmas: small for alpha well inside
    the width (the tilted law sum p^alpha q^(1-alpha) is centred near alpha shifts)."""
    both = (p > 0) & (q > 0)
    only = float(p[(p > 0) & (q <= 0)].sum())
    total = np.sum(p[both] ** alpha * q[both] ** (1.0 - alpha))
    return float(np.log(total) / (alpha - 1.0)), only

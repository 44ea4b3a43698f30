"""Tight composition of mechanisms given each one's privacy profile, by f-DP.

A mechanism that is (eps_i, delta_i)-DP for every point of a grid 0 = eps_0 < ... < eps_n
(in both neighbour orders) is f-DP for the symmetric piecewise-linear trade-off function

    f~(a) = max_i f_{eps_i, delta_i}(a),
    f_{eps, delta}(a) = max(0, 1 - delta - e^eps a, e^-eps (1 - delta - a))

(Dong, Roth & Su, "Gaussian differential privacy", JRSS-B 2022, Prop. 2.12, after
Wasserman & Zhou 2010). ``pessimistic_pair`` builds a finite pair of distributions
(P, Q) with T(Q, P) = f~ exactly: the upper envelope of the lines above is convex and
piecewise linear; its segment of slope -e^L over [a, a'] is one outcome with Q-mass
a' - a and P-mass e^L (a' - a) (privacy loss ln(P/Q) = L, one of +-eps_i); 1 - f~(0) is an
outcome of P alone (loss +inf) and the part where f~ = 0 an outcome of Q alone. Between
the grid points H_{e^eps}(P || Q) is the linear interpolation in e^eps of the profile
("connect the dots": Doroshenko, Ghazi, Kamath, Kumar, Manurangsi, PETS 2022).

Composition (DRS Thm 3.2, which holds for adaptively chosen mechanisms): k mechanisms,
f~_j-DP each, given the earlier outputs, compose to f~_1 (x) ... (x) f~_k =
T(Q_1 x ... x Q_k, P_1 x ... x P_k), so the release is (eps, delta(eps))-DP with

    delta(eps) = H_{e^eps}(P_1 x ... || Q_1 x ...)
               = E_P[(1 - e^(eps - L_1 - ... - L_k))_+] + P(some L_j = +inf).

f~ is symmetric, so is the tensor product (DRS Prop. 2.4 / Sec. 3): one orientation
covers both neighbour orders. ``composed_delta`` computes the expectation on a uniform
loss grid of step h, rounding every finite loss UP to the grid (the integrand grows with
each L_j, so the result is an upper bound), convolving the P-mass vectors and adding
FLOAT_SLACK per stage for float rounding (the masses are differences of numbers <= 1
whose hull breakpoints are quotients: ~1e-14 each, a few hundred per stage).
tests/accounting/test_tradeoff_composition.py checks it against the closed form of
composed Gaussians and against dp-accounting's PLD (test-only).
"""
import dataclasses
import math

import numpy as np
from thresher.accounting import fixed_order

# Absolute allowance for float rounding in the pair's masses and the convolution.
FLOAT_SLACK = 1e-11


@dataclasses.dataclass(frozen=True)
class ProfilePair:
    """A finite pair (P, Q) with T(Q, P) = f~ for a profile. ``losses``: the finite
    privacy losses ln(P/Q) of its outcomes (increasing), ``p``/``q`` their masses under P
    and Q; ``p_only``: mass of the outcome P alone has (loss +inf); ``q_only``: Q's alone."""

    losses: np.ndarray
    p: np.ndarray
    q: np.ndarray
    p_only: float
    q_only: float

    def hockey_stick(self, epsilon):
        """H_{e^eps}(P || Q) = sum_o (P(o) - e^eps Q(o))_+ (array epsilon allowed)."""
        e = np.asarray(epsilon, dtype=np.float64)[..., None]
        out = np.maximum(self.p - np.exp(e) * self.q, 0.0).sum(axis=-1) + self.p_only
        return float(out) if out.ndim == 0 else out


def check_profile(epsilons, deltas):
    """The grid (0 = eps_0 < ... < eps_n, finite) and deltas in [0, 1], as float arrays;
    the deltas are replaced by their running minimum (a mechanism (eps_j, delta_j)-DP is
    (eps_i, delta_j)-DP for eps_i >= eps_j, so this is still a valid profile)."""
    eps = np.asarray(epsilons, dtype=np.float64).reshape(-1)
    dlt = np.asarray(deltas, dtype=np.float64).reshape(-1)
    if eps.size == 0 or eps.size != dlt.size:
        raise ValueError("epsilons and deltas must be non-empty and of equal length")
    if eps[0] != 0.0 or np.any(np.diff(eps) <= 0) or not np.all(np.isfinite(eps)):
        raise ValueError("epsilons must start at 0 and increase strictly (finite)")
    if np.any(~np.isfinite(dlt)) or np.any(dlt < 0) or np.any(dlt > 1):
        raise ValueError("deltas must be in [0, 1]")
    return eps, np.minimum.accumulate(dlt)


def pessimistic_pair(epsilons, deltas):
    """The finite pair (P, Q) with T(Q, P) = max_i f_{eps_i, delta_i} (module docstring).

    The lines of every f_{eps_i, delta_i} (slope -e^eps_i and -e^-eps_i, losses eps_i and
    -eps_i) and the line 0 (loss -inf) are put in increasing slope order; the upper
    envelope over a >= 0 is kept with a stack (the convex hull trick); each envelope line's
    stretch [a, a'] inside [0, a_0] (a_0: where the envelope reaches 0) is one outcome."""
    eps, dlt = check_profile(epsilons, deltas)
    # (slope, intercept, loss): steep lines 1 - d - e^eps a, shallow e^-eps (1 - d - a)
    slope = np.concatenate((-np.exp(eps), -np.exp(-eps)))
    icpt = np.concatenate((1.0 - dlt, np.exp(-eps) * (1.0 - dlt)))
    loss = np.concatenate((eps, -eps))
    order = np.lexsort((-icpt, slope))            # slope increasing, best intercept first
    lines = []
    for i in order:
        s, b, l_ = float(slope[i]), float(icpt[i]), float(loss[i])
        if lines and lines[-1][0] == s:
            continue                              # same slope, lower intercept
        lines.append((s, b, l_))
    lines.append((0.0, 0.0, -math.inf))           # the zero line, last (largest slope)

    def cross(l1, l2):                            # a where l1 and l2 meet (l1 steeper)
        return (l1[1] - l2[1]) / (l2[0] - l1[0])

    hull = []                                     # envelope over a >= 0
    for line in lines:
        while hull:
            top = hull[-1]
            # top is useless when the new line beats it at its left end
            left = cross(hull[-2], top) if len(hull) >= 2 else 0.0
            if line[1] + line[0] * left >= top[1] + top[0] * left:
                hull.pop()
            else:
                break
        hull.append(line)
    starts = [0.0] + [max(cross(hull[j], hull[j + 1]), 0.0) for j in range(len(hull) - 1)]
    losses, p, q = [], [], []
    for j, (s, b, l_) in enumerate(hull[:-1]):
        width = min(starts[j + 1], 1.0) - min(starts[j], 1.0)
        if width > 0:
            losses.append(l_)
            q.append(width)
            p.append(-s * width)
    f0 = hull[0][1]                               # f~(0) = 1 - min delta
    a0 = min(starts[-1], 1.0)                     # where f~ reaches 0
    losses, p, q = np.array(losses), np.array(p), np.array(q)
    idx = np.argsort(losses, kind="stable")
    return ProfilePair(losses=losses[idx], p=p[idx], q=q[idx],
                       p_only=float(max(1.0 - f0, 0.0)), q_only=float(max(1.0 - a0, 0.0)))


def _loss_vector(pair, step):
    """The P-masses of ``pair``'s finite losses rounded UP to multiples of ``step``: an
    offset k0 and a dense vector v with v[k] the mass at (k0 + k) step."""
    k = np.ceil(pair.losses / step)
    k = np.where(k * step < pair.losses, k + 1, k).astype(np.int64)   # float: really up
    k0 = int(k.min())
    v = np.zeros(int(k.max()) - k0 + 1)
    np.add.at(v, k - k0, pair.p)
    return k0, v


def composed_delta(pairs, epsilon, step=1e-4):
    """Upper bound on delta(eps) of the composition of ``pairs`` (ProfilePair each;
    module docstring): E_P[(1 - e^(eps - sum L))_+] + P(some L = +inf), losses rounded up
    to multiples of ``step``, plus FLOAT_SLACK. Returns a float in [0, 1]."""
    step = float(step)
    if not (math.isfinite(step) and step > 0):
        raise ValueError(f"step must be > 0, got {step}")
    k0, v = 0, np.ones(1)
    finite = 1.0
    for pair in pairs:
        if pair.losses.size == 0:                 # only the +inf outcome: delta = 1
            return 1.0
        off, w = _loss_vector(pair, step)
        v = fixed_order.convolve(v, w)          # w: a pair's few outcomes; no BLAS
        k0 += off
        finite *= 1.0 - pair.p_only
    grid = (k0 + np.arange(v.size)) * step
    above = grid > epsilon
    total = float(np.sum(v[above] * -np.expm1(epsilon - grid[above])))
    out = total + (1.0 - finite) + FLOAT_SLACK * (1 + len(pairs))
    return float(min(max(out, 0.0), 1.0))


def composed_profile_delta(profiles, epsilon, step=1e-4):
    """delta(eps) of the composition of mechanisms given as (epsilons, deltas) profiles."""
    return composed_delta([pessimistic_pair(e, d) for e, d in profiles], epsilon, step)

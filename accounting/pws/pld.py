"""Tight composition of PWS key reporting over a user's keys (``composition: pld``).

PWS (Cohen, Geri, Sarlos & Stemmer, AISTATS 2021; paper 001) reports a key of frequency i
with probability pi_i, built by Alg. 3 so that frequencies i and i - 1 are (eps0, delta0)-
indistinguishable. A user changes <= C keys by one each; ``composition: optimal``
(accounting.pws.per_key_budget) composes C worst-case (eps0, delta0) mechanisms. Each key's
output is a coin, so its pair of output laws (Bern(pi_{i-1}), Bern(pi_i)) has a tradeoff
function (Dong, Roth & Su, "Gaussian differential privacy", JRSS-B 2022, Def. 2.1) with one
vertex; Alg. 3's tables put every vertex on the (eps0, delta0) tradeoff f_{eps0,delta0},
whose C-fold composition is what ``optimal`` computes. This module builds the table for a
tradeoff that composes better:

    g(alpha) = max(0, G_mu(alpha) - delta0),   G_mu(alpha) = Phi(Phi^-1(1 - alpha) - mu),

the mu-Gaussian tradeoff lowered by delta0. A pair (Bern(a), Bern(b)) has tradeoff >= g
in both orders iff (docs/weighted_sampling.md, "Tight composition across a user's keys")

    b <= U(a), 1 - b <= U(1 - a), a <= U(b), 1 - a <= U(1 - b),
    U(x) = Phi(Phi^-1(x) + mu) + delta0                                              (1)

so the largest reporting probabilities are (the analogue of Alg. 3, eqs. 16-17)

    pi_0 = 0,  pi_i = min(q_i, U(pi_{i-1}), 1 - U^-1(1 - pi_{i-1})),
    U^-1(y) = Phi(Phi^-1(y - delta0) - mu) (y > delta0; else 0).                     (2)

Composition: g is the tradeoff of an explicit pair (P*, Q*) (Q* moves the delta0 of
N(mu, 1)'s lowest losses to an outcome P* never produces); by Blackwell's theorem (as stated
in DRS §2) every per-key pair is a post-processing of (P*, Q*), so a user's <= C keys are
dominated by the C-fold product, whose hockey-stick divergence is at most

    delta(eps) <= 1 - (1 - delta0)^C + delta_G(eps; mu sqrt(C)),
    delta_G(eps; m) = Phi(-eps/m + m/2) - e^eps Phi(-eps/m - m/2)                    (3)

(DRS: the (eps, delta) form of mu-GDP, and G_mu^{(x)C} = G_{mu sqrt C}). The table actually sampled
(exact Bernoulli coins of the float pi_i, or q_i x fl(pi_i / q_i) on a pre-sampled input)
is verified against (1) with directed bounds on every rounding (:func:`verify`).

``calibrate`` (accounting.pws.release, composition pld) uses this table only where it is no
worse than ``optimal``'s at every frequency (up to delta, :func:`no_worse`), else optimal's
tables. Keys only: the Alg. 4 frequency tokens are built for (eps0, delta0) and keep
``optimal``. This module needs nothing of accounting.pws.core: the release module joins them.
"""
import dataclasses
import math

import numpy as np
from thresher.accounting._lazy import special

# Relative error allowed for the composite Phi(Phi^-1(x) + mu) of scipy's ndtr/ndtri in
# (1) and for the float sum with delta0; tests/accounting/pws/test_pws_pld.py checks scipy
# against mpmath at 50 digits on x in [1e-300, 1 - 1e-16], mu in [1e-4, 8] (< 1e-12 seen).
RHO = 1e-10
_U = np.finfo(np.float64).eps / 2
# Fractions of delta / C tried for delta0 (the rest of delta goes to the Gaussian part).
DELTA0_FRACTIONS = (0.9, 0.7, 0.5, 0.35, 0.2, 0.1, 0.05, 0.02, 0.01)
# The Gaussian part is solved for delta_G <= rest (1 - _SOLVE_MARGIN): float slack.
_SOLVE_MARGIN = 1e-6
# Longest Gaussian table built (frequencies): beyond it (tables stretched by a small
# ppswor/priority sampling threshold) pld keeps optimal's tables, bounding its extra
# planning cost to ~1 s.
MAX_LENGTH = 1 << 20
# Pairs verified per block (bounded memory on tables of up to accounting.pws.MAX_KEEP_LENGTH).
_CHUNK = 1 << 18


@dataclasses.dataclass(frozen=True)
class GaussianBudget:
    """Per-key tradeoff g = max(0, G_mu - delta0) and its C-fold composition at epsilon."""

    mu: float
    delta0: float
    max_keys_per_user: int
    delta: float            # (3) at epsilon: what the release spends


def gaussian_delta(epsilon, mu):
    """delta_G(eps; mu) of (3), the mu-GDP hockey-stick divergence (DRS; Balle & Wang 2018), rounded up (each ndtr term has relative error << 1e-12)."""
    if mu <= 0:
        return 0.0
    first = float(special.ndtr(-epsilon / mu + mu / 2))
    second = math.exp(epsilon) * float(special.ndtr(-epsilon / mu - mu / 2))
    return max(0.0, first - second) + 1e-12 * first


def composed_delta(epsilon, mu, delta0, max_keys_per_user):
    """(3): delta(epsilon) of C keys, each with tradeoff >= max(0, G_mu - delta0)."""
    c = int(max_keys_per_user)
    any_top = -math.expm1(c * math.log1p(-delta0))       # 1 - (1 - delta0)^C
    return min(1.0, any_top * (1 + 4 * c * _U) + gaussian_delta(epsilon, mu * math.sqrt(c)))


def _largest_mu(epsilon, target):
    """Largest m with gaussian_delta(epsilon, m) <= target (increasing in m); bisection
    on log m, returning the lower end (so the bound holds at the value returned)."""
    lo, hi = 1e-6, 1.0
    if gaussian_delta(epsilon, lo) > target:
        return None
    while gaussian_delta(epsilon, hi) <= target:
        lo, hi = hi, hi * 2
        if hi > 1e4:
            return lo
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if gaussian_delta(epsilon, mid) <= target:
            lo = mid
        else:
            hi = mid
        if hi / lo < 1 + 1e-12:
            break
    return lo


def half_length(mu, delta0):
    """Frequency where (2) reaches 1/2 without sampling, approximately: from pi_1 = delta0
    each step adds mu to Phi^-1(pi) (and more, from the + delta0): <= |Phi^-1(delta0)| / mu."""
    return -float(special.ndtri(delta0)) / mu + 1.0


def budgets(epsilon, delta, max_keys_per_user):
    """(mu, delta0) candidates meeting (epsilon, delta) by (3), one per DELTA0_FRACTIONS."""
    c = int(max_keys_per_user)
    out = []
    for f in DELTA0_FRACTIONS:
        d0 = f * delta / c
        rest = delta + math.expm1(c * math.log1p(-d0)) * (1 + 4 * c * _U)
        if rest <= 0:
            continue
        m = _largest_mu(epsilon, rest * (1 - _SOLVE_MARGIN))
        if m is None:
            continue
        mu = m / math.sqrt(c)
        spent = composed_delta(epsilon, mu, d0, c)
        if spent <= delta:
            out.append(GaussianBudget(mu=mu, delta0=d0, max_keys_per_user=c, delta=spent))
    return out


def best_budget(epsilon, delta, max_keys_per_user):
    """The candidate of :func:`budgets` with the smallest :func:`half_length`, or None."""
    cands = budgets(epsilon, delta, max_keys_per_user)
    return min(cands, key=lambda b: half_length(b.mu, b.delta0)) if cands else None


def _upper(x, mu, delta0):
    """U(x) of (1), elementwise (as computed; :func:`verify` allows RHO for its error)."""
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return special.ndtr(special.ndtri(x) + mu) + delta0


def _next_pi(a, q_i, mu, delta0):
    """(2) for one step (scalars)."""
    c1 = float(special.ndtr(special.ndtri(a) + mu)) + delta0 if a > 0 else delta0
    y = 1.0 - a - delta0
    c2 = 1.0 - float(special.ndtr(special.ndtri(y) - mu)) if y > 0 else 1.0
    return min(q_i, c1, c2, 1.0)


def keep_probabilities(q, mu, delta0, max_length=None):
    """pi_0 .. pi_M of (2) for q_0..q_M (q_0 = 0), stopping at the first pi_i = 1 (the
    saturation; later entries would all be 1) or at ``max_length``. Runs of pi_i = q_i
    where q stays inside both constraints are filled in vectorised chunks (the same
    comparison as the scalar step)."""
    q = np.asarray(q, dtype=np.float64)
    n = len(q) if max_length is None else min(len(q), int(max_length) + 1)
    pi = np.zeros(n)
    i, chunk = 1, 256
    while i < n:
        value = _next_pi(pi[i - 1], q[i], mu, delta0)
        pi[i] = value
        i += 1
        if value == 1.0:
            return pi[:i]
        if value == q[i - 1] and i < n:
            end = min(n, i + chunk)
            qa, qb = q[i - 1:end - 1], q[i:end]
            with np.errstate(divide="ignore"):
                c1 = np.where(qa > 0, special.ndtr(special.ndtri(qa) + mu) + delta0, delta0)
                y = 1.0 - qa - delta0
                c2 = np.where(y > 0, 1.0 - special.ndtr(special.ndtri(np.maximum(y, 0.0)) - mu), 1.0)
            ok = (qb <= c1) & (qb <= c2) & (qb < 1.0)
            k = int(np.argmin(ok)) if not ok.all() else len(ok)
            pi[i:i + k] = qb[:k]
            i += k
            chunk = min(chunk * 2, 1 << 20) if k == len(ok) else 256
    return pi


def _within(b, x, mu, delta0):
    """Elementwise: is b <= U(x') for every x' >= x (b, x floats in [0, 1])? U is
    non-decreasing, so this is b <= U(x), decided with scipy's error allowed for: with
    z = Phi^-1(x) + mu, directly (b - delta0 <= Phi(z), z <= 0) or on the complements
    (1 - b + delta0 >= Phi(-z), z > 0), each side moved by RHO and the float rounding of
    the sums (so values near 1 keep their precision)."""
    b = np.asarray(b, dtype=np.float64)
    x = np.asarray(x, dtype=np.float64)
    with np.errstate(divide="ignore", invalid="ignore"):
        z = special.ndtri(x) + mu
        low = z <= 0
        out = np.empty(len(z), dtype=bool)
        out[low] = b[low] <= (special.ndtr(z[low]) * (1.0 - RHO) + delta0) * (1.0 - 4 * _U)
        high = ~low
        one_minus_b = np.nextafter(1.0 - b[high], -1.0).clip(0.0, 1.0)   # <= 1 - b
        out[high] = ((one_minus_b + delta0) * (1.0 - 4 * _U)
                     >= special.ndtr(-z[high]) * (1.0 + RHO))
    return out


def verify(reported, mu, delta0, *, beyond_gap=0.0, relative_error=0.0):
    """True if every consecutive pair of ``reported`` (the probabilities with which counts
    0, 1, .., M are reported; reported[0] = 0) satisfies (1) in both orders, and the pairs
    beyond the table (counts > M, whose reporting probabilities differ by at most
    ``beyond_gap``) do too. ``relative_error`` bounds the float error of ``reported``
    itself (q x fl(pi / q) on a pre-sampled input). Directed bounds: the side that must be
    small is rounded up, the other down; complements 1 - x are moved one float outwards.

    Of the four conditions two hold by themselves for an increasing pair (a <= b, both
    exact values): a <= b <= b + delta0 <= U(b) and 1 - b <= 1 - a <= U(1 - a), since
    Phi(Phi^-1(x) + mu) >= x. They are evaluated only for pairs not certified increasing
    (a's upper bound above b's lower bound)."""
    r = np.asarray(reported, dtype=np.float64)
    if len(r) < 2 or r[0] != 0.0 or not np.all((r >= 0) & (r <= 1)):
        return False
    if beyond_gap > delta0:   # |b - a| <= delta0 satisfies (1): U(x) >= x + delta0
        return False
    for start in range(0, len(r) - 1, _CHUNK):   # pairs (start .. end-1, +1): bounded memory
        part = r[start:start + _CHUNK + 1]
        hi = np.minimum(1.0, part * (1.0 + relative_error))
        lo = part * (1.0 - relative_error)
        comp_hi = np.nextafter(1.0 - lo, 2.0).clip(0.0, 1.0)    # >= 1 - x
        comp_lo = np.nextafter(1.0 - hi, -1.0).clip(0.0, 1.0)   # <= 1 - x
        ok = (_within(hi[1:], lo[:-1], mu, delta0)                 # b <= U(a)
              & _within(comp_hi[:-1], comp_lo[1:], mu, delta0))    # 1 - a <= U(1 - b)
        if not ok.all():
            return False
        odd = np.flatnonzero(hi[:-1] > lo[1:])                     # not certified a <= b
        if len(odd) and not (_within(hi[odd], lo[odd + 1], mu, delta0).all()     # a <= U(b)
                             and _within(comp_hi[odd + 1], comp_lo[odd], mu, delta0).all()):
            return False                                           # 1 - b <= U(1 - a)
    return True


def half_frequency(keep):
    """First frequency with reporting probability >= 1/2 (len(keep) if none)."""
    hit = np.flatnonzero(np.asarray(keep) >= 0.5)
    return int(hit[0]) if len(hit) else len(keep)


def build(q_fn, budget, max_length, *, presampled=False):
    """(keep, mu_build, delta0_build) of a verified table for ``budget`` with at most
    ``max_length`` frequencies, or None (not saturated within max_length, or not
    verifiable). The table is built at mu (1 - margin), delta0 (1 - margin), the margin
    growing until :func:`verify` passes against (mu, delta0) for the reported
    probabilities actually sampled (the mu margin moves Phi(z + mu) by ~0.8 mu margin of
    itself, which must exceed RHO)."""
    margin = max(1e-6, 16 * RHO / budget.mu)
    for _ in range(6):
        mu_build, d_build = budget.mu * (1.0 - margin), budget.delta0 * (1.0 - margin)
        keep = keep_probabilities(q_fn(max_length), mu_build, d_build, max_length)
        if keep[-1] != 1.0:
            return None
        if presampled:
            q = q_fn(len(keep) - 1)
            rep = np.zeros_like(keep)
            pos = q > 0
            rep[pos] = q[pos] * (keep[pos] / q[pos])
            # counts above M have q = 1 (q_M >= pi_M = 1): the same coin as count M
            ok = verify(rep, budget.mu, budget.delta0, relative_error=4 * _U)
        else:
            ok = verify(keep, budget.mu, budget.delta0)
        if ok:
            return keep, mu_build, d_build
        margin *= 8
        if margin >= 0.1:
            return None
    return None


def no_worse(keep, optimal_keep, delta):
    """The Gaussian table is used only if, at every frequency, it reports a key with
    probability at least optimal's minus delta (the release's own delta: at C >= 4 the
    Gaussian table starts from a smaller delta0, lower by < 3e-9 at frequencies 1-5 at
    delta = 1e-8), reaches 1/2 no later and saturates no later."""
    n = len(optimal_keep)
    if len(keep) > n or half_frequency(keep) > half_frequency(optimal_keep):
        return False
    padded = np.concatenate([keep, np.ones(n - len(keep))])
    return bool(np.all(padded >= optimal_keep - delta))


def per_key_epsilon(mu, delta0):
    """The eps0 at which one key with tradeoff g is (eps0, 2 delta0)-DP: delta_G(eps0; mu)
    = delta0 (informational: the report's key_epsilon / key_delta for this table)."""
    lo, hi = 0.0, max(1.0, mu * mu)
    while gaussian_delta(hi, mu) > delta0:
        hi *= 2
    for _ in range(100):
        mid = (lo + hi) / 2
        if gaussian_delta(mid, mu) > delta0:
            lo = mid
        else:
            hi = mid
    return hi

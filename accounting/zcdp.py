"""Approximate zero-concentrated DP: each release's (rho, delta0) and the ledger's filter.

A mechanism M is **delta0-approximately rho-zCDP** (Bun & Steinke, "Concentrated
differential privacy: simplifications, extensions, and lower bounds", TCC 2016, Def. 8.1)
if for every pair of neighbours x, x' there are events E, E' with P[M(x) in E] >= 1 -
delta0 and P[M(x') in E'] >= 1 - delta0 such that the Renyi divergences of the outputs
conditioned on them satisfy D_alpha(M(x)|E || M(x')|E') <= rho alpha for every alpha > 1
(and the same the other way). delta0 = 0 is plain rho-zCDP.

The ledger's ``zcdp`` composition (``pipelines.ledgers.ledger``) charges each release its
record (rho, delta0) and admits a release iff the running sums stay within two budgets
fixed when the dataset's budget is first set: sum rho <= rho_B and sum delta0 <= delta0_B.
That is a valid *filter* for fully adaptive sequences (the next release and its
parameters chosen after seeing earlier outputs): Feldman & Zrnic, "Individual privacy
accounting via a Renyi filter" (NeurIPS 2021), for the Renyi/zCDP part, and Whitehouse,
Ramdas, Rogers & Wu, "Fully-adaptive composition in differential privacy" (ICML 2023),
for approximate zCDP. The whole interaction is then delta0_B-approximately rho_B-zCDP,
hence (epsilon, delta0_B + delta_conv)-DP with epsilon the conversion of rho_B at
delta_conv (:func:`epsilon_of_rho`). rho_B is the largest rho whose conversion at
delta_conv = delta - delta0_B is at most the dataset's epsilon (:func:`rho_budget`).

The conversion (Canonne, Kamath & Steinke, "The discrete Gaussian for differential
privacy", NeurIPS 2020, Prop. 12 / Cor. 13): rho-zCDP implies (epsilon, delta)-DP for

    epsilon = alpha rho + (log(1/delta) - log alpha) / (alpha - 1) + log(1 - 1/alpha)

at *every* order alpha > 1; the ledger takes the infimum over alpha (any alpha is a valid
bound, so a numerically found minimiser errs on the safe side). dp_accounting's
``RdpAccountant`` applies the same formula at its grid of orders.

**A kind's record.** One function per mechanism kind below, which the kind's
``privacy_record`` hook (``pipelines.kinds.base.Kind``) calls; the ledger asks the kind::

    <kind>_record(mechanism, stages, max_keys_per_user) -> Record(rho, delta0)

``mechanism`` is the kind's calibrated section for ONE bound (the report's ``mechanism``:
plain JSON values), ``stages`` the plan's budget stages that the kind spends, as
``(name, epsilon, delta)`` tuples (every stage but the exponential-mechanism ones, which
``pipelines.ledgers.records`` charges by :func:`bounded_range_record`), and
``max_keys_per_user`` the bound C. It returns the record of those stages composed
(rho and delta0 add), derived from the noise actually drawn, as an upper bound for the
worst neighbour. A stage without its own derivation is charged from its (epsilon, delta)
claim by :func:`approximate_record` (pure epsilon-DP => epsilon^2/2-zCDP; (epsilon,
delta)-DP => delta-approximately epsilon^2/2-zCDP, :func:`stage_records`): that is the
default of a kind whose ``privacy_record`` is not overridden, so a new kind is charged
soundly before it gets its own row. To give a kind (or a noise variant of one) its own
record: write its function below from its calibrated parameters, call it from the kind's
``privacy_record``, add its row to docs/accounting.md ("Approximate zCDP records"), and a
test in tests/accounting/test_zcdp.py that its record is >= an independent computation
and that halving its rho fails that test.

docs/accounting.md ("Approximate zCDP records") derives every row; the pure math here
uses numpy only.
"""
import dataclasses
import decimal
import functools
import math

import numpy as np

from thresher.accounting import discrete_gaussian as dg
from thresher.accounting import gshm
from thresher.accounting import plain_gshm
from thresher.accounting import weighted_gaussian as wg

# Stored records and budgets keep this many significant digits (rho and delta0 rounded
# up, the budgets rounded down), so the ledger's exact decimal sums stay short.
DIGITS = 12
# Relative margin below the dataset's epsilon that rho_B's conversion must meet (float
# rounding in the conversion formula is ~1e-15 relative; this is far above it).
_CONVERSION_MARGIN = 1e-12


@dataclasses.dataclass(frozen=True)
class Record:
    """A release's approximate-zCDP record: delta0-approximately rho-zCDP."""
    rho: float
    delta0: float

    def __post_init__(self):
        if not (math.isfinite(self.rho) and self.rho >= 0):
            raise ValueError(f"rho must be finite and >= 0, got {self.rho}")
        if not (0 <= self.delta0 <= 1):
            raise ValueError(f"delta0 must be in [0, 1], got {self.delta0}")

    def __add__(self, other):
        """Composition (adaptive too): rho and delta0 add (Bun & Steinke 2016, Lemma 8.3)."""
        return Record(self.rho + other.rho, min(1.0, self.delta0 + other.delta0))

    def joined(self, other):
        """The componentwise maximum: a record that holds for either mechanism (the charge
        of ``max_keys_per_user: auto``, made before the bound is drawn)."""
        return Record(max(self.rho, other.rho), max(self.delta0, other.delta0))


ZERO = Record(0.0, 0.0)


# ---- exact decimals -----------------------------------------------------------------------

def decimal_up(value, digits=DIGITS):
    """``value`` rounded UP to ``digits`` significant digits, as a Decimal (a record)."""
    return _rounded(value, digits, decimal.ROUND_CEILING)


def decimal_down(value, digits=DIGITS):
    """``value`` rounded DOWN to ``digits`` significant digits, as a Decimal (a budget)."""
    return _rounded(value, digits, decimal.ROUND_FLOOR)


def _rounded(value, digits, rounding):
    exact = decimal.Decimal(float(value))         # the binary64 value, exactly
    if exact == 0:
        return decimal.Decimal(0)
    exponent = exact.adjusted() - digits + 1
    return exact.quantize(decimal.Decimal(1).scaleb(exponent), rounding=rounding).normalize()


# ---- conversion to (epsilon, delta) and the rho budget --------------------------------------

def epsilon_at_orders(rho, delta, orders):
    """min over the given orders alpha > 1 of the CKS conversion of rho-zCDP at delta
    (module docstring; dp_accounting's ``RdpAccountant`` formula with RDP alpha rho)."""
    alpha = np.asarray(orders, dtype=np.float64)
    if np.any(alpha <= 1):
        raise ValueError("orders must be > 1")
    _check_rho_delta(rho, delta)
    eps = (alpha * rho + (math.log(1.0 / delta) - np.log(alpha)) / (alpha - 1.0)
           + np.log1p(-1.0 / alpha))
    return float(max(0.0, np.min(eps)))


def epsilon_of_rho(rho, delta):
    """The smallest epsilon such that rho-zCDP implies (epsilon, delta)-DP by the CKS
    conversion, minimised over every real order alpha > 1 (a log grid, then golden-section
    refinement; the value returned is attained at an order, so it is a valid epsilon).
    rho = 0 gives 0; delta must be in (0, 1)."""
    _check_rho_delta(rho, delta)
    if rho == 0:
        return 0.0
    # The minimiser is near 1 + sqrt(log(1/delta) / rho); search around it on a log grid.
    log_m1 = np.linspace(-12.0, 25.0, 1481)            # log(alpha - 1)
    values = _eps_log(rho, delta, log_m1)
    i = int(np.argmin(values))
    lo, hi = log_m1[max(i - 1, 0)], log_m1[min(i + 1, len(log_m1) - 1)]
    best = float(values[i])
    golden = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = lo, hi
    c, d = b - golden * (b - a), a + golden * (b - a)
    fc, fd = float(_eps_log(rho, delta, c)), float(_eps_log(rho, delta, d))
    for _ in range(100):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - golden * (b - a)
            fc = float(_eps_log(rho, delta, c))
        else:
            a, c, fc = c, d, fd
            d = a + golden * (b - a)
            fd = float(_eps_log(rho, delta, d))
    return max(0.0, min(best, fc, fd))


def _eps_log(rho, delta, log_m1):
    m1 = np.exp(np.asarray(log_m1, dtype=np.float64))      # alpha - 1 > 0
    alpha = 1.0 + m1
    return alpha * rho + (math.log(1.0 / delta) - np.log1p(m1)) / m1 + np.log(m1 / alpha)


@functools.lru_cache(maxsize=64)
def rho_budget(epsilon, delta):
    """rho_B: the largest rho (rounded down to DIGITS significant digits) whose CKS
    conversion at ``delta`` is at most ``epsilon`` (times 1 - 1e-12), by bisection; the
    conversion grows with rho. 0 if ``delta`` is 0 (no conversion without a delta)."""
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    if delta == 0:
        return 0.0
    target = epsilon * (1.0 - _CONVERSION_MARGIN)

    def fits(r):
        return epsilon_of_rho(r, delta) <= target

    lo, hi = 0.0, max(1.0, epsilon)
    while fits(hi):
        lo, hi = hi, 2.0 * hi
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        if mid in (lo, hi):
            break
        if fits(mid):
            lo = mid
        else:
            hi = mid
    out = float(decimal_down(lo))
    if out > 0 and not fits(out):       # cannot happen (monotone); never store a wrong budget
        raise ArithmeticError(f"rho_budget({epsilon}, {delta}): rounded budget does not fit")
    return out


def _check_rho_delta(rho, delta):
    if not (math.isfinite(rho) and rho >= 0):
        raise ValueError(f"rho must be finite and >= 0, got {rho}")
    if not (0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta}")


# ---- the building blocks -----------------------------------------------------------------

def gaussian_rho(squared_sensitivity, sigma):
    """rho of discrete Gaussian noise N_Z(0, sigma^2) (sigma the scale parameter) added
    to every coordinate of an integer vector whose neighbours differ by integer shifts
    h_j with sum h_j^2 <= ``squared_sensitivity``: each coordinate is h_j^2/(2 sigma^2)-zCDP
    (Canonne, Kamath & Steinke 2020, Thm 4: D_alpha(N_Z(h, s^2) || N_Z(0, s^2)) <= alpha
    h^2 / (2 s^2) for integer h) and Renyi divergences of independent coordinates add."""
    if not (sigma > 0):
        raise ValueError(f"sigma must be > 0, got {sigma}")
    return float(squared_sensitivity) / (2.0 * float(sigma) ** 2)


def pure_rho(epsilon):
    """epsilon-DP implies epsilon^2/2-zCDP (Bun & Steinke 2016, Prop. 1.4)."""
    return 0.5 * float(epsilon) ** 2


def bounded_range_record(epsilon):
    """An epsilon-bounded-range mechanism is epsilon^2/8-zCDP (Durfee & Rogers, "Practical
    differentially private top-k selection with pay-what-you-get composition", NeurIPS
    2019; Cesar & Rogers, "Bounding, concentrating, and truncating: unifying privacy loss
    composition for data analytics", ALT 2021, Lemma 3.2). Both forms of
    ``accounting.selection`` are epsilon-BR at their epsilon: the general exponent
    epsilon u / (2 Delta) moves each outcome's log-probability by a term in
    [-epsilon/2, epsilon/2], the monotone exponent epsilon u / Delta by one in [0, epsilon]
    (or [-epsilon, 0]) for all outcomes at once."""
    return Record(float(epsilon) ** 2 / 8.0, 0.0)


def approximate_record(epsilon, delta):
    """The record of any (epsilon, delta)-DP stage: delta-approximately epsilon^2/2-zCDP.
    An (epsilon, delta)-DP pair is a delta-mixture of an epsilon-DP pair (Kairouz, Oh &
    Viswanath, ICML 2015; Murtagh & Vadhan, TCC 2016, Lemma 3.2): the events are the
    mixture's (1 - delta) parts, and epsilon-DP gives epsilon^2/2-zCDP
    (docs/accounting.md, "Approximate zCDP records")."""
    return Record(pure_rho(epsilon), float(delta))


def suppression_delta0(log_beta, keys):
    """1 - beta^keys: the probability that any of ``keys`` independent keys, each hidden
    with probability beta = exp(log_beta), is released (the event a record conditions
    away)."""
    if keys == 0:
        return 0.0
    return float(min(1.0, max(0.0, -math.expm1(keys * min(float(log_beta), 0.0)))))


def stage_records(stages):
    """Every stage charged from its (epsilon, delta) claim, composed."""
    total = ZERO
    for _, epsilon, delta in stages:
        total = total + approximate_record(epsilon, delta)
    return total


# ---- one function per kind --------------------------------------------------------------

def gaussian_record(mechanism, stages, max_keys_per_user):
    """``gaussian`` (paper 004 GSHM; ``public_keys``: every key noised, no threshold), with
    aggregates' grid sum columns. A user shifts at most C keys; each key's count by 1 and
    each sum column j by at most D_j grid units against sigma_j: per key 1/sigma^2 +
    mu_o^2 in units of 1/2 rho (mu_o^2 = sum_j (D_j / sigma_j)^2, the calibration's own).
    Thresholded: delta0 = 1 - beta^C, beta = P[tau + v < tau*] (the keys a user lifts from
    tau - 1 to tau, all C of them at worst; their sums are released only with them)."""
    c = int(max_keys_per_user)
    sigma = float(mechanism["sigma"])
    if mechanism.get("noise") == "correlated":
        # v = Z + X with Z shared by every key (docs/accounting.md, "correlated"): Theorem 3
        # of accounting.correlated_gshm, never the independent row below (it ignores Z).
        from thresher.accounting import correlated_gshm
        return Record(*correlated_gshm.correlated_privacy_record(
            sigma, float(mechanism["shared_sigma"]), mechanism["threshold"],
            int(mechanism["pre_threshold"]), c))
    per_key = 1.0 / sigma ** 2 + float(mechanism.get("mu_o", 0.0)) ** 2
    rho = 0.5 * c * per_key
    if mechanism.get("public_keys"):
        return Record(rho, 0.0)
    gap = float(mechanism["threshold"]) - int(mechanism["pre_threshold"])
    return Record(rho, suppression_delta0(_log_beta_lower(sigma, gap), c))


def _log_beta_lower(sigma, gap):
    """log P[v <= ceil(gap) - 1] for v ~ N_Z(0, sigma^2), from below: plain_gshm's rigorous
    lower bound in plain math (no SciPy: a release read from the calibration cache stays
    SciPy-free), or, past its term limit, gshm's exact sum."""
    try:
        return plain_gshm.log_beta_lower(sigma, gap)
    except plain_gshm.TooLarge:
        return gshm.log_beta(sigma, gap)


def laplace_record(mechanism, stages, max_keys_per_user):
    """``laplace`` (paper 002 Alg. 3 and its l0 form; ``public_keys``: no threshold).
    Discrete Laplace of scale b: a key shifted by h is (h/b)-DP, so h^2/(2 b^2)-zCDP; a
    user's shifts have sum h^2 <= C (l0: C keys by 1) or <= C^2 (l1: C records). With
    aggregates each sum column j is discrete Laplace of scale C D_j / eps_j on shifts
    <= D_j per key over <= C keys: eps_j^2 / (2C), and the columns share the stage's
    epsilon minus the count's equally. Thresholded: delta0 = 1 - beta^C (l0) or the
    worst split of the user's C records over lifted keys (l1, as
    ``accounting.laplace_threshold``'s suppression term)."""
    from thresher.accounting import laplace_threshold   # imports SciPy: only for laplace
    c = int(max_keys_per_user)
    b = float(mechanism["scale"])
    l1 = mechanism.get("model") == "l1"
    rho = (c * c if l1 else c) / (2.0 * b * b)
    if "epsilon_count" in mechanism:        # aggregates: sum columns at eps_count each
        share = float(mechanism["epsilon_count"])
        stage_epsilon = math.fsum(e for _, e, _ in stages)
        rho += max(0.0, stage_epsilon - share) * share / (2.0 * c)
    if mechanism.get("public_keys"):
        return Record(rho, 0.0)
    tau, threshold = int(mechanism["pre_threshold"]), float(mechanism["threshold"])
    if not l1:
        return Record(rho, suppression_delta0(
            laplace_threshold.log_suppress(b, threshold - tau), c))
    h = np.arange(1, c + 1, dtype=np.float64)     # a lifted key holding h of the records
    log_beta = np.minimum(np.atleast_1d(
        laplace_threshold.log_suppress(b, threshold - tau + 1.0 - h)), 0.0)
    k = np.arange(1, c + 1)                       # (C - k + 1, 1, ..., 1): the worst split
    worst = log_beta[c - k] + (k - 1.0) * log_beta[0]
    return Record(rho, float(np.clip(-np.expm1(worst.min()), 0.0, 1.0)))


def _weighted_round(sigma, threshold_grid, scale, max_keys_per_user):
    """One weighted Gaussian selection (Gopi et al. 2020, Thm 5.1, on the grid): a user
    with t keys gives each q_t = floor(S / sqrt(t)) grid units and the noise is N_Z(0,
    (sigma S)^2); rho = max_t t q_t^2 / (2 (sigma S)^2) <= 1/(2 sigma^2); delta0 = max_t
    1 - (1 - P[Z >= T - q_t])^t (the user's t keys all lifted from weight 0)."""
    t = np.arange(1, int(max_keys_per_user) + 1, dtype=np.int64)
    q = wg.grid_weight(t, scale)
    q = np.atleast_1d(q)
    sd = float(sigma) * int(scale)
    rho = float(np.max(t * q.astype(np.float64) ** 2)) / (2.0 * sd * sd)
    # tails at each distinct weight (upper bounds), then the worst t
    weights, inverse = np.unique(q, return_inverse=True)
    tails = np.atleast_1d(wg.sf_upper(int(threshold_grid) - weights, sd))[inverse]
    with np.errstate(divide="ignore"):
        log_hidden = np.log1p(-np.minimum(tails, 1.0))
    delta0 = float(np.clip(np.max(-np.expm1(t * log_hidden)), 0.0, 1.0))
    return Record(rho, delta0)


def weighted_gaussian_record(mechanism, stages, max_keys_per_user):
    """``weighted_gaussian``: the selection (:func:`_weighted_round`) plus the count column,
    the discrete Gaussian mechanism of ``count_sigma`` on <= ``counts_per_user`` counts
    moved by 1 (a key lifted by the user is counted only when released, inside the
    conditioned-away event)."""
    selection = _weighted_round(mechanism["sigma"], mechanism["threshold_grid"],
                                mechanism["scale"], max_keys_per_user)
    counts = int(mechanism["count_stage"]["counts_per_user"])
    return selection + Record(gaussian_rho(counts, mechanism["count_sigma"]), 0.0)


def adaptive_record(mechanism, stages, max_keys_per_user):
    """``adaptive`` (and heavy_hitters' ``method: adaptive``): every round a weighted
    Gaussian selection over the user's keys not released before (at most C), for every
    history; rounds and the count column compose adaptively (records add)."""
    total = ZERO
    for r in mechanism["rounds"]:
        total = total + _weighted_round(r["sigma"], r["threshold_grid"], mechanism["scale"],
                                        max_keys_per_user)
    counts = int(mechanism["count_stage"]["counts_per_user"])
    return total + Record(gaussian_rho(counts, mechanism["count_stage"]["sigma"]), 0.0)


def quantiles_record(mechanism, stages, max_keys_per_user):
    """``quantiles``: the public cells of a per-key release (stage ``levels``: discrete
    Gaussian on every (key, level, bucket) cell, a user shifting ``unit_shifts`` = C L
    cells by 1) by :func:`gaussian_rho`; every other stage (sample-and-threshold levels or
    rounds, ``select_keys``) from its (epsilon, delta)."""
    total = ZERO
    for stage in stages:
        if stage[0] == mechanism.get("stage") and mechanism.get("noise") == "discrete_gaussian":
            total = total + Record(gaussian_rho(int(mechanism["unit_shifts"]),
                                                mechanism["sigma"]), 0.0)
        else:
            total = total + stage_records([stage])
    return total


# sample_and_threshold and weighted_sampling are charged from their stages' (epsilon,
# delta) claims: stage_records, the default privacy_record of a kind.

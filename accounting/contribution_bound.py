"""Choosing the per-user contribution bound C: error-bound scores V(C) and bounded-domain rules.

Paper 002 (Liu, Suresh, Zhu, Kairouz, Gruteser, ICML 2023):

* Unbounded domains, Section 5, Algorithm 4: for every candidate C compute the error
  bound (Thm 5.2 upper bound with Jensen, Sec. 5 before Alg. 4)

      V(C) = 2 * sum_i max(w_i - C, 0) + sum_{j: N_j > 0} cost_C(h_j(C)),
      h_j(C) = sum_i N_ij * C / max(C, w_i),

  and draw C with the exponential mechanism on the score -V(C)
  (``accounting.selection``). For the paper's l1 model with Laplace release, w_i is
  the user's record count m_i, N_ij its record count of key j and
  cost_C(h) = min(h, t(C)), t(C) = C + (C/epsilon) ln(C/(2 delta)) (Alg. 3). thresher
  caps w_i at C_m = ``max_bound`` in the first sum (so the sensitivity is finite) and
  adds analogues for the l0 model (w_i = the user's number of distinct keys, N_ij in
  {0, 1}) with Laplace, Gaussian (GSHM, paper 004) and sample-and-threshold (papers
  000/003) releases: each replaces t(C) by the release's own per-key cost cap.

  The weights: the paper's V weights a dropped contribution 2 (Thm 5.2's upper-bound
  constant) and a contribution on a suppressed key 1. thresher's default ("balanced",
  docs/contribution_bound.md section 1a) is V_w(C) = w D(C) + sum_j min(w h_j(C), T(C))
  with w = sqrt(r), r the score's largest ratio of per-key cost cap to mean absolute
  noise (``balanced_dropped_weight``): a contribution kept on a suppressed key costs
  what a dropped one costs. With dropped weight w >= 1 and suppressed weight
  s in [1, w] every score has sensitivity Delta = max_C w (C_m - C) + s C under
  add/remove-one-user neighbours (paper: 2 C_m - min C; balanced: w C_m; proof in
  docs/contribution_bound.md; the paper states 5 C_m / 2 for its replace-one
  neighbours), and is monotone: adding a user never decreases V(C).

* Bounded domains (public key list of size d), Section 4: Lemma 4.2 (Laplace, l1
  clipping: C* = the ceil(d/epsilon)-th largest m_i is a 2-approximation), Thm 4.3
  (Gaussian, l2 clipping: the smallest C with
  sum_{i: ||N_i||_2 > C} ||N_i||_1 / ||N_i||_2 <= M, M = d sigma sqrt(2/pi)), each with a
  private version by the exponential mechanism on a rank-type score, and Algorithm 5
  (debiasing a clipped sum under a Poisson model).

Pure numpy/scipy; no Beam, no I/O. The Beam stage is ``transforms.bounding.choose_contribution_bound``.
"""
import dataclasses
import math
from collections.abc import Mapping
from fractions import Fraction

import numpy as np
from thresher.accounting._lazy import special

from thresher.accounting import exact_scores, search, selection

# Which contribution model each score kind belongs to.
SCORE_MODELS = {
    "laplace_l1": "l1",            # paper 002 Alg. 3/4: rand-clip records, Laplace, t(C)
    "laplace_l0": "l0",            # l0/l_inf model, Laplace noise + threshold
    "gaussian": "l0",              # GSHM (paper 004 Alg. 1)
    "sample_and_threshold": "l0",  # papers 000/003
    "weighted_sampling": "l0",     # PWS (paper 001): threshold = count kept with prob. 1/2
    "weighted_gaussian": "l0",     # Gopi et al. 2020: threshold = weight threshold * sqrt(C)
}
MODELS = ("l0", "l1")

# Default C_m: see docs/contribution_bound.md ("Default grid and C_m").
DEFAULT_MAX_BOUND = 128
# The weight of the dropped term in V(C): the paper's constant 2 (Thm 5.2's upper bound),
# or "balanced" (thresher's default): w = sqrt(r), r = max over candidates of the per-key
# cost cap over the mean absolute noise of a released count (balanced_dropped_weight).
PAPER_DROPPED_WEIGHT = 2.0
DROPPED_WEIGHT_RULES = ("balanced", "paper")
DEFAULT_DROPPED_WEIGHT = "balanced"
# Default share of the total epsilon spent on choosing C (paper 002 Sec. 7.2 uses
# epsilon' = 0.1 beside epsilon = 1).
DEFAULT_SELECTION_FRACTION = 0.1
# What the automatic bound optimises: "l1" (paper 002's error bound V(C), thresher's
# weights) or "keys" (a smoothed count of the keys the release is expected to publish,
# docs/contribution_bound.md section 1b).
OBJECTIVES = ("keys", "l1")
# make_score's default, the V(C) of paper 002; the spec's default is
# pipelines.spec.DEFAULT_AUTO_OBJECTIVE (keys).
DEFAULT_OBJECTIVE = "l1"


def default_candidates(max_bound=DEFAULT_MAX_BOUND, ratio=math.sqrt(2.0)):
    """Geometric candidate grid 1, 2, 3, 4, 6, 8, 11, 16, ... (round(ratio**k)), ending at
    ``max_bound`` itself: a tuple of strictly increasing ints in [1, max_bound].

    With ratio sqrt(2) and max_bound 128 that is 14 candidates; the best grid point is
    within a factor 2**(1/4) of any C in [1, 128]."""
    max_bound = _positive_int(max_bound, "max_bound")
    if not (math.isfinite(ratio) and ratio > 1):
        raise ValueError(f"ratio must be > 1, got {ratio}")
    grid, k = set(), 0
    while True:
        c = int(round(ratio ** k))
        if c >= max_bound:
            break
        grid.add(c)
        k += 1
    grid.add(max_bound)
    return tuple(sorted(grid))


def score_sensitivity(candidates, max_bound, dropped_weight=PAPER_DROPPED_WEIGHT,
                      suppressed_weight=1.0):
    """Delta of a V(C) score with dropped-term weight w >= 1 and suppressed-key weight
    s in [1, w]: max over C of w (C_m - C) + s C = w C_m - (w - s) min C
    (2 C_m - min C for the paper's w = 2, s = 1; w C_m for s = w).

    For one candidate C, adding or removing one user changes V(C) by at most
    w (C_m - C) + s C (docs/contribution_bound.md, Prop. 1)."""
    candidates = _candidate_array(candidates, max_bound).astype(np.float64)
    w = _dropped_weight_value(dropped_weight)
    s = _suppressed_weight_value(suppressed_weight, w)
    return float(np.max(w * (float(max_bound) - candidates) + s * candidates))


SQRT_2PI = math.sqrt(2.0 * math.pi)


def key_release_utility(expected_counts, caps, widths):
    """u_C(h) = Phi((h - T(C)) / s(C)) - Phi(-T(C) / s(C)) for an array of expected
    bounded counts h, shape (keys, candidates): a smoothed indicator that a key of
    expected bounded count h clears the cost cap T(C) (for a Gaussian release with
    s = sigma and T the threshold, Phi((h - T)/s) is the probability the key is
    published). 0 at h = 0 (a key nobody holds adds nothing), non-decreasing, below 1,
    and (1 / (s sqrt(2 pi)))-Lipschitz in h (docs/contribution_bound.md section 1b)."""
    h = np.asarray(expected_counts, dtype=np.float64)
    t = np.asarray(caps, dtype=np.float64)
    s = np.asarray(widths, dtype=np.float64)
    return special.ndtr((h - t) / s) - special.ndtr(-t / s)


def keys_score_sensitivity(candidates, widths):
    """Delta of the key-count score U(C) = sum_j u_C(h_j(C)): max over C of
    C / (s(C) sqrt(2 pi)).

    Adding or removing one user i changes h_j(C) by N_ij min(1, C / w_i) >= 0 on the
    user's keys only, at most min(w_i, C) <= C in total, and u_C is
    (1 / (s(C) sqrt(2 pi)))-Lipschitz, so U(C) moves by at most C / (s(C) sqrt(2 pi)),
    in the same direction for every C (docs/contribution_bound.md, Prop. 3)."""
    c = np.asarray(candidates, dtype=np.float64)
    s = np.asarray(widths, dtype=np.float64)
    return float(np.max(c / (s * SQRT_2PI)))


def default_key_widths(kind, caps, noise_scales):
    """s(C) of the key-count score: the standard deviation of a released count where the
    release adds noise (Gaussian: sigma = mean absolute noise / sqrt(2/pi); Laplace:
    sqrt(2) b), else a quarter of the cost cap T(C) (sample-and-threshold, weighted
    sampling: a key well below the cap is rarely published, well above it nearly
    always); never below 1 (so the sensitivity is at most C_m / sqrt(2 pi))."""
    caps = np.asarray(caps, dtype=np.float64)
    if noise_scales is not None and kind.startswith("laplace"):
        widths = np.asarray(noise_scales, dtype=np.float64) * math.sqrt(2.0)
    elif noise_scales is not None:   # Gaussian noise: mean absolute noise sigma sqrt(2/pi)
        widths = np.asarray(noise_scales, dtype=np.float64) / math.sqrt(2.0 / math.pi)
    else:
        widths = caps / 4.0
    return np.maximum(widths, 1.0)


def balanced_dropped_weight(caps, noise_scales):
    """thresher's default weight of the dropped term: w = sqrt(r), r = max over candidates
    of caps(C) / noise(C) (>= 1, as every cap is at least the noise).

    Paper 002's V(C) charges a released key its threshold t(C) while its expected error is
    the mean absolute noise (Cor. B.4: between C/epsilon and t(C)), over-weighting the
    noise cost by r = t(C) epsilon / C = epsilon + ln(C / (2 delta)) against the dropped
    contributions. Weight w on the dropped term leaves an over-weighting r / w of the
    noise (bias towards small C) and a sensitivity of about w C_m (the exponential
    mechanism's resolution, in units of the noise cost, is about w C_m / (r epsilon')).
    w = 1 maximises the resolution, w = r removes the bias; w = sqrt(r), their geometric
    mean, splits the factor r evenly between the two (docs/contribution_bound.md, section
    1a, with the Table 1 figures that motivated it). Without noise
    scales (sample-and-threshold, weighted sampling) the paper's 2 is returned."""
    if noise_scales is None:
        return PAPER_DROPPED_WEIGHT
    caps = np.asarray(caps, dtype=np.float64)
    noise = np.asarray(noise_scales, dtype=np.float64)
    usable = noise > 0
    if not np.any(usable):
        return PAPER_DROPPED_WEIGHT
    ratio = float(np.max(caps[usable] / noise[usable]))
    return math.sqrt(max(ratio, 1.0))


# --------------------------------------------------------------------------------------
# Scores for unbounded domains (paper 002 Alg. 4 and thresher's l0 analogues)
# --------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BoundScore:
    """The score V(C) for every candidate C of one release configuration.

    Fields (all per-candidate tuples are aligned with ``candidates``):
      kind: one of SCORE_MODELS.
      candidates: strictly increasing ints in [1, max_bound].
      max_bound: C_m; user weights are capped at C_m in the dropped term.
      thresholds: the release's threshold for each C, in the units of the released
        counts (records for laplace_l1, users for laplace_l0/gaussian, *sampled* users
        for sample_and_threshold).
      noise_scales: optional mean absolute noise of a released count for each C
        (Laplace: b; Gaussian: sigma * sqrt(2/pi)); the per-key cap is
        max(threshold, noise_scale).
      sampling_rates: sample_and_threshold only: the sampling probability p for each C.
      dropped_weight: w >= 1, the weight of the dropped term (the paper's 2 by default
        here; ``make_score`` resolves thresher's "balanced" default).
      suppressed_weight: s in [1, w], the weight of a bounded contribution on a key below
        its cost cap: cost_C(h) = min(s h, T(C)) (the paper's s = 1 by default here;
        thresher's rules set s = w, so a contribution kept on a suppressed key costs what
        a dropped one costs).
    """

    kind: str
    candidates: tuple
    max_bound: int
    thresholds: tuple
    noise_scales: tuple = None
    sampling_rates: tuple = None
    dropped_weight: float = PAPER_DROPPED_WEIGHT
    suppressed_weight: float = 1.0
    objective: str = "l1"
    key_widths: tuple = None

    def __post_init__(self):
        if self.kind not in SCORE_MODELS:
            raise ValueError(f"score must be one of {sorted(SCORE_MODELS)}, got {self.kind!r}")
        if self.objective not in OBJECTIVES:
            raise ValueError(f"objective must be one of {OBJECTIVES}, got {self.objective!r}")
        if self.objective == "keys":
            widths = _per_candidate(self.key_widths, len(self.candidates),
                                    "score_params.key_widths")
            if not np.all(widths >= 1.0):
                raise ValueError(f"score_params.key_widths must all be >= 1, got "
                                 f"{widths.tolist()}")
        elif self.key_widths is not None:
            raise ValueError("score_params.key_widths only applies to objective 'keys'")
        candidates = _candidate_array(self.candidates, self.max_bound)
        _suppressed_weight_value(self.suppressed_weight,
                                 _dropped_weight_value(self.dropped_weight))
        k = len(candidates)
        thresholds = _per_candidate(self.thresholds, k, "score_params.thresholds")
        if not np.all(thresholds > 0):
            raise ValueError("score_params.thresholds must all be > 0, got "
                             f"{thresholds.tolist()}")
        if self.noise_scales is not None:
            scales = _per_candidate(self.noise_scales, k, "score_params.noise_scales")
            if not np.all(scales >= 0):
                raise ValueError("score_params.noise_scales must all be >= 0")
        if self.kind == "sample_and_threshold":
            if self.sampling_rates is None:
                raise ValueError("score_params.sampling_rates is required for "
                                 "score 'sample_and_threshold'")
            rates = _per_candidate(self.sampling_rates, k, "score_params.sampling_rates")
            if not np.all((rates > 0) & (rates <= 1)):
                raise ValueError("score_params.sampling_rates must all be in (0, 1], got "
                                 f"{rates.tolist()}")
            if not np.all(thresholds >= 1):
                # The 1-Lipschitz proof of the cost needs (1 - p) <= 4 * threshold.
                raise ValueError("score_params.thresholds must all be >= 1 (sampled users) "
                                 "for score 'sample_and_threshold'")
        elif self.sampling_rates is not None:
            raise ValueError(f"score_params.sampling_rates only applies to "
                             f"'sample_and_threshold', not {self.kind!r}")

    @property
    def model(self):
        return SCORE_MODELS[self.kind]

    @property
    def user_weighted(self):
        """Whether expected counts are in user weights (:func:`expected_bounded_counts`):
        weighted Gaussian selection with the key-count objective, whose cost cap is the
        threshold in users of weight 1/sqrt(C) (``_from_calibrations``)."""
        return self.kind == "weighted_gaussian" and self.objective == "keys"

    @property
    def sensitivity(self):
        if self.objective == "keys":
            return keys_score_sensitivity(self.candidates, self.key_widths)
        return score_sensitivity(self.candidates, self.max_bound, self.dropped_weight,
                                 self.suppressed_weight)

    @property
    def candidate_array(self):
        return np.asarray(self.candidates, dtype=np.int64)

    def caps(self):
        """Per-key cost cap T(C) for each candidate, in population units (float64)."""
        caps = np.asarray(self.thresholds, dtype=np.float64)
        if self.kind == "sample_and_threshold":
            caps = caps / np.asarray(self.sampling_rates, dtype=np.float64)
        if self.noise_scales is not None:
            caps = np.maximum(caps, np.asarray(self.noise_scales, dtype=np.float64))
        return caps

    def key_cost(self, expected_counts):
        """cost_C(h) for an array of expected bounded counts h, shape (keys, candidates).

        Laplace / Gaussian / weighted sampling: min(s h, T(C)) -- a suppressed key costs
        its count (weighted s: the paper's s = 1, thresher's s = w), a released one at most
        T(C) (paper 002 Cor. B.4). Sample-and-threshold:
        min(s h, T + sqrt((1 - p)/p * max(h, T))), T = threshold / p, adding the standard
        deviation of a released estimate (sampled count / p). Both are 0 at h = 0,
        non-decreasing and s-Lipschitz in h."""
        h = np.asarray(expected_counts, dtype=np.float64)
        caps = self.caps()
        if self.objective == "keys":
            return key_release_utility(h, caps, self.key_widths)
        weighted = self.suppressed_weight * h
        if self.kind != "sample_and_threshold":
            return np.minimum(weighted, caps)
        rates = np.asarray(self.sampling_rates, dtype=np.float64)
        sampling_sd = np.sqrt((1.0 - rates) / rates * np.maximum(h, caps))
        return np.minimum(weighted, caps + sampling_sd)

    # ---- exact scores (accounting.exact_scores; docs/contribution_bound.md, "Exact
    # scores"): the pipeline sums integer units, so every layout gives the same draw.

    def cost_bound(self):
        """An upper bound of any per-key cost the pipeline evaluates: 1 for the key-count
        objective, T(C) for min(s h, T(C)), and for sample-and-threshold
        T + sqrt((1 - p) / p max(h, T)) at the largest exact h, 2^33 contributions
        (``exact_scores.MAX_COUNT_UNITS``); with a factor 2 of margin for the float
        evaluation."""
        if self.objective == "keys":
            return 2.0
        caps = self.caps()
        if self.kind == "sample_and_threshold":
            rates = np.asarray(self.sampling_rates, dtype=np.float64)
            top = float(exact_scores.MAX_COUNT_UNITS) / (1 << exact_scores.COUNT_BITS)
            caps = caps + np.sqrt((1.0 - rates) / rates * np.maximum(caps, top))
        return 2.0 * float(np.max(caps))

    @property
    def cost_bits(self):
        """K: per-key costs are rounded down to the grid 2^-K (``exact_scores.cost_bits``)."""
        return exact_scores.cost_bits(self.cost_bound())

    @property
    def cost_error(self):
        """e, a bound on |c~(h) - cost_C(h)|, the binary64 evaluation error of one per-key
        cost at an exact h (a Fraction), cost_C taken with the score's float constants
        (s, T(C), (1 - p) / p) as exact values. l1 objective: one rounding (s h) of a
        value <= T(C); sample-and-threshold: a product, a square root and a sum, relative
        error <= (1 + 1/2 + 1) 2^-53 < 2^-51 of a value <= cost_bound() / 2; so
        e = 2^-52 cost_bound() covers both. Key-count
        objective: Phi((h - T) / s) - Phi(-T / s) with scipy's ndtr (cephes; documented
        peak relative error a few 1e-16) at an argument z rounded twice (off by <= 2 ulp(z):
        Phi moves by <= 0.4 * 2^-51 |z|, under 6e-15 for |z| <= 40; beyond, Phi is 0 or 1
        to within 1e-300) and one subtraction: below 7e-15 in all; the stated
        e = 2^-44 (5.7e-14) leaves a factor of 8 to spare."""
        if self.objective == "keys":
            return Fraction(1, 1 << 44)
        return Fraction(self.cost_bound()) / (1 << 52)

    @property
    def selection_sensitivity(self):
        """Delta' = Delta + 2 eta, the exact (Fraction) sensitivity of the rounded score
        the pipeline draws from (``exact_scores`` module docstring; Delta rounded up by
        2^-50 relative first, as it is computed in floats)."""
        eta = exact_scores.rounding_allowance(max(self.candidates), self.cost_bits,
                                              self.cost_error)
        return exact_scores.upward(self.sensitivity) + 2 * eta

    def key_cost_units(self, count_units):
        """floor(2^K c~(h)) per key and candidate (int64), h = 2^-B ``count_units`` (the
        exact per-key sums of :func:`exact_scores.expected_count_units`, shape (keys,
        candidates)); c~ is :meth:`key_cost` in binary64, clamped at 0."""
        count_units = np.asarray(count_units, dtype=np.int64)
        if count_units.size and int(count_units.max()) > exact_scores.MAX_COUNT_UNITS:
            raise ValueError("a key's expected bounded count reached 2^33 contributions: "
                             "beyond the exact score's range")
        if self.objective == "keys" and count_units.ndim == 2:
            return self._key_utility_units(count_units)
        h = exact_scores.times_power_of_two(count_units.astype(np.float64),
                                            -exact_scores.COUNT_BITS)
        return exact_scores.floor_units(np.maximum(self.key_cost(h), 0.0), self.cost_bits)

    def _key_utility_units(self, count_units):
        """:meth:`key_cost_units` of the key-count objective in one float64 buffer (issue
        43): the same IEEE operations on the same operands in the same order as
        ``floor_units(max(key_release_utility(2^-B units, T, s), 0), K)``, each done in
        place (``out=``), so the same int64 units, bit for bit, with two buffers instead
        of ten (tests/accounting/test_contribution_bound_exact.py pins the two)."""
        t = np.asarray(self.caps(), dtype=np.float64)
        s = np.asarray(self.key_widths, dtype=np.float64)
        x = count_units.astype(np.float64)
        exact_scores.times_power_of_two(x, -exact_scores.COUNT_BITS, out=x)
        np.subtract(x, t, out=x)
        np.divide(x, s, out=x)
        special.ndtr(x, out=x)
        np.subtract(x, special.ndtr(-t / s), out=x)
        np.maximum(x, 0.0, out=x)
        return exact_scores.floor_units_inplace(x, self.cost_bits)

    def exact_values(self, dropped, cost_units):
        """V(C) as exact Fractions from the integer sums: w dropped(C) + 2^-K units(C), or
        -2^-K units(C) for the key-count objective (``dropped``, ``cost_units``: one int
        per candidate)."""
        scale = Fraction(1, 1 << self.cost_bits)
        if self.objective == "keys":
            return [-scale * int(u) for u in cost_units]
        w = Fraction(self.dropped_weight)
        return [w * int(d) + scale * int(u) for d, u in zip(dropped, cost_units)]

    def values(self, dropped, key_cost_sums):
        """V(C) = w * dropped(C) + sum over keys of cost_C(h_j(C)) (w = 2 in the paper);
        with objective "keys", V(C) = -U(C), minus the smoothed key count (the dropped
        contributions do not enter)."""
        if self.objective == "keys":
            return -np.asarray(key_cost_sums, dtype=np.float64)
        return self.dropped_weight * np.asarray(dropped, dtype=np.float64) + np.asarray(
            key_cost_sums, dtype=np.float64)


def make_score(kind, candidates, max_bound, score_params):
    """Build a :class:`BoundScore` from a ``score_params`` dict.

    score_params keys (per-candidate values are a sequence aligned with ``candidates``
    or a mapping {C: value}):
      laplace_l1: ``epsilon`` and ``delta`` of the release (t(C) = C + (C/epsilon)
        ln(C/(2 delta)), paper 002 Alg. 3, noise scale C/epsilon), or ``thresholds``.
      laplace_l0: ``epsilon`` and ``delta`` (t(C) = 1 + (C/epsilon) ln(C/(2 delta)):
        Laplace(C/epsilon) per key, delta/C per key), or ``thresholds``.
      gaussian: ``thresholds`` (GSHM tau* per C), optional ``sigmas``.
      sample_and_threshold: ``thresholds`` (tau per C, sampled users) and
        ``sampling_rates`` (p per C).
      weighted_sampling: ``thresholds`` (the count reported with probability >= 1/2).
      any kind: ``params_by_bound`` {C: the kind's calibrate() dict}, from which the
        thresholds (and scale / sigma / sampling_rate) are read.
      any kind: ``dropped_weight``: "balanced" (default; w = ``balanced_dropped_weight``),
        "paper" (w = 2 and s = 1: paper 002's V exactly) or a number w >= 1; except for
        "paper" the suppressed-key weight s is w.
      any kind: ``objective``: "l1" (default here: the error bound V(C)) or "keys" (the
        smoothed key count U(C), ``key_release_utility``, widths ``default_key_widths``;
        ``dropped_weight`` is then unused).
    Explicit per-candidate values win over ``params_by_bound``, which wins over the
    epsilon/delta formulas (``epsilon``/``delta`` are accepted and ignored otherwise).
    """
    if kind not in SCORE_MODELS:
        raise ValueError(f"score must be one of {sorted(SCORE_MODELS)}, got {kind!r}")
    allowed = {"epsilon", "delta", "thresholds", "sigmas", "noise_scales", "sampling_rates",
               "params_by_bound", "dropped_weight", "objective", "selection_widths"}
    params = dict(score_params or {})
    unknown = sorted(set(params) - allowed)
    if unknown:
        raise ValueError(f"score_params.{unknown[0]} is not a known field; allowed: "
                         f"{sorted(allowed)}")
    cands = _candidate_array(candidates, max_bound)
    c = cands.astype(np.float64)
    if params.get("params_by_bound") is not None:
        for name, values in _from_calibrations(kind, params["params_by_bound"], cands).items():
            params.setdefault(name, values)

    thresholds = params.get("thresholds")
    noise_scales = params.get("noise_scales")
    if kind in ("laplace_l1", "laplace_l0") and ("epsilon" in params or "delta" in params):
        epsilon, delta = _release_budget(params)
        scale = c / epsilon
        if thresholds is None:
            shift = c if kind == "laplace_l1" else 1.0
            thresholds = shift + scale * np.log(c / (2.0 * delta))
        if noise_scales is None:
            noise_scales = scale
    misplaced = [f for f in ("sigmas",) if f in params
                 and kind not in ("gaussian", "weighted_gaussian")]
    if misplaced:
        raise ValueError(f"score_params.{misplaced[0]} does not apply to score {kind!r}")
    if kind in ("gaussian", "weighted_gaussian") and params.get("sigmas") is not None:
        sigmas = _per_candidate(_aligned(params["sigmas"], cands, "score_params.sigmas"),
                                len(cands), "score_params.sigmas")
        noise_scales = sigmas * math.sqrt(2.0 / math.pi)
    if thresholds is None:
        need = ("'epsilon' and 'delta', or 'thresholds'" if kind.startswith("laplace")
                else "'thresholds'")
        raise ValueError(f"score_params needs {need} for score {kind!r}")
    thresholds = _aligned(thresholds, cands, "score_params.thresholds")
    if noise_scales is not None:
        noise_scales = _aligned(noise_scales, cands, "score_params.noise_scales")
    rates = params.get("sampling_rates")
    if rates is not None:
        rates = _aligned(rates, cands, "score_params.sampling_rates")
    score = BoundScore(
        kind=kind, candidates=tuple(int(x) for x in cands), max_bound=int(max_bound),
        thresholds=tuple(float(x) for x in thresholds),
        noise_scales=None if noise_scales is None else tuple(float(x) for x in noise_scales),
        sampling_rates=None if rates is None else tuple(float(x) for x in rates))
    objective = params.get("objective", DEFAULT_OBJECTIVE)
    if objective not in OBJECTIVES:
        raise ValueError(f"score_params.objective must be one of {OBJECTIVES}, got {objective!r}")
    if objective == "keys":
        widths = default_key_widths(kind, score.caps(), score.noise_scales)
        if params.get("selection_widths") is not None:   # weighted_gaussian's selection noise
            widths = np.maximum(np.asarray(params["selection_widths"], dtype=np.float64), 1.0)
        return dataclasses.replace(score, objective="keys",
                                   key_widths=tuple(float(x) for x in widths))
    rule = params.get("dropped_weight", DEFAULT_DROPPED_WEIGHT)
    if isinstance(rule, str) and rule not in DROPPED_WEIGHT_RULES:
        raise ValueError(f"dropped_weight must be one of {DROPPED_WEIGHT_RULES} or a number "
                         f">= 1, got {rule!r}")
    if isinstance(rule, str) and rule == "paper":
        return dataclasses.replace(score, dropped_weight=PAPER_DROPPED_WEIGHT,
                                   suppressed_weight=1.0)
    if isinstance(rule, str) and rule == "balanced":
        weight = balanced_dropped_weight(score.caps(), score.noise_scales)
    else:
        weight = _dropped_weight_value(rule)
    return dataclasses.replace(score, dropped_weight=float(weight),
                               suppressed_weight=float(weight))


def _from_calibrations(kind, params_by_bound, candidates):
    """Per-candidate thresholds / noise scales / sampling rates from each candidate's
    calibrated mechanism parameters (the dicts the pipeline kinds' calibrate() return:
    gaussian {threshold, sigma}, laplace {threshold, scale}, sample_and_threshold
    {threshold, sampling_rate}, weighted_sampling {threshold})."""
    if not isinstance(params_by_bound, Mapping):
        raise ValueError("score_params.params_by_bound must map each candidate to its "
                         "calibrated parameters")
    missing = [int(c) for c in candidates if int(c) not in params_by_bound]
    if missing:
        raise ValueError(f"score_params.params_by_bound has no parameters for candidates {missing}")
    rows = [params_by_bound[int(c)] for c in candidates]

    def column(name):
        if any(name not in row or row[name] is None for row in rows):
            raise ValueError(f"score_params.params_by_bound: every candidate needs {name!r}")
        return [float(row[name]) for row in rows]

    out = {"thresholds": column("threshold")}
    if kind == "weighted_gaussian":
        # A key is released at about threshold * sqrt(C) users that keep C keys each (weight
        # 1/sqrt(C)); its released count has the count column's noise.
        out["thresholds"] = [t * math.sqrt(int(c)) for t, c in zip(out["thresholds"], candidates)]
        out["sigmas"] = column("count_sigma")
        if all(row.get("sigma") is not None for row in rows):
            # whether a key is published depends on the selection noise: sigma user
            # weights, i.e. sigma * sqrt(C) users of weight 1/sqrt(C) (the keys objective)
            out["selection_widths"] = [float(row["sigma"]) * math.sqrt(int(c))
                                       for row, c in zip(rows, candidates)]
        return out
    if kind.startswith("laplace") and all(row.get("scale") is not None for row in rows):
        out["noise_scales"] = column("scale")
    if kind == "gaussian" and all(row.get("sigma") is not None for row in rows):
        out["sigmas"] = column("sigma")
    if kind == "sample_and_threshold":
        out["sampling_rates"] = column("sampling_rate")
    return out


def pairs_from_records(user_codes, key_codes):
    """(user, key) pairs with record counts N_ij from per-record integer codes.

    Sort-based (no np.unique on pairs). Returns (pair_users, pair_keys, pair_counts),
    int64 arrays sorted by (user, key)."""
    users = np.asarray(user_codes, dtype=np.int64)
    keys = np.asarray(key_codes, dtype=np.int64)
    if users.shape != keys.shape:
        raise ValueError("user_codes and key_codes must have the same length")
    if users.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty, empty
    order = np.lexsort((keys, users))
    su, sk = users[order], keys[order]
    new = np.empty(len(su), dtype=bool)
    new[0] = True
    new[1:] = (su[1:] != su[:-1]) | (sk[1:] != sk[:-1])
    starts = np.flatnonzero(new)
    counts = np.diff(np.append(starts, len(su)))
    return su[starts], sk[starts], counts.astype(np.int64)


def user_weights(pair_users, pair_counts, model, num_users=None):
    """w_i per user code: records m_i (l1) or distinct keys k_i (l0), from (user, key) pairs."""
    if model not in MODELS:
        raise ValueError(f"model must be one of {MODELS}, got {model!r}")
    pair_users = np.asarray(pair_users, dtype=np.int64)
    weights = None if model == "l0" else np.asarray(pair_counts, dtype=np.int64)
    out = np.bincount(pair_users, weights=weights, minlength=num_users or 0)
    return np.rint(out).astype(np.int64)


def dropped_contributions(weights, candidates, max_bound):
    """sum_i max(min(w_i, C_m) - C, 0) for every candidate C (int64 array).

    The contributions rand-clip / l0 bounding to C drops, with each user's weight capped
    at C_m = max_bound (paper 002 Sec. 5: C_m bounds ||N_i||_1)."""
    cands = _candidate_array(candidates, max_bound)
    w = np.sort(np.minimum(np.asarray(weights, dtype=np.int64), int(max_bound)))
    above_sum = np.concatenate([np.cumsum(w[::-1])[::-1], [0]])
    first_above = np.searchsorted(w, cands, side="right")   # w[first_above:] > C
    n_above = len(w) - first_above
    return above_sum[first_above] - cands * n_above


def expected_bounded_counts(pair_counts, pair_weights, candidates, *, user_weighted=False):
    """E[contribution of a (user, key) pair after bounding to C] = N_ij * min(1, C / w_i).

    Rand-clip keeps min(m_i, C) of m_i records uniformly (paper 002 Sec. 5, before
    Alg. 4); l0 bounding keeps min(k_i, C) of k_i keys uniformly (N_ij = 1). Returns an
    array of shape (pairs, candidates).

    ``user_weighted`` (weighted Gaussian selection, Gopi et al. 2020 Thm 5.1, with the
    key-count objective): the pair's expected weight in units of 1/sqrt(C), the weight of
    a user keeping C keys: a user with w_i <= C keeps every key at weight 1/sqrt(w_i),
    i.e. sqrt(C / w_i) units; one with w_i > C keeps a key with probability C / w_i at
    weight 1/sqrt(C), i.e. C / w_i units in expectation -- min(x, sqrt(x)) with
    x = C / w_i. Over a user's keys this adds up to sqrt(C w_i) <= C or to C: at most C,
    as Prop. 3 needs (:func:`keys_score_sensitivity`; docs/contribution_bound.md)."""
    n = np.asarray(pair_counts, dtype=np.float64)[:, None]
    w = np.asarray(pair_weights, dtype=np.float64)[:, None]
    c = np.asarray(candidates, dtype=np.float64)[None, :]
    x = c / np.maximum(w, 1.0)
    if user_weighted:
        return n * np.minimum(x, np.sqrt(x))
    return n * np.minimum(1.0, x)


def score_values(pair_users, pair_keys, pair_counts, score):
    """V(C) for every candidate of ``score``, from (user, key, N_ij) pairs in one process.

    The reference computation: the Beam stage computes the same sums split across
    user shards and key shards. For score.model == "l0" the pairs must be distinct
    (pair_counts are then ignored: N_ij = 1). Returns (values, dropped, key_cost_sums)."""
    pair_users = np.asarray(pair_users, dtype=np.int64)
    pair_keys = np.asarray(pair_keys, dtype=np.int64)
    counts = np.asarray(pair_counts, dtype=np.int64)
    if score.model == "l0":
        counts = np.ones_like(pair_users)
    weights = user_weights(pair_users, counts, score.model)
    dropped = dropped_contributions(weights, score.candidates, score.max_bound)
    contributions = expected_bounded_counts(counts, weights[pair_users], score.candidates,
                                            user_weighted=score.user_weighted)
    if len(pair_keys):
        _, key_index = np.unique(pair_keys, return_inverse=True)
        h = np.zeros((key_index.max() + 1, len(score.candidates)))
        np.add.at(h, key_index, contributions)
    else:
        h = np.zeros((0, len(score.candidates)))
    key_cost_sums = score.key_cost(h).sum(axis=0)
    return score.values(dropped, key_cost_sums), dropped, key_cost_sums


def exact_score_sums(pair_users, pair_keys, pair_counts, score):
    """The pipeline's integer sums in one process: (dropped(C), sum_j floor(2^K
    c~(h~_j(C)))) as tuples of Python ints, h~_j = 2^-B sum_i floor(2^B x_ij)
    (``accounting.exact_scores``). The Beam stage must give exactly these for any split of
    the same pairs; ``score.exact_values`` turns them into V(C). Pairs distinct for l0."""
    pair_users = np.asarray(pair_users, dtype=np.int64)
    pair_keys = np.asarray(pair_keys, dtype=np.int64)
    counts = np.asarray(pair_counts, dtype=np.int64)
    if score.model == "l0":
        counts = np.ones_like(pair_users)
    weights = user_weights(pair_users, counts, score.model)
    dropped = dropped_contributions(weights, score.candidates, score.max_bound)
    if len(pair_keys) == 0:
        return tuple(int(d) for d in dropped), (0,) * len(score.candidates)
    _, key_index = np.unique(pair_keys, return_inverse=True)
    h = np.zeros((key_index.max() + 1, len(score.candidates)), dtype=np.int64)
    for i, c in enumerate(score.candidates):
        units = exact_scores.expected_count_units(
            None if score.model == "l0" else counts, weights[pair_users], c,
            user_weighted=score.user_weighted)
        np.add.at(h[:, i], key_index, units)
    cost = score.key_cost_units(h)
    return (tuple(int(d) for d in dropped),
            tuple(sum(int(v) for v in cost[:, i]) for i in range(cost.shape[1])))


def choose_bound(values, candidates, epsilon, sensitivity, rng, *, monotone=False):
    """Alg. 4, step 4: draw C from the exponential mechanism on the scores -V(C).

    ``values``: floats, or exact Fractions (``BoundScore.exact_values``; then
    ``sensitivity`` may be a Fraction too, ``BoundScore.selection_sensitivity``), drawn
    from exactly. Returns (C, probabilities); the probabilities are not private (operator
    log only)."""
    if any(isinstance(v, Fraction) for v in values):
        scores = [-Fraction(v) for v in values]
        probabilities = selection.exponential_mechanism_probabilities(
            [float(u) for u in scores], epsilon, float(sensitivity), monotone=monotone)
        index = selection.exponential_mechanism(scores, epsilon, sensitivity, rng,
                                                monotone=monotone)
        return int(candidates[index]), probabilities
    scores = -np.asarray(values, dtype=np.float64)
    probabilities = selection.exponential_mechanism_probabilities(
        scores, epsilon, sensitivity, monotone=monotone)
    index = selection.exponential_mechanism(scores, epsilon, sensitivity, rng,
                                            monotone=monotone)
    return int(candidates[index]), probabilities


# --------------------------------------------------------------------------------------
# Bounded domains (paper 002 Section 4 and Section 6)
# --------------------------------------------------------------------------------------

def laplace_best_bound(record_counts, domain_size, epsilon):
    """Lemma 4.2: C* = the ceil(d/epsilon)-th largest m_i (1 if there are fewer users).

    For Algorithm 1 with l1 clipping and Laplace(C/epsilon) noise on each of d keys,
    the expected l1 error is sum_i max(m_i - C, 0) + d C / epsilon, and this C* is within
    a factor 2 of its minimum over C > 0."""
    m = np.asarray(record_counts, dtype=np.int64)
    k = _rank(domain_size, epsilon)
    if k > len(m):
        return 1
    return max(1, int(np.partition(m, len(m) - k)[len(m) - k]))


def laplace_bound_scores(record_counts, domain_size, epsilon, candidates):
    """Rank score of a private Lemma 4.2 quantile: -| #{i: m_i >= C} - ceil(d/epsilon) |.

    Sensitivity 1 under add/remove-one-user (the count changes by at most 1)."""
    m = np.sort(np.asarray(record_counts, dtype=np.int64))
    cands = np.asarray(candidates, dtype=np.int64)
    at_least = len(m) - np.searchsorted(m, cands, side="left")
    return -np.abs(at_least - _rank(domain_size, epsilon)).astype(np.float64)


def private_laplace_bound(record_counts, domain_size, epsilon, epsilon_select,
                          candidates, rng):
    """Lemma 4.2's C* found privately: exponential mechanism (epsilon_select-DP,
    sensitivity 1) over ``candidates`` (e.g. range(1, C_m + 1)) on
    :func:`laplace_bound_scores`. ``epsilon`` is the release's, which sets the rank."""
    cands = np.asarray(candidates, dtype=np.int64)
    scores = laplace_bound_scores(record_counts, domain_size, epsilon, cands)
    return int(cands[selection.exponential_mechanism(scores, epsilon_select, 1.0, rng)])


def gaussian_tail_sum(user_l1, user_l2, candidates, sparsity=None):
    """S(C) = sum_{i: ||N_i||_2 > C} ||N_i||_1 / ||N_i||_2 for each candidate C (Thm 4.3).

    With ``sparsity`` s, each ratio is clipped to sqrt(s) (paper 002 Sec. 7.1), which
    makes the sensitivity sqrt(s) (Cauchy-Schwarz: the ratio is <= sqrt(||N_i||_0))."""
    l1 = np.asarray(user_l1, dtype=np.float64)
    l2 = np.asarray(user_l2, dtype=np.float64)
    positive = l2 > 0
    ratio = np.zeros_like(l1)
    ratio[positive] = l1[positive] / l2[positive]
    if sparsity is not None:
        ratio = np.minimum(ratio, math.sqrt(_positive_int(sparsity, "sparsity")))
    order = np.argsort(l2)
    sorted_l2 = l2[order]
    tail = np.concatenate([np.cumsum(ratio[order][::-1])[::-1], [0.0]])
    first_above = np.searchsorted(sorted_l2, np.asarray(candidates, dtype=np.float64),
                                  side="right")
    return tail[first_above]


def gaussian_best_bound(user_l1, user_l2, domain_size, sigma):
    """Theorem 4.3: C* = min{C >= 0 : S(C) <= M}, M = d sigma sqrt(2/pi), where the noise
    of Algorithm 1 is N(0, C^2 sigma^2) per key; a 2-approximation of the best l2 clip.

    S is a non-increasing step function that jumps at the users' l2 norms, so C* is 0
    or one of those norms."""
    m_target = _positive_int(domain_size, "domain_size") * float(sigma) * math.sqrt(2 / math.pi)
    l2 = np.asarray(user_l2, dtype=np.float64)
    points = np.concatenate([[0.0], np.unique(l2[l2 > 0])])
    ok = gaussian_tail_sum(user_l1, user_l2, points) <= m_target
    return float(points[np.argmax(ok)])   # S(max l2) = 0 <= M, so some point qualifies


def private_gaussian_bound(user_l1, user_l2, domain_size, sigma, sparsity,
                           epsilon_select, candidates, rng):
    """Thm 4.3's C* found privately: exponential mechanism over ``candidates`` on the
    score -|S_s(C) - M| (S with ratios clipped to sqrt(s)), sensitivity sqrt(s)."""
    cands = np.asarray(candidates, dtype=np.float64)
    m_target = _positive_int(domain_size, "domain_size") * float(sigma) * math.sqrt(2 / math.pi)
    scores = -np.abs(gaussian_tail_sum(user_l1, user_l2, cands, sparsity) - m_target)
    index = selection.exponential_mechanism(scores, epsilon_select, math.sqrt(sparsity), rng)
    return float(cands[index])


def poisson_clipped_mean(rate, bound):
    """h(lambda) = E[min(X, C)], X ~ Poisson(lambda) (Algorithm 5, line 2).

    = C - sum_{j < C} (C - j) Pr[X = j] (Appendix C.1); increasing in lambda, from 0 at
    lambda = 0 to C as lambda -> infinity."""
    bound = _positive_int(bound, "bound")
    rate = np.asarray(rate, dtype=np.float64)
    j = np.arange(bound, dtype=np.float64)
    # imported here only: scipy.stats costs ~0.35 s of CPU to import, which every
    # automatic bound (this module) would pay for this one function
    from scipy import stats
    pmf = stats.poisson.pmf(j, rate[..., None])
    return bound - np.sum((bound - j) * pmf, axis=-1)


def poisson_debias(noisy_clipped_sum, num_users, bound, *, max_rate=math.inf):
    """Algorithm 5: N_hat = n * h^{-1}(y / n) for y = sum_i min(N_i, C) + noise.

    Post-processing only (no privacy cost). y/n <= 0 gives 0; y/n >= C has no finite
    inverse and gives n * max_rate. The inverse is found by the shared monotone search
    (accounting.search.smallest_real) to relative tolerance 1e-10."""
    bound = _positive_int(bound, "bound")
    n = _positive_int(num_users, "num_users")
    target = float(noisy_clipped_sum) / n
    if target <= 0:
        return 0.0
    if target >= bound:
        return n * max_rate
    rate = search.smallest_real(
        lambda lam: float(poisson_clipped_mean(lam, bound)) >= target, 0.0, math.inf,
        rel_tol=1e-10)
    return n * min(rate, max_rate)


# --------------------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------------------

def _dropped_weight_value(weight):
    """A dropped-term weight: a finite number >= 1 (the sensitivity proof needs w >= 1)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.floating, np.integer)):
        raise ValueError(f"dropped_weight must be 'balanced', 'paper' or a number >= 1, "
                         f"got {weight!r}")
    weight = float(weight)
    if not (math.isfinite(weight) and weight >= 1.0):
        raise ValueError(f"dropped_weight must be a finite number >= 1, got {weight!r}")
    return weight


def _suppressed_weight_value(weight, dropped_weight):
    """A suppressed-key weight s with 1 <= s <= w (Prop. 1's sensitivity needs it)."""
    if isinstance(weight, bool) or not isinstance(weight, (int, float, np.floating, np.integer)):
        raise ValueError(f"suppressed_weight must be a number, got {weight!r}")
    weight = float(weight)
    if not (math.isfinite(weight) and 1.0 <= weight <= dropped_weight):
        raise ValueError(f"suppressed_weight must be in [1, dropped_weight = "
                         f"{dropped_weight:g}], got {weight!r}")
    return weight


def _positive_int(value, name):
    if isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
    return int(value)


def _candidate_array(candidates, max_bound):
    max_bound = _positive_int(max_bound, "max_bound")
    cands = np.asarray(candidates)
    if cands.ndim != 1 or cands.size == 0:
        raise ValueError("candidates must be a non-empty list of integers")
    if not np.all(np.equal(np.mod(cands, 1), 0)):
        raise ValueError(f"candidates must be integers, got {cands.tolist()}")
    cands = cands.astype(np.int64)
    if np.any(np.diff(cands) <= 0):
        raise ValueError(f"candidates must be strictly increasing, got {cands.tolist()}")
    if cands[0] < 1 or cands[-1] > max_bound:
        raise ValueError(f"candidates must lie in [1, max_bound={max_bound}], got "
                         f"{cands.tolist()}")
    return cands


def _per_candidate(values, k, name):
    arr = np.asarray(values, dtype=np.float64)
    if arr.shape != (k,):
        raise ValueError(f"{name} must have one value per candidate ({k}), got shape {arr.shape}")
    if not np.all(np.isfinite(arr)):
        raise ValueError(f"{name} must be finite, got {arr.tolist()}")
    return arr


def _aligned(values, candidates, name):
    if isinstance(values, Mapping):
        missing = [int(c) for c in candidates if int(c) not in values]
        if missing:
            raise ValueError(f"{name} has no value for candidates {missing}")
        return np.asarray([values[int(c)] for c in candidates], dtype=np.float64)
    return _per_candidate(values, len(candidates), name)


def _release_budget(params):
    epsilon, delta = params.get("epsilon"), params.get("delta")
    if epsilon is None or not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"score_params.epsilon must be > 0, got {epsilon!r}")
    if delta is None or not (0 < delta < 1):
        raise ValueError(f"score_params.delta must be in (0, 1), got {delta!r}")
    return float(epsilon), float(delta)


def _rank(domain_size, epsilon):
    d = _positive_int(domain_size, "domain_size")
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be > 0, got {epsilon}")
    return int(math.ceil(d / epsilon))

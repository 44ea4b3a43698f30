"""accounting.adaptive: the calibration (recomputed), each round's profile, and the f-DP
composed claim checked against a brute-force computation of the two-round release's
exact divergence.

The brute force is independent of the accounting code: it builds every user's round
inputs (their keys minus the keys released before), the grid weights floor(S/sqrt(t))
in integers, the discrete Gaussian tail from a normalised pmf summed with numpy, and
enumerates every joint outcome (R1, R2) of the release with and without one user."""
import itertools
import math

import numpy as np
import pytest

from thresher.accounting import adaptive as ad
from thresher.accounting import discrete_gaussian as dg
from thresher.accounting import weighted_gaussian as wg


@pytest.mark.parametrize("fractions, rounds, message", [
    ((0.5, 0.6), 2, "sum to 1"), ((1.0,), 2, "one entry per round"),
    ((0.0, 1.0), 2, r"in \(0, 1\)"), ((0.2, 0.3, 0.4), 3, "sum to 1")])
def test_fractions_are_checked(fractions, rounds, message):
    with pytest.raises(ValueError, match=message):
        ad.check_fractions(fractions, rounds)


@pytest.mark.parametrize("c", [1, 16, 128])
def test_calibration_meets_the_budget_with_the_smallest_noise_and_thresholds(c):
    """Recomputed from the parameters: the whole release (2 rounds + count) meets
    (1, 1e-6) by the f-DP composition; 0.3% less noise everywhere (thresholds
    re-chosen) does not; every threshold is the smallest for its leak share; the noise
    shares are the fractions'."""
    fr, f_c = (0.1, 0.9), 0.1
    p = ad.calibrate(1.0, 1e-6, c, fractions=fr, count_fraction=f_c, count_keys_per_user=128)
    c_c = min(c, 128)
    assert p.count_keys_per_user == c_c
    rounds = [(r.sigma, r.threshold_grid) for r in p.rounds]
    d = ad.composed_delta(rounds, p.count_sigma, c_c, c, 1.0, 1e-6)
    assert d <= 1e-6 and d == p.delta
    for r, w in zip(p.rounds, fr):
        target = w * ad.THRESHOLD_DELTA_SHARE * 1e-6
        assert ad.round_leak(r.threshold_grid, r.sigma, c) <= target < ad.round_leak(
            r.threshold_grid - 1, r.sigma, c)
        # sigma_r^-2 = (1 - f_c) w_r / s^2 and sigma_c^-2 = f_c / (C_c s^2)
        assert math.isclose(r.sigma ** -2 * p.count_sigma ** 2 / c_c, (1 - f_c) * w / f_c,
                            rel_tol=1e-9)
    less = [(s * 0.997, ad.round_threshold(s * 0.997, c, w * ad.THRESHOLD_DELTA_SHARE * 1e-6))
            for (s, _), w in zip(rounds, fr)]
    assert ad.composed_delta(less, p.count_sigma * 0.997, c_c, c, 1.0, 1e-6) > 1e-6


def test_f_dp_composition_needs_less_noise_than_basic_composition():
    """At the calibrated noise, the stages' deltas at basic-composition shares of epsilon
    (the former accounting) sum far above the budget the f-DP composition meets."""
    p = ad.calibrate(1.0, 1e-6, 16, fractions=(0.1, 0.9), count_fraction=0.1)
    basic = sum(wg.delta(0.9 * w, r.sigma, r.threshold_grid, 16)
                for r, w in zip(p.rounds, (0.1, 0.9)))
    basic += float(dg.composed_shift_delta(0.1, p.count_sigma, 16))
    assert p.delta <= 1e-6 < basic / 10


def _gaussian_delta(eps, mu):
    """delta_G(eps; mu) = Phi(-eps/mu + mu/2) - e^eps Phi(-eps/mu - mu/2) (scipy)."""
    from scipy.stats import norm
    return float(norm.cdf(-eps / mu + mu / 2) - math.exp(eps) * norm.cdf(-eps / mu - mu / 2))


@pytest.mark.parametrize("eps, delta, c, fr", [
    (1.0, 1e-6, 1, (0.1, 0.9)), (1.0, 1e-6, 128, (0.1, 0.9)),
    (0.5, 1e-8, 16, (0.05, 0.15, 0.8)), (3.0, 1e-5, 128, (0.05, 0.15, 0.8))])
def test_composed_claim_is_at_least_the_gaussian_parts_composed(eps, delta, c, fr):
    """The claim is at least the composed delta of the continuous Gaussian parts alone:
    each round shifts one key by its full weight (t = 1: mu_r = 1 / sigma_r) and the
    count C_c counts by 1 (mu_c = sqrt(C_c) / sigma_c), which compose exactly to
    delta_G(eps; sqrt(sum_r sigma_r^-2 + C_c sigma_c^-2)) (Dong, Roth & Su 2022, Cor.
    3.3), minus an allowance of 5% for the discrete Gaussian against the continuous one
    at these sigmas (the rounds' noise >= 1.6 S on the grid of S = WEIGHT_SCALE units,
    the count's >= 13 for a shift of 1). Measured: claim / closed form 1.27-1.32
    (the thresholds' 0.2 delta share and the profile grid). A claim that does not
    compose the stages (the largest single stage's delta) is 0.22-0.32 of the closed
    form and fails here, as it fails the budget when recalibrated."""
    p = ad.calibrate(eps, delta, c, fractions=fr)
    rounds = [(r.sigma, r.threshold_grid) for r in p.rounds]
    claim = ad.composed_delta(rounds, p.count_sigma, p.count_keys_per_user, c, eps, delta)
    mu = math.sqrt(sum(r.sigma ** -2 for r in p.rounds)
                   + p.count_keys_per_user / p.count_sigma ** 2)
    gaussian = _gaussian_delta(eps, mu)
    assert claim >= 0.95 * gaussian, (claim, gaussian)
    assert claim <= delta


def test_calibration_refuses_noise_beyond_the_sampler_naming_the_field():
    with pytest.raises(ValueError, match="round_fractions: round 1 of 2"):
        ad.calibrate(0.5, 1e-6, 8, fractions=(0.00005, 0.99995))


def test_round_profile_is_the_gaussian_part_plus_the_leak():
    """round_profile = weighted_gaussian.gaussian_part (each eps) + p / (1 - p), p from
    the t-th powers of beta_t recomputed here."""
    sigma, t_grid, c = 2.0, 9000, 8
    grid, prof = ad.round_profile(sigma, t_grid, c, 1.0, 1e-6)
    t = np.arange(1, c + 1)
    beta = 1 - np.array([wg.sf_upper(t_grid - wg.grid_weight(k), sigma * wg.WEIGHT_SCALE)
                         for k in t])
    p = max(1 - beta ** t)
    for e, v in zip(grid[::16], prof[::16]):
        assert math.isclose(v, wg.gaussian_part(e, sigma, c) + p / (1 - p), rel_tol=1e-9)


# ---------------------------------------------------------------------------------------
# Brute force: the two-round release's exact hockey-stick divergence on a small grid.

S = 4          # grid scale (q_1 = 4, q_2 = 2, q_3 = 2)


def _weight(t):
    return math.isqrt(S * S // t)


def _sf(x, s):
    """P[Z >= x], Z ~ N_Z(0, s^2), by a normalised pmf sum (numpy, no project code)."""
    z = np.arange(-60 * int(math.ceil(s)) - 60, 60 * int(math.ceil(s)) + 61)
    p = np.exp(-z.astype(float) ** 2 / (2 * s * s))
    p /= p.sum()
    return float(p[z >= x].sum())


def _round(users, released_before, c, s, threshold):
    """One round: every user keeps their keys minus ``released_before``; a user with more
    than c left keeps each c-subset with equal probability. Returns
    {frozenset released: probability}."""
    choices = []
    for keys in users:
        left = sorted(set(keys) - released_before)
        if not left:
            continue
        subsets = list(itertools.combinations(left, min(c, len(left))))
        choices.append([(frozenset(sub), 1.0 / len(subsets)) for sub in subsets])
    out = {}
    for combo in itertools.product(*choices) if choices else [()]:
        p_combo = math.prod(p for _, p in combo)
        totals = {}
        for sub, _ in combo:
            for k in sub:
                totals[k] = totals.get(k, 0) + _weight(len(sub))
        keys = sorted(totals)
        probs = [_sf(threshold - totals[k], s) for k in keys]
        for bits in itertools.product((0, 1), repeat=len(keys)):
            p = p_combo * math.prod(pr if b else 1 - pr for pr, b in zip(probs, bits))
            released = frozenset(k for k, b in zip(keys, bits) if b)
            out[released] = out.get(released, 0.0) + p
    return out


def _two_rounds(users, c, s1, t1, s2, t2):
    """{(R1, R2): probability} of the adaptive release (round 2 on the keys not in R1)."""
    out = {}
    for r1, p1 in _round(users, frozenset(), c, s1, t1).items():
        for r2, p2 in _round(users, r1, c, s2, t2).items():
            assert not (r1 & r2)
            out[(r1, r2)] = out.get((r1, r2), 0.0) + p1 * p2
    return out


def _hockey_stick(p, q, eps):
    e = math.exp(eps)
    return sum(max(pv - e * q.get(o, 0.0), 0.0) for o, pv in p.items())


CASES = [
    # (other users' key sets, the added user's keys, C, s1, T1, s2, T2, eps)
    ([("a",), ("a",), ("b", "c")], ("b",), 2, 3.0, 10, 3.0, 8, 1.0),
    ([("a", "b", "c"), ("a", "b", "c")], ("a", "b", "c"), 3, 3.0, 10, 3.0, 8, 0.5),
    ([("a", "b"), ("b",)], ("a", "c"), 2, 4.0, 10, 4.0, 8, 2.0),
    ([("a", "b"), ("a",), ("a", "c")], ("a", "b", "c"), 2, 3.0, 10, 3.0, 8, 0.5),
    ([("a", "b"), ("a", "b"), ("c",)], ("a", "b", "c"), 2, 3.0, 12, 3.0, 9, 0.5),
]


def _claim(c, s1, t1, s2, t2, eps):
    """The composed claim of the two rounds (f-DP, ``accounting.adaptive``)."""
    return ad.composed_delta([(s1 / S, t1), (s2 / S, t2)], None, 1, c, eps, 1e-3, scale=S)


@pytest.mark.parametrize("case", CASES, ids=[f"case{i}" for i in range(len(CASES))])
def test_two_round_release_stays_within_the_composed_claim(case):
    """For add/remove-one-user neighbours, H_{e^eps}(M(D) || M(D')) and the reverse never
    exceed the f-DP composed claim of the two rounds' profiles (below 0.7: not vacuous);
    the user really moves the outcome (the divergence at eps is at least a sixth of the
    claim). On this toy grid (S = 4, leaks p/(1-p) ~ 0.1) the claim is not always below
    the former basic-composition claim (case2 is not: 0.41 against 0.32; the profile adds
    the leak where the per-round Thm 5.4 accounting mixes it in); at the release's scale
    it is far below (test_f_dp_composition_needs_less_noise_than_basic_composition).

    What this does NOT check: the composition. On these toy cases the threshold term
    p/(1-p) dominates the claim, so replacing the f-DP composition by the largest single
    round's delta, or limiting G_r to t = 1, still passes all five cases (a reviewer
    tried both). It checks the per-round profile (mostly its threshold term); the
    composition is checked by tests/accounting/test_tradeoff_composition.py (Gaussian
    closed form, dp-accounting) and, at the adaptive level, by
    test_composed_claim_is_at_least_the_gaussian_parts_composed."""
    others, user, c, s1, t1, s2, t2, eps = case
    with_user = _two_rounds(others + [user], c, s1, t1, s2, t2)
    without = _two_rounds(others, c, s1, t1, s2, t2)
    assert sum(with_user.values()) == pytest.approx(1.0, abs=1e-12)
    claim = _claim(c, s1, t1, s2, t2, eps)
    measured = max(_hockey_stick(with_user, without, eps),
                   _hockey_stick(without, with_user, eps))
    assert measured <= claim + 1e-12, (measured, claim)
    assert claim < 0.7
    assert measured > claim / 6


def test_the_brute_force_sees_a_round_that_ignores_the_bound():
    """The same brute force flags a broken variant: with every kept key at full weight
    S (sensitivity ignored) the divergence exceeds the claim (0.366 against 0.245),
    where the honest weights stay far below it (0.011)."""
    others, user, c, s1, t1, s2, t2, eps = (
        [("a", "b", "c"), ("a", "b", "c")], ("a", "b", "c"), 3, 3.0, 10, 3.0, 9, 3.0)
    global _weight
    honest = _weight
    claim = _claim(c, s1, t1, s2, t2, eps)
    honest_run = (_two_rounds(others + [user], c, s1, t1, s2, t2),
                  _two_rounds(others, c, s1, t1, s2, t2))
    assert _hockey_stick(*honest_run, eps) < claim / 10
    try:
        _weight = lambda t: S          # noqa: E731 - the broken weight
        with_user = _two_rounds(others + [user], c, s1, t1, s2, t2)
        without = _two_rounds(others, c, s1, t1, s2, t2)
    finally:
        _weight = honest
    measured = max(_hockey_stick(with_user, without, eps),
                   _hockey_stick(without, with_user, eps))
    assert measured > claim

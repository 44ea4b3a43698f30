"""accounting.sample_threshold: privacy of sample-and-threshold (papers 000/003).

Checked against: direct enumeration of both output distributions (thresholded Bin(k, p)
and Bin(k - 1, p), all outcomes listed, in float and in 40-digit mpmath), paper 003's
numbers (alpha = 1/6, C_alpha = 0.935, tau = 20), Monte Carlo of the privacy loss with
the real kernel's draws, brute-force hockey-stick sums over the joint outputs of two keys
(composition), and search-minimality properties (hypothesis)."""
import math

import mpmath
import numpy as np
import pytest
from hypothesis import given, settings, strategies as st
from scipy import stats

from thresher.accounting import sample_threshold as acc
from thresher.accounting.sample_threshold import core as st_core
from tests.accounting import threshold_brute_force as brute

PAPER_P = (1 / 6) * (1 - math.exp(-1))


# ---- independent oracles ---------------------------------------------------------------

def output_distribution(k, p, tau, size):
    """[absent, 0, 1, ..., size - 1]: law of one key's output with k contributions,
    enumerated from the binomial pmf (scipy's pmf, not the tails the module uses)."""
    out = np.zeros(size + 1)
    v = np.arange(k + 1)
    pmf = stats.binom.pmf(v, k, p)
    out[0] = pmf[v < tau].sum()
    out[1 + v[v >= tau]] = pmf[v >= tau]
    return out


def brute_delta(eps, p, tau, k_max):
    """max over 1 <= k <= k_max, both directions, of sum_o max(P(o) - e^eps Q(o), 0)."""
    best, arg = 0.0, None
    for k in range(1, k_max + 1):
        a = output_distribution(k, p, tau, k_max + 1)
        b = output_distribution(k - 1, p, tau, k_max + 1)
        e = math.exp(eps)
        h = max(np.maximum(a - e * b, 0).sum(), np.maximum(b - e * a, 0).sum())
        if h > best:
            best, arg = h, k
    return best, arg


def mp_delta(eps, p, tau, k_max):
    """brute_delta in 40-digit arithmetic (exact binomial coefficients)."""
    with mpmath.workdps(40):
        return _mp_delta(eps, p, tau, k_max)


def _mp_delta(eps, p, tau, k_max):
    p, e = mpmath.mpf(p), mpmath.e ** mpmath.mpf(eps)

    def law(k):
        d = {"absent": mpmath.mpf(0)}
        for v in range(k + 1):
            pr = mpmath.binomial(k, v) * p ** v * (1 - p) ** (k - v)
            if v >= tau:
                d[v] = pr
            else:
                d["absent"] += pr
        return d

    best = mpmath.mpf(0)
    prev = law(0)
    for k in range(1, k_max + 1):
        cur = law(k)
        keys = set(cur) | set(prev)
        h1 = sum(max(mpmath.mpf(0), cur.get(o, 0) - e * prev.get(o, 0)) for o in keys)
        h2 = sum(max(mpmath.mpf(0), prev.get(o, 0) - e * cur.get(o, 0)) for o in keys)
        best = max(best, h1, h2)
        prev = cur
    return best


def k_range(eps, p, tau):
    return int(4 * tau / acc.add_quantile(eps, p)) + 80


# ---- paper numbers ---------------------------------------------------------------------

def test_paper_alpha_example_p_0105_c_alpha_0935_tau_20_gives_delta_below_1e8():
    # paper 003 Sec. 3.1: eps = 1, alpha = 1/6 -> p = 0.105, C_alpha = 0.935, tau = 20.
    p, tau = acc.paper_parameters(1.0, 1e-8, alpha=1 / 6)
    assert p == pytest.approx(0.105, abs=5e-4)
    assert acc.c_alpha(1 / 6) == pytest.approx(0.935, abs=5e-4)
    assert tau == 20
    assert acc.delta(1.0, p, 20, method="alpha") < 1e-8
    assert acc.delta(1.0, p, 19, method="alpha") > 1e-8
    assert acc.min_threshold(1.0, 1e-8, p, method="alpha") == 20


def test_exact_threshold_is_about_half_the_papers_and_checked_by_enumeration():
    # mechanisms.md: exact accounting needs a threshold of about 11 at eps 1, delta 1e-8.
    tau = acc.min_threshold(1.0, 1e-8, PAPER_P)
    assert tau == 11
    assert acc.min_threshold(1.0, 1e-8, PAPER_P, method="kl") == 14
    # the decision tau = 11 is right by direct enumeration, on both sides
    assert brute_delta(1.0, PAPER_P, 11, k_range(1.0, PAPER_P, 11))[0] <= 1e-8
    assert brute_delta(1.0, PAPER_P, 10, k_range(1.0, PAPER_P, 10))[0] > 1e-8
    # at the paper's tau = 20 the exact delta is of order 1e-14 (mechanisms.md)
    assert 1e-15 < acc.delta(1.0, PAPER_P, 20) < 1e-13


@pytest.mark.parametrize("eps,p,tau", [
    (1.0, PAPER_P, 11), (1.0, PAPER_P, 20), (0.5, 0.3, 5), (0.2, 0.03, 4),
    (1.0, 0.7, 10),    # p > 1 - e^-eps: the remove direction is non-zero
    (1.0, 0.8, 30), (2.0, 0.5, 3), (0.1, 0.5, 40),
])
def test_exact_delta_equals_direct_enumeration(eps, p, tau):
    expected, arg = brute_delta(eps, p, tau, k_range(eps, p, tau))
    got, got_arg, searched, tail = acc.exact_delta_search(eps, p, tau)
    assert got == pytest.approx(expected, rel=1e-9)
    assert got_arg == arg
    assert tail <= 1e-6 * got


def test_exact_delta_equals_40_digit_enumeration_at_the_paper_setting():
    for tau in (11, 20):
        expected = mp_delta(1.0, PAPER_P, tau, k_range(1.0, PAPER_P, tau))
        assert acc.delta(1.0, PAPER_P, tau) == pytest.approx(float(expected), rel=1e-9)


@pytest.mark.parametrize("eps,p,tau", [(1.0, PAPER_P, 11), (1.0, 0.7, 10), (0.3, 0.9, 25)])
def test_divergences_per_k_match_enumeration_in_both_directions(eps, p, tau):
    ks = np.arange(1, k_range(eps, p, tau))
    add, remove = acc.divergences(eps, p, tau, ks)
    e = math.exp(eps)
    size = int(ks[-1]) + 1
    for k, a_got, r_got in zip(ks, add, remove):
        a = output_distribution(int(k), p, tau, size)
        b = output_distribution(int(k) - 1, p, tau, size)
        assert a_got == pytest.approx(np.maximum(a - e * b, 0).sum(), rel=1e-8, abs=1e-300)
        assert r_got == pytest.approx(np.maximum(b - e * a, 0).sum(), rel=1e-8, abs=1e-15)
    if acc.remove_quantile(eps, p) <= 0:
        assert not remove.any()


@pytest.mark.parametrize("eps,p,tau", [(1.0, PAPER_P, 11), (1.0, 0.7, 10), (0.5, 0.5, 8)])
def test_tail_bound_dominates_every_divergence_beyond_the_searched_range(eps, p, tau):
    for K in (tau + 10, 2 * tau + 20, 200):
        ks = np.arange(K + 1, K + 2000)
        add, remove = acc.divergences(eps, p, tau, ks)
        assert np.maximum(add, remove).max() <= st_core._tail_bound(eps, p, tau, K) * (1 + 1e-9)


def test_kl_and_alpha_bounds_are_never_below_the_exact_delta():
    for eps in (0.1, 0.5, 1.0):
        for alpha in (0.05, 1 / 6, 0.5, 0.9):
            p = alpha * -math.expm1(-eps)
            for tau in (2, 5, 11, 20, 40):
                exact = acc.delta(eps, p, tau)
                assert exact <= acc.delta(eps, p, tau, method="kl") * (1 + 1e-12)
                assert exact <= acc.delta(eps, p, tau, method="alpha") * (1 + 1e-12)


def test_bounds_report_no_guarantee_outside_their_hypotheses():
    assert acc.delta(1.0, 0.7, 50, method="kl") == 1.0      # p > 1 - e^-1
    assert acc.delta(1.0, 0.7, 50, method="alpha") == 1.0
    assert acc.delta(2.0, 0.1, 50, method="alpha") == 1.0   # lemma needs eps <= 1
    assert acc.delta(1.0, 1.0, 50) == 1.0                    # p = 1: k = tau is revealed
    assert acc.delta(1.0, 0.7, 50) < 1e-3                    # exact still gives a guarantee


# ---- Monte Carlo with the real sampler -------------------------------------------------

def test_monte_carlo_privacy_loss_with_the_kernel_matches_exact_delta():
    """delta = E_{o ~ P_k}[(1 - e^{eps - L(o)})_+] with L the privacy loss; o drawn by the
    kernel (transforms.selection.sample_and_threshold) from a seeded generator. n = 400k draws: the
    estimate's standard error is below 2.5e-4 here and we allow 5 SE (false-failure
    probability < 1e-6 per direction)."""
    from thresher.transforms.selection.sample_and_threshold import sample_and_threshold

    eps, p, tau = 0.5, 0.3, 5
    exact, k, _, _ = acc.exact_delta_search(eps, p, tau)
    rng = np.random.default_rng(20240601)
    n = 400_000
    size = k + 1
    dist_k = output_distribution(k, p, tau, size)
    dist_km1 = output_distribution(k - 1, p, tau, size)
    for draw_from, other, count in ((dist_k, dist_km1, k), (dist_km1, dist_k, k - 1)):
        keep, values = sample_and_threshold(np.full(n, count), sampling_rate=p,
                                            threshold=tau, rng=rng)
        outcome = np.where(keep, 1 + values, 0)
        ratio = other[outcome] / draw_from[outcome]
        terms = np.maximum(1 - math.exp(eps) * ratio, 0)
        truth = np.maximum(draw_from - math.exp(eps) * other, 0).sum()
        se = terms.std() / math.sqrt(n)
        assert abs(terms.mean() - truth) <= 5 * se + 1e-12
    assert exact == pytest.approx(max(
        np.maximum(dist_k - math.exp(eps) * dist_km1, 0).sum(),
        np.maximum(dist_km1 - math.exp(eps) * dist_k, 0).sum()), rel=1e-9)


# ---- composition over a user's keys ---------------------------------------------------

@pytest.mark.parametrize("p,tau", [(0.3, 4), (0.6, 6)])
def test_two_keys_joint_delta_is_within_basic_composition(p, tau):
    """Brute force over the product of two keys' outputs (every joint outcome, every
    (k1, k2) in a range around the per-key maxima): the joint hockey-stick at eps is at
    most 2 delta_key(eps / 2), the budget calibrate() books for C = 2."""
    eps = 1.0
    per_key = acc.delta(eps / 2, p, tau)
    ks = range(tau, tau + 12)
    size = tau + 13
    worst = 0.0
    for k1 in ks:
        for k2 in ks:
            with_user = [output_distribution(k, p, tau, size) for k in (k1, k2)]
            without = [output_distribution(k - 1, p, tau, size) for k in (k1, k2)]
            worst = max(worst, brute.hockey_stick(with_user, without, eps),
                        brute.hockey_stick(without, with_user, eps))
    assert worst <= 2 * per_key
    assert worst > 0


def test_calibrate_books_each_key_at_epsilon_over_c_and_delta_over_c():
    params = acc.calibrate(1.0, 1e-8, 4)
    assert params.per_key_epsilon == 0.25
    assert params.per_key_delta == pytest.approx(2.5e-9)
    assert params.per_key_delta_spent == acc.delta(0.25, params.sampling_rate, params.threshold)
    assert params.delta_spent == pytest.approx(4 * params.per_key_delta_spent)
    assert params.delta_spent <= 1e-8


def test_group_privacy_delta_sums_the_chain():
    eps, dlt = 0.3, 1e-9
    g_eps, g_delta = acc.group_privacy(eps, dlt, 4)
    assert g_eps == pytest.approx(1.2)
    assert g_delta == pytest.approx(dlt * sum(math.exp(i * eps) for i in range(4)))
    assert acc.group_privacy(eps, dlt, 1) == pytest.approx((eps, dlt))


# ---- calibration -----------------------------------------------------------------------

def test_calibrate_default_minimises_the_release_point_and_meets_the_budget():
    params = acc.calibrate(1.0, 1e-8, 1)
    assert params.calibrated == ("sampling_rate", "threshold")
    assert params.delta_spent <= 1e-8
    assert acc.delta(1.0, params.sampling_rate, params.threshold) <= 1e-8
    # no nearby threshold, each at its own largest rate, has a smaller tau / p
    for tau in range(max(1, params.threshold - 5), params.threshold + 6):
        p = acc.sampling_rate_for(1.0, 1e-8, tau)
        assert tau / p >= params.release_point * (1 - 1e-6)
    # and it beats the paper's recipe (tau 20 at p 0.105: release point ~190)
    assert params.release_point < 20 / PAPER_P / 2


def test_calibrate_with_one_parameter_fixed_calibrates_the_other():
    by_rate = acc.calibrate(1.0, 1e-8, 1, sampling_rate=PAPER_P)
    assert (by_rate.threshold, by_rate.calibrated) == (11, ("threshold",))
    by_tau = acc.calibrate(1.0, 1e-8, 1, threshold=11)
    assert by_tau.calibrated == ("sampling_rate",)
    assert by_tau.sampling_rate >= PAPER_P
    assert acc.delta(1.0, by_tau.sampling_rate, 11) <= 1e-8
    assert acc.delta(1.0, by_tau.sampling_rate * (1 + 1e-6), 11) > 1e-8


def test_calibrate_with_both_fixed_refuses_and_says_what_would_work():
    with pytest.raises(acc.CalibrationInfeasible) as info:
        acc.calibrate(1.0, 1e-8, 1, sampling_rate=0.3, threshold=5)
    msg = str(info.value)
    assert "threshold >= 24 at sampling_rate 0.3" in msg
    rate = float(msg.split("sampling_rate <= ")[1].split()[0])
    assert acc.delta(1.0, rate, 5) <= 1e-8          # the suggestion itself works
    assert acc.delta(1.0, 0.3, 24) <= 1e-8 < acc.delta(1.0, 0.3, 23)
    ok = acc.calibrate(1.0, 1e-8, 1, sampling_rate=0.3, threshold=24)
    assert ok.calibrated == () and ok.delta_spent <= 1e-8


def test_calibrate_rejects_out_of_range_arguments_by_name():
    with pytest.raises(ValueError, match="sampling_rate must be in"):
        acc.calibrate(1.0, 1e-8, 1, sampling_rate=1.5)
    with pytest.raises(ValueError, match="threshold must be an integer"):
        acc.calibrate(1.0, 1e-8, 1, threshold=0)
    with pytest.raises(ValueError, match="max_keys_per_user"):
        acc.calibrate(1.0, 1e-8, 0)
    with pytest.raises(ValueError, match="epsilon"):
        acc.delta(-1, 0.1, 5)
    with pytest.raises(ValueError, match="method"):
        acc.delta(1, 0.1, 5, method="rdp")


@pytest.mark.slow
def test_exact_delta_grows_with_the_sampling_rate_on_a_grid():
    """sampling_rate_for's bisection assumes delta non-decreasing in p; checked here."""
    for eps in (0.1, 1.0, 3.0):
        for tau in (1, 3, 10, 30):
            d = [acc.delta(eps, p, tau) for p in np.linspace(0.005, 0.98, 60)]
            assert all(b >= a * (1 - 1e-9) for a, b in zip(d, d[1:]))


# ---- properties ------------------------------------------------------------------------

_eps = st.floats(0.05, 3.0)
_rate = st.floats(0.005, 0.95)
_tau = st.integers(1, 40)


@settings(max_examples=40, deadline=None)
@given(_eps, _rate, _tau, st.sampled_from(acc.METHODS))
def test_delta_is_a_probability_and_non_increasing_in_threshold(eps, p, tau, method):
    d0 = acc.delta(eps, p, tau, method=method)
    d1 = acc.delta(eps, p, tau + 1, method=method)
    assert 0.0 <= d1 <= d0 * (1 + 1e-9) + 1e-300 <= 1.0 + 1e-9


@settings(max_examples=25, deadline=None)
@given(_eps, _rate, st.sampled_from([1e-3, 1e-6, 1e-10]), st.sampled_from(acc.METHODS))
def test_min_threshold_returns_the_smallest_threshold_that_meets_delta(eps, p, target, method):
    tau = acc.min_threshold(eps, target, p, method=method, max_threshold=2000)
    if tau is None:
        assert acc.delta(eps, p, 2000, method=method) > target
        return
    assert acc.delta(eps, p, tau, method=method) <= target
    if tau > 1:
        assert acc.delta(eps, p, tau - 1, method=method) > target


@settings(max_examples=20, deadline=None)
@given(_eps, st.integers(1, 30), st.sampled_from([1e-4, 1e-8]))
def test_sampling_rate_for_returns_an_admissible_rate_close_to_the_largest(eps, tau, target):
    p = acc.sampling_rate_for(eps, target, tau)
    assert p is not None
    assert acc.delta(eps, p, tau) <= target
    if p * (1 + 1e-6) < 1:
        assert acc.delta(eps, min(1.0, p * (1 + 1e-6)), tau) > target


# ---- several levels (heavy hitters, hierarchies, binary search) -------------------------

def test_calibrate_levels_splits_the_budget_and_uses_group_privacy_within_a_level():
    params = acc.calibrate_levels(1.0, 1e-8, 4, 3)
    assert params.level_epsilon == 0.25 and params.unit.epsilon == pytest.approx(0.25 / 3)
    unit_delta = params.unit.delta_spent
    level = acc.group_privacy(params.unit.epsilon, unit_delta, 3)
    assert level[0] == pytest.approx(0.25)
    assert params.level_delta_spent == pytest.approx(level[1])
    assert params.delta_spent == pytest.approx(4 * level[1]) and params.delta_spent <= 1e-8
    assert acc.calibrate_levels(1.0, 1e-8, 1, 1).threshold == acc.calibrate(1.0, 1e-8, 1).threshold


@pytest.mark.parametrize("p,tau", [(0.2, 5), (0.5, 8)])
def test_two_contributions_in_one_cell_are_within_the_group_privacy_bound(p, tau):
    """A user with 2 contributions under one prefix moves that cell from k - 2 to k.
    Enumerated exactly (both directions, every k in range): within the group-privacy
    bound calibrate_levels books, (2 eps_u, delta_u (1 + e^eps_u))."""
    eps_u = 0.4
    delta_u = acc.delta(eps_u, p, tau)
    bound = acc.group_privacy(eps_u, delta_u, 2)
    worst = 0.0
    size = k_range(eps_u, p, tau) + 3
    for k in range(2, size):
        a = output_distribution(k, p, tau, size)
        b = output_distribution(k - 2, p, tau, size)
        e = math.exp(bound[0])
        worst = max(worst, np.maximum(a - e * b, 0).sum(), np.maximum(b - e * a, 0).sum())
    assert 0 < worst <= bound[1]

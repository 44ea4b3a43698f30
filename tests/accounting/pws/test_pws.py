"""accounting.pws: PWS (paper 001) probabilities, estimators, SbH baseline, composition.

Every privacy number is checked against an independent computation: the DP definition
enumerated over all sets of outcomes (brute force), the paper's closed forms (Lemmas 4.2,
4.4, 5.2, Appendix G), numerical integration, exact rational arithmetic, Google's
partition selection (python-dp) and dp_accounting's privacy loss distributions.
"""
import itertools
import math
from fractions import Fraction

import numpy as np
import pytest
import scipy.integrate
from hypothesis import given, settings
from hypothesis import strategies as st

from thresher.accounting import pws
from thresher.accounting.pws import core as pws_core

SCHEMES = [("none", None), ("ppswor", 0.05), ("priority", 0.02), ("ppswor", 2.0),
           ("priority", 0.3)]


def delta_for_integral_L(epsilon, L):
    """delta making L(eps, delta) of PWS eq. (4) the integer L."""
    return math.expm1(epsilon) / (math.exp(epsilon * L) * (math.exp(epsilon) + 1) - 2)


def dense(epsilon, delta, m, sampling="none", t=None):
    return pws.frequency_table(epsilon, delta, m, sampling=sampling,
                               sampling_threshold=t).toarray()


def dp_holds_for_all_sets(p, q, epsilon, delta, tol=1e-12):
    """The DP inequalities P(J) <= e^eps Q(J) + delta and back, for EVERY subset J of the
    outcomes (explicit enumeration, 2^n sets)."""
    n = len(p)
    e = math.exp(epsilon)
    for r in range(n + 1):
        for subset in itertools.combinations(range(n), r):
            j = list(subset)
            pj, qj = p[j].sum(), q[j].sum()
            if pj > e * qj + delta + tol or qj > e * pj + delta + tol:
                return False
    return True


# ----------------------------------------------------------------------------- Alg. 3

def test_keep_probabilities_match_lemma_4_2_closed_form():
    """Lemma 4.2 with its symmetry (Appendix A: 1 - pi*_{2L+1-i} = pi*_i). The printed
    eq. (5) has an off-by-one in the middle segment (2L + 2 - i for 2L + 1 - i); with the
    printed form pi*_{2L+1} would be 1 - delta, contradicting the symmetry and §8.2
    ("pi*_{2L+1} reaches 1"). We check the corrected form."""
    eps, L = 0.3, 9
    delta = delta_for_integral_L(eps, L)
    assert pws.pws_L(eps, delta) == pytest.approx(L, abs=1e-9)
    pi = pws.keep_probabilities(eps, delta, 3 * L)
    i = np.arange(len(pi))
    closed = np.where(i <= L + 1, delta * np.expm1(eps * i) / math.expm1(eps),
                      np.where(i <= 2 * L + 1,
                               1 - delta * np.expm1(eps * (2 * L + 1 - i)) / math.expm1(eps), 1.0))
    assert np.allclose(pi, closed, rtol=1e-9, atol=1e-13)
    assert pi[2 * L + 1] == 1.0 and pi[2 * L] < 1.0
    assert pws.saturation_frequency(eps, delta) == 2 * L + 1


@pytest.mark.parametrize("sampling,t", SCHEMES)
def test_keep_probabilities_are_dp_realizable_and_maximal(sampling, t):
    eps, delta = 0.4, 1e-3
    m = 120
    pi = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    q = pws.sampling_probabilities(m, sampling=sampling, sampling_threshold=t)
    assert pi[0] == 0 and np.all(np.diff(pi) >= 0) and np.all(pi <= q)
    for i in range(1, m + 1):
        a = np.array([pi[i], 1 - pi[i]])
        b = np.array([pi[i - 1], 1 - pi[i - 1]])
        assert dp_holds_for_all_sets(a, b, eps, delta)
        if pi[i] < q[i]:  # maximal: any larger value breaks DP against pi_{i-1}
            bigger = pi[i] + 1e-9
            a = np.array([bigger, 1 - bigger])
            assert not dp_holds_for_all_sets(a, b, eps, delta, tol=0.0)


def test_ppswor_follows_lemma_4_4():
    eps, delta, t = 0.2, 1e-4, 0.01
    m = 400
    pi = pws.keep_probabilities(eps, delta, m, sampling="ppswor", sampling_threshold=t)
    star = pws.keep_probabilities(eps, delta, m)
    q = pws.sampling_probabilities(m, sampling="ppswor", sampling_threshold=t)
    ell = int(np.flatnonzero(star[1:] > q[1:])[0]) + 1
    assert np.allclose(pi[:ell], star[:ell], rtol=1e-12)
    assert np.allclose(pi[ell:], q[ell:], rtol=1e-12)


@pytest.mark.parametrize("eps,delta", [(0.1, 1e-6), (1.0, 1e-5), (0.5, 1e-8), (2.0, 0.01)])
def test_no_sampling_equals_pydp_truncated_geometric(eps, delta):
    from pydp.algorithms import partition_selection
    strategy = partition_selection.create_truncated_geometric_partition_strategy(eps, delta, 1)
    pi = pws.keep_probabilities(eps, delta, 400)
    theirs = np.array([strategy.probability_of_keep(n) for n in range(1, 401)])
    assert np.allclose(pi[1:], theirs, rtol=1e-9, atol=1e-15)


def test_pydp_per_key_split_is_the_optimal_composition_at_eps_over_c():
    """python-dp runs each of C partitions at (eps/C, 1 - (1-delta)^(1/C)); that split is
    the f = 1 point of per_key_budget's search and its composition is exactly delta."""
    from pydp.algorithms import partition_selection
    eps, delta, c = 1.0, 1e-6, 5
    strategy = partition_selection.create_truncated_geometric_partition_strategy(eps, delta, c)
    d0 = -math.expm1(math.log1p(-delta) / c)
    assert pws.composed_delta(eps / c, d0, c, eps) == pytest.approx(delta, rel=1e-9)
    pi = pws.keep_probabilities(eps / c, d0, 300)
    theirs = np.array([strategy.probability_of_keep(n) for n in range(1, 301)])
    assert np.allclose(pi[1:], theirs, rtol=1e-9, atol=1e-15)
    assert pws.per_key_budget(eps, delta, c).key_epsilon >= eps / c * (1 - 1e-9)


def test_ratio_to_sbh_is_about_2i_at_low_frequencies():
    # Paper §1.1 / §8.2: pi*_i / phi_i ~ 2i for low i (no sampling).
    eps, delta = 0.01, 1e-6
    i = np.arange(1, 11)
    ratio = pws.keep_probabilities(eps, delta, 10)[1:] / pws.sbh_keep_probabilities(eps, delta, i)
    assert np.all(np.abs(ratio / (2 * i) - 1) < 0.06)


# ----------------------------------------------------------------------------- Alg. 4

@pytest.mark.parametrize("sampling,t", SCHEMES)
@pytest.mark.parametrize("eps,delta", [(0.5, 0.01), (1.0, 0.05), (0.2, 0.002)])
def test_every_row_is_dp_against_the_previous_for_all_sets(sampling, t, eps, delta):
    """Brute force over all 2^(i+1) sets of outcomes {0 (not reported), 1..i}, both ways."""
    m = 11
    table = dense(eps, delta, m, sampling, t)
    for i in range(1, m + 1):
        assert dp_holds_for_all_sets(table[i, :i + 1], table[i - 1, :i + 1], eps, delta), i


@pytest.mark.parametrize("sampling,t", SCHEMES)
def test_rows_are_distributions_with_keep_probability_mass(sampling, t):
    eps, delta, m = 0.3, 1e-4, 150
    table = dense(eps, delta, m, sampling, t)
    pi = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    assert np.all(table >= 0)
    assert np.allclose(table.sum(axis=1), 1.0, atol=1e-13)
    assert np.allclose(table[:, 1:].sum(axis=1), pi, rtol=1e-12, atol=1e-15)
    assert np.all(np.triu(table[:, 1:], k=0)[:-1, :] >= 0)
    for i in range(m + 1):  # tokens never exceed the frequency (Alg. 4, t = max frequency)
        assert np.all(table[i, i + 1:] == 0)
    # pi_{i,i} = min(delta, pi_i) (Appendix B)
    diag = np.array([table[i, i] for i in range(1, m + 1)])
    assert np.allclose(diag, np.minimum(delta, pi[1:]), rtol=1e-12)


@pytest.mark.parametrize("sampling,t", SCHEMES)
def test_token_distributions_stochastically_dominate(sampling, t):
    """§5: for i > i', P[token >= h] is non-decreasing in the frequency, for every h."""
    table = dense(0.3, 1e-3, 120, sampling, t)
    upper_tail = np.cumsum(table[:, ::-1], axis=1)[:, ::-1][:, 1:]   # P[token >= h], h >= 1
    assert np.all(np.diff(upper_tail, axis=0) >= -1e-13)


def test_no_sampling_rows_follow_lemma_5_2():
    eps, L = 0.4, 6
    delta = delta_for_integral_L(eps, L)
    m = 5 * L
    table = dense(eps, delta, m)
    for i in range(1, m + 1):
        for j in range(1, i + 1):
            k = i - j
            if k <= L:
                want = delta * math.exp(k * eps)
            elif k <= 2 * L:
                want = delta * math.exp((2 * L - k) * eps)
            else:
                want = 0.0
            assert table[i, j] == pytest.approx(want, rel=1e-9, abs=1e-15), (i, j)


def test_frequency_table_beyond_saturation_is_a_shift_of_the_last_row():
    """The "shift" rule for counts above the table: Alg. 4 rows computed further out equal
    the stationary row shifted (to rounding)."""
    params = pws.calibrate(0.5, 1e-4, 1)
    assert params.beyond_table == "shift"
    m = params.max_frequency
    far = pws.frequency_table(params.key_epsilon, params.table_delta, m + 60).toarray()
    base = far[m, 1:m + 1]
    for k in range(1, 61):
        shifted = np.zeros(m + 60)
        shifted[k:k + m] = base
        assert np.allclose(far[m + k, 1:], shifted, rtol=1e-9, atol=1e-18)


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.05, 2.0), log_delta=st.floats(-9, -1),
       scheme=st.sampled_from(["none", "ppswor", "priority"]), log_t=st.floats(-3, 0.5),
       m=st.integers(2, 120))
def test_property_tables_are_dp_monotone_and_optimal(eps, log_delta, scheme, log_t, m):
    delta = 10.0 ** log_delta
    t = None if scheme == "none" else 10.0 ** log_t
    q = pws.sampling_probabilities(m, sampling=scheme, sampling_threshold=t)
    pi = pws.keep_probabilities(eps, delta, m, sampling=scheme, sampling_threshold=t)
    # Alg. 3: each pi_i is the tightest of its three upper bounds (so maximal).
    e = math.exp(eps)
    for i in range(1, m + 1):
        assert pi[i] == pytest.approx(min(q[i], e * pi[i - 1] + delta,
                                          1 + (pi[i - 1] + delta - 1) / e), rel=1e-13)
    assert np.all(np.diff(pi) >= 0)
    table = pws.frequency_table(eps, delta, m, sampling=scheme, sampling_threshold=t).toarray()
    # hockey-stick divergence (the max over all sets J) of consecutive rows, both ways
    fwd = np.maximum(0, table[1:] - e * table[:-1]).sum(axis=1)
    bwd = np.maximum(0, table[:-1] - e * table[1:]).sum(axis=1)
    assert np.all(fwd <= delta * (1 + 1e-9) + 1e-15)
    assert np.all(bwd <= delta * (1 + 1e-9) + 1e-15)
    assert np.allclose(table[:, 1:].sum(axis=1), pi, rtol=1e-11, atol=1e-15)


# ----------------------------------------------------------------------------- estimators

def naive_mle(table, pi):
    m = table.shape[0] - 1
    a = np.zeros(m + 1)
    for j in range(1, m + 1):
        best_i, best = None, -1.0
        for i in range(m + 1):
            if table[i, j] > best:
                best_i, best = i, table[i, j]
        a[j] = best_i / pi[best_i]
    return a


def naive_biased_down(table, pi):
    m = table.shape[0] - 1
    a = np.zeros(m + 1)
    for j in range(1, m + 1):
        candidates = []
        for i in range(1, m + 1):
            if table[i, j] > 0:
                num = i - sum(a[h] * table[i, h] for h in range(1, j))
                den = pi[i] - sum(table[i, h] for h in range(1, j))
                candidates.append(num / den)
        a[j] = min(candidates)
    return a


@pytest.mark.parametrize("sampling,t", SCHEMES[:3])
def test_estimators_match_their_definitions(sampling, t):
    eps, delta, m = 0.5, 1e-3, 40
    t_sparse = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    table = t_sparse.toarray()
    pi = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    assert np.allclose(pws.mle_estimates(t_sparse, pi), naive_mle(table, pi), rtol=1e-12)
    assert np.allclose(pws.biased_down_estimates(t_sparse, pi), naive_biased_down(table, pi),
                       rtol=1e-7)


@pytest.mark.parametrize("sampling,t", SCHEMES[:3])
def test_biased_down_is_non_decreasing_and_never_biased_up(sampling, t):
    # Lemma E.1
    eps, delta, m = 0.3, 1e-4, 200
    table = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    a = pws.biased_down_estimates(table)
    assert np.all(np.diff(a[1:]) >= -1e-9 * a[1:-1])
    moments = pws.estimator_moments(table, a)
    assert np.all(moments["bias"] <= 1e-7 * np.arange(m + 1))


def test_estimator_moments_match_definitions_and_monte_carlo():
    eps, delta, m = 0.5, 1e-3, 30
    table_s = pws.frequency_table(eps, delta, m)
    table = table_s.toarray()
    a = pws.mle_estimates(table_s)
    mom = pws.estimator_moments(table_s, a)
    for i in range(1, m + 1):
        exp_i = sum(table[i, j] * a[j] for j in range(1, i + 1))
        mse_i = table[i, 0] * i * i + sum(table[i, j] * (a[j] - i) ** 2 for j in range(1, i + 1))
        assert mom["expected"][i] == pytest.approx(exp_i, rel=1e-10, abs=1e-12)
        assert mom["mse"][i] == pytest.approx(mse_i, rel=1e-9, abs=1e-9)
    # Monte Carlo at i = 20: 200k draws; the 6-sigma band fails with probability ~2e-9.
    rng = np.random.default_rng(5)
    draws = rng.choice(m + 1, size=200_000, p=table[20] / table[20].sum())
    est = a[draws]
    sd = est.std() / math.sqrt(len(est))
    assert abs(est.mean() - mom["expected"][20]) < 6 * sd


# ----------------------------------------------------------------------------- SbH baseline

def sbh_integral(eps, delta, i, q, kinks=()):
    """phi_i = int_T^inf q(j) Lap_{1/eps}(j - i) dj by adaptive quadrature."""
    T = pws.sbh_threshold(eps, delta)
    f = lambda j: q(j) * 0.5 * eps * math.exp(-eps * abs(j - i))
    hi = max(i, T) + 60 / eps
    pts = [x for x in (i, *kinks) if T < x < hi]
    return scipy.integrate.quad(f, T, hi, points=pts or None, limit=400, epsabs=1e-14)[0]


@pytest.mark.parametrize("sampling,t,q", [
    ("none", None, lambda j: 1.0),
    ("ppswor", 0.05, lambda j: -math.expm1(-0.05 * j)),
    ("ppswor", 0.3, lambda j: -math.expm1(-0.3 * j)),
    ("priority", 0.02, lambda j: min(1.0, 0.02 * j)),
    ("priority", 0.5, lambda j: min(1.0, 0.5 * j)),
])
def test_sbh_keep_probabilities_match_numerical_integration(sampling, t, q):
    eps, delta = 0.3, 1e-4
    freqs = np.array([1, 5, 20, 31, 32, 45, 60, 100, 200])
    got = pws.sbh_keep_probabilities(eps, delta, freqs, sampling=sampling, sampling_threshold=t)
    kinks = (1 / t,) if sampling == "priority" else ()
    want = [sbh_integral(eps, delta, float(i), q, kinks) for i in freqs]
    assert np.allclose(got, want, rtol=1e-6, atol=1e-12)


def test_sbh_keep_probabilities_match_a_simulated_sbh():
    """Laplace(1/eps) noise, threshold T, then ppswor at the noisy count: 400k keys of
    frequency 40; a 6-sigma band fails with probability ~2e-9."""
    eps, delta, t, i = 0.3, 1e-4, 0.05, 40
    rng = np.random.default_rng(11)
    noisy = i + rng.laplace(0, 1 / eps, 400_000)
    kept = (noisy >= pws.sbh_threshold(eps, delta)) & \
           (rng.random(400_000) < -np.expm1(-t * np.maximum(noisy, 0)))
    p = float(pws.sbh_keep_probabilities(eps, delta, [i], sampling="ppswor", sampling_threshold=t)[0])
    assert abs(kept.mean() - p) < 6 * math.sqrt(p * (1 - p) / 400_000)


# ----------------------------------------------------------------------------- composition

def brute_force_composed_delta(e0, d0, c, eps):
    """Hockey-stick divergence of the C-fold product of the (eps0, delta0) dominating pair,
    by enumerating all 4^C outcomes."""
    a = math.exp(e0) / (1 + math.exp(e0))
    p1 = [d0, (1 - d0) * a, (1 - d0) * (1 - a), 0.0]
    q1 = p1[::-1]
    total = 0.0
    for outcome in itertools.product(range(4), repeat=c):
        p = math.prod(p1[k] for k in outcome)
        q = math.prod(q1[k] for k in outcome)
        total += max(0.0, p - math.exp(eps) * q)
    return total


@pytest.mark.parametrize("e0,d0,c,eps", [(0.3, 1e-3, 1, 0.3), (0.3, 1e-3, 2, 0.4),
                                         (0.2, 1e-4, 3, 0.3), (0.5, 1e-2, 4, 1.0),
                                         (0.1, 1e-5, 4, 0.0)])
def test_composed_delta_matches_enumeration(e0, d0, c, eps):
    assert pws.composed_delta(e0, d0, c, eps) == pytest.approx(
        brute_force_composed_delta(e0, d0, c, eps), rel=1e-10, abs=1e-16)


@pytest.mark.parametrize("e0,d0,c,eps", [(0.1, 1e-7, 10, 1.0), (0.03, 1e-9, 50, 1.0)])
def test_composed_delta_matches_dp_accounting_pld(e0, d0, c, eps):
    from dp_accounting.pld import common, privacy_loss_distribution
    pld = privacy_loss_distribution.from_privacy_parameters(
        common.DifferentialPrivacyParameters(e0, d0), value_discretization_interval=1e-5)
    theirs = pld.self_compose(c).get_delta_for_epsilon(eps)   # a pessimistic discretisation
    ours = pws.composed_delta(e0, d0, c, eps)
    assert ours <= theirs * (1 + 1e-9)
    assert ours >= theirs * 0.99


@pytest.mark.parametrize("c", [1, 2, 10, 100, 1000])
def test_per_key_budget_meets_the_total_and_beats_basic(c):
    eps, delta = 1.0, 1e-6
    opt = pws.per_key_budget(eps, delta, c)
    basic = pws.per_key_budget(eps, delta, c, composition="basic")
    assert basic.key_epsilon == pytest.approx(eps / c) and basic.key_delta == pytest.approx(delta / c)
    assert opt.key_epsilon >= basic.key_epsilon * (1 - 1e-12)
    assert pws.pws_L(opt.key_epsilon, opt.key_delta) <= pws.pws_L(basic.key_epsilon, basic.key_delta)
    assert pws.composed_delta(opt.key_epsilon, opt.key_delta, c, eps) <= delta
    if c >= 100:  # optimal composition is substantially better for many keys
        assert opt.key_epsilon > 1.5 * basic.key_epsilon


def test_per_key_budget_rejects_bad_arguments():
    with pytest.raises(ValueError, match="max_keys_per_user"):
        pws.per_key_budget(1.0, 1e-6, 0)
    with pytest.raises(ValueError, match="composition"):
        pws.per_key_budget(1.0, 1e-6, 2, composition="advanced")
    with pytest.raises(ValueError, match="epsilon"):
        pws.per_key_budget(-1.0, 1e-6, 2)


# ----------------------------------------------------------------------------- realized delta

def realized_row_fractions(table_csr, i, q_i=None):
    """Exact rational probabilities of the outcomes the sanitizer samples for row i: token
    j with probability c_j - c_{j-1} of the clipped float cumulative sums (times q_i, of
    fl(c / q_i) when pre-sampled): samplers.cdf_index draws that law exactly (issue 42;
    before, a uniform on the 2^-53 grid drew ceil(2^53 c) / 2^53)."""
    cols, cum = pws.row_cdf(table_csr, i)
    out = {}
    prev = Fraction(0)
    for c, x in zip(cols, cum):
        if q_i is None:
            level = Fraction(min(float(x), 1.0))
            weight = 1
        else:
            level = Fraction(min(float(x / q_i), 1.0))
            weight = Fraction(q_i)
        out[int(c)] = weight * (level - prev)
        prev = level
    out[0] = 1 - sum(out.values())
    return out


@pytest.mark.parametrize("presampled", [False, True])
def test_keys_only_realized_delta_is_for_the_exact_coins_drawn(presampled):
    """Keys only, the sanitizer flips exact Bernoulli(p) coins (samplers.bernoulli) for the
    float p = pi_i (or fl(pi_i / q_i)): the realized delta must be at least the exact
    rational hockey-stick divergence of those coins (computed here with Fractions, e^eps
    bounded from above by mpmath) and within the documented float slack of it. The old
    computation used ceil(2^53 p) / 2^53, the law of a grid uniform, not of these coins."""
    import mpmath
    eps, delta, m = 0.5, 1e-6, 40
    sampling, t = ("ppswor", 0.05) if presampled else ("none", None)
    keep = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    q = pws.sampling_probabilities(m, sampling=sampling, sampling_threshold=t) if presampled else None
    got = pws.realized_delta(eps, keep, None, sampling_probabilities=q)
    with mpmath.workdps(60):
        e_hi = Fraction(str(mpmath.exp(mpmath.mpf(eps)) * (1 + mpmath.mpf(10) ** -50)))
        e_lo = Fraction(str(mpmath.exp(mpmath.mpf(eps)) * (1 - mpmath.mpf(10) ** -50)))
    worst_lo = worst_hi = Fraction(0)
    for i in range(1, m + 1):
        if q is None:
            a, b = Fraction(float(keep[i])), Fraction(float(keep[i - 1]))
        else:
            a = Fraction(float(q[i])) * Fraction(float(keep[i] / q[i]))
            b = (Fraction(float(q[i - 1])) * Fraction(float(keep[i - 1] / q[i - 1]))
                 if q[i - 1] > 0 else Fraction(0))
        for x, y in ((a, b), (b, a)):
            hi = max(0, x - e_lo * y) + max(0, (1 - x) - e_lo * (1 - y))
            lo = max(0, x - e_hi * y) + max(0, (1 - x) - e_hi * (1 - y))
            worst_hi, worst_lo = max(worst_hi, hi), max(worst_lo, lo)
    assert Fraction(got) >= worst_hi
    assert Fraction(got) - worst_lo <= Fraction(2) ** -50 * (1 + e_hi)


@pytest.mark.parametrize("presampled", [False, True])
def test_realized_delta_matches_exact_rational_enumeration(presampled):
    eps, delta, m = 0.5, 0.01, 10
    sampling, t = ("ppswor", 0.3) if presampled else ("none", None)
    table = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    keep = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    q = pws.sampling_probabilities(m, sampling=sampling, sampling_threshold=t) if presampled else None
    got = pws.realized_delta(eps, keep, table, sampling_probabilities=q)
    e = Fraction(math.exp(eps))
    worst = Fraction(0)
    for i in range(1, m + 1):
        a = realized_row_fractions(table, i, None if q is None else float(q[i]))
        b = realized_row_fractions(table, i - 1, None if q is None else float(q[i - 1])) \
            if i > 1 else {0: Fraction(1)}
        outcomes = set(a) | set(b)
        for x, y in ((a, b), (b, a)):
            # the max over all sets J is attained at J = {outcomes with x > e y}
            worst = max(worst, sum(max(Fraction(0), x.get(o, 0) - e * y.get(o, 0))
                                   for o in outcomes))
    # never below the exact divergence of the law drawn, and above it by at most the
    # documented rounding slack (accounting.pws.core._table_slack); e as a Fraction of the
    # float e^eps, within 2^-52 relative of e^eps, is covered by the slack's 2u per e
    assert Fraction(got) >= worst
    assert Fraction(got) - worst <= Fraction(2) ** -53 * (16 * (1 + e) + 100 * worst)
    assert got > delta * 0.999  # the construction is tight


@pytest.mark.parametrize("kwargs", [
    dict(),
    dict(report="keys"),
    dict(sampling="ppswor", sampling_threshold=0.05),
    dict(sampling="priority", sampling_threshold=0.01, estimator="biased_down"),
    dict(sampling="ppswor", sampling_threshold=0.05, presampled=True),
    dict(sampling="priority", sampling_threshold=0.01, report="keys", presampled=True),
    dict(max_frequency=40),
])
def test_calibrate_meets_the_budget_for_the_sampled_distributions(kwargs):
    eps, delta, c = 1.0, 1e-6, 4
    p = pws.calibrate(eps, delta, c, **kwargs)
    assert p.key_delta_realized <= p.key_delta
    assert p.delta_realized <= delta
    q = pws.sampling_probabilities(p.max_frequency, sampling=p.sampling,
                                   sampling_threshold=p.sampling_threshold) if p.presampled else None
    tables = pws.release_tables(p)
    again = pws.realized_delta(p.key_epsilon, tables.keep, tables.table, sampling_probabilities=q,
                               beyond_table=p.beyond_table)
    assert again == p.key_delta_realized
    assert pws.composed_delta(p.key_epsilon, again, c, eps) <= delta
    if p.report == "keys" and "max_frequency" not in kwargs:
        assert tables.keep[-1] == 1.0 and p.saturation_frequency == p.max_frequency


def test_release_tables_extrapolate_estimates_like_a_longer_table():
    for estimator, rel in (("mle", 1e-12), ("biased_down", 2e-3)):
        p = pws.calibrate(0.5, 1e-4, 1, estimator=estimator)
        tables = pws.release_tables(p)
        band = pws_core._build_band(pws.sampling_probabilities(p.max_frequency), p.key_epsilon,
                               p.table_delta)
        width = len(band.row(p.max_frequency))
        longer = pws_core._band_to_csr(pws_core._shift_extend(band, 12 * width))
        fn = pws.mle_estimates if estimator == "mle" else pws.biased_down_estimates
        direct = fn(longer)
        tokens = np.arange(1, p.max_frequency + 10 * width)
        assert np.allclose(tables.estimate(tokens), direct[tokens], rtol=rel)


def test_calibrate_rejects_bad_arguments():
    with pytest.raises(ValueError, match="sampling_threshold"):
        pws.calibrate(1.0, 1e-6, 1, sampling="ppswor")
    with pytest.raises(ValueError, match="sampling_threshold"):
        pws.calibrate(1.0, 1e-6, 1, sampling="none", sampling_threshold=0.1)
    with pytest.raises(ValueError, match="report"):
        pws.calibrate(1.0, 1e-6, 1, report="frequencies")
    with pytest.raises(ValueError, match="max_frequency"):
        pws.calibrate(1.0, 1e-6, 1, max_frequency=0)
    with pytest.raises(ValueError, match="delta"):
        pws.calibrate(1.0, 1.5, 1)


def test_weight_must_be_non_decreasing():
    with pytest.raises(ValueError, match="non-decreasing"):
        pws.sampling_probabilities(10, sampling="priority", sampling_threshold=0.1,
                                   weight=lambda w: 2.0 + np.cos(w))


def test_vectorised_realized_delta_equals_the_row_by_row_loop(monkeypatch):
    for sampling, t in SCHEMES[:3]:
        table = pws.frequency_table(0.2, 1e-6, 400, sampling=sampling, sampling_threshold=t)
        keep = pws.keep_probabilities(0.2, 1e-6, 400, sampling=sampling, sampling_threshold=t)
        q = pws.sampling_probabilities(400, sampling=sampling, sampling_threshold=t)
        fast = [pws.realized_delta(0.2, keep, table, sampling_probabilities=x) for x in (None, q)]
        with monkeypatch.context() as patch:
            patch.setattr(pws_core, "_band_layout", lambda t: None)
            slow = [pws.realized_delta(0.2, keep, table, sampling_probabilities=x)
                    for x in (None, q)]
        assert fast == pytest.approx(slow, rel=1e-14)


def test_release_tables_rebuild_the_calibrated_band_exactly():
    p = pws.calibrate(0.7, 1e-7, 3, sampling="priority", sampling_threshold=0.01)
    cached = pws.release_tables(p)
    pws_core._BANDS.clear()
    pws.release_tables.cache_clear()
    rebuilt = pws.release_tables(p)
    assert np.array_equal(cached.keep, rebuilt.keep)
    assert (cached.table != rebuilt.table).nnz == 0
    assert np.array_equal(cached.estimates, rebuilt.estimates)


def test_tables_too_large_for_the_entry_budget_are_clipped(monkeypatch):
    monkeypatch.setattr(pws_core, "MAX_TABLE_ENTRIES", 5000)
    p = pws.calibrate(0.5, 1e-8, 1, sampling="ppswor", sampling_threshold=0.01)
    assert p.beyond_table == "clip"
    tables = pws.release_tables(p)
    assert tables.table.nnz - (p.max_frequency + 1) <= 5000
    assert p.key_delta_realized <= p.key_delta
    assert tables.keep[-1] < 1.0


def test_explicit_max_frequency_too_large_for_a_table_is_refused(monkeypatch):
    monkeypatch.setattr(pws_core, "MAX_TABLE_ENTRIES", 5000)
    with pytest.raises(ValueError, match="max_frequency 400 needs a frequency table"):
        pws.calibrate(0.5, 1e-8, 1, max_frequency=400)
    assert pws.calibrate(0.5, 1e-8, 1, max_frequency=400, report="keys").max_frequency == 400


@pytest.mark.parametrize("layout", ["dense", "int32_sparse", "int64_sparse"])
@pytest.mark.parametrize("sampling,t", SCHEMES[:2])
def test_estimators_take_dense_and_int32_indexed_tables(layout, sampling, t):
    """mle_estimates / biased_down_estimates accept the dense table their docstrings allow
    and int32-indexed sparse tables (scipy's default for small ones) and agree with the
    naive definitions (issue 18: an int64 sentinel wrapped to -1 under int32 indices)."""
    import scipy.sparse
    eps, delta, m = 0.5, 0.1, 12
    t_sparse = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    table = t_sparse.toarray()
    pi = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    given = {"dense": table,
             "int32_sparse": scipy.sparse.csr_array(
                 (t_sparse.data, t_sparse.indices.astype(np.int32),
                  t_sparse.indptr.astype(np.int32)), shape=t_sparse.shape),
             "int64_sparse": t_sparse}[layout]
    mle = pws.mle_estimates(given)
    assert np.allclose(mle, naive_mle(table, pi), rtol=1e-12)
    assert mle[1] < mle[m]          # the bug gave g(M)/pi_M for every token
    assert np.allclose(pws.biased_down_estimates(given), naive_biased_down(table, pi), rtol=1e-7)


@pytest.mark.parametrize("eps,delta,report", [(1.0, 1e-15, "keys_and_frequencies"),
                                              (20.0, 1e-8, "keys_and_frequencies"),
                                              (100.0, 1e-8, "keys_and_frequencies"),
                                              (20.0, 1e-8, "keys")])
def test_calibration_below_float_granularity_stops_with_an_error(eps, delta, report):
    """When the rounding of the sampled distributions alone exceeds the per-key delta the
    margin would reach 1 (tables at delta <= 0): calibrate says so instead of looping
    (issue 18: these plans ran until killed). pipelines.common.limits refuses such specs first,
    using rounding_excess, which must then exceed the per-key delta."""
    with pytest.raises(ValueError, match="below what floating-point sampling can verify"):
        pws.calibrate(eps, delta, 1, report=report)
    assert pws.rounding_excess(eps, delta, report) > delta


@pytest.mark.parametrize("eps,delta,c,report", [(1.0, 1e-14, 1, "keys_and_frequencies"),
                                                (1.0, 1e-8, 10_000, "keys_and_frequencies"),
                                                (12.0, 1e-8, 1, "keys"),
                                                (10.0, 1e-8, 1, "keys_and_frequencies")])
def test_rounding_excess_accepts_what_calibrates(eps, delta, c, report):
    """The planning estimate is not so pessimistic that it refuses what verifies."""
    p = pws.calibrate(eps, delta, c, report=report)
    assert pws.rounding_excess(p.key_epsilon, p.key_delta, report) <= p.key_delta

"""accounting.pws.pld: weighted_sampling's composition pld (Gaussian-tradeoff keep tables).

Independent checks: the composed bound against exact hockey-stick divergences of the
products of the per-key coins actually drawn (brute force over every vector of
frequencies on small cases; all 2^C outcomes, or the binomial count of reported keys for
identical keys), against dp_accounting's PLD composition (an oracle used only here) for
mixed vectors at C = 8, and scipy's normal functions against mpmath at 50 digits."""
import itertools
import math

import mpmath
import numpy as np
import pytest
from scipy import special, stats

from thresher.accounting import pws
from thresher.accounting.pws import pld as pws_pld


def _none_table(budget, max_length=100_000):
    keep, _, _ = pws_pld.build(lambda m: pws.sampling_probabilities(m), budget, max_length)
    return keep


def _exact_product_delta(a, b, epsilon):
    """max over both directions of the exact hockey-stick divergence between the products
    of Bernoulli(b[:, j]) (with the user) and Bernoulli(a[:, j]) (without), per row."""
    n, c = a.shape
    up, down = np.zeros(n), np.zeros(n)
    e = math.exp(epsilon)
    for bits in itertools.product((False, True), repeat=c):
        bits = np.array(bits)
        pa = np.prod(np.where(bits, a, 1 - a), axis=1)
        pb = np.prod(np.where(bits, b, 1 - b), axis=1)
        up += np.maximum(0.0, pb - e * pa)
        down += np.maximum(0.0, pa - e * pb)
    return np.maximum(up, down)


@pytest.mark.parametrize("epsilon,delta,c", [(1.0, 1e-3, 3), (1.0, 1e-4, 2), (2.0, 1e-2, 4)])
def test_every_frequency_vector_stays_within_the_composed_bound(epsilon, delta, c):
    """Brute force over ALL vectors (i_1..i_C), i_j in 1..M+1 (M+1: beyond the table),
    and all 2^C outcomes: the worst exact delta is <= the bound (3). The worst vector
    reaches a good part of it (>= 0.3: the bound is not vacuous)."""
    budget = pws_pld.best_budget(epsilon, delta, c)
    keep = _none_table(budget)
    m = len(keep) - 1
    reported = np.concatenate([keep, [keep[-1]]])
    vectors = np.array(list(itertools.product(range(1, m + 2), repeat=c)))
    worst = _exact_product_delta(reported[vectors - 1], reported[vectors], epsilon)
    bound = pws_pld.composed_delta(epsilon, budget.mu, budget.delta0, c)
    assert bound <= delta
    assert worst.max() <= bound
    assert worst.max() >= 0.3 * bound


# (sampling, sampling_threshold, presampled): the coins as the sanitizer draws them
_SAMPLINGS = [("none", None, False), ("ppswor", 1e-3, False), ("priority", 1e-3, False),
              ("ppswor", 1e-2, True), ("priority", 1e-2, True)]


def _drawn_coins(params):
    """The probability that a key at frequency i is reported, i = 0..M, as drawn: the
    keep table's Bernoulli(pi_i), or for pre-sampled input q_i x fl(pi_i / q_i) (the
    sample kept the key with probability q_i, the sanitizer flips fl(pi_i / q_i))."""
    keep = pws.release_tables(params).keep
    if not params.presampled:
        return keep
    q = pws.sampling_probabilities(len(keep) - 1, sampling=params.sampling,
                                   sampling_threshold=params.sampling_threshold)
    safe = np.where(q > 0, q, 1.0)
    return np.where(q > 0, q * (keep / safe), 0.0)


def _pld_params(epsilon, delta, c, sampling, threshold, presampled):
    params = pws.calibrate(epsilon, delta, c, report="keys", composition="pld",
                           sampling=sampling, sampling_threshold=threshold, presampled=presampled)
    assert params.key_mu is not None and params.presampled == presampled
    return params


@pytest.mark.parametrize("sampling,threshold,presampled", _SAMPLINGS)
@pytest.mark.parametrize("c", [8, 64])
def test_identical_keys_exact_binomial_delta_within_bound(c, sampling, threshold, presampled):
    """C keys at the same frequency i (every i of the table): the number of reported keys
    is a sufficient statistic, so the exact delta is a sum over k = 0..C of binomial
    terms; its maximum over i is <= the bound and the release's delta_realized. For every
    sampling, on the coins as drawn (pre-sampled: q x fl(pi / q))."""
    params = _pld_params(1.0, 1e-6, c, sampling, threshold, presampled)
    keep = _drawn_coins(params)
    k = np.arange(c + 1)
    worst = 0.0
    for a, b in zip(keep[:-1], keep[1:]):
        pa, pb = stats.binom.pmf(k, c, a), stats.binom.pmf(k, c, b)
        assert np.all(np.isfinite(pa)) and np.all(np.isfinite(pb))
        worst = max(worst, np.maximum(0, pb - math.e * pa).sum(), np.maximum(0, pa - math.e * pb).sum())
    assert worst <= params.delta_realized <= 1e-6


@pytest.mark.parametrize("sampling,threshold,presampled", _SAMPLINGS)
@pytest.mark.parametrize("epsilon,delta,c", [(1.0, 1e-8, 8), (1.0, 1e-6, 64)])
def test_key_delta_realized_is_the_drawn_coins_divergence(epsilon, delta, c, sampling, threshold,
                                                          presampled):
    """key_delta_realized is the per-key delta at key_epsilon of the coins as drawn: at
    least the largest two-outcome hockey-stick divergence between consecutive
    frequencies (computed here directly), within key_delta = 2 delta0, and above delta0
    (one key with tradeoff max(0, G_mu - delta0) is (eps0, 2 delta0)-DP; reporting delta0
    understated it: 1.24e-9 against 6.25e-10 at C = 8, delta = 1e-8)."""
    params = _pld_params(epsilon, delta, c, sampling, threshold, presampled)
    coins = _drawn_coins(params)
    e = math.exp(params.key_epsilon)
    a, b = coins[:-1], coins[1:]
    up = np.maximum(0, b - e * a) + np.maximum(0, (1 - b) - e * (1 - a))
    down = np.maximum(0, a - e * b) + np.maximum(0, (1 - a) - e * (1 - b))
    divergence = float(np.maximum(up, down).max())
    assert params.key_delta_realized >= divergence
    assert params.key_delta_realized <= params.key_delta == 2 * params.key_delta0
    assert params.key_delta_realized > params.key_delta0
    assert divergence > params.key_delta0


@pytest.mark.parametrize("sampling,threshold,presampled",
                         [_SAMPLINGS[0], _SAMPLINGS[2], _SAMPLINGS[3]])
def test_mixed_vectors_against_dp_accounting_pld(sampling, threshold, presampled):
    """dp_accounting's PLD (pessimistic, its own discretisation) composing the actual coins
    (as drawn, for sampling none, priority and pre-sampled ppswor) of random mixed
    frequency vectors at C = 8: always <= our bound (with its discretisation slack), and
    the bound is the release's delta."""
    from dp_accounting.pld import privacy_loss_distribution as pld
    params = _pld_params(1.0, 1e-6, 8, sampling, threshold, presampled)
    keep = _drawn_coins(params)
    rng = np.random.default_rng(7)
    m = len(keep) - 1
    half = pws_pld.half_frequency(keep)
    for trial in range(6):
        # one vector around the middle (where the coins' losses are largest), others anywhere
        centre = half if trial % 2 == 0 else rng.integers(1, m + 1)
        freqs = np.clip(centre + rng.integers(-5, 6, size=8), 1, m)
        total = None
        for i in freqs:
            a, b = keep[i - 1], keep[i]
            lower = {o: math.log(p) for o, p in ((0, 1 - a), (1, a)) if p > 0}
            upper = {o: math.log(p) for o, p in ((0, 1 - b), (1, b)) if p > 0}
            one = pld.from_two_probability_mass_functions(lower, upper,
                                                          value_discretization_interval=1e-4)
            total = one if total is None else total.compose(one)
        oracle = total.get_delta_for_epsilon(1.0)
        assert oracle <= params.delta_realized * 1.01 + 1e-12


@pytest.mark.parametrize("epsilon,mu", [(1.0, 0.19), (0.5, 0.1), (2.0, 1.0), (1.0, 2.0)])
def test_gaussian_delta_matches_dp_accounting(epsilon, mu):
    """delta_G(eps; mu) of (3) against dp_accounting's Gaussian PLD (sigma = 1/mu)."""
    from dp_accounting.pld import privacy_loss_distribution as pld
    ours = pws_pld.gaussian_delta(epsilon, mu)
    oracle = pld.from_gaussian_mechanism(1.0 / mu, value_discretization_interval=1e-4) \
        .get_delta_for_epsilon(epsilon)
    assert ours == pytest.approx(oracle, rel=2e-2)
    assert ours >= oracle * 0.98


def test_scipy_composite_within_rho():
    """RHO bounds the relative error of Phi(Phi^-1(x) + mu) (and of Phi(-(Phi^-1(x) + mu)))
    as scipy computes it: checked against mpmath at 50 digits, with 100x to spare."""
    mpmath.mp.dps = 50
    rng = np.random.default_rng(3)
    xs = np.concatenate([10.0 ** -rng.uniform(0, 300, 60), 1 - 10.0 ** -rng.uniform(1, 15.9, 40),
                         rng.uniform(0, 1, 40)])
    mus = 10.0 ** rng.uniform(-4, math.log10(8), len(xs))
    worst = 0.0
    for x, mu in zip(xs, mus):
        target = mpmath.mpf(float(x))
        z_exact = mpmath.findroot(lambda z: mpmath.log(mpmath.ncdf(z)) - mpmath.log(target),
                                  float(special.ndtri(x)))
        for sign in (1, -1):
            exact = mpmath.ncdf(sign * (z_exact + mpmath.mpf(float(mu))))
            ours = special.ndtr(sign * (special.ndtri(x) + mu))
            if exact > 1e-300:
                worst = max(worst, float(abs(ours - exact) / exact))
    assert worst < pws_pld.RHO / 100


def test_verification_catches_a_table_built_for_a_larger_mu_or_delta0():
    """verify passes on the table calibrate builds and fails when the table was built for
    a 1% larger mu or a 1% larger delta0 than the accounting (mutations)."""
    budget = pws_pld.best_budget(1.0, 1e-8, 8)
    q = pws.sampling_probabilities(1000)
    keep, mu_b, d_b = pws_pld.build(lambda m: pws.sampling_probabilities(m), budget, 1000)
    assert pws_pld.verify(keep, budget.mu, budget.delta0)
    for mu, d0 in ((budget.mu * 1.01, budget.delta0), (budget.mu, budget.delta0 * 1.01)):
        wide = pws_pld.keep_probabilities(q, mu, d0)
        assert not pws_pld.verify(wide, budget.mu, budget.delta0)
    # composition ignored: tables for one key, accounted for eight
    single = pws_pld.best_budget(1.0, 1e-8, 2)
    assert not pws_pld.verify(pws_pld.keep_probabilities(q, single.mu * math.sqrt(2) ** 2,
                                                         single.delta0),
                              budget.mu, budget.delta0)


@pytest.mark.parametrize("sampling,threshold", [("none", None), ("ppswor", 1e-3), ("priority", 1e-3)])
@pytest.mark.parametrize("epsilon,delta,c", [(1.0, 1e-8, 2), (1.0, 1e-8, 3), (1.0, 1e-8, 8),
                                             (1.0, 1e-8, 64), (0.5, 1e-6, 16), (2.0, 1e-10, 128)])
def test_pld_is_never_worse_than_optimal(sampling, threshold, epsilon, delta, c):
    """pld's keep table reports every frequency with at least optimal's probability minus
    delta, reaches 1/2 and saturates no later (the fallback guarantees it), and its
    composed delta is within the budget. At C = 2, 3 (delta 1e-8) optimal's tables are
    used: the Gaussian table would be lower in the upper half."""
    kw = dict(report="keys", sampling=sampling, sampling_threshold=threshold)
    pld_p = pws.calibrate(epsilon, delta, c, composition="pld", **kw)
    opt_p = pws.calibrate(epsilon, delta, c, composition="optimal", **kw)
    pld_keep, opt_keep = pws.release_tables(pld_p).keep, pws.release_tables(opt_p).keep
    assert pws_pld.half_frequency(pld_keep) <= pws_pld.half_frequency(opt_keep)
    assert len(pld_keep) <= len(opt_keep)
    padded = np.concatenate([pld_keep, np.ones(len(opt_keep) - len(pld_keep))])
    assert np.all(padded >= opt_keep - delta)   # at every frequency, up to delta
    assert pld_p.delta_realized <= delta and pld_p.composition == "pld"
    if pld_p.key_mu is not None:
        assert pws_pld.verify(pld_keep, pld_p.key_mu_verified, pld_p.key_delta0)


def test_gain_at_c8_and_larger_c():
    """The figures of docs/weighted_sampling.md ("Tight composition across a user's keys"):
    at eps = 1, delta = 1e-8 the frequency where a key is reported with probability >= 1/2
    drops from 143 (optimal, = basic) to 88 at C = 8 and from 1115 to 365 at C = 128."""
    half = {}
    for c in (8, 64, 128):
        for comp in ("pld", "optimal", "basic"):
            p = pws.calibrate(1.0, 1e-8, c, report="keys", composition=comp)
            half[c, comp] = pws_pld.half_frequency(pws.release_tables(p).keep)
    assert half[8, "optimal"] == half[8, "basic"] == 143
    assert half[8, "pld"] == 88
    assert (half[64, "pld"], half[64, "optimal"], half[64, "basic"]) == (256, 758, 1136)
    assert (half[128, "pld"], half[128, "optimal"], half[128, "basic"]) == (365, 1115, 2273)


def test_presampled_pld_verifies_the_post_processing_coins():
    """Pre-sampled input: the coins are q x fl(pi / q); the table calibrate returns passes
    verify on those (with their rounding) and the release rebuilds the same table."""
    p = pws.calibrate(1.0, 1e-8, 8, report="keys", composition="pld", sampling="ppswor",
                      sampling_threshold=1e-2, presampled=True)
    assert p.key_mu is not None and p.presampled
    keep = pws.release_tables(p).keep
    q = pws.sampling_probabilities(len(keep) - 1, sampling="ppswor", sampling_threshold=1e-2)
    rep = np.where(q > 0, q * (keep / np.where(q > 0, q, 1)), 0.0)
    assert pws_pld.verify(rep, p.key_mu_verified, p.key_delta0, relative_error=1e-15)
    assert np.all(keep <= q)


def test_frequencies_refuse_pld():
    with pytest.raises(ValueError, match="report: keys"):
        pws.calibrate(1.0, 1e-8, 8, report="keys_and_frequencies", composition="pld")


def test_fallback_where_the_gaussian_table_is_lower_somewhere():
    """C = 3, delta = 1e-8: the Gaussian table reaches 1/2 at the same frequency but is
    lower than optimal's above it (by up to ~0.19), so pld releases with optimal's."""
    budget = pws_pld.best_budget(1.0, 1e-8, 3)
    keep, _, _ = pws_pld.build(lambda m: pws.sampling_probabilities(m), budget, 10_000)
    opt = pws.release_tables(pws.calibrate(1.0, 1e-8, 3, report="keys")).keep
    assert not pws_pld.no_worse(keep, opt, 1e-8)
    assert pws.calibrate(1.0, 1e-8, 3, report="keys", composition="pld").key_mu is None


def test_single_key_and_fixed_max_frequency_fall_back_to_optimal_tables():
    one = pws.calibrate(1.0, 1e-8, 1, report="keys", composition="pld")
    assert one.key_mu is None and one.composition == "pld"
    fixed = pws.calibrate(1.0, 1e-8, 8, report="keys", composition="pld", max_frequency=50)
    assert fixed.key_mu is None


def test_tables_longer_than_max_length_keep_optimal(monkeypatch):
    """The planning bound: optimal's table longer than pws_pld.MAX_LENGTH frequencies (a
    small sampling threshold) -> pld builds no Gaussian table and uses optimal's."""
    assert pws.calibrate(1.0, 1e-8, 8, report="keys", composition="pld").key_mu is not None
    monkeypatch.setattr(pws_pld, "MAX_LENGTH", 200)     # optimal's table at C = 8: 285
    p = pws.calibrate(1.0, 1e-8, 8, report="keys", composition="pld")
    assert p.key_mu is None and p.composition == "pld" and p.max_frequency == 285

"""accounting.laplace_threshold: Laplace thresholding, l0 and l1 (paper 002 Alg. 3) models.

Checked against brute-force sums over every joint output of small releases with the
discrete Laplace actually drawn (tests/accounting/threshold_brute_force.py), closed forms
for one key, paper 002's threshold, dp_accounting's discrete Laplace privacy loss
distribution, and search-minimality properties."""
import itertools
import math

import numpy as np
import pytest
from dp_accounting.pld import privacy_loss_distribution as pld
from hypothesis import given, settings, strategies as st

from thresher.accounting import laplace_threshold as lt
from tests.accounting import threshold_brute_force as brute


def laplace_noise(scale, mass_cut=1e-16):
    half = int(math.ceil(scale * math.log(1.0 / mass_cut))) + 1
    return brute.noise_table(lambda x: -np.abs(x) / scale, half)


def l1_configurations(records, pre_threshold, high_count):
    """Every user histogram h (positive counts, sum <= records) and every choice of which
    keys appear with the user (count tau - 1 + h_j with, tau - 1 without: the largest
    count that is below tau without the user) and which are shifted (high + h_j vs high)."""
    configs = []
    for k in range(1, records + 1):
        for h in itertools.combinations_with_replacement(range(1, records + 1), k):
            if sum(h) > records:
                continue
            for appear in itertools.product([True, False], repeat=k):
                with_user = [pre_threshold - 1 + hj if a else high_count + hj
                             for hj, a in zip(h, appear)]
                without = [pre_threshold - 1 if a else high_count for a in appear]
                configs.append((with_user, without))
    return configs


@pytest.mark.parametrize("c, eps, scale_factor, gap, tau", [
    (1, 1.0, 1.0, 6, 1), (2, 1.0, 1.0, 9, 2), (3, 2.0, 1.0, 5, 1),
    (2, 1.0, 0.5, 8, 1), (3, 2.0, 0.6, 6, 3), (2, 0.5, 0.7, 14, 1)])
def test_l0_discrete_delta_equals_brute_force_over_all_outputs(c, eps, scale_factor, gap, tau):
    """Exact, also below the default scale (the binomial privacy loss of discrete
    Laplace shifts is then part of the answer)."""
    scale = scale_factor * c / eps
    noise = laplace_noise(scale)
    high = tau + gap + len(noise[0])
    expected = brute.worst_delta(brute.l0_configurations(c, tau, high), noise, tau, tau + gap, eps)
    got = lt.delta(eps, scale, tau + gap, c, model="l0", pre_threshold=tau)
    assert expected > 1e-6  # noise mass cut at 1e-16 is then far below the tolerance
    assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("c, eps, gap, tau", [(1, 1.0, 5, 1), (2, 1.0, 8, 1), (3, 2.0, 6, 2),
                                              (3, 3.0, 5, 1)])
def test_l1_discrete_delta_equals_brute_force_at_the_default_scale(c, eps, gap, tau):
    """All user histograms with <= C records, every appear/shift split: the worst case
    is found by the (S_A - k + 1, 1, ..., 1) vertex argument, and it is exact at C/eps."""
    scale = lt.sensitivity_scale(c, eps)
    noise = laplace_noise(scale)
    high = tau + gap + len(noise[0])
    expected = brute.worst_delta(l1_configurations(c, tau, high), noise, tau, tau + gap, eps)
    got = lt.delta(eps, scale, tau + gap, c, model="l1", pre_threshold=tau)
    assert expected > 1e-6  # noise mass cut at 1e-16 is then far below the tolerance
    assert got == pytest.approx(expected, rel=1e-9)


@pytest.mark.parametrize("c, eps, scale_factor, gap", [(2, 1.0, 0.6, 8), (3, 2.0, 0.8, 5)])
def test_l1_discrete_delta_bounds_brute_force_below_the_default_scale(c, eps, scale_factor, gap):
    scale = scale_factor * c / eps
    noise = laplace_noise(scale)
    high = 1 + gap + len(noise[0])
    expected = brute.worst_delta(l1_configurations(c, 1, high), noise, 1, 1 + gap, eps)
    assert expected <= lt.delta(eps, scale, 1 + gap, c, model="l1") * (1 + 1e-9)


def test_one_key_continuous_laplace_closed_form():
    """C = 1, b = 1/eps: delta = P[Z >= T - tau] = exp(-(T - tau)/b) / 2."""
    for eps, gap in [(1.0, 10.0), (0.5, 37.3), (2.0, 4.2)]:
        got = lt.delta(eps, 1.0 / eps, 1 + gap, 1, noise="laplace")
        assert got == pytest.approx(0.5 * math.exp(-gap * eps), rel=1e-12)


def test_one_key_discrete_laplace_closed_form_and_continuous_under_reports():
    """Discrete: P[Z >= k] = q^k / (1 + q). At the same integer threshold the continuous
    formula (q^k / 2) under-reports it by a factor 2 / (1 + q): the anchors' bug class."""
    for eps, k in [(1.0, 10), (0.3, 50), (2.0, 4)]:
        q = math.exp(-eps)
        discrete = lt.delta(eps, 1.0 / eps, 1 + k, 1)
        assert discrete == pytest.approx(q ** k / (1 + q), rel=1e-12)
        continuous = lt.delta(eps, 1.0 / eps, 1 + k, 1, noise="laplace")
        assert discrete / continuous == pytest.approx(2 / (1 + q), rel=1e-12)
        assert discrete > continuous


@pytest.mark.parametrize("c", [1, 4, 16, 100])
@pytest.mark.parametrize("eps, target", [(1.0, 1e-8), (0.5, 1e-6), (2.0, 1e-10)])
def test_paper_002_threshold_meets_delta_and_exact_threshold_is_lower(c, eps, target):
    """Alg. 3's t = C + (C/eps) ln(C/(2 delta)) is (eps, delta)-DP (Lemma 5.1); the exact
    accounting agrees and finds a threshold no higher."""
    t = lt.paper_threshold(eps, target, c)
    # (for C = 1 the paper's union bound is exact: equality, up to float rounding)
    assert lt.delta(eps, c / eps, t, c, model="l1", noise="laplace") <= target * (1 + 1e-12)
    exact = lt.min_threshold(eps, target, lt.sensitivity_scale(c, eps), c, model="l1",
                             noise="laplace")
    assert exact <= t * (1 + 1e-9)  # equal for C = 1 (one key: the union bound is exact)


def test_shift_delta_matches_dp_accounting_discrete_laplace_pld():
    for scale, count in [(3.0, 1), (3.0, 5), (8.0, 8)]:
        peer = pld.from_discrete_laplace_mechanism(1.0 / scale, value_discretization_interval=1e-5)
        if count > 1:
            peer = peer.self_compose(count)
        for eps in [0.1, 0.5, 0.9]:
            ours = lt.shift_delta(count, eps, scale)
            theirs = peer.get_delta_for_epsilon(eps)
            assert ours <= theirs * (1 + 1e-9) + 1e-15
            assert theirs == pytest.approx(ours, rel=1e-3, abs=1e-12)


def test_rr_delta_both_tails():
    p = math.exp(1.0) / (1 + math.exp(1.0))
    for e in [-2.0, -0.5, 0.0, 0.5, 1.5]:
        expected = max(p - math.exp(e) * (1 - p), 0) + max(1 - p - math.exp(e) * p, 0)
        assert lt.rr_delta(1.0, e) == pytest.approx(expected, rel=1e-14, abs=1e-300)


@settings(max_examples=40, deadline=None)
@given(eps=st.floats(0.1, 3.0), c=st.integers(1, 200), scale_factor=st.floats(0.3, 2.0),
       gap=st.floats(0.0, 400.0), model=st.sampled_from(lt.MODELS),
       noise=st.sampled_from(lt.NOISES))
def test_delta_in_unit_interval_and_falls_with_threshold(eps, c, scale_factor, gap, model, noise):
    scale = scale_factor * c / eps
    d = lt.delta(eps, scale, 1 + gap, c, model=model, noise=noise)
    assert 0.0 <= d <= 1.0
    assert lt.delta(eps, scale, 2 + gap, c, model=model, noise=noise) <= d + 1e-15


@settings(max_examples=30, deadline=None)
@given(eps=st.floats(0.1, 3.0), log10_delta=st.floats(-12, -3), c=st.integers(1, 300),
       model=st.sampled_from(lt.MODELS), noise=st.sampled_from(lt.NOISES),
       tau=st.integers(1, 20))
def test_calibrated_threshold_is_the_smallest_qualifying(eps, log10_delta, c, model, noise, tau):
    target = 10.0 ** log10_delta
    params = lt.calibrate(eps, target, c, model=model, noise=noise, pre_threshold=tau)
    assert params.delta <= target
    assert params.scale * eps >= c and params.scale == pytest.approx(c / eps, rel=1e-15)
    kw = dict(model=model, noise=noise, pre_threshold=tau)
    if noise == "discrete_laplace":
        assert isinstance(params.threshold, int)
        smaller = params.threshold - 1
    else:
        smaller = tau + (params.threshold - tau) * (1 - 1e-6)
    if smaller >= tau:
        assert lt.delta(eps, params.scale, smaller, c, **kw) > target


@settings(max_examples=20, deadline=None)
@given(eps=st.floats(0.2, 3.0), log10_delta=st.floats(-12, -4), c=st.integers(1, 60),
       extra=st.floats(1.0, 1.6), model=st.sampled_from(lt.MODELS))
def test_min_scale_is_the_smallest_qualifying_scale(eps, log10_delta, c, extra, model):
    target = 10.0 ** log10_delta
    base = lt.calibrate(eps, target, c, model=model)
    threshold = int(base.pre_threshold + (base.threshold - base.pre_threshold) * extra) + 1
    scale = lt.min_scale(eps, target, threshold, c, model=model)
    assert scale is not None
    assert lt.delta(eps, scale, threshold, c, model=model) <= target
    assert lt.delta(eps, scale * (1 - 1e-6), threshold, c, model=model) > target


def test_calibrate_branches_and_errors():
    p = lt.calibrate(1.0, 1e-8, 8)
    assert (p.scale, p.threshold, p.model, p.noise) == (8.0, 160, "l0", "discrete_laplace")
    assert lt.calibrate(1.0, 1e-8, 8, threshold=200).threshold == 200
    both = lt.calibrate(1.0, 1e-8, 8, scale=8.0, threshold=200)
    assert both.delta == lt.delta(1.0, 8.0, 200, 8) <= 1e-8
    with pytest.raises(ValueError, match="threshold >= 160"):
        lt.calibrate(1.0, 1e-8, 8, scale=8.0, threshold=100)
    with pytest.raises(ValueError, match="too low"):
        lt.calibrate(1.0, 1e-8, 8, threshold=100)
    with pytest.raises(ValueError, match="too small"):
        lt.calibrate(1.0, 1e-8, 8, scale=1.0)
    with pytest.raises(ValueError, match="model"):
        lt.calibrate(1.0, 1e-8, 8, model="l2")
    with pytest.raises(ValueError, match="pre_threshold"):
        lt.calibrate(1.0, 1e-8, 8, pre_threshold=0)

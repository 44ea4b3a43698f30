"""Empirical audit of the continual release's design (``accounting.continual``) at
inflated parameters (T = 4, C = 1, sigma = 4, the selection delta ~ 1e-3 so that it is
measurable): one key's whole published series over the horizon -- released or not at
each period, and its noisy cumulative count -- under the tree's shared node noise, on
the three neighbouring pairs the argument distinguishes:

- ``lone``: only the added user holds the key (tested in D' only, at every period);
- ``early``: the added user reaches the key at period 1, the others at period 3 (tested
  early in D' only, then in both: the case the hybrid argument exists for);
- ``shift``: the key is held by many users from period 1 (the tree's zCDP alone).

The claim audited is (epsilon, delta_conv + delta_sel) with epsilon the CKS conversion of
rho at delta_conv. False failure <= 1e-3 per honest test (the auditor's confidence
0.999); the mutation (a threshold and a claim made for one period, without the union
over the horizon's periods) must be flagged.
Seeds fixed."""
import numpy as np
import pytest

from tests.audit import auditor
from thresher.accounting import continual as acc
from thresher.accounting import zcdp
from thresher.transforms.randomness import samplers

pytestmark = [pytest.mark.audit, pytest.mark.slow]

T, SIGMA, DELTA_CONV = 4, 4.0, 1e-3
_BASE, _HALF = 64, 31           # per-period code: 0 absent, else the value clipped around its count


def _threshold():
    """The least tau whose selection delta is <= 2e-3 (C = 1)."""
    tau = 2
    while acc.selection_delta(SIGMA, tau, T, 1) > 2e-3:
        tau += 1
    return tau


TAU = _threshold()


def _runner(cumulative):
    """f(rng, n): n independent runs of one key's series with true cumulative counts
    ``cumulative`` (periods 1..T), coded as one ordered-free integer per run."""
    nodes = sorted({n for t in range(1, T + 1) for n in acc.prefix_nodes(t)})

    def run(rng, n):
        noise = {node: samplers.discrete_gaussian(rng, SIGMA, n) for node in nodes}
        released = np.zeros(n, dtype=bool)
        code = np.zeros(n, dtype=np.int64)
        for t in range(1, T + 1):
            count = cumulative[t - 1]
            column = np.zeros(n, dtype=np.int64)
            if count >= 1:                   # only keys some user has reached are tested
                value = count + sum(noise[node] for node in acc.prefix_nodes(t))
                released |= value >= TAU
                # post-processing shared by both sides: clip around a fixed centre
                centre = 20
                column = np.where(released, 1 + np.clip(value - centre + _HALF, 0, _BASE - 2), 0)
            code = code * _BASE + column
        return code
    return run


PAIRS = {
    "lone": ([0, 0, 0, 0], [1, 1, 1, 1]),
    "early": ([0, 0, 12, 12], [1, 1, 13, 13]),
    "shift": ([20, 20, 21, 21], [21, 21, 22, 22]),
}


def _claim(include_selection=True):
    rho = zcdp.gaussian_rho(acc.levels(T), SIGMA)          # C = 1
    epsilon = zcdp.epsilon_of_rho(rho, DELTA_CONV)
    delta = DELTA_CONV + (acc.selection_delta(SIGMA, TAU, T, 1) if include_selection else 0.0)
    return epsilon, delta


@pytest.mark.parametrize("pair", sorted(PAIRS))
def test_the_series_stays_within_its_claim(pair):
    d, d_prime = PAIRS[pair]
    epsilon, delta = _claim()
    result = auditor.audit(_runner(d), _runner(d_prime), claimed_epsilon=epsilon,
                           claimed_delta=delta, trials=400_000, seed=45, events="likelihood")
    assert not result.violated, f"{pair}: {result.summary()}"


def test_a_threshold_without_the_union_over_periods_is_flagged():
    global TAU
    one_period = acc.gaussian_sum_tail            # P(S_1 >= tau - 1): period 1 alone
    tau = 2
    while one_period(SIGMA, 1, tau - 1) > 2e-3:
        tau += 1
    saved, TAU = TAU, tau
    try:
        rho = zcdp.gaussian_rho(acc.levels(T), SIGMA)
        epsilon = zcdp.epsilon_of_rho(rho, DELTA_CONV)
        delta = DELTA_CONV + one_period(SIGMA, 1, tau - 1)
        d, d_prime = PAIRS["lone"]
        result = auditor.audit(_runner(d), _runner(d_prime), claimed_epsilon=epsilon,
                               claimed_delta=delta, trials=400_000, seed=45,
                               events="likelihood")
    finally:
        TAU = saved
    assert result.violated, result.summary()

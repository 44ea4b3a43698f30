"""Empirical audits of every release mechanism at its calibrated parameters.

Each scenario (tests/audit/scenarios.py) runs the mechanism's real kernel 10^6 times per
side (4x10^4 for the exponential mechanism, 2x10^5 for the bounding pipeline) at
inflated budgets (epsilon = 1, delta ~ 1e-3) and computes a Clopper-Pearson lower bound
on epsilon at the claimed delta. A correct mechanism stays at or below its claim; the
bound holding is a 0.999-probability event (false failure <= 1e-3 per test; seeds are
fixed). The "power" assertion shows each audit actually sees the privacy loss it
should: for pairs whose loss is a shift, the bound must reach a stated fraction of the
claimed epsilon (an auditor that cannot see anything cannot fail either).

Scenarios whose kernel module is not in the tree yet are skipped with the reason.
"""
import math

import numpy as np
import pytest
from scipy import stats

from tests.audit import scenarios

pytestmark = pytest.mark.audit


def _build(builder):
    try:
        return builder()
    except scenarios.MissingKernel as err:
        pytest.skip(str(err))


# The exponential mechanism's audit (9 s on the 2-core machine) runs in the slow suite,
# which CI runs (docs/development.md, "The slow suite").
SLOW = {"exponential_mechanism"}


@pytest.mark.parametrize("builder,power", [
    pytest.param(b, p, id=name, marks=[pytest.mark.slow] if name in SLOW else [])
    for name, b, p in scenarios.HONEST])
def test_mechanism_stays_within_its_claim(builder, power):
    scenario = _build(builder)
    result = scenario.audit(seed=11)
    assert not result.violated, f"{scenario.name} ({scenario.parameters}): {result.summary()}"
    if power is not None:
        assert result.epsilon_lower_bound >= power * scenario.claimed_epsilon, result.summary()


@pytest.mark.parametrize("module,keys", [("gshm", 1), ("gshm", 4), ("laplace", 1), ("laplace", 3)])
def test_release_rate_at_the_pre_threshold_matches_the_accounting(module, keys):
    """Monte Carlo check of the accounting's delta-carrying term: with all of a user's
    keys at the pre-threshold, the real kernel releases at least one of them with
    probability 1 - beta^C (paper 004 Lemma 5.1), beta from the exact discrete CDF.
    Binomial test, false failure 1e-4."""
    from thresher.accounting import gshm, laplace_threshold
    from thresher.transforms.selection.noisy_threshold import noisy_threshold
    if module == "gshm":
        p = gshm.calibrate(1.0, 1e-3, keys)
        noise, scale = "gaussian", p.sigma
        log_beta = gshm.log_beta(p.sigma, p.threshold - p.pre_threshold)
    else:
        p = laplace_threshold.calibrate(1.0, 1e-3, keys)
        noise, scale = "laplace", p.scale
        log_beta = laplace_threshold.log_suppress(p.scale, p.threshold - p.pre_threshold)
    n = 2_000_000
    keep, _ = noisy_threshold(np.full(n * keys, p.pre_threshold), noise=noise, scale=scale,
                              pre_threshold=p.pre_threshold, threshold=p.threshold,
                              rng=np.random.default_rng(12))
    any_released = int(keep.reshape(n, keys).any(axis=1).sum())
    expected = -math.expm1(keys * log_beta)
    assert stats.binomtest(any_released, n, expected).pvalue > 1e-4

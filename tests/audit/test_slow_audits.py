"""Heavier audits (``python -m pytest -m slow tests/audit``): every honest scenario at
ten times the trials of the default run, where the bounds come closer to the claims.
False failure <= 1e-3 per test (the auditor's confidence 0.999); seeds fixed."""
import pytest

from tests.audit import scenarios

pytestmark = [pytest.mark.audit, pytest.mark.slow]


@pytest.mark.parametrize("builder,power", [(b, p) for _, b, p in scenarios.HONEST],
                         ids=[name for name, _, _ in scenarios.HONEST])
def test_mechanism_stays_within_its_claim_at_ten_times_the_trials(builder, power):
    try:
        scenario = builder()
    except scenarios.MissingKernel as err:
        pytest.skip(str(err))
    result = scenario.audit(seed=17, trials=10 * scenario.trials)
    assert not result.violated, f"{scenario.name}: {result.summary()}"
    if power is not None:
        assert result.epsilon_lower_bound >= power * scenario.claimed_epsilon, result.summary()

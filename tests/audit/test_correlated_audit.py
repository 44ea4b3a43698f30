"""Empirical audit of the correlated kernel at C = 2 (``python -m pytest -m slow
tests/audit``): the real ``noisy_threshold`` with one shared draw per trial, at its
calibrated parameters and at a shared scale as large as the independent one, on the
pre-threshold, shift and mixed pairs, with and without witness keys that reveal the
shared draw. False failure <= 1e-3 per honest test (the auditor's confidence 0.999); the
mutation (an accounting that ignores the shared draw) must be flagged. Seeds fixed."""
import pytest

from tests.audit import scenarios

pytestmark = [pytest.mark.audit, pytest.mark.slow]

HONEST = [
    ("calibrated-pre_threshold", lambda: scenarios.correlated_gshm("pre_threshold"), None),
    ("calibrated-shift", lambda: scenarios.correlated_gshm("shift"), 0.4),
    ("calibrated-mixed", lambda: scenarios.correlated_gshm("mixed"), 0.2),
    ("wide-pre_threshold", lambda: scenarios.correlated_gshm("pre_threshold", shared_ratio=1.0), None),
    ("wide-shift+4w", lambda: scenarios.correlated_gshm("shift", shared_ratio=1.0, witnesses=4), 0.3),
    ("wide-mixed+4w", lambda: scenarios.correlated_gshm("mixed", shared_ratio=1.0, witnesses=4), 0.1),
]


@pytest.mark.parametrize("builder,power", [(b, p) for _, b, p in HONEST],
                         ids=[name for name, _, _ in HONEST])
def test_correlated_kernel_stays_within_its_claim(builder, power):
    scenario = builder()
    result = scenario.audit(seed=23)
    assert not result.violated, f"{scenario.name} ({scenario.parameters}): {result.summary()}"
    if power is not None:
        assert result.epsilon_lower_bound >= power * scenario.claimed_epsilon, result.summary()


def test_an_accounting_that_ignores_the_shared_draw_is_flagged():
    scenario = scenarios.correlated_gshm("pre_threshold", shared_ratio=1.0,
                                         mutation="shared ignored")
    result = scenario.audit(seed=23)
    assert result.violated, f"{scenario.name} ({scenario.parameters}): {result.summary()}"

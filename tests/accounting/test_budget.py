import pytest

from thresher.accounting.budget import Budget, BudgetExceededError


def test_stages_add_up_to_total_and_are_reported():
    budget = Budget(1.0, 1e-8)
    budget.spend("choose_contribution_bound", 0.1)
    budget.spend_rest("release")
    report = budget.as_report()
    assert [s["name"] for s in report["stages"]] == ["choose_contribution_bound", "release"]
    assert sum(s["epsilon"] for s in report["stages"]) == pytest.approx(1.0, rel=1e-15)
    assert sum(s["delta"] for s in report["stages"]) == pytest.approx(1e-8, rel=1e-15)


def test_overspending_is_refused():
    budget = Budget(1.0, 1e-6)
    budget.spend("a", 0.7, 5e-7)
    with pytest.raises(BudgetExceededError, match="epsilon 0.4"):
        budget.spend("b", 0.4)
    with pytest.raises(BudgetExceededError, match="delta"):
        budget.spend("c", 0.1, 6e-7)
    with pytest.raises(ValueError, match="already"):
        budget.spend("a", 0.1)


@pytest.mark.parametrize("epsilon,delta", [(0, 1e-8), (-1, 1e-8), (float("inf"), 1e-8), (1, 0), (1, 1)])
def test_invalid_totals(epsilon, delta):
    with pytest.raises(ValueError):
        Budget(epsilon, delta)

"""A release's privacy budget, split into named stages under basic composition.

A release spends (epsilon_i, delta_i) in each stage i (e.g. choosing the contribution
bound, then the release itself). Under basic composition (Dwork & Roth, Thm 3.16) the
release is (sum epsilon_i, sum delta_i)-DP; ``Budget`` refuses any spend that would
exceed the total it was opened with, so a report can never claim less than was spent.
"""
import dataclasses
import math

# Relative slack for float sums of stage budgets (e.g. 0.1 + 0.9 != 1.0 in binary).
_REL_TOL = 1e-12


class BudgetExceededError(ValueError):
    """A stage asked for more epsilon or delta than the budget has left."""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One differentially private step of a release and what it spent."""

    name: str
    epsilon: float
    delta: float

    def __post_init__(self):
        if not (math.isfinite(self.epsilon) and self.epsilon >= 0):
            raise ValueError(f"stage {self.name!r}: epsilon must be finite and >= 0, got {self.epsilon}")
        if not (0 <= self.delta < 1):
            raise ValueError(f"stage {self.name!r}: delta must be in [0, 1), got {self.delta}")

    def as_report(self):
        return {"name": self.name, "epsilon": self.epsilon, "delta": self.delta}


class Budget:
    """Total (epsilon, delta) of a release, spent stage by stage (basic composition)."""

    def __init__(self, epsilon, delta):
        if not (math.isfinite(epsilon) and epsilon > 0):
            raise ValueError(f"epsilon must be > 0, got {epsilon}")
        if not (0 < delta < 1):
            raise ValueError(f"delta must be in (0, 1), got {delta}")
        self.epsilon = float(epsilon)
        self.delta = float(delta)
        self._stages = []

    @property
    def stages(self):
        return tuple(self._stages)

    @property
    def spent_epsilon(self):
        return math.fsum(s.epsilon for s in self._stages)

    @property
    def spent_delta(self):
        return math.fsum(s.delta for s in self._stages)

    @property
    def remaining_epsilon(self):
        return max(0.0, self.epsilon - self.spent_epsilon)

    @property
    def remaining_delta(self):
        return max(0.0, self.delta - self.spent_delta)

    def spend(self, name, epsilon, delta=0.0):
        """Record a stage; raises BudgetExceededError if the total would be exceeded."""
        stage = Stage(name, float(epsilon), float(delta))
        if any(s.name == name for s in self._stages):
            raise ValueError(f"stage {name!r} is already in the budget")
        eps_total = math.fsum([self.spent_epsilon, stage.epsilon])
        delta_total = math.fsum([self.spent_delta, stage.delta])
        if eps_total > self.epsilon * (1 + _REL_TOL):
            raise BudgetExceededError(
                f"stage {name!r} needs epsilon {stage.epsilon:g} but only "
                f"{self.remaining_epsilon:g} of {self.epsilon:g} is left")
        if delta_total > self.delta * (1 + _REL_TOL):
            raise BudgetExceededError(
                f"stage {name!r} needs delta {stage.delta:g} but only "
                f"{self.remaining_delta:g} of {self.delta:g} is left")
        self._stages.append(stage)
        return stage

    def spend_rest(self, name):
        """Give every remaining unit of epsilon and delta to one final stage."""
        return self.spend(name, self.remaining_epsilon, self.remaining_delta)

    def as_report(self):
        return {
            "epsilon": self.epsilon,
            "delta": self.delta,
            "composition": "basic (sum of stages)",
            "stages": [s.as_report() for s in self._stages],
        }

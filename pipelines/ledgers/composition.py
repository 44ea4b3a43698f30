"""How a dataset's releases compose: ``budget.composition: basic`` or ``zcdp``.

Fixed when the dataset's budget is first set (its first charged release); the ledger
refuses a spec that names the other mode (``budget.composition``, exit 2).

- ``basic`` (the default): a release fits iff the sums of every charged release's
  (epsilon, delta) plus its own stay within the dataset's total (Dwork & Roth, Thm 3.16).
- ``zcdp``: a release fits iff sum rho + rho_new <= rho_B and sum delta0 + delta0_new <=
  delta0_B, with each release's approximate-zCDP record (rho, delta0)
  (``pipelines.ledgers.records``) and two budgets fixed with the dataset:
  delta0_B = ``budget.threshold_delta`` (default delta / 2; 0 allowed), and rho_B the
  largest rho whose CKS conversion at delta_conv = delta - delta0_B is <= epsilon
  (``accounting.zcdp.rho_budget``, rounded down). The sequence is then
  (epsilon, delta)-DP for fully adaptive choices of releases (``accounting.zcdp``'s
  docstring: the approximate-zCDP filter of Whitehouse, Ramdas, Rogers & Wu, ICML 2023).

Every number is an exact decimal: the spec's floats as ``repr`` writes them, records and
rho_B with ``accounting.zcdp.DIGITS`` significant digits; sums and differences are exact
(a context that traps any rounding).
"""
import dataclasses
import decimal
import math

from thresher.pipelines.errors import SpecError

BASIC, ZCDP = "basic", "zcdp"
MODES = (BASIC, ZCDP)
# Exact arithmetic: every operand has <= 17 significant digits; any rounding is an error.
EXACT = decimal.Context(prec=1000, traps=[decimal.Inexact, decimal.InvalidOperation,
                                          decimal.Overflow, decimal.Underflow])
ZERO = decimal.Decimal(0)


def dec(value):
    """A float as the decimal it was written as (``repr``), or a stored decimal string."""
    if isinstance(value, decimal.Decimal):
        return value
    if isinstance(value, str):
        return decimal.Decimal(value)
    return decimal.Decimal(repr(float(value)))


def text(value):
    """A decimal as stored (plain notation for the usual range)."""
    return None if value is None else str(dec(value))


def add(a, b):
    return EXACT.add(dec(a), dec(b))


def sub(a, b):
    return EXACT.subtract(dec(a), dec(b))


def _float_down(value):
    """The largest binary64 <= an exact decimal (a delta passed to the conversion)."""
    out = float(value)
    if decimal.Decimal(out) > value:
        out = math.nextafter(out, -math.inf)
    return out


@dataclasses.dataclass(frozen=True)
class Totals:
    """A dataset's fixed budgets (Decimals). ``delta0``/``rho`` are None in basic mode."""
    composition: str
    epsilon: decimal.Decimal
    delta: decimal.Decimal
    delta0: decimal.Decimal = None       # delta0_B
    rho: decimal.Decimal = None          # rho_B

    @property
    def conversion_delta(self):
        """delta_conv = delta - delta0_B: the delta at which sum rho converts to epsilon."""
        return sub(self.delta, self.delta0)

    @classmethod
    def of_spec(cls, budget):
        """The budgets a spec's ``budget`` section fixes (rho_B computed here)."""
        epsilon, delta = dec(budget.epsilon), dec(budget.delta)
        if budget.composition == BASIC:
            return cls(BASIC, epsilon, delta)
        delta0 = threshold_delta(budget)
        return cls(ZCDP, epsilon, delta, delta0, rho_of(epsilon, delta, delta0))

    def epsilon_of(self, rho):
        """The epsilon that ``rho`` converts to at delta_conv (0 for rho 0)."""
        from thresher.accounting import zcdp  # heavy: numpy
        return zcdp.epsilon_of_rho(float(rho), _float_down(self.conversion_delta))


def rho_of(epsilon, delta, delta0):
    """rho_B of the exact decimals (epsilon, delta, delta0_B): the largest rho whose
    conversion at delta - delta0_B is <= epsilon (``accounting.zcdp.rho_budget``; 0 when
    delta0_B = delta). Raises ValueError/ArithmeticError when it cannot be computed (an
    epsilon so large that the bisection overflows)."""
    from thresher.accounting import zcdp  # heavy: numpy
    conv = sub(delta, delta0)
    # rho_budget returns the float of a 12-digit decimal rounded down: repr gives it back
    return dec(zcdp.rho_budget(float(epsilon), _float_down(conv)))


def threshold_delta(budget):
    """delta0_B: ``budget.threshold_delta``, or half of ``budget.delta``."""
    if budget.threshold_delta is not None:
        return dec(budget.threshold_delta)
    return EXACT.divide(dec(budget.delta), decimal.Decimal(2))


def check_section(composition, threshold_delta_value, delta):
    """SpecErrors of the budget section's composition fields (the schema has checked
    their types)."""
    if composition not in MODES:
        raise SpecError("budget.composition", f"must be one of {', '.join(MODES)}, got "
                        f"{composition!r}")
    if threshold_delta_value is None:
        return
    if composition != ZCDP:
        raise SpecError("budget.threshold_delta", "applies to composition: zcdp only (basic "
                        "composition charges each release's delta as it is)")
    if not (0 <= threshold_delta_value < delta):
        raise SpecError("budget.threshold_delta", f"must be in [0, budget.delta) = [0, "
                        f"{delta:g}), got {threshold_delta_value:g} (the rest of budget.delta "
                        f"is the delta at which the releases' rho converts to epsilon)")


@dataclasses.dataclass(frozen=True)
class Charge:
    """What one release costs: (epsilon, delta) and its record (rho, delta0)."""
    epsilon: decimal.Decimal
    delta: decimal.Decimal
    rho: decimal.Decimal
    delta0: decimal.Decimal


@dataclasses.dataclass(frozen=True)
class Spent:
    """A dataset's running sums. ``rho``/``delta0`` are None when some release has no
    record (charged by a thresher before records: basic datasets only)."""
    epsilon: decimal.Decimal = ZERO
    delta: decimal.Decimal = ZERO
    rho: decimal.Decimal = ZERO
    delta0: decimal.Decimal = ZERO

    def plus(self, charge, sign=1):
        op = add if sign > 0 else sub
        return Spent(op(self.epsilon, charge.epsilon), op(self.delta, charge.delta),
                     None if self.rho is None or charge.rho is None else op(self.rho, charge.rho),
                     None if self.delta0 is None or charge.delta0 is None
                     else op(self.delta0, charge.delta0))

    def minus(self, charge):
        return self.plus(charge, sign=-1)

    @classmethod
    def fold(cls, rows):
        """The sums of (epsilon, delta, rho, delta0) rows (None rho/delta0 = no record)."""
        spent = cls()
        for eps, delta, rho, delta0 in rows:
            spent = spent.plus(Charge(dec(eps), dec(delta), None if rho is None else dec(rho),
                                      None if delta0 is None else dec(delta0)))
        return spent


def admits(totals, spent, charge):
    """Whether the release fits the dataset's budget in its composition mode."""
    if totals.composition == ZCDP:
        if spent.rho is None or spent.delta0 is None:
            raise SpecError("budget.composition", "a zcdp dataset holds a release without a "
                            "(rho, delta0) record; the ledger is inconsistent")
        return (add(spent.rho, charge.rho) <= totals.rho
                and add(spent.delta0, charge.delta0) <= totals.delta0)
    return (add(spent.epsilon, charge.epsilon) <= totals.epsilon
            and add(spent.delta, charge.delta) <= totals.delta)


def _g(value):
    """A number as the shortest text that reads back as the same float (issue 42: a total
    of 1.0000001 printed as 1 hid the difference from 1)."""
    return shown_number(value)


def shown_number(value):
    """The shortest decimal text of ``value``'s float (``repr``), without a trailing
    ``.0``: 1, 2.5, 1e-08, 1.0000001."""
    if value is None:
        return "-"
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def cost_text(charge):
    """This release in both modes."""
    return (f"epsilon={_g(charge.epsilon)}, delta={_g(charge.delta)} under basic composition; "
            f"rho={_g(charge.rho)}, delta0={_g(charge.delta0)} under zcdp")


def state_text(dataset, totals, spent):
    """What the dataset has spent and of what, in its mode."""
    if totals.composition == ZCDP:
        eps = totals.epsilon_of(spent.rho)
        return (f"dataset {dataset!r} (zcdp composition) has spent rho={_g(spent.rho)} of "
                f"rho_B={_g(totals.rho)} and delta0={_g(spent.delta0)} of delta0_B="
                f"{_g(totals.delta0)} (epsilon {eps:.4g} of {_g(totals.epsilon)} at delta "
                f"{_g(totals.conversion_delta)} + delta0)")
    return (f"dataset {dataset!r} (basic composition) has spent epsilon={_g(spent.epsilon)}, "
            f"delta={_g(spent.delta)} of its total epsilon={_g(totals.epsilon)}, "
            f"delta={_g(totals.delta)}")


def remaining_text(totals, spent, charge=None):
    """What is left (after ``charge`` if given), in the dataset's mode."""
    if charge is not None:
        spent = spent.plus(charge)
    if totals.composition == ZCDP:
        return (f"rho={_g(sub(totals.rho, spent.rho))}, "
                f"delta0={_g(sub(totals.delta0, spent.delta0))}")
    return (f"epsilon={_g(sub(totals.epsilon, spent.epsilon))}, "
            f"delta={_g(sub(totals.delta, spent.delta))}")


def refusal_text(dataset, totals, spent, charge):
    """A refusal: spent, requested, remaining (epsilon, delta and rho, delta0), then in
    words which of the dataset's budgets ran out and by how much (``shortage_text``)."""
    return (f"{state_text(dataset, totals, spent)}; this release needs {cost_text(charge)}; "
            f"remaining {remaining_text(totals, spent)}; {shortage_text(totals, spent, charge)}")


# The dataset's budgets, in the words a refusal uses: (name, spent, charged, total).
def _budgets(totals, spent, charge):
    if totals.composition == ZCDP:
        return (("the privacy budget rho_B (zCDP)", spent.rho, charge.rho, totals.rho),
                ("the threshold budget delta0_B", spent.delta0, charge.delta0, totals.delta0))
    return (("the epsilon budget", spent.epsilon, charge.epsilon, totals.epsilon),
            ("the delta budget", spent.delta, charge.delta, totals.delta))


def shortage_text(totals, spent, charge):
    """Which budget(s) the release does not fit, and by how much: "refused: it needs
    7.9e-08 of the threshold budget delta0_B, 2.1e-08 left (short by 5.8e-08)"."""
    parts = []
    for name, used, need, total in _budgets(totals, spent, charge):
        left = sub(total, used)
        if need > left:
            parts.append(f"it needs {_g(need)} of {name}, {_g(max(left, ZERO))} left (short "
                         f"by {_g(sub(need, left))})")
    return "refused: " + "; and ".join(parts) if parts else "it fits"

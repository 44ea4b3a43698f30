"""The spec's ``budget`` section: its fields (for the schema), its parsing and checks
(``parse_section``, ``budget_totals``), a relative SQLite ledger resolved from the spec's
folder (``resolved_from``) and kept outside the output folder (``inside_output``).
"""
import dataclasses
import decimal
import os
import re
import warnings

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import store
from thresher.pipelines.ledgers.backend import without_password
from thresher.pipelines.common import declare

# The spec's budget section (declared for pipelines.schema; REQUIRED are required).
FIELDS = {
    "ledger": declare.string(description="a SQLite file path, or a PostgreSQL database URL "
                                         "(postgresql://user@host:5432/db)"),
    "dataset": declare.string(description="what the total protects: the same users across "
                                          "releases"),
    "epsilon": declare.number(low=0, low_open=True, description="the total over all releases "
                                                                "on this dataset"),
    "delta": declare.number(low=0, high=1, high_open=True),
    "composition": declare.choice(comp.MODES, default=comp.BASIC, description=(
        "how releases on the dataset compose: basic (sum of epsilons and deltas) or zcdp "
        "(sum of each release's rho and delta0; docs/accounting.md); fixed by the "
        "dataset's first release")),
    "threshold_delta": declare.number(low=0, high=1, high_open=True, description=(
        "zcdp only: delta0_B, the part of delta charged at face value to thresholds "
        "(default delta / 2; 0 allowed)")),
}
REQUIRED = ("ledger", "dataset", "epsilon", "delta")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(//|[^\\/])")   # postgresql://..., sqlite:///...


@dataclasses.dataclass(frozen=True)
class BudgetSpec:
    """The spec's ``budget`` section."""
    ledger: str
    dataset: str
    epsilon: float
    delta: float
    composition: str = comp.BASIC
    threshold_delta: float = None        # zcdp: delta0_B (None: delta / 2)
    composition_given: bool = True       # False: the spec left budget.composition out


def parse_section(section, privacy):
    """The spec's ``budget`` section (the schema has checked its fields; ``privacy`` is the
    parsed PrivacySpec)."""
    ledger = section["ledger"]
    if (_URL.match(ledger) and not re.match(r"^[A-Za-z]:[\\/]", ledger)
            and store.backend_for(ledger).is_file):     # a URL no database backend takes
        raise SpecError("budget.ledger", f"the database URLs supported are postgresql://..., "
                        f"got {without_password(ledger)!r}; or give the path of a SQLite "
                        f"file (e.g. ledgers/my-dataset.sqlite)")
    ledger = store.backend_for(ledger).expanded(ledger)   # ~/ledgers/x.sqlite: home's
    dataset = section["dataset"]
    epsilon, delta = float(section["epsilon"]), float(section["delta"])
    mode = section.get("composition", comp.BASIC)
    threshold = section.get("threshold_delta")
    comp.check_section(mode, None if threshold is None else float(threshold), delta)
    budget_totals(BudgetSpec(ledger=ledger, dataset=dataset, epsilon=epsilon, delta=delta,
                             composition=mode,
                             threshold_delta=None if threshold is None else float(threshold)))
    if mode == comp.BASIC and privacy.epsilon > epsilon:
        # (zcdp: one release may carry a larger epsilon and still fit rho_B.)
        raise SpecError("budget.epsilon", f"the dataset's total ({epsilon:g}) is smaller than "
                        f"this one release's privacy.epsilon ({privacy.epsilon:g})")
    return BudgetSpec(ledger=ledger, dataset=dataset, epsilon=epsilon, delta=delta,
                      composition=mode,
                      threshold_delta=None if threshold is None else float(threshold),
                      composition_given="composition" in section)


def resolved_from(budget, spec_path):
    """The budget section with a relative SQLite ``budget.ledger`` resolved from the
    folder of the spec file that names it (not the working directory: the same spec run
    from another folder must charge the same ledger; issue 42)."""
    if budget is None:
        return budget
    folder = os.path.dirname(os.path.abspath(spec_path))
    resolved = store.backend_for(budget.ledger).resolved(budget.ledger, folder)
    return budget if resolved == budget.ledger else dataclasses.replace(budget, ledger=resolved)


def inside_output(ledger_path, output_path):
    """Why a SQLite ledger at ``ledger_path`` cannot be used with a release into
    ``output_path`` ("" if it can): a ledger inside the output folder (or the folder
    itself) would be replaced by the release that it charges."""
    if (not store.backend_for(ledger_path).is_file or not output_path
            or "://" in output_path):
        return ""
    ledger_real = os.path.realpath(ledger_path)
    out_real = os.path.realpath(output_path)
    if ledger_real == out_real or ledger_real.startswith(out_real.rstrip(os.sep) + os.sep):
        return (f"the ledger {ledger_path!r} ({ledger_real}) lies inside the output folder "
                f"{output_path!r}, which each release replaces; keep the ledger outside it "
                f"(e.g. ledgers/<dataset>.sqlite beside the spec)")
    return ""


def budget_totals(budget, names=("budget.epsilon", "budget.delta", "budget.threshold_delta")):
    """``composition.Totals.of_spec`` with its failures as SpecErrors naming the field:
    a zcdp total so large that rho_B cannot be computed (epsilon 1e308), or a delta that
    leaves no room to convert rho (delta 0, 5e-324: rho_B would be 0, refusing every
    release) (issue 42: these were internal errors)."""
    eps_name, delta_name, threshold_name = names
    comp.check_section(budget.composition, budget.threshold_delta, budget.delta)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)    # numpy's overflow, refused below
            totals = comp.Totals.of_spec(budget)
    except (ValueError, ArithmeticError, OverflowError, decimal.DecimalException):
        raise SpecError(eps_name, f"{comp.shown_number(budget.epsilon)} is too large for "
                        f"zcdp composition: its rho_B cannot be computed (the conversion "
                        f"overflows); give a total epsilon of at most 1e6 (already far past "
                        f"any meaningful guarantee)") from None
    if totals.composition == comp.ZCDP and not totals.rho > 0:
        conv = totals.conversion_delta
        if budget.threshold_delta is not None and budget.threshold_delta > 0:
            raise SpecError(threshold_name, f"leaves delta - threshold_delta = "
                            f"{comp.shown_number(conv)}, too small to convert any rho to "
                            f"epsilon (rho_B = 0 would refuse every release); give a smaller "
                            f"threshold_delta or a larger delta")
        raise SpecError(delta_name, f"must be large enough to convert rho to epsilon under "
                        f"zcdp composition, got {comp.shown_number(budget.delta)} (rho_B = 0 "
                        f"would refuse every release); give a delta such as 1e-6")
    return totals

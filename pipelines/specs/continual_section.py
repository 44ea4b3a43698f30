"""The spec's ``continual`` section: ``continual: {horizon: T, selection_share: s}``.

Declared here for ``pipelines.specs.schema`` (unknown fields are refused by the schema);
:func:`parse` checks the rules across sections: a continual release is the tree of
``accounting.continual`` over distinct-user counts, so it needs a kind whose
``CONTINUAL`` is set (``mechanism.kind: gaussian``) with no other mechanism field, an integer ``bounding.max_keys_per_user`` in the
``l0`` model, no aggregates and no public keys, and a ``budget`` section with a SQLite
ledger (the horizon's state is kept beside it). Loads no numerics.
"""
import dataclasses

from thresher.pipelines.errors import SpecError
from thresher.pipelines.common import declare

PERIOD_FIELD = "{period}"
MAX_HORIZON = 100_000        # accounting.continual.MAX_HORIZON (a test checks they agree)

FIELDS = {
    "horizon": declare.integer(low=1, high=MAX_HORIZON, description=(
        "T: the number of periods (thresher run SPEC --period P, P = 1..T); the whole "
        "horizon's cost is charged at period 1")),
    "selection_share": declare.number(low=0, high=1, low_open=True, high_open=True,
                                      default=0.5, description=(
        "the share of privacy.delta spent on key selection (a key only one user holds ever "
        "released); the rest converts the tree's zCDP to epsilon")),
}
REQUIRED = ("horizon",)


@dataclasses.dataclass(frozen=True)
class ContinualSpec:
    horizon: int
    selection_share: float = 0.5


def parse(section):
    return ContinualSpec(horizon=int(section["horizon"]),
                         selection_share=float(section.get("selection_share", 0.5)))


def check(data, input_spec, bounding, mechanism, budget, kind, continual_kinds):
    """Refuse what a continual release cannot do (SpecError naming the field). ``kind``:
    the kind object of ``mechanism.kind`` (its ``CONTINUAL`` says whether it may be
    released continually); ``continual_kinds()``: the names of those that may, for the
    message."""
    extra = sorted(k for k in data["mechanism"] if k != "kind")
    if not kind.CONTINUAL:
        raise SpecError("mechanism.kind", f"a continual release counts distinct users per key "
                        f"with tree-aggregated discrete Gaussian noise: use kind: "
                        f"{continual_kinds()}, got {mechanism['kind']!r}")
    if extra:
        raise SpecError(f"mechanism.{extra[0]}", "does not apply with continual: the node noise "
                        "and the threshold are calibrated for the whole horizon (leave only "
                        f"kind: {mechanism['kind']})")
    if bounding.max_keys_per_user == "auto" or bounding.model != "l0":
        raise SpecError("bounding.max_keys_per_user", "with continual must be an integer in the "
                        "l0 model: each user counts in at most that many keys over the whole "
                        "horizon")
    if input_spec.public_keys is not None or input_spec.sample is not None:
        raise SpecError("input", "continual releases count from records (no public_keys, no "
                        "sample)")
    if "aggregates" in data:
        raise SpecError("aggregates", "do not apply with continual (counts only)")
    if budget is None:
        raise SpecError("continual", "needs a budget section: the horizon is charged once to "
                        "a ledger, and its state is kept beside it")
    if "://" in budget.ledger:
        raise SpecError("budget.ledger", "with continual must be a SQLite file: the horizon's "
                        "state is kept in a folder beside it")
    path = input_spec.path
    if path.count(PERIOD_FIELD) != 1 and "{" in path:
        raise SpecError("input.path", f"may hold {PERIOD_FIELD} once (the period's number), "
                        f"got {path!r}")
    if PERIOD_FIELD not in data["output"]["path"] and "{" in data["output"]["path"]:
        raise SpecError("output.path", "is a folder; each period is written to "
                        "OUTPUT/period=P/ (no braces)")

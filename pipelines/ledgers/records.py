"""A plan's approximate-zCDP record (rho, delta0): what the ledger's ``zcdp`` composition
charges for the release (``accounting.zcdp``; docs/accounting.md, "Approximate zCDP
records").

The plan's stages compose (records add). The exponential-mechanism stages
(``choose_contribution_bound`` -- ChooseContributionBound, or ChooseDomainBound over
public keys -- and ``choose_aggregate_clip``, ChooseClipBounds) are epsilon-bounded
range: epsilon^2/8 each. Every other stage belongs to the kind, whose record comes from
its calibration: the ledger asks the kind (``pipelines.kinds.base.Kind.privacy_record``;
the math is in ``accounting.zcdp``). With ``max_keys_per_user: auto`` the
ledger reserves before the bound is drawn, so the kind's record is the maximum over
every calibrated candidate bound; ``clip: auto`` columns are calibrated for a grid
sensitivity that is the same for every candidate clip (pipelines/specs/aggregates.py), so
their record is already the maximum. rho and delta0 are rounded UP to
``accounting.zcdp.DIGITS`` significant digits (exact decimals, as the ledger stores them).
"""
from thresher.accounting import zcdp
from thresher.pipelines import kinds

SELECT_STAGE = "choose_contribution_bound"     # pipelines.planning.plan.SELECT_STAGE
CLIP_STAGE = "choose_aggregate_clip"           # pipelines.specs.aggregates.AUTO_STAGE
EXPONENTIAL_MECHANISM_STAGES = (SELECT_STAGE, CLIP_STAGE)


def privacy_record(plan):
    """(rho, delta0) of the release as exact Decimals, rounded up."""
    total = record_of(plan)
    return zcdp.decimal_up(total.rho), zcdp.decimal_up(total.delta0)


def record_of(plan):
    """The release's ``accounting.zcdp.Record`` (floats, before rounding); computed once
    per plan (a report per candidate bound asks again)."""
    cached = plan.__dict__.get("_zcdp_record")
    if cached is None:
        cached = plan.__dict__["_zcdp_record"] = _record_of(plan)
    return cached


def _record_of(plan):
    stages = [(s.name, s.epsilon, s.delta) for s in plan.budget.stages]
    total = zcdp.ZERO
    for name, epsilon, _ in stages:
        if name in EXPONENTIAL_MECHANISM_STAGES:
            total = total + zcdp.bounded_range_record(epsilon)
    kind_stages = [s for s in stages if s[0] not in EXPONENTIAL_MECHANISM_STAGES]
    record = None
    kind = kinds.get(plan.spec.kind)
    for bound, mechanism in plan.params_by_bound.items():
        one = kind.privacy_record(mechanism, kind_stages, bound)
        record = one if record is None else record.joined(one)
    return total + (record or zcdp.ZERO)


def report_section(plan):
    """The report's ``privacy.zcdp``: the record the ledger charges for this release."""
    rho, delta0 = privacy_record(plan)
    out = {"rho": float(rho), "delta0": float(delta0),
           "meaning": "the release is delta0-approximately rho-zCDP (user level); the "
                      "ledger's zcdp composition charges these (docs/accounting.md)"}
    if len(plan.params_by_bound) > 1:
        out["auto_bound"] = "the maximum over the candidate bounds (charged before the draw)"
    return out


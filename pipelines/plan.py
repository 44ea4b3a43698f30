"""Planning a release: split the budget into stages and calibrate the mechanism, from the
spec alone (no data). ``thresher plan`` prints this; ``thresher run`` executes it.

Stages (basic composition, ``accounting.budget``):
- ``choose_contribution_bound`` (only with ``max_keys_per_user: auto``): epsilon from
  ``bounding.auto.epsilon``, delta 0 (exponential mechanism, paper 002 Alg. 4);
- ``release``: the rest of epsilon and all of delta, spent by the mechanism.

With an automatic bound the mechanism is calibrated for every candidate bound up front,
so the run only picks one of these parameter sets (the chosen bound arrives as a side
input) and no candidate can be chosen whose release would not meet the budget.
"""
import dataclasses
import hashlib
import logging

from accounting.budget import Budget
from pipelines import __version__
from pipelines.errors import CalibrationError
from pipelines.spec import kind_module

log = logging.getLogger("thresher")

NEIGHBOURING = "add/remove all records of one user"
SELECT_STAGE = "choose_contribution_bound"
RELEASE_STAGE = "release"


@dataclasses.dataclass
class Plan:
    spec: object
    budget: Budget
    params_by_bound: dict       # candidate bound C -> the mechanism's calibrated report section
    excluded_bounds: dict       # candidate bound C -> why it could not be calibrated

    @property
    def release_stage(self):
        return next(s for s in self.budget.stages if s.name == RELEASE_STAGE)

    @property
    def select_stage(self):
        return next((s for s in self.budget.stages if s.name == SELECT_STAGE), None)

    @property
    def candidates(self):
        return tuple(sorted(self.params_by_bound))

    def report(self, chosen_bound=None):
        """The release report without data-dependent fields (those are added by the run)."""
        spec = self.spec
        bounding = {"max_keys_per_user": spec.bounding.max_keys_per_user,
                    "model": spec.bounding.model,
                    "chosen_by": "exponential_mechanism" if spec.auto_bound else "spec"}
        if spec.auto_bound:
            from accounting.contribution_bound import score_sensitivity
            bounding["candidates"] = list(self.candidates)
            bounding["selection"] = {
                "epsilon": self.select_stage.epsilon,
                "sensitivity": score_sensitivity(self.candidates, spec.bounding.auto.max_bound),
                "exponent": "epsilon * score / sensitivity (scores monotone in the data; "
                            "docs/contribution_bound.md)"}
            if self.excluded_bounds:
                bounding["excluded_candidates"] = {str(c): why for c, why in self.excluded_bounds.items()}
            if chosen_bound is not None:
                bounding["max_keys_per_user"] = int(chosen_bound)
                mechanism = self.params_by_bound[int(chosen_bound)]
            else:
                mechanism = {"kind": spec.kind,
                             "by_max_keys_per_user": {str(c): p for c, p in self.params_by_bound.items()}}
        else:
            mechanism = self.params_by_bound[spec.bounding.max_keys_per_user]
        privacy = {"epsilon": self.budget.epsilon, "delta": self.budget.delta,
                   "neighbouring": NEIGHBOURING,
                   "accounting": _accounting_text(mechanism, spec),
                   **{k: v for k, v in self.budget.as_report().items() if k not in ("epsilon", "delta")}}
        if spec.input.sample is not None:
            sample = spec.input.sample
            scheme = sample["scheme"] + (f" (threshold {sample['threshold']:g})"
                                         if sample["threshold"] is not None else "")
            privacy["assumes"] = (
                f"the input is a {scheme} weighted sample of per-key user counts in which each "
                f"user contributed to at most {spec.bounding.max_keys_per_user} keys, at most "
                f"once each; the guarantee holds only for a sample drawn as declared")
        return {
            "name": spec.name,
            "thresher_version": __version__,
            "config_sha256": hashlib.sha256(spec.source_text.encode("utf-8")).hexdigest(),
            "mechanism": mechanism,
            "bounding": bounding,
            "privacy": privacy,
        }


def _accounting_text(mechanism, spec):
    parts = []
    if spec.auto_bound:
        parts.append("choose_contribution_bound: exponential mechanism, (epsilon, 0)-DP "
                     "(paper 002 Alg. 4)")
    accounting = mechanism.get("accounting")
    if accounting is None and "by_max_keys_per_user" in mechanism:
        first = next(iter(mechanism["by_max_keys_per_user"].values()))
        accounting = first.get("accounting")
    parts.append(f"release: {accounting}")
    parts.append("stages composed by basic composition")
    return "; ".join(parts)


def make_plan(spec):
    """Budget split and calibration; raises CalibrationError if the budget cannot be met."""
    budget = Budget(spec.privacy.epsilon, spec.privacy.delta)
    if spec.auto_bound:
        budget.spend(SELECT_STAGE, spec.bounding.auto.epsilon, 0.0)
        candidates = spec.bounding.auto.candidates
    else:
        candidates = (spec.bounding.max_keys_per_user,)
    release = budget.spend_rest(RELEASE_STAGE)
    module = kind_module(spec.kind)
    params, excluded = {}, {}
    for bound in candidates:
        try:
            params[bound] = module.calibrate(
                spec.mechanism, epsilon=release.epsilon, delta=release.delta,
                max_keys_per_user=bound, model=spec.bounding.model)
        except CalibrationError as exc:
            if not spec.auto_bound:
                raise
            excluded[bound] = str(exc)
            log.info("candidate bound %d excluded: %s", bound, exc)
    if not params:
        raise CalibrationError(
            "no candidate bound can meet the budget: " +
            "; ".join(f"C={c}: {why}" for c, why in excluded.items()))
    return Plan(spec=spec, budget=budget, params_by_bound=params, excluded_bounds=excluded)

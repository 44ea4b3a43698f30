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
import functools
import hashlib
import logging
import math

from thresher.accounting.budget import Budget
from thresher.pipelines import __version__
from thresher.pipelines.common import calibration_cache, limits
from thresher.pipelines.common.citations import cite_all
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines import kinds
from thresher.pipelines.kinds.base import LAPLACE_NOISE, RELEASE_STAGE

log = logging.getLogger("thresher")

NEIGHBOURING = "add/remove all records of one user"
SELECT_STAGE = "choose_contribution_bound"


@dataclasses.dataclass
class Plan:
    spec: object
    budget: Budget
    params_by_bound: dict       # candidate bound C -> the mechanism's calibrated report section
    excluded_bounds: dict       # candidate bound C -> why it could not be calibrated
    domain: object = None       # input.public_keys: pyarrow.Table of the public keys

    @property
    def release_stage(self):
        return next(s for s in self.budget.stages if s.name == RELEASE_STAGE)

    @property
    def select_stage(self):
        return next((s for s in self.budget.stages if s.name == SELECT_STAGE), None)

    @property
    def candidates(self):
        return tuple(sorted(self.params_by_bound))

    @property
    def score_name(self):
        """The V(C) score of the release kind (accounting.contribution_bound.SCORE_MODELS;
        the kind's ``score``: adaptive scores as weighted_gaussian, laplace by its model)."""
        return kinds.get(self.spec.kind).score(self.spec.bounding.model)

    def score_params(self):
        """score_params for accounting.contribution_bound.make_score: the release stage's
        budget, every candidate's calibrated parameters and the dropped-term weight."""
        stage = self.release_stage
        return {"epsilon": stage.epsilon, "delta": stage.delta,
                "params_by_bound": dict(self.params_by_bound),
                "dropped_weight": self.spec.bounding.auto.dropped_weight,
                "objective": self.spec.bounding.auto.objective}

    def bound_score(self):
        """The accounting.contribution_bound.BoundScore ChooseContributionBound uses."""
        from thresher.accounting.contribution_bound import make_score  # heavy: numpy
        return make_score(self.score_name, self.candidates, self.spec.bounding.auto.max_bound,
                          self.score_params())

    def domain_bound_rule(self):
        """With input.public_keys and an automatic bound: the bounded-domain rule
        (``accounting.known_domain.domain_bound_rule``) over the calibrated candidates."""
        from thresher.accounting.known_domain import domain_bound_rule  # heavy: numpy
        return domain_bound_rule(
            self.spec.kind_object.PUBLIC_DOMAIN_NOISE, self.candidates, self.domain.num_rows,
            epsilon=self.release_stage.epsilon, params_by_bound=self.params_by_bound,
            sparsity=min(self.spec.bounding.auto.max_bound, self.domain.num_rows))

    def report(self, chosen_bound=None):
        """The release report without data-dependent fields (those are added by the run)."""
        spec = self.spec
        bounding = {"max_keys_per_user": spec.bounding.max_keys_per_user,
                    "model": spec.bounding.model,
                    "chosen_by": "exponential_mechanism" if spec.auto_bound else "spec"}
        if self.domain is not None:
            from thresher.pipelines.dataio.public_keys import report_section  # heavy: pyarrow
            bounding["public_keys"] = report_section(spec.input.public_keys, self.domain.num_rows)
        if spec.auto_bound:
            bounding["candidates"] = list(self.candidates)
            if self.domain is not None:
                bounding["selection"] = {
                    "epsilon": self.select_stage.epsilon,
                    "rule": ("paper 002 Lemma 4.2: the ceil(d/epsilon)-th largest user weight"
                             if spec.kind_object.PUBLIC_DOMAIN_NOISE == LAPLACE_NOISE else
                             "paper 002 Thm 4.3: the smallest C with S(C) <= M(C), ratios "
                             "clipped to sqrt(min(max_bound, d))"),
                    "sensitivity": self.domain_bound_rule().sensitivity,
                    "exponent": "epsilon * score / (2 sensitivity) (docs/contribution_bound.md, "
                                "Bounded domains)"}
            else:
                score = self.bound_score()
                weights = {} if score.objective == "keys" else {
                    "dropped_weight": score.dropped_weight,
                    "suppressed_weight": score.suppressed_weight,
                    "dropped_weight_rule": (spec.bounding.auto.dropped_weight
                                            if isinstance(spec.bounding.auto.dropped_weight, str)
                                            else "spec")}
                bounding["selection"] = {
                    "epsilon": self.select_stage.epsilon,
                    "score": score.kind,
                    "objective": score.objective,
                    **weights,
                    "sensitivity": score.sensitivity,
                    # the exact scores' rounding allowance added (docs/contribution_bound.md
                    # section 2a): the value the draw divides by, rounded up to a float
                    "sensitivity_drawn_with": _float_up(score.selection_sensitivity),
                    "exponent": "epsilon * score / sensitivity_drawn_with (scores monotone "
                                "in the data; docs/contribution_bound.md)"}
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
        if self.budget.spent_delta < self.budget.delta:
            # A pure-DP release (Laplace over public keys): the spec's delta is the budget,
            # the stages spend none of it, and the release is (epsilon, 0)-DP.
            privacy["delta_spent"] = self.budget.spent_delta
            privacy["delta_note"] = ("the stages spend delta 0: the release is (epsilon, 0)-DP; "
                                     "privacy.delta is the spec's budget, unused")
        from thresher.pipelines.ledgers.records import report_section  # heavy: numpy
        privacy["zcdp"] = report_section(self)     # what a zcdp ledger charges (docs/accounting.md)
        if spec.input.sample is not None:
            sample = spec.input.sample
            scheme = sample["scheme"] + (f" (threshold {sample['threshold']:g})"
                                         if sample["threshold"] is not None else "")
            privacy["assumes"] = (
                f"the input is a {scheme} weighted sample of per-key user counts in which each "
                f"user contributed to at most {spec.bounding.max_keys_per_user} keys, at most "
                f"once each; the guarantee holds only for a sample drawn as declared")
        # Papers cited by authors and title, not "paper 004" (pipelines/common/citations.py).
        return {"name": spec.name, **cite_all({
            "thresher_version": __version__,
            "config_sha256": hashlib.sha256(spec.source_text.encode("utf-8")).hexdigest(),
            "mechanism": mechanism,
            "bounding": bounding,
            "privacy": privacy,
            "randomness": randomness_report(),
            "intervals": intervals_report(spec),
        })}


def randomness_report():
    """The report's ``randomness`` section: which construction draws the release's keyed
    randomness from its secret (``transforms.randomness.stream_construction``)."""
    # heavy: start-up of thresher validate
    from thresher.transforms.randomness import stream_construction
    return {"construction": stream_construction.CONSTRUCTION,
            "description": stream_construction.DESCRIPTION}


def intervals_report(spec):
    """The report's ``intervals`` section (pipelines/dataio/intervals.py)."""
    from thresher.pipelines.dataio.intervals import report_section  # heavy: pyarrow
    return report_section(spec)


def _accounting_text(mechanism, spec):
    parts = []
    laplace_domain = spec.kind_object.PUBLIC_DOMAIN_NOISE == LAPLACE_NOISE
    if spec.auto_bound and spec.input.public_keys is not None:
        parts.append("choose_contribution_bound: bounded-domain rule (paper 002 "
                     f"{'Lemma 4.2' if laplace_domain else 'Thm 4.3'}) by the "
                     "exponential mechanism, (epsilon, 0)-DP")
    elif spec.auto_bound:
        parts.append("choose_contribution_bound: exponential mechanism, (epsilon, 0)-DP "
                     "(paper 002 Alg. 4)")
    accounting = mechanism.get("accounting")
    if accounting is None and "by_max_keys_per_user" in mechanism:
        first = next(iter(mechanism["by_max_keys_per_user"].values()))
        accounting = first.get("accounting")
    parts.append(f"release: {accounting}")
    note = kinds.get(spec.kind).COMPOSITION_NOTE
    if note is not None:
        parts.append(f"the plan's stages composed by basic composition ({spec.kind}: {note})")
    else:
        parts.append("the plan's stages composed by basic composition")
    return "; ".join(parts)


def check_stage_budgets(spec):
    """The stages taken out of privacy.epsilon before the release (``bounding.auto.epsilon``,
    ``aggregates_auto.epsilon``) must leave the release a positive share; else SpecError
    naming the fields (issue 30 D1/D2: a release epsilon of 0 hung the planning limits,
    a stage above the total was an internal BudgetExceededError)."""
    stages = []
    if spec.auto_bound:
        stages.append(("bounding.auto.epsilon", spec.bounding.auto.epsilon))
    if spec.aggregates_auto is not None:
        stages.append(("aggregates_auto.epsilon", spec.aggregates_auto.epsilon))
    if not stages:
        return
    total = spec.privacy.epsilon
    for field, eps in stages:
        if not (math.isfinite(eps) and 0 < eps):
            raise SpecError(field, f"must be a number > 0, got {eps:g}")
    taken = math.fsum(eps for _, eps in stages)
    # The release keeps total - taken; a share below 1e-9 of the total is zero in all but
    # name (and float sums such as 0.1 + 0.9 must not pass as a sliver above 0).
    if total - taken > total * 1e-9:
        return
    names = " + ".join(f"{field} ({_shown(eps)})" for field, eps in stages)
    raise SpecError(stages[-1][0], f"{names} take{'s' if len(stages) == 1 else ''} "
                    f"{_shown(taken)} of privacy.epsilon ({_shown(total)}), leaving the release no "
                    f"epsilon (it needs more than 1e-9 of privacy.epsilon); " + ("they must sum to less than privacy.epsilon" if len(stages) > 1
                                   else "it must be smaller than privacy.epsilon"))


def _shown(x):
    """A number as written when %g would round it (0.9999999999999 is not 1)."""
    return f"{x:g}" if float(f"{x:g}") == x else repr(float(x))


def make_plan(spec):
    """Budget split and calibration; raises CalibrationError if the budget cannot be met."""
    limits.check_spec(spec, kinds.get(spec.kind))
    check_stage_budgets(spec)
    budget = Budget(spec.privacy.epsilon, spec.privacy.delta)
    if spec.auto_bound:
        budget.spend(SELECT_STAGE, spec.bounding.auto.epsilon, 0.0)
        candidates = spec.bounding.auto.candidates
    else:
        candidates = (spec.bounding.max_keys_per_user,)
    if spec.aggregates_auto is not None:   # clip: auto (pipelines/specs/aggregates.py)
        from thresher.pipelines.specs.aggregates import AUTO_STAGE  # heavy: pyarrow
        budget.spend(AUTO_STAGE, spec.aggregates_auto.epsilon, 0.0)
    domain = None
    if spec.input.public_keys is not None:
        # heavy: pyarrow
        from thresher.pipelines.dataio.public_keys import (
            input_file_key_types, input_key_types, load_domain)
        domain = load_domain(spec.input.public_keys, spec.input.keys, input_key_types(spec.input),
                             input_file_key_types(spec.input))
        kinds.get(spec.kind).check_public_domain(spec.mechanism, domain.num_rows)
        if spec.auto_bound:
            from thresher.pipelines.dataio.public_keys import domain_candidates  # heavy: pyarrow
            candidates = domain_candidates(candidates, domain.num_rows, spec.bounding.model)
    kind = kinds.get(spec.kind)
    if kind.check_key_types is not None:   # from the input's schema (issue 36 D17)
        from thresher.pipelines.dataio.public_keys import input_key_types  # heavy: pyarrow
        key_types = input_key_types(spec.input)
        if key_types is not None:
            kind.check_key_types(key_types)
    # the kind's stages (one per composed histogram of heavy_hitters and quantiles; laplace
    # over a public domain is pure epsilon-DP and spends no delta)
    release = kind.stage_budget(budget, spec.mechanism, public_domain=domain is not None)
    limits.check_release(spec, release.epsilon, release.delta, candidates, kind)
    mechanism = spec.mechanism
    if spec.auto_bound:
        mechanism = kind.for_auto_bound(mechanism)  # the kind's cheaper default there
    params, excluded = {}, {}
    # CLI only; only the kinds with a forward check (verify_calibration) are cached
    calibrate = calibration_cache.cached(f"{spec.kind}.calibrate", kind.calibrate,
                                         kind.verify_calibration)
    if spec.aggregates:   # count and sums calibrated jointly (pipelines/specs/aggregates.py)
        from thresher.pipelines.specs import aggregates  # heavy: pyarrow
        calibrate = functools.partial(aggregates.calibrate, spec, kind)
    for bound in candidates:
        try:
            params[bound] = cite_all(calibrate(
                mechanism, epsilon=release.epsilon, delta=release.delta,
                max_keys_per_user=bound, model=spec.bounding.model))
        except CalibrationError as exc:
            if not spec.auto_bound:
                raise
            excluded[bound] = str(exc)
            log.info("candidate bound %d excluded: %s", bound, exc)
    if not params:
        raise CalibrationError(
            "no candidate bound can meet the budget: " +
            "; ".join(f"C={c}: {why}" for c, why in excluded.items()))
    return Plan(spec=spec, budget=budget, params_by_bound=params, excluded_bounds=excluded,
                domain=domain)


def _float_up(value):
    """The smallest binary64 >= an exact Fraction (a sensitivity is reported rounded up)."""
    out = float(value)
    return out if out >= value else math.nextafter(out, math.inf)

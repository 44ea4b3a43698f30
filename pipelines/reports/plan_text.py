"""``thresher plan`` as text: one line per parameter group, plain values (no Python reprs
such as ``None`` or ``np.float64(...)``), papers cited by authors and title."""
import json
import numbers
import re
import textwrap

from thresher.pipelines import kinds

from thresher.pipelines.common import limits

from thresher.pipelines.common.citations import _BOTH_SAMPLE_AND_THRESHOLD, PAPERS

from thresher.pipelines.reports import summary

_SKIP = ("kind", "accounting")
# Parameters that state what the calibration achieved or compares against: their own line.
_ACHIEVED = ("delta_achieved", "delta_realized", "key_delta_realized", "table_delta")


def value_text(value):
    """A value as a person writes it: 1e-08, 0.125, true, none, [1, 2, 3]."""
    if hasattr(value, "item") and not isinstance(value, (list, tuple, dict)):
        try:
            value = value.item()          # numpy scalar -> Python
        except (TypeError, ValueError):
            pass
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, numbers.Integral):
        return str(int(value))
    if isinstance(value, numbers.Real):
        return f"{float(value):.6g}"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(value_text(v) for v in value) + "]"
    if isinstance(value, dict):
        return ", ".join(f"{k}: {value_text(v)}" for k, v in value.items())
    return str(value)


def params_lines(params, indent="  ", inline_achieved=False):
    """(main line, [extra lines]): the parameters, then one line per nested group and
    one for what the calibration achieved (or that on the main line)."""
    main, achieved, groups = [], [], []
    for key, value in params.items():
        if key in _SKIP or value is None:
            continue
        if isinstance(value, dict):
            groups.append(f"{indent}{key}: {value_text(value)}")
        elif key in _ACHIEVED:
            achieved.append(f"{key}={value_text(value)}")
        else:
            main.append(f"{key}={value_text(value)}")
    if inline_achieved:
        return ", ".join(main + achieved), groups
    extra = ([f"{indent}achieved: {', '.join(achieved)}"] if achieved else []) + groups
    return ", ".join(main), extra


def _domain_lines(plan):
    """The public key domain's size (input.public_keys): every listed key is released."""
    if plan.domain is None:
        return []
    return [f"public keys: {plan.domain.num_rows:,} keys listed in "
            f"{plan.spec.input.public_keys['path']}, each released with noise and no "
            f"threshold (limit {limits.PUBLIC_KEYS_MAX:,})"]


def format_plan(plan, report):
    """The lines of ``thresher plan``."""
    spec = plan.spec
    unit = (f"per user column {spec.input.user}" if spec.input.sample is None else
            f"sanitizing the existing sample's column {spec.input.sample['frequency']}")
    keys = ", ".join(spec.input.keys) or "(none: one global release)"
    out = [f"release {spec.name}: {spec.kind} over keys {keys}, {unit}",
           *_domain_lines(plan),
           f"privacy: epsilon={value_text(plan.budget.epsilon)}, delta={value_text(plan.budget.delta)} "
           f"({report['privacy']['neighbouring']})"]
    for stage in plan.budget.stages:
        out.append(f"  stage {stage.name}: epsilon={value_text(stage.epsilon)}, "
                   f"delta={value_text(stage.delta)}")
    if spec.auto_bound:
        out.append(f"bounding: max_keys_per_user chosen privately from "
                   f"{value_text(list(plan.candidates))} ({spec.bounding.model} model)")
        for bound, params in plan.params_by_bound.items():
            main, _ = params_lines(params, inline_achieved=True)
            out.append(f"  C={bound}: {main}")
        for bound, why in plan.excluded_bounds.items():
            out.append(f"  C={bound}: excluded ({why})")
        selection = report["bounding"].get("selection", {})
        if selection.get("objective") == "keys":
            out.append(f"  selection: score {selection['score']}, objective keys (smoothed "
                       f"count of released keys), sensitivity {selection['sensitivity']:.6g}")
        elif "dropped_weight" in selection:
            out.append(f"  selection: score {selection['score']}, objective "
                       f"{selection.get('objective', 'l1')}, dropped_weight "
                       f"{selection['dropped_weight']:.4g} ({selection['dropped_weight_rule']}), "
                       f"suppressed_weight {selection['suppressed_weight']:.4g}, sensitivity "
                       f"{selection['sensitivity']:.6g}")
        elif selection:
            out.append(f"  selection: {selection['rule']}; sensitivity "
                       f"{value_text(selection['sensitivity'])}")
    else:
        out.append(f"bounding: max_keys_per_user={spec.bounding.max_keys_per_user} "
                   f"({spec.bounding.model} model)")
        main, extra = params_lines(report["mechanism"])
        out.append(f"mechanism: {main}")
        out.extend(extra)
    out.append(f"accounting: {report['privacy']['accounting']}")
    if "assumes" in report["privacy"]:
        out.append(f"assumes: {report['privacy']['assumes']}")
    if getattr(spec, "budget", None) is not None:
        b = spec.budget
        out.append(f"budget: charged to dataset {b.dataset} (total epsilon={value_text(b.epsilon)}, "
                   f"delta={value_text(b.delta)}) in the ledger {b.ledger}")
    return out


# ---- the one-screen plan (the default; --verbose prints format_plan) ---------------------

WIDTH = 100


def format_short(plan, report, users=2000):
    """``thresher plan``'s default: one screen, no line over WIDTH characters, each paper
    cited once. The guarantee, the budget's stages, the bound, the noise and threshold, the
    release point (users a key needs to be released half / 99% of the time, from the
    calibrated parameters alone: ``pipelines.summary.users_at``), the expected errors of
    the released values, and where the rest is (``--verbose``)."""
    spec = plan.spec
    privacy = report["privacy"]
    keys = list(spec.input.keys)
    # PWS's release point needs its release tables (accounting.pws.release_tables), which
    # the plan builds only where they can refuse the bound (tests/robustness/test_pws_plan_cost)
    cheap = spec.kind_object.CHEAP_RELEASE_POINT
    out = [f"release {spec.name}: {spec.kind} over "
           + (f"keys {', '.join(keys)}" if keys else "all rows (no keys)")
           + f", users in column {spec.input.user}",
           *_domain_lines(plan),
           f"guarantee: (epsilon={value_text(plan.budget.epsilon)}, "
           f"delta={value_text(plan.budget.delta)})-DP, user-level: {privacy['neighbouring']}",
           "stages: " + "; ".join(f"{s.name} (epsilon {value_text(s.epsilon)}, delta "
                                  f"{value_text(s.delta)})" for s in plan.budget.stages)]
    if spec.auto_bound:
        cands = list(plan.candidates)
        out.append(f"bound: max_keys_per_user chosen privately from {len(cands)} candidates "
                   f"{value_text(cands[0])}..{value_text(cands[-1])} ({spec.bounding.model} "
                   f"model); each candidate's parameters:")
        # what the counts are of, once for every candidate (C stands for the chosen bound)
        out += _words([summary.bounded_data(dict(report, bounding=dict(
            report["bounding"], max_keys_per_user="C")), " and ".join(keys) or "key")],
            report["mechanism"])
        shown = sorted({cands[0], cands[-1]})
        for bound in shown:
            params = plan.params_by_bound.get(bound)
            if params is None:
                continue
            out.append(f"  at C={bound}:")
            sub = dict(report, mechanism=params,
                       bounding=dict(report["bounding"], max_keys_per_user=bound,
                                     chosen_by="spec"))
            # [2:]: the bound and the bounded-data lines, said once above
            out += ["    " + line for line in _words(summary.noise_in_words(
                sub, keys, release_point=cheap)[2:], params)]
            out += ["    " + line for line in expected_errors(params, users)]
        if len(shown) < len(cands):
            out.append(f"  ({len(cands) - len(shown)} more candidates: thresher plan --verbose)")
    else:
        out += _words(summary.noise_in_words(report, keys, release_point=cheap),
                      report["mechanism"])
        out.append(f"parameters: {scalar_params(report['mechanism'])}")
        out += expected_errors(report["mechanism"], users)
    papers = cited_papers(report)
    if papers:
        out.append("papers: " + "; ".join(papers))
    if getattr(spec, "budget", None) is not None:
        b = spec.budget
        out.append(f"budget: charged to dataset {b.dataset} (total epsilon={value_text(b.epsilon)}, "
                   f"delta={value_text(b.delta)}) in the ledger {b.ledger}")
    out.append("every parameter and the accounting: thresher plan --verbose (or --json)")
    return wrap(out)


def scalar_params(params):
    """The parameters that are one number or one word (lists, groups and prose: --verbose)."""
    return ", ".join(f"{k}={value_text(v)}" for k, v in params.items()
                     if k not in _SKIP and v is not None and not isinstance(v, (list, tuple, dict))
                     and not (isinstance(v, str) and " " in v))


def expected_errors(params, users):
    """The expected absolute error of each released value from its noise alone (bias from
    bounding and clamping depends on the data, which the plan does not read)."""
    out = []
    if params.get("kind") in kinds.KINDS:
        out += kinds.get(params["kind"]).expected_error_words(params)
    if params.get("aggregates"):
        from thresher.pipelines.specs.aggregates import plan_lines  # heavy: pyarrow
        out.append(f"aggregates (noise only, at {users} users per key; --users N):")
        out += ["  " + _short_aggregate(line) for line in plan_lines(params, users)]
    return out


def _words(lines, params):
    """The release in words without the aggregates' lines (expected_errors has them)."""
    outputs = tuple(f"{a['output']}:" for a in params.get("aggregates") or [] if "output" in a)
    return [line for line in lines if not (outputs and line.startswith(outputs))]


def _short_aggregate(line):
    line = re.sub(r", grid step [^,;]+", "", line.strip())
    line = re.sub(r" \([\d.e+]+ grid units\)", "", line)
    return line.replace(" (noise only)", "").replace("discrete Gaussian ", "").replace(
        "discrete Laplace ", "Laplace ")


def cited_papers(report):
    """Each paper the accounting cites, once, in the order first cited."""
    text = json_text(report)
    refs = dict(PAPERS)
    if _BOTH_SAMPLE_AND_THRESHOLD in text:     # both versions of paper 003, cited once
        refs = {k: v for k, v in refs.items() if k not in ("000", "003")}
        refs["000/003"] = _BOTH_SAMPLE_AND_THRESHOLD
    found = [(text.find(ref), ref) for ref in refs.values() if ref in text]
    return [ref for _, ref in sorted(found)]


def json_text(value):
    return json.dumps(value, ensure_ascii=False).replace('\\"', '"')


def wrap(lines, width=WIDTH):
    """Each line at most ``width`` characters, continued lines indented under the first."""
    out = []
    for line in lines:
        if len(line) <= width:
            out.append(line)
            continue
        indent = " " * (len(line) - len(line.lstrip(" ")) + 4)
        out += textwrap.wrap(line, width=width, subsequent_indent=indent,
                             break_on_hyphens=False, break_long_words=True)
    return out

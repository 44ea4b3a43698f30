"""``thresher plan`` as text: one line per parameter group, plain values (no Python reprs
such as ``None`` or ``np.float64(...)``), papers cited by authors and title."""
import numbers

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


def format_plan(plan, report):
    """The lines of ``thresher plan``."""
    spec = plan.spec
    unit = (f"per user column {spec.input.user}" if spec.input.sample is None else
            f"sanitizing the existing sample's column {spec.input.sample['frequency']}")
    keys = ", ".join(spec.input.keys) or "(none: one global release)"
    out = [f"release {spec.name}: {spec.kind} over keys {keys}, {unit}",
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

"""`thresher schema`: the spec's JSON Schema, checked with the jsonschema library against
every spec in configs/ and docs/spec.md, against misspelt fields, and against the loader
itself (the same field names in every section, the same verdict on varied specs)."""
import copy
import glob
import json
import os
import re

import pytest

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.specs.schema import json_schema

from tests.pipelines.conftest import BASE_SPEC, ROOT

jsonschema = pytest.importorskip("jsonschema", reason="the dev extra (jsonschema) is not installed")


@pytest.fixture(scope="module")
def validator():
    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _release_specs():
    """Every thresher release spec under configs/ (Beam YAML pipelines are not specs)."""
    found = []
    for path in sorted(glob.glob(os.path.join(ROOT, "configs", "**", "*.yaml"), recursive=True)):
        data = spec_mod.load_yaml(open(path, encoding="utf-8").read(), path)
        if isinstance(data, dict) and "pipeline" not in data:
            found.append((os.path.relpath(path, ROOT), data))
    return found


def test_configs_hold_release_specs():
    assert [p for p, _ in _release_specs()] == [os.path.join("configs", "examples", name)
                                                for name in ("heavy_hitters.yaml", "quickstart.yaml")]


@pytest.mark.parametrize("path, data", _release_specs(), ids=lambda v: v if isinstance(v, str) else "")
def test_every_spec_in_configs_validates(validator, path, data):
    assert list(validator.iter_errors(data)) == []
    spec_mod.parse(data)          # and the loader agrees


def test_the_documented_spec_validates(validator):
    # the annotated spec of docs/spec.md (it was the README's until issue 37 moved it)
    text = open(os.path.join(ROOT, "docs", "spec.md"), encoding="utf-8").read()
    block = text.split("## The sections", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
    data = spec_mod.load_yaml(block)
    assert list(validator.iter_errors(data)) == []


def test_thresher_schema_prints_it(capsys):
    assert main(["schema"]) == 0
    assert json.loads(capsys.readouterr().out) == json_schema()


@pytest.mark.parametrize("dotted, value", [
    ("mechanizm", {"kind": "gaussian"}),          # misspelt top-level field
    ("privacy.epsilom", 1.0),
    ("input.delimeter", ";"),
    ("mechanism.scale", 4.0),                     # a laplace field on a gaussian release
    ("privacy.delta", 1.0),
    ("privacy.epsilon", "1e-8"),                  # a string, as YAML 1.1 would have read it
    ("bounding.max_keys_per_user", "eight"),
    ("mechanism.kind", "gausian"),
    ("budget", {"ledger": "l.sqlite", "dataset": "d", "epsilon": 2.0}),
])
def test_misspelt_and_wrong_fields_are_rejected_by_both(validator, dotted, value):
    data = copy.deepcopy(BASE_SPEC)
    node, parts = data, dotted.split(".")
    for part in parts[:-1]:
        node = node[part]
    node[parts[-1]] = value
    errors = list(validator.iter_errors(data))
    assert errors, dotted
    with pytest.raises(spec_mod.SpecError):
        spec_mod.parse(data)


_ALLOWED = re.compile(r"allowed fields of (the spec|\S+): (.+)$")


def _loader_fields(section, data):
    """The field names the loader accepts in ``section``, from its own error message."""
    with pytest.raises(spec_mod.SpecError) as err:
        spec_mod.parse(data)
    match = _ALLOWED.search(str(err.value))
    assert match and match.group(1) == section, str(err.value)
    return set(match.group(2).split(", "))


def _with(dotted, value, base=None):
    data = copy.deepcopy(base or BASE_SPEC)
    node, parts = data, dotted.split(".")
    for part in parts[:-1]:
        node = node.setdefault(part, {})
    node[parts[-1]] = value
    return data


@pytest.mark.parametrize("section", ["", "input", "privacy", "bounding", "bounding.auto",
                                     "output", "budget"])
def test_schema_sections_list_the_loaders_fields(section):
    schema = json_schema()
    node = schema
    for part in [p for p in section.split(".") if p]:
        node = node["properties"][part]
    base = copy.deepcopy(BASE_SPEC)
    if section == "bounding.auto":
        base["bounding"] = {"max_keys_per_user": "auto", "auto": {}}
    if section == "budget":
        base["budget"] = {"ledger": "l.sqlite", "dataset": "d", "epsilon": 2.0, "delta": 1e-6}
    data = _with(f"{section}.zzz_unknown" if section else "zzz_unknown", 1, base)
    assert set(node["properties"]) == _loader_fields(section or "the spec", data)


@pytest.mark.parametrize("kind", spec_mod.KINDS)
def test_schema_lists_each_kinds_fields(kind):
    variant = next(v["then"] for v in json_schema()["properties"]["mechanism"]["allOf"]
                   if v["if"]["properties"]["kind"] == {"const": kind})
    assert variant["properties"]["kind"] == {"const": kind}
    data = _with("mechanism", {"kind": kind, "zzz_unknown": 1})
    assert set(variant["properties"]) == _loader_fields("mechanism", data)


@pytest.mark.parametrize("changes", [
    {"mechanism": {"kind": "laplace", "scale": 4.0}},
    {"mechanism": {"kind": "sample_and_threshold", "accounting": "kl"}},
    {"mechanism": {"kind": "weighted_sampling", "report": "keys"}},
    {"bounding": {"max_keys_per_user": "auto", "auto": {"max_bound": 64, "dropped_weight": 2,
                                                               "objective": "l1"}}},
    {"bounding": {"max_keys_per_user": 4, "model": "l1"}, "mechanism": {"kind": "laplace"}},
    {"input": {"path": "d/*.tsv", "user": "u", "keys": "k", "delimiter": "\t"}},
    {"budget": {"ledger": "l.sqlite", "dataset": "d", "epsilon": 3, "delta": 1e-6}},
    {"description": "free text"},
])
def test_specs_the_loader_accepts_validate(validator, changes):
    data = copy.deepcopy(BASE_SPEC)
    data.update(changes)
    spec_mod.parse(data)
    assert list(validator.iter_errors(data)) == []


def _wrong_values(declaration):
    """Values a declaration refuses: one of the wrong type, and one past each end."""
    kind = declaration.get("type")
    if "enum" in declaration or "const" in declaration:
        yield "zzz_not_a_choice"
    if kind in ("number", "integer"):
        yield "zzz_text"
        for key, step in (("minimum", -1), ("exclusiveMinimum", 0), ("maximum", 1),
                          ("exclusiveMaximum", 0)):
            if key in declaration:
                yield declaration[key] + step
    if kind == "integer":
        yield 1.5
    if kind == "boolean":
        yield "yes"
    if kind == "array":
        yield "zzz_not_a_list"


@pytest.mark.parametrize("kind", spec_mod.KINDS)
def test_each_kinds_declared_fields_are_what_the_loader_enforces(kind):
    """One declaration, two uses: for every field a kind declares with a type, range or
    choice, a value the declaration refuses is refused by ``thresher validate``'s loader,
    naming the field and saying what the declaration allows (pipelines.declare.allowed)."""
    from thresher.pipelines.common import declare
    from thresher.pipelines import kinds
    module = kinds.module(kind)
    base = {"kind": kind, **({"column": "v", "ranks": [0.5], "domain": [0, 1]}
                             if kind == "quantiles" else {})}
    checked = 0
    for name, declaration in module.FIELDS.items():
        declaration = declare.field(declaration)
        for value in _wrong_values(declaration):
            with pytest.raises(spec_mod.SpecError) as err:
                spec_mod.parse_mechanism({**base, name: value})
            assert err.value.field.startswith(f"mechanism.{name}"), (name, value, str(err.value))
            if err.value.field == f"mechanism.{name}":
                assert (declare.allowed(declaration) in err.value.message
                        or "must be" in err.value.message), str(err.value)
            checked += 1
    if kind in kinds._ORDER:        # thresher's own kinds declare types, ranges, choices
        assert checked >= 3, kind
    elif not checked:
        pytest.skip(f"{kind} declares its fields by description only (its parse() checks them)")


def test_a_new_kind_module_is_found(tmp_path, monkeypatch):
    """Adding a kind is adding its module: the package lists every module not starting
    with _, thresher's own kinds first."""
    from thresher.pipelines import kinds
    (tmp_path / "zz_new_kind.py").write_text("FIELDS = {}\n")
    (tmp_path / "_zz_helper.py").write_text("\n")
    monkeypatch.setattr(kinds, "__path__", [*kinds.__path__, str(tmp_path)])
    found = kinds._discover()
    assert found[:len(kinds._ORDER)] == kinds._ORDER
    assert "zz_new_kind" in found and "_zz_helper" not in found


def test_a_kind_may_declare_a_field_by_description_only():
    """A field declared by its text alone (kinds written before the schema) accepts any
    value in the schema; the kind's parse() checks it."""
    from thresher.pipelines.common import declare
    variant = declare.mapping({"kind": declare.const("k"), "x": "free text"}, ("kind",))
    assert variant["properties"]["x"] == {"description": "free text"}
    declare.check({"kind": "k", "x": [1, "anything"]}, variant, "mechanism")
    with pytest.raises(spec_mod.SpecError, match="mechanism.y: unknown field"):
        declare.check({"kind": "k", "y": 1}, variant, "mechanism")


def test_schema_messages_name_the_path_and_what_is_allowed():
    from thresher.pipelines.common import declare
    cases = [
        ({"privacy": {"epsilon": "1e-8", "delta": 1e-8}}, "privacy.epsilon: must be a number > 0, got str '1e-8'"),
        ({"bounding": {"max_keys_per_user": 0}}, "bounding.max_keys_per_user: must be an integer >= 1 and <= 10000000, got 0"),
        ({"bounding": {"max_keys_per_user": "many"}}, "bounding.max_keys_per_user: must be an integer >= 1 and <= 10000000 or \"auto\", got str 'many'"),
        ({"input": {"path": "a.csv", "user": "u", "keys": ["a", 3]}}, "input.keys[1]: must be a non-empty string, got int 3"),
        ({"privacy": {"epsilon": float("inf"), "delta": 1e-8}}, "privacy.epsilon: must be finite, got inf"),
        ({"mechanism": {"kind": "gausian"}}, "mechanism.kind: must be one of gaussian, laplace"),
        ({"mechanism": {}}, "mechanism.kind: is required; one of gaussian, laplace"),
    ]
    for change, message in cases:
        data = copy.deepcopy(BASE_SPEC)
        data.update(change)
        with pytest.raises(spec_mod.SpecError) as err:
            spec_mod.parse(data)
        assert str(err.value).startswith(message), str(err.value)
        assert "\n" not in str(err.value)
    assert declare.dotted(["input", "keys", 0, "x"]) == "input.keys[0].x"


def test_schema_copies_agree_with_their_owners():
    """Literals the schema keeps to avoid loading numerics agree with their owners."""
    from thresher.accounting.contribution_bound import DROPPED_WEIGHT_RULES
    from thresher.pipelines.specs import schema
    assert tuple(schema.DROPPED_WEIGHT_RULES) == tuple(DROPPED_WEIGHT_RULES)
    from thresher.accounting.contribution_bound import OBJECTIVES
    assert tuple(schema.OBJECTIVES) == tuple(OBJECTIVES)
    from thresher.accounting.pws import SAMPLING_SCHEMES
    from thresher.pipelines.kinds._sample_fields import SCHEMES
    assert tuple(SCHEMES) == tuple(SAMPLING_SCHEMES)

"""`thresher schema`: the spec's JSON Schema, checked with the jsonschema library against
every spec in configs/ and the README, against misspelt fields, and against the loader
itself (the same field names in every section, the same verdict on varied specs)."""
import copy
import glob
import json
import os
import re

import pytest

from pipelines import spec as spec_mod
from pipelines.cli import main
from pipelines.schema import json_schema

from .conftest import BASE_SPEC, ROOT

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


def test_the_readme_spec_validates(validator):
    text = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    block = text.split("## The release spec", 1)[1].split("```yaml\n", 1)[1].split("```", 1)[0]
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
    variant = next(v for v in json_schema()["properties"]["mechanism"]["oneOf"]
                   if v["properties"]["kind"] == {"const": kind})
    data = _with("mechanism", {"kind": kind, "zzz_unknown": 1})
    assert set(variant["properties"]) - {"kind"} == _loader_fields("mechanism", data)


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

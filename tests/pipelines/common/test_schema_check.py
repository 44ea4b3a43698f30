"""pipelines/common/schema_check.py gives jsonschema's answer (valid or not) on thresher's spec
schemas, or no answer; a valid spec is then checked without importing jsonschema."""
import copy
import datetime
import json
import os
import subprocess
import sys

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from thresher.pipelines.specs import schema
from thresher.pipelines.common import schema_check
from thresher.pipelines.specs.spec import load_yaml

from tests.pipelines.conftest import BASE_SPEC, ROOT


def _jsonschema_valid(document, sch):
    return jsonschema.Draft202012Validator(sch).is_valid(document)


def _seeds():
    """Valid specs: the bundled examples and the base spec with every kind and section."""
    seeds = []
    for folder in ("configs/examples", "configs/beam_yaml"):
        for name in sorted(os.listdir(os.path.join(ROOT, folder))):
            if name.endswith(".yaml"):
                with open(os.path.join(ROOT, folder, name), encoding="utf-8") as handle:
                    document = load_yaml(handle.read(), source=name)
                if isinstance(document, dict) and "mechanism" in document:
                    seeds.append(document)
    required = {"quantiles": {"column": "x", "ranks": [0.25, 0.5], "domain": [0, 100]}}
    for kind in schema.KINDS:
        spec = copy.deepcopy(BASE_SPEC)
        spec["mechanism"] = {"kind": kind, **required.get(kind, {})}
        seeds.append(spec)
    auto = copy.deepcopy(BASE_SPEC)
    auto["bounding"] = {"max_keys_per_user": "auto", "auto": {"epsilon": 0.2,
                                                              "max_bound": 64}}
    seeds.append(auto)
    return seeds


SEEDS = _seeds()
FULL = schema.json_schema()


def _scalars(node, out):
    """Values near the schema's own constants: enum options, consts, bounds and their
    neighbours (where validity flips), type-confusable ones."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == "enum":
                out.extend(v)
            elif k == "const":
                out.append(v)
            elif k in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum",
                       "minItems", "maxItems", "minLength", "maxLength"):
                out.extend([v, v + 1, v - 1, float(v), v + 0.5, v - 1e-9])
            _scalars(v, out)
    elif isinstance(node, list):
        for v in node:
            _scalars(v, out)
    return out


POOL = sorted({json.dumps(v) for v in _scalars(FULL, [])
               + [0, 1, -1, 1.0, 2.5, True, False, None, "", "x", "auto", "l0", "gaussian",
                  [], ["word"], ["a", "a"], [1, True], [1, 1.0], {}, {"a": 1}, 1e300]})
POOL = [json.loads(v) for v in POOL]

values = st.recursive(st.sampled_from(POOL),
                      lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(st.sampled_from(["a", "kind", "path", "epsilon"]), inner,
                                        max_size=2),
                      max_leaves=4)


def _paths(document, prefix=()):
    yield prefix
    if isinstance(document, dict):
        for k, v in document.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(document, list):
        for i, v in enumerate(document):
            yield from _paths(v, (*prefix, i))


@st.composite
def mutated_specs(draw):
    document = copy.deepcopy(draw(st.sampled_from(SEEDS)))
    for _ in range(draw(st.integers(1, 3))):
        paths = [p for p in _paths(document) if p]
        path = draw(st.sampled_from(paths))
        parent = document
        for part in path[:-1]:
            parent = parent[part]
        action = draw(st.sampled_from(["same type", "same type", "set", "delete", "add"]))
        same = [v for v in POOL if type(v) is type(parent[path[-1]])]
        if action == "same type" and same:     # mostly still valid, or out of a range
            parent[path[-1]] = copy.deepcopy(draw(st.sampled_from(same)))
        elif action in ("set", "same type"):
            parent[path[-1]] = copy.deepcopy(draw(values))   # never edit the pool
        elif action == "delete":
            del parent[path[-1]]
        elif isinstance(parent, dict):
            parent[draw(st.sampled_from(["extra", "kind", "sigma", "epsilon", "auto",
                                         "candidates", "public_keys"]))] = copy.deepcopy(draw(values))
    return document


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(mutated_specs(), st.booleans())
def test_the_quick_answer_is_jsonschemas(document, one_kind):
    """Random edits of valid specs (near the schema's bounds, enums and types), checked
    against the full schema and against the one-kind schema the loader uses: the quick
    check always answers for these plain values, and answers as jsonschema does."""
    kind = (document.get("mechanism") or {}).get("kind") if isinstance(document.get("mechanism"), dict) else None
    sch = schema.json_schema(kinds=(kind,)) if one_kind and kind in schema.KINDS else FULL
    answer = schema_check.valid(document, sch)
    assert answer is not None
    assert answer == _jsonschema_valid(document, sch)


@pytest.mark.parametrize("index", range(len(SEEDS)))
def test_valid_specs_are_recognised(index):
    """(Of the random edits above ~6 % stay valid; the answer that matters most, never
    True for an invalid spec, is what the other 94 % test.)"""
    document = SEEDS[index]
    kind = document["mechanism"]["kind"]
    for sch in (FULL, schema.json_schema(kinds=(kind,))):
        assert _jsonschema_valid(document, sch)
        assert schema_check.valid(document, sch) is True


@pytest.mark.parametrize("value, sch, expected", [
    (1.0, {"type": "integer"}, True),
    (1.5, {"type": "integer"}, False),
    (True, {"type": "integer"}, False),
    (True, {"type": "number"}, False),
    (True, {"enum": [1]}, False),
    (1.0, {"enum": [1]}, True),
    (1, {"const": True}, False),
    ([1, 1.0], {"uniqueItems": True}, False),
    ([1, True], {"uniqueItems": True}, True),
    ([[1], [True]], {"uniqueItems": True}, True),
    ([[1], [1.0]], {"uniqueItems": True}, False),
    ([{"a": [1]}, {"a": [1]}], {"uniqueItems": True}, False),

    ("abc", {"pattern": "b"}, True),            # re.search, not a full match
    ("abc", {"pattern": "^b"}, False),
    ("é", {"maxLength": 1}, True),              # code points
    (5, {"pattern": "x", "minLength": 3}, True),   # string keywords ignore other types
    ("x", {"minimum": 3}, True),
    ({"a": 1}, {"properties": {"a": {"type": "string"}}, "additionalProperties": False}, False),
    ({"b": 1}, {"properties": {"a": {}}, "additionalProperties": {"type": "integer"}}, True),
    (3, {"oneOf": [{"type": "integer"}, {"type": "number"}]}, False),
    (3, {"if": {"minimum": 5}, "then": False, "else": {"maximum": 4}}, True),
    (7, {"if": {"minimum": 5}, "then": False, "else": {"maximum": 4}}, False),
])
def test_keywords_as_jsonschema_decides_them(value, sch, expected):
    assert _jsonschema_valid(value, sch) is expected
    assert schema_check.valid(value, sch) is expected


@pytest.mark.parametrize("value, sch", [
    (1, {"multipleOf": 2}),                                 # a keyword it does not decide
    ({"a": 1}, {"patternProperties": {"a": {}}, "additionalProperties": False}),
    (datetime.date(2020, 1, 1), {"type": "string"}),        # a YAML date: not a plain value
    ({1: "x"}, {"type": "object"}),                         # a YAML integer key
    ([b"x"], {"items": {"type": "string"}}),              # bytes inside a list
    ([[i] for i in range(1001)], {"uniqueItems": True}),    # many lists: jsonschema decides
])
def test_no_answer_outside_what_it_decides(value, sch):
    assert schema_check.valid(value, sch) is None


def test_long_lists_of_scalars_are_decided_without_pairwise_comparison(monkeypatch):
    """uniqueItems over scalars goes through a set, never the pairwise _equal (200,000
    items pairwise would be ~2e10 comparisons: the hostile-corpus case auto_20000_candidates
    timed out on the first version)."""
    def pairwise(a, b):
        raise AssertionError("uniqueItems compared scalars pairwise")

    monkeypatch.setattr(schema_check, "_equal", pairwise)
    candidates = list(range(1, 200_001))
    sch = {"type": "array", "items": {"type": "integer", "minimum": 1}, "uniqueItems": True}
    assert schema_check.valid(candidates, sch) is True
    assert schema_check.valid(candidates + [7.0], sch) is False


def test_a_valid_spec_loads_without_importing_jsonschema(tmp_path):
    spec = copy.deepcopy(BASE_SPEC)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    bad = tmp_path / "bad.yaml"
    spec["bounding"]["max_keys_per_user"] = 0
    bad.write_text(yaml.safe_dump(spec))
    probe = ("import sys\nfrom thresher.pipelines.specs import spec\nspec.load(sys.argv[1])\n"
             "print('jsonschema' in sys.modules)\n"
             "try:\n    spec.load(sys.argv[2])\nexcept Exception as exc:\n    print(exc)\n")
    proc = subprocess.run([sys.executable, "-c", probe, str(path), str(bad)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.strip().splitlines()[-2:]
    assert first == "False"
    assert second.startswith("bounding.max_keys_per_user: ")   # jsonschema's error, worded

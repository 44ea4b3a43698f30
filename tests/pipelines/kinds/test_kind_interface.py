"""The kind interface (pipelines/kinds/base.py, issue 37 part 1): every kind is one object
checked against it; a kind lacking a required method fails; a hook written in a kind's
module but not given to its kind object fails; and no release wiring outside the kinds
package probes a kind module (hasattr / getattr / kinds.module)."""
import ast
import os

import pyarrow as pa
import pytest

from thresher.pipelines import kinds
from thresher.pipelines.kinds import base
from thresher.pipelines.kinds.base import CountsKind, Kind, StagesKind, UsersKind

from tests.import_cycles import ROOT

SHAPES = {base.COUNTS: (CountsKind, "release"), base.USERS: (UsersKind, "release_users"),
          base.RECORDS: (StagesKind, "release_stages")}


def _interface_names():
    """Every hook and attribute of the interface (the base class and the three shapes)."""
    names = set()
    for cls in (Kind, CountsKind, UsersKind, StagesKind):
        names.update(n for n in vars(cls) if not n.startswith("_"))
    return names - {"name", "description", "releases_from", "plain_l0_bound"}


# Module-level names of the former duck-typed hooks that the interface no longer reads: a
# kind module defining one would be silently ignored.
RETIRED = ("PER_USER_BOUND",)


def test_every_kind_is_listed():
    assert kinds.KINDS[:8] == kinds._ORDER
    assert "base" not in kinds.KINDS


@pytest.mark.parametrize("name", kinds.KINDS)
def test_each_kind_meets_the_interface(name):
    kind = kinds.get(name)
    assert isinstance(kind, Kind) and kind.name == name
    shape, method = SHAPES[kind.releases_from]
    assert isinstance(kind, shape)
    assert [s for s in (CountsKind, UsersKind, StagesKind) if isinstance(kind, s)] == [shape]
    assert callable(getattr(kind, method))
    for required in ("parse", "calibrate"):
        assert callable(getattr(kind, required))
    assert isinstance(kind.FIELDS, dict) and kind.FIELDS
    assert set(kind.REQUIRED) <= set(kind.FIELDS)
    assert isinstance(kind.OUTPUT_COLUMNS, dict) and kind.OUTPUT_COLUMNS
    assert all(isinstance(t, pa.DataType) for t in kind.OUTPUT_COLUMNS.values())
    assert kind.description.startswith(f"``mechanism.kind: {name}``")
    for hook in ("verify_calibration", "check_key_types"):
        assert getattr(kind, hook) is None or callable(getattr(kind, hook))
    assert kind.WRITES_NOTES == (kind.NOTES_FILE is not None)
    assert not kind.WRITES_NOTES or kind.releases_from == base.RECORDS
    assert set(kind.NOISES) == set() or kind.noise({}) == kind.NOISES[0]
    assert isinstance(kind.AUTO_MAX_BOUND, int) and 1 <= kind.AUTO_MIN_BOUND <= kind.AUTO_MAX_BOUND
    assert 0 < kind.AUTO_EPSILON_FRACTION < 1
    assert isinstance(kind.score("l0"), str) and kind.score("l0")


@pytest.mark.parametrize("name", kinds.KINDS)
def test_a_hook_in_a_kind_module_is_its_kind_objects(name):
    """A hook function or constant a kind's module defines at its top (check_spec,
    stage_budget, AUTO_MAX_BOUND...) is the one its kind object uses: the class binds or
    overrides it; otherwise the wiring, which asks the object, would never see it."""
    module, kind = kinds.module(name), kinds.get(name)
    own = set()
    for cls in type(kind).__mro__:
        if cls in (Kind, CountsKind, UsersKind, StagesKind):
            break
        own.update(vars(cls))
    for hook in sorted(_interface_names() & set(vars(module))):
        assert hook in own, f"pipelines/kinds/{name}.py defines {hook} but {type(kind).__name__} does not"
    for hook in RETIRED:
        assert hook not in vars(module), f"pipelines/kinds/{name}.py: {hook} is no longer read"


def test_the_plain_bound_follows_the_bounding_hooks():
    """plain_l0_bound (pre-reduction and the one-pass automatic bound) only for counts kinds
    with the shared PerUserBound and no options."""
    assert [k for k in kinds.KINDS if kinds.get(k).plain_l0_bound] == [
        "gaussian", "laplace", "sample_and_threshold", "weighted_sampling"]


def _counts_kind(**methods):
    body = {"name": "zz_test", "FIELDS": {"x": "anything"}, "OUTPUT_COLUMNS": {"count": pa.int64()},
            **methods}
    return type("ZzTest", (CountsKind,), body)


def _parse(self, section):
    return section


def _calibrate(self, mech, *, epsilon, delta, max_keys_per_user, model):
    return {}


def _release(self, counts, params, key_columns):
    return counts


@pytest.mark.parametrize("missing", ["parse", "calibrate", "release"])
def test_a_kind_lacking_a_required_method_fails(missing):
    methods = {"parse": _parse, "calibrate": _calibrate, "release": _release}
    complete = _counts_kind(**methods)()
    assert complete.releases_from == base.COUNTS and complete.plain_l0_bound
    del methods[missing]
    with pytest.raises(TypeError, match=missing):
        _counts_kind(**methods)()


@pytest.mark.parametrize("shape, method", [(UsersKind, "release_users"),
                                           (StagesKind, "release_stages")])
def test_each_release_shape_requires_its_release(shape, method):
    cls = type("ZzShape", (shape,), {"parse": _parse, "calibrate": _calibrate})
    with pytest.raises(TypeError, match=method):
        cls()


def test_a_kind_must_choose_a_release_shape():
    cls = type("ZzNoShape", (Kind,), {"parse": _parse, "calibrate": _calibrate})
    with pytest.raises(TypeError, match="releases_from"):
        cls()


def test_a_new_kind_is_one_module(tmp_path, monkeypatch):
    """A module in pipelines/kinds/ with its kind object is a kind (listed, its schema
    variant built from the object); one without it is refused naming what is missing."""
    from thresher.pipelines.specs import schema
    (tmp_path / "zz_new.py").write_text(
        '"""``mechanism.kind: zz_new`` -- a test kind."""\n'
        "import pyarrow as pa\n"
        "from thresher.pipelines.kinds.base import CountsKind\n"
        "from thresher.pipelines.common import declare\n\n\n"
        "class ZzNew(CountsKind):\n"
        "    name = 'zz_new'\n"
        "    FIELDS = {'x': declare.integer(low=1, high=9)}\n"
        "    OUTPUT_COLUMNS = {'count': pa.int64()}\n\n"
        "    def parse(self, section):\n        return dict(section)\n\n"
        "    def calibrate(self, mech, *, epsilon, delta, max_keys_per_user, model):\n"
        "        return {'kind': 'zz_new'}\n\n"
        "    def release(self, counts, params, key_columns):\n        return counts\n\n\n"
        "KIND = ZzNew()\n")
    (tmp_path / "zz_no_object.py").write_text('"""a module without its kind object"""\n'
                                              "FIELDS = {}\n")
    monkeypatch.setattr(kinds, "__path__", [*kinds.__path__, str(tmp_path)])
    monkeypatch.setattr(kinds, "KINDS", kinds._discover())
    assert kinds.KINDS[-2:] == ("zz_new", "zz_no_object")
    try:
        new = kinds.get("zz_new")
        assert new.privacy_record({}, [("release", 0.5, 1e-7)], 3).delta0 == pytest.approx(1e-7)
        variant = schema.kind_variant("zz_new")
        assert variant["properties"]["x"]["maximum"] == 9
        assert variant["description"] == "``mechanism.kind: zz_new`` -- a test kind."
        with pytest.raises(TypeError, match="KIND = "):
            kinds.get("zz_no_object")
    finally:
        import sys
        for m in ("zz_new", "zz_no_object"):
            sys.modules.pop(f"{kinds.__name__}.{m}", None)


# ---- no probing of a kind module outside the kinds package ------------------------------

def _probes(path):
    """(line, text) of every hasattr / getattr whose object mentions a kind (or is a name
    assigned from an expression that does), and every kinds.module(...) call (the registry's access to a kind *module*), in one file."""
    source = open(path, encoding="utf-8").read()
    tree = ast.parse(source)
    # names given a value that mentions a kind (module = kind_module(spec.kind))
    kind_names = {t.id for node in ast.walk(tree) if isinstance(node, ast.Assign)
                  and "kind" in (ast.get_source_segment(source, node.value) or "").lower()
                  for t in node.targets if isinstance(t, ast.Name)}
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Name) and func.id in ("hasattr", "getattr") and node.args:
            target = ast.get_source_segment(source, node.args[0]) or ""
            if "kind" in target.lower() or target in kind_names:
                found.append((node.lineno, ast.get_source_segment(source, node)))
        if isinstance(func, ast.Attribute) and func.attr == "module" \
                and isinstance(func.value, ast.Name) and func.value.id.startswith("kinds"):
            found.append((node.lineno, ast.get_source_segment(source, node)))
    return found


def _pipeline_files(root):
    for here, _, files in os.walk(os.path.join(root, "pipelines")):
        if os.path.join("pipelines", "kinds") in here:
            continue
        for name in files:
            if name.endswith(".py"):
                yield os.path.join(here, name)


def test_no_release_wiring_probes_a_kind_module():
    probes = {os.path.relpath(p, ROOT): _probes(p) for p in _pipeline_files(ROOT)}
    assert {p: f for p, f in probes.items() if f} == {}


def test_the_probe_check_sees_a_probe(tmp_path):
    """The scan finds the forms it must (so an empty result means something)."""
    path = tmp_path / "wiring.py"
    path.write_text("def f(spec, kinds):\n"
                    "    m = kinds.module(spec.kind)\n"
                    "    return hasattr(kind_module(spec.kind), 'release_stages') or "
                    "getattr(m, 'SCORE', None)\n")
    assert [line for line, _ in _probes(str(path))] == [2, 3, 3]

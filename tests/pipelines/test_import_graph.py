"""The pipelines package imports without cycles: every import between its modules, at the
top of a file or inside a function, and the kinds that ``pipelines.kinds.module`` loads by
name, form a graph with no cycle; and each module imports alone in a fresh interpreter."""
import ast

import pytest

from tests.import_cycles import find_cycle, import_graph, imports_alone, package_modules


def _modules():
    return package_modules("pipelines")


def _graph():
    """{module: modules it imports}, function-local imports included; the kinds registry
    (``importlib.import_module`` in pipelines/kinds/__init__.py) imports every kind."""
    modules = _modules()
    edges = import_graph("pipelines")
    registry = "thresher.pipelines.kinds"
    tree = ast.parse(open(modules[registry], encoding="utf-8").read())
    if any(isinstance(n, ast.Attribute) and n.attr == "import_module" for n in ast.walk(tree)):
        edges[registry].update(m for m in modules if m.startswith(registry + ".")
                               and not m.rpartition(".")[2].startswith("_"))
    return edges


_cycle = find_cycle


def test_the_graph_sees_the_imports():
    """The checker finds what it must (so an empty result means something)."""
    edges = _graph()
    assert "thresher.pipelines.specs.fields" in edges["thresher.pipelines.specs.spec"]
    assert "thresher.pipelines.kinds.gaussian" in edges["thresher.pipelines.kinds"]
    assert "thresher.pipelines.dataio.public_keys" in edges["thresher.pipelines.kinds.gaussian"]
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_import_cycle_in_pipelines():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def test_spec_kinds_and_public_keys_do_not_import_each_other_back():
    edges = _graph()
    kinds = [m for m in edges if m.startswith("thresher.pipelines.kinds.")]
    for kind in kinds:
        assert "thresher.pipelines.specs.spec" not in edges[kind], kind
    assert "thresher.pipelines.specs.spec" not in edges["thresher.pipelines.dataio.public_keys"]
    assert not any(m.startswith("thresher.pipelines.kinds") for m in edges["thresher.pipelines.dataio.public_keys"])


# ---- layers: what each subpackage may import (its __init__ docstring says the same) -------

P = "thresher.pipelines"
ENTRY_POINTS = (f"{P}.cli", f"{P}.api", f"{P}.beam_yaml")
TOP = (*ENTRY_POINTS, f"{P}.errors")
# {subpackage or module: what it may import outside itself}; an entry names a package (and
# everything under it) or one module. The pipelines package itself (__version__) is free.
# The most specific key applies.
LAYERS = {
    "errors": (),
    "specs": ("errors", "dataio", "kinds", "ledgers.ledger", "continual.section"),
    "specs.declare": ("errors", "specs.fields", "specs.schema_check"),
    "specs.fields": ("errors",),
    "specs.schema_check": (),
    "specs.columns": ("errors",),
    "kinds": ("errors", "specs.declare", "specs.fields", "dataio.public_keys",
              "planning.limits", "planning.calibration_cache"),
    "dataio": ("errors", "specs.declare", "specs.fields", "planning.limits",
               "running.progress"),
    "ledgers": ("errors", "specs.declare", "running.progress", "kinds"),
    "planning": ("errors", "specs", "kinds", "dataio", "ledgers.records", "reports.citations"),
    "planning.limits": ("errors", "planning.calibration_cache"),
    "planning.calibration_cache": ("errors",),
    "planning.preflight": ("errors",),
    "reports": ("errors", "kinds", "specs", "planning"),
    "running": ("errors", "planning.calibration_cache", "running"),
    "running.progress": ("errors",),
    "running.release": ("errors", "specs", "kinds", "dataio", "ledgers", "planning", "running"),
    # engines check builds its synthetic release's spec and plan, then runs it as
    # release does (in child processes)
    "running.engine_check": ("errors", "specs", "planning", "running"),
    "continual": ("errors", "specs.declare", "dataio", "ledgers"),
    "continual.section": ("errors", "specs.declare"),
}


def _rule(module):
    """The LAYERS entry of a module below the entry points (the longest matching key)."""
    name = module.removeprefix(P + ".")
    parts = name.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in LAYERS:
            return ".".join(parts[:n])
    return None


def _allowed(rule, target):
    own = rule.split(".")[0]
    name = target.removeprefix(P + ".")
    if target == P or name.split(".")[0] == own and rule == own:
        return True
    return any(name == a or name.startswith(a + ".") for a in (*LAYERS[rule], rule))


def _layer_breaks(edges):
    breaks = []
    for module, targets in sorted(edges.items()):
        if module in ENTRY_POINTS or module == P:
            continue
        rule = _rule(module)
        assert rule is not None, f"{module}: no LAYERS entry (a new subpackage?)"
        breaks += [f"{module} -> {t}" for t in sorted(targets) if not _allowed(rule, t)]
    return breaks


def test_every_subpackage_opens_with_its_docstring_and_the_top_is_small():
    """At most 4 modules at the top of pipelines/ (the entry points and errors); every
    subpackage's __init__ opens with a docstring that says what it may import."""
    import os
    from tests.import_cycles import ROOT
    top = sorted(f for f in os.listdir(os.path.join(ROOT, "pipelines"))
                 if f.endswith(".py") and f != "__init__.py")
    assert [f"{P}.{f[:-3]}" for f in top] == sorted(TOP)
    packages = [m for m, path in _modules().items() if path.endswith("__init__.py")]
    assert len(packages) >= 8
    for package in packages:
        tree = ast.parse(open(_modules()[package], encoding="utf-8").read())
        doc = ast.get_docstring(tree)
        assert doc and tree.body and isinstance(tree.body[0], ast.Expr), package
        if package != P:
            assert "imports" in doc.lower(), f"{package}: its docstring says nothing of its imports"
            assert package.removeprefix(P + ".") in LAYERS, package


def test_subpackages_import_only_their_layers():
    assert _layer_breaks(_graph()) == []


def test_nothing_below_the_entry_points_imports_them():
    edges = _graph()
    for module, targets in edges.items():
        if module not in ENTRY_POINTS:
            assert not targets & set(ENTRY_POINTS), module


def test_the_layer_check_sees_a_break():
    """A kind importing the spec loader, I/O importing the plan: both reported."""
    edges = {f"{P}.kinds.gaussian": {f"{P}.specs.spec", f"{P}.specs.declare"},
             f"{P}.dataio.io": {f"{P}.planning.plan", f"{P}.running.progress"},
             f"{P}.running.engines": {f"{P}.running.release"}}
    assert _layer_breaks(edges) == [f"{P}.dataio.io -> {P}.planning.plan",
                                    f"{P}.kinds.gaussian -> {P}.specs.spec"]


# The modules of the former circle (spec <-> kinds <-> public_keys, through formats, ledger
# and aggregates); every other module under the slow mark (a fresh interpreter costs ~2 s).
CIRCLE = ("thresher.pipelines.specs.spec", "thresher.pipelines.specs.schema", "thresher.pipelines.dataio.public_keys", "thresher.pipelines.dataio.formats",
          "thresher.pipelines.ledgers.ledger", "thresher.pipelines.specs.aggregates", "thresher.pipelines.kinds")


def _circle(module):
    return module in CIRCLE or module.startswith("thresher.pipelines.kinds.")


@pytest.mark.parametrize("module", [
    m if _circle(m) else pytest.param(m, marks=pytest.mark.slow) for m in sorted(_modules())])
def test_each_module_imports_alone(module):
    """A fresh interpreter imports the module by itself (no hidden order dependence)."""
    ok, stderr = imports_alone(module)
    assert ok, stderr

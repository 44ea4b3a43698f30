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

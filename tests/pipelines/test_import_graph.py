"""The pipelines package imports without cycles: every import between its modules, at the
top of a file or inside a function, and the kinds that ``pipelines.kinds.module`` loads by
name, form a graph with no cycle; and each module imports alone in a fresh interpreter."""
import ast
import os
import subprocess
import sys

import pytest

from .conftest import ROOT
from tests.import_cycles import find_cycle

PACKAGE = os.path.join(ROOT, "pipelines")


def _modules():
    found = {}
    for folder, _, files in os.walk(PACKAGE):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(folder, name)
                module = "thresher." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def _graph():
    """{module: modules it imports}, function-local imports included; the kinds registry
    (``importlib.import_module`` in pipelines/kinds/__init__.py) imports every kind."""
    modules = _modules()
    edges = {m: set() for m in modules}
    for module, path in modules.items():
        for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
            if isinstance(node, ast.Import):
                edges[module].update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module:
                subs = {f"{node.module}.{a.name}" for a in node.names} & set(modules)
                edges[module].update(subs)
                if node.module in modules and len(subs) < len(node.names):
                    edges[module].add(node.module)      # names defined in the module itself
            elif (isinstance(node, ast.Attribute) and node.attr == "import_module"
                  and module == "thresher.pipelines.kinds"):
                edges[module].update(m for m in modules if m.startswith("thresher.pipelines.kinds.")
                                     and not m.rpartition(".")[2].startswith("_"))
    for module in edges:
        edges[module].discard(module)
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
          "thresher.pipelines.ledgers.ledger", "thresher.pipelines.aggregates", "thresher.pipelines.kinds")


def _circle(module):
    return module in CIRCLE or module.startswith("thresher.pipelines.kinds.")


@pytest.mark.parametrize("module", [
    m if _circle(m) else pytest.param(m, marks=pytest.mark.slow) for m in sorted(_modules())])
def test_each_module_imports_alone(module):
    """A fresh interpreter imports the module by itself (no hidden order dependence)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]

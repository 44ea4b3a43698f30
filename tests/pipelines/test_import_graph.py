"""The pipelines package is layered (issue 44, item 3): ORDER lists its subpackages bottom
first, and every import of a module of pipelines/ -- at the top of a file or inside a
function, and the kinds that ``pipelines.kinds`` loads by name -- goes to a module of the
same layer or a lower one. The graph of its modules has no cycle, an import inside a
function says why it is not at the top (``# heavy:`` / ``# cycle:`` / ``# optional:``),
docs/development.md draws the same order, and each module imports alone in a fresh
interpreter."""
import ast
import os
import re

import pytest

from tests.import_cycles import ROOT, find_cycle, import_graph, imported_modules, imports_alone, package_modules

P = "thresher.pipelines"

# Bottom first. A layer is one subpackage, or (the floor, the entry points) a few names of
# pipelines/ side by side; a module may import its own layer and any lower one.
ORDER = (
    ("errors", "common"),           # the floor: errors; declarations, limits, cache, progress, citations
    ("dataio",),                    # reading and publishing
    ("kinds",),                     # one object per mechanism kind
    ("ledgers",),                   # the privacy budget
    ("specs",),                     # the spec, its schema and its sections
    ("planning",),                  # the plan
    ("reports",),                   # summary, plan text, HTML page
    ("running",),                   # the release pipeline on Beam
    ("continual",),                 # continual release over a horizon
    ("api", "beam_yaml", "cli"),    # the entry points
)
RANK = {name: rank for rank, names in enumerate(ORDER) for name in names}

# What an import inside a function must say, on its line or the line above.
REASON = re.compile(r"#\s*(heavy|cycle|optional):")


def _modules():
    return package_modules("pipelines")


def _graph(modules=None, sources=None):
    """{module: modules of pipelines it imports}, function-local imports included; the kinds
    registry (``importlib.import_module`` in pipelines/kinds/__init__.py) imports every kind.
    ``sources`` ({module: text}) replaces the text of some modules (a planted import)."""
    modules = modules or _modules()
    edges = import_graph("pipelines")
    for module, text in (sources or {}).items():
        edges[module] = imported_modules(text, module, modules)
    registry = f"{P}.kinds"
    tree = ast.parse(open(modules[registry], encoding="utf-8").read())
    if any(isinstance(n, ast.Attribute) and n.attr == "import_module" for n in ast.walk(tree)):
        edges[registry].update(m for m in modules if m.startswith(registry + ".")
                               and not m.rpartition(".")[2].startswith("_"))
    return edges


def layer(module):
    """The ORDER rank of a module of pipelines/ (None for the package itself, whose
    ``__version__`` any module may read)."""
    if module == P:
        return None
    name = module.removeprefix(P + ".").split(".")[0]
    assert name in RANK, f"{module}: {name} is in no layer of ORDER (a new subpackage?)"
    return RANK[name]


def upward_imports(edges):
    """The imports that break the order: (module, imported) where the imported module's
    layer is above the importer's."""
    found = []
    for module, targets in sorted(edges.items()):
        mine = layer(module)
        for target in sorted(targets):
            theirs = layer(target)
            if mine is not None and theirs is not None and theirs > mine:
                found.append((module, target))
    return found


def test_the_graph_sees_the_imports():
    """The checker finds what it must (so an empty result means something): a top-level
    import, a function-local one, the kinds the registry loads by name."""
    edges = _graph()
    assert f"{P}.common.fields" in edges[f"{P}.specs.spec"]
    assert f"{P}.kinds.gaussian" in edges[f"{P}.kinds"]
    assert f"{P}.dataio.public_keys" in edges[f"{P}.kinds.gaussian"]
    assert f"{P}.running.release" in edges[f"{P}.cli"]          # inside _run (Beam)
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_every_name_of_pipelines_is_in_one_layer():
    """Each module and subpackage at the top of pipelines/ is in ORDER, once."""
    names = sorted(f[:-3] if f.endswith(".py") else f
                   for f in os.listdir(os.path.join(ROOT, "pipelines"))
                   if f != "__init__.py" and (f.endswith(".py") or os.path.isfile(
                       os.path.join(ROOT, "pipelines", f, "__init__.py"))))
    listed = [name for names in ORDER for name in names]
    assert sorted(listed) == names
    assert len(set(listed)) == len(listed)


def test_every_import_goes_to_the_same_or_a_lower_layer():
    assert upward_imports(_graph()) == []


@pytest.mark.parametrize("module, planted", [
    # an in-function import of the plan from I/O (two layers up)
    ("dataio.paths", "def _planted():\n    from thresher.pipelines.planning.plan import make_plan\n"),
    # a top-level import of the spec loader from a kind
    ("kinds.gaussian", "from thresher.pipelines.specs import spec\n"),
    # the floor importing a subpackage above it (a relative import)
    ("common.limits", "def _planted():\n    from ..kinds import get\n"),
    # anything below importing an entry point
    ("continual.command", "import thresher.pipelines.cli\n"),
])
def test_a_planted_upward_import_fails(module, planted):
    """A module's real source with one upward import added: the check reports that import
    and nothing else."""
    modules = _modules()
    name = f"{P}.{module}"
    text = open(modules[name], encoding="utf-8").read() + "\n" + planted
    breaks = upward_imports(_graph(modules, {name: text}))
    assert len(breaks) == 1 and breaks[0][0] == name, breaks


def test_an_import_of_the_same_or_a_lower_layer_passes():
    """Imports down and across one layer are not reported: the check is not blind-strict."""
    modules = _modules()
    name = f"{P}.planning.plan"
    text = (open(modules[name], encoding="utf-8").read()
            + "\nfrom thresher.pipelines.common import progress\n"
            + "from thresher.pipelines.planning import preflight\n")
    assert upward_imports(_graph(modules, {name: text})) == []


def test_no_import_cycle_in_pipelines():
    cycle = find_cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


def _function_imports(path):
    """(line, text) of every import statement inside a function of a file."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found = []

    def visit(node, inside):
        for child in ast.iter_child_nodes(node):
            if inside and isinstance(child, (ast.Import, ast.ImportFrom)):
                found.append(child)
            visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                      ast.Lambda)))
    visit(tree, False)
    return found


def _unexplained(path):
    lines = open(path, encoding="utf-8").read().split("\n")
    return [f"{os.path.relpath(path, ROOT)}:{n.lineno}: {ast.unparse(n)}"
            for n in _function_imports(path)
            if not REASON.search("\n".join(lines[max(n.lineno - 2, 0):n.end_lineno]))]


def test_an_import_inside_a_function_says_why():
    """Imports are at the top of a module, but for an import that would make importing the
    module heavy (Beam, pyarrow, numpy, matplotlib ...), add modules to a light command's
    start-up (``thresher --help``, ``validate``, ``plan`` ...), close a cycle, or load an
    optional dependency: each says so in a comment."""
    unexplained = []
    for path in sorted(_modules().values()):
        unexplained += _unexplained(path)
    assert unexplained == []


def test_an_unexplained_function_import_is_seen(tmp_path):
    path = tmp_path / "m.py"
    path.write_text("import os\n\ndef f():\n    import json\n    # heavy: numpy\n    import numpy\n"
                    "    import pyarrow  # optional: a guard\n")
    assert _unexplained(str(path)) == [f"{os.path.relpath(str(path), ROOT)}:4: import json"]


def test_docs_draw_the_same_order():
    """docs/development.md's picture names the layers top first, as ORDER does bottom first."""
    text = open(os.path.join(ROOT, "docs", "development.md"), encoding="utf-8").read()
    picture = text.split("<!-- layers -->")[1].split("<!-- /layers -->")[0]
    rows = [re.findall(r"\b[a-z_]+\b", line.split("--")[0]) for line in picture.splitlines()
            if line.strip().startswith(tuple("0123456789"))]
    assert [tuple(sorted(r[:len(names)])) for r, names in zip(rows, reversed(ORDER))] \
        == [tuple(sorted(names)) for names in reversed(ORDER)]
    assert len(rows) == len(ORDER)


def test_every_subpackage_opens_with_its_docstring():
    """Every subpackage's __init__ opens with a docstring that says what it may import."""
    modules = _modules()
    packages = [m for m, path in modules.items() if path.endswith("__init__.py")]
    assert len(packages) >= 10
    for package in packages:
        tree = ast.parse(open(modules[package], encoding="utf-8").read())
        doc = ast.get_docstring(tree)
        assert doc and tree.body and isinstance(tree.body[0], ast.Expr), package
        if package != P:
            assert "imports" in doc.lower(), f"{package}: its docstring says nothing of its imports"


# The modules of the former circle (spec <-> kinds <-> public_keys, through formats, ledger
# and aggregates); every other module under the slow mark (a fresh interpreter costs ~2 s).
CIRCLE = (f"{P}.specs.spec", f"{P}.specs.schema", f"{P}.dataio.public_keys", f"{P}.dataio.formats",
          f"{P}.ledgers.ledger", f"{P}.specs.aggregates", f"{P}.kinds")


def _circle(module):
    return module in CIRCLE or module.startswith(f"{P}.kinds.")


@pytest.mark.parametrize("module", [
    m if _circle(m) else pytest.param(m, marks=pytest.mark.slow) for m in sorted(_modules())])
def test_each_module_imports_alone(module):
    """A fresh interpreter imports the module by itself (no hidden order dependence)."""
    ok, stderr = imports_alone(module)
    assert ok, stderr

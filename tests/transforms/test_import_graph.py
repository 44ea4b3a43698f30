"""The transforms package imports one way (issue 37): its modules sit in six subpackages by
concern, layered bottom-up as LAYERS says; a module imports modules of its own subpackage
or of a lower layer, never a higher one or a sibling of its layer, by any import (at the
top of a file or inside a function). The graph has no cycle but one, documented
(ALLOWED_CYCLE_EDGE). The flat module paths of before issue 37 are gone (issue 44: no
finder keeps them alive) and nothing in the repository imports one.
"""
import ast
import os

import pytest

from tests.import_cycles import ROOT, find_cycle, import_graph, imports_alone, package_modules

PACKAGE = "thresher.transforms"
# Bottom layer first; the subpackages of one layer do not import each other.
LAYERS = (("plumbing",), ("randomness",), ("bounding",), ("selection",), ("values", "trees"))
RANK = {name: rank for rank, names in enumerate(LAYERS) for name in names}

# The flat paths thresher.transforms.<module> of before issue 37, kept alive by a meta-path
# finder until issue 44 retired it (CHANGELOG.md): {former module name: its subpackage}.
FORMER_PATHS = {
    **dict.fromkeys(("arrow_coder", "spill", "aggregate"), "plumbing"),
    **dict.fromkeys(("hashing", "samplers", "block_prf", "stream_construction", "keyed_random",
                     "secret_commitment", "user_identity"), "randomness"),
    **dict.fromkeys(("user_shards", "per_user_bound", "rand_clip", "prereduce", "scored_bound",
                     "choose_contribution_bound", "key_value_bound"), "bounding"),
    **dict.fromkeys(("release_fn", "noisy_threshold", "sample_and_threshold", "sanitize_sample",
                     "weighted_threshold", "adaptive_rounds", "public_domain", "unique_keys"),
                    "selection"),
    **dict.fromkeys(("aggregate_values", "choose_clip"), "values"),
    **dict.fromkeys(("heavy_hitters", "quantiles", "quantile_release", "public_cells"), "trees"),
}

# keyed_random.par_do applies a secret-reading DoFn through secret_commitment.CommittedParDo,
# whose DoFn subclasses keyed_random._WithSecret: the one cycle, closed by an import inside
# par_do (never at import time). Any other cycle fails.
ALLOWED_CYCLE_EDGE = (f"{PACKAGE}.randomness.keyed_random", f"{PACKAGE}.randomness.secret_commitment")


def _graph():
    return import_graph("transforms")


def _subpackage(module):
    """The subpackage of a module of thresher.transforms (None for the package itself)."""
    parts = module.split(".")
    return parts[2] if len(parts) > 2 else None


def back_edges(edges):
    """The imports that break the layering: (module, imported) where the imported module's
    subpackage is of the same or a higher layer than the importer's and is not its own
    (an import of the package ``thresher.transforms`` itself counts too)."""
    found = []
    for module, imported in sorted(edges.items()):
        mine = _subpackage(module)
        if mine is None:
            continue
        for other in sorted(imported):
            theirs = _subpackage(other)
            if theirs == mine:
                continue
            if theirs is None or RANK[theirs] >= RANK[mine]:
                found.append((module, other))
    return found


def _top_level_imports(path):
    """The import statements of a file that run when it is imported (outside any def)."""
    tree = ast.parse(open(path, encoding="utf-8").read())
    found, todo = [], list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            found.append(node)
        elif not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            todo.extend(ast.iter_child_nodes(node))
    return found


def test_the_graph_sees_the_imports():
    """The checker finds what it must (so an empty result means something): a top-level
    import, a function-local one across subpackages, and a back edge added to the graph."""
    edges = _graph()
    assert f"{PACKAGE}.plumbing.tables" in edges[f"{PACKAGE}.randomness.keyed_random"]
    assert f"{PACKAGE}.selection.noisy_threshold" in edges[f"{PACKAGE}.values.aggregate_values"]
    assert ALLOWED_CYCLE_EDGE[1] in edges[ALLOWED_CYCLE_EDGE[0]]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]


def test_no_more_than_six_files_at_the_top_and_every_module_in_a_layer():
    top = sorted(n for n in os.listdir(os.path.join(ROOT, "transforms"))
                 if os.path.isfile(os.path.join(ROOT, "transforms", n)))
    assert top == ["__init__.py"], top
    subpackages = {_subpackage(m) for m in package_modules("transforms")} - {None}
    assert subpackages == set(RANK)


@pytest.mark.parametrize("subpackage", sorted(RANK))
def test_every_subpackage_opens_with_its_docstring(subpackage):
    """What lives there and what it may import (and that it never imports a higher layer)."""
    path = os.path.join(ROOT, "transforms", subpackage, "__init__.py")
    doc = ast.get_docstring(ast.parse(open(path, encoding="utf-8").read()))
    assert doc and len(doc.split()) >= 20, path
    assert "may import" in doc.lower() or "imports nothing" in doc.lower(), path


def test_each_subpackage_imports_only_lower_layers():
    assert back_edges(_graph()) == []


@pytest.mark.parametrize("module, imported", [
    ("randomness.keyed_random", "bounding.user_shards"),      # randomness imports no bounding
    ("bounding.per_user_bound", "selection.noisy_threshold"),  # bounding no selection
    ("plumbing.aggregate", "randomness.samplers"),            # plumbing imports nothing here
    ("values.choose_clip", "trees.quantiles"),               # siblings of one layer
    ("trees.heavy_hitters", "values.aggregate_values"),
    ("selection.release_fn", "transforms"),                   # the package itself
])
def test_a_back_edge_is_found(module, imported):
    """Each kind of back edge, added to the real graph, is reported."""
    edges = {m: set(d) for m, d in _graph().items()}
    target = PACKAGE if imported == "transforms" else f"{PACKAGE}.{imported}"
    edges[f"{PACKAGE}.{module}"].add(target)
    assert back_edges(edges) == [(f"{PACKAGE}.{module}", target)]


def test_no_import_cycle_in_transforms():
    """No cycle once the one allowed edge is taken out, and that edge is an import inside
    a function (keyed_random imports secret_commitment only when par_do runs)."""
    edges = {m: set(d) for m, d in _graph().items()}
    module, imported = ALLOWED_CYCLE_EDGE
    edges[module].discard(imported)
    cycle = find_cycle(edges)
    assert cycle is None, " -> ".join(cycle)
    at_import_time = [n.lineno for n in _top_level_imports(package_modules("transforms")[module])
                      if imported in _names(n)]
    assert at_import_time == []


def _names(node):
    """The dotted names an import statement may load."""
    if isinstance(node, ast.Import):
        return {a.name for a in node.names}
    return {node.module} | {f"{node.module}.{a.name}" for a in node.names}


def _flat_path_imports(source):
    """Imports of a module by its flat path of before issue 37."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.module:
            names = [f"{node.module}.{a.name}" for a in node.names] + [node.module]
        elif isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        else:
            continue
        found += [n for n in names if n.startswith(PACKAGE + ".")
                  and n.split(".")[2] in FORMER_PATHS
                  and not n.startswith(f"{PACKAGE}.{FORMER_PATHS[n.split('.')[2]]}.")]
    return found


IGNORED_DIRS = {os.path.join("benchmarks", "data")}


def test_the_repository_imports_the_new_paths_only():
    """An import of a former flat path inside a function fails only when the function
    runs: none is left in any Python file of the repository."""
    assert _flat_path_imports("from thresher.transforms import keyed_random\n"
                              "import thresher.transforms.user_shards\n"
                              "from thresher.transforms.randomness import samplers\n") == [
        "thresher.transforms.keyed_random", "thresher.transforms.user_shards"]
    stale = []
    for folder in ("accounting", "pipelines", "transforms", "tests", "benchmarks", "src"):
        for here, dirs, files in os.walk(os.path.join(ROOT, folder)):
            # the repository's own files: not the benchmarks' generated data (.gitignore),
            # which holds whole older trees checked out by `bench_release --compare`
            dirs[:] = [d for d in dirs if os.path.relpath(os.path.join(here, d), ROOT)
                       not in IGNORED_DIRS]
            for name in files:
                if name.endswith(".py") and name != os.path.basename(__file__):
                    path = os.path.join(here, name)
                    found = _flat_path_imports(open(path, encoding="utf-8").read())
                    stale += [(os.path.relpath(path, ROOT), m) for m in found]
    assert stale == []


def test_the_former_flat_paths_are_gone():
    """No finder answers for the flat paths any more (issue 44): importing one fails, the
    package has no such attribute, and each module is at the place CHANGELOG.md names."""
    import importlib.util
    import sys

    import thresher.transforms as transforms
    import thresher.transforms.randomness.keyed_random  # noqa: F401 (the module exists)

    with pytest.raises(ModuleNotFoundError):
        import thresher.transforms.keyed_random  # noqa: F401
    with pytest.raises(ImportError):
        from thresher.transforms import user_shards  # noqa: F401
    with pytest.raises(AttributeError):
        transforms.samplers
    assert not [f for f in sys.meta_path if type(f).__module__.startswith("thresher")]
    for old, group in FORMER_PATHS.items():
        assert importlib.util.find_spec(f"{PACKAGE}.{old}") is None, old
        assert importlib.util.find_spec(f"{PACKAGE}.{group}.{old}") is not None, old


# A fresh interpreter costs ~2 s: the moved-down module and the package itself by default,
# every other module under the slow mark.
_FAST = (PACKAGE, f"{PACKAGE}.plumbing.tables", f"{PACKAGE}.randomness.keyed_random")


@pytest.mark.parametrize("module", [
    m if m in _FAST else pytest.param(m, marks=pytest.mark.slow)
    for m in sorted(package_modules("transforms"))])
def test_each_module_imports_alone(module):
    """A fresh interpreter imports the module by itself (no hidden order dependence)."""
    ok, stderr = imports_alone(module)
    assert ok, stderr

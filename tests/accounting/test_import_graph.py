"""The accounting package imports without cycles (issue 29): every import between its
modules, at the top of a file or inside a function, forms a graph with no cycle. The two
former circles (``pws`` <-> ``pws_pld``, ``sample_threshold`` <-> ``sample_threshold_pld``)
are now one subpackage each whose modules import one way; each of their modules imports
alone in a fresh interpreter."""
import pytest

from tests.import_cycles import find_cycle, import_graph, imported_modules, imports_alone, package_modules

_imports = imported_modules


def _modules():
    return package_modules("accounting")


def _graph():
    return import_graph("accounting")


_cycle = find_cycle


def test_the_graph_sees_every_kind_of_import():
    """The checker finds what it must (so an empty result means something): top-level and
    function-local imports, ``from package import module``, names from a module, relative
    imports; and the cycle search finds a known cycle."""
    modules = {"thresher.accounting.a": "a.py", "thresher.accounting.b": "b.py",
               "thresher.accounting.c": "c.py", "thresher.accounting.d": "d.py",
               "thresher.accounting.e": "e.py"}
    source = ("from thresher.accounting import a\n"
              "def f():\n    from thresher.accounting.b import x\n"
              "    import thresher.accounting.c\n"
              "class K:\n    def g(self):\n        from . import d\n        from .e import y\n")
    assert _imports(source, "thresher.accounting.z", modules) == {
        "thresher.accounting.a", "thresher.accounting.b", "thresher.accounting.c",
        "thresher.accounting.d", "thresher.accounting.e"}
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert "thresher.accounting.search" in _graph()["thresher.accounting.adaptive"]


def test_no_import_cycle_in_accounting():
    cycle = _cycle(_graph())
    assert cycle is None, " -> ".join(cycle)


# Each family: its modules from the bottom layer up; a module may import only those before it.
FAMILIES = {
    "pws": ("estimators", "pld", "core", "release"),
    "sample_threshold": ("core", "pld", "calibration", "trie"),
}


@pytest.mark.parametrize("family", sorted(FAMILIES))
def test_each_family_imports_one_way(family):
    """Inside a family a module imports only modules of a lower layer, never the family's
    package (its __init__ imports them all) nor one that imports it back."""
    edges = _graph()
    package = f"thresher.accounting.{family}"
    layers = FAMILIES[family]
    inside = {m for m in edges if m.startswith(package + ".")}
    assert inside == {f"{package}.{name}" for name in layers}
    for i, name in enumerate(layers):
        module = f"{package}.{name}"
        allowed = {f"{package}.{lower}" for lower in layers[:i]}
        reached = {m for m in edges[module] if m == package or m.startswith(package + ".")}
        assert reached <= allowed, (module, sorted(reached - allowed))


@pytest.mark.parametrize("module", sorted(
    m for m in _modules() if any(m.startswith(f"thresher.accounting.{f}") for f in FAMILIES)))
def test_each_family_module_imports_alone(module):
    """A fresh interpreter imports the module by itself (no hidden order dependence)."""
    ok, stderr = imports_alone(module)
    assert ok, stderr

"""The layers import one way: ``accounting`` imports nothing of thresher above it, and
``transforms`` imports no ``thresher.pipelines`` module (every import, at the top of a
file or inside a function, read from the source)."""
import ast
import os

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _imports(folder):
    for base, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(base, name)
                for node in ast.walk(ast.parse(open(path, encoding="utf-8").read())):
                    if isinstance(node, ast.ImportFrom) and node.module:
                        yield os.path.relpath(path, ROOT), node.module
                    elif isinstance(node, ast.Import):
                        for alias in node.names:
                            yield os.path.relpath(path, ROOT), alias.name


@pytest.mark.parametrize("folder, forbidden", [
    ("transforms", ("thresher.pipelines",)),
    ("accounting", ("thresher.pipelines", "thresher.transforms", "apache_beam")),
])
def test_layers_import_one_way(folder, forbidden):
    upward = [(path, module) for path, module in _imports(folder)
              if any(module == f or module.startswith(f + ".") for f in forbidden)]
    assert not upward, upward


def test_the_check_sees_imports():
    assert ("transforms/selection/unique_keys.py", "thresher.errors") in set(_imports("transforms"))

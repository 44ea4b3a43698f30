"""The import graph of a thresher subpackage and its cycle search, shared by the
import-graph tests (tests/accounting, tests/pipelines, tests/transforms)."""
import ast
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def package_modules(folder):
    """{dotted name as installed (thresher.<folder>...): path} for every module under the
    repository folder ``folder``; a package is its __init__."""
    found = {}
    for here, _, files in os.walk(os.path.join(ROOT, folder)):
        for name in files:
            if name.endswith(".py"):
                path = os.path.join(here, name)
                module = "thresher." + os.path.relpath(path, ROOT)[:-3].replace(os.sep, ".")
                found[module.removesuffix(".__init__")] = path
    return found


def imported_modules(source, module, modules):
    """The modules of ``modules`` that ``source`` (the text of ``module``) imports, by any
    import statement anywhere in it (function bodies included). ``from P import x`` counts
    as importing P.x when that is a module, else P (x is defined in P itself)."""
    package = module if modules.get(module, "").endswith("__init__.py") else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:      # relative: from .x import y / from . import y
                anchor = package
                for _ in range(node.level - 1):
                    anchor = anchor.rpartition(".")[0]
                base = f"{anchor}.{base}" if base else anchor
            subs = {f"{base}.{a.name}" for a in node.names} & set(modules)
            found.update(subs)
            if base in modules and len(subs) < len(node.names):
                found.add(base)
    found.discard(module)
    return found


def import_graph(folder):
    """{module: modules of the same folder it imports}."""
    modules = package_modules(folder)
    return {m: imported_modules(open(path, encoding="utf-8").read(), m, modules)
            for m, path in modules.items()}


def imports_alone(module):
    """(ok, stderr tail): a fresh interpreter imports ``module`` by itself (no hidden
    order dependence)."""
    done = subprocess.run([sys.executable, "-c", f"import {module}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    return done.returncode == 0, done.stderr[-2000:]


def find_cycle(edges):
    """One cycle of the graph {node: nodes it points to} as a list of nodes ending where it
    starts, or None (depth-first search, nodes in sorted order)."""
    state, stack = {}, []

    def visit(m):
        state[m] = "open"
        stack.append(m)
        for n in sorted(edges.get(m, ())):
            if state.get(n) == "open":
                return stack[stack.index(n):] + [n]
            if n not in state:
                found = visit(n)
                if found:
                    return found
        stack.pop()
        state[m] = "done"
        return None

    for m in sorted(edges):
        if m not in state:
            found = visit(m)
            if found:
                return found
    return None

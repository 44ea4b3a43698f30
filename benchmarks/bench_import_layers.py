"""How layered pipelines/ is (issue 44, item 3): the pairs of its subpackages that import
each other (any import, at the top of a file or inside a function), and the share of its
import statements that sit inside functions.

    python benchmarks/bench_import_layers.py [-v]

-v lists the imports of each mutual pair. Static (reads the sources, imports nothing)."""
import ast
import collections
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from tests.import_cycles import imported_modules, package_modules  # noqa: E402

P = "thresher.pipelines"


def _subpackage(module):
    return None if module == P else module.removeprefix(P + ".").split(".")[0]


def _is_thresher(node):
    if isinstance(node, ast.ImportFrom):
        return bool(node.level) or (node.module or "").startswith("thresher")
    return any(a.name.startswith("thresher") for a in node.names)


def measure():
    modules = package_modules("pipelines")
    edges = collections.defaultdict(list)       # (from subpackage, to subpackage) -> imports
    counts = collections.Counter()              # (kind, inside a function) -> statements
    for module, path in modules.items():
        def visit(node, inside):
            for child in ast.iter_child_nodes(node):
                if isinstance(child, (ast.Import, ast.ImportFrom)):
                    targets = imported_modules(ast.unparse(child), module, modules)
                    counts["all", inside] += 1
                    counts["thresher", inside] += _is_thresher(child)
                    counts["pipelines", inside] += bool(targets)
                    for target in targets:
                        a, b = _subpackage(module), _subpackage(target)
                        if a and b and a != b:
                            edges[a, b].append(f"{module} -> {target}" + (" (in a function)" if inside else ""))
                visit(child, inside or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef,
                                                          ast.Lambda)))
        visit(ast.parse(open(path, encoding="utf-8").read()), False)
    pairs = sorted({tuple(sorted(k)) for k in edges if (k[1], k[0]) in edges})
    return pairs, edges, counts


def main(argv):
    pairs, edges, counts = measure()
    print(f"subpackages of pipelines/ importing each other: {len(pairs)} pairs")
    for a, b in pairs:
        print(f"  {a} <-> {b}")
        if "-v" in argv:
            for line in edges[a, b] + edges[b, a]:
                print(f"      {line}")
    for kind, what in (("pipelines", "imports of pipelines/ modules"),
                       ("thresher", "imports of thresher modules"), ("all", "all imports")):
        inside, total = counts[kind, True], counts[kind, True] + counts[kind, False]
        print(f"{what}: {total} statements, {inside} inside functions ({100 * inside / total:.0f}%)")


if __name__ == "__main__":
    main(sys.argv[1:])

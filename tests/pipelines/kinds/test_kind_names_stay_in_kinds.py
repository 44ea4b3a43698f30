"""No kind-name switch outside ``pipelines/kinds/`` (issue 44 item 1, "the kind owns its
column"): every kind-specific decision is a hook or attribute of ``pipelines.kinds.base.Kind``,
so no module of the package compares a value with a kind's name, tests membership in a
list of kind names, or keys a table by them.

The scan reads the syntax trees (not the text: docstrings and messages may name kinds) of
every module of ``pipelines/`` but ``pipelines/kinds/``, ``transforms/`` and
``accounting/``, and flags a kind name written as a string literal

- on either side of ``==``, ``!=``, ``is``, ``in``, ``not in`` (alone or inside a tuple,
  list or set literal),
- as a key of a dict literal or the index of a subscript (``MAX_KEYS["gaussian"]``),
- as the argument of ``startswith`` / ``endswith``, or a ``case`` pattern;
- as a kind module imported by name (``from thresher.pipelines.kinds.weighted_sampling
  import ...``, ``from thresher.pipelines.kinds import quantiles``) or a kind object
  fetched by a literal name (``kinds.get("gaussian")``).

In ``pipelines/`` every one of the 8 kind names counts. ``accounting/`` and ``transforms/``
know no kinds (they import nothing of ``pipelines``) but have vocabularies sharing words
with them: the noise laws (``accounting.gshm.NOISES``, ``accounting.laplace_threshold.NOISES``,
``accounting.known_domain.KINDS``: "gaussian", "laplace") and the automatic bound's score
models (``accounting.contribution_bound.SCORE_MODELS``, which a kind names by its
``SCORE``); there the names in neither vocabulary count (heavy_hitters, quantiles,
adaptive). The vocabularies are read from those modules, not listed here.

``test_the_scan_finds_a_planted_switch`` checks the scanner itself on planted sources;
planting ``if spec.kind == "quantiles": ...`` in pipelines/reports/summary.py makes
``test_no_kind_name_switch_outside_the_kinds`` fail (checked by hand when it was written).
"""
import ast
import os

import pytest

from thresher.accounting import contribution_bound, gshm, known_domain, laplace_threshold
from thresher.pipelines import kinds

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
KIND_NAMES = frozenset(kinds._ORDER)
SHARED_WORDS = frozenset((*gshm.NOISES, *laplace_threshold.NOISES, *known_domain.KINDS,
                          *contribution_bound.SCORE_MODELS))
# folder -> the kind names a switch there is flagged on
SCANNED = {
    "pipelines": KIND_NAMES,
    "transforms": KIND_NAMES - SHARED_WORDS,
    "accounting": KIND_NAMES - SHARED_WORDS,
}
EXCLUDED = (os.path.join("pipelines", "kinds"),)
KINDS_PACKAGE = "thresher.pipelines.kinds"


def _named(node, names):
    """The kind name a literal node writes (a str constant, or one inside a tuple, list or
    set literal), else None."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value in names:
        return node.value
    if isinstance(node, (ast.Tuple, ast.List, ast.Set)):
        for element in node.elts:
            found = _named(element, names)
            if found:
                return found
    return None


def switches(source, names, filename="<source>"):
    """[(line, kind name, what)] of every kind-name switch of ``source`` (module docstring)."""
    found = []
    for node in ast.walk(ast.parse(source, filename)):
        if isinstance(node, ast.Compare):
            for operand in (node.left, *node.comparators):
                name = _named(operand, names)
                if name:
                    found.append((node.lineno, name, "comparison"))
        elif isinstance(node, ast.Dict):
            for key in node.keys:
                name = key is not None and _named(key, names)
                if name:
                    found.append((node.lineno, name, "dict key"))
        elif isinstance(node, ast.Subscript):
            name = _named(node.slice, names)
            if name:
                found.append((node.lineno, name, "subscript"))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("startswith", "endswith"):
            for arg in node.args:
                name = _named(arg, names)
                if name:
                    found.append((node.lineno, name, node.func.attr))
        elif isinstance(node, ast.MatchValue):
            name = _named(node.value, names)
            if name:
                found.append((node.lineno, name, "case"))
        elif isinstance(node, ast.ImportFrom) and node.module \
                and node.module.startswith(KINDS_PACKAGE):
            rest = node.module[len(KINDS_PACKAGE):].lstrip(".").split(".")[0]
            for name in (rest,) if rest else (a.name for a in node.names):
                if name in names:
                    found.append((node.lineno, name, "kind module import"))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith(KINDS_PACKAGE + ".") and \
                        alias.name[len(KINDS_PACKAGE) + 1:].split(".")[0] in names:
                    found.append((node.lineno, alias.name, "kind module import"))
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr in ("get", "module") and isinstance(node.func.value, ast.Name) \
                and node.func.value.id == "kinds":
            for arg in node.args:
                name = _named(arg, names)
                if name:
                    found.append((node.lineno, name, f"kinds.{node.func.attr}"))
    return found


def scan():
    """[(path, line, kind name, what)] over the scanned folders."""
    found = []
    for folder, names in SCANNED.items():
        for base, dirs, files in os.walk(os.path.join(ROOT, folder)):
            rel = os.path.relpath(base, ROOT)
            if any(rel == e or rel.startswith(e + os.sep) for e in EXCLUDED):
                continue
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            for file in sorted(files):
                if file.endswith(".py"):
                    path = os.path.join(base, file)
                    with open(path, encoding="utf-8") as handle:
                        source = handle.read()
                    found += [(os.path.relpath(path, ROOT), *hit)
                              for hit in switches(source, names, path)]
    return found


def test_no_kind_name_switch_outside_the_kinds():
    found = scan()
    assert not found, ("kind-name switches outside pipelines/kinds/ (make each decision a "
                       "hook or attribute of pipelines.kinds.base.Kind):\n"
                       + "\n".join(f"{p}:{line}: {name!r} ({what})" for p, line, name, what in found))


@pytest.mark.parametrize("planted", [
    'if spec.kind == "quantiles":\n    pass\n',
    'x = report["mechanism"].get("kind") != "gaussian"\n',
    'x = kind in ("laplace", "weighted_gaussian")\n',
    'MAX_KEYS = {"weighted_sampling": 10_000}\n',
    'x = MAX_KEYS["sample_and_threshold"]\n',
    'x = kind.startswith("heavy_hitters")\n',
    'match kind:\n    case "adaptive":\n        pass\n',
    'from thresher.pipelines.kinds.weighted_sampling import parse_sample\n',
    'from thresher.pipelines.kinds import quantiles\n',
    'import thresher.pipelines.kinds.laplace\n',
    'x = kinds.get("weighted_gaussian").MAX_KEYS\n',
])
def test_the_scan_finds_a_planted_switch(planted):
    assert len(switches(planted, KIND_NAMES)) == 1


def test_the_scan_leaves_words_that_are_not_switches():
    source = ('"""gaussian and laplace kinds."""\n'
              'def f(kind):\n'
              '    raise ValueError(f"{kind}: use quantiles")\n'
              'NAMES = ["heavy_hitters"]\n')
    assert switches(source, KIND_NAMES) == []

"""The tests mirror the code (issue 44, item 6; docs/development.md, "Where a test goes").

- Every folder under tests/ that holds tests is the mirror of a code package
  (tests/pipelines/ledgers/ for pipelines/ledgers/) or one of the cross-cutting folders
  below, each of which docs/development.md names.
- No test file is named after an issue ("test_report_issue36.py" says nothing of what
  it tests).
- A test file whose name starts with a module's name (test_ledger_messages.py,
  test_summary.py) sits beside the tests of that module's package: a name that names
  pipelines/ledgers/ledger.py belongs in tests/pipelines/ledgers/. Cross-cutting folders
  are exempt (an audit of the ledger is still an audit).

Each failure says where the file should go. Deterministic: it reads the file tree only."""
import os
import re

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The source folders that install as thresher.<part> (setup.py's package_dir).
CODE = ("accounting", "pipelines", "transforms")

# Folders that test across packages, by threat or by environment rather than by module.
CROSS_CUTTING = {
    "audit": "empirical privacy audits of the mechanisms",
    "privacy": "neighbouring-dataset byte comparisons and identity checks of whole releases",
    "robustness": "hostile inputs through the real CLI",
    "distributed": "Beam's portable runners, engines, worker pools and packaging",
}

ISSUE_NAME = re.compile(r"issue[_-]?\d+", re.IGNORECASE)


def code_packages(root):
    """{"pipelines/ledgers", ...}: every folder under CODE with an __init__.py."""
    found = set()
    for part in CODE:
        for folder, dirs, files in os.walk(os.path.join(root, part)):
            dirs[:] = [d for d in dirs if d != "__pycache__"]
            if "__init__.py" in files:
                found.add(os.path.relpath(folder, root).replace(os.sep, "/"))
    return found


def module_homes(root, packages):
    """{name: {test folder, ...}}: for each module name (and package name) in the code,
    the tests/ folders its tests belong in (the mirror of the package holding the module;
    for a package, its own mirror). Private modules (leading underscore) are left out."""
    homes = {}
    for package in packages:
        homes.setdefault(package.rsplit("/", 1)[-1], set()).add("tests/" + package)
        for name in os.listdir(os.path.join(root, package)):
            if name.endswith(".py") and not name.startswith("_"):
                homes.setdefault(name[:-3], set()).add("tests/" + package)
    return homes


def named_home(stem, homes):
    """(module name, {folders}) of the longest module name that ``stem`` starts with
    (whole words: "ledger_messages" starts with "ledger", "released_bytes" does not start
    with "release"), or (None, set())."""
    best = None
    for name in homes:
        if (stem == name or stem.startswith(name + "_")) and (best is None or len(name) > len(best)):
            best = name
    return (best, homes[best]) if best else (None, set())


def layout_problems(root):
    """One message per misplaced test file or folder under ``root``/tests, each saying
    where the file should go."""
    packages = code_packages(root)
    mirrors = {"tests"} | {"tests/" + p for p in packages}
    homes = module_homes(root, packages)
    problems = []
    for folder, dirs, files in os.walk(os.path.join(root, "tests")):
        dirs[:] = sorted(d for d in dirs if d != "__pycache__")
        rel = os.path.relpath(folder, root).replace(os.sep, "/")
        tests = sorted(f for f in files if f.startswith("test_") and f.endswith(".py"))
        top = rel.split("/")[1] if rel.count("/") else None
        cross = top in CROSS_CUTTING
        for name in tests:
            path = f"{rel}/{name}"
            stem = name[len("test_"):-len(".py")]
            if ISSUE_NAME.search(name):
                problems.append(f"{path} is named after an issue: name it by what it tests "
                                f"(test_<module>_<what>.py)")
            if cross:
                continue
            module, places = named_home(stem, homes)
            if module and rel not in places:
                problems.append(f"{path}: its name names the module {module!r}; move it to "
                                + " or ".join(f"{p}/" for p in sorted(places)))
            elif not module and rel not in mirrors:
                # a folder named after a package or module: that package's mirror
                same = sorted(homes.get(rel.rsplit("/", 1)[-1], ()))
                where = (" or ".join(f"{p}/" for p in same) if same else
                         "the tests/ folder mirroring the package it tests (tests/<package path>/)")
                problems.append(f"{path}: {rel}/ mirrors no code package and is not a cross-cutting "
                                f"folder ({', '.join('tests/' + c + '/' for c in CROSS_CUTTING)}); "
                                f"move it to {where}")
    return problems


def test_every_test_sits_in_the_mirror_of_what_it_tests():
    problems = layout_problems(ROOT)
    assert not problems, "tests/ does not mirror the code:\n" + "\n".join(problems)


def test_the_cross_cutting_folders_are_documented_and_exist():
    with open(os.path.join(ROOT, "docs", "development.md"), encoding="utf-8") as handle:
        doc = handle.read()
    for name in CROSS_CUTTING:
        assert os.path.isdir(os.path.join(ROOT, "tests", name)), name
        assert f"`tests/{name}/`" in doc, f"docs/development.md does not name tests/{name}/"


def _tree(root, paths):
    for path in paths:
        full = os.path.join(root, path)
        os.makedirs(os.path.dirname(full), exist_ok=True)
        with open(full, "w", encoding="utf-8") as handle:
            handle.write("")


def test_a_planted_misplaced_file_is_found_with_where_it_goes(tmp_path):
    """A small tree shaped like the repository: every planted mistake is reported once,
    naming the folder it belongs in; the well-placed files are not."""
    _tree(tmp_path, [
        "accounting/__init__.py", "accounting/zcdp.py",
        "pipelines/__init__.py", "pipelines/cli.py",
        "pipelines/ledgers/__init__.py", "pipelines/ledgers/ledger.py",
        "pipelines/kinds/__init__.py", "pipelines/kinds/gaussian.py", "pipelines/kinds/_common.py",
        "transforms/__init__.py",
        # well placed
        "tests/test_docs_links.py", "tests/accounting/test_zcdp.py",
        "tests/pipelines/test_cli_habits.py", "tests/pipelines/ledgers/test_ledger_ops.py",
        "tests/pipelines/kinds/test_renamed_kinds.py", "tests/audit/test_ledger_audit.py",
        "tests/pipelines/ledgers/legacy/ledger.py",
        # planted
        "tests/pipelines/test_ledger_backends.py",        # flat, though its module has a package
        "tests/kinds/test_kind_interface.py",             # a folder that mirrors nothing
        "tests/ledger/test_two_backends.py",              # a folder named after a module
        "tests/pipelines/ledgers/test_zcdp_records.py",   # names accounting/zcdp.py
        "tests/robustness/test_hostile_issue30.py",       # an issue's name
    ])
    problems = layout_problems(str(tmp_path))
    assert len(problems) == 5, problems
    assert any(p.startswith("tests/ledger/test_two_backends.py") and
               p.endswith("move it to tests/pipelines/ledgers/") for p in problems), problems
    assert any(p.startswith("tests/pipelines/test_ledger_backends.py") and
               p.endswith("move it to tests/pipelines/ledgers/") for p in problems), problems
    assert any(p.startswith("tests/kinds/test_kind_interface.py") and
               p.endswith("move it to tests/pipelines/kinds/") for p in problems), problems
    assert any(p.startswith("tests/pipelines/ledgers/test_zcdp_records.py") and
               p.endswith("move it to tests/accounting/") for p in problems), problems
    assert any(p.startswith("tests/robustness/test_hostile_issue30.py is named after an issue")
               for p in problems), problems

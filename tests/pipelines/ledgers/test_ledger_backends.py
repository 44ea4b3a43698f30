"""The ledger behind one backend interface (issue 44, item 4).

- One lifecycle scenario -- open, charge, refuse past the total, show the totals, abandon,
  and concurrent charges decided by the database's lock -- run through
  ``pipelines.ledgers.backend.Backend`` against both implementations: a SQLite file and a
  real PostgreSQL server (Debian's initdb, ``test_ledger_postgres.server``).
- The structure that keeps it so: no module of ``pipelines/ledgers/`` asks a connection
  what it is (no ``hasattr`` probe, no ``isinstance``/``getattr`` on a connection), only
  the two backend modules import a database driver, only ``store`` picks a backend, and
  the lifecycle calls nothing on a connection that the interface does not name.
"""
import ast
import os
import threading

import pytest

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import backend as backend_mod
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import ledger, store
from thresher.pipelines.ledgers.postgres_backend import PostgresBackend
from thresher.pipelines.ledgers.sqlite_backend import SQLiteBackend

from tests.pipelines.conftest import ROOT

LEDGERS = os.path.join(ROOT, "pipelines", "ledgers")
BACKEND_MODULES = ("backend.py", "sqlite_backend.py", "postgres_backend.py")
DRIVERS = ("sqlite3", "psycopg", "psycopg2")


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request, tmp_path):
    """The ledger: a SQLite file, or a fresh database on the test PostgreSQL server."""
    if request.param == "sqlite":
        return str(tmp_path / "ledgers" / "l.sqlite")
    pytest.importorskip("psycopg")
    return request.getfixturevalue("url")


try:
    from .test_ledger_postgres import server, url  # noqa: F401  (fixtures)
except pytest.skip.Exception:      # psycopg missing outside CI: the sqlite cases still run
    pass


def _budget(location, total=1.0):
    return ledger.BudgetSpec(ledger=location, dataset="ds", epsilon=total, delta=1e-6)


def _charge(epsilon):
    return comp.Charge(comp.dec(epsilon), comp.dec(1e-8), comp.dec("0.01"), comp.dec("1e-9"))


def _reserve(location, name, epsilon=0.5, total=1.0):
    return ledger.reserve_charge(_budget(location, total), name, "0" * 64, _charge(epsilon))


# ---- one lifecycle, both backends ------------------------------------------------------------

def test_the_backend_is_chosen_from_the_location_alone(target):
    expected = SQLiteBackend if target.endswith(".sqlite") else PostgresBackend
    assert store.backend_for(target) is expected
    assert expected.is_file == (expected is SQLiteBackend)
    # every operation of the interface is implemented (an abstract one left: not instantiable)
    assert not expected.__abstractmethods__


def test_one_lifecycle_through_the_interface(target):
    """Open, charge, refuse past the total, show, abandon: the same outcome on both."""
    # open for writing: the tables exist with the ledger's columns, through the interface
    conn = store.connect(target, create=True)
    try:
        for table, wanted in store.COLUMNS.items():
            assert set(wanted) <= set(conn.columns_of(table)), table
    finally:
        conn.close()
    # charge: two releases of 0.5 fill the total of 1.0
    first = _reserve(target, "first")
    first.publishing()
    first.commit("out-first")
    second = _reserve(target, "second")
    assert (first.row_id, second.row_id) == (1, 2)
    assert second.spent.epsilon == comp.dec("1.0")
    # refuse past the total: named ``budget``, nothing recorded for it
    with pytest.raises(SpecError) as refused:
        _reserve(target, "third")
    assert refused.value.field == "budget"
    assert "nothing was read or published" in refused.value.message
    # show: totals, running sums checked against the releases, every release with its id
    shown = ledger.summary(target)[0]
    assert shown["budget"] == {"epsilon": 1.0, "delta": 1e-6}
    assert shown["spent"] == {"epsilon": 1.0, "delta": 2e-8}
    assert shown["zcdp"]["rho_spent"] == 0.02 and "warning" not in shown
    assert [(r["id"], r["name"], r["state"]) for r in shown["releases"]] == [
        (1, "first", "published"), (2, "second", "reserved")]
    assert "spent epsilon 1 of 1, delta 2e-08 of 1e-06 (2 releases" in ledger.format_summary(
        ledger.summary(target))
    # abandon before reading: the reservation goes and its charge with it
    second.abandon()
    shown = ledger.summary(target)[0]
    assert shown["spent"] == {"epsilon": 0.5, "delta": 1e-8}
    assert [r["name"] for r in shown["releases"]] == ["first"]
    assert ledger.reservations(target) == []


def test_concurrent_charges_with_room_for_one(target):
    """Four threads (a connection each) charge 0.5 at once with 0.5 left: the database's
    lock (SQLite's BEGIN IMMEDIATE, PostgreSQL's row lock) admits exactly one."""
    _reserve(target, "first").abandon()      # creates the ledger (no dataset left)
    _reserve(target, "first")
    racers = 4
    barrier, outcomes = threading.Barrier(racers), []

    def charge(i):
        barrier.wait(timeout=60)
        try:
            _reserve(target, f"racer-{i}")
            outcomes.append("reserved")
        except SpecError as exc:
            outcomes.append(f"refused: {exc.field}")

    threads = [threading.Thread(target=charge, args=(i,)) for i in range(racers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=300)
    assert sorted(outcomes) == ["refused: budget"] * (racers - 1) + ["reserved"], outcomes
    shown = ledger.summary(target)[0]
    assert shown["spent"]["epsilon"] == 1.0 and len(shown["releases"]) == 2


# ---- the structure ---------------------------------------------------------------------------

def _modules():
    return sorted(n for n in os.listdir(LEDGERS) if n.endswith(".py"))


def _tree(name):
    with open(os.path.join(LEDGERS, name), encoding="utf-8") as handle:
        return ast.parse(handle.read(), name)


def _imported(tree):
    """Every module name an import statement names (``from a import b``: a and a.b)."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            yield node.module
            yield from (f"{node.module}.{alias.name}" for alias in node.names)


def _mentions_connection(node):
    """An expression that names a connection: ``conn``, ``self._conn``, ``connection``..."""
    return any("conn" in (n.id if isinstance(n, ast.Name) else n.attr).lower()
               for n in ast.walk(node) if isinstance(n, (ast.Name, ast.Attribute)))


def probes(name):
    """The connection probes in one module: any ``hasattr`` (what a thing is, asked at run
    time), and ``isinstance``/``getattr``/``type`` applied to a connection."""
    found = []
    for node in ast.walk(_tree(name)):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
            if node.func.id == "hasattr" or (
                    node.func.id in ("isinstance", "getattr", "type") and node.args
                    and _mentions_connection(node.args[0])):
                found.append((node.lineno, f"{name}:{node.lineno}: {ast.unparse(node)}"))
    return [text for _, text in sorted(found)]


def driver_imports(name):
    """The database drivers and backend modules a lifecycle module imports."""
    found = []
    for imported in _imported(_tree(name)):
        top = imported.split(".")[0]
        if top in DRIVERS or (name != "store.py" and imported.endswith(
                ("ledgers.sqlite_backend", "ledgers.postgres_backend"))):
            found.append(f"{name}: imports {imported}")
    return found


def calls_outside_the_interface(name):
    """Attributes used on an opened ledger (``conn.X``) or a backend class
    (``store.backend_for(...).X``) that ``Backend`` does not name."""
    interface = set(dir(backend_mod.Backend))
    found = []
    for node in ast.walk(_tree(name)):
        if not isinstance(node, ast.Attribute):
            continue
        base = node.value
        on_conn = isinstance(base, ast.Name) and base.id == "conn"
        on_class = (isinstance(base, ast.Call) and isinstance(base.func, ast.Attribute)
                    and base.func.attr == "backend_for")
        if (on_conn or on_class) and node.attr not in interface:
            found.append(f"{name}:{node.lineno}: {ast.unparse(node)}")
    return found


def test_no_module_of_the_ledger_probes_a_connection():
    assert [p for name in _modules() for p in probes(name)] == []


def test_only_the_backends_import_a_database_driver():
    lifecycle = [n for n in _modules() if n not in BACKEND_MODULES]
    assert {"store.py", "lifecycle.py", "operations.py", "show.py", "ledger.py"} <= set(
        lifecycle)
    assert [p for name in lifecycle for p in driver_imports(name)] == []
    # and the backends do (the check reads real imports)
    assert driver_imports("sqlite_backend.py") == ["sqlite_backend.py: imports sqlite3"]


def test_the_lifecycle_calls_only_the_interface():
    lifecycle = [n for n in _modules() if n not in BACKEND_MODULES]
    assert [p for name in lifecycle for p in calls_outside_the_interface(name)] == []


def test_the_structural_checks_see_a_planted_probe(tmp_path, monkeypatch):
    """The three checks above fail on a module that probes its connection as the ledger
    did before this change (``hasattr(conn, "lock_dataset")``, ``import sqlite3``,
    ``getattr(conn, "dialect", None)``), here a planted copy outside the package."""
    (tmp_path / "planted.py").write_text(
        "import sqlite3\n\n\n"
        "def reserve(conn):\n"
        "    if hasattr(conn, 'lock_dataset'):\n"
        "        return conn.lock_dataset('ds', ())\n"
        "    if getattr(conn, 'dialect', None) == 'postgresql':\n"
        "        return conn.dialect\n"
        "    if isinstance(conn, sqlite3.Connection):\n"
        "        return conn.execute('SELECT 1').lastrowid\n")
    monkeypatch.setitem(globals(), "LEDGERS", str(tmp_path))
    assert [p.split(": ", 1)[1] for p in probes("planted.py")] == [
        "hasattr(conn, 'lock_dataset')", "getattr(conn, 'dialect', None)",
        "isinstance(conn, sqlite3.Connection)"]
    assert driver_imports("planted.py") == ["planted.py: imports sqlite3"]
    assert calls_outside_the_interface("planted.py") == ["planted.py:8: conn.dialect"]

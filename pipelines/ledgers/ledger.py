"""The privacy-budget ledger: what has been spent on a dataset, across releases.

A spec may name a ledger and the total (epsilon, delta) that protects one dataset (the
same users, across every release made from it)::

    budget:
      ledger: ledgers/search-logs.sqlite   # or postgresql://user@host:5432/db
      dataset: search-logs
      epsilon: 3.0
      delta: 1.0e-6

      composition: zcdp                    # optional: basic (default) or zcdp
      threshold_delta: 5.0e-7              # optional, zcdp only: delta0_B (default delta/2)

Composition across releases (``pipelines.ledgers.composition``): ``basic`` -- a release
fits if the sum of the (epsilon, delta) of every release already charged to the dataset,
plus its own, stays within the total (Dwork & Roth, *The Algorithmic Foundations of
Differential Privacy*, Thm 3.16); ``zcdp`` -- each release is charged its approximate-zCDP
record (rho, delta0) (``pipelines.ledgers.records``) against rho_B and delta0_B, fixed
with the dataset (an approximate-zCDP filter; docs/accounting.md). The mode is fixed by
the dataset's first charged release. Sums are exact: each number is kept as the decimal
it was written as (``repr`` of the float; records rounded up, rho_B down, to 12
significant digits) and added with ``decimal.Decimal``, so ten releases at 0.1 fill a
total of 1.0 exactly. The running sums live in the dataset's row and are updated in the
transaction that reserves, abandons or releases a release (a reservation reads one row,
not the history); a ledger written by an older thresher gets the new columns (all
nullable) and the ledger's triggers (``TRIGGERS``) when it is next opened for writing,
and its sums are folded once. The triggers bind any program that writes the tables: a
release without its (rho, delta0) record is refused (an older thresher, which would not
update the sums, fails closed), and each change of a dataset's releases is counted, so
sums that do not cover every change are folded again and sums that cannot be right
refuse the reservation (review F1; ``_dataset_row``).

The life of one release in the ledger (``thresher run``, ``pipelines.running.release.run``):

1. ``reserve`` — before any input is opened, one ``BEGIN IMMEDIATE`` transaction (SQLite
   takes the database's write lock at BEGIN, so two runs cannot both read the old sum
   and both write) reads the dataset's running sums, refuses the release if it would
   exceed the dataset's budget in its mode (``SpecError`` naming ``budget``, exit 2), and
   otherwise inserts the release as ``reserved`` and adds it to the sums. A reserved
   release counts as spent.
2. The pipeline runs into a staging location that only the operator can see.
3. ``publishing`` — just before the release is moved into place the row becomes
   ``publishing`` in a write transaction, only if it is still ``reserved``. If that
   fails (the ledger cannot be written, or an operator released the reservation) nothing
   is published. From here on its output could have been seen.
4. On success the release becomes ``published`` (with its output path); if the ledger
   cannot record that, the release stands, stays charged as ``publishing``, and the run
   warns (it never exits with an error for a release that is in place).
   On an error or a refusal *before* step 2 reads the input (the spec, the input's
   files and schema, the output, the runner's options) the reservation is deleted (and
   the dataset's row, if this first release created it: only a charged release fixes a
   total). On an error once the pipeline has begun reading the input (a user over the
   row limit, a corrupt row group, Ctrl-C) the release stays charged as ``run_failed``:
   whether and when a run fails may depend on the data, and giving the budget back would
   make a failing run a free look at it (``Reservation.reading``; review F3). On an
   error *after* step 3 (publishing started but did not finish) the release stays
   charged, as ``publish_failed``: part of it may be visible, so its budget is spent.

A dataset's totals are written by thresher only -- by its first charged release, and by
``thresher ledger set-budget`` (``set_budget``: rho_B computed again, a total below what
is spent refused unless forced, the change recorded in ``budget_changes``) -- and each
time stamped with their digest (``totals_digest``). Totals that disagree -- a zcdp rho_B
that is not the one its (epsilon, delta, delta0_B) give, or totals that do not match the
digest, as after ``UPDATE datasets SET epsilon = ...`` -- refuse every reservation on the
dataset (``budget.ledger``, exit 2) and ``ledger show`` warns (issue 42). Values that no
thresher writes (``rho = 'abc'``, NaN, negative, an unknown composition) are ``BadRow``
errors naming the table, row and column, never internal errors.

A relative SQLite path in a spec file names a file beside the spec (``resolved_from``,
called by ``specs.spec.load``); ``~`` is the home folder.

A process killed outright (power loss, SIGKILL) leaves its row ``reserved``; it keeps
counting as spent, the safe side. ``thresher ledger reservations`` lists such rows and
``thresher ledger release ID`` frees one whose run has ended (docs/robustness.md,
"Ledger operations"). Any database error (locked, read-only, corrupt, tables of another
shape) is a SpecError naming the ledger (exit 2).

The ledger is an SQLite file (Python's standard ``sqlite3``); its locking needs a local
file system (not NFS). A ledger path that does not exist yet is created, with its folder.
Or it is a PostgreSQL database, given as a ``postgresql://`` URL
(``pipelines.ledger_postgres``: the same tables; the dataset's row is locked ``FOR
UPDATE`` where SQLite takes its write lock), shared by runs on several machines.

A release built into a user's Beam pipeline (``pipelines.beam_yaml``, ``thresher.Release``)
reserves when the pipeline *runs*, under a run token derived from the run's secret:
``reserve(plan, run_token=...)`` charges a token once, so a retried reservation of the
same run charges nothing more, and a second run of the same pipeline object (a new
secret, a new token) is a second release, charged again. A token found in the ledger is
taken as this run's own charge only if it was charged to the same dataset, by the same
spec digest, at the same charge (``_check_token_row``); otherwise the run is refused.
"""
import contextlib
import dataclasses
import datetime
import decimal
import hashlib
import logging
import math
import os
import re
import socket
import sqlite3

from thresher.pipelines.specs import declare

from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import ledger_postgres
from thresher.pipelines.ledgers.sums import NO_RECORD, UNFOLD  # noqa: F401 (ledger.NO_RECORD)
from thresher.pipelines.errors import SpecError

log = logging.getLogger("thresher")

# The spec's budget section (declared for pipelines.schema; REQUIRED are required).
FIELDS = {
    "ledger": declare.string(description="a SQLite file path, or a PostgreSQL database URL "
                                         "(postgresql://user@host:5432/db)"),
    "dataset": declare.string(description="what the total protects: the same users across "
                                          "releases"),
    "epsilon": declare.number(low=0, low_open=True, description="the total over all releases "
                                                                "on this dataset"),
    "delta": declare.number(low=0, high=1, high_open=True),
    "composition": declare.choice(comp.MODES, default=comp.BASIC, description=(
        "how releases on the dataset compose: basic (sum of epsilons and deltas) or zcdp "
        "(sum of each release's rho and delta0; docs/accounting.md); fixed by the "
        "dataset's first release")),
    "threshold_delta": declare.number(low=0, high=1, high_open=True, description=(
        "zcdp only: delta0_B, the part of delta charged at face value to thresholds "
        "(default delta / 2; 0 allowed)")),
}
REQUIRED = ("ledger", "dataset", "epsilon", "delta")
RESERVED, PUBLISHING, PUBLISHED, PUBLISH_FAILED = ("reserved", "publishing", "published",
                                                   "publish_failed")
RUN_FAILED = "run_failed"      # failed after it began reading its input: stays charged
BUSY_TIMEOUT_S = 60.0
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(//|[^\\/])")   # postgresql://..., sqlite:///...

_TABLES = """
CREATE TABLE IF NOT EXISTS datasets (
    dataset TEXT PRIMARY KEY,
    epsilon TEXT NOT NULL,            -- the total, as a decimal string
    delta TEXT NOT NULL,
    created TEXT NOT NULL,
    composition TEXT,                 -- basic | zcdp (NULL: basic, a ledger before modes)
    threshold_delta TEXT,             -- zcdp: delta0_B
    rho TEXT,                         -- zcdp: rho_B
    spent_epsilon TEXT,               -- running sums (NULL: not folded yet)
    spent_delta TEXT,
    spent_rho TEXT,                   -- NULL once a release without a record is charged
    spent_delta0 TEXT,
    row_changes INTEGER NOT NULL DEFAULT 0,   -- inserts, deletes and charge edits of the
                                      -- dataset's releases, counted by the triggers
    spent_row_changes INTEGER,        -- row_changes that the running sums cover
    totals_sha256 TEXT                -- digest of the totals thresher wrote (totals_digest)
);
CREATE TABLE IF NOT EXISTS budget_changes (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL,
    changed_at TEXT NOT NULL,
    old_epsilon TEXT, old_delta TEXT, old_threshold_delta TEXT, old_rho TEXT,
    epsilon TEXT NOT NULL, delta TEXT NOT NULL, threshold_delta TEXT, rho TEXT,
    spent TEXT,                       -- what was spent then, as ledger show words it
    forced INTEGER NOT NULL DEFAULT 0, -- 1: set below what was spent (--force)
    host TEXT,
    pid INTEGER
);
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL REFERENCES datasets(dataset),
    name TEXT NOT NULL,
    epsilon TEXT NOT NULL,            -- what the release spends, as decimal strings
    delta TEXT NOT NULL,
    config_sha256 TEXT NOT NULL,
    state TEXT NOT NULL,              -- reserved | publishing | published | publish_failed
                                      -- | run_failed
    reserved_at TEXT NOT NULL,
    finished_at TEXT,
    output TEXT,
    host TEXT,
    pid INTEGER,
    rho TEXT,                         -- the release's record (NULL: charged before records)
    delta0 TEXT,
    run_token TEXT                    -- a Beam pipeline run's token (NULL: thresher run)
);
"""
_INDEX = "CREATE UNIQUE INDEX IF NOT EXISTS releases_run_token ON releases (run_token)"
# What the ledger refuses an older thresher (review F1): it inserts releases without a
# record, and never updates the running sums.
# The ledger's triggers (SQLite; ``ledger_postgres`` has the same on the server). They
# bind every program that writes the tables, an older thresher included:
# ``releases_need_record`` refuses a release without its record (every older thresher
# fails closed, with its own exit-2 error naming the ledger), and the ``releases_counted_*``
# count each insert, delete and change of a release's charge in its dataset's
# ``row_changes``. This version stamps its running sums with the count they cover
# (``spent_row_changes``); sums that do not cover the count are folded again from the
# releases (``_dataset_state``). Counting, not summing: SQLite has no exact decimals.
TRIGGERS = {
    "releases_need_record": (
        "CREATE TRIGGER IF NOT EXISTS releases_need_record BEFORE INSERT ON releases "
        "WHEN NEW.rho IS NULL OR NEW.delta0 IS NULL "
        f"BEGIN SELECT RAISE(ABORT, '{NO_RECORD}'); END"),
    "releases_counted_insert": (
        "CREATE TRIGGER IF NOT EXISTS releases_counted_insert AFTER INSERT ON releases "
        "BEGIN UPDATE datasets SET row_changes = row_changes + 1 WHERE dataset = NEW.dataset; "
        "END"),
    "releases_counted_delete": (
        "CREATE TRIGGER IF NOT EXISTS releases_counted_delete AFTER DELETE ON releases "
        "BEGIN UPDATE datasets SET row_changes = row_changes + 1 WHERE dataset = OLD.dataset; "
        "END"),
    "releases_counted_update": (
        "CREATE TRIGGER IF NOT EXISTS releases_counted_update AFTER UPDATE OF dataset, epsilon, "
        "delta, rho, delta0 ON releases BEGIN UPDATE datasets SET row_changes = row_changes "
        "+ 1 WHERE dataset = OLD.dataset OR dataset = NEW.dataset; END"),
}
# A whole new ledger, as one script.
_SCHEMA = _TABLES + _INDEX + ";\n" + "".join(t + ";\n" for t in TRIGGERS.values())
# Columns added after the first ledgers were written: added (nullable, or counting from 0)
# to an older ledger when it is opened for writing (``_migrate``); readers treat them as
# NULL until then.
NEW_COLUMNS = {
    "datasets": ("composition", "threshold_delta", "rho", "spent_epsilon", "spent_delta",
                 "spent_rho", "spent_delta0", "row_changes", "spent_row_changes",
                 "totals_sha256"),
    "releases": ("rho", "delta0", "run_token"),
}
COLUMN_TYPES = {"row_changes": "INTEGER NOT NULL DEFAULT 0", "spent_row_changes": "INTEGER"}


@dataclasses.dataclass(frozen=True)
class BudgetSpec:
    """The spec's ``budget`` section."""
    ledger: str
    dataset: str
    epsilon: float
    delta: float
    composition: str = comp.BASIC
    threshold_delta: float = None        # zcdp: delta0_B (None: delta / 2)
    composition_given: bool = True       # False: the spec left budget.composition out


def parse_section(section, privacy):
    """The spec's ``budget`` section (the schema has checked its fields; ``privacy`` is the
    parsed PrivacySpec)."""
    ledger = section["ledger"]
    if (_URL.match(ledger) and not re.match(r"^[A-Za-z]:[\\/]", ledger)
            and not ledger_postgres.is_url(ledger)):
        raise SpecError("budget.ledger", f"the database URLs supported are postgresql://..., "
                        f"got {ledger_postgres.shown(ledger)!r}; or give the path of a SQLite "
                        f"file (e.g. ledgers/my-dataset.sqlite)")
    if not ledger_postgres.is_url(ledger):
        ledger = os.path.expanduser(ledger)      # ~/ledgers/x.sqlite: the home folder's
    dataset = section["dataset"]
    epsilon, delta = float(section["epsilon"]), float(section["delta"])
    mode = section.get("composition", comp.BASIC)
    threshold = section.get("threshold_delta")
    comp.check_section(mode, None if threshold is None else float(threshold), delta)
    budget_totals(BudgetSpec(ledger=ledger, dataset=dataset, epsilon=epsilon, delta=delta,
                             composition=mode,
                             threshold_delta=None if threshold is None else float(threshold)))
    if mode == comp.BASIC and privacy.epsilon > epsilon:
        # (zcdp: one release may carry a larger epsilon and still fit rho_B.)
        raise SpecError("budget.epsilon", f"the dataset's total ({epsilon:g}) is smaller than "
                        f"this one release's privacy.epsilon ({privacy.epsilon:g})")
    return BudgetSpec(ledger=ledger, dataset=dataset, epsilon=epsilon, delta=delta,
                      composition=mode,
                      threshold_delta=None if threshold is None else float(threshold),
                      composition_given="composition" in section)


def resolved_from(budget, spec_path):
    """The budget section with a relative SQLite ``budget.ledger`` resolved from the
    folder of the spec file that names it (not the working directory: the same spec run
    from another folder must charge the same ledger; issue 42)."""
    if budget is None or ledger_postgres.is_url(budget.ledger) or os.path.isabs(budget.ledger):
        return budget
    folder = os.path.dirname(os.path.abspath(spec_path))
    return dataclasses.replace(budget, ledger=os.path.normpath(os.path.join(folder,
                                                                            budget.ledger)))


def inside_output(ledger_path, output_path):
    """Why a SQLite ledger at ``ledger_path`` cannot be used with a release into
    ``output_path`` ("" if it can): a ledger inside the output folder (or the folder
    itself) would be replaced by the release that it charges."""
    if ledger_postgres.is_url(ledger_path) or not output_path or "://" in output_path:
        return ""
    ledger_real = os.path.realpath(ledger_path)
    out_real = os.path.realpath(output_path)
    if ledger_real == out_real or ledger_real.startswith(out_real.rstrip(os.sep) + os.sep):
        return (f"the ledger {ledger_path!r} ({ledger_real}) lies inside the output folder "
                f"{output_path!r}, which each release replaces; keep the ledger outside it "
                f"(e.g. ledgers/<dataset>.sqlite beside the spec)")
    return ""


def charge_of(plan):
    """(epsilon, delta) the release spends: privacy.epsilon, and privacy.delta unless the
    stages spend no delta at all (Laplace over public keys is (epsilon, 0)-DP)."""
    budget = plan.budget
    return budget.epsilon, (budget.delta if budget.spent_delta > 0 else 0.0)


def full_charge(plan):
    """The release's ``composition.Charge``: (epsilon, delta) and its record (rho, delta0),
    both charged in either mode's columns."""
    from thresher.pipelines.ledgers.records import privacy_record
    epsilon, delta = charge_of(plan)
    rho, delta0 = privacy_record(plan)
    return comp.Charge(_dec(epsilon), _dec(delta), rho, delta0)


# ---- exact sums -------------------------------------------------------------------------

def _dec(value):
    return comp.dec(value)


def _num(text):
    """A stored decimal as the float a person reads (2.0, 1e-08)."""
    return None if text is None else float(decimal.Decimal(text))


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the database -------------------------------------------------------------------------

def _connect(path, create):
    if ledger_postgres.is_url(path):
        conn = ledger_postgres.connect(path, create, "budget.ledger" if create else "")
        try:
            check_shape(conn, path, "budget.ledger" if create else "")
            if create:
                _migrate(conn, path)
        except BaseException:
            conn.close()
            raise
        return conn
    if create:
        folder = os.path.dirname(os.path.abspath(path))
        try:
            os.makedirs(folder, exist_ok=True)
        except OSError as exc:
            raise SpecError("budget.ledger", f"cannot create the folder {folder!r}: "
                            f"{exc.strerror or exc}") from None
        uri = None
    else:
        if not os.path.isfile(path):
            raise SpecError("", _no_ledger(path))
        uri = f"{_file_uri(path)}?mode=ro"
    from thresher.pipelines.running.progress import when_slow
    try:
        if uri:
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        else:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        if create:
            with when_slow(LOCK_WAIT.format(ledger=_shown(path))):
                _create_tables(conn)     # waits while another process writes
    except sqlite3.Error as exc:
        if create and not os.path.exists(path) and not os.access(
                os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK):
            raise SpecError("budget.ledger", f"cannot create the ledger {path!r} "
                            f"({os.path.abspath(path)}): its folder is not writable by this "
                            f"user; make the folder writable, or name a ledger in a "
                            f"writable folder") from None
        raise SpecError("budget.ledger" if create else "", f"{path!r} "
                        f"({os.path.abspath(path)}) is not a usable ledger: {exc}") from None
    try:
        check_shape(conn, path, "budget.ledger" if create else "")
        if create:
            _migrate(conn, path)
    except BaseException:
        conn.close()
        raise
    return conn


def _no_ledger(path):
    """Why there is no ledger to read at ``path``: nothing there, or a folder (named with
    the ledger files in it, if any)."""
    where = f"{path!r} ({os.path.abspath(path)})"
    if os.path.isdir(path):
        try:
            found = sorted(n for n in os.listdir(path) if n.endswith((".sqlite", ".db",
                                                                       ".sqlite3")))
        except OSError:
            found = []
        hint = (f"; ledger files in it: {', '.join(found[:5])}" if found else
                "; no .sqlite file in it")
        return (f"{where} is a folder, not a ledger: give the ledger file (a spec's "
                f"budget.ledger){hint}")
    return f"no ledger at {where}"


def _create_tables(conn):
    """The tables of a new ledger (its index and triggers come from ``_migrate``, which
    gives an older ledger its new columns first)."""
    conn.executescript(_TABLES)


# The columns each table must have (a ledger made by another program, or an older
# thresher, with tables of these names but another shape is refused naming what is
# missing; issue 30 D8: it was an internal OperationalError). NEW_COLUMNS are added.
COLUMNS = {
    "datasets": ("dataset", "epsilon", "delta", "created"),
    "releases": ("id", "dataset", "name", "epsilon", "delta", "config_sha256", "state",
                 "reserved_at", "finished_at", "output", "host", "pid"),
}


def _columns(conn, table):
    if hasattr(conn, "columns_of"):
        return conn.columns_of(table)
    return [row[1] for row in conn.execute(f"PRAGMA table_info({table})").fetchall()]


def check_shape(conn, path, field):
    """SpecError naming the ledger, the table and its missing columns, unless both tables
    have (at least) the ledger's columns. A read-only ledger without the tables is a ledger
    nothing was ever recorded in."""
    with errors(path, field):
        for table, wanted in COLUMNS.items():
            have = _columns(conn, table)
            if not have and not field:
                continue          # ledger show on an empty file: "no dataset yet"
            missing = [c for c in wanted if c not in have]
            if missing:
                raise SpecError(field, f"the ledger {_shown(path)!r} is not a thresher ledger: "
                                f"its table {table!r} " + (
                                    f"lacks the columns {', '.join(missing)}" if have
                                    else "is missing") + f" (it has: {', '.join(have) or '-'}); "
                                "use a ledger made by thresher, or a new file/database")


def _triggers(conn):
    return [row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = "
                                           "'trigger' AND tbl_name = 'releases'").fetchall()]


def _migrate(conn, path):
    """A ledger written before composition modes, records or the triggers: add the
    NEW_COLUMNS (nullable or counting from 0, nothing rewritten), the run-token index and
    the TRIGGERS, in one write transaction (two runs migrating at once: the second finds
    them). Every dataset's running sums are then folded again at its next reservation:
    sums written while the triggers were missing may miss an older thresher's rows (the
    review's F1). A ledger that cannot be altered is refused naming the table (exit 2);
    nothing is lost. (PostgreSQL: ``ledger_postgres.connect`` did all of it.)"""
    if getattr(conn, "dialect", None) == ledger_postgres.Connection.dialect:
        return
    if (all(set(cols) <= set(_columns(conn, t)) for t, cols in NEW_COLUMNS.items())
            and set(TRIGGERS) <= set(_triggers(conn))):
        return
    table = None
    try:
        with _write_transaction(conn):
            for table, cols in NEW_COLUMNS.items():
                have = _columns(conn, table)
                for col in cols:
                    if col not in have:
                        conn.execute(f"ALTER TABLE {table} ADD COLUMN {col} "
                                     f"{COLUMN_TYPES.get(col, 'TEXT')}")
            table = "releases"
            conn.execute(_INDEX)
            for trigger in TRIGGERS.values():
                conn.execute(trigger)
            conn.execute(UNFOLD)
    except _all_database_errors() as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecError("budget.ledger", f"the ledger {_shown(path)!r} was written by an older "
                        f"thresher and its table {table!r} cannot be given the columns and "
                        f"triggers this version records "
                        f"({', '.join(NEW_COLUMNS.get(table, ()))}): {first}; "
                        f"nothing was changed (open it writable once, or use a new "
                        f"ledger)") from None


# Running sums to be folded again from the releases (after the triggers are installed).

@contextlib.contextmanager
def errors(path, field="budget.ledger", doing=""):
    """Database errors of the ledger (SQLite's or the server's: locked, read-only, corrupt,
    another shape) as a SpecError naming the ledger, never an internal error."""
    try:
        yield
    except SpecError:
        raise
    except _all_database_errors() as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        where = _shown(path)
        if not ledger_postgres.is_url(path) and os.path.abspath(path) != path:
            where = f"{path!r} ({os.path.abspath(path)})"
        else:
            where = repr(where)
        hint = (" (a read-only file, folder or file system: the ledger must be writable "
                "to charge a release)" if "readonly" in first.replace("-", "") else "")
        raise SpecError(field, f"the ledger {where} cannot be {doing or 'used'}: "
                        f"{first}{hint}") from None


def _all_database_errors():
    found = [sqlite3.Error]
    try:
        import psycopg
        found.append(psycopg.Error)
    except ImportError:
        pass
    return tuple(found)


def _file_uri(path):
    import pathlib
    return pathlib.Path(os.path.abspath(path)).as_uri()


@contextlib.contextmanager
def _write_transaction(conn):
    """BEGIN IMMEDIATE: the write lock is taken before anything is read (PostgreSQL: a
    transaction; ``reserve`` locks the dataset's row in it)."""
    if hasattr(conn, "write_transaction"):
        with conn.write_transaction():
            yield conn
        return
    from thresher.pipelines.running.progress import when_slow
    with when_slow(LOCK_WAIT.format(ledger=_connected_path(conn))):
        conn.execute("BEGIN IMMEDIATE")     # waits while another process writes
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


LOCK_WAIT = ("waiting for the ledger {ledger}: another process (a thresher run or command) is "
             f"writing to it; this run waits up to {BUSY_TIMEOUT_S:g} s for its lock, then "
             f"stops with an error naming budget.ledger")


def _connected_path(conn):
    """The file of an SQLite connection (for messages)."""
    try:
        return next((row[2] for row in conn.execute("PRAGMA database_list")
                     if row[1] == "main"), "") or "(in memory)"
    except sqlite3.Error:
        return "(its file)"


# ---- a dataset's row: its budgets and running sums ---------------------------------------

_DATASET_COLUMNS = ("epsilon", "delta", "composition", "threshold_delta", "rho",
                    "spent_epsilon", "spent_delta", "spent_rho", "spent_delta0", "row_changes",
                    "spent_row_changes", "totals_sha256")


def _select(conn, table, columns, where="", params=()):
    """SELECT ``columns`` (NULL for a column an unmigrated, read-only ledger lacks)."""
    have = set(_columns(conn, table))
    exprs = ", ".join(c if c in have else "NULL" for c in columns)
    return conn.execute(f"SELECT {exprs} FROM {table}{where}", params)


class BadRow(SpecError):
    """A value in the ledger's tables that no thresher wrote (edited by hand: ``rho =
    'abc'``, NULL, NaN, a negative charge): a SpecError naming ``budget.ledger``, the
    table, row and column (issue 42: these were internal errors, even in ledger show)."""

    def __init__(self, where, column, value, allowed="a finite decimal number >= 0"):
        super().__init__("budget.ledger", f"the ledger holds {where} {column} = {value!r}, "
                         f"which no thresher writes (expected {allowed}): it was edited by "
                         f"hand or is corrupt; nothing was read or published")


def _stored(value, where, column, nullable=False):
    """A stored decimal, checked: finite and >= 0 (None only if ``nullable``)."""
    if value is None:
        if nullable:
            return None
        raise BadRow(where, column, value)
    try:
        number = decimal.Decimal(value) if isinstance(value, str) else comp.dec(value)
    except (decimal.InvalidOperation, TypeError, ValueError):
        raise BadRow(where, column, value) from None
    if not number.is_finite() or number < 0:
        raise BadRow(where, column, value)
    return number


def totals_digest(mode, epsilon, delta, delta0, rho):
    """The digest a dataset's totals are stamped with whenever thresher writes them (a
    first release, ``thresher ledger set-budget``): totals changed by any other means
    (``UPDATE datasets SET epsilon = ...``) no longer match it, and the ledger refuses
    to admit a release on that dataset until set-budget writes them again (issue 42)."""
    words = "|".join("" if v is None else comp.text(v) for v in (epsilon, delta, delta0, rho))
    return hashlib.sha256(f"thresher-totals-v1|{mode}|{words}".encode()).hexdigest()


def _parse_totals(row, dataset):
    """(Totals, problem) of a dataset row's budget columns. Values that are no decimals
    raise BadRow; totals that are numbers but disagree with each other or with the digest
    thresher stamped them with give a ``problem`` (None when they agree)."""
    eps, delta, mode, delta0_b, rho_b = row[:5]
    digest = row[11]
    where = f"dataset {dataset!r}'s"
    mode = comp.BASIC if mode is None else mode
    if mode not in comp.MODES:
        raise BadRow(where, "composition", mode, f"one of {', '.join(comp.MODES)}")
    epsilon = _stored(eps, where, "epsilon")
    total_delta = _stored(delta, where, "delta")
    zcdp = mode == comp.ZCDP
    delta0 = _stored(delta0_b, where, "threshold_delta", nullable=not zcdp)
    rho = _stored(rho_b, where, "rho", nullable=not zcdp)
    totals = comp.Totals(mode, epsilon, total_delta, delta0, rho)
    problem = None
    if zcdp:
        try:
            expected = comp.rho_of(epsilon, total_delta, delta0)
        except (ValueError, ArithmeticError):
            expected = None
        # within 1e-9 relative: another machine's libm may round rho_B's last digit the
        # other way; an edited total moves it far more (the digest catches exact edits)
        if expected is None or abs(expected - rho) > decimal.Decimal("1e-9") * rho:
            problem = (f"its stored rho_B = {comp.text(rho)} is not the rho_B that its "
                       f"epsilon = {comp.text(epsilon)}, delta = {comp.text(total_delta)} and "
                       f"threshold_delta = {comp.text(delta0)} give"
                       + ("" if expected is None else f" ({comp.text(expected)})")
                       + ": its totals were changed outside thresher")
    if problem is None and digest is not None and digest != totals_digest(
            mode, epsilon, total_delta, delta0, rho):
        problem = ("its totals were changed outside thresher (they do not match the digest "
                   "thresher stamped them with)")
    return totals, problem


TOTALS_HELP = ("change a dataset's totals with: thresher ledger set-budget LEDGER DATASET "
               "--epsilon E [--delta D] (it recomputes rho_B and records the change)")


@dataclasses.dataclass(frozen=True)
class _DatasetRow:
    totals: comp.Totals
    spent: comp.Spent
    row_changes: int          # the triggers' count (None: a ledger without them, read only)
    problem: str = None       # read only: why the stored sums cannot be right (then folded)
    totals_problem: str = None   # why the stored totals disagree (refused by reserve)
    digest: str = None        # the stored totals_sha256 (None: not stamped yet)


def _dataset_state(conn, dataset, fold=False, path=None):
    """(Totals, Spent) of a dataset's row, or None (``_dataset_row``)."""
    row = _dataset_row(conn, dataset, fold, path)
    return None if row is None else (row.totals, row.spent)


def _dataset_row(conn, dataset, fold=False, path=None):
    """The dataset's row: its Totals, and its running sums when they cover every change of
    its releases the triggers counted; otherwise the sums folded from the releases
    (written back, stamped with the count, when ``fold``: inside a write transaction that
    holds the dataset's row). Sums that cannot be right (``_wrong_sums``) are refused when
    ``fold`` (a SpecError naming the ledger), folded for reading otherwise. Values that
    are no decimals raise BadRow; totals that disagree are ``totals_problem``."""
    row = _select(conn, "datasets", _DATASET_COLUMNS, " WHERE dataset = ?", (dataset,)).fetchone()
    if row is None:
        return None
    s_eps, s_delta, s_rho, s_delta0, changes, covered = row[5:11]
    totals, totals_problem = _parse_totals(row, dataset)
    changes = None if changes is None else int(changes)
    covered = None if covered is None else int(covered)
    problem = _wrong_sums(row[5:9], changes, covered)
    if problem is not None and fold:
        raise SpecError("budget.ledger", f"the ledger {_shown(path or '?')!r} is inconsistent: "
                        f"dataset {dataset!r}: {problem}; nothing was read or published "
                        f"(thresher ledger show compares the sums with the releases; setting "
                        f"the dataset's spent_* columns to NULL has the next run fold them "
                        f"again from its releases)")
    if s_eps is None or changes is None or covered != changes or problem is not None:
        spent = _fold(conn, dataset)
        if fold:
            if s_eps is not None:
                log.warning("ledger %s: the releases of dataset %r were changed by another "
                            "program (an older thresher, or by hand) since its running sums "
                            "were written; they are folded again from its releases",
                            _shown(path or "?"), dataset)
            _write_spent(conn, dataset, spent, changes)
    else:
        spent = comp.Spent(_dec(s_eps), _dec(s_delta), None if s_rho is None else _dec(s_rho),
                           None if s_delta0 is None else _dec(s_delta0))
    return _DatasetRow(totals, spent, changes, problem, totals_problem, row[11])


def _wrong_sums(sums, changes, covered):
    """Why the dataset's stored running sums cannot be right (None if they may be), told
    from its row alone (no history read): only some of the sums stored; a negative
    sum or one that is no decimal; a stamp of more changes than the triggers counted (the
    count went backwards: hand edited). Sums with a stamp behind the count are merely
    stale (folded again); exact sums edited by hand to other valid values are found by
    ``thresher ledger show``, which folds the history."""
    s_eps, s_delta, s_rho, s_delta0 = sums
    wrong = None
    if (s_eps is None) != (s_delta is None) or (s_rho is None) != (s_delta0 is None) or (
            s_eps is None and s_rho is not None):
        wrong = "only some of its running sums are stored (the others are NULL)"
    else:
        for name, value in zip(("spent_epsilon", "spent_delta", "spent_rho", "spent_delta0"),
                               sums):
            if value is None:
                continue
            try:
                number = decimal.Decimal(value)
            except (decimal.InvalidOperation, TypeError, ValueError):
                wrong = f"its running sum {name} = {value!r} is not a decimal number"
                break
            if not number.is_finite():
                wrong = f"its running sum {name} = {value} is not finite"
                break
            if number < 0:
                wrong = f"a negative running sum: {name} = {value}"
                break
    if wrong is None and changes is not None and covered is not None and covered > changes:
        wrong = (f"its running sums say they counted {covered - changes} more changes of its "
                 f"releases than the ledger did (spent_row_changes = {covered}, row_changes "
                 f"= {changes})")
    if wrong is None and changes is not None and changes < 0:
        wrong = f"its count of changes is negative (row_changes = {changes})"
    return wrong


def _fold(conn, dataset):
    """The sums over the dataset's releases (to fill running sums that are missing or do
    not cover every change, and for ``ledger show``'s check). A charge that is no
    decimal raises BadRow naming the release (a NULL record is a release charged before
    records: allowed)."""
    rows = _select(conn, "releases", ("id", "epsilon", "delta", "rho", "delta0"),
                   " WHERE dataset = ?", (dataset,)).fetchall()
    checked = []
    for rid, eps, delta, rho, delta0 in rows:
        where = f"release {rid}'s"
        checked.append((_stored(eps, where, "epsilon"), _stored(delta, where, "delta"),
                        _stored(rho, where, "rho", nullable=True),
                        _stored(delta0, where, "delta0", nullable=True)))
    return comp.Spent.fold(checked)


def _write_spent(conn, dataset, spent, row_changes):
    """The running sums, stamped with the triggers' count of changes they cover."""
    conn.execute("UPDATE datasets SET spent_epsilon = ?, spent_delta = ?, spent_rho = ?, "
                 "spent_delta0 = ?, spent_row_changes = ? WHERE dataset = ?",
                 (comp.text(spent.epsilon), comp.text(spent.delta), comp.text(spent.rho),
                  comp.text(spent.delta0), row_changes, dataset))


def _lock_row(conn, dataset):
    """Inside a write transaction: hold the dataset's row until it ends (PostgreSQL: FOR
    UPDATE; SQLite's BEGIN IMMEDIATE holds the whole database already)."""
    if hasattr(conn, "lock_dataset"):
        conn.execute("SELECT 1 FROM datasets WHERE dataset = ? FOR UPDATE", (dataset,))


def _uncharge(conn, dataset, row_id, path=None):
    """Inside a write transaction: delete a ``reserved`` release and take its charge off
    the dataset's running sums (a release without a record -- an older thresher's -- is
    folded out instead: the sums of the others are exact again). Returns whether a row
    was deleted."""
    row = _select(conn, "releases", ("epsilon", "delta", "rho", "delta0"),
                  " WHERE id = ? AND state = ?", (row_id, RESERVED)).fetchone()
    if row is None:
        return False
    _lock_row(conn, dataset)
    state = _dataset_row(conn, dataset, fold=True, path=path)
    conn.execute("DELETE FROM releases WHERE id = ? AND state = ?", (row_id, RESERVED))
    if state is not None:
        eps, delta, rho, delta0 = row
        changes = state.row_changes + 1          # the delete, counted by the trigger
        if rho is None or delta0 is None:
            _write_spent(conn, dataset, _fold(conn, dataset), changes)
        else:
            _write_spent(conn, dataset, state.spent.minus(comp.Charge(
                _dec(eps), _dec(delta), _dec(rho), _dec(delta0))), changes)
    return True


# ---- one release -----------------------------------------------------------------------------

class Reservation:
    """A release's row in the ledger, from ``reserve`` to published or released."""

    def __init__(self, path, row_id, dataset, total, spent, new_dataset=False):
        self.path = path
        self.row_id = row_id
        self.dataset = dataset
        self.total = total           # composition.Totals of the dataset
        self.spent = spent           # composition.Spent, including this release
        self.new_dataset = new_dataset   # this reservation created the dataset's row
        self.charged = True          # False: a run token already charged (reserve)
        self.earlier = 0             # run tokens: earlier runs of the same spec charged
        self._reading = False
        self._publishing = False
        self._done = False

    def _connect(self):
        return _connect(self.path, create=True)

    def say_new_dataset(self):
        """Once this first release stays charged (published, or failed after reading):
        the dataset exists for good, so say where (the ledger's absolute path: a relative
        budget.ledger resolves from the spec's folder). A first release abandoned before
        reading leaves no dataset and says nothing (issue 42)."""
        if self.new_dataset:
            total = self.total
            log.info("ledger %s: new dataset %r (%s composition) with total epsilon=%s, "
                     "delta=%s", _where(self.path), self.dataset, total.composition,
                     comp.shown_number(total.epsilon), comp.shown_number(total.delta))

    def reading(self):
        """The run is about to read its input (the pipeline starts). From here on a failure
        may depend on the data -- a user over a limit, a corrupt row group, how long it
        ran before Ctrl-C -- so ``abandon`` keeps the charge (``run_failed``) instead of
        giving the budget back: a failed run must not be a free look at the data (review
        F3). Nothing is written to the ledger here."""
        self._reading = True

    def publishing(self):
        """The release is about to be moved into place: record it in the ledger first
        (state ``publishing``, still charged), so that nothing is published that the
        ledger does not hold. Refused (SpecError, nothing published) if the row is no
        longer ``reserved`` (an operator released it: ``thresher ledger release``) or the
        ledger cannot be written."""
        try:
            with errors(self.path, "budget.ledger", "updated"):
                conn = self._connect()
                try:
                    with _write_transaction(conn):
                        cur = conn.execute("UPDATE releases SET state = ? WHERE id = ? AND "
                                           "state = ?", (PUBLISHING, self.row_id, RESERVED))
                        changed = cur.rowcount
                finally:
                    conn.close()
        except SpecError as exc:
            raise SpecError("budget.ledger", f"{exc.message}; the release could not be recorded "
                            f"as publishing, so nothing was published") from None
        if changed != 1:
            raise SpecError("budget.ledger", f"release {self.row_id} is no longer reserved in "
                            f"the ledger {_shown(self.path)!r} (released by an operator: "
                            f"thresher ledger release); nothing was published")
        self._publishing = True

    def _finish(self, state, output=None):
        conn = self._connect()
        try:
            with _write_transaction(conn):
                if state is None:
                    _uncharge(conn, self.dataset, self.row_id, self.path)
                    if self.new_dataset:
                        # A dataset's total is fixed by its first charged release: a first
                        # release abandoned before publishing leaves no dataset behind.
                        conn.execute("DELETE FROM datasets WHERE dataset = ? AND NOT EXISTS "
                                     "(SELECT 1 FROM releases WHERE dataset = ?)",
                                     (self.dataset, self.dataset))
                else:
                    conn.execute("UPDATE releases SET state = ?, finished_at = ?, output = ? "
                                 "WHERE id = ?", (state, _now(), output, self.row_id))
        finally:
            conn.close()
        self._done = True
        if state is not None:
            self.say_new_dataset()

    def commit(self, output):
        """After the release was moved into place: mark it ``published``. It is already
        charged (``publishing``), so a ledger that cannot be written now does not undo
        the release: a loud warning says what happened and what the ledger holds."""
        try:
            with errors(self.path):
                self._finish(PUBLISHED, output)
        except SpecError as exc:
            self._done = True
            log.warning("WARNING: the release is published at %s, but the ledger could not "
                        "mark it published (%s). Its row %d stays '%s' and counts as spent, "
                        "so the budget is safe; repair or restore the ledger, then check it "
                        "with: thresher ledger show %s", output, exc.message, self.row_id,
                        PUBLISHING if self._publishing else RESERVED, _shown(self.path))

    def abandon(self):
        """After an error: delete the reservation if the run had not begun reading its
        input; keep it charged if it had (``run_failed``) or if publishing began
        (``publish_failed``)."""
        if self._done:
            return
        state = (PUBLISH_FAILED if self._publishing else RUN_FAILED if self._reading
                 else None)
        try:
            self._finish(state)
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            log.warning("could not update the ledger %s (release %d stays %s and counts as "
                        "spent; thresher ledger reservations lists it): %s", _shown(self.path),
                        self.row_id, PUBLISHING if self._publishing else RESERVED, exc)
            return
        if state == RUN_FAILED:
            log.warning("the run failed after it began reading its input: its charge stays "
                        "spent (release %d is %s in the ledger %s; a failure after reading "
                        "may depend on the data)", self.row_id, RUN_FAILED, _shown(self.path))


def reserve(plan, run_token=None, output=None):
    """Reserve the release's charge on its dataset; SpecError naming ``budget`` if the
    dataset's budget would be exceeded (``budget.composition`` / ``budget.threshold_delta``
    if the spec names another mode or delta0_B than the dataset's), or ``budget.ledger``
    if the ledger cannot be used. Returns a Reservation.

    ``run_token`` (a Beam pipeline's run, ``pipelines.beam_yaml``): the release is recorded
    at once as ``published`` with ``output``, and a token already in the ledger is not
    charged again (the Reservation of the existing row, ``charged`` False)."""
    spec = plan.spec
    return reserve_charge(spec.budget, spec.name, config_sha256(spec), full_charge(plan),
                          run_token, output)


def config_sha256(spec):
    return hashlib.sha256(spec.source_text.encode("utf-8")).hexdigest()


def reserve_charge(budget, name, sha, charge, run_token=None, output=None):
    """``reserve`` of a charge computed beforehand (``full_charge``): what a pipeline's
    worker calls with the values the pipeline was built with."""
    with errors(budget.ledger):
        return _reserve(budget, name, sha, charge, run_token, output)


def _reserve(budget, name, sha, charge, run_token=None, output=None):
    wanted = comp.Totals.of_spec(budget)
    conn = _connect(budget.ledger, create=True)
    try:
        with _write_transaction(conn):
            if run_token is not None:
                row = conn.execute("SELECT id, dataset, config_sha256, epsilon, delta, rho, "
                                   "delta0 FROM releases WHERE run_token = ?",
                                   (run_token,)).fetchone()
                if row is not None:      # this run was charged already (a retried reserve)
                    _check_token_row(row, budget, sha, charge)
                    state = _dataset_state(conn, budget.dataset)
                    reservation = Reservation(budget.ledger, int(row[0]), budget.dataset,
                                              state[0], state[1])
                    reservation.charged = False
                    reservation._done = True
                    return reservation
            created = _now()
            fresh = (budget.dataset, comp.text(wanted.epsilon), comp.text(wanted.delta), created,
                     wanted.composition, comp.text(wanted.delta0), comp.text(wanted.rho),
                     "0", "0", "0", "0", 0, 0, _digest_of(wanted))
            if hasattr(conn, "lock_dataset"):
                new = conn.lock_dataset(budget.dataset, fresh)
            else:
                new = conn.execute("SELECT 1 FROM datasets WHERE dataset = ?",
                                   (budget.dataset,)).fetchone() is None
                if new:
                    conn.execute(_INSERT_DATASET, fresh)
            dataset_row = _dataset_row(conn, budget.dataset, fold=True, path=budget.ledger)
            totals, spent = dataset_row.totals, dataset_row.spent
            if dataset_row.totals_problem is not None:
                raise SpecError("budget.ledger", f"the ledger {_shown(budget.ledger)!r} is "
                                f"inconsistent: dataset {budget.dataset!r}: "
                                f"{dataset_row.totals_problem}; no release is admitted on it "
                                f"until its totals are set again ({TOTALS_HELP}); nothing was "
                                f"read or published")
            if dataset_row.digest is None:
                # A dataset written before totals were stamped: stamped now, as they are.
                conn.execute("UPDATE datasets SET totals_sha256 = ? WHERE dataset = ?",
                             (_digest_of(totals), budget.dataset))
            _check_fixed(budget, totals, wanted)
            if totals.composition == comp.ZCDP and (spent.rho is None or spent.delta0 is None):
                raise SpecError("budget.ledger", f"the ledger {_shown(budget.ledger)!r} is "
                                f"inconsistent: zcdp dataset {budget.dataset!r} holds a release "
                                f"without a (rho, delta0) record (charged by an older "
                                f"thresher?), so its spent rho is unknown; nothing was read or "
                                f"published")
            if not comp.admits(totals, spent, charge):
                raise SpecError("budget", f"{comp.refusal_text(budget.dataset, totals, spent, charge)} "
                                f"(ledger {_shown(budget.ledger)}); nothing was read or published")
            earlier = 0
            if run_token is not None:      # earlier runs of this release (Beam: run twice)
                earlier = int(conn.execute(
                    "SELECT COUNT(*) FROM releases WHERE dataset = ? AND config_sha256 = ? AND "
                    "run_token IS NOT NULL", (budget.dataset, sha)).fetchone()[0])
            state = RESERVED if run_token is None else PUBLISHED
            sql = ("INSERT INTO releases (dataset, name, epsilon, delta, config_sha256, state, "
                   "reserved_at, host, pid, rho, delta0, run_token, finished_at, output) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
            now = _now()
            params = (budget.dataset, name, comp.text(charge.epsilon), comp.text(charge.delta),
                      sha, state, now, socket.gethostname(), os.getpid(), comp.text(charge.rho),
                      comp.text(charge.delta0), run_token,
                      None if run_token is None else now, output)
            if hasattr(conn, "insert_release"):
                row_id = conn.insert_release(sql, params)
            else:
                row_id = conn.execute(sql, params).lastrowid
            spent = spent.plus(charge)
            _write_spent(conn, budget.dataset, spent, dataset_row.row_changes + 1)  # the insert
    finally:
        conn.close()
    reservation = Reservation(budget.ledger, row_id, budget.dataset, totals, spent,
                              new_dataset=new)
    reservation.earlier = earlier
    if run_token is not None:
        reservation._done = True
        reservation.say_new_dataset()
    return reservation


_INSERT_DATASET = ("INSERT INTO datasets (dataset, epsilon, delta, created, composition, "
                   "threshold_delta, rho, spent_epsilon, spent_delta, spent_rho, spent_delta0, "
                   "row_changes, spent_row_changes, totals_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, "
                   "?, ?, ?, ?, ?, ?, ?)")


def _digest_of(totals):
    return totals_digest(totals.composition, totals.epsilon, totals.delta, totals.delta0,
                         totals.rho)


def _where(ledger):
    """A ledger as messages show it: a URL without its password, a file's absolute path."""
    return _shown(ledger) if ledger_postgres.is_url(ledger) else os.path.abspath(ledger)


def _check_token_row(row, budget, sha, charge):
    """A run token found in the ledger is this run's own charge only if it was charged to
    the same dataset, by the same spec (its digest), at the same charge: a token charged
    for another release (a secret reused across specs) is refused, never taken as paid
    (issue 42: the ledger trusted the token alone)."""
    rid, dataset, stored_sha, eps, delta, rho, delta0 = row
    where = f"release {rid}'s"
    stored = (_stored(eps, where, "epsilon"), _stored(delta, where, "delta"),
              _stored(rho, where, "rho", nullable=True),
              _stored(delta0, where, "delta0", nullable=True))
    differs = [what for what, same in (
        ("dataset", dataset == budget.dataset), ("spec (config_sha256)", stored_sha == sha),
        ("charge", stored == (charge.epsilon, charge.delta, charge.rho, charge.delta0)))
        if not same]
    if differs:
        raise SpecError("budget.ledger", f"this run's token is already charged in the ledger "
                        f"{_shown(budget.ledger)!r} as release {rid}, for another "
                        f"{' and '.join(differs)} (release {rid}: dataset {dataset!r}, spec "
                        f"{stored_sha[:12]}; this run: dataset {budget.dataset!r}, spec "
                        f"{sha[:12]}): a run token belongs to one release, so this run is "
                        f"refused and nothing is published (was one secret reused for two "
                        f"releases?)")


def _check_fixed(budget, totals, wanted):
    """A dataset's total, composition mode and delta0_B are fixed by its first release."""
    shown = _shown(budget.ledger)
    if (totals.epsilon, totals.delta) != (wanted.epsilon, wanted.delta):
        raise SpecError("budget", f"the ledger {shown!r} records the total epsilon="
                        f"{float(totals.epsilon):g}, delta={float(totals.delta):g} for dataset "
                        f"{budget.dataset!r}; the spec says epsilon={budget.epsilon:g}, "
                        f"delta={budget.delta:g} (a dataset's total cannot change by editing the spec: change "
                        f"it with thresher ledger set-budget, then give the spec the new total)")
    if totals.composition != wanted.composition:
        said = (f"the spec says {wanted.composition}" if budget.composition_given else
                f"the spec leaves budget.composition out, which means {wanted.composition}")
        raise SpecError("budget.composition", f"dataset {budget.dataset!r} composes by "
                        f"{totals.composition} in the ledger {shown!r} (fixed by its first "
                        f"release); {said}: a dataset with releases "
                        f"cannot switch modes (its charges are kept in {totals.composition}'s "
                        f"terms); use composition: {totals.composition}, or a new dataset")
    if totals.composition == comp.ZCDP and totals.delta0 != wanted.delta0:
        said = (f"the spec gives {comp.shown_number(wanted.delta0)}"
                if budget.threshold_delta is not None else
                f"the spec leaves budget.threshold_delta out, which means delta / 2 = "
                f"{comp.shown_number(wanted.delta0)}")
        raise SpecError("budget.threshold_delta", f"dataset {budget.dataset!r} has delta0_B="
                        f"{comp.shown_number(totals.delta0)} in the ledger {shown!r} (fixed by "
                        f"its first release; thresher ledger set-budget changes it); {said}")


@contextlib.contextmanager
def reservation_for(plan):
    """``with reservation_for(plan) as r:`` — reserve (if the spec has a budget section),
    abandon on any error; the caller calls ``r.publishing()`` before publishing and
    ``r.commit(output)`` after. Yields None without a budget section."""
    if getattr(plan.spec, "budget", None) is None:
        yield None
        return
    reservation = reserve(plan)
    try:
        yield reservation
    except BaseException:
        reservation.abandon()
        raise
    if not reservation._done:
        # The body ended without publishing (it should not): keep nothing reserved.
        reservation.abandon()


# ---- thresher ledger reservations / release --------------------------------------------------

def reservations(path, dataset=None):
    """Open reservations (state ``reserved``): a run that is still going, or one killed
    outright (SIGKILL, power loss) that left its charge. Each with its owner's host and
    pid and whether that process is still running (``owner``: ``running`` / ``gone`` on
    this host, ``unknown`` on another)."""
    with errors(path, "", "read"):
        conn = _connect(path, create=False)
        try:
            sql = ("SELECT id, dataset, name, epsilon, delta, reserved_at, host, pid FROM "
                   "releases WHERE state = ?" + (" AND dataset = ?" if dataset else "") +
                   " ORDER BY id")
            rows = conn.execute(sql, (RESERVED, dataset) if dataset else (RESERVED,)).fetchall()
        finally:
            conn.close()
    now = datetime.datetime.now(datetime.timezone.utc)
    out = []
    for rid, ds, name, eps, delta, at, host, pid in rows:
        reserved = _parse_time(at)
        out.append({"id": int(rid), "dataset": ds, "name": name, "epsilon": _loose(eps),
                    "delta": _loose(delta), "reserved_at": at,
                    "age_seconds": int((now - reserved).total_seconds()) if reserved else None,
                    "host": host, "pid": pid, "owner": owner_state(host, pid, reserved)})
    return out


def _parse_time(text):
    try:
        return datetime.datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(
            tzinfo=datetime.timezone.utc)
    except (TypeError, ValueError):
        return None


def owner_state(host, pid, reserved):
    """``running`` if the reserving process is alive on this host (the pid exists and its
    process started no later than the reservation: a reused pid is not the owner), ``gone``
    if not, ``unknown`` if it ran on another host (or recorded no pid)."""
    if not pid or host != socket.gethostname():
        return "unknown"
    started = _process_start(int(pid))
    if started is None:
        return "gone"
    if reserved is not None and started > reserved.timestamp() + 1.0:
        return "gone"          # the pid was reused by a later process
    return "running"


def _process_start(pid):
    """The start time (Unix seconds) of a live, non-zombie process, or None (Linux /proc;
    elsewhere: alive per os.kill(pid, 0), start unknown, so treated as not newer)."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as handle:
            fields = handle.read().rsplit(") ", 1)[1].split()
        with open("/proc/stat", encoding="ascii") as handle:
            btime = next(int(line.split()[1]) for line in handle if line.startswith("btime "))
    except (OSError, IndexError, StopIteration, ValueError):
        if os.path.isdir("/proc/self"):
            return None
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return None
        except OSError:
            pass
        return float("-inf")
    if fields[0] in ("Z", "X"):
        return None
    return btime + int(fields[19]) / os.sysconf("SC_CLK_TCK")


def release_reservation(path, row_id, force=False):
    """``thresher ledger release``: delete an open reservation so its budget is free again.

    The safe rule: only a row still ``reserved`` (a ``publishing``, ``published`` or
    ``publish_failed`` row may have been seen, a ``run_failed`` run failed after reading
    its input: charged for good), and only when its owner
    is known to be gone (same host, process ended); a running owner or one on another host
    needs ``force``. Even then no release is published uncharged: a run marks its row
    ``publishing`` (in a write transaction, only if still ``reserved``) before it moves its
    output into place, and refuses to publish once its row was released. Returns the row
    as ``reservations`` lists it."""
    if not ledger_postgres.is_url(path) and not os.path.isfile(path):
        raise SpecError("", _no_ledger(path))
    with errors(path, "", "updated"):
        conn = _connect(path, create=True)
        try:
            with _write_transaction(conn):
                row = conn.execute("SELECT id, dataset, name, epsilon, delta, reserved_at, host, "
                                   "pid, state FROM releases WHERE id = ?", (row_id,)).fetchone()
                if row is None:
                    raise SpecError("ID", f"no release {row_id} in the ledger {_shown(path)!r}")
                rid, ds, name, eps, delta, at, host, pid, state = row
                if state != RESERVED:
                    why = ("its run failed after it began reading the input" if state ==
                           RUN_FAILED else "it may have been seen")
                    raise SpecError("ID", f"release {row_id} ({name!r}, dataset {ds!r}) is "
                                    f"{state}, not reserved: {why}, so its budget stays spent")
                owner = owner_state(host, pid, _parse_time(at))
                if owner != "gone" and not force:
                    why = (f"its run (pid {pid} on this host) is still running" if owner ==
                           "running" else f"its run was on host {host!r} (pid {pid}), which "
                           f"thresher cannot check from here")
                    raise SpecError("--force", f"release {row_id} ({name!r}, dataset {ds!r}) is "
                                    f"reserved and {why}; pass --force once you know it has "
                                    f"ended (a run whose reservation is released refuses to "
                                    f"publish)")
                _uncharge(conn, ds, row_id, path)
        finally:
            conn.close()
    return {"id": int(rid), "dataset": ds, "name": name, "epsilon": _loose(eps),
            "delta": _loose(delta), "reserved_at": at, "host": host, "pid": pid, "owner": owner}


def format_reservations(rows):
    if not rows:
        return "no open reservations"
    n = comp.shown_number
    lines = [f"{'id':>5}  {'dataset':<16} {'name':<20} {'epsilon':>8} {'delta':>8}  "
             f"{'age':>8}  owner"]
    for r in rows:
        age = "-" if r["age_seconds"] is None else _age(r["age_seconds"])
        lines.append(f"{r['id']:>5}  {printable(r['dataset']):<16} {printable(r['name']):<20} "
                     f"{n(r['epsilon']):>8} {n(r['delta']):>8}  {age:>8}  {r['owner']} (pid "
                     f"{r['pid']} on {printable(r['host'])})")
    return "\n".join(lines)


def _age(seconds):
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds} s"


# ---- thresher ledger show ------------------------------------------------------------------

def summary(path, dataset=None):
    """Every dataset of a ledger (or one): its mode and budgets, what is charged (the
    running sums, checked against the releases), every release."""
    with errors(path, "", "read"):
        return _summary(path, dataset)


def _summary(path, dataset):
    conn = _connect(path, create=False)
    try:
        try:
            names = [r[0] for r in conn.execute("SELECT dataset FROM datasets "
                                                "ORDER BY dataset").fetchall()]
        except _database_errors(conn) as exc:
            raise SpecError("", f"{_shown(path)!r} is not a thresher ledger: {exc}") from None
        if dataset is not None:
            names = [d for d in names if d == dataset]
            if not names:
                raise SpecError("--dataset", f"no dataset {dataset!r} in the ledger "
                                             f"{_shown(path)!r}")
        out = []
        for name in names:
            rows = _select(conn, "releases", (
                "name", "epsilon", "delta", "config_sha256", "state", "reserved_at",
                "finished_at", "output", "id", "rho", "delta0"),
                " WHERE dataset = ? ORDER BY id", (name,)).fetchall()
            try:
                state = _dataset_row(conn, name)
                folded = _fold(conn, name)
            except BadRow as exc:
                # ledger show is how an operator finds such a row: shown, never a crash
                out.append(_unreadable_summary(name, rows, exc.message))
                continue
            entry = _dataset_summary(name, state.totals, state.spent, folded, rows,
                                     state.problem)
            if state.totals_problem is not None:
                entry["warning"] = " ".join(filter(None, (
                    f"{state.totals_problem}: no release is admitted on this dataset until "
                    f"its totals are set again ({TOTALS_HELP}).", entry.get("warning"))))
            out.append(entry)
        return out
    finally:
        conn.close()


def _loose(value):
    """A stored number for display, whatever was stored (None if it is no number)."""
    try:
        number = float(decimal.Decimal(value))
    except (decimal.InvalidOperation, TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def _unreadable_summary(name, rows, message):
    """A dataset whose row or releases hold a value no thresher writes: its releases as
    stored (numbers that are no numbers shown as null) and the problem as its warning."""
    return {
        "dataset": name, "composition": None, "budget": None, "spent": None, "zcdp": None,
        "releases": [{"id": r[8], "name": r[0], "epsilon": _loose(r[1]),
                      "delta": _loose(r[2]), "rho": _loose(r[9]), "delta0": _loose(r[10]),
                      "config_sha256": r[3], "state": r[4], "time": r[6] or r[5],
                      "output": r[7]} for r in rows],
        "warning": f"{message.replace('; nothing was read or published', '')}; every run "
                   f"on this dataset is refused until the value is repaired",
    }


def _dataset_summary(name, totals, spent, folded, rows, problem=None):
    zcdp = totals.composition == comp.ZCDP
    if zcdp and (spent.rho is None or spent.delta0 is None):
        entry = _unreadable_summary(name, rows, "a zcdp dataset holds a release without a "
                                    "(rho, delta0) record (NULL), so its spent rho is unknown")
        entry.update(composition=totals.composition, budget={
            "epsilon": float(totals.epsilon), "delta": float(totals.delta)})
        return entry
    if zcdp:
        eps = totals.epsilon_of(spent.rho)
        shown_spent = {"epsilon": eps, "delta": float(comp.add(
            spent.delta0, totals.conversion_delta if spent.rho > 0 else 0))}
    else:
        shown_spent = {"epsilon": float(spent.epsilon), "delta": float(spent.delta)}
    records = {"rho_spent": _num(comp.text(spent.rho)),
               "delta0_spent": _num(comp.text(spent.delta0))}
    if zcdp:
        records.update(rho_budget=float(totals.rho), delta0_budget=float(totals.delta0),
                       conversion_delta=float(totals.conversion_delta),
                       epsilon_of_rho_spent=shown_spent["epsilon"])
    elif spent.rho is not None:
        records["epsilon_of_rho_spent_at_delta"] = {
            "delta": float(totals.delta), "note": "what these releases would convert to "
            "under zcdp with threshold_delta 0, for comparison",
            "epsilon": comp.Totals(comp.ZCDP, totals.epsilon, totals.delta, comp.ZERO,
                                   comp.ZERO).epsilon_of(spent.rho)}
    entry = {
        "dataset": name,
        "composition": totals.composition,
        "budget": {"epsilon": float(totals.epsilon), "delta": float(totals.delta)},
        "spent": shown_spent,
        "zcdp": records,
        "releases": [{"id": r[8], "name": r[0], "epsilon": _num(r[1]), "delta": _num(r[2]),
                      "rho": _num(r[9]), "delta0": _num(r[10]),
                      "config_sha256": r[3], "state": r[4], "time": r[6] or r[5],
                      "output": r[7]} for r in rows],
    }
    if problem is not None:
        entry["warning"] = (f"the running sums in the dataset's row cannot be right ({problem}); "
                            f"shown: the sums of its releases. The next run refuses until they "
                            f"are repaired (set the dataset's spent_* columns to NULL to have "
                            f"them folded again)")
    elif folded != spent:
        entry["warning"] = (f"the running sums in the dataset's row ({spent}) differ from the "
                            f"sums of its releases ({folded}): the ledger was edited by hand "
                            f"or is corrupt")
    return entry


def _shown(ledger):
    return ledger_postgres.shown(ledger) if ledger_postgres.is_url(ledger) else ledger


def _database_errors(conn):
    if hasattr(conn, "lock_dataset"):
        return ledger_postgres.database_errors()
    return (sqlite3.DatabaseError,)


def printable(text):
    """Text from the ledger for a terminal: control characters (a dataset name with an
    escape sequence or a newline) shown escaped, as Python writes them, never raw."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def format_summary(datasets):
    n = comp.shown_number
    lines = []
    for d in datasets:
        b, s, z = d["budget"], d["spent"], d["zcdp"]
        name = printable(d["dataset"])
        count = f"{len(d['releases'])} release{'s' if len(d['releases']) != 1 else ''}"
        if s is None:
            lines.append(f"dataset {name} ({count}): cannot be read")
        elif d["composition"] == comp.ZCDP:
            lines.append(f"dataset {name} (zcdp composition, {count}): spent rho "
                         f"{n(z['rho_spent'])} of rho_B {n(z['rho_budget'])}, delta0 "
                         f"{n(z['delta0_spent'])} of delta0_B {n(z['delta0_budget'])}; that is "
                         f"epsilon {n(s['epsilon'])} of {n(b['epsilon'])} at delta "
                         f"{n(z['conversion_delta'])} + delta0 (total delta {n(b['delta'])})")
        else:
            lines.append(f"dataset {name}: spent epsilon {n(s['epsilon'])} of "
                         f"{n(b['epsilon'])}, delta {n(s['delta'])} of {n(b['delta'])} "
                         f"({count}, basic composition)")
        if d.get("warning"):
            lines.append(f"  WARNING: {printable(d['warning'])}")
        for r in d["releases"]:
            record = ("" if r["rho"] is None else
                      f" rho={n(r['rho'])} delta0={n(r['delta0'])}")
            lines.append(f"  {r['time']}  {printable(r['state']):<14} {printable(r['name'])}  "
                         f"epsilon={n(r['epsilon'])} delta={n(r['delta'])}{record}  config "
                         f"{printable(str(r['config_sha256'])[:12])}  "
                         f"{printable(r['output'] or '-')}")
    return "\n".join(lines) if lines else "the ledger holds no dataset yet"


def after_run_line(budget):
    """The line ``thresher run`` prints after a charged release."""
    try:
        d = summary(budget.ledger, budget.dataset)[0]
    except SpecError as exc:      # the release is published; the warning above says more
        return f"ledger: cannot be read now ({exc})"
    s, b, n = d["spent"], d["budget"], comp.shown_number
    if s is None:
        return f"ledger: cannot be read now ({d['warning']})"
    name = printable(d["dataset"])
    if d["composition"] == comp.ZCDP:
        z = d["zcdp"]
        return (f"ledger: dataset {name} (zcdp) has spent rho {n(z['rho_spent'])} of "
                f"{n(z['rho_budget'])}, delta0 {n(z['delta0_spent'])} of "
                f"{n(z['delta0_budget'])} (epsilon {n(s['epsilon'])} of {n(b['epsilon'])}) "
                f"({_where(budget.ledger)})")
    return (f"ledger: dataset {name} has spent epsilon {n(s['epsilon'])} of "
            f"{n(b['epsilon'])}, delta {n(s['delta'])} of {n(b['delta'])} "
            f"({_where(budget.ledger)})")


# ---- validate and plan: what the ledger would say, without charging it -----------------------

@dataclasses.dataclass(frozen=True)
class Preview:
    """What ``reserve`` would decide for a plan, read without writing: ``refuses`` (with
    the reason), the text for people, and ``warning`` when the ledger could not be read."""
    refuses: bool
    text: str
    warning: bool = False
    field: str = "budget"       # what a refusal names


def preview(plan):
    """Read the ledger (read-only; no reservation, no new dataset, no file created) and
    say what this release costs in both modes and what it would leave, or why the ledger
    will refuse it. A ledger that cannot be reached is a warning (the run will try again
    and refuse then if it must)."""
    budget = plan.spec.budget
    charge = full_charge(plan)
    wanted = comp.Totals.of_spec(budget)
    shown = _shown(budget.ledger)
    cost = f"this release costs {comp.cost_text(charge)}"
    if not ledger_postgres.is_url(budget.ledger) and not os.path.exists(budget.ledger):
        state = None
    else:
        try:
            conn = _connect(budget.ledger, create=False)
            try:
                row = _dataset_row(conn, budget.dataset)
            finally:
                conn.close()
            state = None if row is None else (row.totals, row.spent)
            if row is not None and row.totals_problem is not None:
                return Preview(True, f"the ledger {shown!r} is inconsistent: dataset "
                                     f"{budget.dataset!r}: {row.totals_problem} ({TOTALS_HELP})"
                                     f": the run will be refused", field="budget.ledger")
        except BadRow as exc:
            return Preview(True, f"{exc.message.replace('; nothing was read or published', '')}"
                                 f": the run will be refused", field="budget.ledger")
        except (SpecError, OSError) as exc:
            return Preview(False, f"cannot read the ledger {shown!r} ({exc}); not checked: the "
                                  f"run reads it again and refuses then if it must", warning=True)
        except Exception as exc:  # noqa: BLE001 - any database failure: a warning here
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            return Preview(False, f"cannot read the ledger {shown!r} ({type(exc).__name__}: "
                                  f"{first}); not checked: the run reads it again and refuses "
                                  f"then if it must", warning=True)
    if state is None:
        totals, spent = wanted, comp.Spent()
        where = (f"ledger: dataset {budget.dataset!r} is new in {shown!r} ({wanted.composition} "
                 f"composition; the first run creates it)")
    else:
        totals, spent = state
        if totals.composition == comp.ZCDP and (spent.rho is None or spent.delta0 is None):
            return Preview(True, f"the ledger {shown!r} is inconsistent: zcdp dataset "
                                 f"{budget.dataset!r} holds a release without a (rho, delta0) "
                                 f"record, so its spent rho is unknown: the run will be "
                                 f"refused", field="budget.ledger")
        try:
            _check_fixed(budget, totals, wanted)
        except SpecError as exc:
            return Preview(True, f"{exc.message}: the run will be refused", field=exc.field)
        where = f"ledger: {comp.state_text(budget.dataset, totals, spent)}"
    if not comp.admits(totals, spent, charge):
        return Preview(True, f"{comp.refusal_text(budget.dataset, totals, spent, charge)}: "
                             f"the ledger {shown!r} will refuse it")
    return Preview(False, f"{where}; {cost}; after it {comp.remaining_text(totals, spent, charge)} "
                          f"remain ({shown!r}; not charged)")


# ---- thresher ledger set-budget --------------------------------------------------------------

def set_budget(path, dataset, epsilon, delta=None, threshold_delta=None, force=False):
    """``thresher ledger set-budget``: change a dataset's totals, the one way to do it.

    In one write transaction: the new totals (``delta`` and, zcdp, ``threshold_delta``
    kept when not given) are checked like a spec's budget section, rho_B is computed
    again from them (zcdp), what the dataset has spent is folded from its releases, and
    a total below it is refused unless ``force`` (the dataset then admits nothing until
    the total is raised again). The totals are stamped with their digest
    (``totals_digest``) and the change is recorded in ``budget_changes``. A dataset
    whose totals were edited by hand is repaired this way. Returns (old, new) as dicts."""
    if not ledger_postgres.is_url(path) and not os.path.isfile(path):
        raise SpecError("LEDGER", _no_ledger(path))
    with errors(path, "LEDGER", "updated"):
        conn = _connect(path, create=True)
        try:
            with _write_transaction(conn):
                _lock_row(conn, dataset)
                row = _select(conn, "datasets", _DATASET_COLUMNS, " WHERE dataset = ?",
                              (dataset,)).fetchone()
                if row is None:
                    raise SpecError("DATASET", f"no dataset {printable(dataset)!r} in the "
                                    f"ledger {_shown(path)!r} (a dataset is created by its "
                                    f"first release)")
                old_text = [None if v is None else str(v) for v in row[:5]]
                mode = row[2] or comp.BASIC
                if mode not in comp.MODES:
                    raise BadRow(f"dataset {dataset!r}'s", "composition", mode,
                                 f"one of {', '.join(comp.MODES)}")
                new = _new_totals(mode, row, dataset, epsilon, delta, threshold_delta)
                spent = _fold(conn, dataset)
                over = _overspent(new, spent)
                if over and not force:
                    raise SpecError("--force", f"dataset {printable(dataset)!r} has already "
                                    f"spent {over}: a total below what is spent admits no "
                                    f"release until it is raised again; pass --force to set "
                                    f"it anyway")
                changes = conn.execute("SELECT row_changes FROM datasets WHERE dataset = ?",
                                       (dataset,)).fetchone()[0]
                conn.execute("UPDATE datasets SET epsilon = ?, delta = ?, threshold_delta = ?, "
                             "rho = ?, totals_sha256 = ? WHERE dataset = ?",
                             (comp.text(new.epsilon), comp.text(new.delta),
                              comp.text(new.delta0), comp.text(new.rho), _digest_of(new),
                              dataset))
                _write_spent(conn, dataset, spent, changes)
                conn.execute("INSERT INTO budget_changes (dataset, changed_at, old_epsilon, "
                             "old_delta, old_threshold_delta, old_rho, epsilon, delta, "
                             "threshold_delta, rho, spent, forced, host, pid) VALUES (?, ?, ?, "
                             "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (dataset, _now(), old_text[0], old_text[1], old_text[3],
                              old_text[4], comp.text(new.epsilon), comp.text(new.delta),
                              comp.text(new.delta0), comp.text(new.rho),
                              comp.state_text(dataset, new, spent), 1 if over else 0,
                              socket.gethostname(), os.getpid()))
        finally:
            conn.close()
    return ({"epsilon": old_text[0], "delta": old_text[1], "threshold_delta": old_text[3],
             "rho": old_text[4]},
            {"dataset": dataset, "composition": mode, "epsilon": float(new.epsilon),
             "delta": float(new.delta),
             "threshold_delta": None if new.delta0 is None else float(new.delta0),
             "rho": None if new.rho is None else float(new.rho), "forced": bool(over),
             "spent": comp.state_text(dataset, new, spent)})


def _new_totals(mode, row, dataset, epsilon, delta, threshold_delta):
    """The Totals set-budget writes: its arguments checked as a spec's budget fields are
    (named as the options), the ones not given kept from the dataset's row."""
    where = f"dataset {dataset!r}'s"
    if delta is None:
        delta = float(_stored(row[1], where, "delta"))
    if mode == comp.ZCDP and threshold_delta is None:
        threshold_delta = float(_stored(row[3], where, "threshold_delta"))
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise SpecError("--epsilon", f"must be a finite number > 0, got {epsilon!r}")
    if not (0 <= delta < 1) or (mode == comp.ZCDP and delta <= 0):
        raise SpecError("--delta", f"must be in {'(0, 1)' if mode == comp.ZCDP else '[0, 1)'}"
                        f", got {delta!r}")
    if mode == comp.BASIC and threshold_delta is not None:
        raise SpecError("--threshold-delta", "applies to zcdp datasets only")
    budget = BudgetSpec("", dataset, float(epsilon), float(delta), mode,
                        None if threshold_delta is None else float(threshold_delta))
    try:
        return budget_totals(budget, names=("--epsilon", "--delta", "--threshold-delta"))
    except SpecError:
        raise


def _overspent(totals, spent):
    """What ``spent`` exceeds of ``totals`` in words ("" if it fits)."""
    if totals.composition == comp.ZCDP:
        if spent.rho is None or spent.delta0 is None:
            raise SpecError("budget.ledger", "a zcdp dataset holds a release without a (rho, "
                            "delta0) record; the ledger is inconsistent")
        pairs = (("rho", spent.rho, totals.rho), ("delta0", spent.delta0, totals.delta0))
    else:
        pairs = (("epsilon", spent.epsilon, totals.epsilon),
                 ("delta", spent.delta, totals.delta))
    return ", ".join(f"{name} {comp.shown_number(used)}, more than the new "
                     f"{comp.shown_number(total)}" for name, used, total in pairs if used > total)


def budget_totals(budget, names=("budget.epsilon", "budget.delta", "budget.threshold_delta")):
    """``composition.Totals.of_spec`` with its failures as SpecErrors naming the field:
    a zcdp total so large that rho_B cannot be computed (epsilon 1e308), or a delta that
    leaves no room to convert rho (delta 0, 5e-324: rho_B would be 0, refusing every
    release) (issue 42: these were internal errors)."""
    eps_name, delta_name, threshold_name = names
    comp.check_section(budget.composition, budget.threshold_delta, budget.delta)
    import warnings
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)    # numpy's overflow, refused below
            totals = comp.Totals.of_spec(budget)
    except (ValueError, ArithmeticError, OverflowError, decimal.DecimalException):
        raise SpecError(eps_name, f"{comp.shown_number(budget.epsilon)} is too large for "
                        f"zcdp composition: its rho_B cannot be computed (the conversion "
                        f"overflows); give a total epsilon of at most 1e6 (already far past "
                        f"any meaningful guarantee)") from None
    if totals.composition == comp.ZCDP and not totals.rho > 0:
        conv = totals.conversion_delta
        if budget.threshold_delta is not None and budget.threshold_delta > 0:
            raise SpecError(threshold_name, f"leaves delta - threshold_delta = "
                            f"{comp.shown_number(conv)}, too small to convert any rho to "
                            f"epsilon (rho_B = 0 would refuse every release); give a smaller "
                            f"threshold_delta or a larger delta")
        raise SpecError(delta_name, f"must be large enough to convert rho to epsilon under "
                        f"zcdp composition, got {comp.shown_number(budget.delta)} (rho_B = 0 "
                        f"would refuse every release); give a delta such as 1e-6")
    return totals

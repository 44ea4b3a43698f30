"""The ledger in an SQLite file (``budget.ledger: ledgers/search-logs.sqlite``): the
``backend.Backend`` of a file path, through Python's standard ``sqlite3``.

What makes "two runs with room for one: exactly one proceeds" hold here is the
database's write lock: every write transaction is ``BEGIN IMMEDIATE``, which takes the
lock before anything is read, so two runs cannot both read the old sums and both write
(a second run waits up to ``BUSY_TIMEOUT_S``, saying so after a few seconds). The lock
needs a local file system (not NFS). A ledger opened only to read is opened read-only
(``mode=ro``) and never created.

The tables (``_TABLES``) are created when a ledger is first opened for writing; a ledger
written by an older thresher is given the columns added since (``NEW_COLUMNS``), the run
token index and the ``TRIGGERS`` in one write transaction (``migrate``).
"""
import contextlib
import os
import pathlib
import sqlite3

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers.backend import Backend
from thresher.pipelines.ledgers.sums import NO_RECORD, UNFOLD

BUSY_TIMEOUT_S = 60.0
LOCK_WAIT = ("waiting for the ledger {ledger}: another process (a thresher run or command) is "
             f"writing to it; this run waits up to {BUSY_TIMEOUT_S:g} s for its lock, then "
             f"stops with an error naming budget.ledger")

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
# The ledger's triggers (``postgres_backend`` has the same on the server). They bind every
# program that writes the tables, an older thresher included: ``releases_need_record``
# refuses a release without its record (every older thresher fails closed, with its own
# exit-2 error naming the ledger; review F1: it inserted releases without a record and
# never updated the running sums), and the ``releases_counted_*`` count each insert,
# delete and change of a release's charge in its dataset's ``row_changes``. This version
# stamps its running sums with the count they cover (``spent_row_changes``); sums that
# do not cover the count are folded again from the releases (``store.dataset_row``).
# Counting, not summing: SQLite has no exact decimals.
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
# to an older ledger when it is opened for writing (``migrate``); readers treat them as
# NULL until then (``store.select``).
NEW_COLUMNS = {
    "datasets": ("composition", "threshold_delta", "rho", "spent_epsilon", "spent_delta",
                 "spent_rho", "spent_delta0", "row_changes", "spent_row_changes",
                 "totals_sha256"),
    "releases": ("rho", "delta0", "run_token"),
}
COLUMN_TYPES = {"row_changes": "INTEGER NOT NULL DEFAULT 0", "spent_row_changes": "INTEGER"}
_INSERT_DATASET = ("INSERT INTO datasets (dataset, epsilon, delta, created, composition, "
                   "threshold_delta, rho, spent_epsilon, spent_delta, spent_rho, spent_delta0, "
                   "row_changes, spent_row_changes, totals_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, "
                   "?, ?, ?, ?, ?, ?, ?)")
LEDGER_SUFFIXES = (".sqlite", ".db", ".sqlite3")


class SQLiteBackend(Backend):
    """An SQLite ledger file, opened (``connect``)."""

    is_file = True

    def __init__(self, conn):
        self._conn = conn

    # ---- the location ------------------------------------------------------------------

    @classmethod
    def claims(cls, location):
        return True            # whatever is no database URL is a file path

    @classmethod
    def shown(cls, location):
        return location

    @classmethod
    def where(cls, location):
        return os.path.abspath(location)

    @classmethod
    def named(cls, location):
        if os.path.abspath(location) != location:
            return f"{location!r} ({os.path.abspath(location)})"
        return repr(location)

    @classmethod
    def expanded(cls, location):
        return os.path.expanduser(location)      # ~/ledgers/x.sqlite: the home folder's

    @classmethod
    def resolved(cls, location, folder):
        if os.path.isabs(location):
            return location
        return os.path.normpath(os.path.join(folder, location))

    @classmethod
    def nothing_there(cls, location):
        return not os.path.exists(location)

    @classmethod
    def missing(cls, location):
        return "" if os.path.isfile(location) else _no_ledger(location)

    @classmethod
    def database_errors(cls):
        return (sqlite3.Error,)

    @classmethod
    def connect(cls, location, create, field):
        path = location
        if create:
            folder = os.path.dirname(os.path.abspath(path))
            try:
                os.makedirs(folder, exist_ok=True)
            except OSError as exc:
                raise SpecError(field, f"cannot create the folder {folder!r}: "
                                f"{exc.strerror or exc}") from None
            uri = None
        else:
            if not os.path.isfile(path):
                raise SpecError(field, _no_ledger(path))
            uri = f"{pathlib.Path(os.path.abspath(path)).as_uri()}?mode=ro"
        # heavy: start-up of thresher schema
        from thresher.pipelines.common.progress import when_slow
        try:
            if uri:
                conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S,
                                       isolation_level=None)
            else:
                conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
            conn.execute("PRAGMA foreign_keys = ON")
            if create:
                with when_slow(LOCK_WAIT.format(ledger=path)):
                    # The tables of a new ledger (its index and triggers come from
                    # ``migrate``, which gives an older ledger its new columns first);
                    # waits while another process writes.
                    conn.executescript(_TABLES)
        except sqlite3.Error as exc:
            if create and not os.path.exists(path) and not os.access(
                    os.path.dirname(os.path.abspath(path)), os.W_OK | os.X_OK):
                raise SpecError(field, f"cannot create the ledger {path!r} "
                                f"({os.path.abspath(path)}): its folder is not writable by "
                                f"this user; make the folder writable, or name a ledger in a "
                                f"writable folder") from None
            raise SpecError(field, f"{path!r} ({os.path.abspath(path)}) is not a usable "
                            f"ledger: {exc}") from None
        return cls(conn)

    # ---- an opened ledger --------------------------------------------------------------

    def execute(self, sql, params=()):
        return self._conn.execute(sql, params)

    def close(self):
        self._conn.close()

    @contextlib.contextmanager
    def write_transaction(self):
        """BEGIN IMMEDIATE: the write lock is taken before anything is read."""
        # heavy: start-up of thresher schema
        from thresher.pipelines.common.progress import when_slow
        with when_slow(LOCK_WAIT.format(ledger=self._file())):
            self._conn.execute("BEGIN IMMEDIATE")     # waits while another process writes
        try:
            yield self
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def _file(self):
        """The connection's file (for messages)."""
        try:
            return next((row[2] for row in self._conn.execute("PRAGMA database_list")
                         if row[1] == "main"), "") or "(in memory)"
        except sqlite3.Error:
            return "(its file)"

    def columns_of(self, table):
        return [row[1] for row in self._conn.execute(f"PRAGMA table_info({table})").fetchall()]

    def _triggers(self):
        return [row[0] for row in self._conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = "
            "'releases'").fetchall()]

    def migrate(self, location):
        """A ledger written before composition modes, records or the triggers: add the
        NEW_COLUMNS (nullable or counting from 0, nothing rewritten), the run-token index
        and the TRIGGERS, in one write transaction (two runs migrating at once: the second
        finds them). Every dataset's running sums are then folded again at its next
        reservation: sums written while the triggers were missing may miss an older
        thresher's rows (the review's F1). A ledger that cannot be altered is refused
        naming the table (exit 2); nothing is lost."""
        if (all(set(cols) <= set(self.columns_of(t)) for t, cols in NEW_COLUMNS.items())
                and set(TRIGGERS) <= set(self._triggers())):
            return
        table = None
        try:
            with self.write_transaction():
                for table, cols in NEW_COLUMNS.items():
                    have = self.columns_of(table)
                    for col in cols:
                        if col not in have:
                            self.execute(f"ALTER TABLE {table} ADD COLUMN {col} "
                                         f"{COLUMN_TYPES.get(col, 'TEXT')}")
                table = "releases"
                self.execute(_INDEX)
                for trigger in TRIGGERS.values():
                    self.execute(trigger)
                self.execute(UNFOLD)
        except sqlite3.Error as exc:
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecError("budget.ledger", f"the ledger {location!r} was written by an "
                            f"older thresher and its table {table!r} cannot be given the "
                            f"columns and triggers this version records "
                            f"({', '.join(NEW_COLUMNS.get(table, ()))}): {first}; "
                            f"nothing was changed (open it writable once, or use a new "
                            f"ledger)") from None

    def lock_dataset(self, dataset, fresh):
        # BEGIN IMMEDIATE holds the whole database: a check, then the insert, is safe.
        new = self.execute("SELECT 1 FROM datasets WHERE dataset = ?",
                           (dataset,)).fetchone() is None
        if new:
            self.execute(_INSERT_DATASET, fresh)
        return new

    def lock_row(self, dataset):
        """Nothing to do: BEGIN IMMEDIATE holds the whole database already."""

    def insert_release(self, sql, params):
        return self.execute(sql, params).lastrowid

    def statement_errors(self):
        return (sqlite3.DatabaseError,)


def _no_ledger(path):
    """Why there is no ledger to read at ``path``: nothing there, or a folder (named with
    the ledger files in it, if any)."""
    where = f"{path!r} ({os.path.abspath(path)})"
    if os.path.isdir(path):
        try:
            found = sorted(n for n in os.listdir(path) if n.endswith(LEDGER_SUFFIXES))
        except OSError:
            found = []
        hint = (f"; ledger files in it: {', '.join(found[:5])}" if found else
                "; no .sqlite file in it")
        return (f"{where} is a folder, not a ledger: give the ledger file (a spec's "
                f"budget.ledger){hint}")
    return f"no ledger at {where}"

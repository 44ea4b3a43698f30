"""The ledger on a PostgreSQL server: ``budget.ledger: postgresql://user@host:5432/db``;
the ``backend.Backend`` of a ``postgresql://`` URL.

The same tables and the same life of a release as the SQLite ledger (``sqlite_backend``;
the lifecycle is ``pipelines.ledgers.lifecycle``), through psycopg 3 (``pip install
'thresher[postgres]'``). What makes "two runs with room for one: exactly one proceeds"
hold here is a row lock, not a check then a write: ``reserve`` runs in one transaction
that first makes sure the dataset's row exists (``lock_dataset``: ``INSERT ... ON
CONFLICT DO NOTHING``) and then takes that row ``FOR UPDATE``; a second run on the same
dataset waits at that lock until the first commits, and then reads the running sums
(kept in that row) including the first release. The tables are created -- and an older
ledger's tables given the columns added since (``ADD COLUMN IF NOT EXISTS``, all
nullable) -- under a transaction-scoped advisory lock, so two first runs do not race on
``CREATE`` or ``ALTER``; the ledger's triggers (``TRIGGERS``: a release without its
record refused, each change of a release counted) are created there too when missing.
"""
import contextlib

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import sums
from thresher.pipelines.ledgers.backend import Backend, without_password

SCHEMES = ("postgresql", "postgres")
_ADVISORY_KEY = 0x7468726573686572      # "thresher": serialises CREATE TABLE
CONNECT_TIMEOUT_S = 30

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS datasets (
        dataset TEXT PRIMARY KEY,
        epsilon TEXT NOT NULL,
        delta TEXT NOT NULL,
        created TEXT NOT NULL,
        composition TEXT,
        threshold_delta TEXT,
        rho TEXT,
        spent_epsilon TEXT,
        spent_delta TEXT,
        spent_rho TEXT,
        spent_delta0 TEXT,
        row_changes BIGINT NOT NULL DEFAULT 0,
        spent_row_changes BIGINT,
        totals_sha256 TEXT)""",
    """CREATE TABLE IF NOT EXISTS releases (
        id BIGSERIAL PRIMARY KEY,
        dataset TEXT NOT NULL REFERENCES datasets(dataset),
        name TEXT NOT NULL,
        epsilon TEXT NOT NULL,
        delta TEXT NOT NULL,
        config_sha256 TEXT NOT NULL,
        state TEXT NOT NULL,
        reserved_at TEXT NOT NULL,
        finished_at TEXT,
        output TEXT,
        host TEXT,
        pid INTEGER,
        rho TEXT,
        delta0 TEXT,
        run_token TEXT)""",
    """CREATE TABLE IF NOT EXISTS budget_changes (
        id BIGSERIAL PRIMARY KEY,
        dataset TEXT NOT NULL,
        changed_at TEXT NOT NULL,
        old_epsilon TEXT, old_delta TEXT, old_threshold_delta TEXT, old_rho TEXT,
        epsilon TEXT NOT NULL, delta TEXT NOT NULL, threshold_delta TEXT, rho TEXT,
        spent TEXT,
        forced INTEGER NOT NULL DEFAULT 0,
        host TEXT,
        pid INTEGER)""",
)
# The columns added since the first ledgers (sqlite_backend.NEW_COLUMNS): an
# older database gets them here, under the same advisory lock as CREATE TABLE.
_MIGRATIONS = (
    *(f"ALTER TABLE datasets ADD COLUMN IF NOT EXISTS {c} TEXT" for c in (
        "composition", "threshold_delta", "rho", "spent_epsilon", "spent_delta", "spent_rho",
        "spent_delta0")),
    "ALTER TABLE datasets ADD COLUMN IF NOT EXISTS row_changes BIGINT NOT NULL DEFAULT 0",
    "ALTER TABLE datasets ADD COLUMN IF NOT EXISTS spent_row_changes BIGINT",
    "ALTER TABLE datasets ADD COLUMN IF NOT EXISTS totals_sha256 TEXT",
    *(f"ALTER TABLE releases ADD COLUMN IF NOT EXISTS {c} TEXT" for c in (
        "rho", "delta0", "run_token")),
    "CREATE UNIQUE INDEX IF NOT EXISTS releases_run_token ON releases (run_token)",
)
# The ledger's triggers (sqlite_backend.TRIGGERS: the same on SQLite): a release
# without its record is refused, whoever inserts it (an older thresher fails closed), and
# every insert, delete and change of a release's charge is counted in its dataset's
# ``row_changes``. Created once, when missing (then every dataset's running sums are
# folded again: ``sums.UNFOLD``).
_FUNCTIONS = (
    """CREATE OR REPLACE FUNCTION thresher_release_needs_record() RETURNS trigger
       LANGUAGE plpgsql AS $$
       BEGIN
         RAISE EXCEPTION USING ERRCODE = 'check_violation', MESSAGE = %(message)s;
       END $$""",
    """CREATE OR REPLACE FUNCTION thresher_count_release_change() RETURNS trigger
       LANGUAGE plpgsql AS $$
       BEGIN
         IF TG_OP <> 'INSERT' THEN
           UPDATE datasets SET row_changes = row_changes + 1 WHERE dataset = OLD.dataset;
         END IF;
         IF TG_OP = 'INSERT' OR (TG_OP = 'UPDATE' AND NEW.dataset IS DISTINCT FROM OLD.dataset)
         THEN
           UPDATE datasets SET row_changes = row_changes + 1 WHERE dataset = NEW.dataset;
         END IF;
         RETURN NULL;
       END $$""",
)
TRIGGERS = {
    "releases_need_record": "CREATE TRIGGER releases_need_record BEFORE INSERT ON releases "
                            "FOR EACH ROW WHEN (NEW.rho IS NULL OR NEW.delta0 IS NULL) "
                            "EXECUTE PROCEDURE thresher_release_needs_record()",
    "releases_counted": "CREATE TRIGGER releases_counted AFTER INSERT OR DELETE OR UPDATE OF "
                        "dataset, epsilon, delta, rho, delta0 ON releases FOR EACH ROW "
                        "EXECUTE PROCEDURE thresher_count_release_change()",
}


def is_url(ledger):
    return ledger.split("://", 1)[0].lower() in SCHEMES and "://" in ledger


def shown(url):
    """The URL without its password, for messages."""
    return without_password(url)


class PostgresBackend(Backend):
    """A PostgreSQL ledger, connected (``connect``); speaks the SQLite ledger's SQL (``?``
    placeholders)."""

    def __init__(self, conn):
        self._conn = conn

    # ---- the location ------------------------------------------------------------------

    @classmethod
    def claims(cls, location):
        return is_url(location)

    @classmethod
    def shown(cls, location):
        return shown(location)

    @classmethod
    def where(cls, location):
        return shown(location)

    @classmethod
    def named(cls, location):
        return repr(shown(location))

    @classmethod
    def expanded(cls, location):
        return location

    @classmethod
    def resolved(cls, location, folder):
        return location

    @classmethod
    def nothing_there(cls, location):
        return False          # only the server can tell: connect and read

    @classmethod
    def missing(cls, location):
        return ""

    @classmethod
    def database_errors(cls):
        try:
            # optional: psycopg, an optional dependency (PostgreSQL ledgers only)
            import psycopg      # optional (the postgres extra); only a URL ledger needs it
        except ImportError:
            return ()
        return (psycopg.Error,)

    @classmethod
    def connect(cls, location, create, field):
        return cls(_connect(location, create, field))

    # ---- a connected ledger ------------------------------------------------------------

    def execute(self, sql, params=()):
        return self._conn.execute(sql.replace("?", "%s"), params)

    def close(self):
        self._conn.close()

    @contextlib.contextmanager
    def write_transaction(self):
        with self._conn.transaction():
            yield self

    def migrate(self, location):
        """Nothing left to do: ``connect`` made the tables, columns and triggers under its
        advisory lock."""

    def lock_dataset(self, dataset, fresh):
        """Inside a write transaction: the dataset's row, created with the values ``fresh``
        (every column of ``datasets``, dataset first) if new, locked until the transaction
        ends. Returns whether this call created it."""
        # A first release abandoned meanwhile deletes the row it created (only a charged
        # release fixes a total): the SELECT may then find none, and the INSERT is retried.
        for _ in range(10):
            cur = self.execute("INSERT INTO datasets (dataset, epsilon, delta, created, "
                               "composition, threshold_delta, rho, spent_epsilon, spent_delta, "
                               "spent_rho, spent_delta0, row_changes, spent_row_changes, "
                               "totals_sha256) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) "
                               "ON CONFLICT (dataset) "
                               "DO NOTHING", fresh)
            new = cur.rowcount == 1
            row = self.execute("SELECT epsilon FROM datasets WHERE dataset = ? FOR "
                               "UPDATE", (dataset,)).fetchone()
            if row is not None:
                return new
        raise SpecError("budget.ledger", f"the dataset {dataset!r} kept vanishing from the "
                        "ledger while this run reserved (deleted by other runs); try again")

    def lock_row(self, dataset):
        """FOR UPDATE: other runs on this dataset wait for this transaction."""
        self.execute("SELECT 1 FROM datasets WHERE dataset = ? FOR UPDATE", (dataset,))

    def columns_of(self, table):
        """The column names of ``table`` in the connection's schema ([] if none)."""
        rows = self.execute("SELECT column_name FROM information_schema.columns WHERE "
                            "table_schema = current_schema() AND table_name = ? ORDER BY "
                            "ordinal_position", (table,)).fetchall()
        return [r[0] for r in rows]

    def insert_release(self, sql, params):
        return self.execute(f"{sql} RETURNING id", params).fetchone()[0]

    def statement_errors(self):
        return self.database_errors()


def _connect(url, create, field):
    """The psycopg connection (autocommit; tables made under the advisory lock when
    ``create``)."""
    try:
        import psycopg  # optional: psycopg, an optional dependency (PostgreSQL ledgers only)
    except ImportError:
        raise SpecError(field, "a PostgreSQL ledger needs psycopg: pip install "
                        "'thresher[postgres]'") from None
    from thresher.pipelines.common.progress import when_slow  # heavy: start-up of thresher schema
    try:
        # A server that never answers: said after a few seconds, not 30 s of silence
        with when_slow(f"connecting to the ledger {shown(url)}: the server has not answered "
                       f"yet; waiting up to {CONNECT_TIMEOUT_S} s"):
            conn = psycopg.connect(url, autocommit=True, connect_timeout=CONNECT_TIMEOUT_S)
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecError(field if create else "", f"cannot connect to the ledger "
                        f"{shown(url)}: {first}") from None
    if create:
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
                for statement in (*_SCHEMA, *_MIGRATIONS):
                    conn.execute(statement)
                _install_triggers(conn)
        except psycopg.Error as exc:
            # e.g. a datasets table of another shape: REFERENCES datasets(dataset) fails
            conn.close()
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecError(field, f"the ledger {shown(url)} cannot be used (its tables "
                            f"cannot be made or are of another shape): {first}") from None
    return conn


def _triggers_of(conn, table):
    rows = conn.execute("SELECT t.tgname FROM pg_trigger t JOIN pg_class c ON c.oid = "
                        "t.tgrelid WHERE c.relname = %s AND c.relnamespace = "
                        "current_schema()::regnamespace AND NOT t.tgisinternal",
                        (table,)).fetchall()
    return [r[0] for r in rows]


def _install_triggers(conn):
    """Inside connect's transaction (under the advisory lock): the TRIGGERS and their
    functions, if any is missing; then every dataset's sums are folded again."""
    if set(TRIGGERS) <= set(_triggers_of(conn, "releases")):
        return
    for function in _FUNCTIONS:
        conn.execute(function.replace("%(message)s", _literal(sums.NO_RECORD)))
    for name, statement in TRIGGERS.items():
        conn.execute(f"DROP TRIGGER IF EXISTS {name} ON releases")
        conn.execute(statement)
    conn.execute(sums.UNFOLD)


def _literal(text):
    return "'" + text.replace("'", "''") + "'"

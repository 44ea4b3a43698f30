"""The ledger on a PostgreSQL server: ``budget.ledger: postgresql://user@host:5432/db``.

The same two tables and the same life of a release as the SQLite ledger
(``pipelines.ledger``), through psycopg 3 (``pip install 'thresher[postgres]'``). What
makes "two runs with room for one: exactly one proceeds" hold here is a row lock, not a
check then a write: ``reserve`` runs in one transaction that first makes sure the
dataset's row exists (``INSERT ... ON CONFLICT DO NOTHING``) and then takes that row
``FOR UPDATE``; a second run on the same dataset waits at that lock until the first
commits, and then reads the sum including the first release. The tables are created
under a transaction-scoped advisory lock, so two first runs do not race on ``CREATE``.
"""
import contextlib
import re

from thresher.pipelines.errors import SpecError

SCHEMES = ("postgresql", "postgres")
_ADVISORY_KEY = 0x7468726573686572      # "thresher": serialises CREATE TABLE

_SCHEMA = (
    """CREATE TABLE IF NOT EXISTS datasets (
        dataset TEXT PRIMARY KEY,
        epsilon TEXT NOT NULL,
        delta TEXT NOT NULL,
        created TEXT NOT NULL)""",
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
        pid INTEGER)""",
)


def is_url(ledger):
    return ledger.split("://", 1)[0].lower() in SCHEMES and "://" in ledger


def shown(url):
    """The URL without its password, for messages."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)


class Connection:
    """A psycopg connection that speaks the SQLite ledger's SQL (``?`` placeholders)."""

    dialect = "postgresql"

    def __init__(self, conn):
        self._conn = conn

    def execute(self, sql, params=()):
        return self._conn.execute(sql.replace("?", "%s"), params)

    def close(self):
        self._conn.close()

    @contextlib.contextmanager
    def write_transaction(self):
        with self._conn.transaction():
            yield self

    def lock_dataset(self, dataset, total):
        """Inside a write transaction: the dataset's row, created with ``total`` (epsilon,
        delta, created) if new, locked until the transaction ends. Returns (row, new)."""
        # A first release abandoned meanwhile deletes the row it created (only a charged
        # release fixes a total): the SELECT may then find none, and the INSERT is retried.
        for _ in range(10):
            cur = self.execute("INSERT INTO datasets VALUES (?, ?, ?, ?) ON CONFLICT (dataset) "
                               "DO NOTHING", (dataset, *total))
            new = cur.rowcount == 1
            row = self.execute("SELECT epsilon, delta FROM datasets WHERE dataset = ? FOR "
                               "UPDATE", (dataset,)).fetchone()
            if row is not None:
                return row, new
        raise SpecError("budget.ledger", f"the dataset {dataset!r} kept vanishing from the "
                        "ledger while this run reserved (deleted by other runs); try again")

    def columns_of(self, table):
        """The column names of ``table`` in the connection's schema ([] if none)."""
        rows = self.execute("SELECT column_name FROM information_schema.columns WHERE "
                            "table_schema = current_schema() AND table_name = ? ORDER BY "
                            "ordinal_position", (table,)).fetchall()
        return [r[0] for r in rows]

    def insert_release(self, sql, params):
        return self.execute(f"{sql} RETURNING id", params).fetchone()[0]


def connect(url, create, field="budget.ledger"):
    try:
        import psycopg
    except ImportError:
        raise SpecError(field, "a PostgreSQL ledger needs psycopg: pip install "
                        "'thresher[postgres]'") from None
    try:
        conn = psycopg.connect(url, autocommit=True, connect_timeout=30)
    except psycopg.Error as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecError(field if create else "", f"cannot connect to the ledger "
                        f"{shown(url)}: {first}") from None
    if create:
        try:
            with conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_ADVISORY_KEY,))
                for statement in _SCHEMA:
                    conn.execute(statement)
        except psycopg.Error as exc:
            # e.g. a datasets table of another shape: REFERENCES datasets(dataset) fails
            conn.close()
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise SpecError(field, f"the ledger {shown(url)} cannot be used (its tables "
                            f"cannot be made or are of another shape): {first}") from None
    return Connection(conn)


def database_errors():
    import psycopg
    return (psycopg.Error,)

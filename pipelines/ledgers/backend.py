"""The one interface between the ledger's lifecycle and a database: what reserving,
publishing, abandoning, ``ledger show``, ``ledger reservations`` / ``release`` and
``ledger set-budget`` need of a ledger, and nothing else.

Two implementations: ``sqlite_backend.SQLiteBackend`` (a file; Python's ``sqlite3``) and
``postgres_backend.PostgresBackend`` (a server; psycopg 3). ``store.backend_for`` picks
one from the ledger's location once -- a ``postgresql://`` URL or a file path -- and the
lifecycle (``store``, ``lifecycle``, ``operations`` and ``show`` in ``pipelines.ledgers``)
calls only the methods below. It never asks a connection what it is: each difference
between the databases (how the write lock is taken, how a dataset's row is locked, how a
new row's id comes back, which errors the driver raises) is a method here with one
answer per backend.

Both backends speak the same SQL: the lifecycle writes ``?`` placeholders and the
columns of ``store.COLUMNS``; the PostgreSQL backend translates the placeholders.

Two kinds of method:

- on the class, about a *location* before anything is opened (how it is shown in
  messages, whether it is a file of this machine, why nothing can be read there);
- on an opened backend (``connect``), about the *connection*: statements, the write
  transaction, the dataset row's lock, the table shape, the driver's errors.
"""
import abc
import re


class Backend(abc.ABC):
    """An opened ledger database (``connect``), and what the lifecycle asks of its
    location (the class methods)."""

    #: The ledger is a file on this machine (its path resolves from the spec's folder,
    #: must lie outside the output folder, and is reached only by local workers).
    is_file = False

    # ---- the location, before anything is opened -------------------------------------------

    @classmethod
    @abc.abstractmethod
    def claims(cls, location):
        """Whether ``location`` names a ledger of this backend."""

    @classmethod
    @abc.abstractmethod
    def shown(cls, location):
        """The location as messages quote it (a URL without its password)."""

    @classmethod
    @abc.abstractmethod
    def where(cls, location):
        """The location as an informational line names it (a file's absolute path)."""

    @classmethod
    @abc.abstractmethod
    def named(cls, location):
        """The location as a database error names it (already quoted)."""

    @classmethod
    @abc.abstractmethod
    def expanded(cls, location):
        """The location a spec's ``budget.ledger`` means (``~`` expanded for a file)."""

    @classmethod
    @abc.abstractmethod
    def resolved(cls, location, folder):
        """The location, a relative file path resolved from ``folder``."""

    @classmethod
    @abc.abstractmethod
    def nothing_there(cls, location):
        """True when nothing at all exists at the location yet (a first run creates it):
        read without opening anything."""

    @classmethod
    @abc.abstractmethod
    def missing(cls, location):
        """Why there is no ledger to read or change at the location ("" if there may be)."""

    @classmethod
    @abc.abstractmethod
    def database_errors(cls):
        """The driver's exception classes: any of them is a SpecError naming the ledger."""

    @classmethod
    @abc.abstractmethod
    def connect(cls, location, create, field):
        """The opened backend. ``create``: make the tables if missing (and the file or its
        folder); otherwise open read-only where the database allows it. Failures are
        SpecErrors naming ``field``."""

    # ---- an opened ledger ------------------------------------------------------------------

    @abc.abstractmethod
    def execute(self, sql, params=()):
        """Run one statement (``?`` placeholders); the driver's cursor (``fetchone``,
        ``fetchall``, ``rowcount``)."""

    @abc.abstractmethod
    def close(self):
        """Close the connection."""

    @abc.abstractmethod
    def write_transaction(self):
        """A context manager: one transaction that holds the ledger's write lock from its
        start (SQLite: ``BEGIN IMMEDIATE``; PostgreSQL: a transaction in which
        ``lock_dataset`` / ``lock_row`` take the dataset's row); rolled back on an error."""

    @abc.abstractmethod
    def columns_of(self, table):
        """The column names of ``table`` ([] if there is no such table)."""

    @abc.abstractmethod
    def migrate(self, location):
        """On a ledger opened for writing, after its shape was checked: give a ledger
        written by an older thresher the columns, index and triggers added since (a
        SpecError naming ``budget.ledger`` if it cannot be altered)."""

    @abc.abstractmethod
    def lock_dataset(self, dataset, fresh):
        """Inside a write transaction: the dataset's row, inserted with ``fresh`` (every
        column of ``datasets``, dataset first) if missing, held until the transaction
        ends. Returns whether this call inserted it."""

    @abc.abstractmethod
    def lock_row(self, dataset):
        """Inside a write transaction: hold the dataset's existing row until it ends."""

    @abc.abstractmethod
    def insert_release(self, sql, params):
        """Run an ``INSERT INTO releases`` statement; the new row's id."""

    @abc.abstractmethod
    def statement_errors(self):
        """The exception classes of a statement the tables cannot answer (a file that is
        no ledger): ``ledger show`` says "not a thresher ledger"."""



def without_password(url):
    """A URL without its password, for messages (any scheme: a refused URL is quoted too)."""
    return re.sub(r"(://[^:/@]*):[^@/]*@", r"\1:***@", url)

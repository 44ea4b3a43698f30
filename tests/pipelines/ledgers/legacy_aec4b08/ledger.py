"""The privacy-budget ledger: what has been spent on a dataset, across releases.

A spec may name a ledger and the total (epsilon, delta) that protects one dataset (the
same users, across every release made from it)::

    budget:
      ledger: ledgers/search-logs.sqlite   # or postgresql://user@host:5432/db
      dataset: search-logs
      epsilon: 3.0
      delta: 1.0e-6

Composition across releases is basic: a release fits if the sum of the (epsilon, delta)
of every release already charged to the dataset, plus its own, stays within the total
(Dwork & Roth, *The Algorithmic Foundations of Differential Privacy*, Thm 3.16). Sums
are exact: each number is kept as the decimal it was written as (``repr`` of the float)
and added with ``decimal.Decimal``, so ten releases at 0.1 fill a total of 1.0 exactly.

The life of one release in the ledger (``thresher run``, ``pipelines.release.run``):

1. ``reserve`` — before any input is opened, one ``BEGIN IMMEDIATE`` transaction (SQLite
   takes the database's write lock at BEGIN, so two runs cannot both read the old sum
   and both write) sums what is charged, refuses the release if it would exceed the
   total (``SpecError`` naming ``budget``, exit 2), and otherwise inserts the release as
   ``reserved``. A reserved release counts as spent.
2. The pipeline runs into a staging location that only the operator can see.
3. ``publishing`` — just before the release is moved into place the row becomes
   ``publishing`` in a write transaction, only if it is still ``reserved``. If that
   fails (the ledger cannot be written, or an operator released the reservation) nothing
   is published. From here on its output could have been seen.
4. On success the release becomes ``published`` (with its output path); if the ledger
   cannot record that, the release stands, stays charged as ``publishing``, and the run
   warns (it never exits with an error for a release that is in place).
   On an error or a refusal *before* step 3 the reservation is deleted (and the
   dataset's row, if this first release created it: only a charged release fixes a
   total): nothing derived from the data left the staging location, which is discarded.
   On an error *after* step 3 (publishing started but did not finish) the release stays
   charged, as ``publish_failed``: part of it may be visible, so its budget is spent.

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
"""
import contextlib
import dataclasses
import datetime
import decimal
import hashlib
import logging
import os
import re
import socket
import sqlite3

from thresher.pipelines.specs import declare

from thresher.pipelines.ledgers import ledger_postgres
from thresher.pipelines.errors import SpecError

log = logging.getLogger("thresher")

# The spec's budget section (declared for pipelines.schema; all four are required).
FIELDS = {
    "ledger": declare.string(description="a SQLite file path, or a PostgreSQL database URL "
                                         "(postgresql://user@host:5432/db)"),
    "dataset": declare.string(description="what the total protects: the same users across "
                                          "releases"),
    "epsilon": declare.number(low=0, low_open=True, description="the total over all releases "
                                                                "on this dataset"),
    "delta": declare.number(low=0, high=1, high_open=True),
}
RESERVED, PUBLISHING, PUBLISHED, PUBLISH_FAILED = ("reserved", "publishing", "published",
                                                   "publish_failed")
BUSY_TIMEOUT_S = 60.0
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.\-]*:(//|[^\\/])")   # postgresql://..., sqlite:///...

_SCHEMA = """
CREATE TABLE IF NOT EXISTS datasets (
    dataset TEXT PRIMARY KEY,
    epsilon TEXT NOT NULL,            -- the total, as a decimal string
    delta TEXT NOT NULL,
    created TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS releases (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL REFERENCES datasets(dataset),
    name TEXT NOT NULL,
    epsilon TEXT NOT NULL,            -- what the release spends, as decimal strings
    delta TEXT NOT NULL,
    config_sha256 TEXT NOT NULL,
    state TEXT NOT NULL,              -- reserved | publishing | published | publish_failed
    reserved_at TEXT NOT NULL,
    finished_at TEXT,
    output TEXT,
    host TEXT,
    pid INTEGER
);
"""


@dataclasses.dataclass(frozen=True)
class BudgetSpec:
    """The spec's ``budget`` section."""
    ledger: str
    dataset: str
    epsilon: float
    delta: float


def parse_section(section, privacy):
    """The spec's ``budget`` section (the schema has checked its fields; ``privacy`` is the
    parsed PrivacySpec)."""
    ledger = section["ledger"]
    if (_URL.match(ledger) and not re.match(r"^[A-Za-z]:[\\/]", ledger)
            and not ledger_postgres.is_url(ledger)):
        raise SpecError("budget.ledger", f"the database URLs supported are postgresql://..., "
                        f"got {ledger_postgres.shown(ledger)!r}; or give the path of a SQLite "
                        f"file (e.g. ledgers/my-dataset.sqlite)")
    dataset = section["dataset"]
    epsilon, delta = float(section["epsilon"]), float(section["delta"])
    if privacy.epsilon > epsilon:
        raise SpecError("budget.epsilon", f"the dataset's total ({epsilon:g}) is smaller than "
                        f"this one release's privacy.epsilon ({privacy.epsilon:g})")
    return BudgetSpec(ledger=ledger, dataset=dataset, epsilon=epsilon, delta=delta)


def charge_of(plan):
    """(epsilon, delta) the release spends: privacy.epsilon, and privacy.delta unless the
    stages spend no delta at all (Laplace over public keys is (epsilon, 0)-DP)."""
    budget = plan.budget
    return budget.epsilon, (budget.delta if budget.spent_delta > 0 else 0.0)


# ---- exact sums -------------------------------------------------------------------------

def _dec(value):
    return decimal.Decimal(repr(float(value)))


def _sum(values):
    total = decimal.Decimal(0)
    for v in values:
        total += decimal.Decimal(v)
    return total


def _num(text):
    """A stored decimal as the float a person reads (2.0, 1e-08)."""
    return float(decimal.Decimal(text))


def _now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


# ---- the database -------------------------------------------------------------------------

def _connect(path, create):
    if ledger_postgres.is_url(path):
        conn = ledger_postgres.connect(path, create, "budget.ledger" if create else "")
        try:
            check_shape(conn, path, "budget.ledger" if create else "")
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
            raise SpecError("", f"no ledger at {path!r} ({os.path.abspath(path)})")
        uri = f"{_file_uri(path)}?mode=ro"
    try:
        if uri:
            conn = sqlite3.connect(uri, uri=True, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        else:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        conn.execute("PRAGMA foreign_keys = ON")
        if create:
            conn.executescript(_SCHEMA)
    except sqlite3.Error as exc:
        raise SpecError("budget.ledger" if create else "", f"{path!r} "
                        f"({os.path.abspath(path)}) is not a usable ledger: {exc}") from None
    try:
        check_shape(conn, path, "budget.ledger" if create else "")
    except BaseException:
        conn.close()
        raise
    return conn


# The columns each table must have (a ledger made by another program, or an older
# thresher, with tables of these names but another shape is refused naming what is
# missing; issue 30 D8: it was an internal OperationalError).
COLUMNS = {
    "datasets": ("dataset", "epsilon", "delta", "created"),
    "releases": ("id", "dataset", "name", "epsilon", "delta", "config_sha256", "state",
                 "reserved_at", "finished_at", "output", "host", "pid"),
}


def check_shape(conn, path, field):
    """SpecError naming the ledger, the table and its missing columns, unless both tables
    have (at least) the ledger's columns. A read-only ledger without the tables is a ledger
    nothing was ever recorded in."""
    with errors(path, field):
        for table, wanted in COLUMNS.items():
            if hasattr(conn, "columns_of"):
                have = conn.columns_of(table)
            else:
                have = [row[1] for row in conn.execute(f"PRAGMA table_info({table})").fetchall()]
            if not have and not field:
                continue          # ledger show on an empty file: "no dataset yet"
            missing = [c for c in wanted if c not in have]
            if missing:
                raise SpecError(field, f"the ledger {_shown(path)!r} is not a thresher ledger: "
                                f"its table {table!r} " + (
                                    f"lacks the columns {', '.join(missing)}" if have
                                    else "is missing") + f" (it has: {', '.join(have) or '-'}); "
                                "use a ledger made by thresher, or a new file/database")


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
    conn.execute("BEGIN IMMEDIATE")
    try:
        yield conn
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    conn.execute("COMMIT")


def _charged(conn, dataset):
    rows = conn.execute("SELECT epsilon, delta FROM releases WHERE dataset = ?",
                        (dataset,)).fetchall()
    return _sum(r[0] for r in rows), _sum(r[1] for r in rows)


# ---- one release -----------------------------------------------------------------------------

class Reservation:
    """A release's row in the ledger, from ``reserve`` to published or released."""

    def __init__(self, path, row_id, dataset, total, spent, new_dataset=False):
        self.path = path
        self.row_id = row_id
        self.dataset = dataset
        self.total = total           # (epsilon, delta) of the dataset, floats
        self.spent = spent           # (epsilon, delta) charged including this release
        self.new_dataset = new_dataset   # this reservation created the dataset's row
        self._publishing = False
        self._done = False

    def _connect(self):
        return _connect(self.path, create=True)

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
                    conn.execute("DELETE FROM releases WHERE id = ? AND state = ?",
                                 (self.row_id, RESERVED))
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
        """After an error: delete the reservation, or keep it charged if publishing began."""
        if self._done:
            return
        try:
            self._finish(PUBLISH_FAILED if self._publishing else None)
        except Exception as exc:  # noqa: BLE001 - the original error matters more
            log.warning("could not update the ledger %s (release %d stays %s and counts as "
                        "spent; thresher ledger reservations lists it): %s", _shown(self.path),
                        self.row_id, PUBLISHING if self._publishing else RESERVED, exc)


def reserve(plan):
    """Reserve the release's (epsilon, delta) on its dataset; SpecError naming ``budget``
    if the dataset's total would be exceeded, or ``budget.ledger`` if the ledger cannot
    be used. Returns a Reservation."""
    with errors(plan.spec.budget.ledger):
        return _reserve(plan)


def _reserve(plan):
    spec = plan.spec
    budget = spec.budget
    epsilon, delta = charge_of(plan)
    sha = hashlib.sha256(spec.source_text.encode("utf-8")).hexdigest()
    conn = _connect(budget.ledger, create=True)
    try:
        with _write_transaction(conn):
            total = (str(_dec(budget.epsilon)), str(_dec(budget.delta)), _now())
            if hasattr(conn, "lock_dataset"):
                row, new = conn.lock_dataset(budget.dataset, total)
            else:
                row = conn.execute("SELECT epsilon, delta FROM datasets WHERE dataset = ?",
                                   (budget.dataset,)).fetchone()
                new = row is None
                if new:
                    conn.execute("INSERT INTO datasets VALUES (?, ?, ?, ?)",
                                 (budget.dataset, *total))
            if new:
                log.info("ledger %s: new dataset %r with total epsilon=%g, delta=%g",
                         budget.ledger, budget.dataset, budget.epsilon, budget.delta)
            elif (decimal.Decimal(row[0]), decimal.Decimal(row[1])) != (
                    _dec(budget.epsilon), _dec(budget.delta)):
                raise SpecError("budget", f"the ledger {_shown(budget.ledger)!r} records the total "
                                f"epsilon={_num(row[0]):g}, delta={_num(row[1]):g} for dataset "
                                f"{budget.dataset!r}; the spec says epsilon={budget.epsilon:g}, "
                                f"delta={budget.delta:g} (a dataset's total cannot change)")
            spent_eps, spent_delta = _charged(conn, budget.dataset)
            total_eps, total_delta = _dec(budget.epsilon), _dec(budget.delta)
            need_eps, need_delta = spent_eps + _dec(epsilon), spent_delta + _dec(delta)
            if need_eps > total_eps or need_delta > total_delta:
                raise SpecError("budget", f"dataset {budget.dataset!r} has spent "
                                f"epsilon={float(spent_eps):g}, delta={float(spent_delta):g} of "
                                f"its total epsilon={budget.epsilon:g}, delta={budget.delta:g}; "
                                f"this release needs epsilon={epsilon:g}, delta={delta:g} more "
                                f"(ledger {_shown(budget.ledger)}); nothing was read or published")
            sql = ("INSERT INTO releases (dataset, name, epsilon, delta, config_sha256, state, "
                   "reserved_at, host, pid) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)")
            params = (budget.dataset, spec.name, str(_dec(epsilon)), str(_dec(delta)), sha,
                      RESERVED, _now(), socket.gethostname(), os.getpid())
            if hasattr(conn, "insert_release"):
                row_id = conn.insert_release(sql, params)
            else:
                row_id = conn.execute(sql, params).lastrowid
    finally:
        conn.close()
    return Reservation(budget.ledger, row_id, budget.dataset,
                       (budget.epsilon, budget.delta), (float(need_eps), float(need_delta)), new_dataset=new)


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
        out.append({"id": int(rid), "dataset": ds, "name": name, "epsilon": _num(eps),
                    "delta": _num(delta), "reserved_at": at,
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
    ``publish_failed`` row may have been seen: charged for good), and only when its owner
    is known to be gone (same host, process ended); a running owner or one on another host
    needs ``force``. Even then no release is published uncharged: a run marks its row
    ``publishing`` (in a write transaction, only if still ``reserved``) before it moves its
    output into place, and refuses to publish once its row was released. Returns the row
    as ``reservations`` lists it."""
    if not ledger_postgres.is_url(path) and not os.path.isfile(path):
        raise SpecError("", f"no ledger at {path!r} ({os.path.abspath(path)})")
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
                    raise SpecError("ID", f"release {row_id} ({name!r}, dataset {ds!r}) is "
                                    f"{state}, not reserved: it may have been seen, so its "
                                    f"budget stays spent")
                owner = owner_state(host, pid, _parse_time(at))
                if owner != "gone" and not force:
                    why = (f"its run (pid {pid} on this host) is still running" if owner ==
                           "running" else f"its run was on host {host!r} (pid {pid}), which "
                           f"thresher cannot check from here")
                    raise SpecError("--force", f"release {row_id} ({name!r}, dataset {ds!r}) is "
                                    f"reserved and {why}; pass --force once you know it has "
                                    f"ended (a run whose reservation is released refuses to "
                                    f"publish)")
                conn.execute("DELETE FROM releases WHERE id = ? AND state = ?", (row_id, RESERVED))
        finally:
            conn.close()
    return {"id": int(rid), "dataset": ds, "name": name, "epsilon": _num(eps),
            "delta": _num(delta), "reserved_at": at, "host": host, "pid": pid, "owner": owner}


def format_reservations(rows):
    if not rows:
        return "no open reservations"
    lines = [f"{'id':>5}  {'dataset':<16} {'name':<20} {'epsilon':>8} {'delta':>8}  "
             f"{'age':>8}  owner"]
    for r in rows:
        age = "-" if r["age_seconds"] is None else _age(r["age_seconds"])
        lines.append(f"{r['id']:>5}  {r['dataset']:<16} {r['name']:<20} {r['epsilon']:>8g} "
                     f"{r['delta']:>8g}  {age:>8}  {r['owner']} (pid {r['pid']} on "
                     f"{r['host']})")
    return "\n".join(lines)


def _age(seconds):
    for unit, size in (("d", 86400), ("h", 3600), ("min", 60)):
        if seconds >= size:
            return f"{seconds / size:.1f} {unit}"
    return f"{seconds} s"


# ---- thresher ledger show ------------------------------------------------------------------

def summary(path, dataset=None):
    """Every dataset of a ledger (or one): its total, what is charged, every release."""
    with errors(path, "", "read"):
        return _summary(path, dataset)


def _summary(path, dataset):
    conn = _connect(path, create=False)
    try:
        try:
            datasets = conn.execute("SELECT dataset, epsilon, delta FROM datasets "
                                    "ORDER BY dataset").fetchall()
        except _database_errors(conn) as exc:
            raise SpecError("", f"{_shown(path)!r} is not a thresher ledger: {exc}") from None
        if dataset is not None:
            datasets = [d for d in datasets if d[0] == dataset]
            if not datasets:
                raise SpecError("--dataset", f"no dataset {dataset!r} in the ledger "
                                             f"{_shown(path)!r}")
        out = []
        for name, eps, delta in datasets:
            rows = conn.execute(
                "SELECT name, epsilon, delta, config_sha256, state, reserved_at, finished_at, "
                "output, id FROM releases WHERE dataset = ? ORDER BY id", (name,)).fetchall()
            spent_eps, spent_delta = _charged(conn, name)
            out.append({
                "dataset": name,
                "budget": {"epsilon": _num(eps), "delta": _num(delta)},
                "spent": {"epsilon": float(spent_eps), "delta": float(spent_delta)},
                "releases": [{"id": r[8], "name": r[0], "epsilon": _num(r[1]), "delta": _num(r[2]),
                              "config_sha256": r[3], "state": r[4], "time": r[6] or r[5],
                              "output": r[7]} for r in rows],
            })
        return out
    finally:
        conn.close()


def _shown(ledger):
    return ledger_postgres.shown(ledger) if ledger_postgres.is_url(ledger) else ledger


def _database_errors(conn):
    if hasattr(conn, "lock_dataset"):
        return ledger_postgres.database_errors()
    return (sqlite3.DatabaseError,)


def format_summary(datasets):
    lines = []
    for d in datasets:
        b, s = d["budget"], d["spent"]
        lines.append(f"dataset {d['dataset']}: spent epsilon {s['epsilon']:g} of {b['epsilon']:g}, "
                     f"delta {s['delta']:g} of {b['delta']:g} ({len(d['releases'])} release"
                     f"{'s' if len(d['releases']) != 1 else ''}, basic composition)")
        for r in d["releases"]:
            lines.append(f"  {r['time']}  {r['state']:<14} {r['name']}  epsilon={r['epsilon']:g} "
                         f"delta={r['delta']:g}  config {r['config_sha256'][:12]}  "
                         f"{r['output'] or '-'}")
    return "\n".join(lines) if lines else "the ledger holds no dataset yet"


# ---- validate and plan: what the ledger would say, without charging it -----------------------

@dataclasses.dataclass(frozen=True)
class Preview:
    """What ``reserve`` would decide for a plan, read without writing: ``refuses`` (with
    the reason), the text for people, and ``warning`` when the ledger could not be read."""
    refuses: bool
    text: str
    warning: bool = False


def preview(plan):
    """Read the ledger (read-only; no reservation, no new dataset, no file created) and
    say what this release would leave, or why the ledger will refuse it. A ledger that
    cannot be reached is a warning (the run will try again and refuse then if it must)."""
    budget = plan.spec.budget
    epsilon, delta = charge_of(plan)
    shown = _shown(budget.ledger)
    if not ledger_postgres.is_url(budget.ledger) and not os.path.exists(budget.ledger):
        return Preview(False, f"ledger: {shown!r} does not exist yet; the first run creates it "
                              f"and charges dataset {budget.dataset!r} epsilon={epsilon:g}, "
                              f"delta={delta:g} of its total epsilon={budget.epsilon:g}, "
                              f"delta={budget.delta:g}")
    try:
        conn = _connect(budget.ledger, create=False)
        try:
            row = conn.execute("SELECT epsilon, delta FROM datasets WHERE dataset = ?",
                               (budget.dataset,)).fetchone()
            spent_eps, spent_delta = _charged(conn, budget.dataset) if row else (_sum([]), _sum([]))
        finally:
            conn.close()
    except (SpecError, OSError) as exc:
        return Preview(False, f"cannot read the ledger {shown!r} ({exc}); not checked: the run "
                              f"reads it again and refuses then if it must", warning=True)
    except Exception as exc:  # noqa: BLE001 - any database failure: a warning here
        return Preview(False, f"cannot read the ledger {shown!r} ({type(exc).__name__}: "
                              f"{str(exc).strip().splitlines()[0] if str(exc).strip() else ''}); "
                              f"not checked: the run reads it again and refuses then if it must",
                       warning=True)
    if row is not None and (decimal.Decimal(row[0]), decimal.Decimal(row[1])) != (
            _dec(budget.epsilon), _dec(budget.delta)):
        return Preview(True, f"the ledger {shown!r} records the total epsilon={_num(row[0]):g}, "
                             f"delta={_num(row[1]):g} for dataset {budget.dataset!r}; the spec "
                             f"says epsilon={budget.epsilon:g}, delta={budget.delta:g} (a "
                             f"dataset's total cannot change): the run will be refused")
    total_eps, total_delta = _dec(budget.epsilon), _dec(budget.delta)
    left_eps, left_delta = total_eps - spent_eps, total_delta - spent_delta
    if spent_eps + _dec(epsilon) > total_eps or spent_delta + _dec(delta) > total_delta:
        return Preview(True, f"dataset {budget.dataset!r} has spent epsilon={float(spent_eps):g}, "
                             f"delta={float(spent_delta):g} of its total epsilon="
                             f"{budget.epsilon:g}, delta={budget.delta:g} (left: epsilon="
                             f"{float(left_eps):g}, delta={float(left_delta):g}); this release "
                             f"needs epsilon={epsilon:g}, delta={delta:g}: the ledger {shown!r} "
                             f"will refuse it")
    return Preview(False, f"ledger: dataset {budget.dataset!r} has spent epsilon="
                          f"{float(spent_eps):g}, delta={float(spent_delta):g} of epsilon="
                          f"{budget.epsilon:g}, delta={budget.delta:g}; after this release "
                          f"epsilon={float(left_eps - _dec(epsilon)):g}, delta="
                          f"{float(left_delta - _dec(delta)):g} are left ({shown!r}; not charged)")

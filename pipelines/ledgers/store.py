"""The ledger's tables, read and written through one ``backend.Backend``: opening a
ledger (``connect``: the backend chosen from the location, the tables' shape checked),
database errors as SpecErrors naming the ledger (``errors``), and a dataset's row -- its
totals checked against each other and against the digest thresher stamped them with
(``totals_digest``), its running sums checked against the triggers' count of changes and
folded again from the releases when they do not cover them (``dataset_row``).

The lifecycle modules (``lifecycle``: reserve, publish, abandon; ``operations``: ledger
reservations / release / set-budget; ``show``) build on these; none of them knows which
database it talks to (docs/ledger.md, last paragraph).
"""
import contextlib
import dataclasses
import datetime
import decimal
import hashlib
import logging

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers.postgres_backend import PostgresBackend
from thresher.pipelines.ledgers.sqlite_backend import SQLiteBackend

log = logging.getLogger("thresher")

# The states of a release's row (pipelines.ledgers.ledger's docstring: the life of one
# release).
RESERVED, PUBLISHING, PUBLISHED, PUBLISH_FAILED = ("reserved", "publishing", "published",
                                                   "publish_failed")
RUN_FAILED = "run_failed"      # failed after it began reading its input: stays charged


def backend_for(location):
    """The ``backend.Backend`` class of a ledger location, chosen once from the location
    alone: a ``postgresql://`` URL is a server, anything else a SQLite file."""
    return PostgresBackend if PostgresBackend.claims(location) else SQLiteBackend


def shown(ledger):
    """A ledger as messages quote it (a URL without its password)."""
    return backend_for(ledger).shown(ledger)


def where(ledger):
    """A ledger as messages show it: a URL without its password, a file's absolute path."""
    return backend_for(ledger).where(ledger)


def now():
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def as_float(text):
    """A stored decimal as the float a person reads (2.0, 1e-08)."""
    return None if text is None else float(decimal.Decimal(text))


def connect(path, create):
    """The ledger at ``path``, opened through its backend: its tables checked
    (``check_shape``) and, when opened to write (``create``), created or given what an
    older thresher's ledger lacks (``Backend.migrate``). Failures are SpecErrors naming
    ``budget.ledger`` (``create``) or nothing (a read)."""
    field = "budget.ledger" if create else ""
    conn = backend_for(path).connect(path, create, field)
    try:
        check_shape(conn, path, field)
        if create:
            conn.migrate(path)
    except BaseException:
        conn.close()
        raise
    return conn


# The columns each table must have (a ledger made by another program, or an older
# thresher, with tables of these names but another shape is refused naming what is
# missing; issue 30 D8: it was an internal OperationalError). The columns added since
# (sqlite_backend.NEW_COLUMNS; the same on PostgreSQL) are given by Backend.migrate.
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
            have = conn.columns_of(table)
            if not have and not field:
                continue          # ledger show on an empty file: "no dataset yet"
            missing = [c for c in wanted if c not in have]
            if missing:
                raise SpecError(field, f"the ledger {shown(path)!r} is not a thresher ledger: "
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
    except backend_for(path).database_errors() as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        named = backend_for(path).named(path)
        hint = (" (a read-only file, folder or file system: the ledger must be writable "
                "to charge a release)" if "readonly" in first.replace("-", "") else "")
        raise SpecError(field, f"the ledger {named} cannot be {doing or 'used'}: "
                        f"{first}{hint}") from None


DATASET_COLUMNS = ("epsilon", "delta", "composition", "threshold_delta", "rho",
                   "spent_epsilon", "spent_delta", "spent_rho", "spent_delta0", "row_changes",
                   "spent_row_changes", "totals_sha256")


def select(conn, table, columns, where="", params=()):
    """SELECT ``columns`` (NULL for a column an unmigrated, read-only ledger lacks)."""
    have = set(conn.columns_of(table))
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


def stored(value, where, column, nullable=False):
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


def digest_of(totals):
    return totals_digest(totals.composition, totals.epsilon, totals.delta, totals.delta0,
                         totals.rho)


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
    epsilon = stored(eps, where, "epsilon")
    total_delta = stored(delta, where, "delta")
    zcdp = mode == comp.ZCDP
    delta0 = stored(delta0_b, where, "threshold_delta", nullable=not zcdp)
    rho = stored(rho_b, where, "rho", nullable=not zcdp)
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


def dataset_state(conn, dataset, fold=False, path=None):
    """(Totals, Spent) of a dataset's row, or None (``dataset_row``)."""
    row = dataset_row(conn, dataset, fold, path)
    return None if row is None else (row.totals, row.spent)


def dataset_row(conn, dataset, fold=False, path=None):
    """The dataset's row: its Totals, and its running sums when they cover every change of
    its releases the triggers counted; otherwise the sums folded from the releases
    (written back, stamped with the count, when ``fold``: inside a write transaction that
    holds the dataset's row). Sums that cannot be right (``_wrong_sums``) are refused when
    ``fold`` (a SpecError naming the ledger), folded for reading otherwise. Values that
    are no decimals raise BadRow; totals that disagree are ``totals_problem``."""
    row = select(conn, "datasets", DATASET_COLUMNS, " WHERE dataset = ?", (dataset,)).fetchone()
    if row is None:
        return None
    s_eps, s_delta, s_rho, s_delta0, changes, covered = row[5:11]
    totals, totals_problem = _parse_totals(row, dataset)
    changes = None if changes is None else int(changes)
    covered = None if covered is None else int(covered)
    problem = _wrong_sums(row[5:9], changes, covered)
    if problem is not None and fold:
        raise SpecError("budget.ledger", f"the ledger {shown(path or '?')!r} is inconsistent: "
                        f"dataset {dataset!r}: {problem}; nothing was read or published "
                        f"(thresher ledger show compares the sums with the releases; setting "
                        f"the dataset's spent_* columns to NULL has the next run fold them "
                        f"again from its releases)")
    if s_eps is None or changes is None or covered != changes or problem is not None:
        spent = folded(conn, dataset)
        if fold:
            if s_eps is not None:
                log.warning("ledger %s: the releases of dataset %r were changed by another "
                            "program (an older thresher, or by hand) since its running sums "
                            "were written; they are folded again from its releases",
                            shown(path or "?"), dataset)
            write_spent(conn, dataset, spent, changes)
    else:
        spent = comp.Spent(comp.dec(s_eps), comp.dec(s_delta),
                           None if s_rho is None else comp.dec(s_rho),
                           None if s_delta0 is None else comp.dec(s_delta0))
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


def folded(conn, dataset):
    """The sums over the dataset's releases (to fill running sums that are missing or do
    not cover every change, and for ``ledger show``'s check). A charge that is no
    decimal raises BadRow naming the release (a NULL record is a release charged before
    records: allowed)."""
    rows = select(conn, "releases", ("id", "epsilon", "delta", "rho", "delta0"),
                  " WHERE dataset = ?", (dataset,)).fetchall()
    checked = []
    for rid, eps, delta, rho, delta0 in rows:
        where = f"release {rid}'s"
        checked.append((stored(eps, where, "epsilon"), stored(delta, where, "delta"),
                        stored(rho, where, "rho", nullable=True),
                        stored(delta0, where, "delta0", nullable=True)))
    return comp.Spent.fold(checked)


def write_spent(conn, dataset, spent, row_changes):
    """The running sums, stamped with the triggers' count of changes they cover."""
    conn.execute("UPDATE datasets SET spent_epsilon = ?, spent_delta = ?, spent_rho = ?, "
                 "spent_delta0 = ?, spent_row_changes = ? WHERE dataset = ?",
                 (comp.text(spent.epsilon), comp.text(spent.delta), comp.text(spent.rho),
                  comp.text(spent.delta0), row_changes, dataset))


def uncharge(conn, dataset, row_id, path=None):
    """Inside a write transaction: delete a ``reserved`` release and take its charge off
    the dataset's running sums (a release without a record -- an older thresher's -- is
    folded out instead: the sums of the others are exact again). Returns whether a row
    was deleted."""
    row = select(conn, "releases", ("epsilon", "delta", "rho", "delta0"),
                 " WHERE id = ? AND state = ?", (row_id, RESERVED)).fetchone()
    if row is None:
        return False
    conn.lock_row(dataset)
    state = dataset_row(conn, dataset, fold=True, path=path)
    conn.execute("DELETE FROM releases WHERE id = ? AND state = ?", (row_id, RESERVED))
    if state is not None:
        eps, delta, rho, delta0 = row
        changes = state.row_changes + 1          # the delete, counted by the trigger
        if rho is None or delta0 is None:
            write_spent(conn, dataset, folded(conn, dataset), changes)
        else:
            write_spent(conn, dataset, state.spent.minus(comp.Charge(
                comp.dec(eps), comp.dec(delta), comp.dec(rho), comp.dec(delta0))), changes)
    return True


def loose(value):
    """A stored number for display, whatever was stored (None if it is no number)."""
    try:
        number = float(decimal.Decimal(value))
    except (decimal.InvalidOperation, TypeError, ValueError):
        return None
    return number if number == number and abs(number) != float("inf") else None


def printable(text):
    """Text from the ledger for a terminal: control characters (a dataset name with an
    escape sequence or a newline) shown escaped, as Python writes them, never raw."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)

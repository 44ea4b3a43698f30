"""The operator's ledger commands that change or list rows: ``thresher ledger
reservations`` (open reservations and whether their run is still going), ``thresher
ledger release`` (free a reservation whose run has ended) and ``thresher ledger
set-budget`` (the one way to change a dataset's totals). Through ``store`` and the
``backend.Backend`` interface only.
"""
import datetime
import math
import os
import socket

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import section, store
from thresher.pipelines.ledgers.store import RESERVED, RUN_FAILED, loose, printable


def reservations(path, dataset=None):
    """Open reservations (state ``reserved``): a run that is still going, or one killed
    outright (SIGKILL, power loss) that left its charge. Each with its owner's host and
    pid and whether that process is still running (``owner``: ``running`` / ``gone`` on
    this host, ``unknown`` on another)."""
    with store.errors(path, "", "read"):
        conn = store.connect(path, create=False)
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
        out.append({"id": int(rid), "dataset": ds, "name": name, "epsilon": loose(eps),
                    "delta": loose(delta), "reserved_at": at,
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
    missing = store.backend_for(path).missing(path)
    if missing:
        raise SpecError("", missing)
    with store.errors(path, "", "updated"):
        conn = store.connect(path, create=True)
        try:
            with conn.write_transaction():
                row = conn.execute("SELECT id, dataset, name, epsilon, delta, reserved_at, host, "
                                   "pid, state FROM releases WHERE id = ?", (row_id,)).fetchone()
                if row is None:
                    raise SpecError("ID", f"no release {row_id} in the ledger "
                                    f"{store.shown(path)!r}")
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
                store.uncharge(conn, ds, row_id, path)
        finally:
            conn.close()
    return {"id": int(rid), "dataset": ds, "name": name, "epsilon": loose(eps),
            "delta": loose(delta), "reserved_at": at, "host": host, "pid": pid, "owner": owner}


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


def set_budget(path, dataset, epsilon, delta=None, threshold_delta=None, force=False):
    """``thresher ledger set-budget``: change a dataset's totals, the one way to do it.

    In one write transaction: the new totals (``delta`` and, zcdp, ``threshold_delta``
    kept when not given) are checked like a spec's budget section, rho_B is computed
    again from them (zcdp), what the dataset has spent is folded from its releases, and
    a total below it is refused unless ``force`` (the dataset then admits nothing until
    the total is raised again). The totals are stamped with their digest
    (``store.totals_digest``) and the change is recorded in ``budget_changes``. A dataset
    whose totals were edited by hand is repaired this way. Returns (old, new) as dicts."""
    missing = store.backend_for(path).missing(path)
    if missing:
        raise SpecError("LEDGER", missing)
    with store.errors(path, "LEDGER", "updated"):
        conn = store.connect(path, create=True)
        try:
            with conn.write_transaction():
                conn.lock_row(dataset)
                row = store.select(conn, "datasets", store.DATASET_COLUMNS, " WHERE dataset = ?",
                              (dataset,)).fetchone()
                if row is None:
                    raise SpecError("DATASET", f"no dataset {printable(dataset)!r} in the "
                                    f"ledger {store.shown(path)!r} (a dataset is created by its "
                                    f"first release)")
                old_text = [None if v is None else str(v) for v in row[:5]]
                mode = row[2] or comp.BASIC
                if mode not in comp.MODES:
                    raise store.BadRow(f"dataset {dataset!r}'s", "composition", mode,
                                 f"one of {', '.join(comp.MODES)}")
                new = _new_totals(mode, row, dataset, epsilon, delta, threshold_delta)
                spent = store.folded(conn, dataset)
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
                              comp.text(new.delta0), comp.text(new.rho), store.digest_of(new),
                              dataset))
                store.write_spent(conn, dataset, spent, changes)
                conn.execute("INSERT INTO budget_changes (dataset, changed_at, old_epsilon, "
                             "old_delta, old_threshold_delta, old_rho, epsilon, delta, "
                             "threshold_delta, rho, spent, forced, host, pid) VALUES (?, ?, ?, "
                             "?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                             (dataset, store.now(), old_text[0], old_text[1], old_text[3],
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
        delta = float(store.stored(row[1], where, "delta"))
    if mode == comp.ZCDP and threshold_delta is None:
        threshold_delta = float(store.stored(row[3], where, "threshold_delta"))
    if not (math.isfinite(epsilon) and epsilon > 0):
        raise SpecError("--epsilon", f"must be a finite number > 0, got {epsilon!r}")
    if not (0 <= delta < 1) or (mode == comp.ZCDP and delta <= 0):
        raise SpecError("--delta", f"must be in {'(0, 1)' if mode == comp.ZCDP else '[0, 1)'}"
                        f", got {delta!r}")
    if mode == comp.BASIC and threshold_delta is not None:
        raise SpecError("--threshold-delta", "applies to zcdp datasets only")
    budget = section.BudgetSpec("", dataset, float(epsilon), float(delta), mode,
                        None if threshold_delta is None else float(threshold_delta))
    try:
        return section.budget_totals(budget, names=("--epsilon", "--delta", "--threshold-delta"))
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

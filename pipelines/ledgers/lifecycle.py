"""The life of one release in the ledger: its charge (``full_charge``), ``reserve``
before any input is read, ``Reservation.publishing`` before its output is moved into
place, ``commit`` after, ``abandon`` on an error (the reservation deleted, or kept
charged once the run began reading: ``run_failed`` / ``publish_failed``), and
``preview`` -- what ``reserve`` would decide, read without writing (validate, plan).

Everything here goes through ``store`` and the ``backend.Backend`` interface it opens;
the steps and their guarantees are told in ``pipelines.ledgers.ledger``'s docstring.
"""
import contextlib
import dataclasses
import hashlib
import logging
import os
import socket

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import store
from thresher.pipelines.ledgers.store import (PUBLISH_FAILED, PUBLISHED, PUBLISHING, RESERVED,
                                               RUN_FAILED, TOTALS_HELP)

log = logging.getLogger("thresher")


def charge_of(plan):
    """(epsilon, delta) the release spends: privacy.epsilon, and privacy.delta unless the
    stages spend no delta at all (Laplace over public keys is (epsilon, 0)-DP)."""
    budget = plan.budget
    return budget.epsilon, (budget.delta if budget.spent_delta > 0 else 0.0)


def full_charge(plan):
    """The release's ``composition.Charge``: (epsilon, delta) and its record (rho, delta0),
    both charged in either mode's columns."""
    epsilon, delta = charge_of(plan)
    # records asks the kinds, which import the spec, which imports this package: late
    from thresher.pipelines.ledgers.records import privacy_record  # heavy: numpy
    rho, delta0 = privacy_record(plan)
    return comp.Charge(comp.dec(epsilon), comp.dec(delta), rho, delta0)


def config_sha256(spec):
    return hashlib.sha256(spec.source_text.encode("utf-8")).hexdigest()


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
        return store.connect(self.path, create=True)

    def say_new_dataset(self):
        """Once this first release stays charged (published, or failed after reading):
        the dataset exists for good, so say where (the ledger's absolute path: a relative
        budget.ledger resolves from the spec's folder). A first release abandoned before
        reading leaves no dataset and says nothing (issue 42)."""
        if self.new_dataset:
            total = self.total
            log.info("ledger %s: new dataset %r (%s composition) with total epsilon=%s, "
                     "delta=%s", store.where(self.path), self.dataset, total.composition,
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
            with store.errors(self.path, "budget.ledger", "updated"):
                conn = self._connect()
                try:
                    with conn.write_transaction():
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
                            f"the ledger {store.shown(self.path)!r} (released by an operator: "
                            f"thresher ledger release); nothing was published")
        self._publishing = True

    def _finish(self, state, output=None):
        conn = self._connect()
        try:
            with conn.write_transaction():
                if state is None:
                    store.uncharge(conn, self.dataset, self.row_id, self.path)
                    if self.new_dataset:
                        # A dataset's total is fixed by its first charged release: a first
                        # release abandoned before publishing leaves no dataset behind.
                        conn.execute("DELETE FROM datasets WHERE dataset = ? AND NOT EXISTS "
                                     "(SELECT 1 FROM releases WHERE dataset = ?)",
                                     (self.dataset, self.dataset))
                else:
                    conn.execute("UPDATE releases SET state = ?, finished_at = ?, output = ? "
                                 "WHERE id = ?", (state, store.now(), output, self.row_id))
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
            with store.errors(self.path):
                self._finish(PUBLISHED, output)
        except SpecError as exc:
            self._done = True
            log.warning("WARNING: the release is published at %s, but the ledger could not "
                        "mark it published (%s). Its row %d stays '%s' and counts as spent, "
                        "so the budget is safe; repair or restore the ledger, then check it "
                        "with: thresher ledger show %s", output, exc.message, self.row_id,
                        PUBLISHING if self._publishing else RESERVED, store.shown(self.path))

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
                        "spent; thresher ledger reservations lists it): %s",
                        store.shown(self.path),
                        self.row_id, PUBLISHING if self._publishing else RESERVED, exc)
            return
        if state == RUN_FAILED:
            log.warning("the run failed after it began reading its input: its charge stays "
                        "spent (release %d is %s in the ledger %s; a failure after reading "
                        "may depend on the data)", self.row_id, RUN_FAILED, store.shown(self.path))


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


def reserve_charge(budget, name, sha, charge, run_token=None, output=None):
    """``reserve`` of a charge computed beforehand (``full_charge``): what a pipeline's
    worker calls with the values the pipeline was built with."""
    with store.errors(budget.ledger):
        return _reserve(budget, name, sha, charge, run_token, output)


def _reserve(budget, name, sha, charge, run_token=None, output=None):
    wanted = comp.Totals.of_spec(budget)
    conn = store.connect(budget.ledger, create=True)
    try:
        with conn.write_transaction():
            if run_token is not None:
                row = conn.execute("SELECT id, dataset, config_sha256, epsilon, delta, rho, "
                                   "delta0 FROM releases WHERE run_token = ?",
                                   (run_token,)).fetchone()
                if row is not None:      # this run was charged already (a retried reserve)
                    _check_token_row(row, budget, sha, charge)
                    state = store.dataset_state(conn, budget.dataset)
                    reservation = Reservation(budget.ledger, int(row[0]), budget.dataset,
                                              state[0], state[1])
                    reservation.charged = False
                    reservation._done = True
                    return reservation
            created = store.now()
            fresh = (budget.dataset, comp.text(wanted.epsilon), comp.text(wanted.delta), created,
                     wanted.composition, comp.text(wanted.delta0), comp.text(wanted.rho),
                     "0", "0", "0", "0", 0, 0, store.digest_of(wanted))
            new = conn.lock_dataset(budget.dataset, fresh)
            dataset_row = store.dataset_row(conn, budget.dataset, fold=True, path=budget.ledger)
            totals, spent = dataset_row.totals, dataset_row.spent
            if dataset_row.totals_problem is not None:
                raise SpecError("budget.ledger", f"the ledger {store.shown(budget.ledger)!r} is "
                                f"inconsistent: dataset {budget.dataset!r}: "
                                f"{dataset_row.totals_problem}; no release is admitted on it "
                                f"until its totals are set again ({TOTALS_HELP}); nothing was "
                                f"read or published")
            if dataset_row.digest is None:
                # A dataset written before totals were stamped: stamped now, as they are.
                conn.execute("UPDATE datasets SET totals_sha256 = ? WHERE dataset = ?",
                             (store.digest_of(totals), budget.dataset))
            _check_fixed(budget, totals, wanted)
            if totals.composition == comp.ZCDP and (spent.rho is None or spent.delta0 is None):
                raise SpecError("budget.ledger", f"the ledger {store.shown(budget.ledger)!r} is "
                                f"inconsistent: zcdp dataset {budget.dataset!r} holds a release "
                                f"without a (rho, delta0) record (charged by an older "
                                f"thresher?), so its spent rho is unknown; nothing was read or "
                                f"published")
            if not comp.admits(totals, spent, charge):
                refusal = comp.refusal_text(budget.dataset, totals, spent, charge)
                raise SpecError("budget", f"{refusal} (ledger {store.shown(budget.ledger)}); "
                                f"nothing was read or published")
            earlier = 0
            if run_token is not None:      # earlier runs of this release (Beam: run twice)
                earlier = int(conn.execute(
                    "SELECT COUNT(*) FROM releases WHERE dataset = ? AND config_sha256 = ? AND "
                    "run_token IS NOT NULL", (budget.dataset, sha)).fetchone()[0])
            state = RESERVED if run_token is None else PUBLISHED
            sql = ("INSERT INTO releases (dataset, name, epsilon, delta, config_sha256, state, "
                   "reserved_at, host, pid, rho, delta0, run_token, finished_at, output) "
                   "VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
            now = store.now()
            params = (budget.dataset, name, comp.text(charge.epsilon), comp.text(charge.delta),
                      sha, state, now, socket.gethostname(), os.getpid(), comp.text(charge.rho),
                      comp.text(charge.delta0), run_token,
                      None if run_token is None else now, output)
            row_id = conn.insert_release(sql, params)
            spent = spent.plus(charge)
            # stamped with the count of changes including this insert (its trigger counts it)
            store.write_spent(conn, budget.dataset, spent, dataset_row.row_changes + 1)
    finally:
        conn.close()
    reservation = Reservation(budget.ledger, row_id, budget.dataset, totals, spent,
                              new_dataset=new)
    reservation.earlier = earlier
    if run_token is not None:
        reservation._done = True
        reservation.say_new_dataset()
    return reservation


def _check_token_row(row, budget, sha, charge):
    """A run token found in the ledger is this run's own charge only if it was charged to
    the same dataset, by the same spec (its digest), at the same charge: a token charged
    for another release (a secret reused across specs) is refused, never taken as paid
    (issue 42: the ledger trusted the token alone)."""
    rid, dataset, stored_sha, eps, delta, rho, delta0 = row
    where = f"release {rid}'s"
    stored = (store.stored(eps, where, "epsilon"), store.stored(delta, where, "delta"),
              store.stored(rho, where, "rho", nullable=True),
              store.stored(delta0, where, "delta0", nullable=True))
    differs = [what for what, same in (
        ("dataset", dataset == budget.dataset), ("spec (config_sha256)", stored_sha == sha),
        ("charge", stored == (charge.epsilon, charge.delta, charge.rho, charge.delta0)))
        if not same]
    if differs:
        raise SpecError("budget.ledger", f"this run's token is already charged in the ledger "
                        f"{store.shown(budget.ledger)!r} as release {rid}, for another "
                        f"{' and '.join(differs)} (release {rid}: dataset {dataset!r}, spec "
                        f"{stored_sha[:12]}; this run: dataset {budget.dataset!r}, spec "
                        f"{sha[:12]}): a run token belongs to one release, so this run is "
                        f"refused and nothing is published (was one secret reused for two "
                        f"releases?)")


def _check_fixed(budget, totals, wanted):
    """A dataset's total, composition mode and delta0_B are fixed by its first release."""
    shown = store.shown(budget.ledger)
    if (totals.epsilon, totals.delta) != (wanted.epsilon, wanted.delta):
        raise SpecError("budget", f"the ledger {shown!r} records the total epsilon="
                        f"{float(totals.epsilon):g}, delta={float(totals.delta):g} for dataset "
                        f"{budget.dataset!r}; the spec says epsilon={budget.epsilon:g}, "
                        f"delta={budget.delta:g} (a dataset's total cannot change by editing the "
                        f"spec: change "
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
    shown = store.shown(budget.ledger)
    cost = f"this release costs {comp.cost_text(charge)}"
    if store.backend_for(budget.ledger).nothing_there(budget.ledger):
        state = None
    else:
        try:
            conn = store.connect(budget.ledger, create=False)
            try:
                row = store.dataset_row(conn, budget.dataset)
            finally:
                conn.close()
            state = None if row is None else (row.totals, row.spent)
            if row is not None and row.totals_problem is not None:
                return Preview(True, f"the ledger {shown!r} is inconsistent: dataset "
                                     f"{budget.dataset!r}: {row.totals_problem} ({TOTALS_HELP})"
                                     f": the run will be refused", field="budget.ledger")
        except store.BadRow as exc:
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
    left = comp.remaining_text(totals, spent, charge)
    return Preview(False, f"{where}; {cost}; after it {left} "
                          f"remain ({shown!r}; not charged)")

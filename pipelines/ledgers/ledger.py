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
refuse the reservation (review F1; ``store.dataset_row``).

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
Or it is a PostgreSQL database, given as a ``postgresql://`` URL (the same tables; the
dataset's row is locked ``FOR UPDATE`` where SQLite takes its write lock), shared by runs
on several machines.

The code: one interface to a database (``backend.Backend``), implemented by
``sqlite_backend`` and ``postgres_backend`` and chosen once from the ledger's location
(``store.backend_for``); the lifecycle above it knows no database -- ``store`` (opening,
errors, a dataset's row and running sums), ``lifecycle`` (the charge, reserve, publish,
abandon, preview), ``operations`` (reservations, release, set-budget), ``show`` (ledger
show) -- and ``section`` (the spec's budget section). This module is their front: the
names the rest of thresher calls.

A release built into a user's Beam pipeline (``pipelines.beam_yaml``, ``thresher.Release``)
reserves when the pipeline *runs*, under a run token derived from the run's secret:
``reserve(plan, run_token=...)`` charges a token once, so a retried reservation of the
same run charges nothing more, and a second run of the same pipeline object (a new
secret, a new token) is a second release, charged again. A token found in the ledger is
taken as this run's own charge only if it was charged to the same dataset, by the same
spec digest, at the same charge (``lifecycle._check_token_row``); otherwise the run is refused.
"""
from thresher.pipelines.ledgers import composition as comp  # noqa: F401
from thresher.pipelines.ledgers.lifecycle import (  # noqa: F401 (the ledger's front)
    Preview, Reservation, _check_fixed, _check_token_row, charge_of, config_sha256,
    full_charge, preview, reservation_for, reserve, reserve_charge)
from thresher.pipelines.ledgers.operations import (  # noqa: F401
    format_reservations, owner_state, release_reservation, reservations, set_budget)
from thresher.pipelines.ledgers.section import (  # noqa: F401
    FIELDS, REQUIRED, BudgetSpec, budget_totals, inside_output, parse_section, resolved_from)
from thresher.pipelines.ledgers.show import (  # noqa: F401
    after_run_line, format_summary, summary)
from thresher.pipelines.ledgers.store import (  # noqa: F401
    COLUMNS, PUBLISH_FAILED, PUBLISHED, PUBLISHING, RESERVED, RUN_FAILED, TOTALS_HELP, BadRow,
    backend_for, check_shape, errors, printable, totals_digest)
from thresher.pipelines.ledgers.store import connect as _connect  # noqa: F401
from thresher.pipelines.ledgers.store import shown as _shown  # noqa: F401
from thresher.pipelines.ledgers.store import where as _where  # noqa: F401
from thresher.pipelines.ledgers.sums import NO_RECORD  # noqa: F401
from thresher.pipelines.errors import SpecError  # noqa: F401 (ledger.SpecError in tests)

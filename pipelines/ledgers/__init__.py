"""The privacy-budget ledger (SQLite and PostgreSQL): the ``budget`` section, reservations,
the composition modes and each release's zCDP record.

Imports: ``pipelines.errors``, ``pipelines.specs.declare``, ``pipelines.running.progress``
and ``pipelines.kinds`` (``records`` asks the kind for its ``privacy_record``) -- never
the spec loader, the plan or the release wiring (they call the ledger).
"""

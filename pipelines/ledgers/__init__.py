"""The privacy-budget ledger (SQLite and PostgreSQL): the ``budget`` section, reservations,
the composition modes and each release's zCDP record.

One interface to a database (``backend``: ``sqlite_backend``, ``postgres_backend``) under
a lifecycle that knows no database (``store``, ``lifecycle``, ``operations``, ``show``);
``section`` parses the spec's budget section, ``composition`` and ``records`` are the
accounting, ``pipeline_charge`` charges a release built into a Beam pipeline, and
``ledger`` is the front the rest of thresher imports.

Imports (layer 3 of tests/pipelines/test_import_graph.py's order): the floor, I/O and
``pipelines.kinds`` (``records`` asks the kind for its ``privacy_record``) -- never the
spec loader, the plan or the release wiring (they call the ledger).
"""

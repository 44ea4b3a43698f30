"""The release spec: its YAML reading, JSON Schema, field declarations and checks, and the
``aggregates`` section (its parse, its calibration beside the kind's, its stages).

Imports: ``pipelines.errors``, ``pipelines.dataio`` (formats, paths, public keys),
``pipelines.kinds`` (the spec asks each kind object; kinds import only ``declare`` and
``fields`` from here) and ``pipelines.ledgers.ledger`` (the ``budget`` section) -- never
the plan, the release wiring or the reports. ``declare`` (with ``fields`` and
``schema_check``) and ``columns`` import only ``pipelines.errors``: kinds and I/O use them.
"""

"""The release spec: its YAML reading, JSON Schema and checks, the ``aggregates`` section (its
parse, its calibration beside the kind's, its stages) and the ``continual`` section
(``continual_section``: its fields and checks, no numerics). The field declarations they
are written with live in the floor, ``pipelines.common``.

Imports (layer 4 of tests/pipelines/test_import_graph.py's order): the floor
(``pipelines.errors``, ``pipelines.common``), ``pipelines.dataio`` (formats, paths, public
keys), ``pipelines.kinds`` (the spec asks each kind object) and ``pipelines.ledgers`` (the
``budget`` section) -- never the plan, the reports, the release wiring or the entry points.
"""

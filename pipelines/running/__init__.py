"""Running a release on Beam: the wiring of a release pipeline (``release``: read, bound,
count, the kind's release, publish), runner flags and options, process settings and signals
(the progress lines are in the floor, ``pipelines.common.progress``).

Imports (layer 7 of tests/pipelines/test_import_graph.py's order): every layer below --
the floor, I/O, the kinds, the ledger, the spec and the plan (``release`` wires them
together) -- never the continual release or the entry points.
"""

"""Reports people read: the run summary, the plan as text, and the HTML page (the citations they
carry are in the floor, ``pipelines.common.citations``).

Imports (layer 6 of tests/pipelines/test_import_graph.py's order): the floor, the kinds,
the spec and the plan (and anything below them) -- never the release wiring
(``pipelines.running``) or the entry points: a report is drawn from the plan and the
published files' contents.
"""

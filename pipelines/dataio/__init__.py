"""Input and publishing: reading records, formats, paths, public key domains, staging, the
published file and the exclusive output claim.

Imports (layer 1 of tests/pipelines/test_import_graph.py's order): the floor only
(``pipelines.errors``; ``pipelines.common``: field checks, the public-key file limits, the
read counters) -- never the kinds, the spec loader, the plan, the ledger or the release
wiring, which all read through here. Beam only inside the readers and writers.
"""

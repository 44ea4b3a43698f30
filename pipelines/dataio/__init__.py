"""Input and publishing: reading records, formats, paths, public key domains, staging, the
published file and the exclusive output claim.

Imports: ``pipelines.errors``, ``pipelines.specs.declare`` / ``fields`` (field checks),
``pipelines.planning.limits`` (the public-key file limits) and ``pipelines.running.progress``
(the read counters) -- never the spec loader, the kinds, the plan, the ledger or the
release wiring, which all read through here. Beam only inside the readers and writers.
"""

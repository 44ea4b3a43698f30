"""Reports people read: the run summary, the plan as text, the HTML page and the citations
they carry.

Imports: ``pipelines.errors``, ``pipelines.kinds``, ``pipelines.specs`` and
``pipelines.planning`` -- never the release wiring (``pipelines.running``), the ledger or
I/O: a report is drawn from the plan and the published files' contents.
"""

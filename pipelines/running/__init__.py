"""Running a release on Beam: the wiring of a release pipeline (``release``: read, bound,
count, the kind's release, publish), runner flags and options, process settings, signals
and progress lines.

Imports: ``release`` imports the spec, the kinds, I/O, the ledger and the plan's
calibration cache (every subpackage but ``reports`` and the entry points); the other
modules here import only ``pipelines.errors``, ``pipelines.planning.calibration_cache``
and each other (``progress`` only ``errors``: I/O and the ledger use it).
"""

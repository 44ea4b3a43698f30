"""Continual release (``continual: {horizon: T}``): per-key distinct-user counts published
every period of a horizon, charged once (docs/continual.md).

- ``state``: the horizon's state beside the ledger (secret, per-user contributions,
  released keys), verified by digest before use;
- ``period``: one period's computation (bounding across periods, tree, selection,
  intervals), vectorised over pyarrow/numpy;
- ``command``: ``thresher run SPEC --period P`` and ``thresher plan`` for such a spec.

Imports (layer 8 of tests/pipelines/test_import_graph.py's order): any layer below --
the spec, I/O (input files, record preparation), the ledger (the one charge) -- never the
entry points; the spec's ``continual`` section lives in ``pipelines.specs.continual_section``.
"""

"""Continual release (``continual: {horizon: T}``): per-key distinct-user counts published
every period of a horizon, charged once (docs/continual.md).

- ``section``: the spec's ``continual`` section (schema fields and checks; no numerics);
- ``state``: the horizon's state beside the ledger (secret, per-user contributions,
  released keys), verified by digest before use;
- ``period``: one period's computation (bounding across periods, tree, selection,
  intervals), vectorised over pyarrow/numpy;
- ``command``: ``thresher run SPEC --period P`` and ``thresher plan`` for such a spec.

Imports: ``pipelines.errors``, ``pipelines.specs.declare`` (the section's fields),
``pipelines.dataio`` (input files, record preparation) and ``pipelines.ledgers`` (the one
charge); the spec loader imports ``section`` only, the CLI ``command``.
"""

"""The floor of pipelines/: small modules every layer above may use, beside
``pipelines.errors``.

- ``fields``, ``declare`` and ``schema_check``: declaring a spec section's fields, checking
  a value against its declaration, and the JSON Schema answer without jsonschema;
- ``limits``: the planning limits (a spec whose calibration would not finish in seconds and
  bounded memory is refused naming the field, before anything is allocated);
- ``calibration_cache``: calibrations kept between ``thresher`` commands, each re-verified
  by the kind's forward check before use;
- ``progress``: the progress lines and read counters of a running command;
- ``citations``: the papers a plan and a report cite, by authors and title.

Imports: ``pipelines.errors``, each other, ``accounting`` and Beam-free constants of
``transforms`` -- nothing else of ``pipelines`` (layer 0 of the order in
tests/pipelines/test_import_graph.py; docs/development.md draws it).
"""

"""Planning a release from its spec alone, before any data is read.

- ``plan``: split the budget into stages and calibrate the kind for every candidate bound
  (``make_plan``; ``thresher plan`` prints it, ``thresher run`` executes it);
- ``preflight``: checks of the output location before a run starts.

The planning limits and the calibration cache are in the floor (``pipelines.common``): the
kinds and I/O use them too.

Imports (layer 5 of tests/pipelines/test_import_graph.py's order): the floor, I/O (public
keys, intervals), the kinds, the ledger (the zCDP record) and the spec -- never Beam,
the reports, ``pipelines.running`` or the entry points (cli, api, beam_yaml).
"""

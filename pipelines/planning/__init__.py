"""Planning a release from its spec alone, before any data is read.

- ``plan``: split the budget into stages and calibrate the kind for every candidate bound
  (``make_plan``; ``thresher plan`` prints it, ``thresher run`` executes it);
- ``limits``: the planning limits -- a spec whose calibration would not finish in seconds
  and bounded memory is refused naming the field, before anything is allocated;
- ``calibration_cache``: calibrations kept between commands, each re-verified by the kind's
  forward check before use;
- ``preflight``: checks of the output location before a run starts.

Imports: ``limits``, ``calibration_cache`` and ``preflight`` import only
``pipelines.errors``, each other, ``accounting`` and Beam-free constants of ``transforms``
(so the kinds and I/O may use them);
``plan`` also imports ``pipelines.specs``, ``pipelines.kinds``, ``pipelines.dataio``
(public keys, intervals), ``pipelines.reports`` (citations) and ``pipelines.ledgers`` (the
zCDP record). Nothing here imports Beam, ``pipelines.running`` or the entry points (cli,
api, beam_yaml).
"""

"""Release specs, the thresher CLI, I/O and the wiring of a release pipeline.

Its subpackages are layers, bottom first; a module imports (at its top or inside a
function) only modules of its own layer or a lower one (tests/pipelines/test_import_graph.py
states the order and checks every import; docs/development.md draws it):

0. the floor: ``errors`` (ThresherError and its kinds, importing nothing of thresher) and
   ``common`` (field declarations, planning limits, the calibration cache, progress lines,
   citations);
1. ``dataio`` -- reading and publishing;
2. ``kinds`` -- one object per mechanism kind (``kinds.base.Kind``);
3. ``ledgers`` -- the privacy budget;
4. ``specs`` -- the spec, its schema and its sections;
5. ``planning`` -- the plan;
6. ``reports`` -- the summary, the plan as text, the HTML page;
7. ``running`` -- the release pipeline and running it on Beam;
8. ``continual`` -- continual release over a horizon;
9. the entry points: ``cli`` (the ``thresher`` command), ``api`` (``thresher.Release``,
   ``thresher.plan``), ``beam_yaml`` (the Beam YAML provider: its dotted path is what
   users' YAML names).
"""

__version__ = "0.1.0"

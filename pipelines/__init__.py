"""Release specs, the thresher CLI, I/O and the wiring of a release pipeline.

At the top, the entry points and the errors they report:

- ``cli`` (the ``thresher`` command), ``api`` (``thresher.Release``, ``thresher.plan``),
  ``beam_yaml`` (the Beam YAML provider: its dotted path is what users' YAML names);
- ``errors``: ThresherError and its kinds (SpecError, InputError, CalibrationError), imported
  by everything below and importing nothing of thresher.

Below them, by concern (each package's docstring says what it may import;
tests/pipelines/test_import_graph.py checks it): ``specs`` (the spec and its schema),
``kinds`` (one object per mechanism kind, ``kinds.base.Kind``), ``planning`` (the plan,
its limits and cache), ``dataio`` (reading and publishing), ``ledgers`` (the privacy
budget), ``running`` (the release pipeline and running it on Beam), ``reports``. Nothing
below the entry points imports them.
"""

__version__ = "0.1.0"

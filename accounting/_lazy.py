"""``scipy.special`` (and ``scipy.stats``, ``scipy.sparse``) imported on first use, not when an accounting module is imported.

Importing ``scipy.special`` costs 0.15-0.5 s here (SciPy 1.17 clones the numpy namespace
for its array-API layer, which loads ``numpy.f2py`` and ``numpy.testing``), more than the
whole rest of a small release beyond Beam's own import. A release whose calibration is
already known (``pipelines.common.calibration_cache``) or that never calls these functions
(fixed parameters of some kinds) then never pays it. The functions are SciPy's own:
the same values, looked up once and kept on this object.
"""
import importlib


class LazyModule:
    """Attribute access imports the module once and keeps each looked-up attribute."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, attr):
        if attr.startswith("__"):
            raise AttributeError(attr)
        value = getattr(importlib.import_module(self._name), attr)
        setattr(self, attr, value)        # later look-ups skip __getattr__
        return value


special = LazyModule("scipy.special")
# scipy.stats costs 0.7-1.4 s to import here and scipy.sparse 0.2-0.4 s: planning a
# weighted_sampling release needs them (accounting.pws, accounting.known_domain), listing
# the kinds' fields (thresher schema, validate) does not.
stats = LazyModule("scipy.stats")
sparse = LazyModule("scipy.sparse")

"""One module per release mechanism kind (``mechanism.kind``).

A kind is a module here whose name does not start with ``_`` (found at import; nothing
else lists kinds). It declares its own fields; nothing else in thresher lists them:

- ``FIELDS``: {field name: declaration}. A declaration is a JSON Schema fragment built
  with ``pipelines.declare`` (``declare.number(low=0, low_open=True, description=...)``),
  checked by jsonschema before ``parse`` runs, or a description string alone (any value
  is then accepted and ``parse`` must check it, with ``pipelines.fields``).
- ``REQUIRED`` (optional): field names that must be given.
- ``KEYS_OPTIONAL`` (optional, default False): ``input.keys`` may be left out.
- ``OUTPUT_COLUMNS``, ``parse(section)`` (cross-field rules of the section; returns the
  parsed fields), ``calibrate(...)``, ``release(...)`` (or ``release_stages``), and
  optionally ``check_spec(mechanism, input_spec, bounding, privacy)``.

Kind modules import from ``pipelines.declare``, ``pipelines.fields``, ``pipelines.errors``,
``pipelines.public_keys``, ``accounting`` and ``transforms`` -- never ``pipelines.spec`` (which
loads them by name through :func:`module`).
"""
import importlib
import pkgutil

# The order kinds are listed in messages and the schema; a kind module not named here (a
# new one) is found in this package and listed after these, by name.
_ORDER = ("gaussian", "laplace", "sample_and_threshold", "weighted_sampling", "heavy_hitters",
          "quantiles", "weighted_gaussian", "adaptive")


def _discover():
    found = sorted(m.name for m in pkgutil.iter_modules(__path__)
                   if not m.ispkg and not m.name.startswith("_"))
    return tuple(k for k in _ORDER if k in found) + tuple(k for k in found if k not in _ORDER)


KINDS = _discover()


def module(kind):
    """The module of one kind (imported on first use: only the chosen kind is loaded)."""
    if kind not in KINDS:
        raise KeyError(kind)
    return importlib.import_module(f"{__name__}.{kind}")

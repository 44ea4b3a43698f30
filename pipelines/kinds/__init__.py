"""One module per release mechanism kind (``mechanism.kind``); see docs/spec.md.

A kind module declares its own fields; nothing else in thresher lists them:

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

KINDS = ("gaussian", "laplace", "sample_and_threshold", "weighted_sampling", "heavy_hitters",
         "quantiles")


def module(kind):
    """The module of one kind (imported on first use: only the chosen kind is loaded)."""
    if kind not in KINDS:
        raise KeyError(kind)
    return importlib.import_module(f"{__name__}.{kind}")

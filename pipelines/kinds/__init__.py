"""The release mechanism kinds (``mechanism.kind``): one module per kind, each defining
one kind object.

The interface is ``pipelines.kinds.base.Kind`` (every hook, its default and its docstring
in one place); :func:`get` returns a kind's object and the spec loader, the schema, the
plan, the ledger and the release wiring ask it, never the module.

**Adding a kind** is adding one module here, ``pipelines/kinds/<name>.py`` (its name is the
kind's name; found at import, nothing else lists kinds), plus the transforms it releases
with. The module:

- declares its fields (``FIELDS``: {name: declaration}, built with
  ``pipelines.specs.declare``) and its ``OUTPUT_COLUMNS``;
- ends with its kind object, ``KIND = MyKind()``, where ``MyKind`` subclasses the release
  shape it uses -- ``base.CountsKind`` (released from bounded per-key counts: implement
  ``release``), ``base.UsersKind`` (from whole users: ``release_users``) or
  ``base.StagesKind`` (its own stages: ``release_stages``) -- implements ``parse`` and
  ``calibrate``, sets ``name``, and overrides only the hooks it needs (``check_spec``,
  ``stage_budget``, ``verify_calibration``, ``privacy_record``, ``noise``...).

A kind option (a noise variant of an existing kind, e.g. gaussian's ``mechanism.noise``)
is a field of that kind, listed in its ``NOISES``, calibrated by its ``calibrate`` and
charged by its ``privacy_record``: nothing outside the kind's module changes.
tests/kinds/test_kind_interface.py checks every kind against the interface.

Modules whose names start with ``_`` (and ``base``) are shared parts of kinds, not kinds.
Imports: kind modules import ``pipelines.specs.declare``, ``pipelines.specs.fields``,
``pipelines.errors``, ``pipelines.dataio.public_keys``, ``pipelines.planning.limits`` and
``calibration_cache``, ``accounting`` and (inside functions: Beam) ``transforms`` -- never
``pipelines.specs.spec`` (which loads them by name through :func:`get`), the plan or the
release wiring.
"""
import importlib
import pkgutil

# The order kinds are listed in messages and the schema; a kind module not named here (a
# new one) is found in this package and listed after these, by name.
_ORDER = ("gaussian", "laplace", "sample_and_threshold", "weighted_sampling", "heavy_hitters",
          "quantiles", "weighted_gaussian", "adaptive")
_NOT_KINDS = ("base",)


def _discover():
    found = sorted(m.name for m in pkgutil.iter_modules(__path__)
                   if not m.ispkg and not m.name.startswith("_") and m.name not in _NOT_KINDS)
    return tuple(k for k in _ORDER if k in found) + tuple(k for k in found if k not in _ORDER)


KINDS = _discover()


def module(kind):
    """The module of one kind (imported on first use: only the chosen kind is loaded)."""
    if kind not in KINDS:
        raise KeyError(kind)
    return importlib.import_module(f"{__name__}.{kind}")


def get(kind):
    """The kind object of ``mechanism.kind`` ``kind`` (``base.Kind``); KeyError for an
    unknown kind, TypeError for a module that does not define its kind object."""
    from thresher.pipelines.kinds.base import Kind
    found = module(kind).__dict__.get("KIND")
    if not isinstance(found, Kind) or found.name != kind:
        raise TypeError(f"pipelines/kinds/{kind}.py must end with its kind object, "
                        f"KIND = <a pipelines.kinds.base.Kind subclass>() whose name is "
                        f"{kind!r} (docs: pipelines/kinds/__init__.py)")
    return found

"""The release mechanism kinds (``mechanism.kind``): one module per kind, each defining
one kind object.

The interface is ``pipelines.kinds.base.Kind`` (every hook, its default and its docstring
in one place); :func:`get` returns a kind's object and the spec loader, the schema, the
plan, the ledger and the release wiring ask it, never the module.

**Adding a kind** is adding one module here, ``pipelines/kinds/<name>.py`` (its name is the
kind's name; found at import, nothing else lists kinds), plus the transforms it releases
with. The module:

- declares its fields (``FIELDS``: {name: declaration}, built with
  ``pipelines.common.declare``) and its ``OUTPUT_COLUMNS``;
- ends with its kind object, ``KIND = MyKind()``, where ``MyKind`` subclasses the release
  shape it uses -- ``base.CountsKind`` (released from bounded per-key counts: implement
  ``release``), ``base.UsersKind`` (from whole users: ``release_users``) or
  ``base.StagesKind`` (its own stages: ``release_stages``) -- implements ``parse`` and
  ``calibrate``, sets ``name``, and overrides only the hooks it needs (``check_spec``,
  ``stage_budget``, ``verify_calibration``, ``privacy_record``, ``noise``...).

A kind option (a noise variant of an existing kind, e.g. gaussian's ``mechanism.noise``)
is a field of that kind, listed in its ``NOISES``, calibrated by its ``calibrate`` and
charged by its ``privacy_record``: nothing outside the kind's module changes.
tests/pipelines/kinds/test_kind_interface.py checks every kind against the interface.

**A kind kept outside this package** (a plug-in) is registered by its module path: call
:func:`register` (``register("my_package.my_kind")``) before loading a spec, or list the
module paths, comma-separated, in the environment variable ``THRESHER_KINDS`` (what the
``thresher`` command reads). The module's last name is the kind's name, exactly as for a
module here; it is imported only when the kind is used. Nothing outside this package
compares kind names: every kind-specific decision is a hook of ``base.Kind``, so a
registered kind plans, validates, runs, shows and reports like one kept here
(tests/pipelines/kinds/test_renamed_kinds.py runs a renamed copy of each kind).

Modules whose names start with ``_`` (and ``base``) are shared parts of kinds, not kinds.
Imports (layer 2 of tests/pipelines/test_import_graph.py's order): the floor
(``pipelines.errors``, ``pipelines.common``: field declarations, limits, the calibration
cache), ``pipelines.dataio`` (public keys), ``accounting`` and (inside functions: Beam)
``transforms`` -- never ``pipelines.specs`` (which loads them by name through
:func:`get`), the plan or the release wiring.
"""
import importlib
import os
import pkgutil

from thresher.pipelines.kinds.base import Kind

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
# The environment variable naming registered kind modules (module paths, comma-separated).
ENV = "THRESHER_KINDS"
# {kind name: module path} of the kinds registered from outside this package.
_REGISTERED = {}


def register(module_path):
    """Register the kind defined by the module ``module_path`` (importable; it ends with
    its kind object, as a module of this package does); its last dotted name is the
    kind's name. Returns the name. Call it before a spec naming the kind is loaded (the
    schema lists :data:`KINDS` when it is built). ValueError for a name already taken by
    another module."""
    global KINDS
    name = module_path.rsplit(".", 1)[-1]
    if not name.isidentifier() or name.startswith("_"):
        raise ValueError(f"{ENV}: {module_path!r} is not a kind module path (its last name "
                         f"is the kind's name: letters, digits and _, not starting with _)")
    if name in KINDS and _REGISTERED.get(name) != module_path:
        raise ValueError(f"{ENV}: kind {name!r} is already defined "
                         f"(by {_REGISTERED.get(name, f'{__name__}.{name}')})")
    _REGISTERED[name] = module_path
    if name not in KINDS:
        KINDS = KINDS + (name,)
    return name


for _path in filter(None, (p.strip() for p in os.environ.get(ENV, "").split(","))):
    register(_path)


def module(kind):
    """The module of one kind (imported on first use: only the chosen kind is loaded)."""
    if kind not in KINDS:
        raise KeyError(kind)
    return importlib.import_module(_REGISTERED.get(kind, f"{__name__}.{kind}"))


def get(kind):
    """The kind object of ``mechanism.kind`` ``kind`` (``base.Kind``); KeyError for an
    unknown kind, TypeError for a module that does not define its kind object."""
    found = module(kind).__dict__.get("KIND")
    if not isinstance(found, Kind) or found.name != kind:
        raise TypeError(f"{module(kind).__file__} must end with its kind object, "
                        f"KIND = <a pipelines.kinds.base.Kind subclass>() whose name is "
                        f"{kind!r} (docs: pipelines/kinds/__init__.py)")
    return found

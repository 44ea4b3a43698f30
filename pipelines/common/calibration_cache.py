"""A cache of the kinds' calibrations, for the ``thresher`` command (never for library use).

A kind's ``calibrate(mechanism, epsilon=, delta=, max_keys_per_user=, model=)`` (and the
planning limit's check that a Gaussian release can meet its budget at all,
``pipelines.common.limits``) is a pure function of its arguments and of the code that computes it (thresher's ``accounting``
and ``pipelines`` sources, NumPy, SciPy, mpmath and Python). Computing it needs
``scipy.special``, whose import alone costs 0.15-0.5 s on this machine -- more than the
rest of a small release beyond Beam's own import. The ``thresher`` command therefore keeps
each calibration it computed in a file and reads it back when the same calibration is
asked for again by the same code:

- the file name is the SHA-256 of the arguments (type-tagged: 1 and 1.0 and True are
  different arguments; floats by their exact hex form) and of a fingerprint of the code:
  the bytes of every ``.py`` file of thresher's ``accounting`` and ``pipelines`` packages,
  the versions of NumPy, SciPy (with its git revision) and mpmath, and Python's version;
- the value is stored type-tagged and read back exactly (floats by hex), so a cached plan
  is the very dict the calibration returned: the same report and the same noise;
- only successful calibrations are stored (a refusal is always recomputed), and only for
  the calls that have a forward check (``cached(..., verify=)``);
- a value read back is only a guess: before it is used its forward accounting is
  recomputed (the delta of the cached parameters at the spec's epsilon, in plain ``math``
  for the gaussian kind: ``accounting.plain_gshm``, so scipy is still not imported; one
  ``pld.user_delta`` or one-key exact delta for sample_and_threshold and heavy_hitters'
  trie, ``accounting.sample_threshold.calibration.recheck``) and it
  is used only if that meets the budget; otherwise it is recalibrated and a warning says so
  (an edited or corrupted file that still decodes never reaches a release);
- the folder is ``$THRESHER_CACHE_DIR`` or ``$XDG_CACHE_HOME/thresher`` or
  ``~/.cache/thresher`` (a new folder is made 0700; an existing one is left as it is); files are written whole (temporary file and
  rename), 0600; a file that is not owned by this user, is writable by others or does not
  decode is ignored and recomputed. ``THRESHER_CACHE_DIR=off`` turns the cache off (the
  test suite does, except the tests of this module);
- any error reading or writing the cache only means the calibration is computed.

What is cached is the calibrated parameters, never data, secrets or released values.
"""
import functools
import hashlib
import importlib.util
import json
import logging
import os
import pathlib
import sys
import tempfile

from thresher.pipelines import __version__

log = logging.getLogger("thresher")

ENV = "THRESHER_CACHE_DIR"
FORMAT = 2                 # bump when the stored layout or a cached bound changes
# 2: issue 38's sample-and-threshold bound (accounting/sample_threshold/pld.py, one
# dominating pair): entries of format 1 hold the old bound's (p, tau) and report; they
# are refused on reading (and their keys no longer match: the fingerprint changed).
_PACKAGES = ("accounting", "pipelines")
_enabled = False


def enable():
    """Use the cache in this process (``pipelines.process.prepare`` of the CLI)."""
    global _enabled
    _enabled = True


def disable():
    global _enabled
    _enabled = False


def folder():
    """The cache folder, or None when the cache is off."""
    configured = os.environ.get(ENV)
    if configured is not None:
        if configured.strip().lower() in ("", "off", "0", "no", "false"):
            return None
        return pathlib.Path(configured) / "calibration"
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    if not os.path.isabs(base):   # no home folder (e.g. a container without HOME): off,
        return None               # rather than a cache under the working directory
    if not fingerprint():
        return None               # no sources to fingerprint (a bytecode-only install): off
    return pathlib.Path(base) / "thresher" / "calibration"


def cached(name, function, verify=None):
    """``function`` (pure: a kind's calibrate, a planning limit's check) reading and writing
    the cache under ``name`` when the cache is enabled; the function itself otherwise.

    A cached value is only a guess: ``verify(value, *args, **kwargs)`` recomputes its
    forward accounting (the delta of the cached parameters at the asked epsilon, the cheap
    direction) and is True only when that meets the budget the arguments ask for. A value
    that fails is not used: the calibration is recomputed and a log line says so. A value
    is stored only once it verifies, and without ``verify`` nothing is cached (a kind
    whose forward check costs as much as its calibration is not cached)."""
    if verify is None or not _enabled or folder() is None:
        return function

    def call(*args, **kwargs):
        try:
            key = _key(name, args, kwargs)
        except _Uncacheable:
            key = None
        if key is not None:
            hit = _read(key)
            if hit is not None:
                if _verified(verify, hit[0], args, kwargs):
                    return hit[0]
                log.warning("cached calibration %s (file %s.json) fails its forward privacy "
                            "check for the budget asked: not used, recalibrating", name, key)
        value = function(*args, **kwargs)
        if key is not None and _verified(verify, value, args, kwargs):
            _write(key, [value])
        return value
    return call


def same(a, b):
    """a and b are the same value, types included (1, 1.0 and True differ): a verify
    function compares the report it recomputed with the cached one by this."""
    try:
        return _tag(a) == _tag(b)
    except _Uncacheable:
        return False


def _verified(verify, value, args, kwargs):
    """verify's answer; any error in it (a value of the wrong shape) counts as a failure."""
    try:
        return verify(value, *args, **kwargs) is True
    except Exception as exc:      # noqa: BLE001 -- a malformed value fails the check
        log.debug("calibration cache value fails its check: %r", exc)
        return False


# ---- keys --------------------------------------------------------------------------------

class _Uncacheable(Exception):
    """An argument or value outside the exactly round-tripping types."""


def _tag(x):
    """A JSON value that names the type of ``x`` exactly (only plain Python types)."""
    t = type(x)
    if x is None:
        return None
    if t is bool:
        return ["bool", x]
    if t is int:
        return ["int", str(x)]
    if t is float:
        return ["float", x.hex()]
    if t is str:
        return ["str", x]
    if t in (list, tuple):
        return [t.__name__, [_tag(v) for v in x]]
    if t is dict:
        return ["dict", [[_tag(k), _tag(v)] for k, v in x.items()]]   # insertion order kept
    raise _Uncacheable(f"type {t.__name__}")


def _untag(v):
    if v is None:
        return None
    name, body = v
    if name == "bool":
        return bool(body)
    if name == "int":
        return int(body)
    if name == "float":
        return float.fromhex(body)
    if name == "str":
        return str(body)
    if name == "list":
        return [_untag(b) for b in body]
    if name == "tuple":
        return tuple(_untag(b) for b in body)
    if name == "dict":
        return {_untag(k): _untag(b) for k, b in body}
    raise ValueError(f"unknown tag {name!r}")


def _key(name, args, kwargs):
    document = json.dumps([FORMAT, fingerprint(), _tag(name), _tag(tuple(args)),
                           _tag(dict(sorted(kwargs.items())))], separators=(",", ":"))
    return hashlib.sha256(document.encode("utf-8")).hexdigest()


@functools.lru_cache(maxsize=None)
def fingerprint():
    """SHA-256 of the code a calibration depends on (see the module docstring)."""
    h = hashlib.sha256()
    sources = 0
    for package in _PACKAGES:
        # where the package is installed (a wheel's thresher/accounting, or the checkout's
        # accounting/ in an editable install), never a path guessed from this file's place
        spec = importlib.util.find_spec(f"thresher.{package}")
        for folder in (spec.submodule_search_locations or []) if spec else []:
            root = pathlib.Path(folder).resolve()
            for path in sorted(root.rglob("*.py")):
                h.update(f"{package}/{path.relative_to(root).as_posix()}".encode("utf-8") + b"\0")
                h.update(path.read_bytes() + b"\0")
                sources += 1
    if sources == 0:
        return ""                 # nothing to tell versions apart by: the cache stays off
    h.update(__version__.encode("utf-8") + b"\0")
    h.update(sys.version.encode("utf-8") + b"\0")
    import numpy  # heavy: numpy
    h.update(numpy.__version__.encode("utf-8") + b"\0")
    for name, version_file in (("scipy", "version.py"), ("mpmath", "__init__.py")):
        spec = importlib.util.find_spec(name)   # finds the package without importing it
        if spec is not None and spec.origin:
            h.update(name.encode("utf-8") + b"\0")
            h.update(pathlib.Path(spec.origin).with_name(version_file).read_bytes() + b"\0")
    return h.hexdigest()


# ---- files -------------------------------------------------------------------------------

def _read(key):
    path = folder() / f"{key}.json"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    except OSError:
        return None
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid() or st.st_mode & 0o022:
            log.debug("calibration cache file %s ignored: not private to this user", path)
            return None
        with os.fdopen(fd, "rb") as handle:
            fd = None
            document = json.loads(handle.read().decode("utf-8"))
        if document.get("format") != FORMAT or document.get("key") != key:
            return None
        return _untag(document["value"])
    except (OSError, ValueError, TypeError, KeyError, AttributeError):
        log.debug("calibration cache file %s ignored: unreadable", path)
        return None
    finally:
        if fd is not None:
            os.close(fd)


def _write(key, params):
    try:
        value = _tag(params)
    except _Uncacheable as exc:
        log.debug("calibration not cached: %s", exc)
        return
    directory = folder()
    try:
        directory.mkdir(mode=0o700, parents=True, exist_ok=True)
        data = json.dumps({"format": FORMAT, "key": key, "value": value},
                          separators=(",", ":")).encode("utf-8")
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-", suffix=".json")
        try:
            with os.fdopen(fd, "wb") as handle:       # mkstemp's file is 0600
                handle.write(data)
            os.replace(tmp, directory / f"{key}.json")
        except BaseException:
            os.unlink(tmp)
            raise
    except OSError as exc:
        log.debug("calibration not cached: %s", exc)

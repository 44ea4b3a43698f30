"""Process settings of the ``thresher`` command (never applied when thresher is imported
as a library).

**No IPython probe.** Beam asks ``is_in_ipython()`` when a pipeline is built and run,
which imports IPython when it is installed (0.25-0.6 s of every start-up here). A
process started as ``thresher`` that has not imported IPython is not an IPython session,
so the import is answered with ImportError (``sys.modules["IPython"] = None``) and
Beam's probe returns False at once. A process that already runs IPython is left alone.

**DoFn state/timer specs looked up once per DoFn object.** Beam asks
``userstate.get_dofn_specs(dofn)`` about every DoFn about eight times while it builds,
translates and runs a pipeline (is it stateful? validate it; its state and timer specs for
the runner API; again in each bundle processor), and each time wraps every method of the
DoFn and calls ``inspect.signature`` on it: 190 look-ups of 47 DoFn objects, 0.1-0.3 s of
a 1,000-row release. The answer is a function of the DoFn object's methods and their
default arguments, which do not change while it exists, so the ``thresher`` command keeps
the first answer per object (by identity, while the object lives; copies of the two
sets are handed out).

**Function signatures looked up once per function** (:func:`memoize_signatures`) and
**gettext's translation-file look-ups once per question** (:func:`memoize_translation_lookups`):
Beam re-inspects the same DoFn methods for every copy it unpickles, and argparse asks
gettext for its words at every parser Beam and the CLI build.

**Beam only when a pipeline is built.** ``prepare`` imports nothing of Beam: a refused
spec, and every command but ``run``, answers without it (tests/pipelines/
test_cli_command_imports.py); ``run`` imports it in :func:`prepare_pipeline`, once the spec is
planned and the output and options are checked.

**Beam's import kept out of the cyclic garbage collector's full passes.** Importing Beam
leaves ~150,000 long-lived objects; the first full collection while a small release is
built and run scans them all (0.07 s of CPU here, a fifth of what a 1,000-row release
costs beyond Beam's import). ``thresher run`` moves the objects that exist once Beam is
imported into the collector's permanent generation (``gc.freeze()``, as servers that
pre-import do): they are modules, classes and functions that live as long as the process.
Everything created later is collected as before. The interpreter's exit then skips
collecting them too (0.3-0.5 s of CPU of a bare ``import apache_beam`` process here).

**Freed buffers kept for the next batch** (:func:`keep_freed_heap`). A release allocates
and frees arrays of megabytes for every batch and shard; glibc's defaults hand many of them
back to the system (buffers it maps on their own, and the top of the heap past 128 KB free)
and the next batch faults the same amount of fresh zeroed pages in again: ~230,000 page
faults and ~1.2 s of system time per 1e7 rows, 1.3 million and ~14 s at 1e8. ``thresher
run`` raises glibc's thresholds (buffers up to 32 MB from the heap, the heap trimmed only
past 1 GB free at its top): 60,000 faults and 0.6 s at 1e7 rows, 340,000 and 7.7 s at 1e8
(issue 43 round 7, idle). Freed memory that is not reused stays resident, so peak RSS can
be higher: at 1e7 rows 447-476 MB without against 477-487 MB with, in two pairs of runs
(within the runs' own +-15 MB). (Tried and not kept, the other way: a lower mmap
threshold so that freed buffers go back at once: -40 MB of peak RSS at 1e7 rows for
+2.5 s of system time.)
"""
import ctypes
import ctypes.util
import gc
import gettext
import os
import platform
import sys
import types
import weakref


def skip_ipython_probe():
    """Make Beam's IPython probe cheap in a process that is not an IPython session."""
    if "IPython" not in sys.modules:
        sys.modules["IPython"] = None


def memoize_dofn_specs():
    """Beam's ``get_dofn_specs`` computed once per DoFn object in this process."""
    from apache_beam.transforms import userstate  # heavy: apache_beam
    compute = userstate.get_dofn_specs
    if getattr(compute, "thresher_memo", False):
        return
    memo = {}        # id(dofn) -> (weak reference to it, its state specs, its timer specs)

    def get_dofn_specs(dofn):
        entry = memo.get(id(dofn))
        if entry is not None and entry[0]() is dofn:
            return set(entry[1]), set(entry[2])
        states, timers = compute(dofn)
        try:
            memo[id(dofn)] = (weakref.ref(dofn), frozenset(states), frozenset(timers))
        except TypeError:            # not weakly referable: asked again next time
            pass
        return states, timers
    get_dofn_specs.thresher_memo = True
    get_dofn_specs.__doc__ = compute.__doc__
    userstate.get_dofn_specs = get_dofn_specs


def prepare(command):
    """Settings for one ``thresher COMMAND`` process (Beam is not imported here: a spec
    that is refused, and every command but ``run``, answers without it)."""
    skip_ipython_probe()
    from thresher.pipelines.common import calibration_cache  # heavy: start-up of thresher --help
    calibration_cache.enable()      # calibrations read back, not recomputed (scipy not imported)


def memoize_translation_lookups():
    """``gettext.find`` answered once per question in this process.

    ``argparse`` asks gettext for its few words ("options", "usage: ") whenever it builds
    a parser or an argument's formatter, and every ask looks for translation files on
    disk again (``os.path.exists`` per language; a miss is never cached): about 150
    times while ``thresher run`` builds its own parser and Beam's option parsers (Beam
    builds one per options view it reads). The answer is a function of the arguments
    and of the locale variables of the environment, which are part of the key, so the
    memo answers exactly as gettext would."""
    find = gettext.find
    if getattr(find, "thresher_memo", False):
        return
    memo = {}

    def cached_find(domain, localedir=None, languages=None, all=False):
        try:
            key = (domain, localedir, None if languages is None else tuple(languages), all,
                   tuple(os.environ.get(v) for v in ("LANGUAGE", "LC_ALL", "LC_MESSAGES", "LANG")))
            hash(key)
        except TypeError:
            return find(domain, localedir, languages, all)
        if key not in memo:
            memo[key] = find(domain, localedir, languages, all)
        found = memo[key]
        return list(found) if isinstance(found, list) else found
    cached_find.thresher_memo = True
    cached_find.__doc__ = find.__doc__
    gettext.find = cached_find


def memoize_signatures():
    """Beam's ``get_signature`` computed once per Python function in this process.

    Beam asks for the signature of the same DoFn methods and mapped functions again and
    again: each DoFn copy a bundle processor unpickles is a new object (so the per-object
    memo of :func:`memoize_dofn_specs` misses), and every copy's methods are wrapped and
    inspected anew -- 725 ``inspect.signature`` calls while a 1,000-row release runs, 1,450
    in all. For a plain function the signature is a function of the function object (its
    code, defaults, annotations and ``__wrapped__``/``__signature__``), which thresher and
    Beam never change once made; a method bound to any object has that function's
    signature without its first parameter. Only those two shapes are kept (by the
    function, weakly: a function that goes away leaves the memo); classes, builtins,
    partials and other callables are asked of Beam each time. Signatures are immutable, so
    one object is handed to every caller."""
    from apache_beam.transforms import core, ptransform, util  # heavy: apache_beam
    from apache_beam.typehints import decorators  # heavy: apache_beam
    compute = decorators.get_signature
    if getattr(compute, "thresher_memo", False):
        return
    plain, bound = weakref.WeakKeyDictionary(), weakref.WeakKeyDictionary()

    def get_signature(func):
        if type(func) is types.FunctionType:
            memo, key = plain, func
        elif type(func) is types.MethodType and type(func.__func__) is types.FunctionType:
            memo, key = bound, func.__func__
        else:
            return compute(func)
        signature = memo.get(key)
        if signature is None:
            signature = memo[key] = compute(func)
        return signature
    get_signature.thresher_memo = True
    get_signature.__doc__ = compute.__doc__
    for module in (decorators, core, ptransform, util):
        if getattr(module, "get_signature", None) is compute:
            module.get_signature = get_signature


# glibc's mallopt parameters (malloc.h) and the values thresher run sets
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3
_HEAP_SETTINGS = ((_M_MMAP_THRESHOLD, 32 << 20),   # glibc's largest on 64-bit systems
                  (_M_TRIM_THRESHOLD, 1 << 30),
                  (_M_TOP_PAD, 64 << 20))


def keep_freed_heap():
    """glibc's malloc keeps freed buffers for reuse (see the module docstring). Returns
    True when every setting took; False (nothing to do) where the C library is not glibc
    or refuses a value. The process's results do not depend on it, only its page faults."""
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    return all([mallopt(param, value) == 1 for param, value in _HEAP_SETTINGS])


def prepare_pipeline():
    """Settings for building and running a pipeline, once the spec is planned and checked
    (``thresher run``, just before the release is built): imports Beam and the release's
    modules, then freezes what exists into the collector's permanent generation."""
    # heavy: apache_beam
    import thresher.pipelines.running.release  # noqa: F401 -- Beam and the transforms, frozen below
    memoize_dofn_specs()
    memoize_signatures()
    keep_freed_heap()
    if gc.get_freeze_count() == 0:   # once per process (in-process CLI calls in tests)
        gc.freeze()


def finish():
    """Undo what :func:`prepare` set for one command that later library calls in the same
    process must not inherit (the calibration cache is for the ``thresher`` command only)."""
    from thresher.pipelines.common import calibration_cache  # heavy: start-up of thresher --help
    calibration_cache.disable()

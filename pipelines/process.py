"""Process settings of the ``thresher`` command (never applied when thresher is imported
as a library).

**No IPython probe.** Beam asks ``is_in_ipython()`` when a pipeline is built and run,
which imports IPython when it is installed (0.25-0.6 s of every start-up here). A
process started as ``thresher`` that has not imported IPython is not an IPython session,
so the import is answered with ImportError (``sys.modules["IPython"] = None``) and
Beam's probe returns False at once. A process that already runs IPython is left alone.

(Tried and not kept: fixing glibc's mmap threshold so freed multi-megabyte buffers go
back to the system: -40 MB of peak RSS at 1e7 rows for +2.5 s of system time.)
"""
import sys


def skip_ipython_probe():
    """Make Beam's IPython probe cheap in a process that is not an IPython session."""
    if "IPython" not in sys.modules:
        sys.modules["IPython"] = None


def prepare(command):
    """Settings for one ``thresher COMMAND`` process."""
    skip_ipython_probe()
    from pipelines import calibration_cache
    calibration_cache.enable()      # calibrations read back, not recomputed (scipy not imported)

"""SIGTERM during ``thresher run``: unwind like Ctrl-C and publish nothing (and SIGINT,
noted by the CLI's handler, is checked at the same points).

``timeout``, ``kill`` and schedulers stop a job with SIGTERM, whose default action ends
the process at once and leaves the staging folder behind. :func:`install` makes it raise
:class:`Terminated` instead, so ``pipelines.running.release`` discards the staging folder and
releases its claim on the output before the CLI exits with 143.

Library code may swallow an exception raised at an arbitrary point (Beam's optional
imports catch everything), so the request is also remembered: :func:`check` raises it
again at the release's checkpoints (after the pipeline, before publishing).
"""
import signal
import threading


class Terminated(BaseException):
    """SIGTERM arrived while a release was running."""


_requested = False
_interrupt = False     # SIGINT arrived (the CLI's handler raises KeyboardInterrupt itself)
_before_raise = None


def _handler(signum, frame):
    global _requested
    _requested = True
    if _before_raise is not None:
        _before_raise()
    raise Terminated()


def install(before_raise=None):
    """Handle SIGTERM in this (main) thread (no-op elsewhere); returns a function that
    puts the previous handler back. ``before_raise`` runs first (the CLI stops its worker
    processes there: Beam's clean-up joins them, and a worker that got no signal would
    never exit)."""
    global _requested, _interrupt, _before_raise
    _requested = False
    _interrupt = False
    _before_raise = before_raise
    if threading.current_thread() is not threading.main_thread():
        return lambda: None
    previous = signal.signal(signal.SIGTERM, _handler)
    return lambda: signal.signal(signal.SIGTERM, previous)


def requested():
    """True if SIGTERM arrived during this run (Beam may have wrapped the exception)."""
    return _requested


def note_interrupt():
    """SIGINT arrived (called by the CLI's SIGINT handler, which raises KeyboardInterrupt)."""
    global _interrupt
    _interrupt = True


def check():
    """Raise :class:`Terminated` if SIGTERM arrived, or KeyboardInterrupt if SIGINT did,
    even if library code swallowed the exception the handler raised."""
    if _requested:
        raise Terminated()
    if _interrupt:
        raise KeyboardInterrupt()

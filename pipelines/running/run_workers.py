"""The worker processes a ``thresher run`` started, found and stopped when it is
interrupted or terminated (Ctrl-C, SIGTERM).

Beam's multi-processing runner starts each SDK worker as ``sh -c "python -m
apache_beam.runners.worker.sdk_worker_main"`` with a copy of this process's environment
(``SubprocessSdkWorker.run``). A worker whose ``sh`` parent died on a terminal's Ctrl-C is
no longer our descendant, so the stop also looks for Beam workers by their command line;
but a process group is shared with whatever else its shell started (two releases from
one script, a CI job's concurrent test sessions), so a Beam worker is ours only if it
carries this run's mark: ``THRESHER_RUN_PID=<our pid>`` in its environment, which
:func:`mark` sets before the pipeline starts its workers. Linux ``/proc``; elsewhere
nothing is found and nothing is signalled.
"""
import os
import signal
import time

MARK = "THRESHER_RUN_PID"
_WORKER_MODULE = b"apache_beam.runners.worker.sdk_worker_main"


def mark():
    """Put this run's mark in the environment the workers inherit; returns a function
    that restores the previous value."""
    previous = os.environ.get(MARK)
    os.environ[MARK] = str(os.getpid())

    def restore():
        if previous is None:
            os.environ.pop(MARK, None)
        else:
            os.environ[MARK] = previous
    return restore


def _children(pid):
    """Child process ids of ``pid``."""
    out = []
    try:
        tasks = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return out
    for task in tasks:
        try:
            with open(f"/proc/{pid}/task/{task}/children", encoding="ascii") as handle:
                out.extend(int(c) for c in handle.read().split())
        except OSError:
            continue
    return out


def descendants(pid):
    """Every process below ``pid``, parents before their children."""
    pending, found = [pid], []
    while pending:
        kids = _children(pending.pop())
        found.extend(kids)
        pending.extend(kids)
    return found


def _carries_mark(pid, mark_entry):
    with open(f"/proc/{pid}/environ", "rb") as handle:
        return mark_entry in handle.read().split(b"\0")


def marked_beam_workers():
    """Beam SDK workers in this process group that carry this process's mark (a worker
    whose ``sh -c`` parent died is no longer our descendant, but it is still in our
    group, and its environment still names us)."""
    out = []
    group, me = os.getpgrp(), os.getpid()
    mark_entry = f"{MARK}={me}".encode()
    try:
        pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
    except OSError:
        return out
    for pid in pids:
        if pid == me:
            continue
        try:
            if os.getpgid(pid) != group:
                continue
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if _WORKER_MODULE not in handle.read():
                    continue
            if _carries_mark(pid, mark_entry):
                out.append(pid)
        except OSError:            # gone, or another user's process
            continue
    return out


def stop():
    """Stop the worker processes this run started (Beam's multi-processing workers, which
    would otherwise keep running, and keep this process alive, after an interrupt): each
    descendant and each marked Beam worker of this process group, by its process id;
    SIGTERM, then SIGKILL to any left after 2 s."""
    found = list(dict.fromkeys(reversed(descendants(os.getpid()) + marked_beam_workers())))
    for pid in found:
        try:
            os.kill(pid, signal.SIGTERM)
        except OSError:
            pass
    deadline = time.time() + 2.0
    while found and time.time() < deadline:
        found = [pid for pid in found if _alive(pid)]
        time.sleep(0.05)
    for pid in found:     # a worker stuck in its own interrupt handling
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _alive(pid):
    try:
        os.waitpid(pid, os.WNOHANG)
    except ChildProcessError:
        pass
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().split(") ")[-1][:1] not in ("Z", "X")
    except OSError:
        return False

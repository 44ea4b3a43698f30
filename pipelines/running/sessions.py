"""Processes by session: everything a run started, found and stopped together.

A job server that Beam starts, Beam's worker pool and the SDK workers the pool starts
are children, grandchildren and great-grandchildren of the run, in several process
groups; all of them stay in the session the run was started in (none calls setsid).
So a run started in its own session (``start_new_session=True``) is stopped by
signalling every process of that session (Linux ``/proc/<pid>/stat``, field 6).
"""
import os
import signal
import time


def session_of(pid):
    """The session id of ``pid``, or None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="utf-8", errors="replace") as handle:
            text = handle.read()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()     # after the command name, which may hold spaces
    return int(fields[3])                            # state ppid pgrp session


def _live_stats():
    """(pid, [state, ppid, pgrp, session, ...]) of every live process (zombies excluded),
    from /proc/PID/stat: the fields after the command name, which may hold spaces."""
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8", errors="replace") as handle:
                text = handle.read()
        except OSError:
            continue
        fields = text[text.rindex(")") + 2:].split()
        if fields[0] != "Z":
            yield int(name), fields


def members(session):
    """The pids of the live processes of ``session`` (zombies excluded)."""
    return [pid for pid, fields in _live_stats() if int(fields[3]) == session]


def stop(session, grace=15.0):
    """SIGTERM to every process of ``session``, SIGKILL to those left after ``grace``
    seconds; returns the pids that were signalled."""
    signalled = set()
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 10.0)):
        alive = [pid for pid in members(session) if pid != os.getpid()]
        if not alive:
            return signalled
        for pid in alive:
            try:
                os.kill(pid, sig)
                signalled.add(pid)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(
                pid != os.getpid() for pid in members(session)):
            time.sleep(0.2)
    return signalled


def descendants(pid):
    """Every live process below ``pid`` (children, their children, ...)."""
    children = {}
    for child, fields in _live_stats():
        children.setdefault(int(fields[1]), []).append(child)
    found, stack = [], list(children.get(pid, []))
    while stack:
        child = stack.pop()
        found.append(child)
        stack.extend(children.get(child, []))
    return found


def stop_descendants(pid, grace=10.0):
    """SIGTERM, then SIGKILL after ``grace`` s, to every process below ``pid``."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        alive = descendants(pid)
        if not alive:
            return
        for child in alive:
            try:
                os.kill(child, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and descendants(pid):
            time.sleep(0.2)

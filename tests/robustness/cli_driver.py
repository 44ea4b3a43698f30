"""One driver for the robustness tests that run the real CLI in a capped child interpreter.

``run_batch(argvs)`` starts one fresh interpreter (``python -m tests.robustness.cli_driver``,
optionally through a ``prefix`` command such as setpriv or unshare) that caps its own
address space (``resource.setrlimit(RLIMIT_AS)``, 3 GB) and runs each argv through
``pipelines.cli.main`` (what ``python -m thresher`` runs) with stdout and stderr
captured, the root logger's handlers reset and a SIGALRM hang guard per case (a case still
running after ``seconds`` is stopped and reported as ``code: "timeout"``; the guard ends a
hung case, it is not a speed check). Each result holds the exit code (or "timeout" /
"MemoryError"), the captured stdout and stderr, the wall seconds (for messages only) and
the case's peak resident memory in MB (VmHWM, reset to the current RSS before each case).

``hooks`` names a module imported in the child after the cap is set; its optional
``before_case(argv)`` runs before each case (e.g. to clear caches) and its optional
``after_case(argv)`` returns a JSON-able dict stored as the result's ``"hooks"`` (e.g.
work counters of the case).
"""
import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MEMORY_CAP = 3 << 30
CASE_SECONDS = 60


def run_batch(argvs, prefix=(), *, hooks=None, cap=MEMORY_CAP, seconds=CASE_SECONDS):
    """Run each argv through the CLI in one capped child interpreter; list of results."""
    command = [*prefix, sys.executable, "-m", "tests.robustness.cli_driver",
               "--cap", str(int(cap)), "--seconds", str(int(seconds))]
    if hooks:
        command += ["--hooks", hooks]
    proc = subprocess.run(command, cwd=ROOT, input=json.dumps(argvs), capture_output=True,
                          text=True, timeout=seconds * len(argvs) + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout)


# ---- the child ---------------------------------------------------------------------------

class _Timeout(BaseException):
    pass


def _alarm(*_):
    raise _Timeout()


def _peak_mb():
    # VmHWM: this process's own peak RSS (ru_maxrss survives execve on Linux, so it would
    # report the parent's peak, e.g. pytest's after a long suite)
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak():
    try:   # reset VmHWM to the current RSS, so each case's peak is its own (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        pass   # then the peak is the running maximum: still an upper bound per case


def _child(argv):
    import argparse
    import contextlib
    import importlib
    import io
    import logging
    import resource
    import signal
    import time

    parser = argparse.ArgumentParser()
    parser.add_argument("--cap", type=int, required=True)
    parser.add_argument("--seconds", type=int, required=True)
    parser.add_argument("--hooks")
    args = parser.parse_args(argv)
    resource.setrlimit(resource.RLIMIT_AS, (args.cap, args.cap))
    from thresher.pipelines.cli import main
    hooks = importlib.import_module(args.hooks) if args.hooks else None
    before = getattr(hooks, "before_case", None)
    after = getattr(hooks, "after_case", None)

    signal.signal(signal.SIGALRM, _alarm)
    stdout = sys.stdout
    results = []
    for case in json.load(sys.stdin):
        if before:
            before(case)
        _reset_peak()
        out, err = io.StringIO(), io.StringIO()
        logging.getLogger().handlers[:] = []
        started = time.time()
        signal.alarm(args.seconds)
        try:
            with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
                try:
                    code = main(case)
                except SystemExit as exc:
                    code = exc.code
        except _Timeout:
            code = "timeout"
        except MemoryError:
            code = "MemoryError"
        finally:
            signal.alarm(0)
        result = {"code": code, "out": out.getvalue(), "err": err.getvalue(),
                  "seconds": time.time() - started, "peak_mb": _peak_mb()}
        if after:
            result["hooks"] = after(case)
        results.append(result)
    json.dump(results, stdout)


if __name__ == "__main__":
    _child(sys.argv[1:])

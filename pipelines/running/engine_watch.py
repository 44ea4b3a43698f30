"""A release on Flink, Spark or Prism: bounded in time, and its failures in one line.

Beam's portable runner talks to the job server over gRPC and reports its failures as
gRPC or runtime errors (``_InactiveRpcError ... StatusCode.UNAVAILABLE`` when the job
server died, ``Pipeline ... failed in state FAILED: ...`` when the engine failed the
job). :func:`watched` turns them into one :class:`EngineRunError` line naming the engine
and what happened; the release then publishes nothing (``release.run`` discards its
staging), and a ledger reservation stays charged once reading started, as for any
failure.

A job can also wait forever: an SDK worker that never connects (a worker pool whose
``python`` has no Beam) leaves Flink waiting for it. ``thresher run --timeout S`` bounds
the run: past S seconds the processes this run started (the job server, worker pools,
the workers) are stopped, which ends Beam's wait, and the run fails with
``did not finish within S s``. Whatever the end, every process the run started is
stopped before the command returns (:func:`sessions.stop_descendants`).
"""
import contextlib
import os
import threading

from thresher.pipelines.errors import ThresherError
from thresher.pipelines.running import sessions


class EngineRunError(ThresherError):
    """The engine failed the job, stopped answering, or the run exceeded --timeout."""
    exit_code = 1


def engine_name(beam_args):
    """``Flink``, ``Spark``, ``Prism`` or None (an in-process or other runner)."""
    for arg in beam_args:
        if arg.startswith("--runner="):
            runner = arg.split("=", 1)[1].rsplit(".", 1)[-1].lower()
            return {"flinkrunner": "Flink", "sparkrunner": "Spark",
                    "prismrunner": "Prism", "portablerunner": "the portable job server"
                    }.get(runner)
    return None


def _describe(exc):
    """One line from a gRPC or runner error."""
    code = getattr(exc, "code", None)
    if callable(code):
        try:
            details = exc.details() or ""
            return f"gRPC {code().name}: {details}".strip()[:300]
        except Exception:  # noqa: BLE001 - a half-made gRPC error: its text below
            pass
    text = str(exc).strip().splitlines()
    return (text[0] if text else type(exc).__name__)[:400]


@contextlib.contextmanager
def watched(beam_args, timeout=None):
    """Run the body (the release) on the engine ``beam_args`` name, bounded by ``timeout``
    seconds when given; EngineRunError (exit 1) on an engine failure or past the bound."""
    name = engine_name(beam_args)
    if name is None and timeout is not None:
        raise ThresherError("--timeout bounds a run on Flink, Spark, Prism or a portable job "
                            "server (it stops the processes the run started); the in-process "
                            "runner has none to stop: leave --timeout out, or stop the "
                            "command itself")
    if name is None:
        yield
        return
    if timeout is not None and not timeout > 0:
        raise ThresherError(f"--timeout {timeout:g}: give a positive number of seconds")
    expired = threading.Event()
    finished = threading.Event()

    def watchdog():
        if not finished.wait(timeout):
            expired.set()
            sessions.stop_descendants(os.getpid())   # ends Beam's wait on the job

    guard = None
    if timeout is not None:
        guard = threading.Thread(target=watchdog, name="thresher-timeout", daemon=True)
        guard.start()
    try:
        yield
    except ThresherError:
        if expired.is_set():
            raise EngineRunError(_timeout_text(name, timeout)) from None
        raise
    except Exception as exc:  # noqa: BLE001 - gRPC and runner errors, named below
        if expired.is_set():
            raise EngineRunError(_timeout_text(name, timeout)) from None
        if name is None:
            raise
        if "RpcError" in type(exc).__name__ or type(exc).__module__.startswith("grpc"):
            raise EngineRunError(
                f"{name} stopped answering while the job ran ({_describe(exc)}): its job "
                f"server died or was stopped; nothing was published") from None
        if "failed in state" in str(exc) or "FAILED" in str(exc):
            raise EngineRunError(f"{name} failed the job: {_describe(exc)}; nothing was "
                                 f"published") from None
        raise
    finally:
        finished.set()
        sessions.stop_descendants(os.getpid())       # nothing this run started lives on


def _timeout_text(name, timeout):
    return (f"the run on {name or 'the runner'} did not finish within {timeout:g} s "
            f"(--timeout): stopped it and every process it started; nothing was published")

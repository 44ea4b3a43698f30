"""Beam's worker pool for N SDK worker processes on this machine (``--workers N``).

``python -m apache_beam.runners.worker.worker_pool_main`` starts one ``python -c
"...SdkHarness(...).run()"`` process per worker the engine asks for, with the ``python``
first on its PATH: started from another environment it finds an interpreter without
Beam, the worker dies (``No module named apache_beam``) and the job waits for it
forever. So the pool runs with this interpreter's folder first on PATH (the interpreter
that runs thresher has Beam and thresher), in the run's folder (relative output paths
resolve as in the launcher), on a free port, listening on localhost only
(``loopback_pool``: Beam's own pool binds every interface and has no flag for it).
"""
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time

from thresher.pipelines.running.engines import EngineError

START_TIMEOUT = 60.0


@dataclasses.dataclass
class Pool:
    process: subprocess.Popen
    endpoint: str
    log_path: str

    def stop(self):
        """The pool and its workers (one process group) are stopped."""
        for sig, wait in ((signal.SIGTERM, 10), (signal.SIGKILL, 10)):
            try:
                os.killpg(self.process.pid, sig)
            except ProcessLookupError:
                return
            try:
                self.process.wait(timeout=wait)
            except subprocess.TimeoutExpired:
                continue
        try:
            os.killpg(self.process.pid, signal.SIGKILL)   # workers that outlived the pool
        except ProcessLookupError:
            pass

    def workers_started(self):
        with open(self.log_path, encoding="utf-8", errors="replace") as handle:
            return handle.read().count("Starting worker with command")


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def start(folder):
    """A worker pool serving from ``folder``; EngineError when it does not listen."""
    env = dict(os.environ)
    env["PATH"] = os.path.dirname(sys.executable) + os.pathsep + env.get("PATH", "")
    log_path = os.path.join(folder, "worker_pool.log")
    for _ in range(3):              # a free port may be taken before the pool binds it
        port = _free_port()
        log = open(log_path, "w", encoding="utf-8")
        process = subprocess.Popen(
            [sys.executable, "-m", "thresher.pipelines.running.loopback_pool",
             f"--service_port={port}"], cwd=folder, env=env, stdout=log,
            stderr=subprocess.STDOUT, process_group=0)
        log.close()
        pool = Pool(process, f"localhost:{port}", log_path)
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline and process.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return pool
            except OSError:
                time.sleep(0.2)
        pool.stop()
    raise EngineError(f"Beam's worker pool did not start; its log: {log_path}")

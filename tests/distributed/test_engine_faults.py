"""Faults on Flink through the real CLI (marker ``engine_faults``; .ci/run runs them after
the engine matrix): a job server that dies mid-run, an SDK worker that dies, a port in
use, a job that hangs. Each must end with one clear error line within a bounded time,
publish nothing, keep the ledger's charge once reading started, and leave no process of
the run alive (checked by walking the run's session in /proc, as ``ps -s`` would).

The command runs in its own session with a hard bound of its own (``bounded``): the
assertions are about what the CLI did, never about how long it took.
"""
import json
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

from thresher.pipelines.running import sessions

from .conftest import ROOT, free_loopback_port, quickstart_spec
from .test_engines_jvm import _cached

HARD_BOUND = 900        # s: the test's own limit on one CLI run (a hang fails the test)


@pytest.fixture(scope="module")
def flink_jar():
    return _cached("flink")


def _spec_with_ledger(folder):
    spec_path, out, _ = quickstart_spec(folder)
    with open(spec_path, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    ledger = os.path.join(str(folder), "ledger.sqlite")
    doc["budget"] = {"ledger": ledger, "dataset": "words", "epsilon": 10.0, "delta": 1e-6}
    with open(spec_path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle, sort_keys=False)
    return spec_path, out, ledger


def _start(args, cwd, env=None):
    env = dict(env or os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli"] + args, cwd=cwd,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            errors="replace", start_new_session=True)


def _finish(process):
    """(exit code, stderr, pids of the run's session still alive after it ended)."""
    try:
        _, err = process.communicate(timeout=HARD_BOUND)
    except subprocess.TimeoutExpired:
        sessions.stop(process.pid)
        process.communicate()
        pytest.fail(f"the CLI did not end within {HARD_BOUND} s")
    time.sleep(1)                 # a process signalled as the CLI exited has gone by now
    left = sessions.members(process.pid)
    sessions.stop(process.pid)
    return process.returncode, err, left


def _wait_for(predicate, process, limit=300):
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        found = predicate()
        if found:
            return found
        if process.poll() is not None:
            return None
        time.sleep(0.5)
    return None


def _java_of(session):
    for pid in sessions.members(session):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                if handle.read().split(b"\0")[0].endswith(b"java"):
                    return pid
        except OSError:
            pass
    return None


def _listening(pid):
    """How many TCP sockets ``pid`` listens on (2 for an idle job server; the Fn API
    servers of a running job add several)."""
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:
        return 0
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(table, encoding="utf-8") as handle:
            for line in handle.readlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:      # 0A: LISTEN
                    count += 1
    return count


def _charged(ledger):
    done = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", "ledger", "show",
                           ledger, "--json"], capture_output=True, text=True,
                          env=dict(os.environ, PYTHONPATH=ROOT), timeout=120)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _assert_failed_cleanly(code, err, left, out, words):
    assert code not in (0, None), err[-3000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("thresher: error: "), err[-3000:]
    assert any(word in last for word in words), last
    assert "Traceback" not in err and "internal error" not in err
    assert not os.path.exists(out), os.listdir(out)         # nothing published
    assert left == [], f"processes of the run still alive: {left}"


@pytest.mark.engine_faults
def test_a_job_server_that_dies_mid_run(flink_jar, tmp_path):
    spec, out, ledger = _spec_with_ledger(tmp_path)
    run = _start(["run", spec, "--", "--runner=FlinkRunner", "--flink_master=[local]"],
                 str(tmp_path))
    java = _wait_for(lambda: _java_of(run.pid), run)
    assert java, "the job server never started"
    # the job runs once its Fn API servers listen beside the job and artifact ports
    assert _wait_for(lambda: _listening(java) >= 4, run), "the job never started"
    assert run.poll() is None, "the run ended before the job server could be killed"
    os.kill(java, 9)
    code, err, left = _finish(run)
    _assert_failed_cleanly(code, err, left, out, ["stopped answering", "failed the job"])
    summary = _charged(ledger)
    # the charge stays: reading had started (a reservation left open, never published)
    assert "published" not in json.dumps(summary["releases"]), summary
    assert summary["releases"], summary


@pytest.mark.engine_faults
def test_a_port_in_use_is_refused_before_anything_runs(flink_jar, tmp_path):
    spec, out, ledger = _spec_with_ledger(tmp_path)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        run = _start(["run", spec, "--", "--runner=FlinkRunner", "--flink_master=[local]",
                      f"--job_port={port}"], str(tmp_path))
        code, err, left = _finish(run)
    assert code == 2, err
    _assert_failed_cleanly(code, err, left, out, [f"--job_port={port}"])
    assert "in use" in err and "nothing was run" in err
    assert not os.path.exists(ledger) or not _charged(ledger)["releases"]   # never charged


def _pool(folder, python_dir):
    """Beam's worker pool whose workers' ``python`` is the first on ``python_dir``'s PATH."""
    port = free_loopback_port()
    env = dict(os.environ, PYTHONPATH=ROOT,
               PATH=python_dir + os.pathsep + os.environ.get("PATH", ""))
    log = open(os.path.join(str(folder), "pool.log"), "w")
    pool = subprocess.Popen([sys.executable, "-m", "apache_beam.runners.worker.worker_pool_main",
                             f"--service_port={port}"], env=env, stdout=log,
                            stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return pool, port
        except OSError:
            time.sleep(0.3)
    sessions.stop(pool.pid)
    pytest.fail("the worker pool did not start")


@pytest.mark.engine_faults
def test_a_job_that_hangs_is_stopped_at_the_timeout(flink_jar, tmp_path):
    """A pool whose ``python`` has no Beam (the PATH pitfall): every worker dies at start
    and Flink waits for one forever; ``--timeout`` ends it."""
    stub = tmp_path / "bin"
    stub.mkdir()
    (stub / "python").write_text("#!/bin/sh\necho 'No module named apache_beam' >&2\nexit 1\n")
    (stub / "python").chmod(0o755)
    pool, port = _pool(tmp_path, str(stub))
    try:
        spec, out, ledger = _spec_with_ledger(tmp_path)
        run = _start(["run", spec, "--timeout", "60", "--", "--runner=FlinkRunner",
                      "--flink_master=[local]", "--environment_type=EXTERNAL",
                      f"--environment_config=localhost:{port}"], str(tmp_path))
        code, err, left = _finish(run)
    finally:
        sessions.stop(pool.pid)
    _assert_failed_cleanly(code, err, left, out, ["did not finish within 60 s"])
    assert code == 1
    assert _charged(ledger)["releases"]          # reading had started: the charge stays


@pytest.mark.engine_faults
def test_a_worker_that_dies(flink_jar, tmp_path):
    from thresher.pipelines.running.engine_check import synthetic
    pool, port = _pool(tmp_path, os.path.dirname(sys.executable))
    try:
        spec, out, ledger = _spec_with_ledger(tmp_path)
        records = str(tmp_path / "records.parquet")
        synthetic(records, 2_000_000)            # a job that outlives the kill
        with open(spec, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
        doc["input"]["path"] = records
        with open(spec, "w", encoding="utf-8") as handle:
            yaml.safe_dump(doc, handle, sort_keys=False)
        run = _start(["run", spec, "--timeout", "150", "--", "--runner=FlinkRunner",
                      "--flink_master=[local]", "--environment_type=EXTERNAL",
                      f"--environment_config=localhost:{port}"], str(tmp_path))

        def worker():
            for pid in sessions.members(pool.pid):
                try:
                    with open(f"/proc/{pid}/cmdline", "rb") as handle:
                        if b"SdkHarness" in handle.read():
                            return pid
                except OSError:
                    pass
            return None
        victim = _wait_for(worker, run)
        assert victim, "no SDK worker started"
        os.kill(victim, 9)            # at once: the job reads 2e6 rows for several seconds
        code, err, left = _finish(run)
    finally:
        sessions.stop(pool.pid)
    _assert_failed_cleanly(code, err, left, out,
                           ["failed the job", "stopped answering", "did not finish within"])
    assert _charged(ledger)["releases"]

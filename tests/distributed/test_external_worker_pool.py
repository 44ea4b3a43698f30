"""Releases on an EXTERNAL worker pool: the closest stand-in here for a cluster's SDK harness.

A virtual environment gets thresher pip-installed (non-editable, from a copy of the
checkout; ``--system-site-packages`` only lends it Beam, numpy, scipy and pyarrow). In
it, Beam's worker pool (``apache_beam.runners.worker.worker_pool_main``) and the Python
portable job service (``local_job_service_main``) listen on free loopback ports, with a
working directory outside the checkout and no PYTHONPATH, so every SDK worker imports
thresher from the installed package, as a Flink or Spark cluster's workers would. The
installed ``thresher`` console script then runs the quickstart and its
``max_keys_per_user: auto`` variant with ``--runner=PortableRunner
--environment_type=EXTERNAL --environment_config=localhost:PORT``; each release is
checked by :func:`tests.distributed.release_check.check_release` (false-failure
probability < 5e-6 per run, stated there).

Everything is bounded: a worker that cannot start makes a portable job hang, so every
run has a timeout, and the services' process groups are stopped at the end.
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan

from .conftest import ROOT, _wait_for_port, copy_source, free_loopback_port, quickstart_spec
from .release_check import check_release

pytestmark = pytest.mark.slow

RUN_TIMEOUT = 150   # seconds per release; the quickstart takes a few seconds here


def _stop_group(process):
    """SIGTERM, then SIGKILL, to the process group this test started (the pool's SDK
    workers are its children)."""
    if process.poll() is None:
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)
    else:
        try:
            os.killpg(process.pid, signal.SIGKILL)   # leftover workers of a dead pool
        except ProcessLookupError:
            pass


def _start(command, folder, name, env):
    """Start a service on a free loopback port (a few attempts: the port is free when
    chosen, but another process may take it first). Returns (process, port, log path)."""
    log_path = os.path.join(folder, f"{name}.log")
    for attempt in range(3):
        port = free_loopback_port()
        with open(log_path, "w", encoding="utf-8") as log:
            process = subprocess.Popen(command(port), stdout=log, stderr=subprocess.STDOUT,
                                       env=env, cwd=folder, start_new_session=True)
        try:
            _wait_for_port(port, process, log_path)
            return process, port, log_path
        except RuntimeError:
            _stop_group(process)
            if attempt == 2:
                raise


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """(venv python, environment) with thresher pip-installed from a copy of the checkout."""
    folder = tmp_path_factory.mktemp("external")
    source = folder / "checkout"     # pip builds in place; keep the checkout clean
    copy_source(source)
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(venv)],
                   check=True, timeout=120)
    python = str(venv / "bin" / "python")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PATH"] = str(venv / "bin") + os.pathsep + env.get("PATH", "")   # the pool's `python`
    # as README command 1 and .ci/run install it (pip builds the wheel in an isolated
    # build environment); --no-deps: the venv borrows the installed dependencies
    done = subprocess.run([python, "-m", "pip", "install", "--no-deps", "-q", str(source)],
                          capture_output=True, text=True, env=env, cwd=str(folder), timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    where = subprocess.run([python, "-c", "import thresher.pipelines, thresher.transforms; "
                            "print(thresher.pipelines.__file__)"],
                           capture_output=True, text=True, env=env, cwd=str(folder), timeout=120)
    assert where.returncode == 0, where.stderr[-3000:]
    assert where.stdout.strip().startswith(str(venv)), where.stdout   # not the checkout
    return python, env, str(folder)


@pytest.fixture(scope="module")
def services(installed):
    """The worker pool and the job service, from the venv; yields their endpoints."""
    python, env, folder = installed
    pool, pool_port, pool_log = _start(
        lambda port: [python, "-m", "apache_beam.runners.worker.worker_pool_main",
                      f"--service_port={port}"], folder, "worker_pool", env)
    try:
        jobs, job_port, job_log = _start(
            lambda port: [python, "-m", "apache_beam.runners.portability.local_job_service_main",
                          "--port", str(port), "--staging_dir", os.path.join(folder, "staging")],
            folder, "job_service", env)
        try:
            yield {"job": f"localhost:{job_port}", "pool": f"localhost:{pool_port}",
                   "pool_log": pool_log, "job_log": job_log}
        finally:
            _stop_group(jobs)
    finally:
        _stop_group(pool)


def _log(path):
    with open(path, encoding="utf-8", errors="replace") as handle:
        return handle.read()


@pytest.mark.parametrize("bound", [8, "auto"])
def test_release_on_an_external_worker_pool(installed, services, tmp_path, bound):
    python, env, _ = installed
    work = tmp_path / "work"      # the run's working directory, outside the checkout
    work.mkdir()
    spec_path, out, input_path = quickstart_spec(str(work))
    if bound == "auto":
        text = open(spec_path, encoding="utf-8").read()
        assert "max_keys_per_user: 8\n" in text
        with open(spec_path, "w", encoding="utf-8") as handle:
            handle.write(text.replace("max_keys_per_user: 8\n", "max_keys_per_user: auto\n"))
    workers_before = _log(services["pool_log"]).count("Starting worker with command")
    thresher = os.path.join(os.path.dirname(python), "thresher")
    started = time.monotonic()
    try:
        done = subprocess.run(
            [thresher, "run", spec_path, "--", "--runner=PortableRunner",
             f"--job_endpoint={services['job']}", "--environment_type=EXTERNAL",
             f"--environment_config={services['pool']}"],
            capture_output=True, text=True, env=env, cwd=str(work), timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the release did not finish within {RUN_TIMEOUT} s; worker pool log:\n"
                    + _log(services["pool_log"])[-3000:])
    wall = time.monotonic() - started
    assert done.returncode == 0, (done.stderr[-3000:], _log(services["pool_log"])[-2000:])
    # the pool started SDK workers for this job (the work ran there, not in the launcher)
    assert _log(services["pool_log"]).count("Starting worker with command") > workers_before
    with open(os.path.join(out, "release_report.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    spec = spec_mod.load(spec_path)
    if bound == "auto":
        chosen = report["bounding"]["max_keys_per_user"]
        assert report["bounding"]["chosen_by"] == "exponential_mechanism"
        assert chosen in report["bounding"]["candidates"]
        plan_report = make_plan(spec).report(chosen_bound=chosen)
    else:
        plan_report = make_plan(spec).report()
    check_release(out, plan_report, input_path)
    print(f"external worker pool, bound {bound}: {wall:.1f} s wall")

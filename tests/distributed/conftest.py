"""Fixtures for running the quickstart release on Beam's portable runners."""
import os
import socket
import subprocess
import sys
import time

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "configs", "examples", "quickstart.yaml")


# What a source checkout needs for `pip install` / `--setup_file` (setup.py maps the three
# folders to thresher.accounting, .pipelines and .transforms; src/thresher is the package).
SOURCE_FILES = ("setup.py", "pyproject.toml", "README.md")
SOURCE_FOLDERS = ("src", "accounting", "transforms", "pipelines")


def copy_source(dest):
    """Copy what building thresher needs into the folder ``dest`` (made if missing)."""
    import shutil
    os.makedirs(dest, exist_ok=True)
    for name in SOURCE_FILES:
        shutil.copy(os.path.join(ROOT, name), dest)
    for folder in SOURCE_FOLDERS:
        shutil.copytree(os.path.join(ROOT, folder), os.path.join(str(dest), folder),
                        ignore=shutil.ignore_patterns("__pycache__"))


def quickstart_spec(folder, output=None):
    """The bundled quickstart spec, with an absolute input path and the output in
    ``folder``; returns (spec path, output path, input path)."""
    with open(QUICKSTART, encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)
    input_path = os.path.join(ROOT, spec["input"]["path"])
    spec["input"]["path"] = input_path
    spec["output"]["path"] = output or os.path.join(str(folder), "out")
    path = os.path.join(str(folder), "quickstart.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    return path, spec["output"]["path"], input_path


@pytest.fixture
def quickstart(tmp_path):
    return quickstart_spec(tmp_path)


@pytest.fixture
def worker_env(monkeypatch):
    """Subprocess workers (multi_processing, the job service) import thresher from the
    checkout, wherever pytest was started."""
    path = os.environ.get("PYTHONPATH")
    monkeypatch.setenv("PYTHONPATH", ROOT + (os.pathsep + path if path else ""))


def free_loopback_port():
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port, process, log_path, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"the job service exited with {process.returncode}:\n"
                               + open(log_path, encoding="utf-8", errors="replace").read()[-3000:])
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            time.sleep(0.2)
    raise RuntimeError(f"the job service did not listen on port {port} within {timeout:g} s")


@pytest.fixture(scope="module")
def job_service(tmp_path_factory):
    """Beam's Python local job service (the Job API a Flink or Spark job server speaks),
    on a free loopback port; stopped (SIGTERM, then SIGKILL) when the module's tests end.
    Yields (endpoint ``localhost:PORT``, path of its log, its artifact staging folder)."""
    folder = tmp_path_factory.mktemp("job_service")
    log_path = str(folder / "job_service.log")
    env = dict(os.environ)
    env["PYTHONPATH"] = ROOT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    for attempt in range(3):  # the port is free when chosen; another process may take it first
        port = free_loopback_port()
        with open(log_path, "w", encoding="utf-8") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "apache_beam.runners.portability.local_job_service_main",
                 "--port", str(port), "--staging_dir", str(folder / "staging")],
                stdout=log, stderr=subprocess.STDOUT, env=env, cwd=str(folder))
        try:
            _wait_for_port(port, process, log_path)
            break
        except RuntimeError:
            _stop(process)
            if attempt == 2:
                raise
    try:
        yield f"localhost:{port}", log_path, str(folder / "staging")
    finally:
        _stop(process)


def _stop(process):
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=15)

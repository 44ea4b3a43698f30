"""Releases on real Flink and Spark: Beam's job servers built by ``thresher engines fetch
flink spark`` from the runner jars Maven Central serves (pipelines/running/jvm_engines.py).

- ``-m engines`` (every CI run, after .ci/run fetched both): the quickstart through the
  ``thresher`` CLI with only Beam's flags (``--runner=FlinkRunner --flink_master=[local]``,
  ``--runner=SparkRunner --spark_master_url=local[2]``; the CLI adds the cached job-server
  jar), checked by :func:`tests.distributed.release_check.check_release` (false-failure
  probability < 5e-6 per run, stated there); and ``thresher engines check flink spark``
  through the CLI, which must report identical bytes.
- ``-m engines_full`` (every CI run too): the same release everywhere. Under one test
  secret (the test-only ``rng_factory`` of ``pipelines.running.release.run``, through
  ``_release_under_secret.py``), every kind, aggregates with ``clip: auto``, a public key
  list and the automatic bound publish byte-identical ``released.parquet`` and
  ``release_report.json`` on Flink and on Spark as in process. One job server per engine
  serves the whole matrix (``--job_endpoint``), so each case costs its job, not a JVM
  start; the CLI-started job server is what the ``engines`` tests run.

Every run is a subprocess in its own session bounded by a timeout, and every process of
that session (Beam's job server among them) is stopped when it ends, passed or failed
(``pipelines/running/sessions.py``).
"""
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running import engines, sessions
from thresher.pipelines.specs import spec as spec_mod

from .conftest import ROOT, free_loopback_port, quickstart_spec
from .release_check import check_release
from .test_engines_real import DATA, SECRET, _spec_doc

RUN_TIMEOUT = 600        # s per release: a cold JVM and a 2-core machine shared with CI
RELEASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_release_under_secret.py")
HEAVY_HITTERS = os.path.join(ROOT, "configs", "examples", "heavy_hitters.yaml")


def _cached(name):
    path = engines.cached(engines.engine(name))
    if path is None:
        message = f"{name} is not fetched: run `thresher engines fetch {name}` (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)      # never skipped in CI
        pytest.skip(message)
    return path


@pytest.fixture(scope="module")
def flink_jar():
    return _cached("flink")


@pytest.fixture(scope="module")
def spark_jar():
    return _cached("spark")


def bounded(command, cwd, env=None, timeout=RUN_TIMEOUT):
    """Run ``command`` in its own session; (exit code or None past ``timeout``, output,
    pids still alive in the session afterwards: must be none)."""
    process = subprocess.Popen(command, cwd=cwd, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, errors="replace",
                               start_new_session=True)
    try:
        output, _ = process.communicate(timeout=timeout)
        code = process.returncode
    except subprocess.TimeoutExpired:
        code, output = None, ""
    finally:
        left = sessions.members(process.pid)
        sessions.stop(process.pid)
        if process.poll() is None:
            process.kill()
        process.communicate()
    return code, output, left


def _cli(args, cwd, timeout=RUN_TIMEOUT):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return bounded([sys.executable, "-m", "thresher.pipelines.cli"] + args, cwd, env, timeout)


# ---- the quickstart through the CLI, Beam starting the cached job server ----------------

@pytest.mark.engines
@pytest.mark.parametrize("flags", [
    ["--runner=FlinkRunner", "--flink_master=[local]"],
    ["--runner=SparkRunner", "--spark_master_url=local[2]"],
], ids=["flink", "spark"])
def test_quickstart_through_the_cli(flink_jar, spark_jar, tmp_path, flags):
    spec_path, out, input_path = quickstart_spec(tmp_path)
    code, output, left = _cli(["run", spec_path, "--"] + flags, str(tmp_path))
    assert code == 0, output[-3000:]
    assert left == [], "processes left running after the run: " + repr(left)
    check_release(out, make_plan(spec_mod.load(spec_path)).report(), input_path)


@pytest.mark.engines
def test_engines_check_through_the_cli(flink_jar, spark_jar, tmp_path):
    code, output, left = _cli(["engines", "check", "flink", "spark", "--rows", "20000",
                               "--json"], str(tmp_path), timeout=3 * RUN_TIMEOUT)
    assert code == 0, output[-3000:]
    rows = json.loads([line for line in output.splitlines() if line.startswith("[")][-1])
    assert [row["engine"] for row in rows] == ["in-process", "flink", "spark"]
    assert [row["identical"] for row in rows] == [None, True, True]
    assert all(row["rows"] == 20000 and row["workers"] == 1 and row["seconds"] > 0
               for row in rows)
    assert left == []


# ---- one job server per engine for the matrix ------------------------------------------

def _job_server(jar, name, folder):
    """The cached job server, started as Beam would (its flags; loopback job port)."""
    port = free_loopback_port()
    command = ["java"]
    if name == "spark":
        command.append("-Dspark.ui.enabled=false")
    command += ["-jar", jar, "--job-port", str(port), "--artifact-port", "0",
                "--expansion-port", "-1", "--artifacts-dir", str(folder / "artifacts")]
    command += (["--flink-master", "[local]"] if name == "flink"
                else ["--spark-master-url", "local[2]"])
    env = dict(os.environ, SPARK_LOCAL_IP="127.0.0.1")
    log = open(folder / "job_server.log", "w")
    process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=env,
                               start_new_session=True)
    import socket
    import time
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        assert process.poll() is None, open(folder / "job_server.log").read()[-3000:]
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return process, f"localhost:{port}"
        except OSError:
            time.sleep(0.3)
    sessions.stop(process.pid)
    raise AssertionError("the job server did not listen within 120 s")


@pytest.fixture(scope="module")
def job_servers(flink_jar, spark_jar, tmp_path_factory):
    started = {}
    try:
        for name, jar in (("flink", flink_jar), ("spark", spark_jar)):
            started[name] = _job_server(jar, name, tmp_path_factory.mktemp(name))
        yield {name: endpoint for name, (_, endpoint) in started.items()}
    finally:
        for process, _ in started.values():
            sessions.stop(process.pid)
            process.wait(timeout=30)


def _public_keys(folder):
    path = os.path.join(folder, "public_words.parquet")
    if not os.path.exists(path):
        words = pq.read_table(os.path.join(ROOT, "configs/examples/data/quickstart.parquet"),
                              columns=["word"]).column("word").unique().to_pylist()
        pq.write_table(pa.table({"word": sorted(words)[:60] + ["zz-absent-1", "zz-absent-2"]}),
                       path)
    return path


QUICKSTART_ROWS = 60_000     # of the quickstart's 200,000: CI's engine budget (~12 min)


def _quickstart_part():
    """The quickstart's first QUICKSTART_ROWS rows, written once per machine: the engines'
    cost is mostly per job, but each run still reads and shuffles every row."""
    path = os.path.join(DATA, f"quickstart-{QUICKSTART_ROWS}.parquet")
    if not os.path.exists(path):
        os.makedirs(DATA, exist_ok=True)
        table = pq.read_table(os.path.join(ROOT, "configs/examples/data/quickstart.parquet"))
        pq.write_table(table.slice(0, QUICKSTART_ROWS), path + ".tmp")
        os.replace(path + ".tmp", path)
    return path


def _matrix_doc(case):
    """The spec of one case: every kind, the automatic bound, aggregates, public keys."""
    doc = _matrix_doc_full(case)
    if doc["input"]["path"].endswith("configs/examples/data/quickstart.parquet"):
        doc["input"]["path"] = _quickstart_part()
    return doc


def _matrix_doc_full(case):
    if case in ("fixed_bound", "auto_bound", "adaptive", "clip_auto", "quantiles"):
        return _spec_doc(case)
    doc = _spec_doc("fixed_bound")
    if case == "heavy_hitters":
        with open(HEAVY_HITTERS, encoding="utf-8") as handle:
            doc = yaml.safe_load(handle)
        doc["input"]["path"] = os.path.join(ROOT, doc["input"]["path"])
    elif case == "laplace_public_keys":
        os.makedirs(DATA, exist_ok=True)
        doc["input"]["public_keys"] = {"path": _public_keys(DATA)}
        doc["mechanism"] = {"kind": "laplace"}
    elif case in ("laplace", "weighted_gaussian", "weighted_sampling",
                  "sample_and_threshold"):
        doc["mechanism"] = {"kind": case}
    else:
        raise AssertionError(case)
    return doc


CASES = ["fixed_bound", "auto_bound", "laplace", "laplace_public_keys",
         "sample_and_threshold", "weighted_sampling", "weighted_gaussian", "adaptive",
         "heavy_hitters", "quantiles", "clip_auto"]


def _publish(case, folder, beam_args=None):
    """``case`` under SECRET in ``folder`` (spec text the same everywhere, output relative);
    in process when ``beam_args`` is None; (released bytes, report bytes)."""
    os.makedirs(folder, exist_ok=True)
    doc = _matrix_doc(case)
    doc["output"]["path"] = "out"
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    env = dict(os.environ, PYTHONPATH=ROOT)
    command = [sys.executable, RELEASE, path, SECRET.hex()]
    if beam_args is not None:
        command += ["--"] + beam_args
    code, output, left = bounded(command, folder, env)
    assert code == 0, f"{case}: exit {code}\n{output[-3000:]}"
    assert left == [], f"{case}: processes left running: {left}"
    with open(os.path.join(folder, "out", "released.parquet"), "rb") as handle:
        released = handle.read()
    with open(os.path.join(folder, "out", "release_report.json"), "rb") as handle:
        report = handle.read()
    return released, report


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    folder = tmp_path_factory.mktemp("in_process")
    return {case: _publish(case, str(folder / case)) for case in CASES}


def _same(got, want, case):
    released_keys = json.loads(want[1])["released_keys"]
    assert released_keys > 0, f"{case}: the reference release is empty"
    assert got[0] == want[0], f"{case}: released.parquet differs from the in-process run"
    assert got[1] == want[1], (f"{case}: report differs:\n{got[1].decode()[:3000]}\n---\n"
                               f"{want[1].decode()[:3000]}")
    assert SECRET not in got[0] and SECRET not in got[1]
    for word in ("Flink", "flink", "Spark", "spark", "LOOPBACK", "localhost"):
        assert word not in got[1].decode(), f"{case}: the report names the runner ({word})"


@pytest.mark.engines_full
@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("engine", ["flink", "spark"])
def test_engine_publishes_the_in_process_bytes(job_servers, in_process, tmp_path, engine, case):
    runner = "FlinkRunner" if engine == "flink" else "SparkRunner"
    got = _publish(case, str(tmp_path), [f"--runner={runner}",
                                         f"--job_endpoint={job_servers[engine]}",
                                         "--environment_type=LOOPBACK"])
    _same(got, in_process[case], case)


# ---- every listener of a local run on loopback ------------------------------------------

LOOPBACK = ("127.0.0.1", "::1")


def _socket_addresses():
    """{socket inode: (address, port)} of every listening TCP socket of this network
    namespace, from /proc/net/tcp and tcp6 (state 0A is LISTEN)."""
    import ipaddress
    found = {}
    for table, size in (("/proc/net/tcp", 4), ("/proc/net/tcp6", 16)):
        with open(table, encoding="ascii") as handle:
            rows = handle.read().splitlines()[1:]
        for row in rows:
            fields = row.split()
            if fields[3] != "0A":
                continue
            hex_address, hex_port = fields[1].split(":")
            raw = bytes.fromhex(hex_address)
            # the kernel prints each 32-bit word in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            address = ipaddress.ip_address(raw)
            if size == 16 and address.ipv4_mapped:
                address = address.ipv4_mapped
            found[fields[9]] = (str(address), int(hex_port, 16))
    return found


def listeners(pids):
    """{(pid, command, address, port)} of the listening TCP sockets ``pids`` hold."""
    addresses = _socket_addresses()
    found = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/comm", encoding="utf-8") as handle:
                command = handle.read().strip()
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:[") and target[8:-1] in addresses:
                found.add((pid, command) + addresses[target[8:-1]])
    return found


def _run_watching_listeners(args, cwd, poll=0.5, timeout=RUN_TIMEOUT):
    """The CLI run of ``args`` in its own session; while it runs, the listening sockets of
    every process of that session (the launcher, Beam's job server JVM and whatever it
    starts) are read every ``poll`` s. Returns (exit code or None, output, listeners)."""
    import tempfile
    import time
    env = dict(os.environ, PYTHONPATH=ROOT)
    seen = set()
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as log:
        process = subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli"] + args,
                                   cwd=cwd, env=env, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while process.poll() is None and time.monotonic() < deadline:
                seen |= listeners(sessions.members(process.pid))
                time.sleep(poll)
            code = process.poll()
        finally:
            sessions.stop(process.pid)
            if process.poll() is None:
                process.kill()
            process.wait()
        log.seek(0)
        output = log.read()
    return code, output, seen


@pytest.mark.engines
@pytest.mark.parametrize("flags", [
    ["--runner=FlinkRunner", "--flink_master=[local]"],
    ["--runner=SparkRunner", "--spark_master_url=local[2]"],
], ids=["flink", "spark"])
def test_a_local_run_listens_on_loopback_only(flink_jar, spark_jar, tmp_path, flags):
    """Issue 41: with a local master, every port the run opens (the job server's job and
    artifact ports, Flink's local cluster or Spark's driver, Beam's Fn API servers, the
    launcher's LOOPBACK worker) is bound to 127.0.0.1 or ::1, none to every interface."""
    spec_path, out, input_path = quickstart_spec(tmp_path)
    code, output, seen = _run_watching_listeners(["run", spec_path, "--"] + flags,
                                                 str(tmp_path))
    assert code == 0, output[-3000:]
    assert any(command == "java" for _, command, _, _ in seen), \
        "no listener of the job server was seen: " + repr(sorted(seen))
    wide = sorted(entry for entry in seen if entry[2] not in LOOPBACK)
    assert wide == [], f"listening beyond loopback ({len(wide)} of {len(seen)}): {wide}"
    check_release(out, make_plan(spec_mod.load(spec_path)).report(), input_path)


@pytest.mark.parametrize("name,flags,local", [
    ("flink", ["--runner=FlinkRunner", "--flink_master=[local]"], True),
    ("flink", ["--runner=FlinkRunner"], True),                       # Beam's default [auto]
    ("flink", ["--runner=FlinkRunner", "--flink_master=flink.example:8081"], False),
    ("spark", ["--runner=SparkRunner", "--spark_master_url=local[2]"], True),
    ("spark", ["--runner=SparkRunner", "--spark_master_url=spark://spark.example:7077"], False),
])
def test_loopback_is_forced_only_for_a_local_master(tmp_path, monkeypatch, name, flags, local):
    """A user-given cluster master keeps the engine's own addresses: no FLINK_CONF_DIR,
    no SPARK_LOCAL_IP; a local one gets them (and the loopback job-server jar)."""
    monkeypatch.delenv("FLINK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    assert engines.loopback_environment(name, flags, str(tmp_path)) is local
    variable = "FLINK_CONF_DIR" if name == "flink" else "SPARK_LOCAL_IP"
    assert (variable in os.environ) is local
    if local and name == "flink":
        with open(os.path.join(os.environ[variable], "flink-conf.yaml"), encoding="utf-8") as f:
            conf = dict(line.split(": ", 1) for line in f.read().splitlines())
        assert conf == {key: "127.0.0.1" for key in ("rest.address", "rest.bind-address",
                                                     "jobmanager.rpc.address",
                                                     "jobmanager.bind-host",
                                                     "taskmanager.host",
                                                     "taskmanager.bind-host")}
    if local and name == "spark":
        assert os.environ[variable] == "127.0.0.1"


@pytest.mark.engines
def test_a_cluster_master_gets_the_plain_job_server(flink_jar, spark_jar, monkeypatch):
    """Only a local master runs the job server whose gRPC servers bind loopback."""
    monkeypatch.delenv("FLINK_CONF_DIR", raising=False)
    monkeypatch.delenv("SPARK_LOCAL_IP", raising=False)
    remote = engines.complete_beam_args(["--runner=FlinkRunner",
                                         "--flink_master=flink.example:8081"])
    assert f"--flink_job_server_jar={flink_jar}" in remote
    local = engines.complete_beam_args(["--runner=SparkRunner", "--spark_master_url=local[2]"])
    jar = [arg for arg in local if arg.startswith("--spark_job_server_jar=")]
    assert jar and jar[0].endswith("-thresher-loopback.jar")
    remote = engines.complete_beam_args(["--runner=SparkRunner",
                                         "--spark_master_url=spark://spark.example:7077"])
    assert f"--spark_job_server_jar={spark_jar}" in remote


def test_the_workers_pool_listens_on_loopback_only(tmp_path):
    """The pool thresher starts for ``--workers N`` (pipelines/running/worker_pool.py)
    binds localhost only: Beam's worker_pool_main alone listens on ``[::]`` (what it did
    before loopback_pool). No engine needed: the pool is started and its listening sockets
    read from /proc while it runs."""
    from thresher.pipelines.running import worker_pool
    pool = worker_pool.start(str(tmp_path))
    try:
        port = int(pool.endpoint.rsplit(":", 1)[1])
        found = [entry for entry in listeners([pool.process.pid]) if entry[3] == port]
        assert found, f"the pool holds no listener on {port}"
        assert all(entry[2] in LOOPBACK for entry in found), found
    finally:
        pool.stop()

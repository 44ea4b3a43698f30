"""The execution engines a release can be submitted to, fetched once into a cache.

    thresher engines fetch flink|spark|prism [...]

Beam's portable runners need a binary beside the Python SDK: Flink and Spark a Java
job-server jar (Maven Central, ``org.apache.beam:beam-runners-flink-<X.Y>-job-server``,
``beam-runners-spark-3-job-server``), Prism a Go program (``go install`` of Beam's Go
module). Left to itself Beam downloads them at run time from hard-coded addresses, which a
machine that reaches only the package registries cannot; so thresher fetches them with the
registries' own clients (``mvn``, ``go``), of exactly the SDK's version (the Job API is
not stable across versions: SDK and job server must match), into

    $THRESHER_ENGINES_DIR, else ${XDG_CACHE_HOME:-~/.cache}/thresher/engines/<beam version>/

and records each file's sha256 in ``<engine>.json`` beside it. Every use re-hashes the file
and compares (a cache is a place anyone can write to); a second fetch is a no-op that
verifies. Each client runs with a time limit and its output is shown as progress lines.

``thresher run SPEC -- --runner=FlinkRunner ...`` then gets ``--flink_job_server_jar`` (and
``--spark_job_server_jar``, ``--prism_location``) from the cache when the user gave none;
with nothing cached the run stops before any input is read, naming the flag and the fetch
command (:func:`complete_beam_args`).
"""
import dataclasses
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

from thresher.pipelines.errors import ThresherError
from thresher.pipelines.running import jvm_engines

MAVEN_TIMEOUT = 900      # s: one job-server jar is ~100-250 MB
GO_TIMEOUT = 1800        # s: Prism compiles from source; ~5-10 min on 2 busy cores
HEARTBEAT = 30           # s between "still running" lines while a client is quiet
PRISM_PACKAGE = "github.com/apache/beam/sdks/v2/go/cmd/prism"


class EngineError(ThresherError):
    """An engine cannot be fetched or used; the message says what to do (exit code 2)."""


@dataclasses.dataclass(frozen=True)
class Engine:
    """One engine: what to fetch, and the Beam flag that names it."""
    name: str          # the cache entry: flink-2.2, spark-3, prism
    flag: str          # the Beam option that points the runner at the file
    source: str        # Maven G:A:V or Go package@version
    file_name: str     # the file in the cache folder
    fetch_words: str   # what follows `thresher engines fetch`


def beam_version():
    import apache_beam  # heavy: apache_beam
    return apache_beam.__version__


def default_flink_version():
    """The Flink major.minor fetched unless ``--flink-version`` is given: the newest whose
    Beam runner jar the registry serves (pipelines/running/jvm_engines.py)."""
    return jvm_engines.FLINK_VERSIONS[0]


def flink_versions():
    return list(jvm_engines.FLINK_VERSIONS)


def engine(name, version=None, flink_version=None):
    """The :class:`Engine` for ``flink``, ``spark`` or ``prism`` at Beam ``version``.

    Flink and Spark: the job server built from the newest served runner jar
    (:mod:`jvm_engines`); ``source`` names it and its pins."""
    version = version or beam_version()
    if name in ("flink", "spark"):
        if name == "flink":
            mm = flink_version or default_flink_version()
            if mm not in flink_versions():
                raise EngineError(f"--flink-version {mm}: no Beam Flink runner jar for it is "
                                  f"served by the registry; served: {', '.join(flink_versions())}")
            key = f"flink-{mm}"
            words = "flink" if mm == default_flink_version() else f"flink --flink-version {mm}"
            flag = "flink_job_server_jar"
        else:
            key, words, flag = "spark-3", "spark", "spark_job_server_jar"
        jvm = jvm_engines.candidates(key)[0]
        return Engine(key, flag, jvm.source(), jvm.jar_name, words)
    if name == "prism":
        return Engine("prism", "prism_location", f"{PRISM_PACKAGE}@v{version}", "prism", "prism")
    raise EngineError(f"unknown engine {name!r}; thresher fetches flink, spark and prism")


def cache_dir(version=None):
    root = os.environ.get("THRESHER_ENGINES_DIR")
    if not root:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "thresher", "engines")
    return os.path.join(root, version or beam_version())


def sha256_of(path):
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _manifest_path(folder, eng):
    return os.path.join(folder, f"{eng.name}.json")


def _check_sha(path, expected, manifest, eng):
    if not os.path.isfile(path):
        raise EngineError(f"{path} is missing though {manifest} records it; run "
                          f"thresher engines fetch {eng.fetch_words}")
    actual = sha256_of(path)
    if actual != expected:
        raise EngineError(f"{path} has sha256 {actual}, not the {expected} recorded when it "
                          f"was fetched: it changed since; remove it and run "
                          f"thresher engines fetch {eng.fetch_words}")


def record(eng, folder=None):
    """The cache record of ``eng`` (a dict) or None when it was never fetched here."""
    manifest = _manifest_path(folder or cache_dir(), eng)
    if not os.path.exists(manifest):
        return None
    try:
        with open(manifest, encoding="utf-8") as handle:
            found = json.load(handle)
        if not isinstance(found.get("file"), str) or not isinstance(found.get("sha256"), str):
            raise ValueError("no file or sha256")
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise EngineError(f"the cache record {manifest} is unreadable ({exc}); remove it and "
                          f"run thresher engines fetch {eng.fetch_words}") from None
    return found


def cached(eng, folder=None):
    """The verified path of ``eng``'s cached file, or None when it was never fetched.

    EngineError when the file, or any jar of a job server's classpath, differs from the
    sha256 recorded when it was fetched."""
    folder = folder or cache_dir()
    manifest = _manifest_path(folder, eng)
    found = record(eng, folder)
    if found is None or found.get("source") != eng.source:
        return None     # never fetched, or fetched for another version: not this one
    path = os.path.join(folder, found["file"])
    _check_sha(path, found["sha256"], manifest, eng)
    jars = found.get("jars", {})
    if not isinstance(jars, dict):
        raise EngineError(f"the cache record {manifest} is unreadable (jars); remove it and "
                          f"run thresher engines fetch {eng.fetch_words}")
    for name, digest in sorted(jars.items()):
        _check_sha(os.path.join(folder, name), digest, manifest, eng)
    if isinstance(found.get("loopback_jar"), str):
        _check_sha(os.path.join(folder, found["loopback_jar"]),
                   str(found.get("loopback_sha256")), manifest, eng)
    return path


def loopback_jar(eng, folder=None):
    """The verified loopback variant of a cached job server (:func:`cached` first), or
    None when the cache predates it (``thresher engines fetch`` adds it)."""
    folder = folder or cache_dir()
    found = record(eng, folder)
    name = found.get("loopback_jar") if found else None
    return os.path.join(folder, name) if isinstance(name, str) else None


def _run_client(command, env, timeout, label, say):
    """Run a registry client, its output shown as progress lines; EngineError on failure
    or past ``timeout`` seconds (the client's process group is stopped)."""
    say(f"{label}: {' '.join(command)}")
    started = time.monotonic()
    try:
        process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                   env=env, text=True, errors="replace", start_new_session=True)
    except FileNotFoundError:
        raise EngineError(f"{command[0]} is not installed; {label} needs it "
                          f"(docs/running.md, Engines)") from None
    lines = []

    def pump():
        for line in process.stdout:
            line = line.rstrip()
            if line:
                lines.append(line)
                say(f"{label}: {line}")

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    while True:
        try:
            process.wait(timeout=HEARTBEAT)
            break
        except subprocess.TimeoutExpired:
            elapsed = time.monotonic() - started
            if elapsed > timeout:
                os.killpg(process.pid, 9)
                process.wait()
                raise EngineError(f"{label}: {command[0]} did not finish within {timeout} s; "
                                  f"stopped it, nothing was cached") from None
            say(f"{label}: still running ({elapsed:.0f} s)")
    reader.join(timeout=10)
    if process.returncode != 0:
        reason = [line for line in lines if "ERROR" in line or "error" in line.lower()]
        raise EngineError(f"{label}: {command[0]} exited with {process.returncode}: "
                          f"{(reason or lines or ['no output'])[0][:400]}")
    say(f"{label}: done in {time.monotonic() - started:.0f} s")


def _tool_version(command):
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    text = (done.stdout + done.stderr).strip().splitlines()
    return text[0].strip() if text else None


def require_java(what):
    """EngineError (exit 2) naming what to install when ``java`` is not on PATH."""
    if shutil.which("java") is None:
        raise EngineError(f"{what} needs Java 17 (`java` is not on PATH): install a JDK or "
                          f"JRE 17, e.g. `apt-get install openjdk-17-jre-headless`")


def _fetch_maven(eng, scratch, folder, say):
    """Resolve the job server's classpath with Maven into ``scratch``, then assemble it in
    ``folder``; returns (manifest jar path, extra record fields)."""
    missing = [tool for tool in ("java", "mvn") if shutil.which(tool) is None]
    if missing:
        raise EngineError(
            f"thresher engines fetch {eng.fetch_words} needs Java 17 and Maven; not on PATH: "
            f"{', '.join(missing)}. Install them (e.g. `apt-get install "
            f"openjdk-17-jdk-headless maven`) and fetch again; nothing was fetched")
    jvm = jvm_engines.candidates(eng.name)[0]
    with open(os.path.join(scratch, "pom.xml"), "w", encoding="utf-8") as handle:
        handle.write(jvm_engines.pom_xml(jvm))
    _run_client(jvm_engines.maven_command(scratch, os.path.join(scratch, "lib")),
                dict(os.environ), MAVEN_TIMEOUT, f"fetch {eng.name}", say)
    path, jars = jvm_engines.assemble(jvm, scratch, folder)
    extra = {"runner": jvm.coordinates, "pins": jvm.pins, "main_class": jvm.main_class,
             "java": _tool_version(["java", "-version"]),
             "maven": _tool_version(["mvn", "-v"]),
             "jars": {name: sha256_of(os.path.join(folder, name)) for name in jars}}
    _add_loopback_jar(eng, folder, extra, say)
    return path, extra


def _add_loopback_jar(eng, folder, entry, say):
    """Write the job server's loopback variant (:func:`jvm_engines.write_loopback_jar`) and
    record it in ``entry``: its name and sha256, the rewritten class's jar among the jars."""
    jvm = jvm_engines.candidates(eng.name)[0]
    try:
        name, patch = jvm_engines.write_loopback_jar(folder, jvm)
    except (ValueError, KeyError, OSError) as exc:
        say(f"{eng.name}: no loopback variant of the job server ({exc}): a local run's "
            f"Beam gRPC servers will listen on every interface")
        return
    entry["jars"][patch] = sha256_of(os.path.join(folder, patch))
    entry["loopback_jar"] = name
    entry["loopback_sha256"] = sha256_of(os.path.join(folder, name))


def _fetch_go(eng, scratch, say):
    env = dict(os.environ)
    env["GOBIN"] = scratch
    env.setdefault("GOFLAGS", "-buildvcs=false")
    env.setdefault("CGO_ENABLED", "0")      # a static binary: no C toolchain needed
    # go install PACKAGE@VERSION checks every module against the checksum database
    _run_client(["go", "install", eng.source], env, GO_TIMEOUT, f"fetch {eng.name}", say)
    path = os.path.join(scratch, "prism")
    if not os.path.isfile(path):
        raise EngineError(f"fetch {eng.name}: go install finished but {path} is not there")
    return path


def fetch(eng, folder=None, say=None):
    """Fetch ``eng`` into the cache unless a verified copy is there; returns its path."""
    say = say or (lambda line: print(f"thresher: {line}", file=sys.stderr, flush=True))
    folder = folder or cache_dir()
    path = cached(eng, folder)
    if path is not None:
        found = record(eng, folder)
        if eng.name != "prism" and "loopback_jar" not in found:
            _add_loopback_jar(eng, folder, found, say)   # a cache from before it existed
            if "loopback_jar" in found:
                manifest = _manifest_path(folder, eng)
                with open(manifest + ".tmp", "w", encoding="utf-8") as handle:
                    json.dump(found, handle, indent=2)
                os.replace(manifest + ".tmp", manifest)
                say(f"{eng.name}: added {found['loopback_jar']} (Beam's gRPC servers on "
                    f"the address they are given, for local runs)")
        extra = len(found.get("jars", {}))
        say(f"{eng.name}: {path} already fetched, sha256 verified"
            + (f" (and the {extra} jars of its classpath)" if extra else ""))
        return path
    os.makedirs(folder, exist_ok=True)
    scratch = tempfile.mkdtemp(prefix=f".{eng.name}-", dir=folder)
    try:
        if eng.name == "prism":
            got, extra = _fetch_go(eng, scratch, say), {}
            final = os.path.join(folder, eng.file_name)
            os.replace(got, final)
            os.chmod(final, 0o755)
        else:
            final, extra = _fetch_maven(eng, scratch, folder, say)
        digest = sha256_of(final)
        entry = {"engine": eng.name, "source": eng.source, "file": eng.file_name,
                 "sha256": digest, "bytes": os.path.getsize(final), **extra}
        manifest = _manifest_path(folder, eng)
        with open(manifest + ".tmp", "w", encoding="utf-8") as handle:
            json.dump(entry, handle, indent=2)
        os.replace(manifest + ".tmp", manifest)   # the record last: a half fetch has none
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    jars = len(entry.get("jars", {}))
    say(f"{eng.name}: cached {final} ({entry['bytes']} bytes, sha256 {digest})"
        + (f" and its classpath of {jars} jars, each sha256 recorded in "
           f"{_manifest_path(folder, eng)}" if jars else ""))
    return final


_RUNNER_ENGINE = {"flinkrunner": "flink", "sparkrunner": "spark", "prismrunner": "prism"}


def _given(beam_args, flag):
    """Whether the user wrote ``--flag`` (as ``--flag=V`` or ``--flag V``)."""
    return any(arg == f"--{flag}" or arg.startswith(f"--{flag}=") for arg in beam_args)


def job_server_flags(name, beam_args):
    """What a job server thresher's cache starts needs besides its jar: Flink 1.19 (the
    only Flink whose runner jar is served), no Java expansion service (a thresher release
    has no cross-language transform; it would be one more listening port), Spark's UI
    off; each only when the user gave none."""
    extra = []
    if name == "flink" and not _given(beam_args, "flink_version"):
        extra.append(f"--flink_version={default_flink_version()}")
    if not _given(beam_args, "expansion_port"):
        extra.append("--expansion_port=-1")
    if name == "spark":
        extra.append("--job_server_jvm_property=-Dspark.ui.enabled=false")
    return extra


def check_ports(beam_args):
    """EngineError (exit 2) when a port the user gave the job server (``--job_port``,
    ``--artifact_port``, ``--expansion_port``) is taken on loopback: Beam would start the
    job server three times, each failing to bind, and end in an internal error."""
    # heavy: apache_beam
    from apache_beam.options.pipeline_options import JobServerOptions, PipelineOptions
    options = PipelineOptions(list(beam_args)).view_as(JobServerOptions)
    for flag in ("job_port", "artifact_port", "expansion_port"):
        port = getattr(options, flag)
        if not port or port < 0:
            continue
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError as exc:
                raise EngineError(f"--{flag}={port}: the port is in use on this machine "
                                  f"({exc.strerror}); give a free port, or leave the flag out "
                                  f"and Beam picks one; nothing was run") from None


# Flink's local cluster (the MiniCluster inside the job server) binds its REST endpoint,
# blob server, RPC and the task managers' netty shuffle to the wildcard address unless
# told (Flink 1.19 option names, from flink-core's ConfigOptions classes). The job server
# reads them from $FLINK_CONF_DIR/flink-conf.yaml when it is given no --flink-conf-dir
# (Beam's FlinkExecutionEnvironments calls GlobalConfiguration.loadConfiguration()).
LOOPBACK_FLINK_CONF = (
    ("rest.address", "127.0.0.1"),
    ("rest.bind-address", "127.0.0.1"),
    ("jobmanager.rpc.address", "127.0.0.1"),
    ("jobmanager.bind-host", "127.0.0.1"),      # also the blob server's bind address
    ("taskmanager.host", "127.0.0.1"),
    ("taskmanager.bind-host", "127.0.0.1"),     # RPC and the netty shuffle server
)
LOCAL_FLINK_MASTERS = ("[local]", "[auto]")     # Beam's default is [auto]: a local cluster


def loopback_flink_conf(folder=None):
    """The folder of a flink-conf.yaml holding :data:`LOOPBACK_FLINK_CONF` (written once,
    in the engine cache beside the job server; rewritten when it differs)."""
    conf_dir = os.path.join(folder or cache_dir(), "flink-loopback-conf")
    text = "".join(f"{key}: {value}\n" for key, value in LOOPBACK_FLINK_CONF)
    path = os.path.join(conf_dir, "flink-conf.yaml")
    try:
        with open(path, encoding="utf-8") as handle:
            if handle.read() == text:
                return conf_dir
    except OSError:
        pass
    os.makedirs(conf_dir, exist_ok=True)
    with open(path + ".tmp", "w", encoding="utf-8") as handle:
        handle.write(text)
    os.replace(path + ".tmp", path)
    return conf_dir


def loopback_environment(name, beam_args, folder=None):
    """For a local master, the environment the job server inherits from the launcher (Beam
    starts it with ``os.environ``) makes the engine bind to loopback, unless the user set
    the variable: Spark's driver and block manager bind to SPARK_LOCAL_IP, else to the
    address of the host name (a real interface); Flink's local cluster reads
    FLINK_CONF_DIR (:func:`loopback_flink_conf`). A cluster master (``--flink_master=
    host:port``, ``--spark_master_url=spark://...``) is left alone: its task managers /
    executors must reach the job server and driver from other machines. Returns whether
    the master is local (then the job server's loopback variant is started)."""
    # heavy: apache_beam
    from apache_beam.options.pipeline_options import (FlinkRunnerOptions, PipelineOptions,
                                                      SparkRunnerOptions)
    options = PipelineOptions(list(beam_args))
    if name == "spark":
        local = options.view_as(SparkRunnerOptions).spark_master_url.startswith("local")
        if local and not os.environ.get("SPARK_LOCAL_IP"):
            os.environ["SPARK_LOCAL_IP"] = "127.0.0.1"
    else:
        local = options.view_as(FlinkRunnerOptions).flink_master in LOCAL_FLINK_MASTERS
        if local and not os.environ.get("FLINK_CONF_DIR"):
            os.environ["FLINK_CONF_DIR"] = loopback_flink_conf(folder)
    loopback_worker_service()
    return local


def loopback_worker_service():
    """Beam's LOOPBACK environment serves the launcher's SDK worker on ``[::]:PORT``
    (``worker_pool_main.BeamFnExternalWorkerPoolServicer.start``, no flag for the
    address) while it hands the job server ``localhost:PORT``: bind what is handed out.
    gRPC binds ``localhost`` on 127.0.0.1 and ::1 alike, so either resolution of the
    name by the job server reaches it. Beam's own ``start`` runs unchanged; only the
    ``grpc`` that module sees makes servers whose wildcard ports bind ``localhost``."""
    from apache_beam.runners.worker import worker_pool_main as pool  # heavy: apache_beam
    if isinstance(pool.grpc, _LoopbackGrpc):
        return
    pool.grpc = _LoopbackGrpc(pool.grpc)


class _LoopbackGrpc:
    """The ``grpc`` module as worker_pool_main sees it: every attribute is grpc's, but
    ``server`` returns a server whose ``add_insecure_port("[::]:N")`` binds
    ``localhost:N`` (checked by
    tests/distributed/test_engines_jvm.py::test_a_local_run_listens_on_loopback_only)."""

    def __init__(self, grpc_module):
        self._grpc = grpc_module

    def __getattr__(self, name):
        return getattr(self._grpc, name)

    def server(self, *args, **kwargs):
        return _LoopbackServer(self._grpc.server(*args, **kwargs))


class _LoopbackServer:
    """A gRPC server whose wildcard listening addresses become ``localhost``."""

    def __init__(self, server):
        self._server = server

    def __getattr__(self, name):
        return getattr(self._server, name)

    def add_insecure_port(self, address):
        for wildcard in ("[::]:", "0.0.0.0:"):
            if address.startswith(wildcard):
                address = "localhost:" + address[len(wildcard):]
        return self._server.add_insecure_port(address)


def complete_beam_args(beam_args, folder=None):
    """``beam_args`` plus the cached engine's flag for a Flink, Spark or Prism run that
    names none (and, for a job server from the cache, :func:`job_server_flags`);
    EngineError (exit 2) naming the flag and the fetch command when nothing is cached.
    Other runners' flags come back unchanged."""
    # heavy: apache_beam
    from apache_beam.options.pipeline_options import (FlinkRunnerOptions, PipelineOptions,
                                                      PortableOptions, PrismRunnerOptions,
                                                      SparkRunnerOptions, StandardOptions)
    options = PipelineOptions(list(beam_args))
    runner = options.view_as(StandardOptions).runner
    if not isinstance(runner, str):
        return list(beam_args)
    name = _RUNNER_ENGINE.get(runner.rsplit(".", 1)[-1].lower())
    if name is None:
        return list(beam_args)
    if name == "flink":
        given = options.view_as(FlinkRunnerOptions).flink_job_server_jar
        mm = options.view_as(FlinkRunnerOptions).flink_version \
            if _given(beam_args, "flink_version") else None
        if given or options.view_as(PortableOptions).job_endpoint:
            return list(beam_args)
        eng = engine("flink", flink_version=mm)
    elif name == "spark":
        given = options.view_as(SparkRunnerOptions).spark_job_server_jar
        eng = engine("spark")
    else:
        given = options.view_as(PrismRunnerOptions).prism_location
        eng = engine("prism")
    if given:
        return list(beam_args)
    if name != "prism" and options.view_as(PortableOptions).job_endpoint:
        return list(beam_args)      # the user runs the job server: no jar needed here
    path = cached(eng, folder)
    if path is None:
        raise EngineError(
            f"--runner={runner} needs --{eng.flag}: Beam would download it from an address "
            f"outside the package registries. Run `thresher engines fetch {eng.fetch_words}` "
            f"once (it caches {eng.source} in {folder or cache_dir()}), or give "
            f"--{eng.flag}=PATH; nothing was run")
    if name == "prism":
        return list(beam_args) + [f"--{eng.flag}={path}"]
    require_java(f"--runner={runner}")
    check_ports(beam_args)
    if loopback_environment(name, beam_args, folder):
        local = loopback_jar(eng, folder)
        if local is None:
            print(f"thresher: the cached {eng.name} job server has no loopback variant: its "
                  f"gRPC servers will listen on every interface; `thresher engines fetch "
                  f"{eng.fetch_words}` adds it", file=sys.stderr, flush=True)
        else:
            path = local
    return list(beam_args) + [f"--{eng.flag}={path}"] + job_server_flags(name, beam_args)

"""``thresher engines fetch`` and the engine flags ``thresher run`` adds (pipelines/running/engines.py).

Fast: nothing is downloaded. The registry clients are stand-ins on PATH (a ``go`` that
writes a file where ``go install`` would put Prism, an ``mvn`` that writes the jar where
``dependency:copy`` would), so what is checked is thresher's side: the cache, the sha256
record and its re-verification, idempotence, time limits, and the exit-2 errors of a run
that names a portable runner with nothing cached. The real fetches and runs are in
tests/distributed/test_engines_real.py (marker engines_full) and .ci/run.
"""
import hashlib
import json
import os
import stat
import subprocess
import sys
import textwrap

import pytest

from thresher.pipelines.running import engines

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
QUICKSTART = os.path.join(ROOT, "configs", "examples", "quickstart.yaml")


def _tool(folder, name, body):
    path = os.path.join(folder, name)
    with open(path, "w", encoding="utf-8") as handle:
        handle.write("#!/bin/sh\n" + textwrap.dedent(body))
    os.chmod(path, os.stat(path).st_mode | stat.S_IEXEC)


@pytest.fixture
def fake_clients(tmp_path):
    """A PATH whose ``go`` and ``mvn`` log each call to calls.log and write a file."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    _tool(str(bin_dir), "go", f"""\
        echo "go $*" >> {log}
        echo "go: downloading github.com/apache/beam/sdks/v2"
        printf 'prism binary for %s' "$3" > "$GOBIN/prism"
    """)
    _tool(str(bin_dir), "mvn", f"""\
        echo "mvn $*" >> {log}
        for a in "$@"; do
          case "$a" in
            -DoutputDirectory=*) out="${{a#-DoutputDirectory=}}" ;;
          esac
        done
        pom=$(dirname "$out")/pom.xml
        mkdir -p "$out"
        for art in $(grep -o '<artifactId>[^<]*</artifactId><version>[^<]*' "$pom" | sed 's#<artifactId>##; s#</artifactId><version>#-#'); do
          printf 'jar %s' "$art" > "$out/$art.jar"
        done
    """)
    env = dict(os.environ)
    env["PATH"] = str(bin_dir) + os.pathsep + env["PATH"]
    env["THRESHER_ENGINES_DIR"] = str(tmp_path / "cache")
    return env, log


def _calls(log):
    return open(log).read().splitlines() if os.path.exists(log) else []


def _cli(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "thresher.pipelines.cli"] + args, capture_output=True,
                          text=True, env=dict(env, PYTHONPATH=ROOT), cwd=cwd, timeout=300)


def _spec(tmp_path):
    text = open(QUICKSTART, encoding="utf-8").read()
    text = text.replace("path: configs/", f"path: {ROOT}/configs/").replace(
        "path: out/quickstart", f"path: {tmp_path}/out")
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    return str(path), str(tmp_path / "out")


@pytest.mark.parametrize("runner,flag,words", [
    ("--runner=PrismRunner", "--prism_location", "thresher engines fetch prism"),
    ("--runner=FlinkRunner", "--flink_job_server_jar", "thresher engines fetch flink"),
    ("--runner=SparkRunner", "--spark_job_server_jar", "thresher engines fetch spark"),
])
def test_a_portable_run_with_nothing_cached_exits_2_naming_the_flag_and_the_fetch(
        tmp_path, runner, flag, words):
    spec, out = _spec(tmp_path)
    env = dict(os.environ, THRESHER_ENGINES_DIR=str(tmp_path / "empty"))
    done = _cli(["run", spec, "--", runner], env, str(tmp_path))
    assert done.returncode == 2, done.stderr[-2000:]
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("thresher: error: ")
    assert flag in last and words in last and "nothing was run" in last
    assert "Traceback" not in done.stderr and "internal error" not in done.stderr
    assert not os.path.exists(out)


def test_fetch_caches_with_a_sha256_and_a_second_fetch_only_verifies(tmp_path, fake_clients):
    env, log = fake_clients
    done = _cli(["engines", "fetch", "prism"], env, str(tmp_path))
    assert done.returncode == 0, done.stderr
    version = engines.beam_version()
    folder = os.path.join(env["THRESHER_ENGINES_DIR"], version)
    binary = os.path.join(folder, "prism")
    assert done.stdout.strip() == f"prism: --prism_location={binary}"
    assert "fetch prism: go install github.com/apache/beam/sdks/v2/go/cmd/prism@v" in done.stderr
    assert "go: downloading" in done.stderr          # the client's output, as progress
    record = json.load(open(os.path.join(folder, "prism.json")))
    assert record["sha256"] == hashlib.sha256(open(binary, "rb").read()).hexdigest()
    assert record["source"] == f"github.com/apache/beam/sdks/v2/go/cmd/prism@v{version}"
    assert os.access(binary, os.X_OK)
    assert _calls(log) == [f"go install github.com/apache/beam/sdks/v2/go/cmd/prism@v{version}"]
    again = _cli(["engines", "fetch", "prism"], env, str(tmp_path))
    assert again.returncode == 0, again.stderr
    assert "already fetched, sha256 verified" in again.stderr
    assert len(_calls(log)) == 1                     # no second go install


def test_fetch_flink_and_spark_resolve_the_runner_jars_with_maven(tmp_path, fake_clients):
    """A pom naming the served runner jar (and the pinned job service), Maven's
    copy-dependencies with strict checksums, a manifest-only jar whose Class-Path is every
    copied jar, and a record of each jar's sha256."""
    import zipfile
    env, log = fake_clients
    done = _cli(["engines", "fetch", "flink", "spark"], env, str(tmp_path))
    assert done.returncode == 0, done.stderr
    calls = [c for c in _calls(log) if c != "mvn -v"]    # -v: the version recorded
    assert len(calls) == 2 and all(c.startswith("mvn -B -C ") for c in calls)
    assert all("maven-dependency-plugin:3.6.1:copy-dependencies" in c for c in calls)
    folder = os.path.join(env["THRESHER_ENGINES_DIR"], engines.beam_version())
    flink = json.load(open(os.path.join(folder, "flink-1.19.json")))
    assert flink["runner"] == "org.apache.beam:beam-runners-flink-1.19:2.70.0"
    assert flink["pins"] == {"org.apache.beam:beam-runners-java-job-service": "2.65.0"}
    assert "flink-1.19-lib/beam-runners-flink-1.19-2.70.0.jar" in flink["jars"]
    assert all(name.startswith("flink-1.19-lib/") for name in flink["jars"])
    for name, digest in flink["jars"].items():
        assert hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest() == digest
    jar = os.path.join(folder, flink["file"])
    assert done.stdout.splitlines()[0] == f"flink-1.19: --flink_job_server_jar={jar}"
    with zipfile.ZipFile(jar) as handle:
        assert handle.namelist() == ["META-INF/MANIFEST.MF"]
        manifest = handle.read("META-INF/MANIFEST.MF").decode().replace("\r\n ", "")
    assert "Main-Class: org.apache.beam.runners.flink.FlinkJobServerDriver" in manifest
    assert "Class-Path: flink-1.19-lib/beam-runners-flink-1.19-2.70.0.jar" in manifest
    assert "Add-Opens: java.base/java.lang " in manifest
    spark = json.load(open(os.path.join(folder, "spark-3.json")))
    assert "flink-1.19-lib/" not in json.dumps(spark["jars"])
    assert "spark-3-lib/spark-core_2.12-3.5.0.jar" in spark["jars"]
    # a second fetch only verifies; a changed jar of the classpath is refused
    again = _cli(["engines", "fetch", "flink"], env, str(tmp_path))
    assert again.returncode == 0 and "already fetched, sha256 verified" in again.stderr
    assert len([c for c in _calls(log) if c != "mvn -v"]) == 2
    with open(os.path.join(folder, "spark-3-lib/spark-core_2.12-3.5.0.jar"), "ab") as handle:
        handle.write(b"!")
    changed = _cli(["engines", "fetch", "spark"], env, str(tmp_path))
    assert changed.returncode == 2 and "changed since" in changed.stderr
    assert "spark-core_2.12-3.5.0.jar" in changed.stderr


def test_fetch_without_java_or_maven_names_what_to_install(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    os.symlink(sys.executable, bin_dir / "python")
    env = dict(os.environ, PATH=str(bin_dir), THRESHER_ENGINES_DIR=str(tmp_path / "c"))
    done = _cli(["engines", "fetch", "flink"], env, str(tmp_path))
    assert done.returncode == 2, done.stderr
    last = done.stderr.strip().splitlines()[-1]
    assert "needs Java 17 and Maven; not on PATH: java, mvn" in last and "apt-get install" in last
    assert "Traceback" not in done.stderr


def test_an_unserved_flink_version_is_refused_with_the_served_ones(tmp_path, fake_clients):
    env, log = fake_clients
    done = _cli(["engines", "fetch", "flink", "--flink-version", "1.20"], env, str(tmp_path))
    assert done.returncode == 2 and "1.19" in done.stderr and not _calls(log)


def test_run_gets_the_cached_flag_unless_the_user_gave_one(tmp_path, fake_clients, monkeypatch):
    env, _ = fake_clients
    assert _cli(["engines", "fetch", "prism", "spark"], env, str(tmp_path)).returncode == 0
    monkeypatch.setenv("THRESHER_ENGINES_DIR", env["THRESHER_ENGINES_DIR"])
    folder = engines.cache_dir()
    args = engines.complete_beam_args(["--runner=PrismRunner", "--environment_type=LOOPBACK"])
    assert args == ["--runner=PrismRunner", "--environment_type=LOOPBACK",
                    f"--prism_location={os.path.join(folder, 'prism')}"]
    mine = ["--runner=PrismRunner", "--prism_location=/opt/prism"]
    assert engines.complete_beam_args(mine) == mine
    spark = engines.complete_beam_args(["--runner=SparkRunner", "--spark_master_url=local[2]"])
    assert spark[2].startswith("--spark_job_server_jar=" + folder)
    assert "--expansion_port=-1" in spark and os.environ["SPARK_LOCAL_IP"] == "127.0.0.1"
    assert "--job_server_jvm_property=-Dspark.ui.enabled=false" in spark
    # a job server the user started (--job_endpoint) needs no jar here
    ep = ["--runner=FlinkRunner", "--job_endpoint=localhost:8099"]
    assert engines.complete_beam_args(ep) == ep
    assert engines.complete_beam_args([]) == []
    assert engines.complete_beam_args(["--runner=DirectRunner"]) == ["--runner=DirectRunner"]


def test_a_cached_file_that_changed_is_refused_by_run_and_by_fetch(tmp_path, fake_clients):
    env, log = fake_clients
    assert _cli(["engines", "fetch", "prism"], env, str(tmp_path)).returncode == 0
    binary = os.path.join(env["THRESHER_ENGINES_DIR"], engines.beam_version(), "prism")
    with open(binary, "ab") as handle:
        handle.write(b"!")
    spec, out = _spec(tmp_path)
    done = _cli(["run", spec, "--", "--runner=PrismRunner"], env, str(tmp_path))
    assert done.returncode == 2, done.stderr[-2000:]
    assert "changed since" in done.stderr and "thresher engines fetch prism" in done.stderr
    assert not os.path.exists(out)
    again = _cli(["engines", "fetch", "prism"], env, str(tmp_path))
    assert again.returncode == 2 and "changed since" in again.stderr
    assert len(_calls(log)) == 1


def test_a_failing_client_caches_nothing_and_exits_2(tmp_path, fake_clients):
    env, _ = fake_clients
    _tool(env["PATH"].split(os.pathsep)[0], "mvn", """\
        echo "[ERROR] Could not find artifact org.apache.beam:x:jar:1 in central"
        exit 1
    """)
    done = _cli(["engines", "fetch", "spark"], env, str(tmp_path))
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1].startswith(
        "thresher: error: fetch spark-3: mvn exited with 1: [ERROR] Could not find artifact")
    folder = os.path.join(env["THRESHER_ENGINES_DIR"], engines.beam_version())
    assert os.listdir(folder) == []      # no record, no jar, no scratch folder


def test_a_client_past_its_time_limit_is_stopped(tmp_path, fake_clients, monkeypatch):
    env, _ = fake_clients
    _tool(env["PATH"].split(os.pathsep)[0], "go", "sleep 60\n")
    monkeypatch.setenv("PATH", env["PATH"])
    monkeypatch.setattr(engines, "GO_TIMEOUT", 1)
    monkeypatch.setattr(engines, "HEARTBEAT", 0.3)
    lines = []
    with pytest.raises(engines.EngineError, match="did not finish within 1 s"):
        engines.fetch(engines.engine("prism"), folder=str(tmp_path / "c"), say=lines.append)
    assert any("still running" in line for line in lines)
    assert os.listdir(tmp_path / "c") == []


def test_engines_check_prints_json_and_exits_1_when_an_engine_differs(monkeypatch, capsys):
    """The comparison and the exit code of ``thresher engines check`` (the runs themselves
    are stand-ins here; the real ones: tests/distributed/test_engines_jvm.py)."""
    from thresher.pipelines import cli
    from thresher.pipelines.running import engine_check
    seen = []

    def fake_run(folder, spec, secret, beam_args, workers, timeout):
        seen.append((secret, beam_args, workers))
        differs = any("SparkRunner" in arg for arg in beam_args)
        return 1.5, b"parquet" + (b"!" if differs else b""), b"{}"
    monkeypatch.setattr(engine_check, "run_one", fake_run)
    monkeypatch.setattr(engines, "complete_beam_args", lambda args, folder=None: list(args))
    code = cli.main(["engines", "check", "flink", "spark", "--rows", "500", "--workers", "2",
                     "--json"])
    rows = json.loads(capsys.readouterr().out)
    assert code == 1
    assert [(r["engine"], r["workers"], r["rows"], r["identical"]) for r in rows] == [
        ("in-process", 1, 500, None), ("flink", 2, 500, True), ("spark", 2, 500, False)]
    assert len({secret for secret, _, _ in seen}) == 1 and len(seen[0][0]) == 32  # one secret
    assert seen[0][1] == []                                 # the reference: in process
    assert "--environment_type=EXTERNAL" in seen[1][1] and "--parallelism=2" in seen[1][1]
    assert "--spark_master_url=local[2]" in seen[2][1]
    same = cli.main(["engines", "check", "flink", "--rows", "500"])
    assert same == 0 and "identical" in capsys.readouterr().out


def test_a_job_port_in_use_is_refused_naming_it(tmp_path, fake_clients, monkeypatch):
    import socket
    env, _ = fake_clients
    assert _cli(["engines", "fetch", "flink"], env, str(tmp_path)).returncode == 0
    monkeypatch.setenv("THRESHER_ENGINES_DIR", env["THRESHER_ENGINES_DIR"])
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(engines.EngineError, match=f"--job_port={port}: the port is in use"):
            engines.complete_beam_args(["--runner=FlinkRunner", f"--job_port={port}"])

"""Releases on a real engine: Beam's Prism runner, fetched by ``thresher engines fetch prism``.

Two markers, both deselected by default (they need the fetched engine, and Prism's start
plus a worker pool take tens of seconds on two cores):

- ``-m engines`` (every CI run, after .ci/run fetched Prism): the quickstart through the
  ``thresher`` CLI with only Beam's flags, ``--runner=PrismRunner`` with LOOPBACK (Python
  work in the launcher) and EXTERNAL workers (Beam's ``worker_pool_main`` in a virtualenv
  with thresher pip-installed, so the work runs in separate processes that import the
  installed package, as a cluster's SDK harness would). The CLI itself adds
  ``--prism_location`` from the cache. Each release is checked by
  :func:`tests.distributed.release_check.check_release` (false-failure probability
  < 5e-6 per run, stated there).
- ``-m engines_full``: the same release everywhere. Under one secret (the test-only
  ``rng_factory`` hook of ``pipelines.running.release.run``: a ``KeyedSource`` that is pickled with
  the stages, so it reaches EXTERNAL workers too), Prism LOOPBACK and Prism EXTERNAL
  publish byte-identical ``released.parquet`` and ``release_report.json`` to the in-process
  runner, for a fixed bound, ``max_keys_per_user: auto``, the adaptive kind, aggregates
  with ``clip: auto`` and per-key quantiles. Nothing runner-specific enters the report (it is compared as bytes).

Every engine run happens inside a private network namespace whose only interface is
loopback (``loopback_netns.py``: Prism and Beam's worker pool listen on all interfaces and
have no flag for the address), as a subprocess bounded by a timeout; the pool runs there
too and is stopped with its workers when the run ends.

Flink and Spark are not here: their Beam job-server jars are not served by this machine's
Maven registry (docs/running.md, Engines, has the exact command and error).
"""
import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.running import release
from thresher.pipelines.running import engines

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.transforms.randomness.keyed_random import KeyedSource

from .conftest import QUICKSTART, ROOT, quickstart_spec
from .release_check import check_release
from .test_external_worker_pool import RUN_TIMEOUT, installed  # noqa: F401

SECRET = b"test-only release secret: 32 B.."


@pytest.fixture(scope="module")
def prism():
    """The Prism binary ``thresher engines fetch prism`` cached (sha256 verified)."""
    path = engines.cached(engines.engine("prism"))
    if path is None:
        message = "Prism is not fetched: run `thresher engines fetch prism` (.ci/run does)"
        if os.environ.get("CI"):
            pytest.fail(message)      # never skipped in CI
        pytest.skip(message)
    return path


NETNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "loopback_netns.py")


def _in_netns(command, env, cwd, pool=None, timeout=RUN_TIMEOUT):
    """Run ``command`` in a loopback-only network namespace (with a worker pool from the
    ``pool`` interpreter, ``{pool}`` its endpoint); the CompletedProcess."""
    wrapper = [sys.executable, NETNS, "--timeout", str(timeout)]
    if pool:
        wrapper += ["--pool", pool, "--pool-log", os.path.join(cwd, "worker_pool.log")]
    return subprocess.run(wrapper + ["--"] + command, capture_output=True, text=True, env=env,
                          cwd=cwd, timeout=timeout + 120)


def _pool_workers(stderr):
    found = re.findall(r"the worker pool started (\d+) SDK workers", stderr)
    return int(found[-1]) if found else 0


@pytest.mark.engines
def test_quickstart_on_prism_loopback(prism, tmp_path):
    spec_path, out, input_path = quickstart_spec(tmp_path)
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = _in_netns([sys.executable, "-m", "thresher.pipelines.cli", "run", spec_path, "--",
                      "--runner=PrismRunner", "--environment_type=LOOPBACK"], env, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    check_release(out, make_plan(spec_mod.load(spec_path)).report(), input_path)


@pytest.mark.engines
def test_quickstart_on_prism_with_external_workers(prism, installed, tmp_path):  # noqa: F811
    """The installed ``thresher`` script, Python work on the pool's SDK workers (which
    import the installed thresher, not the checkout)."""
    python, env, _ = installed
    work = tmp_path / "work"
    work.mkdir()
    spec_path, out, input_path = quickstart_spec(str(work))
    thresher = os.path.join(os.path.dirname(python), "thresher")
    done = _in_netns([thresher, "run", spec_path, "--", "--runner=PrismRunner",
                      "--environment_type=EXTERNAL", "--environment_config={pool}"],
                     env, str(work), pool=python)
    assert done.returncode == 0, done.stderr[-3000:]
    assert _pool_workers(done.stderr) >= 1, done.stderr[-3000:]   # the work ran there
    check_release(out, make_plan(spec_mod.load(spec_path)).report(), input_path)


@pytest.fixture(scope="module")
def python_boot(tmp_path_factory):
    """Beam's Python boot binary, built by ``go install`` of the SDK's version (bounded)."""
    folder = tmp_path_factory.mktemp("boot")
    env = dict(os.environ, GOBIN=str(folder), CGO_ENABLED="0")
    done = subprocess.run(["go", "install", "github.com/apache/beam/sdks/v2/python/container@v"
                           + engines.beam_version()], capture_output=True, text=True, env=env,
                          timeout=engines.GO_TIMEOUT)
    assert done.returncode == 0, done.stderr[-3000:]
    return str(folder / "container")


@pytest.mark.engines_full
def test_quickstart_on_prism_with_process_workers(prism, python_boot, tmp_path):
    """--environment_type=PROCESS: Prism starts Beam's boot binary, which starts the SDK
    worker (this checkout on PYTHONPATH, Beam's default environment, no venv);
    boot_unquoted.sh works around Prism's quoted --id."""
    spec_path, out, input_path = quickstart_spec(tmp_path)
    config = json.dumps({"command": os.path.join(os.path.dirname(NETNS), "boot_unquoted.sh"),
                         "env": {"RUN_PYTHON_SDK_IN_DEFAULT_ENVIRONMENT": "1"}})
    env = dict(os.environ, PYTHONPATH=ROOT, THRESHER_BEAM_BOOT=python_boot)
    done = _in_netns([sys.executable, "-m", "thresher.pipelines.cli", "run", spec_path, "--",
                      "--runner=PrismRunner", "--environment_type=PROCESS",
                      f"--environment_config={config}"], env, str(tmp_path))
    assert done.returncode == 0, done.stderr[-3000:]
    # the boot binary printed the provisioning Prism gave it (PROCESS, not a fallback)
    assert "Provision info:" in done.stdout + done.stderr, done.stderr[-3000:]
    check_release(out, make_plan(spec_mod.load(spec_path)).report(), input_path)


# ---- the same release everywhere (engines_full) ------------------------------------------

def _aggregates_data(folder):
    """Users with 1-3 keys and log-normal amounts (some NaN): input for clip: auto; written
    once per session, so every run's spec is the same text."""
    path = os.path.join(folder, "amounts.parquet")
    if os.path.exists(path):
        return path
    rng = np.random.default_rng(4)
    users, keys, amounts = [], [], []
    for u in range(4000):
        for k in rng.choice(6, size=rng.integers(1, 4), replace=False,
                            p=[.35, .25, .15, .1, .1, .05]):
            for _ in range(rng.integers(1, 4)):
                users.append(u)
                keys.append(f"k{k}")
                amounts.append(float(rng.lognormal(3.0, 1.2)))
    amounts = np.array(amounts)
    amounts[::97] = np.nan
    pq.write_table(pa.table({"uid": users, "key": keys, "amount": amounts}), path)
    return path


DATA = os.path.join(os.environ.get("TMPDIR", "/tmp"), f"thresher-engines-{os.getuid()}")


def _spec_doc(case):
    with open(QUICKSTART, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    doc["input"]["path"] = os.path.join(ROOT, doc["input"]["path"])
    if case == "auto_bound":
        doc["bounding"]["max_keys_per_user"] = "auto"
    elif case == "adaptive":
        doc["mechanism"] = {"kind": "adaptive"}
    elif case == "clip_auto":
        os.makedirs(DATA, exist_ok=True)
        doc["input"] = {"path": _aggregates_data(DATA), "format": "parquet", "user": "uid",
                        "keys": ["key"]}
        doc["privacy"]["delta"] = 1e-6
        doc["bounding"] = {"max_keys_per_user": 3}
        doc["aggregates"] = [{"column": "amount", "statistic": "sum", "clip": "auto"},
                             {"column": "amount", "statistic": "mean", "clip": "auto"}]
        doc["aggregates_auto"] = {"epsilon": 0.5, "quantile": 0.99}
    elif case == "quantiles":
        os.makedirs(DATA, exist_ok=True)
        doc["input"] = {"path": _aggregates_data(DATA), "format": "parquet", "user": "uid",
                        "keys": ["key"]}
        doc["privacy"]["delta"] = 1e-6
        doc["bounding"] = {"max_keys_per_user": 3}
        doc["mechanism"] = {"kind": "quantiles", "column": "amount",
                            "ranks": [0.1, 0.5, 0.9], "domain": [0, 400]}
    return doc


def _publish(case, folder, beam_args=None, pool=None):
    """Run ``case`` under SECRET into ``folder``/out, in this process (``beam_args`` None)
    or in the loopback namespace; (released bytes, report bytes, pool workers started).
    Every run of a case reads the same spec text (the report holds its sha256): the output
    path is relative, each run works in its own folder."""
    os.makedirs(folder, exist_ok=True)
    doc = _spec_doc(case)
    doc["output"]["path"] = "out"
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    workers = None
    if beam_args is None:
        here = os.getcwd()
        os.chdir(folder)
        try:
            release.run(make_plan(spec_mod.load(path)), [], rng_factory=KeyedSource(SECRET))
        finally:
            os.chdir(here)
    else:
        env = dict(os.environ, PYTHONPATH=ROOT)
        done = _in_netns([sys.executable, RELEASE, path, SECRET.hex(), "--"] + beam_args,
                         env, folder, pool=pool)
        assert done.returncode == 0, done.stderr[-3000:]
        workers = _pool_workers(done.stderr)
    with open(os.path.join(folder, "out", "released.parquet"), "rb") as handle:
        released = handle.read()
    with open(os.path.join(folder, "out", "release_report.json"), "rb") as handle:
        report = handle.read()
    return released, report, workers


RELEASE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_release_under_secret.py")
CASES = ["fixed_bound", "auto_bound", "adaptive", "clip_auto", "quantiles"]


@pytest.fixture(scope="module")
def in_process(tmp_path_factory):
    """Each case's release on the default in-process runner: the reference bytes."""
    folder = tmp_path_factory.mktemp("in_process")
    return {case: _publish(case, str(folder / case)) for case in CASES}


def _same(got, want, case):
    released, report, _ = got
    assert len(want[0]) > 300
    assert released == want[0], f"{case}: released.parquet differs from the in-process run"
    assert report == want[1], (f"{case}: report differs:\n{report.decode()[:3000]}\n---\n"
                               f"{want[1].decode()[:3000]}")
    assert SECRET not in released and SECRET not in report
    text = report.decode()
    for word in ("Prism", "prism", "EXTERNAL", "LOOPBACK", "localhost"):
        assert word not in text, f"{case}: the report names the runner ({word})"
    json.loads(text)


@pytest.mark.engines_full
@pytest.mark.parametrize("case", CASES)
def test_prism_loopback_publishes_the_in_process_bytes(prism, in_process, tmp_path, case):
    got = _publish(case, str(tmp_path), ["--runner=PrismRunner", f"--prism_location={prism}",
                                         "--environment_type=LOOPBACK"])
    _same(got, in_process[case], case)


@pytest.mark.engines_full
@pytest.mark.parametrize("case", CASES)
def test_prism_external_workers_publish_the_in_process_bytes(prism, in_process, installed,  # noqa: F811
                                                             tmp_path, case):
    python, _, _ = installed
    got = _publish(case, str(tmp_path), ["--runner=PrismRunner", f"--prism_location={prism}",
                                         "--environment_type=EXTERNAL",
                                         "--environment_config={pool}"], pool=python)
    assert got[2] >= 1          # the pool's SDK workers did the work
    _same(got, in_process[case], case)

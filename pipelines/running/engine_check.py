"""``thresher engines check ENGINE... [--rows N] [--workers N] [--json]``: does an engine
publish what the in-process runner publishes?

What a user runs after fetching an engine or setting up a cluster. It makes synthetic
(user, word) records (:func:`synthetic`), draws one fresh release secret from the OS, and
runs the same release (the quickstart's shape: Gaussian sparse histogram, C = 8,
epsilon = 1, delta = 1e-8) under that secret once in process and once on each engine;
then compares the published bytes, ``released.parquet`` and ``release_report.json``.
Keyed randomness (docs/running.md, "Randomness") makes a correct engine publish the very
same bytes; any difference is a fault of the engine or of thresher on it.

The secret reaches each run as the test hook of :func:`release.run` does (a
``KeyedSource``, pickled with the stages), through the child's stdin, never a command
line or the environment; the records are synthetic and every output is deleted when the
check ends: nothing computed under that secret is published.

Each run is a child process in its own session (``python -m
thresher.pipelines.running.engine_check --child``), bounded by ``--timeout``; the job
server Beam starts, the worker pool and its workers are in that session and are stopped
with it, on success, failure or timeout. ``--workers N`` runs the Python work on N SDK
worker processes (Beam's worker pool, started by the child with this interpreter's
folder first on PATH: :mod:`worker_pool`) and sets the engine's parallelism to N.
"""
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running import engines as engines_mod, sessions
from thresher.pipelines.running.engine_watch import EngineRunError
from thresher.pipelines.running.engines import EngineError

ENGINES = ("prism", "flink", "spark")
IN_PROCESS = "in-process"
DEFAULT_TIMEOUT = 1800.0     # s per run: 1e7 rows on a busy 2-core machine take minutes


def synthetic(path, rows, seed=0):
    """``rows`` (user_id, word) records into the Parquet file ``path``: users' activity
    and words both heavy-tailed (Zipf), as in the quickstart; a function of ``seed``
    (test data, not privacy randomness), vectorised."""
    import numpy as np  # heavy: numpy
    import pyarrow as pa  # heavy: pyarrow
    import pyarrow.parquet as pq  # heavy: pyarrow.parquet
    rng = np.random.default_rng(seed)
    users = max(1, rows // 6)
    vocabulary = pa.array([f"w{index:05d}" for index in range(5000)])
    word_ids = np.minimum(rng.zipf(1.3, size=rows) - 1, len(vocabulary) - 1)
    user_ids = np.minimum(rng.zipf(1.6, size=rows) - 1, users - 1)
    user_ids = (user_ids * 2654435761 + rng.integers(0, users, size=rows)) % users
    table = pa.table({"user_id": pa.array(user_ids.astype(np.int64)),
                      "word": vocabulary.take(pa.array(word_ids))})
    pq.write_table(table, path, row_group_size=500_000)


def spec_text(input_path):
    """The release every run makes: the same text everywhere (the report holds its
    sha256), output relative to each run's own folder."""
    return (f"name: engines_check\n"
            f"input: {{path: {json.dumps(input_path)}, format: parquet, user: user_id, "
            f"keys: [word]}}\n"
            f"privacy: {{epsilon: 1.0, delta: 1.0e-8}}\n"
            f"bounding: {{max_keys_per_user: 8}}\n"
            f"mechanism: {{kind: gaussian, pre_threshold: 1}}\n"
            f"output: {{path: out}}\n")


def engine_args(engine, workers):
    """Beam's flags for one engine on this machine, its Python work on ``workers`` SDK
    workers ({pool} is replaced by the worker pool's endpoint)."""
    if engine == "prism":
        args = ["--runner=PrismRunner"]
    elif engine == "flink":
        args = ["--runner=FlinkRunner", "--flink_master=[local]", f"--parallelism={workers}"]
    elif engine == "spark":
        args = ["--runner=SparkRunner", f"--spark_master_url=local[{workers}]"]
    else:
        raise EngineError(f"unknown engine {engine!r}; thresher engines check runs "
                          f"{', '.join(ENGINES)}")
    if workers == 1:
        return args + ["--environment_type=LOOPBACK"]
    return args + ["--environment_type=EXTERNAL", "--environment_config={pool}",
                   f"--sdk_worker_parallelism={workers}"]


def _stop_session(process):
    """Every process of the child's session (job server, pool, workers), then the child."""
    sessions.stop(process.pid)
    try:
        process.wait(timeout=10)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


def run_one(folder, spec, secret, beam_args, workers, timeout):
    """One release in a child process under ``secret``; (seconds, released bytes, report
    bytes). EngineRunError (exit 1) with the child's last lines when it fails or exceeds
    ``timeout``."""
    os.makedirs(folder, exist_ok=True)
    log_path = os.path.join(folder, "run.log")
    command = [sys.executable, "-m", "thresher.pipelines.running.engine_check", "--child",
               spec, str(workers), "--"] + list(beam_args)
    started = time.monotonic()
    with open(log_path, "w", encoding="utf-8") as log:
        child = subprocess.Popen(command, cwd=folder, stdin=subprocess.PIPE, stdout=log,
                                 stderr=subprocess.STDOUT, start_new_session=True)
        try:
            child.stdin.write(secret.hex().encode() + b"\n")
            child.stdin.close()
            rc = child.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            _stop_session(child)
    seconds = time.monotonic() - started
    if rc != 0:
        with open(log_path, encoding="utf-8", errors="replace") as handle:
            tail = [line for line in handle.read().splitlines() if line.strip()][-5:]
        what = f"did not finish within {timeout:g} s (stopped)" if rc is None \
            else f"failed (exit {rc})"
        raise EngineRunError(f"the run {' '.join(beam_args) or 'in process'} {what}: "
                          + " | ".join(tail)[-1500:])
    out = os.path.join(folder, "out")
    with open(os.path.join(out, "released.parquet"), "rb") as handle:
        released = handle.read()
    with open(os.path.join(out, "release_report.json"), "rb") as handle:
        report = handle.read()
    return seconds, released, report


def check(engines_wanted, rows, workers, timeout=DEFAULT_TIMEOUT, say=None, keep=None):
    """Run the check; a list of {"engine", "workers", "rows", "seconds", "identical"}, the
    in-process reference first (its ``identical`` is None)."""
    say = say or (lambda line: print(f"thresher: {line}", file=sys.stderr, flush=True))
    for name in engines_wanted:      # refuse before any work: unknown or not fetched
        engine_args(name, workers)
        engines_mod.complete_beam_args(engine_args(name, 1))
    root = keep or tempfile.mkdtemp(prefix="thresher-engines-check-")
    try:
        data = os.path.join(root, "records.parquet")
        say(f"writing {rows:,} synthetic records to {data}")
        synthetic(data, rows)
        secret = os.urandom(32)          # one fresh secret for every run; never published
        results = []
        reference = None
        for name in (IN_PROCESS,) + tuple(engines_wanted):
            folder = os.path.join(root, name)
            os.makedirs(folder, exist_ok=True)
            spec = os.path.join(folder, "spec.yaml")
            with open(spec, "w", encoding="utf-8") as handle:
                handle.write(spec_text(data))
            args = [] if name == IN_PROCESS else engine_args(name, workers)
            say(f"{name}: running the release ({workers if args else 1} worker"
                f"{'s' if args and workers > 1 else ''})")
            seconds, released, report = run_one(folder, spec, secret, args,
                                                workers if args else 1, timeout)
            if reference is None:
                reference = (released, report)
                identical = None
            else:
                identical = released == reference[0] and report == reference[1]
            results.append({"engine": name, "workers": workers if args else 1, "rows": rows,
                            "seconds": round(seconds, 2), "identical": identical})
            say(f"{name}: {seconds:.1f} s"
                + ("" if identical is None else
                   ", the same bytes" if identical else ", DIFFERENT bytes"))
        return results
    finally:
        if keep is None:
            shutil.rmtree(root, ignore_errors=True)


def format_results(results):
    lines = [f"{'engine':<12}{'workers':>8}{'rows':>14}{'seconds':>10}  published bytes"]
    for row in results:
        same = ("(reference)" if row["identical"] is None else
                "identical" if row["identical"] else "DIFFERENT")
        lines.append(f"{row['engine']:<12}{row['workers']:>8}{row['rows']:>14,}"
                     f"{row['seconds']:>10.1f}  {same}")
    return "\n".join(lines)


def _child(argv):
    """In the run's folder: the release under the secret read from stdin."""
    spec_path, workers = argv[0], int(argv[1])
    beam_args = argv[argv.index("--") + 1:] if "--" in argv else []
    secret = bytes.fromhex(sys.stdin.readline().strip())
    from thresher.pipelines.running import engines, release, worker_pool  # heavy: apache_beam
    from thresher.pipelines.specs import spec as spec_mod  # heavy: pyarrow
    from thresher.transforms.randomness.keyed_random import KeyedSource  # heavy: apache_beam
    pool = None
    if any("{pool}" in arg for arg in beam_args):
        pool = worker_pool.start(os.getcwd())
        beam_args = [arg.replace("{pool}", pool.endpoint) for arg in beam_args]
    try:
        beam_args = engines.complete_beam_args(beam_args)
        release.run(make_plan(spec_mod.load(spec_path)), beam_args,
                    rng_factory=KeyedSource(secret))
    finally:
        if pool is not None:
            pool.stop()
    return 0


if __name__ == "__main__":
    if sys.argv[1:2] == ["--child"]:
        sys.exit(_child(sys.argv[2:]))
    raise SystemExit("thresher.pipelines.running.engine_check is run by `thresher engines check`")

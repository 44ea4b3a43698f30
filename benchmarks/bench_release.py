"""Side-by-side speed of a private release: thresher, PipelineDP and the in-process floor.

Issue #8. One run generates (or reuses) the data, then measures, each in a fresh process:

- ``thresher run`` end to end (process start to report written) for every mechanism kind
  present, with a fixed ``max_keys_per_user`` and with ``auto`` (when ChooseContributionBound
  exists), on Beam's default local runner (in-process FnApiRunner);
- PipelineDP 0.3.1 ``DPEngine`` + ``BeamBackend`` on the same runner, data and (epsilon,
  delta): COUNT with its defaults (Laplace noise, truncated-geometric partition selection),
  ``max_partitions_contributed`` = C, ``max_contributions_per_partition`` = 1, at each of
  ``--peer-rows`` (default 1e5 and 1e6 rows; PipelineDP needs about a minute for 1e6 rows
  here), with a fixed + per-row fit of CPU seconds from the two largest sizes;
- the in-process numpy/pyarrow floor: read, exact identity (dictionary codes), de-duplicate
  (user, key), keep C random keys per user, count per key, noise and threshold, write the
  released keys, in one process with no Beam (see :func:`floor`); timed as thresher is,
  the whole process (start-up and imports included, output written): the ratio column of
  the thresher rows is thresher's wall (CPU) over the floor process's wall (CPU);
- a scaling run over ``--scaling`` row counts, and a key-cardinality run over ``--keys``
  distinct keys (peak RSS must stay flat as keys grow).

Peak RSS is ``getrusage(RUSAGE_CHILDREN).ru_maxrss`` of a small wrapper process that runs
the measured command (includes every process the command starts). Every figure is
printed with the 1-minute load average at its start and end: the machine is shared.

Data: :func:`benchmarks.datagen.generate` with ``users = vocabulary = rows / 10``,
``zipf_a = 1.1``, ``user_tail = 0.8`` and ``--seed`` (default 8), Parquet (zstd, 100k-row
row groups), cached under ``--data-dir`` (default ``benchmarks/data``, not committed).
The key-cardinality data keep the user column of the main data set and replace the key by
``k<i>`` with i = a seeded permutation of the rows modulo K (exactly K distinct keys).

- with ``--compare REV[,REV...]``: older commits installed beside this checkout, each in
  its own virtualenv (``git archive REV`` + ``pip install``, cached under
  ``--data-dir``/compare), and ``thresher run`` of each and of this checkout on the same
  data and spec (``--rows``, gaussian, ``--compare-bound``), taken in turns for
  ``--compare-rounds`` rounds (every case within each round): wall, CPU and peak RSS side
  by side (see :func:`compare_table`); each ratio is given as the ratio of the medians and,
  paired, as the median of the per-round ratios. ``--compare-growth 3e7,1e8`` adds the
  first case at those row counts (each commit's time there over its time at ``--rows``)
  and ``--compare-heavy fixed,auto,l1,aggregates`` the heavy-user runs of
  ``benchmarks/heavy_modes.py`` (exit code, CPU, peak RSS), in the same rounds: issue 43's
  figures side by side in one run. This checkout runs from a clean virtualenv of its own too
  (:func:`install_checkout`: the same third-party packages as the compared commits), and
  the floor after each of its runs of a fixed bound, with every commit's ratio to it.

    python benchmarks/bench_release.py                   # everything (about 10 minutes)
    python -m benchmarks.bench_release --compare 364e7c4,aec4b08 --rows 1e7
    python benchmarks/bench_release.py --rows 1000000 --scaling 100000,1000000 --keys 1000
    # quantiles against gaussian at 1e7, main and this checkout in turns (issue 43):
    python -m benchmarks.bench_release --rows 1e7 --compare main --compare-bound 8 \
        --compare-kinds gaussian,quantiles --data-dir /work/bench-data
    # issue 43's figures in one run: auto, the floor, growth to 1e8, heavy users
    python -m benchmarks.bench_release --rows 1e7 --compare main --compare-rounds 2 \
        --compare-cases 4,auto,4:pt1,auto:pt1 --compare-growth 3e7,1e8 \
        --compare-heavy fixed,auto,l1,aggregates --data-dir /work/bench-data
"""
import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

EPSILON = 1.0
DELTA = 1e-8
BOUND = 8
USER, KEY = "user_id", "word"
KINDS = ("gaussian", "laplace", "sample_and_threshold", "weighted_sampling")


# ---- data ---------------------------------------------------------------------------------

def data_path(data_dir, rows, seed):
    return os.path.join(data_dir, f"zipf_rows{rows}_seed{seed}.parquet")


def ensure_data(data_dir, rows, seed):
    path = data_path(data_dir, rows, seed)
    if not os.path.exists(path):
        from benchmarks import datagen
        t0 = time.perf_counter()
        table = datagen.generate(rows, users=max(1, rows // 10), vocabulary_size=max(1, rows // 10),
                                 zipf_a=1.1, user_tail=0.8, seed=seed)
        datagen.write(table, path + ".part")
        os.replace(path + ".part", path)
        print(f"# generated {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


VALUE = "amount"    # the value column of the quantiles runs (datagen.values)


def value_data_path(data_dir, rows, seed):
    return os.path.join(data_dir, f"zipf_rows{rows}_seed{seed}_{VALUE}.parquet")


def ensure_value_data(data_dir, rows, seed):
    """The main data (:func:`ensure_data`) with the value column ``amount``
    (``datagen.with_values``: lognormal(4, 1), its own stream of ``seed``), the input of
    the quantiles runs; the same user and word columns, so every kind reads one file."""
    path = value_data_path(data_dir, rows, seed)
    if not os.path.exists(path):
        import pyarrow.parquet as pq
        from benchmarks import datagen
        t0 = time.perf_counter()
        table = datagen.with_values(pq.read_table(ensure_data(data_dir, rows, seed)), VALUE, seed)
        datagen.write(table, path + ".part")
        os.replace(path + ".part", path)
        print(f"# generated {path} in {time.perf_counter() - t0:.1f} s", flush=True)
    return path


def ensure_key_data(data_dir, rows, seed, distinct_keys):
    """The main data's users with exactly ``distinct_keys`` distinct keys ``k<i>``."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    from benchmarks import datagen
    path = os.path.join(data_dir, f"keys{distinct_keys}_rows{rows}_seed{seed}.parquet")
    if not os.path.exists(path):
        base = pq.read_table(ensure_data(data_dir, rows, seed), columns=[USER])
        rng = np.random.default_rng(seed + distinct_keys)
        index = rng.permutation(rows) % distinct_keys
        keys = np.char.add("k", index.astype(str)).astype(object)
        table = pa.table({USER: base.column(USER), KEY: pa.array(keys, type=pa.string())})
        datagen.write(table, path + ".part")
        os.replace(path + ".part", path)
    return path


# ---- measuring a command in a fresh process --------------------------------------------------

def measure(cmd, cwd=ROOT, env=None):
    """Run ``cmd`` under a wrapper process; returns dict(wall, rss_mb, rc, stderr, stdout, load)."""
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as handle:
        out = handle.name
    load0 = os.getloadavg()[0]
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "_measure", out, "--", *cmd],
                          cwd=cwd, capture_output=True, text=True, env=env)
    load1 = os.getloadavg()[0]
    try:
        with open(out, encoding="utf-8") as handle:
            m = json.load(handle)
    except (OSError, ValueError):
        m = {"wall": float("nan"), "rss_kb": 0, "cpu": float("nan"), "rc": proc.returncode}
    finally:
        if os.path.exists(out):
            os.remove(out)
    return {"wall": m["wall"], "cpu": m["cpu"], "rss_mb": m["rss_kb"] / 1024, "rc": m["rc"],
            "stdout": proc.stdout, "stderr": proc.stderr, "load": (load0, load1)}


def _measure_main(out, cmd):
    import resource
    t0 = time.perf_counter()
    proc = subprocess.run(cmd)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    with open(out, "w", encoding="utf-8") as handle:
        json.dump({"wall": wall, "rss_kb": usage.ru_maxrss,  # KiB on Linux
                   "cpu": usage.ru_utime + usage.ru_stime, "rc": proc.returncode}, handle)
    return 0


# ---- thresher ---------------------------------------------------------------------------------

def checkout_env():
    """The environment of this checkout's ``thresher`` runs: Python's bytecode cache on
    (an installed thresher, like every compared commit, runs from the bytecode ``pip
    install`` compiled; with PYTHONDONTWRITEBYTECODE the checkout's ~200 modules would be
    compiled from source in every measured run). :func:`compile_checkout` writes it
    first, so no measured run pays the compilation."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}


_COMPILED = []


def compile_checkout(python=None):
    """Compile the checkout's modules into their ``__pycache__`` folders (git-ignored)
    once, as ``pip install`` does for an installed version."""
    if _COMPILED:
        return
    python = python or sys.executable
    folders = [os.path.join(ROOT, p) for p in ("accounting", "pipelines", "transforms",
                                               os.path.join("src", "thresher"))]
    subprocess.run([python, "-m", "compileall", "-q",
                    *[f for f in folders if os.path.isdir(f)]],
                   env=checkout_env(), check=False, stdout=subprocess.DEVNULL)
    _COMPILED.append(True)


def thresher_command():
    """The checkout's thresher (``python -m thresher`` run from ROOT), never an
    installed ``thresher`` of another version found on PATH."""
    return [sys.executable, "-m", "thresher.pipelines.cli"]


def kind_available(kind):
    return os.path.exists(os.path.join(ROOT, "pipelines", "kinds", f"{kind}.py"))


def auto_available():
    return os.path.exists(os.path.join(ROOT, "transforms", "bounding", "choose_contribution_bound.py"))


def write_config(work, name, data, kind, bound, mechanism=None):
    import yaml
    spec = {"name": name,
            "input": {"path": data, "format": "parquet", "user": USER, "keys": [KEY]},
            "privacy": {"epsilon": EPSILON, "delta": DELTA},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": kind, **(mechanism or {})},
            "output": {"path": os.path.join(work, "out", name)}}
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    return path, spec["output"]["path"]


def run_thresher(work, name, data, kind, bound, extra=(), env=None):
    config, out = write_config(work, name, data, kind, bound)
    if env is None:
        compile_checkout()
        env = checkout_env()
    m = measure([*thresher_command(), "run", config, "--overwrite", "--quiet", *extra], env=env)
    m["keys"] = None
    report_path = os.path.join(out, "release_report.json")
    if m["rc"] == 0 and os.path.exists(report_path):
        with open(report_path, encoding="utf-8") as handle:
            report = json.load(handle)
        m["keys"] = report.get("released_keys")
        m["report"] = report
    return m


# ---- PipelineDP --------------------------------------------------------------------------------

def _pipelinedp_main(data, out, epsilon, delta, bound):
    """PipelineDP DPEngine + BeamBackend on the in-process FnApiRunner: COUNT per key with
    its default noise (Laplace) and partition selection (truncated geometric)."""
    import apache_beam as beam
    import pipeline_dp
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=delta)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.BeamBackend())
    params = pipeline_dp.AggregateParams(metrics=[pipeline_dp.Metrics.COUNT],
                                         max_partitions_contributed=bound,
                                         max_contributions_per_partition=1)
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda row: row[USER],
                                            partition_extractor=lambda row: row[KEY],
                                            value_extractor=lambda row: 0)
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        rows = pipeline | "Read" >> beam.io.ReadFromParquet(data, columns=[USER, KEY])
        result = engine.aggregate(rows, params, extractors)
        accountant.compute_budgets()
        (result
         | "Format" >> beam.Map(lambda kv: f"{kv[0]}\t{kv[1].count}")
         | "Write" >> beam.io.WriteToText(out, num_shards=1, shard_name_template=""))
    with open(out, encoding="utf-8") as handle:
        keys = sum(1 for _ in handle)
    print(json.dumps({"keys": keys}))
    return 0


def run_pipelinedp(work, data):
    out = os.path.join(work, "out", "pipelinedp.tsv")
    m = measure([sys.executable, os.path.abspath(__file__), "_pipelinedp", data, out,
                 repr(EPSILON), repr(DELTA), str(BOUND)])
    m["keys"] = _last_json(m["stdout"]).get("keys")
    return m


# ---- the in-process floor ---------------------------------------------------------------------

def floor(data, bound, sigma, threshold, out=None, pre_threshold=1, seed=0):
    """The in-process floor of a release: the leanest single-process numpy/pyarrow version
    of the work ``thresher run`` does, timed like thresher (issue 43: "read, exact
    identity, bound, count, noise, write").

    In (each a phase of the returned seconds):

    - read: the user and key columns of the whole Parquet file (pyarrow's multi-threaded
      reader, as thresher's row-group reads);
    - identity: every distinct user id and key told apart exactly (Parquet's dictionaries
      unified across row groups: dense codes, no hashing into a smaller space);
    - bound: de-duplicate (user, key) (one sort of the packed codes), then C uniformly
      random distinct keys per user (users with more than C keys only);
    - count: distinct users per key (``bincount``);
    - noise: rounded normal noise of ``sigma`` on the keys with at least
      ``pre_threshold`` users, kept where at or above ``threshold``;
    - write: the released keys (strings) and noisy counts as Parquet to ``out`` (a
      temporary file when None; thresher writes ``released.parquet`` and its report).

    Out: Beam, sharding, spilling, the keyed CSPRNG (numpy's generator instead), the
    discrete Gaussian, the plan and ledger, the canonical order and interval columns of
    thresher's output: a speed floor, not a private release. Its process start-up
    (interpreter, numpy/pyarrow imports) is not in these phases; :func:`run_floor` times
    the whole process (start to file written), as thresher's figures are, and that is
    the figure the ratios use. Returns per-phase seconds and the number of keys kept."""
    import pyarrow as pa
    import pyarrow.dataset as _dataset  # imported before the clock starts (read_table uses it)
    import pyarrow.parquet as pq
    del _dataset
    rng = np.random.default_rng(seed)
    cpu0 = time.process_time()
    t = {"start": time.perf_counter()}
    table = pq.read_table(data, columns=[USER, KEY], read_dictionary=[USER, KEY])
    t["read"] = time.perf_counter()
    # Parquet's per-row-group dictionaries unified into one per column (reading plain
    # strings and encoding them in one hash pass, pc.dictionary_encode, measured the same:
    # 7.2-7.5 s of process CPU either way at 1e7 rows)
    table = table.unify_dictionaries()
    user = table.column(USER).combine_chunks()
    key = table.column(KEY).combine_chunks()
    del table
    key_names = key.dictionary
    n_keys = len(key_names)
    u = user.indices.to_numpy().astype(np.int64)
    k = key.indices.to_numpy().astype(np.int64)
    del user, key
    t["identity"] = time.perf_counter()
    pairs = np.sort(u * n_keys + k)                      # sort-based de-duplication
    del u, k
    first = np.empty(len(pairs), dtype=bool)
    first[0] = True
    np.not_equal(pairs[1:], pairs[:-1], out=first[1:])
    pairs = pairs[first]
    pu, pk = pairs // n_keys, pairs % n_keys
    # C uniformly random distinct keys per user; only users with more than C keys need
    # coins: order their pairs by (user, random priority) and keep the first C
    new_user = np.empty(len(pu), dtype=bool)
    new_user[0] = True
    np.not_equal(pu[1:], pu[:-1], out=new_user[1:])
    starts = np.flatnonzero(new_user)
    per_user = np.diff(np.append(starts, len(pu)))
    big = np.repeat(per_user > bound, per_user)
    kept_small = pk[~big]
    bu, bk = pu[big], pk[big]
    order = np.argsort((bu << 32) | rng.integers(0, 1 << 32, len(bu)))
    bu, bk = bu[order], bk[order]
    first = np.empty(len(bu), dtype=bool)
    if len(bu):
        first[0] = True
        np.not_equal(bu[1:], bu[:-1], out=first[1:])
    running = np.arange(len(bu))
    rank = running - np.maximum.accumulate(np.where(first, running, 0))
    kept = np.concatenate([kept_small, bk[rank < bound]])
    t["bound"] = time.perf_counter()
    counts = np.bincount(kept, minlength=n_keys)
    t["count"] = time.perf_counter()
    eligible = np.flatnonzero(counts >= pre_threshold)
    noisy = counts[eligible] + np.rint(rng.normal(0, sigma, len(eligible))).astype(np.int64)
    released = noisy >= threshold
    t["noise"] = time.perf_counter()
    result = pa.table({KEY: key_names.take(pa.array(eligible[released])),
                       "count": pa.array(noisy[released])})
    if out is None:
        with tempfile.TemporaryDirectory() as folder:
            pq.write_table(result, os.path.join(folder, "released.parquet"))
    else:
        pq.write_table(result, out)
    t["write"] = time.perf_counter()
    names = ["read", "identity", "bound", "count", "noise", "write"]
    phases = {}
    prev = t["start"]
    for name in names:
        phases[name] = t[name] - prev
        prev = t[name]
    return {"compute": t["write"] - t["start"], "compute_cpu": time.process_time() - cpu0,
            "phases": phases, "keys": int(released.sum())}


def _floor_main(data, bound, sigma, threshold):
    result = floor(data, int(bound), float(sigma), float(threshold))
    print(json.dumps(result))
    return 0


def run_floor(data, sigma, threshold, bound=BOUND, python=None):
    """:func:`floor` in a fresh process: ``wall``/``cpu``/``rss_mb`` are the whole
    process's (interpreter start to output written, as thresher's figures), ``compute``
    / ``compute_cpu``/``phases`` the work after the imports."""
    m = measure([python or sys.executable, os.path.abspath(__file__), "_floor", data, str(bound),
                 repr(sigma), repr(threshold)])
    result = _last_json(m["stdout"])
    m.update(compute=result.get("compute", float("nan")),
             compute_cpu=result.get("compute_cpu", float("nan")), phases=result.get("phases", {}),
             keys=result.get("keys"))
    return m


def _floor_phases(fl):
    if _ok(fl):
        phases = ", ".join(f"{k} {v:.2f}" for k, v in fl.get("phases", {}).items())
        print(f"#   floor phases (wall s): {phases}; after the imports {fl['compute']:.2f} s "
              f"wall, {fl['compute_cpu']:.2f} s cpu; process {fl['wall']:.2f} s wall, "
              f"{fl['cpu']:.2f} s cpu", flush=True)


def _last_json(text):
    for line in reversed((text or "").strip().splitlines()):
        try:
            return json.loads(line)
        except ValueError:
            continue
    return {}


# ---- printing ----------------------------------------------------------------------------------

HEADER = (f"{'case':<38} {'rows':>10} {'wall s':>8} {'cpu s':>7} {'rows/s':>10} {'peak RSS MB':>11} "
          f"{'ratio':>18} {'keys':>7} {'load 1m':>11}")


def row(case, rows, m, ratio="", seconds=None):
    wall = m["wall"] if seconds is None else seconds
    cpu = m["cpu"] if seconds is None else m.get("compute_cpu", float("nan"))
    if m["rc"] != 0:
        tail = (m["stderr"] or "").strip().splitlines()[-3:]
        print(f"{case:<38} {rows:>10} FAILED rc={m['rc']}: {' | '.join(tail)[:300]}", flush=True)
        return
    keys = "" if m.get("keys") is None else str(m["keys"])
    print(f"{case:<38} {rows:>10} {wall:>8.2f} {cpu:>7.2f} {rows / wall:>10,.0f} {m['rss_mb']:>11,.0f} "
          f"{ratio:>18} {keys:>7} {m['load'][0]:>5.1f}->{m['load'][1]:<4.1f}", flush=True)


def _ok(m):
    return m is not None and m["rc"] == 0


# ---- the runs ----------------------------------------------------------------------------------

def main_table(args, work):
    rows = args.rows
    data = ensure_data(args.data_dir, rows, args.seed)
    print(f"\n## {rows:,} rows, epsilon={EPSILON:g}, delta={DELTA:g}, C={BOUND} "
          f"(data {os.path.relpath(data, ROOT)}); thresher = {' '.join(thresher_command())}")
    print(HEADER)
    results = {}
    auto = auto_available()
    for kind in args.kinds:
        if not kind_available(kind):
            print(f"{'thresher ' + kind:<38} skipped: pipelines/kinds/{kind}.py is absent")
            continue
        for bound in ([BOUND, "auto"] if auto else [BOUND]):
            name = f"{kind}_{'auto' if bound == 'auto' else 'fixed'}_{rows}"
            results[(kind, bound)] = run_thresher(work, name, data, kind, bound)
    if not auto:
        print(f"{'thresher * auto bound':<38} skipped: transforms/bounding/choose_contribution_bound.py "
              f"is absent")
    gaussian = results.get(("gaussian", BOUND))
    fl = None
    if _ok(gaussian):
        mech = gaussian["report"]["mechanism"]
        fl = run_floor(data, mech["sigma"], mech["threshold"])
    for (kind, bound), m in results.items():
        ratio = (f"{m['wall'] / fl['wall']:.1f}x ({m['cpu'] / fl['cpu']:.1f}x cpu)"
                 if _ok(fl) and _ok(m) else "")
        row(f"thresher {kind}, C={bound}", rows, m, ratio)
    for kind in args.kinds:
        fixed, auto_m = results.get((kind, BOUND)), results.get((kind, "auto"))
        if _ok(fixed) and _ok(auto_m):
            print(f"#   {kind}: auto / C={BOUND}: wall {auto_m['wall'] / fixed['wall']:.2f}x, "
                  f"cpu {auto_m['cpu'] / fixed['cpu']:.2f}x, peak RSS "
                  f"{auto_m['rss_mb'] / fixed['rss_mb']:.2f}x (targets: time <= 1.25x, "
                  f"memory <= 1.1x)")
    if fl is not None:
        row("floor: numpy/pyarrow in process", rows, fl, "1.0x")
        _floor_phases(fl)
    return results, fl


def peer_table(args, work):
    print("\n## PipelineDP vs thresher: same runner (in-process FnApiRunner), data and "
          "(epsilon, delta)")
    print(HEADER)
    points = {"PipelineDP": [], "laplace": [], "gaussian": []}
    for rows in args.peer_rows:
        data = ensure_data(args.data_dir, rows, args.seed)
        peer = run_pipelinedp(work, data)
        row("PipelineDP DPEngine+BeamBackend count", rows, peer, "1.0x")
        if _ok(peer):
            points["PipelineDP"].append((rows, peer["wall"], peer["cpu"]))
        for kind in ("laplace", "gaussian"):
            if not kind_available(kind):
                continue
            m = run_thresher(work, f"{kind}_fixed_{rows}", data, kind, BOUND)
            ratio = (f"{peer['wall'] / m['wall']:.0f}x ({peer['cpu'] / m['cpu']:.0f}x cpu)"
                     if _ok(peer) and _ok(m) else "")
            row(f"thresher {kind}, C={BOUND}", rows, m, ratio)
            if _ok(m):
                points[kind].append((rows, m["wall"], m["cpu"]))
    # fixed + per-row cost from the two largest sizes (CPU seconds: less load-sensitive)
    fits = {}
    for name, pts in points.items():
        if len(pts) >= 2:
            (r0, _, c0), (r1, _, c1) = sorted(pts)[-2:]
            per_row = (c1 - c0) / (r1 - r0)
            fits[name] = (c1 - per_row * r1, per_row)
            print(f"#   {name}: cpu ~ {fits[name][0]:.2f} s + {per_row * 1e6:.2f} us/row "
                  f"(from {r0:,} and {r1:,} rows)")
    if "PipelineDP" in fits:
        for kind in ("laplace", "gaussian"):
            if kind in fits and fits[kind][1] <= 0:
                print(f"#   per-row cost of thresher {kind} is below the timing noise at "
                      f"these sizes; use larger --peer-rows")
            elif kind in fits:
                print(f"#   per-row cost ratio PipelineDP / thresher {kind}: "
                      f"{fits['PipelineDP'][1] / fits[kind][1]:.0f}x")


def scaling_table(args, work):
    print(f"\n## Scaling in rows (thresher gaussian, C={BOUND}; floor)")
    print(HEADER)
    previous = None
    for rows in args.scaling:
        data = ensure_data(args.data_dir, rows, args.seed)
        m = run_thresher(work, f"scale_gaussian_{rows}", data, "gaussian", BOUND)
        marginal = ""
        if _ok(m) and previous is not None:
            (r0, c0) = previous
            marginal = f"{(m['cpu'] - c0) / (rows - r0) * 1e6:.2f} us/row cpu"
        row("thresher gaussian", rows, m, marginal)
        if _ok(m):
            previous = (rows, m["cpu"])
            mech = m["report"]["mechanism"]
            fl = run_floor(data, mech["sigma"], mech["threshold"])
            row("floor", rows, fl, (f"thresher {m['wall'] / fl['wall']:.1f}x"
                                    if _ok(fl) else ""))
    print("#   ratio column of thresher rows: marginal CPU cost per row between this size and "
          "the previous; of floor rows: thresher wall / floor process wall")


def startup_env(work):
    """The environment of the start-up row: thresher's calibration cache in a fresh folder
    of this run (so its first run computes), and Python's bytecode cache on for both
    commands (PYTHONDONTWRITEBYTECODE would make every run compile the checkout's modules
    from source while Beam's come compiled from site-packages; ``pip install`` compiles
    thresher's too). The bytecode goes to a folder of this run (PYTHONPYCACHEPREFIX)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    env["THRESHER_CACHE_DIR"] = os.path.join(work, "thresher-cache")
    return env


def startup_table(args, work, repeats=5):
    """Fixed cost of one run: ``thresher run`` on a 1,000-row input against
    ``python -c "import apache_beam"`` (the least any Beam pipeline pays), in fresh
    processes taken in turns, median of ``repeats`` each (the machine is shared). The
    first ``thresher run`` (its calibration not yet in the cache: SciPy imported and the
    calibration computed) is reported on its own; a warm-up run of each command first
    writes the bytecode cache and is not counted."""
    rows = 1000
    data = ensure_data(args.data_dir, rows, args.seed)
    env = startup_env(work)
    import shutil
    shutil.rmtree(env["THRESHER_CACHE_DIR"], ignore_errors=True)   # the first run calibrates
    print(f"\n## Start-up: thresher run on {rows:,} rows vs importing Beam (median of {repeats})")
    print(HEADER)
    beam_cmd = [sys.executable, "-c", "import apache_beam"]
    measure(beam_cmd, env=env)                                     # bytecode cache, not counted
    first = run_thresher(work, f"startup_{rows}", data, "gaussian", BOUND, env=env)
    # thresher run freezes Beam's import objects out of the garbage collector (gc.freeze),
    # which also spares it the exit-time collection of them that the plain import pays
    # (0.3-0.5 s of CPU here): the second baseline imports Beam and freezes too.
    frozen_cmd = [sys.executable, "-c", "import apache_beam, gc; gc.freeze()"]
    beam_runs, frozen_runs, runs = [], [], []
    for _ in range(repeats):
        beam_runs.append(measure(beam_cmd, env=env))
        frozen_runs.append(measure(frozen_cmd, env=env))
        runs.append(run_thresher(work, f"startup_{rows}", data, "gaussian", BOUND, env=env))

    def median(ms):
        ok = [m for m in ms if _ok(m)]
        if not ok:
            return ms[0]
        out = dict(ok[0])
        for field in ("wall", "cpu", "rss_mb"):
            out[field] = statistics.median(m[field] for m in ok)
        out["load"] = (min(m["load"][0] for m in ok), max(m["load"][1] for m in ok))
        return out
    beam = median(beam_runs)
    frozen = median(frozen_runs)
    for label, m in (('python -c "import apache_beam"', beam),
                     ("  same + gc.freeze() (no exit-time GC)", frozen)):
        print(f"{label:<38} {'':>10} {m['wall']:>8.2f} "
              f"{m['cpu']:>7.2f} {'':>10} {m['rss_mb']:>11,.0f} {'':>18} {'':>7} "
              f"{m['load'][0]:>5.1f}->{m['load'][1]:<4.1f}", flush=True)
    if _ok(first):
        row("thresher run, first (calibrates)", rows, first,
            f"+{first['wall'] - beam['wall']:.2f} s (+{first['cpu'] - beam['cpu']:.2f} cpu)")
    else:
        row("thresher run, first (calibrates)", rows, first)
    warm = median(runs)
    if _ok(warm):
        pairs = [(t["wall"] - b["wall"], t["cpu"] - b["cpu"])
                 for b, t in zip(beam_runs, runs) if _ok(b) and _ok(t)]
        row("thresher run, gaussian C=8", rows, warm,
            f"+{warm['wall'] - beam['wall']:.2f} s (+{warm['cpu'] - beam['cpu']:.2f} cpu)")
        print(f"#   thresher run beyond import apache_beam (medians): "
              f"{warm['wall'] - beam['wall']:.2f} s wall, {warm['cpu'] - beam['cpu']:.2f} s cpu; "
              f"median of the {len(pairs)} pairs run back to back: "
              f"{statistics.median(p[0] for p in pairs):.2f} s wall, "
              f"{statistics.median(p[1] for p in pairs):.2f} s cpu (target: <= 0.5 s); beyond "
              f"the import with gc.freeze(): {warm['wall'] - frozen['wall']:.2f} s wall, "
              f"{warm['cpu'] - frozen['cpu']:.2f} s cpu")
    else:
        row("thresher run, gaussian C=8", rows, warm)


def large_table(args, work):
    """Rows beyond the main table (default 3e7 and 1e8): thresher gaussian C=8 and the
    floor; PipelineDP only up to --peer-max rows (about 50 us/row here: 1e7 rows already
    take ~9 minutes, 1e8 would take ~1.5 hours); the floor only up to --floor-max rows
    (it holds the whole input in memory: ~1.2 GB per 1e7 rows)."""
    print(f"\n## Large inputs (thresher gaussian, C={BOUND}; PipelineDP and floor where run)")
    print(HEADER)
    for rows in args.large:
        if rows > args.large_max:
            print(f"{'thresher gaussian':<38} {rows:>10} skipped: above --large-max "
                  f"{args.large_max:,} rows (peak RSS grows ~50-70 B per input row on the "
                  f"in-process runner; see docs/performance.md)")
            continue
        data = ensure_data(args.data_dir, rows, args.seed)
        m = run_thresher(work, f"large_gaussian_{rows}", data, "gaussian", BOUND)
        row("thresher gaussian", rows, m, f"{m['rss_mb'] * 2**20 / rows:.0f} B/row peak"
            if _ok(m) else "")
        if rows > args.peer_max:
            print(f"{'PipelineDP DPEngine+BeamBackend count':<38} {rows:>10} skipped: above "
                  f"--peer-max {args.peer_max:,} rows (~50 us/row: "
                  f"{rows * 50e-6 / 60:.0f} min expected)")
        else:
            peer = run_pipelinedp(work, data)
            row("PipelineDP DPEngine+BeamBackend count", rows, peer,
                f"{peer['wall'] / m['wall']:.0f}x thresher" if _ok(peer) and _ok(m) else "")
        if not _ok(m):
            continue
        if rows > args.floor_max:
            print(f"{'floor':<38} {rows:>10} skipped: above --floor-max {args.floor_max:,} "
                  f"rows (the floor holds the whole input in memory)")
            continue
        mech = m["report"]["mechanism"]
        fl = run_floor(data, mech["sigma"], mech["threshold"])
        row("floor", rows, fl, (f"thresher {m['wall'] / fl['wall']:.1f}x" if _ok(fl) else ""))


def install_revision(rev, cache):
    """(thresher command, full commit) of ``rev`` of this repository, installed in a
    virtualenv of its own under ``cache``/<commit> (``git archive`` of the commit and a
    non-editable ``pip install``; reused when present). The command is the venv's
    ``thresher`` console script, run from a folder outside any checkout so that no
    ``pipelines`` or ``thresher`` folder on the working directory shadows the install."""
    import shutil
    commit = subprocess.run(["git", "-C", ROOT, "rev-parse", "--verify", f"{rev}^{{commit}}"],
                            capture_output=True, text=True, check=True).stdout.strip()
    folder = os.path.join(cache, commit[:12])
    thresher = os.path.join(folder, "venv", "bin", "thresher")
    done = os.path.join(folder, "installed")
    if os.path.exists(done):
        return [thresher], commit
    shutil.rmtree(folder, ignore_errors=True)
    source = os.path.join(folder, "src")
    os.makedirs(source)
    t0 = time.perf_counter()
    archive = subprocess.run(["git", "-C", ROOT, "archive", "--format=tar", commit],
                             capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", source], input=archive, check=True)
    subprocess.run([sys.executable, "-m", "venv", os.path.join(folder, "venv")], check=True)
    subprocess.run([os.path.join(folder, "venv", "bin", "python"), "-m", "pip", "install", "-q",
                    source], check=True)
    with open(done, "w", encoding="utf-8") as handle:
        handle.write(commit + "\n")
    print(f"# installed {rev} ({commit[:12]}) in {time.perf_counter() - t0:.0f} s: {folder}",
          flush=True)
    return [thresher], commit


def install_checkout(cache):
    """A ``python`` of a clean virtualenv (``--compare-head venv``) with this checkout
    installed editable (``pip install -e``, its dependencies resolved as for a compared
    commit, cached under ``cache`` by the checkout's path and packaging files): HEAD then
    runs with the same third-party packages as the commits it is compared with. Beam
    imports optional packages when they are present (pandas, boto3 and the s3
    filesystem, ...): in this machine's system site-packages, which the checkout's own
    ``.venv`` may see, they cost ~0.6 s of CPU and ~55 MB of peak RSS per run, which a
    compared commit's clean venv does not pay (issue 43 item 4's "+50 MB" was that)."""
    import hashlib
    import shutil
    digest = hashlib.sha256(ROOT.encode())
    for name in ("setup.py", "pyproject.toml"):
        path = os.path.join(ROOT, name)
        if os.path.exists(path):
            with open(path, "rb") as handle:
                digest.update(handle.read())
    folder = os.path.join(cache, f"checkout-{digest.hexdigest()[:12]}")
    python = os.path.join(folder, "venv", "bin", "python")
    done = os.path.join(folder, "installed")
    if not os.path.exists(done):
        shutil.rmtree(folder, ignore_errors=True)
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "venv", os.path.join(folder, "venv")], check=True)
        subprocess.run([python, "-m", "pip", "install", "-q", "-e", ROOT], check=True)
        with open(done, "w", encoding="utf-8") as handle:
            handle.write(ROOT + "\n")
        print(f"# installed this checkout (editable) in a clean venv in "
              f"{time.perf_counter() - t0:.0f} s: {folder}", flush=True)
    return python


def compare_table(args, work):
    """This checkout against older commits (``--compare``) on one input: ``thresher run``
    of each, gaussian, ``max_keys_per_user`` = ``--compare-bound``, string user ids,
    in a fresh process each (:func:`measure`), the commits taken in turns (a different
    order every round) so that the machine's load falls on all alike."""
    rows = args.rows
    kinds = args.compare_kinds
    unknown = [k for k in kinds if k not in COMPARE_MECHANISMS]
    if unknown:
        raise SystemExit(f"--compare-kinds: unknown {unknown} (allowed: "
                         f"{', '.join(COMPARE_MECHANISMS)})")
    data = (ensure_value_data(args.data_dir, rows, args.seed) if kinds != ["gaussian"]
            else ensure_data(args.data_dir, rows, args.seed))
    cache = os.path.join(args.data_dir, "compare")
    targets = []
    for rev in args.compare:
        command, commit = install_revision(rev, cache)
        targets.append((f"{rev} ({commit[:7]})", command, tempfile.mkdtemp(prefix="cmp_")))
    head = subprocess.run(["git", "-C", ROOT, "rev-parse", "--short", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    dirty = subprocess.run(["git", "-C", ROOT, "status", "--porcelain", "--untracked-files=no"],
                           capture_output=True, text=True).stdout.strip()
    head_label = f"HEAD ({head}{'+' if dirty else ''})"
    head_python = (install_checkout(cache) if args.compare_head == "venv" and args.compare
                   else sys.executable)
    targets.append((head_label, [head_python, "-m", "thresher.pipelines.cli"], ROOT))
    compile_checkout(head_python)
    cases = args.compare_cases or [str(args.compare_bound)]
    print(f"\n## Compare: {rows:,} rows, {', '.join(kinds)}, cases {','.join(cases)}, "
          f"epsilon={EPSILON:g}, delta={DELTA:g}, string user ids (data "
          f"{os.path.relpath(data, ROOT)}); {args.compare_rounds} round(s), commits in turns")
    print(HEADER)
    results = {}
    # (case, label) for gaussian, the figures as they always were; (case, label, kind)
    # for every other kind
    runs = [(case, kind) for case in cases for kind in kinds]
    for case, kind in runs:
        for label, _, _ in targets:
            results[_result_key(case, label, kind)] = []
    grown, heavy_runs = {}, {}      # (rows, label) and (heavy mode, label): their runs
    heavy = ensure_heavy(args.data_dir, work, args.compare_heavy) if args.compare_heavy else None
    # data made before the first timed run, never between two
    grown_data = {n: ensure_data(args.data_dir, n, args.seed) for n in args.compare_growth}
    if args.compare_growth and "gaussian" not in kinds:
        print("#   --compare-growth: no gaussian case at --rows to divide by (add gaussian "
              "to --compare-kinds): the growth runs are printed without ratios")
    # rounds outermost: every case of a round runs within minutes of the others, so the
    # per-round ratios (auto / fixed, kind / gaussian, thresher / floor) pair runs made
    # under the same machine speed (this machine's speed drifts by 20 % within minutes)
    for round_ in range(args.compare_rounds):
        for case, kind in runs:
            bound, mechanism = _compare_case(case)
            mechanism = {**COMPARE_MECHANISMS[kind], **mechanism}
            order = targets if round_ % 2 == 0 else targets[::-1]
            for label, command, cwd in order:
                index = targets.index((label, command, cwd))
                name = f"compare_{index}_{case.replace(':', '_')}" + (
                    "" if kind == "gaussian" else f"_{kind}")
                config, out = write_config(work, name, data, kind, bound, mechanism)
                m = measure([*command, "run", config, "--overwrite", "--quiet"], cwd=cwd,
                            env=checkout_env() if label == head_label else None)
                m["keys"] = _released_keys(out) if m["rc"] == 0 else None
                m["round"] = round_
                results[_result_key(case, label, kind)].append(m)
                tag = "" if kind == "gaussian" and kinds == ["gaussian"] else f" {kind}"
                row(f"{label}{tag} C={case}", rows, m, f"round {round_ + 1}")
                if args.compare_floor and label == head_label and m["rc"] == 0 \
                        and bound != "auto" and kind == "gaussian":
                    fl = _floor_for(out, data, bound, head_python)
                    fl["round"] = round_
                    results.setdefault((case, "floor"), []).append(fl)
                    row(f"floor C={case}", rows, fl, f"round {round_ + 1}")
        for n in args.compare_growth:      # the first case's spec at more rows
            bound, mechanism = _compare_case(cases[0])
            for label, command, cwd in (targets if round_ % 2 == 0 else targets[::-1]):
                index = targets.index((label, command, cwd))
                config, out = write_config(work, f"compare_{index}_rows{n}", grown_data[n],
                                           "gaussian", bound, mechanism)
                m = measure([*command, "run", config, "--overwrite", "--quiet"], cwd=cwd,
                            env=checkout_env() if label == head_label else None)
                m.update(round=round_, keys=_released_keys(out) if m["rc"] == 0 else None)
                grown.setdefault((n, label), []).append(m)
                row(f"{label} C={cases[0]}", n, m, f"round {round_ + 1}")
        for mode in args.compare_heavy:    # benchmarks/heavy_modes.py's specs
            for label, command, cwd in (targets if round_ % 2 == 0 else targets[::-1]):
                m = measure([*command, "run", os.path.join(heavy, f"mode_{mode}.yaml"),
                             "--overwrite", "--quiet"], cwd=cwd,
                            env=checkout_env() if label == head_label else None)
                m["round"] = round_
                heavy_runs.setdefault((mode, label), []).append(m)
                _heavy_row(f"heavy {mode}: {label}", m, f"round {round_ + 1}")
    medians = {}
    for key, ms in results.items():
        ok = [m for m in ms if _ok(m)]
        if ok:
            medians[key] = dict(ok[0], wall=statistics.median(m["wall"] for m in ok),
                                cpu=statistics.median(m["cpu"] for m in ok),
                                rss_mb=statistics.median(m["rss_mb"] for m in ok),
                                load=(min(m["load"][0] for m in ok),
                                      max(m["load"][1] for m in ok)))
    if args.compare_rounds > 1:
        print("#   medians over the rounds:")
        for key, median in medians.items():
            case, label, *kind = key
            if not kind and kinds != ["gaussian"] and label != "floor":
                kind = ["gaussian"]
            row(f"{label}{''.join(' ' + k for k in kind)} C={case}", rows, median, "median")
    for label, _, _ in targets:      # every kind against gaussian, per commit (same run)
        for case, kind in runs:
            g, k = medians.get((case, label)), medians.get(_result_key(case, label, kind))
            if kind != "gaussian" and g and k:
                print(f"#   {label} C={case}: {kind} / gaussian: CPU {k['cpu'] / g['cpu']:.2f}x "
                      f"({k['cpu']:.2f} / {g['cpu']:.2f} s), wall {k['wall'] / g['wall']:.2f}x "
                      f"({k['wall']:.2f} / {g['wall']:.2f} s), peak RSS "
                      f"{k['rss_mb'] / g['rss_mb']:.2f}x ({k['rss_mb']:,.0f} / "
                      f"{g['rss_mb']:,.0f} MB)" + _paired(
                          results[_result_key(case, label, kind)], results[(case, label)]),
                      flush=True)
    for key, median in medians.items():   # every commit against the floor
        if len(key) != 2:
            continue
        case, label = key
        fl = medians.get((case, "floor"))
        if fl and label != "floor":
            print(f"#   {label} C={case} / floor (whole processes): CPU "
                  f"{median['cpu'] / fl['cpu']:.2f}x, wall {median['wall'] / fl['wall']:.2f}x, "
                  f"peak RSS {median['rss_mb'] / fl['rss_mb']:.2f}x"
                  + _paired(results[key], results[(case, "floor")]), flush=True)
    # auto against the fixed bound of the same spec shape, per commit (same run)
    for label, _, _ in targets:
        for case in cases:
            if not case.startswith("auto"):
                continue
            fixed = next((c for c in cases if not c.startswith("auto")
                          and c.partition(":")[2] == case.partition(":")[2]), None)
            a, f = medians.get((case, label)), medians.get((fixed, label))
            if a and f:
                print(f"#   {label}: C={case} / C={fixed}: CPU {a['cpu'] / f['cpu']:.2f}x, "
                      f"wall {a['wall'] / f['wall']:.2f}x, peak RSS "
                      f"{a['rss_mb'] / f['rss_mb']:.2f}x"
                      + _paired(results[(case, label)], results[(fixed, label)]), flush=True)
    for label, _, _ in targets:   # growth: each row count against --rows, per commit
        base = results.get((cases[0], label), [])
        for n in args.compare_growth:
            runs_n = [m for m in grown.get((n, label), []) if _ok(m)]
            ok = [m for m in base if _ok(m)]
            if runs_n and ok:
                cpu = statistics.median(m["cpu"] for m in runs_n)
                wall = statistics.median(m["wall"] for m in runs_n)
                print(f"#   {label} C={cases[0]}: {n:,} rows / {rows:,} rows: CPU "
                      f"{cpu / statistics.median(m['cpu'] for m in ok):.2f}x, wall "
                      f"{wall / statistics.median(m['wall'] for m in ok):.2f}x (medians; "
                      f"{n / rows:g}x the rows), peak RSS "
                      f"{statistics.median(m['rss_mb'] for m in runs_n):,.0f} MB"
                      + _paired(runs_n, ok), flush=True)
    for mode in args.compare_heavy:   # heavy user: every commit's exit codes and medians
        for label, _, _ in targets:
            ms = heavy_runs.get((mode, label), [])
            if len(ms) < 2:
                continue
            codes = [m["rc"] for m in ms]
            rc = max(set(codes), key=codes.count)      # the medians of the usual outcome
            same = [m for m in ms if m["rc"] == rc]
            _heavy_row(f"heavy {mode}: {label}", dict(
                same[0], rc="/".join(str(c) for c in codes),
                cpu=statistics.median(m["cpu"] for m in same),
                wall=statistics.median(m["wall"] for m in same),
                rss_mb=statistics.median(m["rss_mb"] for m in same)),
                f"median of the {len(same)} runs of exit {rc}")
    return results


def ensure_heavy(data_dir, work, modes):
    """The heavy-user data of ``benchmarks/heavy_modes.py`` (one user with 1e7 rows, each on
    its own key, among 5,000 users of 20 rows), cached under ``data_dir``, and its specs
    written under ``work`` (this run's outputs): the folder of the specs. ``modes`` must
    be heavy_modes' (a mistyped mode would show as every commit's exit 2)."""
    from benchmarks import heavy_modes
    unknown = [m for m in modes if m not in heavy_modes.MODES]
    if unknown:
        raise SystemExit(f"--compare-heavy: unknown mode {unknown[0]!r} (allowed: "
                         f"{', '.join(heavy_modes.MODES)})")
    folder = os.path.join(data_dir, f"heavy_{heavy_modes.HEAVY_ROWS}_seed{heavy_modes.SEED}")
    data = os.path.join(folder, "heavy.parquet")
    if not os.path.exists(data):
        os.makedirs(folder, exist_ok=True)
        t0 = time.perf_counter()
        heavy_modes.generate(data + ".part")
        os.replace(data + ".part", data)
        print(f"# generated {data} in {time.perf_counter() - t0:.1f} s", flush=True)
    specs = os.path.join(work, "heavy")
    os.makedirs(specs, exist_ok=True)
    heavy_modes.write_specs(specs, data)
    return specs


def _heavy_row(case, m, note):
    """One heavy-user run (or median): its exit code whatever it is (a refusal, exit 2, is
    a figure here, not a failure, and its message is printed), CPU, wall and peak RSS."""
    said = [line for line in (m.get("stderr") or "").splitlines() if line.strip()]
    why = f"  ({said[-1][:160]})" if m["rc"] not in (0, "0") and said else ""
    print(f"{case:<46} exit {m['rc']:<4} {m['wall']:>8.2f} s wall {m['cpu']:>7.2f} s CPU "
          f"{m['rss_mb']:>7,.0f} MB peak  {note}  load {m['load'][0]:.1f}->{m['load'][1]:.1f}"
          f"{why}", flush=True)


def _paired(numerators, denominators):
    """"; paired, median of N rounds (min-max): CPU ..., wall ..." — the median, min and
    max over the rounds of each round's CPU and wall ratio (rounds where both runs
    succeeded), or "" with fewer than two such rounds.
    The ratio of medians above pairs a case's median run with another's, possibly from
    rounds minutes apart; a per-round ratio compares runs made one after the other, under
    the same machine speed, as the issue's targets mean them."""
    by_round = {m["round"]: m for m in denominators if _ok(m)}
    pairs = [(m, by_round[m["round"]]) for m in numerators
             if _ok(m) and m["round"] in by_round]
    if len(pairs) < 2:
        return ""
    text = []
    for what in ("cpu", "wall"):
        ratios = [a[what] / b[what] for a, b in pairs]
        text.append(f"{what.upper() if what == 'cpu' else what} "
                    f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})")
    return f"; paired, median of {len(pairs)} rounds (min-max): " + ", ".join(text)


# --compare-kinds: each kind's mechanism fields (quantiles: per key over the value column
# of ensure_value_data, as docs/performance.md measures it)
COMPARE_MECHANISMS = {
    "gaussian": {},
    "quantiles": {"column": VALUE, "ranks": [0.25, 0.5, 0.9], "domain": [0, 1000]},
}


def _result_key(case, label, kind):
    return (case, label) if kind == "gaussian" else (case, label, kind)


def _floor_for(out, data, bound, python):
    """The floor (:func:`run_floor`) at a compared run's sigma, threshold and bound, run
    by ``python`` (HEAD's interpreter and packages)."""
    with open(os.path.join(out, "release_report.json"), encoding="utf-8") as handle:
        mech = json.load(handle)["mechanism"]
    fl = run_floor(data, mech["sigma"], mech["threshold"], bound=bound, python=python)
    _floor_phases(fl)
    return fl


def _compare_case(case):
    """``--compare-cases`` entry -> (max_keys_per_user, extra mechanism fields): ``4``,
    ``auto``, and either with ``:pt1`` (``pre_threshold: 1``)."""
    bound, _, extra = case.partition(":")
    mechanism = {}
    if extra == "pt1":
        mechanism["pre_threshold"] = 1
    elif extra:
        raise SystemExit(f"--compare-cases: unknown suffix {extra!r} (allowed: pt1)")
    return (bound if bound == "auto" else int(bound)), mechanism


def _released_keys(out):
    path = os.path.join(out, "release_report.json")
    if not os.path.exists(path):
        return None
    with open(path, encoding="utf-8") as handle:
        return json.load(handle).get("released_keys")


def _process_tree(root):
    """{pid: (command, cpu seconds, peak RSS KB)} of ``root`` and its descendants, from
    /proc (Linux); processes that end between two looks keep their last figures."""
    children = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            children.setdefault(int(fields[1]), []).append(int(name))
        except (OSError, IndexError, ValueError):
            continue
    out, stack, tick = {}, [root], os.sysconf("SC_CLK_TCK")
    while stack:
        pid = stack.pop()
        stack.extend(children.get(pid, []))
        try:
            with open(f"/proc/{pid}/stat", encoding="utf-8") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{pid}/status", encoding="utf-8") as handle:
                hwm = next((int(line.split()[1]) for line in handle
                            if line.startswith("VmHWM")), 0)
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                command = handle.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, StopIteration, ValueError):
            continue
        out[pid] = (command, (int(fields[11]) + int(fields[12])) / tick, hwm)
    return out


def measure_tree(cmd, cwd=ROOT, interval=0.5):
    """Run ``cmd``; returns (wall, rc, {pid: (command, cpu s, peak RSS KB)}) of every
    process it started, sampled every ``interval`` seconds (a worker's CPU after its
    last sample is lost: at most ``interval`` s of it)."""
    load0 = os.getloadavg()[0]
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, cwd=cwd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    seen = {}
    while proc.poll() is None:
        seen.update(_process_tree(proc.pid))
        time.sleep(interval)
    wall = time.perf_counter() - t0
    err = proc.stderr.read().decode(errors="replace")
    return {"wall": wall, "rc": proc.returncode, "processes": seen, "stderr": err,
            "load": (load0, os.getloadavg()[0])}


def workers_table(args, work):
    """``thresher run`` in process and with two worker processes
    (``--direct_num_workers=2 --direct_running_mode=multi_processing``) on the same
    data: wall time, and each process's CPU seconds, share of the wall time and peak
    RSS (where the second core waits shows as a worker's CPU share well below 1)."""
    rows = args.rows
    data = ensure_data(args.data_dir, rows, args.seed)
    bound = args.compare_bound
    print(f"\n## One process vs two workers: {rows:,} rows, gaussian, C={bound}")
    for label, extra in (("in process", []),
                         ("2 workers", ["--", "--direct_num_workers=2",
                                        "--direct_running_mode=multi_processing"])):
        config, _ = write_config(work, f"workers_{len(extra)}", data, "gaussian", bound)
        m = measure_tree([*thresher_command(), "run", config, "--overwrite", "--quiet",
                          *extra])
        total = sum(cpu for _, cpu, _ in m["processes"].values())
        print(f"{label}: rc={m['rc']} wall {m['wall']:.2f} s, cpu {total:.2f} s "
              f"({total / m['wall']:.2f} cores busy), load {m['load'][0]:.1f}->"
              f"{m['load'][1]:.1f}", flush=True)
        for pid, (command, cpu, hwm) in sorted(m["processes"].items()):
            role = ("worker" if "sdk_worker" in command or "worker_pool" in command
                    else "controller" if "thresher" in command else command[:40])
            print(f"    pid {pid:>7} {role:<12} cpu {cpu:>7.2f} s  "
                  f"{cpu / m['wall']:>5.0%} of wall  peak RSS {hwm / 1024:>7,.0f} MB",
                  flush=True)


def keys_table(args, work):
    rows = args.key_rows
    print(f"\n## Distinct keys at {rows:,} rows (thresher gaussian, C={BOUND})")
    print(HEADER)
    for distinct in args.keys:
        data = ensure_key_data(args.data_dir, rows, args.seed, distinct)
        m = run_thresher(work, f"keys{distinct}_{rows}", data, "gaussian", BOUND)
        row(f"thresher gaussian, {distinct:,} keys", rows, m)


def _ints(text):
    return [int(float(x)) for x in text.split(",") if x.strip()]


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] == "_measure":
        return _measure_main(argv[1], argv[argv.index("--") + 1:])
    if argv and argv[0] == "_pipelinedp":
        return _pipelinedp_main(argv[1], argv[2], float(argv[3]), float(argv[4]), int(argv[5]))
    if argv and argv[0] == "_floor":
        return _floor_main(*argv[1:5])
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--peer-rows", type=_ints, default=[100_000, 1_000_000])
    parser.add_argument("--scaling", type=_ints, default=[100_000, 1_000_000, 10_000_000])
    parser.add_argument("--keys", type=_ints, default=[1_000, 100_000, 10_000_000])
    parser.add_argument("--key-rows", type=lambda s: int(float(s)), default=None,
                        help="rows of the key-cardinality data (default --rows)")
    parser.add_argument("--kinds", type=lambda s: s.split(","), default=list(KINDS))
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", "data"))
    parser.add_argument("--large", type=_ints, default=[30_000_000, 100_000_000])
    parser.add_argument("--large-max", type=lambda s: int(float(s)), default=30_000_000,
                        help="rows above which the large table is not run (memory)")
    parser.add_argument("--peer-max", type=lambda s: int(float(s)), default=10_000_000,
                        help="rows above which PipelineDP is not run (time)")
    parser.add_argument("--floor-max", type=lambda s: int(float(s)), default=30_000_000,
                        help="rows above which the floor is not run (memory)")
    parser.add_argument("--compare", type=lambda s: [r for r in s.split(",") if r], default=[],
                        help="older commits (any git revision) to measure beside this "
                             "checkout: runs only the comparison unless --only is given")
    parser.add_argument("--compare-bound", type=int, default=4)
    parser.add_argument("--compare-rounds", type=int, default=1)
    parser.add_argument("--compare-head", choices=("venv", "here"), default="venv",
                        help="venv: HEAD runs from a clean virtualenv with this checkout "
                             "installed editable, as the compared commits run from theirs "
                             "(install_checkout); here: with this interpreter")
    parser.add_argument("--compare-floor", action=argparse.BooleanOptionalAction, default=True,
                        help="also run the floor (whole process) after each HEAD run of a "
                             "fixed bound, and print every commit's ratio to it")
    parser.add_argument("--compare-cases", type=lambda s: [c for c in s.split(",") if c],
                        default=None,
                        help="bounds to compare, e.g. 4,auto,4:pt1,auto:pt1 (pt1: "
                             "mechanism.pre_threshold: 1); default --compare-bound")
    parser.add_argument("--compare-growth", type=_ints, default=[],
                        help="more row counts, e.g. 3e7,1e8: the first case's spec (gaussian) "
                             "on that many rows, every commit in turns each round, and each "
                             "commit's time there over its time at --rows")
    parser.add_argument("--compare-heavy", type=lambda s: [m for m in s.split(",") if m],
                        default=[],
                        help="heavy-user modes of benchmarks/heavy_modes.py (e.g. "
                             "fixed,auto,l1,aggregates): every commit in turns each round, "
                             "exit code, CPU, wall and peak RSS side by side")
    parser.add_argument("--compare-kinds", type=lambda s: [k for k in s.split(",") if k],
                        default=["gaussian"],
                        help="mechanism kinds compared (default gaussian), e.g. "
                             "gaussian,quantiles: every kind on the same data (with "
                             "quantiles, the main data plus a value column 'amount', "
                             "datagen.values), and each kind's ratio to gaussian per commit")
    parser.add_argument("--only", default=None,
                        help="comma-separated subset of: main, peer, scaling, keys, startup, "
                             "large, compare, workers (default: all but compare and "
                             "workers; with --compare: compare)")
    args = parser.parse_args(argv)
    args.key_rows = args.key_rows or args.rows
    args.data_dir = os.path.abspath(args.data_dir)
    os.makedirs(args.data_dir, exist_ok=True)
    # a work folder of this run's own: two benchmarks on one --data-dir never share an
    # output path or its lock
    work = tempfile.mkdtemp(prefix="work-", dir=args.data_dir)
    os.makedirs(os.path.join(work, "out"))
    try:
        return _tables(args, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _tables(args, work):
    only = set((args.only or ("compare" if args.compare else
                              "main,peer,scaling,keys,startup,large")).split(","))
    print(f"# thresher bench_release: {os.cpu_count()} cores, load {os.getloadavg()}, "
          f"python {sys.version.split()[0]}")
    if (args.compare_growth or args.compare_heavy) and "compare" not in only:
        print("# --compare-growth and --compare-heavy are part of the comparison: ignored "
              "without --compare (or --only compare)")
    if "compare" in only:
        compare_table(args, work)
    if "workers" in only:
        workers_table(args, work)
    if "main" in only:
        main_table(args, work)
    if "peer" in only:
        peer_table(args, work)
    if "scaling" in only:
        scaling_table(args, work)
    if "keys" in only:
        keys_table(args, work)
    if "startup" in only:
        startup_table(args, work)
    if "large" in only:
        large_table(args, work)
    return 0


if __name__ == "__main__":
    sys.exit(main())

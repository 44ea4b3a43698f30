"""What each stage of a release hands on, in elements, rows and encoded bytes (docs/scale.md).

Runs one real release (``thresher run``'s code path, Beam's in-process runner) on
``benchmarks/datagen.py`` data with its user and key shuffles kept *in the runner*, as on
Flink, Spark or Dataflow (the in-process spill folder is switched off, so the shuffled
elements are Arrow tables, not file names), and measures, per stage, what its DoFn
yields: the number of elements, their rows, and their bytes in the encoding the runner
moves them in (``transforms.plumbing.arrow_coder.ArrowTableCoder``: Arrow IPC), with the
largest element. The measuring wraps the stages' DoFns in this process only (nothing in
the package changes); the release itself is the ordinary one.

    python -m benchmarks.shuffle_volume --rows 1e6                 # gaussian, C = 8
    python -m benchmarks.shuffle_volume --rows 1e7 --bound auto
    python -m benchmarks.shuffle_volume --rows 1e6 --json          # one JSON object

Encoding every shuffled element once more costs a memcpy per byte (a few % of the run).
Figures are per input row and in total; ``docs/scale.md`` extrapolates them to 1e11 rows.
"""
import argparse
import functools
import json
import os
import pickle
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

NAMESPACE = "shuffle_volume"

# (stage, what it is): in pipeline order; "shuffled" says whether the runner moves the
# elements between workers (a GroupByKey's input, a side input) or they stay in a fused stage.
STAGES = (
    ("read", "prepared read batches (__user, __user_lo, __key, key columns)", "fused"),
    ("prereduce", "pre-reduced tables (fixed l0 bound only)", "fused"),
    ("user_shuffle", "(user shard, table) pieces into GroupUserShards", "GroupByKey"),
    ("user_shard", "one user shard after the shuffle (all rows of its users)", "element"),
    ("partial_counts", "per (user shard, key) counts after PerUserBound", "fused"),
    ("stats_partials", "auto: (key shard, 15 int64 columns) into the score's GroupByKey",
     "GroupByKey"),
    ("stats_dropped", "auto: dropped-contribution vector per user shard", "global combine"),
    ("running_counts", "auto: per (user shard, key) running counts waiting for C",
     "materialised"),
    ("key_shuffle", "(key shard, partial counts) into GroupKeyShards", "GroupByKey"),
    ("key_counts", "one row per key after SumCountsPerKey", "fused"),
    ("released", "released tables gathered by the writer (one AsList side input)",
     "side input"),
)


def _encoded(value):
    """(rows, bytes) of one element as the runner would move it."""
    import pyarrow as pa
    from thresher.transforms.plumbing.arrow_coder import ArrowTableCoder
    if isinstance(value, pa.Table):
        return value.num_rows, len(ArrowTableCoder().encode(value))
    if isinstance(value, tuple) and len(value) == 2 and isinstance(value[1], pa.Table):
        rows, size = _encoded(value[1])
        return rows, size + 2          # the shard id as a varint
    return 1, len(pickle.dumps(value))


def _record(stage, value):
    from apache_beam.metrics import Metrics
    rows, size = _encoded(value)
    Metrics.counter(NAMESPACE, f"{stage}.elements").inc()
    Metrics.counter(NAMESPACE, f"{stage}.rows").inc(rows)
    Metrics.counter(NAMESPACE, f"{stage}.bytes").inc(size)
    Metrics.distribution(NAMESPACE, f"{stage}.element_bytes").update(size)
    Metrics.distribution(NAMESPACE, f"{stage}.element_rows").update(rows)


def _measured(stage, generator_fn, tagged=None):
    """``generator_fn`` with every output recorded under ``stage`` (TaggedOutputs under
    ``tagged[tag]``; WindowedValues by their value)."""
    from apache_beam.pvalue import TaggedOutput
    from apache_beam.utils.windowed_value import WindowedValue

    @functools.wraps(generator_fn)
    def wrapper(*args, **kwargs):
        out = generator_fn(*args, **kwargs)
        if out is None:
            return
        for item in out:
            value = item.value if isinstance(item, (WindowedValue, TaggedOutput)) else item
            name = stage
            if isinstance(item, TaggedOutput):
                name = (tagged or {}).get(item.tag)
            if name is not None:
                _record(name, value)
            yield item
    return wrapper


def instrument():
    """Wrap the stages' DoFns (this process only) and keep the shuffles in the runner."""
    from thresher.pipelines.dataio import io
    from thresher.pipelines.running import release
    from thresher.transforms.bounding import per_user_bound, prereduce, scored_bound, user_shards
    from thresher.transforms.plumbing import aggregate

    io._PrepareBatches.process = _measured("read", io._PrepareBatches.process)
    prereduce._PreReduceFn._flush = _measured("prereduce", prereduce._PreReduceFn._flush)
    user_shards._SplitByUser._split = _measured("user_shuffle", user_shards._SplitByUser._split)
    user_shards._concat_shard = _measured("user_shard", user_shards._concat_shard)
    # the automatic bound's pass concatenates its shards itself (issue 43)
    with_order = scored_bound.concat_shard_with_order

    def concat_recorded(*args, **kwargs):
        table, order = with_order(*args, **kwargs)
        if table is not None:
            _record("user_shard", table)
        return table, order
    scored_bound.concat_shard_with_order = concat_recorded
    per_user_bound._BoundL0Fn.process = _measured("partial_counts",
                                                  per_user_bound._BoundL0Fn.process)
    scored_bound._ScoredBoundFn.process = _measured(
        "running_counts", scored_bound._ScoredBoundFn.process,
        tagged={"dropped": "stats_dropped", "partials": "stats_partials"})
    aggregate._SplitByKey.process = _measured("key_shuffle", aggregate._SplitByKey.process)
    aggregate.SumCountsPerKey.per_shard = staticmethod(
        _measured("key_counts", aggregate._sum_shard))

    finish = release.finish

    def finish_recorded(unused, tables, *args, **kwargs):
        tables = list(tables)
        for table in tables:
            _record("released", table)
        return finish(unused, tables, *args, **kwargs)
    release.finish = finish_recorded
    release._spill_dir = lambda pipeline, staging: None   # shuffles in the runner

    captured = {}
    metrics = release._metrics

    def keep_result(result):
        captured["result"] = result
        captured["diagnostics"] = metrics(result)
        return captured["diagnostics"]
    release._metrics = keep_result
    return captured


def _read_metrics(result):
    from apache_beam.metrics.metric import MetricsFilter
    query = result.metrics().query(MetricsFilter().with_namespace(NAMESPACE))
    out = {}
    for c in query["counters"]:
        stage, what = c.key.metric.name.rsplit(".", 1)
        out.setdefault(stage, {})[what] = out.get(stage, {}).get(what, 0) + c.committed
    for d in query["distributions"]:
        stage, what = d.key.metric.name.rsplit(".", 1)
        entry = out.setdefault(stage, {})
        entry[f"max_{what}"] = max(entry.get(f"max_{what}", 0), d.committed.max or 0)
    return out


def _spec(data, out, bound, kind):
    return {"name": "shuffle_volume",
            "input": {"path": data, "format": "parquet", "user": "user_id", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": kind},
            "output": {"path": out}}


def measure(rows, bound=8, kind="gaussian", data_dir=None, seed=8, rows_per_shard=None):
    """Run one release and return {stage: {elements, rows, bytes, max_element_bytes, ...}}
    plus the run's facts (rows, shards, wall and CPU seconds, released keys).
    ``rows_per_shard``: override ``pipelines.dataio.io.ROWS_PER_SHARD`` (fewer, larger user
    and key shards, as at 1e11 rows where MAX_SHARDS caps their number)."""
    from benchmarks.bench_release import ensure_data
    captured = instrument()
    from thresher.pipelines import api
    from thresher.pipelines.dataio import io
    if rows_per_shard is not None:
        io.ROWS_PER_SHARD = int(rows_per_shard)
    from thresher.pipelines.running import release
    data = ensure_data(data_dir or os.path.join(ROOT, "benchmarks", "data"), rows, seed)
    with tempfile.TemporaryDirectory(prefix="shuffle_volume_") as work:
        plan = api.plan(_spec(data, os.path.join(work, "out"), bound, kind))
        wall, cpu = time.perf_counter(), time.process_time()
        report = release.run(plan, overwrite=True)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    stages = _read_metrics(captured["result"])
    return {"rows": rows, "kind": kind, "bound": bound,
            "num_shards": io.num_shards_for(rows, exact=True),
            "input_bytes": os.path.getsize(data),
            "released_keys": report.get("released_keys"),
            "chosen_bound": report.get("bounding", {}).get("max_keys_per_user"),
            "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
            "load": round(os.getloadavg()[0], 2), "stages": stages,
            "diagnostics": captured.get("diagnostics", {})}


def kernel_memory(rows, bound=8, data_dir=None, seed=8, path=None):
    """Peak memory of the bounding kernel on one user shard of ``rows`` rows (the first
    rows of the 1e7-row data set, prepared as the reader prepares them): the rise of this
    process's resident high-water mark (VmHWM, reset through /proc/self/clear_refs once the
    shard is built) while ``bound_table_l0`` + ``count_per_key`` (a fixed C) or
    ``scored_table`` (``auto``) run. Linux only; run it in a fresh process per size."""
    import gc
    import pyarrow as pa
    import pyarrow.parquet as pq
    from benchmarks.bench_release import ensure_data
    from thresher.accounting import contribution_bound
    from thresher.pipelines.dataio.io import prepare_batch
    from thresher.transforms.bounding.per_user_bound import bound_table_l0, count_per_key
    from thresher.transforms.bounding.scored_bound import scored_table
    from thresher.transforms.bounding.user_shards import exact_users
    from thresher.transforms.randomness import keyed_random
    from thresher.transforms.randomness.user_identity import TEST_KEY
    path = path or ensure_data(data_dir or os.path.join(ROOT, "benchmarks", "data"),
                               max(rows, 10_000_000), seed)
    batches, n = [], 0
    for batch in pq.ParquetFile(path).iter_batches(batch_size=1 << 18,
                                                   columns=["user_id", "word"]):
        batches.append(batch)
        n += batch.num_rows
        if n >= rows:
            break
    raw = pa.Table.from_batches(batches).slice(0, rows)
    table, _ = prepare_batch(raw, "user_id", ["word"], identity_key=TEST_KEY)
    table = exact_users(table.combine_chunks())
    del raw, batches
    gc.collect()
    source = keyed_random.StageSource(keyed_random.KeyedSource(b"s" * 32), "PerUserBound")

    def rss_kb(field):
        with open("/proc/self/status", encoding="ascii") as handle:
            for line in handle:
                if line.startswith(field):
                    return int(line.split()[1])
        return 0
    with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
        handle.write("5")                       # reset VmHWM to the current RSS
    before = rss_kb("VmRSS:")
    t0 = time.process_time()
    if bound == "auto":
        score = contribution_bound.make_score(
            "laplace_l0", contribution_bound.default_candidates(128), 128,
            {"epsilon": 0.9, "delta": 1e-8})
        out = scored_table(table, ["word"], score, source)
    else:
        kept = bound_table_l0(table, ["word"], int(bound), source)
        out = count_per_key(table.take(pa.array(kept)), ["word"])
    cpu = time.process_time() - t0
    peak = rss_kb("VmHWM:")
    del out
    return {"rows": rows, "bound": bound, "shard_table_mb": round(table.nbytes / 1e6, 1),
            "kernel_peak_mb": round((peak - before) / 1024, 1),
            "kernel_bytes_per_row": round((peak - before) * 1024 / rows, 1),
            "kernel_cpu_s": round(cpu, 2)}


def print_table(result):
    rows = result["rows"]
    print(f"# {result['kind']}, max_keys_per_user {result['bound']} "
          f"(chosen {result['chosen_bound']}), {rows:,} rows, {result['num_shards']} shards, "
          f"input {result['input_bytes'] / rows:.1f} B/row (Parquet, zstd), "
          f"{result['released_keys']} keys released; wall {result['wall_s']} s, "
          f"CPU {result['cpu_s']} s (this process), load {result['load']}")
    diagnostics = result.get("diagnostics") or {}
    if diagnostics:
        print("# operator counters (not private): " + ", ".join(
            f"{k} {v:,}" for k, v in sorted(diagnostics.items())))
    print("| stage | moved by | elements | rows | rows per input row | bytes | "
          "bytes per input row | largest element: rows, MB |")
    print("|---|---|---:|---:|---:|---:|---:|---|")
    for stage, _, how in STAGES:
        s = result["stages"].get(stage)
        if not s:
            continue
        print(f"| {stage} | {how} | {s['elements']:,} | {s['rows']:,} | "
              f"{s['rows'] / rows:.4f} | {s['bytes']:,} | {s['bytes'] / rows:.2f} | "
              f"{s.get('max_element_rows', 0):,}, {s.get('max_element_bytes', 0) / 1e6:.1f} |")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, default=1e6)
    parser.add_argument("--bound", default="8", help="max_keys_per_user: an int or auto")
    parser.add_argument("--kind", default="gaussian")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--rows-per-shard", type=float, default=None,
                        help="override ROWS_PER_SHARD (default 1e6): larger shards")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--kernel", action="store_true",
                        help="only the bounding kernel's peak memory on one shard of --rows rows")
    args = parser.parse_args(argv)
    bound = args.bound if args.bound == "auto" else int(args.bound)
    if args.kernel:
        print(json.dumps(kernel_memory(int(args.rows), bound, args.data_dir, args.seed)))
        return
    result = measure(int(args.rows), bound, args.kind, args.data_dir, args.seed,
                     args.rows_per_shard)
    if args.json:
        print(json.dumps(result, sort_keys=True))
    else:
        print_table(result)


if __name__ == "__main__":
    main()

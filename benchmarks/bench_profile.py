"""Where the time of one ``thresher run`` goes: cProfile of the whole process, by stage.

    python benchmarks/bench_profile.py CONFIG [--top 25] [--save prof.out] [--cpu]

Runs ``pipelines.cli run CONFIG --overwrite --quiet`` under cProfile in this process and
prints (1) seconds per stage, from the cumulative time of each stage's entry point, and
(2) the functions with the most own time. The stages are disjoint except "imports",
which also happen inside "pipeline construction" (listed for scale; the remainder line
does not subtract them twice). "Beam runner" is the runner's time outside thresher's DoFns
(encoding, the in-memory shuffle, bundle bookkeeping). cProfile slows Python-heavy code
(the runner) more than numpy/pyarrow kernels, so the runner's share is an upper bound.
``--cpu`` times by the process's CPU time (``time.process_time``) instead of the wall
clock: on a loaded machine, or where a stage waits on the disk (the spill folder's
files), the two differ, and CPU time is what grows with the rows.
"""
import argparse
import cProfile
import os
import pstats
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

# (stage, where its time is): "module:qualname" of a function (its cumulative time), or a
# list of substrings of pstats' "file:line(function)" labels (summed over matches).
STAGES = [
    ("read Parquet", "thresher.pipelines.dataio.io:_ReadParquetRowGroup.process"),
    ("read Parquet (Beam parquetio)", ["parquetio.py", "(read_records)"]),
    ("prepare: drop, hash users+keys", "thresher.pipelines.dataio.io:prepare_batch"),
    ("pre-reduce: all (combine, decide, kernel)", "thresher.transforms.bounding.prereduce:_PreReduceFn._flush"),
    ("  of which the decision", "thresher.transforms.bounding.prereduce:heavy_user_rows"),
    ("  of which the l0 kernel", "thresher.transforms.bounding.prereduce:prereduce_l0"),
    ("split batches by user shard", "thresher.transforms.bounding.user_shards:_SplitByUser._split"),
    ("concat a user shard", "thresher.transforms.bounding.user_shards:_concat_shard"),
    ("bound: bound_table_l0 kernel", "thresher.transforms.bounding.per_user_bound:bound_table_l0"),
    ("bound: take + count per key", "thresher.transforms.bounding.per_user_bound:count_per_key"),
    ("choose contribution bound", "thresher.transforms.bounding.choose_contribution_bound:_UserStatisticsFn.process"),
    ("choose contribution bound: key costs", "thresher.transforms.bounding.choose_contribution_bound:shard_key_costs"),
    ("aggregate: split by key shard", "thresher.transforms.plumbing.aggregate:_SplitByKey.process"),
    ("aggregate: sum per key", "thresher.transforms.plumbing.aggregate:_sum_shard"),
    ("release kernel (NoisyThreshold)", "thresher.transforms.selection.release_fn:ReleaseBatchFn.process"),
    ("release kernel (PWS)", ["transforms/selection/sanitize_sample.py", "(process)"]),
    ("release kernel (S&T)", ["transforms/selection/sample_and_threshold.py", "(process)"]),
    ("write Parquet", ["parquetio.py", "(write_record)"]),
]


def _code_key(target):
    """pstats key (file, first line, name) of "module:qualname", or None if absent."""
    import importlib
    module_name, qualname = target.split(":")
    try:
        obj = importlib.import_module(module_name)
        for part in qualname.split("."):
            obj = getattr(obj, part)
    except (ImportError, AttributeError):
        return None
    code = getattr(obj, "__code__", None)
    return (code.co_filename, code.co_firstlineno, code.co_name) if code else None


def _cum(stats, target):
    if isinstance(target, str):
        key = _code_key(target)
        entry = stats.stats.get(key) if key else None
        return entry[3] if entry else 0.0
    total = 0.0
    for (filename, line, name), (_, _, _, ct, _) in stats.stats.items():
        label = f"{filename}:{line}({name})"
        if all(p in label for p in target):
            total += ct
    return total


def profile(config, save=None, top=25, cpu=False):
    from thresher.pipelines.cli import main
    profiler = cProfile.Profile(time.process_time) if cpu else cProfile.Profile()
    t0 = time.perf_counter()
    profiler.enable()
    rc = main(["run", config, "--overwrite", "--quiet"])
    profiler.disable()
    wall = time.perf_counter() - t0
    if save:
        profiler.dump_stats(save)
    stats = pstats.Stats(profiler)
    total = stats.total_tt
    run_stages = _cum(stats, ["fn_runner.py", "(run_stages)"])
    imports = _cum(stats, ["<frozen importlib._bootstrap>", "(_find_and_load)"])
    print(f"# rc={rc}; profiled wall {wall:.2f} s (total profiled {total:.2f} s of "
          f"{'CPU' if cpu else 'wall'} time); load {os.getloadavg()[0]:.1f}")
    print(f"{'stage':<36} {'seconds':>8} {'share':>6}")
    inside = 0.0
    for stage, parts in STAGES:
        seconds = _cum(stats, parts)
        if seconds:
            inside += seconds if not stage.startswith("  ") else 0.0
            print(f"{stage:<36} {seconds:>8.2f} {seconds / total:>6.0%}")
    runner = max(0.0, run_stages - inside)
    print(f"{'Beam runner (outside DoFns)':<36} {runner:>8.2f} {runner / total:>6.0%}")
    rest = max(0.0, total - run_stages)
    print(f"{'start-up, construction, report':<36} {rest:>8.2f} {rest / total:>6.0%}"
          f"   (of which imports {imports:.2f})")
    print(f"\n# top {top} functions by own time")
    stats.sort_stats("tottime").print_stats(top)
    return rc


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("config")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--save", default=None)
    parser.add_argument("--cpu", action="store_true",
                        help="time by the process's CPU time, not the wall clock")
    args = parser.parse_args(argv)
    return profile(args.config, args.save, args.top, args.cpu)


if __name__ == "__main__":
    sys.exit(main())

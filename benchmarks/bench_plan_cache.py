"""``thresher plan`` for the sample-and-threshold specs, first and second run with a fresh
calibration cache (pipelines/common/calibration_cache.py), and the refusal of a fixed
(sampling_rate, threshold) that misses the budget. Prints one line per run: wall time,
CPU time (user + sys of the plan process, from wait4), its peak RSS, the exit code and
the 1-minute load average (the machine is shared: CPU time is the figure load distorts
least). ``--import-floor`` adds the plan of the bundled gaussian quickstart (no
sample-and-threshold calibration: what every plan costs in imports). Figures in
docs/performance.md (calibration cache) and docs/sample_and_threshold.md (issue 38).

    python -m benchmarks.bench_plan_cache [--runs 2] [--import-floor]
        [--before-python /path/to/python --before-root /path/to/its/checkout]
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import yaml

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = ROOT / "configs" / "examples" / "heavy_hitters.yaml"


def specs(folder):
    """(label, path): the example (trie, 3 levels), heavy_hitters without method or
    prefix_lengths (the default-method rule), sample_and_threshold at C = 16 and 64, and two
    fixed settings that miss over 3 levels."""
    base = yaml.safe_load(EXAMPLE.read_text())
    base["input"]["path"] = str(ROOT / base["input"]["path"])
    out = [("heavy_hitters example (trie, 3 levels)", EXAMPLE)]
    variants = {
        "heavy_hitters default method": {"kind": "heavy_hitters", "top_k": 20},
        "sample_and_threshold C=16": {"kind": "sample_and_threshold"},
        "sample_and_threshold C=64": {"kind": "sample_and_threshold"},
        "trie p=0.1 tau=8 (misses)": {**base["mechanism"], "sampling_rate": 0.1, "threshold": 8},
        "trie p=0.9 tau=10 (misses)": {**base["mechanism"], "sampling_rate": 0.9,
                                       "threshold": 10},
    }
    for i, (label, mechanism) in enumerate(variants.items()):
        path = pathlib.Path(folder) / f"spec{i}.yaml"
        bounding = {"max_keys_per_user": 64} if "C=64" in label else base["bounding"]
        path.write_text(yaml.safe_dump({**base, "bounding": bounding, "mechanism": mechanism}))
        out.append((label, path))
    return out


def plan(path, env, python=sys.executable, root=ROOT):
    """(wall s, CPU s, peak RSS MiB, exit code) of one ``thresher plan`` process."""
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        proc = subprocess.Popen([python, "-m", "thresher", "plan", str(path)],
                               cwd=root, env=env, stdout=sink, stderr=sink)
        _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    return (time.perf_counter() - start, usage.ru_utime + usage.ru_stime,
            usage.ru_maxrss / 1024, proc.returncode)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--import-floor", action="store_true")
    parser.add_argument("--before-python", help="an interpreter with an earlier thresher "
                        "installed (e.g. main's): each spec is planned by it too, first")
    parser.add_argument("--before-root", default=str(ROOT),
                        help="working folder of the --before-python runs")
    args = parser.parse_args(argv)
    builds = [("now", sys.executable, ROOT)]
    if args.before_python:
        builds.insert(0, ("before", args.before_python, args.before_root))
    with tempfile.TemporaryDirectory() as folder:
        todo = specs(folder)
        if args.import_floor:
            todo.insert(0, ("gaussian quickstart (imports only)",
                            ROOT / "configs" / "examples" / "quickstart.yaml"))
        for label, path in todo:
            for build, python, root in builds:
                env = {**os.environ,
                       "THRESHER_CACHE_DIR": str(pathlib.Path(folder) / build / label[:24])}
                for run in range(1, args.runs + 1):
                    wall, cpu, rss, code = plan(path, env, python, root)
                    print(f"{label:40s} {build:6s} run {run}: wall {wall:5.1f} s  "
                          f"CPU {cpu:5.2f} s  peak RSS {rss:4.0f} MiB  exit {code}  "
                          f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()

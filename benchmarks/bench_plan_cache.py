"""Wall time of ``thresher plan`` for the sample-and-threshold specs, first and second run
with a fresh calibration cache (pipelines/calibration_cache.py), and of the refusal of a
fixed (sampling_rate, threshold) that misses the budget. Prints one line per run with the
exit code and the 1-minute load average (the machine is shared: compare runs made at a
similar load). Figures in docs/performance.md (calibration cache).

    python -m benchmarks.bench_plan_cache [--runs 2]
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
    prefix_lengths (the default-method rule), sample_and_threshold at C = 16, and two
    fixed settings that miss over 3 levels."""
    base = yaml.safe_load(EXAMPLE.read_text())
    base["input"]["path"] = str(ROOT / base["input"]["path"])
    out = [("heavy_hitters example (trie, 3 levels)", EXAMPLE)]
    variants = {
        "heavy_hitters default method": {"kind": "heavy_hitters", "top_k": 20},
        "sample_and_threshold C=16": {"kind": "sample_and_threshold"},
        "trie p=0.1 tau=8 (misses)": {**base["mechanism"], "sampling_rate": 0.1, "threshold": 8},
        "trie p=0.9 tau=10 (misses)": {**base["mechanism"], "sampling_rate": 0.9,
                                       "threshold": 10},
    }
    for i, (label, mechanism) in enumerate(variants.items()):
        path = pathlib.Path(folder) / f"spec{i}.yaml"
        path.write_text(yaml.safe_dump({**base, "mechanism": mechanism}))
        out.append((label, path))
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=2)
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        for label, path in specs(folder):
            env = {**os.environ, "THRESHER_CACHE_DIR": str(pathlib.Path(folder) / label[:20])}
            for run in range(1, args.runs + 1):
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, "-m", "thresher", "plan", str(path)],
                                      cwd=ROOT, env=env, capture_output=True, text=True)
                took = time.perf_counter() - start
                print(f"{label:40s} run {run}: {took:6.1f} s  exit {proc.returncode}  "
                      f"load {os.getloadavg()[0]:.1f}", flush=True)


if __name__ == "__main__":
    main()

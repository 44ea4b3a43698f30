"""Wall seconds of ``thresher plan`` for a GIVEN mechanism.threshold (cache off), per kind
and max_keys_per_user: the figures behind pipelines.common.limits.THRESHOLD_MAX.

    python benchmarks/bench_fixed_threshold.py [--timeout 60] [--thresholds 1000,2000,5000]

Prints one row per (kind, C, threshold): seconds (or ">timeout") and the exit code.
Wall time depends on the machine's load; the figure in docs/performance.md names it.
"""
import argparse
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import yaml

DATA = pathlib.Path(__file__).resolve().parents[1] / "configs/examples/data/quickstart.parquet"


def spec(kind, c, tau, out):
    mech = {"kind": kind, "threshold": tau}
    if kind == "heavy_hitters":
        mech["method"] = "trie"
    return {"name": "t", "input": {"path": str(DATA), "keys": ["word"], "user": "user_id"},
            "bounding": {"max_keys_per_user": c}, "mechanism": mech,
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "output": {"path": out}}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--timeout", type=float, default=60.0)
    ap.add_argument("--thresholds", default="1000,2000,5000")
    ap.add_argument("--bounds", default="16,64")
    ap.add_argument("--kinds", default="sample_and_threshold,heavy_hitters")
    args = ap.parse_args()
    env = {**os.environ, "THRESHER_CACHE_DIR": "off"}
    print(f"load average at start: {os.getloadavg()[0]:.2f}")
    with tempfile.TemporaryDirectory() as tmp:
        for kind in args.kinds.split(","):
            for c in map(int, args.bounds.split(",")):
                for tau in map(int, args.thresholds.split(",")):
                    path = pathlib.Path(tmp) / "s.yaml"
                    path.write_text(yaml.safe_dump(spec(kind, c, tau, tmp + "/out")))
                    start = time.perf_counter()
                    try:
                        rc = subprocess.run([sys.executable, "-m", "thresher", "plan", str(path)],
                                            env=env, capture_output=True,
                                            timeout=args.timeout).returncode
                        took = f"{time.perf_counter() - start:.1f}"
                    except subprocess.TimeoutExpired:
                        rc, took = "-", f">{args.timeout:g}"
                    print(f"{kind:22s} C={c:<4d} threshold={tau:<6d} {took:>6s} s  exit {rc}  "
                          f"load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()

"""Heavy user under every bound mode (issue 43, item 2): data, specs and a measuring run.

The data are ``benchmarks/heavy_user.py``'s (one user ``heavy`` with ``--heavy-rows`` rows
among ``--users`` ordinary users of 20 rows each; with ``--same-key`` all of the heavy
user's rows are on one key, else each on its own key). One spec per mode below; each is
run through the CLI under ``/usr/bin/time -v`` and a table of (exit code, CPU seconds
(user + system, waited-for children included), wall seconds, peak RSS, 1-minute load at
the end) is printed. ``public_keys*`` modes read ``domain.parquet`` (keys k0..k1199)
written beside the specs:

    python benchmarks/heavy_modes.py /tmp/heavy --heavy-rows 10000000
    python benchmarks/heavy_modes.py /tmp/heavy --run [--python PATH] [--modes l1,auto]

Deterministic data (``--seed``); the figures are timings on whatever machine runs them.
"""
import argparse
import os
import re
import subprocess
import sys
import time

import yaml

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import heavy_user  # noqa: E402

# The data's defaults (``main``'s flags and ``bench_release --compare-heavy``): one user of
# HEAVY_ROWS rows among USERS users of ROWS_PER_USER rows, ROW_GROUP-row groups, SEED.
HEAVY_ROWS, USERS, ROWS_PER_USER, ROW_GROUP, SEED = 10_000_000, 5000, 20, 1 << 20, 30


def generate(path, heavy_rows=HEAVY_ROWS, users=USERS, seed=SEED, same_key=False):
    """``heavy_user.generate`` with this benchmark's shape: the number of rows written."""
    return heavy_user.generate(path, heavy_rows, users, ROWS_PER_USER, ROW_GROUP, seed,
                               same_key)


QUANTILES = {"kind": "quantiles", "column": "amount", "ranks": [0.5], "domain": [0, 20]}
MODES = {
    "fixed": {"bounding": {"max_keys_per_user": 4}},
    "auto": {"bounding": {"max_keys_per_user": "auto"}},
    "l1": {"bounding": {"max_keys_per_user": 4, "model": "l1"}, "mechanism": {"kind": "laplace"}},
    "adaptive": {"bounding": {"max_keys_per_user": 4}, "mechanism": {"kind": "adaptive"}},
    "aggregates": {"bounding": {"max_keys_per_user": 4},
                   "aggregates": [{"column": "amount", "statistic": "sum", "clip": [0.0, 10.0]}]},
    "aggregates_auto": {"bounding": {"max_keys_per_user": 4},
                        "aggregates": [{"column": "amount", "statistic": "mean",
                                        "clip": "auto"}]},
    "quantiles": {"bounding": {"max_keys_per_user": 4}, "mechanism": QUANTILES},
    "heavy_hitters_trie": {"bounding": {"max_keys_per_user": 4},
                           "mechanism": {"kind": "heavy_hitters", "top_k": 5, "method": "trie"}},
    "heavy_hitters_adaptive": {"bounding": {"max_keys_per_user": 4},
                               "mechanism": {"kind": "heavy_hitters", "top_k": 5,
                                             "method": "adaptive"}},
    # a public key domain (the ordinary keys k0..k199 and the heavy user's first 1,000):
    # write_specs points input.public_keys at domain.parquet beside the data
    "public_keys": {"bounding": {"max_keys_per_user": 4}, "public_keys": True},
    "public_keys_aggregates": {"bounding": {"max_keys_per_user": 4}, "public_keys": True,
                               "aggregates": [{"column": "amount", "statistic": "sum",
                                               "clip": [0.0, 10.0]}]},
}
DOMAIN_KEYS = 1200     # k0 .. k1199: heavy_user.py's ordinary keys and 1,000 of the heavy's


def write_domain(folder):
    import pyarrow as pa
    import pyarrow.parquet as pq
    path = os.path.join(os.path.abspath(folder), "domain.parquet")
    pq.write_table(pa.table({"word": [f"k{i}" for i in range(DOMAIN_KEYS)]}), path)
    return path


def write_specs(folder, data):
    domain = write_domain(folder)
    for name, change in MODES.items():
        change = dict(change)
        doc = {"name": f"heavy-{name}",
               "input": {"path": os.path.abspath(data), "format": "parquet",
                         "user": "user_id", "keys": ["word"]},
               "privacy": {"epsilon": 1.0, "delta": 1.0e-8},
               "mechanism": {"kind": "gaussian"},
               "output": {"path": os.path.join(os.path.abspath(folder), "out", name)}}
        if change.pop("public_keys", False):
            doc["input"]["public_keys"] = {"path": domain}
        for section, values in change.items():
            if isinstance(values, dict) and section != "mechanism":
                doc.setdefault(section, {}).update(values)
            else:
                doc[section] = values
        with open(os.path.join(folder, f"mode_{name}.yaml"), "w", encoding="utf-8") as handle:
            yaml.safe_dump(doc, handle, sort_keys=False)


def run(folder, python, modes):
    print("| mode | exit | CPU s | wall s | peak RSS MB | load | message |")
    print("|---|---|---|---|---|---|---|")
    for name in modes:
        spec = os.path.join(folder, f"mode_{name}.yaml")
        start = time.time()
        done = subprocess.run(["/usr/bin/time", "-v", python, "-m", "thresher", "run", spec,
                               "--overwrite"], capture_output=True, text=True)
        wall = time.time() - start
        rss = re.search(r"Maximum resident set size \(kbytes\): (\d+)", done.stderr)
        lines = [l for l in done.stderr.splitlines() if l.strip()
                 and not l.startswith("\t") and not l.startswith("Command ")]
        message = lines[-1][:120] if done.returncode and lines else ""
        cpu = sum(float(m) for m in re.findall(
            r"(?:User|System) time \(seconds\): ([0-9.]+)", done.stderr))
        with open("/proc/loadavg", encoding="utf-8") as handle:
            load = handle.read().split()[0]
        print(f"| {name} | {done.returncode} | {cpu:.0f} | {wall:.0f} | "
              f"{int(rss.group(1)) / 1024 if rss else float('nan'):.0f} | {load} | "
              f"{message} |", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--heavy-rows", type=int, default=HEAVY_ROWS)
    parser.add_argument("--users", type=int, default=USERS)
    parser.add_argument("--same-key", action="store_true")
    parser.add_argument("--seed", type=int, default=SEED)
    parser.add_argument("--run", action="store_true")
    parser.add_argument("--python", default=sys.executable)
    parser.add_argument("--modes", default=",".join(MODES))
    args = parser.parse_args(argv)
    os.makedirs(args.folder, exist_ok=True)
    data = os.path.join(args.folder, "heavy.parquet")
    if args.run:
        run(args.folder, args.python, args.modes.split(","))
        return
    n = generate(data, args.heavy_rows, args.users, args.seed, args.same_key)
    write_specs(args.folder, data)
    print(f"{data}: {n} rows")


if __name__ == "__main__":
    main()

"""What keyed randomness costs: streams per second, and releases before/after side by side.

Issue #34 item 1 and issue #36 D13. Three parts, each figure with the 1-minute load:

- ``streams`` (in this process, this checkout): CPU seconds to make one keyed stream per
  row and draw one word of each -- per user (identity words), per (user, key) pair and per
  key (canonical text) -- and a discrete Gaussian per key, at ``--stream-rows`` rows;
- ``releases``: ``thresher run`` end to end in a fresh process (wall, CPU, peak RSS) for
  the quickstart, a 1e7-row gaussian release with ``max_keys_per_user: 4``
  (``benchmarks/bench_release.py``'s data) and a public key domain of ``--domain-keys``
  keys over the quickstart data (D13), once per interpreter given with ``--python``
  (e.g. the system python with main installed, then this checkout's venv);
- ``profile``: the same 1e7-row release under cProfile per interpreter, with the call
  counts of ``hashlib.shake_256`` and of the AES encryptor's ``update_into`` and the
  total function calls (per-row hashing shows as millions of calls).

    python benchmarks/bench_keyed_random.py --python /usr/bin/python3 --python .venv/bin/python
"""
import argparse
import os
import pstats
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from benchmarks import bench_release  # noqa: E402

QUICKSTART = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")


def _load():
    return os.getloadavg()[0]


# ---- streams, in process -------------------------------------------------------------------

def streams(rows):
    import pyarrow as pa
    from thresher.transforms.randomness import keyed_random, samplers
    rng = np.random.default_rng(1)
    words = rng.integers(0, 1 << 64, size=(rows, 2), dtype=np.uint64)
    table = pa.table({"__user": words[:, 0], "__user_lo": words[:, 1],
                      "word": pa.array([f"w{i}" for i in rng.integers(0, rows // 10, rows)])})
    keys = pa.table({"word": pa.array([f"key-{i}" for i in range(rows)])})
    source = keyed_random.StageSource(keyed_random.KeyedSource(bytes(32)), "bench")
    index = np.arange(rows)
    cases = [
        ("user streams, 1 word each", lambda: samplers.uniform_priorities(
            keyed_random.bind_users(source, table, ["word"]).rows(index, "user"), rows)),
        ("(user, key) streams, 1 word each", lambda: samplers.uniform_priorities(
            keyed_random.bind_users(source, table, ["word"]).rows(index, "pair"), rows)),
        ("key streams (text), 1 word each", lambda: samplers.uniform_priorities(
            keyed_random.table_streams(keyed_random.KeyedSource(bytes(32)), None, "bench",
                                       keys, ["word"]), rows)),
        ("key streams, discrete Gaussian sigma=10", lambda: samplers.discrete_gaussian(
            keyed_random.table_streams(keyed_random.KeyedSource(bytes(32)), None, "bench",
                                       keys, ["word"]), 10.0, rows)),
    ]
    construction = getattr(keyed_random, "CONSTRUCTION", "shake256 (before aes256-cbcmac-v1)")
    print(f"\n## keyed streams, {rows:,} rows, in process ({construction})")
    print(f"{'case':<42} {'cpu s':>7} {'M rows/s':>9} {'load 1m':>8}")
    for name, fn in cases:
        fn()   # warm (tables, imports)
        load = _load()
        t0 = time.process_time()
        fn()
        cpu = time.process_time() - t0
        print(f"{name:<42} {cpu:>7.3f} {rows / cpu / 1e6:>9.2f} {load:>8.1f}", flush=True)


# ---- releases, fresh processes -------------------------------------------------------------

def _spec(work, name, data, bound, extra_input=None):
    import yaml
    spec = {"name": name,
            "input": {"path": data, "format": "parquet", "user": "user_id", "keys": ["word"],
                      **(extra_input or {})},
            "privacy": {"epsilon": 1.0, "delta": 1e-8},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "gaussian"},
            "output": {"path": os.path.join(work, "out", name)}}
    path = os.path.join(work, f"{name}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    return path


def domain_file(work, size):
    """A public key domain of ``size`` keys: the quickstart's words and made-up ones."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    words = pq.read_table(QUICKSTART, columns=["word"]).column("word").unique().to_pylist()
    extra = [f"domain-{i}" for i in range(max(0, size - len(words)))]
    path = os.path.join(work, f"domain{size}.parquet")
    pq.write_table(pa.table({"word": (words + extra)[:size]}), path)
    return path


def cases(work, args):
    out = [("quickstart, C=8", _spec(work, "quickstart", QUICKSTART, 8))]
    if args.rows:
        data = bench_release.ensure_data(args.data_dir, args.rows, 8)
        out.append((f"{args.rows:.0e} rows, C=4", _spec(work, "large", data, 4)))
    if args.domain_keys:
        domain = domain_file(work, args.domain_keys)
        out.append((f"public keys {args.domain_keys:.0e}, quickstart data",
                    _spec(work, "domain", QUICKSTART, 8, {"public_keys": {"path": domain}})))
    return out


def releases(work, pythons, args):
    print("\n## thresher run, fresh process per run (wall, CPU = user + sys of the process "
          "tree, peak RSS)")
    print(f"{'case':<36} {'python':<40} {'wall s':>8} {'cpu s':>7} {'RSS MB':>7} {'load 1m':>11}")
    for name, spec in cases(work, args):
        for python in pythons:
            m = bench_release.measure([python, "-m", "thresher.pipelines.cli", "run", spec,
                                       "--overwrite", "--quiet"], cwd=work)
            if m["rc"] != 0:
                tail = " | ".join((m["stderr"] or "").strip().splitlines()[-2:])[:200]
                print(f"{name:<36} {python[-40:]:<40} FAILED rc={m['rc']}: {tail}", flush=True)
                continue
            print(f"{name:<36} {python[-40:]:<40} {m['wall']:>8.2f} {m['cpu']:>7.2f} "
                  f"{m['rss_mb']:>7.0f} {m['load'][0]:>5.1f}->{m['load'][1]:<4.1f}", flush=True)


def profile(work, pythons, args):
    name, spec = cases(work, args)[1 if args.rows else 0]
    print(f"\n## cProfile of {name}: calls of the per-row hashing suspects")
    print(f"{'python':<40} {'shake_256':>10} {'AES update_into':>16} {'all calls':>12} "
          f"{'wall s':>7} {'load 1m':>8}")
    for python in pythons:
        prof = os.path.join(work, "profile.out")
        load = _load()
        t0 = time.perf_counter()
        proc = subprocess.run([python, "-m", "cProfile", "-o", prof, "-m",
                               "thresher.pipelines.cli", "run", spec, "--overwrite", "--quiet"],
                              cwd=work, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if proc.returncode != 0:
            print(f"{python[-40:]:<40} FAILED: {proc.stderr.strip().splitlines()[-1:]}")
            continue
        stats = pstats.Stats(prof)
        counts = {"shake_256": 0, "update_into": 0}
        for (filename, _, function), (_, ncalls, *_rest) in stats.stats.items():
            for needle in counts:
                if needle in function:
                    counts[needle] += ncalls
        print(f"{python[-40:]:<40} {counts['shake_256']:>10,} {counts['update_into']:>16,} "
              f"{stats.total_calls:>12,} {wall:>7.1f} {load:>8.1f}", flush=True)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--python", action="append", default=None,
                        help="interpreter(s) with a thresher installed (default: this one)")
    parser.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--domain-keys", type=lambda s: int(float(s)), default=300_000)
    parser.add_argument("--stream-rows", type=lambda s: int(float(s)), default=1_000_000)
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", "data"))
    parser.add_argument("--only", default="streams,releases,profile")
    args = parser.parse_args(argv)
    only = set(args.only.split(","))
    pythons = args.python or [sys.executable]
    with tempfile.TemporaryDirectory() as work:
        if "streams" in only:
            streams(args.stream_rows)
        if "releases" in only:
            releases(work, pythons, args)
        if "profile" in only:
            profile(work, pythons, args)
    return 0


if __name__ == "__main__":
    sys.exit(main())

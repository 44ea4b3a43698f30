"""Done-when figure for ``mechanism.kind: heavy_hitters`` (issue 17): recall of the true
top 20 keys by distinct users on a real corpus, at epsilon = 1, delta = 1e-6, C = 16.

Corpus: ``benchmarks/docstring_corpus.py`` -- the words of the docstrings of every
installed Python module (standard library + site-packages of this interpreter), built
offline. Two privacy units: one docstring (a document; the default) and one source file.

Each run is a real release (``pipelines.running.release.run``: Beam FnApiRunner, CSPRNG
sampling) of the spec below; recall = |released top 20 ∩ true top 20| / 20, the true
top 20 by distinct users before bounding (ties broken by word).

    python -m benchmarks.bench_heavy_hitters_kind [--unit docstring|file] [--runs 3]
        [--prefix-lengths 2,4,none] [--corpus PATH]
"""
import argparse
import os
import tempfile
import time

import pyarrow.parquet as pq
import yaml

from benchmarks import docstring_corpus
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run


def true_top(path, k):
    table = pq.read_table(path).group_by("word").aggregate([("user", "count_distinct")])
    rows = sorted(zip(table.column("word").to_pylist(), table.column("user_count_distinct").to_pylist()),
                  key=lambda r: (-r[1], r[0]))
    return rows[:k]


def release(path, out, prefix_lengths, top_k=20):
    spec = {"name": "hh-bench", "input": {"path": path, "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "bounding": {"max_keys_per_user": 16},
            "mechanism": {"kind": "heavy_hitters", "top_k": top_k, "prefix_lengths": prefix_lengths},
            "output": {"path": out}}
    spec_path = os.path.join(os.path.dirname(out), "spec.yaml")
    with open(spec_path, "w") as handle:
        yaml.safe_dump(spec, handle)
    report = run(make_plan(spec_mod.load(spec_path)), overwrite=True)
    return report, pq.read_table(os.path.join(out, "released.parquet")).to_pylist()


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--unit", choices=("docstring", "file"), default="docstring")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--prefix-lengths", default="2,4,none")
    ap.add_argument("--corpus", default=None, help="a corpus parquet already built")
    args = ap.parse_args(argv)
    lengths = [None if x.strip().lower() in ("none", "null") else int(x) for x in args.prefix_lengths.split(",")]
    work = tempfile.mkdtemp(prefix="hh-bench-")
    path = args.corpus
    if path is None:
        path = os.path.join(work, f"corpus_{args.unit}.parquet")
        table = docstring_corpus.build(units=(args.unit,))[args.unit]
        pq.write_table(table, path)
        print(f"corpus: {docstring_corpus.describe(table)}, user = one {args.unit}")
    top = true_top(path, 20)
    truth = {w for w, _ in top}
    print(f"true top 20 by distinct users: {', '.join(f'{w} ({c})' for w, c in top)}")
    recalls = []
    for r in range(args.runs):
        started = time.time()
        report, rows = release(path, os.path.join(work, "out"), lengths)
        got = [row["word"] for row in sorted(rows, key=lambda row: row["rank"])]
        recall = len(truth & set(got)) / 20
        recalls.append(recall)
        mech = report["mechanism"]
        print(f"run {r + 1}: recall {recall:.2f} ({len(got)} released; p={mech['sampling_rate']:.4g}, "
              f"tau={mech['threshold']}, release point {mech['release_point']:.0f} users, "
              f"{mech['levels']} levels; {time.time() - started:.0f} s wall)")
    print(f"epsilon=1, delta=1e-6, C=16, prefix_lengths={lengths}, unit={args.unit}: "
          f"recall of the true top 20 min {min(recalls):.2f}, mean {sum(recalls) / len(recalls):.2f} "
          f"over {len(recalls)} runs")


if __name__ == "__main__":
    main()

"""Heavy hitters recall on a small population (issue 28 done-when).

Corpus: ``benchmarks/identifier_corpus.py`` (identifiers of numpy, scipy, pandas and
pyarrow as installed, one user per .py file: 2,810 users, 339,379 (user, word) rows).
Truth: the 20 words with the most distinct users. At epsilon = 1, delta = 1e-6,
max_keys_per_user = ``--bound`` (16), top_k = 20, for each of ``--seeds`` release secrets:

- ``kind: heavy_hitters`` with its default method (chosen by the plan from public
  parameters; printed);
- ``kind: adaptive`` with its defaults, then the top 20 of its released keys by noisy
  count ("adaptive + top-k");
- ``kind: heavy_hitters, method: trie`` (TrieHH++; prefix schedule chosen by the plan,
  the C x L-cell PLD accounting) on the first ``--trie-seeds`` secrets (default: all).

Printed: recall@20 per run, and per method the mean and its standard error over the seeds.
``--points``: instead, the trie's release point tau / p for 1, 2 and 3 levels with the
group-privacy split (``calibrate_levels``) and with the C x L-cell accounting
(``calibrate_trie``), and the adaptive method's point (the default method rule).

    python -m benchmarks.bench_heavy_hitters_recall [--seeds 10] [--trie-seeds N] [--bound C] [--points]
"""
import argparse
import math
import os
import tempfile

import numpy as np
import pyarrow.parquet as pq
import yaml

from benchmarks import identifier_corpus

TOP = 20


def true_top(path, k=TOP):
    table = pq.read_table(path)
    per = table.group_by(["word"]).aggregate([("user", "count_distinct")])
    pairs = sorted(zip(per.column("user_count_distinct").to_pylist(), per.column("word").to_pylist()),
                   key=lambda cw: (-cw[0], cw[1]))
    return [w for _, w in pairs[:k]], pairs[k - 1][0], pairs[k][0]


def release(data, out, mechanism, secret, epsilon=1.0, delta=1e-6, bound=16):
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    from thresher.transforms.randomness.keyed_random import KeyedSource
    spec = {"name": "hh-recall", "input": {"path": data, "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": epsilon, "delta": delta},
            "bounding": {"max_keys_per_user": bound}, "mechanism": mechanism,
            "output": {"path": out}}
    path = out + ".yaml"
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    report = run(make_plan(spec_mod.load(path)), overwrite=True, rng_factory=KeyedSource(secret))
    table = pq.read_table(os.path.join(out, "released.parquet"))
    pairs = sorted(zip(table.column("count").to_pylist(), table.column("word").to_pylist()),
                   key=lambda cw: (-cw[0], cw[1]))
    return [w for _, w in pairs[:TOP]], report


def summary(name, recalls):
    m = float(np.mean(recalls))
    se = float(np.std(recalls, ddof=1) / math.sqrt(len(recalls))) if len(recalls) > 1 else float("nan")
    print(f"{name}: mean recall@{TOP} {m:.3f} (standard error {se:.3f}) over {len(recalls)} "
          f"runs; min hits {int(min(recalls) * TOP)}")
    return m, se


def points(epsilon=1.0, delta=1e-6, bound=16):
    from thresher.accounting import sample_threshold as st
    from thresher.pipelines.kinds.heavy_hitters import release_points
    print(f"epsilon={epsilon:g}, delta={delta:g}, C={bound}: trie release point tau/p")
    for schedule in st.SCHEDULES:
        old = st.calibrate_levels(epsilon, delta, len(schedule), bound)
        new = st.calibrate_trie(epsilon, delta, len(schedule), bound)
        print(f"  {len(schedule)} level(s) {list(schedule)}: group-privacy split p={old.sampling_rate:.5f} "
              f"tau={old.threshold} point={old.threshold / old.sampling_rate:,.1f} | C x L-cell "
              f"{new.composition} p={new.sampling_rate:.5f} tau={new.threshold} "
              f"point={new.release_point:,.1f} delta_spent={new.delta_spent:.3g}", flush=True)
    print(f"  default method rule (1 level): {release_points(epsilon, delta, bound, 1)}")


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--trie-seeds", type=int, default=None)
    ap.add_argument("--points", action="store_true")
    ap.add_argument("--data-dir", default=identifier_corpus.DEFAULT_DATA_DIR)
    ap.add_argument("--bound", type=int, default=16, help="max_keys_per_user (default 16)")
    args = ap.parse_args(argv)
    if args.points:
        return points(bound=args.bound)
    if args.trie_seeds is None:
        args.trie_seeds = args.seeds
    data = identifier_corpus.cached(args.data_dir)
    print(f"corpus: {identifier_corpus.describe(pq.read_table(data))}")
    truth, kth, next_ = true_top(data)
    print(f"true top {TOP}: 20th word has {kth} users, 21st {next_}; max_keys_per_user "
          f"{args.bound}, load {os.getloadavg()[0]:.1f}")
    truth = set(truth)
    methods = {"heavy_hitters (default method)": ({"kind": "heavy_hitters", "top_k": TOP}, args.seeds),
               "adaptive + top-k": ({"kind": "adaptive"}, args.seeds),
               "heavy_hitters method trie": ({"kind": "heavy_hitters", "top_k": TOP,
                                              "method": "trie"}, args.trie_seeds)}
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, (mech, seeds) in methods.items():
            recalls = []
            for s in range(seeds):
                top, report = release(data, os.path.join(tmp, "out"), mech, f"heavy hitters recall secret {s}".encode(),
                                   bound=args.bound)
                hits = len(truth & set(top))
                recalls.append(hits / TOP)
                extra = ""
                if s == 0 and report["mechanism"].get("method"):
                    extra = (f" method={report['mechanism']['method']} release_point="
                             f"{report['mechanism'].get('release_point', float('nan')):.0f}")
                print(f"  {name} secret {s}: {hits}/{TOP} of the true top {TOP}, "
                      f"{report['released_keys']} keys released{extra}", flush=True)
            results[name] = summary(name, recalls)
    hh, ad = results["heavy_hitters (default method)"], results["adaptive + top-k"]
    print(f"done-when: heavy_hitters mean {hh[0]:.3f} >= adaptive+top-k mean - 1 se "
          f"{ad[0] - ad[1]:.3f}: {hh[0] >= ad[0] - ad[1]}")


if __name__ == "__main__":
    main()

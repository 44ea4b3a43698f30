"""CPU cost of the automatic bound's score statistics (the part issue 25 F2 changed).

The exact scores (accounting/exact_scores.py) replace float per-pair terms and float sums
by integer units; this script times, in one process and in CPU seconds (less sensitive to
a loaded machine than wall time), the two kernels of ``transforms.bounding.choose_contribution_bound``
that do the arithmetic, on ``--rows`` rows of ``benchmarks/datagen.py`` data (users =
rows / 10, vocabulary = rows / 10, as ``bench_release.py``) split into ``--shards`` user
shards:

* ``pair_statistics`` per user shard (dropped contributions and per-key partials of h_j(C)
  for the 14 default candidates), from the shard's distinct (user, key) pairs;
* ``shard_key_costs`` per key shard (16), from all user shards' partials.

    python benchmarks/bench_exact_scores.py --rows 1e7          # about a minute

Run it from an older checkout (``--root``) to compare with the float kernels.
"""
import argparse
import os
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=lambda s: int(float(s)), default=10_000_000)
    parser.add_argument("--shards", type=int, default=10)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--root", default=ROOT, help="the checkout whose kernels are timed")
    args = parser.parse_args()
    sys.path.insert(0, args.root)
    import numpy as np
    from thresher.accounting import contribution_bound as cb
    from benchmarks import datagen
    from thresher.transforms.bounding import choose_contribution_bound as ccb
    from thresher.transforms.randomness.hashing import hash_array

    t0 = time.process_time()
    table = datagen.generate(args.rows, users=max(1, args.rows // 10),
                             vocabulary_size=max(1, args.rows // 10), seed=args.seed)
    users = np.asarray(hash_array(table.column("user_id")), dtype=np.uint64)
    keys = np.asarray(hash_array(table.column("word")), dtype=np.uint64)
    print(f"# {args.rows:,} rows generated and hashed in {time.process_time() - t0:.1f} s CPU; "
          f"kernels of {args.root}")
    candidates = cb.default_candidates(128)
    score = cb.make_score("gaussian", candidates, 128, {
        "thresholds": [10.0 + 2 * c for c in candidates],
        "sigmas": [2.0 + c / 8 for c in candidates], "objective": "keys"})
    shard_of = users % np.uint64(args.shards)
    pairs = []
    for s in range(args.shards):
        mine = shard_of == s
        pairs.append(ccb.user_key_pairs(users[mine], keys[mine]))
    n_pairs = sum(len(p[0]) for p in pairs)
    for repeat in range(args.repeats):
        t0 = time.process_time()
        partials = {}
        for pu, pk, pc in pairs:
            _, parts = ccb.pair_statistics(pu, pk, pc, score, 16)
            for shard, part in parts:
                partials.setdefault(shard, []).append(part)
        t1 = time.process_time()
        for parts in partials.values():
            ccb.shard_key_costs(parts, ["word"], score)
        t2 = time.process_time()
        print(f"repeat {repeat}: {n_pairs:,} pairs; pair_statistics {t1 - t0:.2f} s CPU, "
              f"shard_key_costs {t2 - t1:.2f} s CPU, total {t2 - t0:.2f} s CPU", flush=True)


if __name__ == "__main__":
    main()

"""weighted_gaussian's count stage on a real corpus: keys released and count error against
the bound C, ``count_fraction`` f and ``count_keys_per_user`` C_c, through the pipeline's
own kernels (no Beam): ``transforms.selection.weighted_threshold.weighted_counts`` (the l0 bound,
grid weights and the capped count) and ``weighted_threshold.weighted_threshold`` (the
selection and the count's discrete Gaussian noise), parameters from the kind's
``calibrate`` at the release epsilon after the automatic bound's 10% (0.9 epsilon).

    python -m benchmarks.bench_count_stage benchmarks/data/docstring_file_py311.parquet \\
        [--bounds 256 512 1024] [--fractions 0.1 0.25] [--caps 0 64 128 256] [--seeds 2]

``--caps 0`` is no cap (every kept key counted). Prints, per (C, f, C_c), the mean over
seeds of the keys released and of the median and 90th percentile of
|released count - true distinct users| / true over the released keys (the truth is
unbounded: the error includes the bias of the bound and of the cap), as
benchmarks/bench_keys.py measures it. The keys do not depend on C_c.
"""
import argparse
import os
import sys

import numpy as np
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def main(argv=None):
    from thresher.pipelines.dataio.io import prepare_batch
    from thresher.transforms.randomness.user_identity import TEST_KEY   # public, tests only
    from thresher.pipelines.kinds import weighted_gaussian as kind
    from thresher.transforms.selection import weighted_threshold as wt

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("corpus")
    ap.add_argument("--epsilon", type=float, default=0.9)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--bounds", type=int, nargs="+", default=[256, 512, 1024])
    ap.add_argument("--fractions", type=float, nargs="+", default=[0.1, 0.25])
    ap.add_argument("--caps", type=int, nargs="+", default=[0, 64, 128, 256])
    ap.add_argument("--seeds", type=int, default=2)
    a = ap.parse_args(argv)
    table = pq.read_table(a.corpus, columns=["user", "word"])
    truth_table = table.group_by("word").aggregate([("user", "count_distinct")])
    truth = dict(zip(truth_table.column("word").to_pylist(),
                     truth_table.column("user_count_distinct").to_pylist()))
    records = prepare_batch(table, "user", ["word"], identity_key=TEST_KEY)[0]
    print(f"corpus {a.corpus}: {table.num_rows} rows, {len(truth)} words; "
          f"release epsilon={a.epsilon:g}, delta={a.delta:g}")
    for bound in a.bounds:
        for f in a.fractions:
            for cap in a.caps:
                mech = kind.parse({"count_fraction": f,
                                   **({"count_keys_per_user": cap} if cap else {})})
                if not cap:
                    mech["count_keys_per_user"] = None
                p = kind.calibrate(mech, epsilon=a.epsilon * (1 - f), delta=a.delta * (1 - f),
                                   max_keys_per_user=bound, model="l0")
                keys, med, p90 = [], [], []
                for seed in range(a.seeds):
                    rng = np.random.default_rng(seed)
                    sums = wt.weighted_counts(records, ["word"], bound, rng, p["scale"],
                                              count_keys_per_user=mech["count_keys_per_user"])
                    released = wt.release_table(sums, p, rng)
                    words = released.column("word").to_pylist()
                    true = np.array([truth[w] for w in words], dtype=np.float64)
                    rel = np.abs(released.column("count").to_numpy() - true) / true
                    keys.append(len(words))
                    med.append(np.median(rel))
                    p90.append(np.quantile(rel, 0.9))
                print(f"C={bound:5d} f={f:.2f} C_c={cap or 'none':>5} keys={np.mean(keys):6.1f} "
                      f"median={np.mean(med):.3f} p90={np.mean(p90):.3f} "
                      f"count_sigma={p['count_sigma']:.1f} sigma={p['sigma']:.3f} "
                      f"threshold={p['threshold']:.2f}", flush=True)


if __name__ == "__main__":
    main()

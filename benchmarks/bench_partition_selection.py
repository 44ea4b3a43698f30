"""Keys released by gaussian vs weighted_gaussian at fixed bounds, on a real corpus,
through the pipeline's own kernels (no Beam): the l0 bound of transforms.bounding.per_user_bound,
the grid weights and release rule of transforms.selection.weighted_threshold, GSHM's
transforms.selection.noisy_threshold, with parameters from each kind's calibrate().

    python -m benchmarks.bench_partition_selection CORPUS.parquet [--epsilon 1]
        [--delta 1e-6] [--bounds 16 64 128 256] [--count-fraction 0.25] [--seeds 3]

CORPUS: (user, word) rows, e.g. from benchmarks/docstring_corpus.py. Prints, per bound,
the mean number of keys released (over --seeds runs of the bound and the noise) and the
mean absolute count error of the released keys against the true distinct-user count.
"""
import argparse

import numpy as np
import pyarrow.parquet as pq

from thresher.pipelines.kinds import gaussian, weighted_gaussian
from thresher.transforms.selection import noisy_threshold, weighted_threshold
from thresher.transforms.bounding.per_user_bound import bound_l0


def load(path):
    t = pq.read_table(path)
    users = np.unique(t.column(t.column_names[0]).to_numpy(zero_copy_only=False),
                      return_inverse=True)[1].astype(np.uint64)
    _, keys = np.unique(t.column(t.column_names[1]).to_numpy(zero_copy_only=False),
                        return_inverse=True)
    return users, keys.astype(np.int64)


def true_counts(users, keys):
    pairs = np.unique(np.stack([users.astype(np.int64), keys]), axis=1)
    return np.bincount(pairs[1], minlength=keys.max() + 1)


def run(users, keys, bound, params, kind, rng):
    kept = bound_l0(users, keys.astype(np.uint64), bound, rng)
    u, k = users[kept], keys[kept]
    n_keys = keys.max() + 1
    counts = np.bincount(k, minlength=n_keys)
    present = np.flatnonzero(counts)
    if kind == "gaussian":
        keep, values = noisy_threshold.noisy_threshold(
            counts[present], rng=rng, **noisy_threshold.kernel_arguments(params))
    else:
        w = weighted_threshold.user_weights(u, params["scale"])
        weights = np.bincount(k, weights=w, minlength=n_keys).astype(np.int64)
        keep, values = weighted_threshold.weighted_threshold(
            counts[present], weights[present], rng=rng,
            **weighted_threshold.kernel_arguments(params))
    return present[keep], values[keep]


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("corpus")
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-6)
    ap.add_argument("--bounds", type=int, nargs="+", default=[16, 64, 128, 256])
    ap.add_argument("--count-fraction", type=float, default=0.25)
    ap.add_argument("--seeds", type=int, default=3)
    a = ap.parse_args(argv)
    users, keys = load(a.corpus)
    truth = true_counts(users, keys)
    print(f"corpus {a.corpus}: {len(users)} rows, {len(np.unique(users))} users, "
          f"{len(truth)} keys; epsilon={a.epsilon:g}, delta={a.delta:g}")
    print(f"{'bound':>6} {'kind':>18} {'keys':>8} {'count MAE':>10}  parameters")
    for bound in a.bounds:
        g = gaussian.calibrate({"pre_threshold": 1, "sigma": None, "threshold": None},
                               epsilon=a.epsilon, delta=a.delta, max_keys_per_user=bound,
                               model="l0")
        mech = weighted_gaussian.parse({"count_fraction": a.count_fraction})
        e_sel = a.epsilon * (1 - a.count_fraction)
        d_sel = a.delta * (1 - a.count_fraction)
        w = weighted_gaussian.calibrate(mech, epsilon=e_sel, delta=d_sel,
                                        max_keys_per_user=bound, model="l0")
        for kind, params, text in (
                ("gaussian", g, f"sigma={g['sigma']:.2f} T={g['threshold']}"),
                ("weighted_gaussian", w, f"sigma={w['sigma']:.3f} T={w['threshold']:.3f} "
                                         f"count_sigma={w['count_sigma']:.1f}")):
            n, err = [], []
            for seed in range(a.seeds):
                rng = np.random.default_rng(seed)
                released, values = run(users, keys, bound, params, kind, rng)
                n.append(len(released))
                if len(released):
                    err.append(np.abs(values - truth[released]).mean())
            print(f"{bound:>6} {kind:>18} {np.mean(n):>8.1f} "
                  f"{(np.mean(err) if err else float('nan')):>10.1f}  {text}")


if __name__ == "__main__":
    main()

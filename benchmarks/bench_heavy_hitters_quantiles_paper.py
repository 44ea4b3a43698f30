"""Paper 003's applications at a scale that runs here: top-k recall (Sec. 5, Figure 2)
through the heavy-hitters kernel, and the hierarchical-quantile example of Sec. 4.2.

Figure 2 setting (paper 003 Sec. 5): n = 10^6 clients, one bucket each, B = 2^8 and 2^12
buckets, Binomial (bucket ~ Bin(B, 1/2)) and Geometric (bucket ~ Geometric(1/sqrt(B)))
data, delta = 1e-8, recall of the true top k = B/10 buckets among the k largest released
estimates, mean over 10 repetitions. Rows:
  paper S&T    -- one histogram, p = alpha (1 - e^-eps), alpha = 1/6, tau = 20 (the paper's)
  thresher 1   -- heavy_hitters with prefix_lengths [null]: one histogram calibrated by
                  calibrate_levels(eps, delta, 1, C=1) (exact accounting)
  thresher trie -- heavy_hitters with the trie over the bucket id as a hex string
                  (prefix_lengths [1, null] for B = 2^8, [1, 2, null] for 2^12), eps / L per
                  level; the kind's kernels (transforms.trees.heavy_hitters.trie_heavy_hitters)
The paper gives Figure 2 as plots only; its text: "for B = 2^8 the sample and threshold
approach achieves close to perfect recall for all datasets", and the larger histogram is
harder (Shakespeare data, not reproduced: not available offline).

Quantiles (paper 003 Sec. 4.2, after Lemma "hierarchical quantiles"): "for tau = 10,
L = 10, beta = 2, eps = 1 ... for n > 10^6 rank queries with error around 0.01". Here:
n = 10^6 uniform values on [0, 1), the hierarchy at beta = 2, L = 10 with exact calibration
at delta = 1e-8 (its tau is printed), and thresher's default beta = 16, L = 3; the worst
rank error over ranks 0.01, 0.1, ..., 0.99 and 5 repetitions.

Seeded numpy randomness (a benchmark); ~1 minute on one idle core.

    python -m benchmarks.bench_heavy_hitters_quantiles_paper [--reps 10]
"""
import argparse
import math
import time

import numpy as np
import pyarrow as pa

from thresher.accounting import sample_threshold as acc
from thresher.transforms.trees.heavy_hitters import heavy_hitters, trie_heavy_hitters
from thresher.transforms.trees.quantile_release import hierarchy_quantiles, hierarchy_release
from thresher.transforms.selection.sample_and_threshold import sample_and_threshold

N = 10**6
DELTA = 1e-8
EPSILONS = (0.1, 0.2, 0.5, 1.0)


def data(kind, b, rng):
    if kind == "Binomial":
        x = rng.binomial(b, 0.5, N)
    else:
        x = rng.geometric(1 / math.sqrt(b), N) - 1
    return np.bincount(np.minimum(x, b - 1), minlength=b).astype(np.int64)


def recall(true_counts, est, k):
    truth = set(np.argsort(-true_counts, kind="stable")[:k])
    order = np.argsort(-est, kind="stable")[:k]
    got = {i for i in order if est[i] > 0}
    return len(truth & got) / k


def one_level(counts, p, tau, rng):
    keep, values = sample_and_threshold(counts, sampling_rate=p, threshold=tau, rng=rng)
    return np.where(keep, values / p, 0.0)


def trie(counts, b, eps, rng):
    digits = len(f"{b - 1:x}")
    lengths = list(range(1, digits)) + [None]
    params = acc.calibrate_levels(eps, DELTA, len(lengths), 1)
    keys = [f"{i:0{digits}x}" for i in range(b)]
    table = pa.table({"key": keys, "count": counts})
    released = trie_heavy_hitters(table, "key", lengths, params, rng)
    est = np.zeros(b)
    if released.num_rows:
        top = heavy_hitters(released, "key")
        for key, e in zip(top.column("key").to_pylist(), top.column("estimate").to_pylist()):
            est[int(key, 16)] = e
    return est, len(lengths), params


def recall_table(reps, rng):
    print("Top-k recall, k = B/10, n = 1e6, delta = 1e-8 (mean over %d reps)" % reps)
    print(f"{'data':9s} {'B':>6s} {'eps':>5s} {'paper S&T':>10s} {'thresher 1':>11s} {'thresher trie':>14s}")
    for b in (2**8, 2**12):
        for kind in ("Binomial", "Geometric"):
            for eps in EPSILONS:
                p_paper, tau_paper = acc.paper_parameters(eps, DELTA)
                one = acc.calibrate_levels(eps, DELTA, 1, 1)
                r = {"paper": [], "one": [], "trie": []}
                for _ in range(reps):
                    counts = data(kind, b, rng)
                    k = b // 10
                    r["paper"].append(recall(counts, one_level(counts, p_paper, tau_paper, rng), k))
                    r["one"].append(recall(counts, one_level(counts, one.sampling_rate, one.threshold, rng), k))
                    est, levels, _ = trie(counts, b, eps, rng)
                    r["trie"].append(recall(counts, est, k))
                print(f"{kind:9s} {b:6d} {eps:5.1f} {np.mean(r['paper']):10.3f} {np.mean(r['one']):11.3f} "
                      f"{np.mean(r['trie']):10.3f} (L={levels})")


def rank_errors(values, answers, ranks):
    ordered = np.sort(values)
    n = len(values)
    worst = 0.0
    for phi, v in zip(ranks, answers):
        lo = np.searchsorted(ordered, v, "left") / n
        hi = np.searchsorted(ordered, v, "right") / n
        worst = max(worst, lo - phi, phi - hi, 0.0)
    return worst


def quantile_table(reps, rng):
    ranks = [0.01] + [i / 10 for i in range(1, 10)] + [0.99]
    print("\nHierarchical quantiles, n = 1e6 uniform on [0, 1), eps = 1, delta = 1e-8, "
          f"ranks {ranks[0]}, 0.1..0.9, {ranks[-1]} ({reps} reps)")
    for beta, levels in ((2, 10), (16, 3)):
        params = acc.calibrate_levels(1.0, DELTA, levels, 1)
        worst = []
        for _ in range(reps):
            values = rng.random(N)
            v, c = np.unique(np.round(values, 7), return_counts=True)
            table = pa.table({"v": v, "count": c.astype(np.int64)})
            released = hierarchy_release(table, [], "v", lo=0.0, hi=1.0, branching=beta, levels=levels,
                                         params=params, rng=rng)
            out = hierarchy_quantiles(released, [], [()], ranks, lo=0.0, hi=1.0, branching=beta,
                                      levels=levels)
            worst.append(rank_errors(np.round(values, 7), out["value"], ranks))
        print(f"  beta={beta:2d}, L={levels:2d}: p={params.sampling_rate:.4g}, tau={params.threshold}, "
              f"worst rank error mean {np.mean(worst):.4f}, max {np.max(worst):.4f} "
              f"(paper's bound for tau=10, L=10, beta=2: ~1e4/n = 0.01)")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    rng = np.random.default_rng(2022)
    started = time.time()
    recall_table(args.reps, rng)
    quantile_table(max(1, args.reps // 2), rng)
    print(f"\n{time.time() - started:.0f} s")


if __name__ == "__main__":
    main()

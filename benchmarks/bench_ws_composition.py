"""weighted_sampling (report: keys): composition pld vs optimal vs basic.

For each bound C and composition, the calibrated keep table of ``accounting.pws``
(``pld``: ``accounting.pws.pld``): the frequency where a key is reported with
probability >= 1/2 (the plan's ``threshold``), the saturation frequency (reported with
certainty), pi at a few frequencies, and the expected number of keys released on the
docstring corpus of ``benchmarks.bench_keys`` (words of installed Python files, one user
per file; built once, ~80 s, cached under --data-dir): sum over words of pi at the word's
distinct-user count after each user's words are cut to a uniform sample of C (the l0
bound, drawn here with a fixed seed, the same sample for every composition).

    python -m benchmarks.bench_ws_composition [--epsilon 1] [--delta 1e-8] [--bounds 8 64 128]
"""
import argparse
import os
import time

import numpy as np
import pyarrow.parquet as pq

from thresher.accounting import pws
from thresher.accounting.pws import pld as pws_pld

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
COMPOSITIONS = ("pld", "optimal", "basic")
AT = (10, 25, 50, 100, 200)


def bounded_counts(table, c, seed=0):
    """Distinct-user counts per word after keeping a uniform sample of <= c words per user."""
    users = table.column("user").to_numpy(zero_copy_only=False)
    words = table.column("word").to_numpy(zero_copy_only=False)
    _, user_id = np.unique(users, return_inverse=True)
    _, word_id = np.unique(words, return_inverse=True)
    rng = np.random.default_rng(seed)
    order = np.lexsort((rng.random(len(user_id)), user_id))   # random order within each user
    u = user_id[order]
    start = np.r_[0, np.flatnonzero(np.diff(u)) + 1]
    rank = np.arange(len(u)) - np.repeat(start, np.diff(np.r_[start, len(u)]))
    kept = word_id[order][rank < c]
    return np.bincount(kept)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--epsilon", type=float, default=1.0)
    ap.add_argument("--delta", type=float, default=1e-8)
    ap.add_argument("--bounds", type=int, nargs="+", default=[8, 64, 128])
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", "data"))
    args = ap.parse_args(argv)
    from benchmarks.bench_keys import corpus
    table = pq.read_table(corpus(args.data_dir), columns=["user", "word"])
    print(f"# corpus: {table.num_rows} (user, word) rows, "
          f"{len(set(table.column('user').to_pylist()))} users; epsilon={args.epsilon:g}, "
          f"delta={args.delta:g}, report: keys")
    head = " | ".join(f"pi_{i}" for i in AT)
    print(f"| C | composition | threshold (pi >= 1/2) | saturation | {head} | keys released "
          f"(expected) | plan s |")
    print("|" + " --- |" * (7 + len(AT) - 1))
    for c in args.bounds:
        counts = bounded_counts(table, c)
        counts = counts[counts > 0]
        for comp in COMPOSITIONS:
            t0 = time.perf_counter()
            params = pws.calibrate(args.epsilon, args.delta, c, report="keys", composition=comp)
            keep = pws.release_tables(params).keep
            seconds = time.perf_counter() - t0
            m = len(keep) - 1
            pis = " | ".join(f"{keep[min(i, m)]:.3g}" for i in AT)
            released = float(keep[np.minimum(counts, m)].sum())
            label = comp if comp != "pld" or params.key_mu is not None else "pld (= optimal)"
            print(f"| {c} | {label} | {pws_pld.half_frequency(keep)} | {m} | {pis} | "
                  f"{released:.1f} | {seconds:.2f} |", flush=True)


if __name__ == "__main__":
    main()

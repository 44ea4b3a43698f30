"""Empirical coverage of the published intervals through whole releases (issue 27).

Data with known truth: users with 1-3 distinct keys each (so the contribution bound 3
drops nothing and the bounded count of a key is its distinct users), key sizes
log-uniform over [5, 400] users so many keys sit near the release point tau*, one
gamma-distributed amount per (user, key). Each kind is released RELEASES times through
``thresher run``'s pipeline (pipelines.running.release.run, in-process runner) with different
secrets; the published intervals are compared with the truth:

* count: all released keys, and released keys whose true count is below tau* (for
  weighted_gaussian / adaptive: whose true total weight is below the weight threshold
  of the (last) selection round; for sample_and_threshold, whose interval is on
  ``estimate``: whose expected sampled count n p is below the threshold);
* sum (target: the grid-rounded clamped sum), mean and variance (targets: of the clamped
  per-user totals).

    python -m benchmarks.bench_coverage [--releases 3] [--users 60000] [--keys 1000]

Prints one line per kind and statistic: covered / released = coverage, and the Monte
Carlo standard error sqrt(c (1 - c) / m).
"""
import argparse
import math
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

CLIP = (0.0, 100.0)
KINDS = {
    "gaussian": ["sum", "mean", "variance"],
    "laplace": ["sum", "mean"],
    "weighted_gaussian": [],
    "adaptive": [],
    "sample_and_threshold": [],
}


def make_data(num_keys, num_users, seed):
    rng = np.random.default_rng(seed)
    sizes = np.exp(rng.uniform(np.log(5), np.log(400), size=num_keys))
    p = sizes / sizes.sum()
    users, keys, amounts = [], [], []
    for u in range(num_users):
        for k in rng.choice(num_keys, size=rng.integers(1, 4), replace=False, p=p):
            users.append(u)
            keys.append(f"k{k:04d}")
            amounts.append(float(rng.gamma(2.0, 20.0)))
    return pa.table({"uid": users, "key": keys, "amount": amounts})


def truth_of(table, scale_weights):
    """Per key: users, grid sum / g, mean and variance of the clamped totals, and the
    weighted_gaussian weight (sum over users of floor(S / sqrt(t)) / S)."""
    from thresher.accounting.aggregates import fixed_point_grid
    df = table.to_pandas()
    grid = fixed_point_grid(*CLIP)
    df["clamped"] = df["amount"].clip(*CLIP)
    df["units"] = grid.to_units(df["clamped"].to_numpy())
    per_user_keys = df.groupby("uid")["key"].transform("size")
    df["weight"] = np.floor(scale_weights / np.sqrt(per_user_keys)) / scale_weights
    g = df.groupby("key")
    return {"count": g.size(), "sum": g["units"].sum() / grid.scale,
            "mean": g["clamped"].mean(), "variance": g["clamped"].var(ddof=0),
            "weight": g["weight"].sum()}


def release(kind, folder, data_path, secret):
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    from thresher.transforms.randomness.keyed_random import KeyedSource
    spec = {"name": "coverage", "input": {"path": data_path, "user": "uid", "keys": ["key"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": 3}, "mechanism": {"kind": kind},
            "output": {"path": os.path.join(folder, "out"), "confidence": 0.95}}
    if KINDS[kind]:
        spec["aggregates"] = [{"column": "amount", "statistic": s, "clip": list(CLIP)}
                              for s in KINDS[kind]]
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle)
    report = run(make_plan(spec_mod.load(path)), overwrite=True,
                 rng_factory=KeyedSource(secret))
    return report, pq.read_table(os.path.join(folder, "out", "released.parquet")).to_pandas()


def coverage(kind, released, truth, report):
    mech = report["mechanism"]
    keys = released["key"]
    n = truth["count"].reindex(keys).to_numpy()
    out = {}
    column = "estimate" if kind == "sample_and_threshold" else "count"
    hit = (released[column + "_low"] <= n) & (n <= released[column + "_high"])
    out["count"] = hit.to_numpy()
    if kind in ("gaussian", "laplace"):
        below = n < float(mech["threshold"])
    elif kind == "sample_and_threshold":      # expected sampled count below the threshold
        below = n * float(mech["sampling_rate"]) < float(mech["threshold"])
    else:
        threshold = mech["rounds"][-1]["threshold"] if kind == "adaptive" else mech["threshold"]
        below = truth["weight"].reindex(keys).to_numpy() < float(threshold)
    out["count, true value below the release point"] = hit.to_numpy()[below]
    for stat in KINDS[kind]:
        target = truth[stat].reindex(keys).to_numpy()
        col = f"amount_{stat}"
        out[stat] = ((released[col + "_low"] <= target + 1e-9)
                     & (target - 1e-9 <= released[col + "_high"])).to_numpy()
    return out


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--releases", type=int, default=3)
    parser.add_argument("--users", type=int, default=60_000)
    parser.add_argument("--keys", type=int, default=1000)
    args = parser.parse_args(argv)
    from thresher.accounting import weighted_gaussian as wg
    started = time.time()
    with tempfile.TemporaryDirectory() as tmp:
        table = make_data(args.keys, args.users, seed=2027)
        data_path = os.path.join(tmp, "data.parquet")
        pq.write_table(table, data_path)
        truth = truth_of(table, wg.WEIGHT_SCALE)
        print(f"{table.num_rows} rows, {args.users} users, {args.keys} keys (true counts "
              f"{int(truth['count'].min())}-{int(truth['count'].max())}); confidence 0.95; "
              f"{args.releases} releases per kind")
        for kind in KINDS:
            pooled = {}
            for r in range(args.releases):
                folder = os.path.join(tmp, f"{kind}{r}")
                os.makedirs(folder)
                report, released = release(kind, folder, data_path, bytes([r + 1]) * 32)
                for name, hits in coverage(kind, released, truth, report).items():
                    pooled.setdefault(name, []).append(hits)
            for name, parts in pooled.items():
                hits = np.concatenate(parts)
                m = len(hits)
                c = float(hits.mean()) if m else float("nan")
                se = math.sqrt(c * (1 - c) / m) if m else float("nan")
                print(f"{kind:18s} {name:45s} {int(hits.sum()):6d} / {m:6d} = {c:.4f} "
                      f"(MC s.e. {se:.4f})")
    print(f"wall time {time.time() - started:.0f} s")


if __name__ == "__main__":
    main()

"""Per-key quantiles at realistic sizes (issue 28): a corpus of 120 keys ("countries"),
six of them with 5,000-12,000 users and the rest 20-2,500, each user in one key with 1-6
values from the key's own lognormal distribution (median 5-80 on the public domain
[0, 1000], like a price or a latency). ``kind: quantiles`` with ``select_keys`` (no
public keys) at epsilon = 1, delta = 1e-6, max_keys_per_user = 1, through the real
release path (``pipelines.running.release.run``). Printed per run: keys selected, keys with a
value, the worst rank error |F(value) - phi| (0 when phi lies in [F(value-), F(value)])
over the keys with >= 5,000 users and over all selected keys, and whether every key's
values are non-decreasing in rank.

    python -m benchmarks.per_key_quantiles [--runs 3] [--seed 0]
"""
import argparse
import os
import tempfile

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

RANKS = [0.1, 0.25, 0.5, 0.75, 0.9]
DOMAIN = [0.0, 1000.0]
BIG = (12_000, 9_000, 7_500, 6_000, 5_500, 5_000)


def corpus(seed=0, small_keys=114):
    """(table user/country/x, {country: sorted values}): the corpus described above."""
    rng = np.random.default_rng(seed)
    sizes = list(BIG) + [int(v) for v in np.clip(rng.pareto(1.1, small_keys) * 60 + 20, 20, 2500)]
    users, countries, values = [], [], []
    truth = {}
    next_user = 0
    for i, n in enumerate(sizes):
        name = f"c{i:03d}"
        median, spread = rng.uniform(5, 80), rng.uniform(0.5, 1.2)
        per_user = rng.integers(1, 7, n)
        total = int(per_user.sum())
        x = rng.lognormal(np.log(median), spread, total)
        ids = np.repeat(np.arange(next_user, next_user + n), per_user)
        next_user += n
        users.append(ids)
        countries.append(np.full(total, name, dtype=object))
        values.append(x)
        truth[name] = np.sort(np.minimum(x, DOMAIN[1]))
    table = pa.table({"user": pa.array([f"u{u}" for u in np.concatenate(users)]),
                      "country": pa.array(np.concatenate(countries).tolist()),
                      "x": pa.array(np.concatenate(values), pa.float64())})
    users_per_key = dict(zip([f"c{i:03d}" for i in range(len(sizes))], sizes))
    return table, truth, users_per_key


def rank_error(sorted_values, value, phi):
    n = len(sorted_values)
    lo = np.searchsorted(sorted_values, value, "left") / n
    hi = np.searchsorted(sorted_values, value, "right") / n
    return max(0.0, lo - phi, phi - hi)


def spec_dict(data, out, epsilon=1.0, delta=1e-6, bound=1):
    return {"name": "per_key_quantiles",
            "input": {"path": data, "user": "user", "keys": ["country"]},
            "privacy": {"epsilon": epsilon, "delta": delta},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "quantiles", "column": "x", "ranks": RANKS,
                          "domain": DOMAIN},
            "output": {"path": out}}


def evaluate(rows, truth, users_per_key, big=5_000):
    """Figures of one release's rows (dicts country/rank/value)."""
    by_key = {}
    for r in rows:
        by_key.setdefault(r["country"], []).append((r["rank"], r["value"]))
    worst_big, worst_all, monotone, with_value = 0.0, 0.0, True, 0
    for key, pairs in by_key.items():
        pairs.sort()
        vals = [v for _, v in pairs]
        if any(v is None for v in vals):
            continue
        with_value += 1
        monotone &= all(a <= b for a, b in zip(vals, vals[1:]))
        err = max(rank_error(truth[key], v, phi) for phi, v in pairs)
        worst_all = max(worst_all, err)
        if users_per_key[key] >= big:
            worst_big = max(worst_big, err)
    big_keys = [k for k, n in users_per_key.items() if n >= big]
    return {"selected": len(by_key), "with_value": with_value,
            "big_selected": sum(k in by_key for k in big_keys), "big_keys": len(big_keys),
            "worst_rank_error_big": worst_big, "worst_rank_error_all": worst_all,
            "monotone": monotone}


def main(argv=None):
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    from thresher.transforms.randomness.keyed_random import KeyedSource
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    table, truth, users_per_key = corpus(args.seed)
    print(f"corpus: {table.num_rows:,} rows, {len(users_per_key)} keys, "
          f"{sum(users_per_key.values()):,} users; keys >= 5,000 users: "
          f"{sum(n >= 5000 for n in users_per_key.values())}")
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "data.parquet")
        pq.write_table(table, data)
        for r in range(args.runs):
            out = os.path.join(tmp, f"out{r}")
            path = os.path.join(tmp, f"spec{r}.yaml")
            with open(path, "w") as f:
                yaml.safe_dump(spec_dict(data, out), f)
            report = run(make_plan(spec_mod.load(path)),
                         rng_factory=KeyedSource(f"per-key quantiles bench {r}".encode()))
            rows = pq.read_table(os.path.join(out, "released.parquet")).to_pylist()
            figs = evaluate(rows, truth, users_per_key)
            print(f"run {r}: sigma {report['mechanism']['sigma']:.4g}, {figs}")


if __name__ == "__main__":
    main()

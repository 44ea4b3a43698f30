"""Data and specs for the heavy-user memory figures (issue 30, D15; docs/performance.md).

One user ``heavy`` with ``--heavy-rows`` rows on as many distinct keys (``k<i>``), among
``--users`` ordinary users with ``--rows-per-user`` rows each over a vocabulary of 200 common
keys (which the heavy user holds too), written as Parquet (plain string columns, zstd,
``--row-group`` rows per row group, rows in a seeded random order, so the heavy user is in every row group). With
``--same-key`` the heavy user's rows are all on one key instead (the adaptive case).

Then one spec per case beside the data (gaussian C = 4; auto; l1; aggregates; adaptive),
for ``/usr/bin/time -v python -m thresher run SPEC`` (the peak RSS figure is its "Maximum
resident set size"):

    python benchmarks/heavy_user.py benchmarks/data/heavy            # 1e7 heavy rows
    /usr/bin/time -v python -m thresher run benchmarks/data/heavy/fixed.yaml

Everything is a deterministic function of ``--seed`` (test data, not privacy randomness).
"""
import argparse
import os

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import yaml

CASES = {
    "fixed": {"bounding": {"max_keys_per_user": 4}},
    "auto": {"bounding": {"max_keys_per_user": "auto"}},
    "l1": {"bounding": {"max_keys_per_user": 4, "model": "l1"}, "mechanism": {"kind": "laplace"}},
    "aggregates": {"bounding": {"max_keys_per_user": 4},
                   "aggregates": [{"column": "amount", "statistic": "sum", "clip": [0.0, 10.0]}]},
    "adaptive": {"bounding": {"max_keys_per_user": 4}, "mechanism": {"kind": "adaptive"}},
}


def _names(prefix, codes, negative=None):
    """Strings prefix + code (``negative`` for code -1), built by Arrow kernels."""
    text = pc.binary_join_element_wise(prefix, pc.cast(pa.array(codes), pa.string()), "")
    if negative is not None:
        text = pc.if_else(pc.equal(pa.array(codes), -1), negative, text)
    return text


def generate(path, heavy_rows, users, rows_per_user, row_group, seed, same_key=False):
    rng = np.random.default_rng(seed)
    n = heavy_rows + users * rows_per_user
    ordinary = np.repeat(np.arange(users), rows_per_user)
    user_codes = np.concatenate([np.full(heavy_rows, users), ordinary])
    heavy_keys = (np.zeros(heavy_rows, dtype=np.int64) if same_key
                  else np.arange(heavy_rows, dtype=np.int64)) + 200
    key_codes = np.concatenate([heavy_keys, rng.integers(0, 200, size=len(ordinary))])
    order = rng.permutation(n)
    user_codes = np.where(user_codes[order] == users, -1, user_codes[order])
    table = pa.table({   # plain strings, as ids and keys usually arrive
        "user_id": _names("u", user_codes, "heavy"),
        "word": _names("k", key_codes[order]),
        "amount": pa.array(rng.integers(1, 20, size=n).astype(np.float64)),
    })
    pq.write_table(table, path, row_group_size=row_group, compression="zstd")
    return n


def write_specs(folder, data):
    for name, change in CASES.items():
        doc = {"name": f"heavy-{name}",
               "input": {"path": os.path.abspath(data), "format": "parquet",
                         "user": "user_id", "keys": ["word"]},
               "privacy": {"epsilon": 1.0, "delta": 1.0e-8},
               "mechanism": {"kind": "gaussian"},
               "output": {"path": os.path.join(os.path.abspath(folder), "out", name)}}
        for section, values in change.items():
            if isinstance(values, dict):
                doc.setdefault(section, {}).update(values)
            else:
                doc[section] = values
        with open(os.path.join(folder, f"{name}.yaml"), "w", encoding="utf-8") as handle:
            yaml.safe_dump(doc, handle, sort_keys=False)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("folder")
    parser.add_argument("--heavy-rows", type=int, default=10_000_000)
    parser.add_argument("--users", type=int, default=5000)
    parser.add_argument("--rows-per-user", type=int, default=20)
    parser.add_argument("--row-group", type=int, default=1 << 20)
    parser.add_argument("--same-key", action="store_true")
    parser.add_argument("--seed", type=int, default=30)
    args = parser.parse_args(argv)
    os.makedirs(args.folder, exist_ok=True)
    data = os.path.join(args.folder, "heavy.parquet")
    n = generate(data, args.heavy_rows, args.users, args.rows_per_user, args.row_group,
                 args.seed, args.same_key)
    write_specs(args.folder, data)
    print(f"{data}: {n} rows ({args.heavy_rows} of one user, {args.users} users x "
          f"{args.rows_per_user}); specs: " + ", ".join(f"{c}.yaml" for c in CASES))


if __name__ == "__main__":
    main()

"""Aggregates (issue 14): accuracy of clipped sums and means per key, and PipelineDP SUM.

Data (deterministic, ``--seed``): ``--users`` users; each has Geometric(0.7) distinct
countries (70% one, 2.7% more than 3, at most 12) drawn from a Zipf-like law over 40
keys, and a heavy-tailed activity (1 + floor(Pareto(2)) records per user-key, up to 400);
every record's ``amount`` is log-normal(3, 1.1) (median 20, mean 37, a long right tail),
with 0.1% NaN.

Three releases at epsilon = 1, delta = 1e-6, max_keys_per_user = 3 (gaussian kind, real
Beam pipeline):

1. fixed clip [0, CLIP] -- compared with the *clamped truth*: per key, the sum over all
   users of their clamped totals (so the error includes the bounding to 3 keys, the grid
   rounding and the noise);
2. clip: auto (aggregates_auto.epsilon 0.1 out of 1) -- compared with the *raw truth*
   (sum of all finite amounts per key; mean = raw sum / users);
3. PipelineDP 0.3.1 SUM (Gaussian noise, same epsilon, delta, max_partitions_contributed
   = 3, min/max_sum_per_partition = the same clip; it selects partitions privately too)
   on the same rows, compared with the same clamped truth.

Keys with at least 2,000 users are reported. Prints the figures docs/aggregates.md quotes.
Run: ``python -m benchmarks.bench_aggregates`` (about a minute of CPU).
"""
import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

EPSILON, DELTA, BOUND, CLIP = 1.0, 1e-6, 3, 500.0
MIN_USERS = 2000


def generate(n_users, seed):
    rng = np.random.default_rng(seed)
    n_keys = 40
    weights = 1.0 / np.arange(1, n_keys + 1) ** 1.1
    weights /= weights.sum()
    k_per_user = np.minimum(rng.geometric(0.7, size=n_users), 12)
    users, keys = [], []
    for u, k in enumerate(k_per_user):
        chosen = rng.choice(n_keys, size=k, replace=False, p=weights)
        users.append(np.full(k, u))
        keys.append(chosen)
    users, keys = np.concatenate(users), np.concatenate(keys)
    records = np.minimum(np.floor(rng.pareto(2.0, size=users.size) + 1).astype(np.int64), 400)
    uid = np.repeat(users, records)
    key = np.repeat(keys, records)
    amount = rng.lognormal(3.0, 1.1, size=uid.size)
    amount[rng.random(uid.size) < 0.001] = np.nan
    return pa.table({"user_id": uid, "country": pa.array([f"c{k:02d}" for k in key]),
                     "amount": amount})


def truth(table, clip):
    df = table.to_pandas()
    df["amount"] = df["amount"].where(np.isfinite(df["amount"]), 0.0)
    per_user = df.groupby(["country", "user_id"])["amount"].sum()
    g = per_user.groupby("country")
    clamped = per_user.clip(0, clip).groupby("country").sum() if clip else None
    return g.size(), g.sum(), clamped


def run_thresher(path, out, aggregates, auto=None):
    import yaml

    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    spec = {"name": "bench_aggregates",
            "input": {"path": path, "user": "user_id", "keys": ["country"]},
            "privacy": {"epsilon": EPSILON, "delta": DELTA},
            "bounding": {"max_keys_per_user": BOUND},
            "mechanism": {"kind": "gaussian"},
            "aggregates": aggregates,
            "output": {"path": out}}
    if auto:
        spec["aggregates_auto"] = auto
    text = yaml.safe_dump(spec)
    plan = make_plan(spec_mod.parse(yaml.safe_load(text), text))
    report = run(plan, overwrite=True)
    released = pq.read_table(os.path.join(out, "released.parquet")).to_pandas().set_index("country")
    return report, released


def run_pipeline_dp(table, clip):
    import pipeline_dp
    rows = list(zip(table.column("user_id").to_pylist(), table.column("country").to_pylist(),
                    np.nan_to_num(table.column("amount").to_numpy(zero_copy_only=False)).tolist()))
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=EPSILON, total_delta=DELTA)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.SUM], noise_kind=pipeline_dp.NoiseKind.GAUSSIAN,
        max_partitions_contributed=BOUND, max_contributions_per_partition=400,
        min_sum_per_partition=0.0, max_sum_per_partition=clip)
    extractors = pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                            partition_extractor=lambda r: r[1],
                                            value_extractor=lambda r: r[2])
    result = engine.aggregate(rows, params, extractors)
    accountant.compute_budgets()
    return {k: v.sum for k, v in result}


def _rel(a, b):
    return abs(a - b) / abs(b)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=120_000)
    parser.add_argument("--seed", type=int, default=14)
    parser.add_argument("--skip-pipeline-dp", action="store_true")
    args = parser.parse_args(argv)
    table = generate(args.users, args.seed)
    users, raw, clamped = truth(table, CLIP)
    big = users[users >= MIN_USERS].index
    print(f"data: {table.num_rows} records, {args.users} users, {len(users)} keys, "
          f"{len(big)} keys with >= {MIN_USERS} users; epsilon={EPSILON}, delta={DELTA}, C={BOUND}")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "data.parquet")
        pq.write_table(table, path)
        t = time.time()
        fixed = [{"column": "amount", "statistic": "sum", "clip": [0, CLIP]},
                 {"column": "amount", "statistic": "mean", "clip": [0, CLIP]}]
        report, rel_fixed = run_thresher(path, os.path.join(tmp, "fixed"), fixed)
        t_fixed = time.time() - t
        auto = [{"column": "amount", "statistic": "sum", "clip": "auto"},
                {"column": "amount", "statistic": "mean", "clip": "auto"}]
        report_auto, rel_auto = run_thresher(path, os.path.join(tmp, "auto"), auto,
                                             {"epsilon": 0.1})
        t = time.time()
        pdp = {} if args.skip_pipeline_dp else run_pipeline_dp(table, CLIP)
        t_pdp = time.time() - t
    entry = report["mechanism"]["aggregates"][0]
    auto_entry = report_auto["mechanism"]["aggregates"][0]
    print(f"fixed clip [0, {CLIP:g}]: count sigma {report['mechanism']['sigma']:.4g}, sum sigma "
          f"{entry['sigma']:.4g} (grid step {entry['grid_resolution']:g}, mu_o "
          f"{report['mechanism']['mu_o']:.4g}); run {t_fixed:.1f} s")
    print(f"clip: auto chose [0, {auto_entry['clip'][1]:g}]; sum sigma {auto_entry['sigma']:.4g}; "
          f"stages {[(s['name'], s['epsilon']) for s in report_auto['privacy']['stages']]}")
    print(f"{'key':>5} {'users':>6} {'fixed sum':>9} {'fixed mean':>10} {'auto sum':>9} "
          f"{'auto mean':>9} {'PipelineDP sum':>14}   (relative errors)")
    worst = {"fs": 0, "fm": 0, "as": 0, "am": 0, "p": 0}
    errs_t, errs_p = [], []
    for k in big:
        n = users[k]
        fs = _rel(rel_fixed.loc[k, "amount_sum"], clamped[k])
        fm = _rel(rel_fixed.loc[k, "amount_mean"], clamped[k] / n)
        a_s = _rel(rel_auto.loc[k, "amount_sum"], raw[k])
        am = _rel(rel_auto.loc[k, "amount_mean"], raw[k] / n)
        p = _rel(pdp[k], clamped[k]) if k in pdp else float("nan")
        errs_t.append(abs(rel_fixed.loc[k, "amount_sum"] - clamped[k]))
        errs_p.append(abs(pdp[k] - clamped[k]) if k in pdp else float("nan"))
        for name, v in (("fs", fs), ("fm", fm), ("as", a_s), ("am", am), ("p", p)):
            worst[name] = max(worst[name], v) if np.isfinite(v) else worst[name]
        print(f"{k:>5} {n:>6} {fs:>9.2%} {fm:>10.2%} {a_s:>9.2%} {am:>9.2%} {p:>14.2%}")
    print(f"worst over keys with >= {MIN_USERS} users: fixed sum {worst['fs']:.2%}, fixed mean "
          f"{worst['fm']:.2%} (vs clamped truth; target 10%); auto sum {worst['as']:.2%}, auto "
          f"mean {worst['am']:.2%} (vs raw truth; target 25%)")
    if pdp:
        print(f"mean absolute sum error over those keys: thresher {np.mean(errs_t):.5g}, "
              f"PipelineDP {np.nanmean(errs_p):.5g} (PipelineDP run {t_pdp:.1f} s, local backend)")


if __name__ == "__main__":
    main()

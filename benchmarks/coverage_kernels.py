"""Empirical coverage of the published intervals with the real release kernels (issue 27).

Keys with known truth (counts spread around the release point tau*, per-user totals drawn
and clamped) go through the kernels thresher runs (``noisy_threshold`` +
``aggregate_values.noisy_outputs``, ``weighted_threshold``, the adaptive count stage) with
keyed streams under a given secret; the interval columns are computed as the launcher
computes them (``pipelines.dataio.intervals.interval_columns``). Shared by
tests/pipelines/dataio/test_intervals_coverage.py and benchmarks/bench_coverage.py.
"""
import numpy as np
import pyarrow as pa

from thresher.accounting import aggregates as agg
from thresher.pipelines.dataio import intervals
from thresher.transforms.randomness import keyed_random


def synthetic_keys(num_keys, count_range, clip, seed):
    """Per key: n users (uniform over count_range) and their totals (gamma, mean 40),
    clamped to ``clip``. Returns (counts, grid sums, grid sums of squares, clamped sums,
    means and population variances of the clamped totals)."""
    rng = np.random.default_rng(seed)
    counts = rng.integers(count_range[0], count_range[1] + 1, size=num_keys)
    grid, sq_grid = agg.fixed_point_grid(*clip), agg.squared_grid(*clip)
    s_units, q_units, sums, means, variances = [], [], [], [], []
    for n in counts:
        totals = np.clip(rng.gamma(2.0, 20.0, size=n), *clip)
        s_units.append(int(grid.to_units(totals).sum()))
        q_units.append(int(sq_grid.to_units(totals).sum()))
        sums.append(float(totals.sum()))
        means.append(float(totals.mean()) if n else np.nan)
        variances.append(float(totals.var()) if n else np.nan)
    return {"count": counts.astype(np.int64), "s_units": np.array(s_units, dtype=np.int64),
            "q_units": np.array(q_units, dtype=np.int64), "sum": np.array(sums),
            "mean": np.array(means), "variance": np.array(variances),
            "grid_scale": grid.scale}


def _streams(num_keys, secret, stage):
    table = pa.table({"key": [f"k{i}" for i in range(num_keys)]})
    source = keyed_random.KeyedSource(secret)
    return table, keyed_random.table_streams(source, None, stage, table, ["key"])


def threshold_release(params, truth, secret, confidence):
    """gaussian / laplace with aggregates: the released table with its intervals, and
    the truth of the released keys."""
    from thresher.transforms.values.aggregate_values import release_with_aggregates
    n = len(truth["count"])
    table, rng = _streams(n, secret, "ReleaseWithAggregates")
    table = table.append_column("count", pa.array(truth["count"]))
    table = table.append_column("__s0", pa.array(truth["s_units"]))
    table = table.append_column("__s1", pa.array(truth["q_units"]))
    table = table.append_column("__i", pa.array(np.arange(n)))
    released = release_with_aggregates(table, params, rng)
    columns = intervals.interval_columns(released, params, confidence)
    for name, values in columns.items():
        released = released.append_column(name, values)
    return released, released.column("__i").to_numpy()


def count_stage_release(kind, params, counts, secret, confidence):
    """weighted_gaussian (selection on weights, then count noise from the key's stream)
    or adaptive's count stage: released counts with intervals and their indices."""
    n = len(counts)
    if kind == "weighted_gaussian":
        from thresher.transforms.selection.weighted_threshold import weighted_threshold
        _, rng = _streams(n, secret, "WeightedThreshold")
        weights = counts * int(params["scale"])        # every user with one key: weight S
        keep, values = weighted_threshold(counts, weights, sigma_grid=float(params["sigma"]) *
                                          int(params["scale"]),
                                          threshold_grid=int(params["threshold_grid"]),
                                          count_sigma=float(params["count_sigma"]), rng=rng)
        index = np.flatnonzero(keep)
        values = values[keep]
    else:
        from thresher.transforms.selection.adaptive_rounds import noisy_counts_table
        table, rng = _streams(n, secret, "CountNoise")
        table = table.append_column("count", pa.array(counts))
        values = noisy_counts_table(table, params, rng).column("count").to_numpy()
        index = np.arange(n)
    low, high = intervals.count_interval(values, params, 1.0 - confidence)
    return index, values, low, high


def covered(low, high, truth):
    return (np.asarray(low) <= truth) & (truth <= np.asarray(high))


def threshold_coverage(released, index, truth, params):
    """{statistic: (covered count, released keys)}, counts also among keys below tau*."""
    n = truth["count"][index]
    out = {}
    c = covered(released.column("count_low").to_numpy(), released.column("count_high").to_numpy(), n)
    below = n < float(params["threshold"])
    out["count"] = (int(c.sum()), len(c))
    out["count_below_threshold"] = (int(c[below].sum()), int(below.sum()))
    targets = {"sum": truth["s_units"][index] / truth["grid_scale"],
               "mean": truth["mean"][index], "variance": truth["variance"][index]}
    for e in params["aggregates"]:
        stat = e["statistic"]
        lo = released.column(e["output"] + "_low").to_numpy(zero_copy_only=False)
        hi = released.column(e["output"] + "_high").to_numpy(zero_copy_only=False)
        c = covered(lo, hi, targets[stat])
        out[stat] = (int(c.sum()), len(c))
    return out


def calibrated(kind, tmp_dir, epsilon=1.0, delta=1e-6, bound=3, clip=(0.0, 100.0)):
    """A kind's calibrated mechanism section, as the plan makes it (with sum, mean and
    variance of one column for gaussian / laplace)."""
    import os

    import pyarrow.parquet as pq
    import yaml

    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    data = os.path.join(tmp_dir, "tiny.parquet")
    pq.write_table(pa.table({"uid": ["a", "b"], "key": ["x", "y"], "amount": [1.0, 2.0]}), data)
    spec = {"name": "coverage", "input": {"path": data, "user": "uid", "keys": ["key"]},
            "privacy": {"epsilon": epsilon, "delta": delta},
            "bounding": {"max_keys_per_user": bound}, "mechanism": {"kind": kind},
            "output": {"path": os.path.join(tmp_dir, "out")}}
    if kind in ("gaussian", "laplace"):
        spec["aggregates"] = [{"column": "amount", "statistic": s, "clip": list(clip)}
                              for s in ("sum", "mean", "variance")]
    path = os.path.join(tmp_dir, f"{kind}.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle)
    return make_plan(spec_mod.load(path)).params_by_bound[bound]


def sample_threshold_release(params, counts, secret, confidence):
    """sample_and_threshold: sampled counts of released keys, their indices and the
    estimate intervals (for the bounded count n)."""
    from thresher.accounting import intervals as iv
    from thresher.transforms.selection.sample_and_threshold import sample_and_threshold
    _, rng = _streams(len(counts), secret, "SampleAndThreshold")
    keep, values = sample_and_threshold(counts, sampling_rate=float(params["sampling_rate"]),
                                        threshold=int(params["threshold"]), rng=rng)
    low, high = iv.binomial_bounds(values[keep], float(params["sampling_rate"]),
                                   1.0 - confidence, float(params["threshold"]))
    return np.flatnonzero(keep), values[keep], low, high

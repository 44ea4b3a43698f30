"""Done-when figure for ``mechanism.kind: quantiles`` (issue 17), and a comparison with
PipelineDP's PERCENTILE metric on the same data.

Data: 1e5 users with one value each, from two distributions: N(50, 10) on the domain
[0, 100], and a long-tailed lognormal (median e^4 ~ 55, rank 0.99 ~ 560, like latencies
in ms) on [0, 1000]. For each, a real thresher release (``pipelines.running.release.run``: Beam
FnApiRunner, CSPRNG sampling) at epsilon = 1, delta = 1e-6, max_keys_per_user = 1 for
ranks 0.1, 0.5, 0.9, 0.99, with each method; the figure is the rank error
|F(value) - phi| (0 when phi lies in [F(value-), F(value)]) on the true data.

PipelineDP (``pipeline_dp``, LocalBackend; its PERCENTILE uses Google's quantile tree
with Laplace noise) gets the same budget: epsilon = 1, delta = 1e-6, one public partition
(so no partition selection), max_contributions 1, the same [min_value, max_value].

    python -m benchmarks.bench_quantiles_kind [--runs 3] [--users 100000] [--no-pipelinedp]
"""
import argparse
import os
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run

RANKS = [0.1, 0.5, 0.9, 0.99]
DISTRIBUTIONS = {
    "normal(50,10) on [0,100]": (lambda rng, n: rng.normal(50, 10, n), [0.0, 100.0]),
    "lognormal(4,1) on [0,1000]": (lambda rng, n: rng.lognormal(4, 1, n), [0.0, 1000.0]),
}


def rank_error(sorted_values, value, phi):
    n = len(sorted_values)
    lo = np.searchsorted(sorted_values, value, "left") / n
    hi = np.searchsorted(sorted_values, value, "right") / n
    return max(0.0, lo - phi, phi - hi)


def thresher_quantiles(path, work, domain, method):
    spec = {"name": "q-bench", "input": {"path": path, "user": "user"},
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "bounding": {"max_keys_per_user": 1},
            "mechanism": {"kind": "quantiles", "column": "x", "ranks": RANKS, "domain": domain,
                          "method": method},
            "output": {"path": os.path.join(work, "out")}}
    spec_path = os.path.join(work, "spec.yaml")
    with open(spec_path, "w") as handle:
        yaml.safe_dump(spec, handle)
    report = run(make_plan(spec_mod.load(spec_path)), overwrite=True)
    rows = pq.read_table(os.path.join(work, "out", "released.parquet")).to_pylist()
    return report, {r["rank"]: r["value"] for r in rows}


def pipelinedp_quantiles(users, values, domain):
    import pipeline_dp
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=1.0, total_delta=1e-6)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.PERCENTILE(100 * r) for r in RANKS],
        max_partitions_contributed=1, max_contributions_per_partition=1,
        min_value=domain[0], max_value=domain[1])
    extractors = pipeline_dp.DataExtractors(partition_extractor=lambda r: 0,
                                            privacy_id_extractor=lambda r: r[0],
                                            value_extractor=lambda r: r[1])
    result = engine.aggregate(list(zip(users, values)), params, extractors, public_partitions=[0])
    accountant.compute_budgets()
    (_, metrics), = list(result)
    out = {}
    for r in RANKS:
        name = f"percentile_{100 * r:g}".replace(".", "_")
        out[r] = getattr(metrics, name, None)
    if any(v is None for v in out.values()):  # field names differ across versions
        fields = [f for f in metrics._fields if f.startswith("percentile")]
        out = dict(zip(RANKS, [getattr(metrics, f) for f in fields]))
    return out


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--users", type=int, default=100_000)
    ap.add_argument("--no-pipelinedp", action="store_true")
    args = ap.parse_args(argv)
    work = tempfile.mkdtemp(prefix="q-bench-")
    rng = np.random.default_rng(2026)
    for dist, (draw, domain) in DISTRIBUTIONS.items():
        values = draw(rng, args.users)
        users = [f"u{i}" for i in range(args.users)]
        path = os.path.join(work, "data.parquet")
        pq.write_table(pa.table({"user": users, "x": values}), path)
        ordered = np.sort(values)
        print(f"\n{dist}: {args.users} users, one value each; true quantiles "
              + ", ".join(f"{r}: {np.quantile(values, r):.3f}" for r in RANKS))
        methods = ["hierarchical", "binary_search"] + ([] if args.no_pipelinedp else ["pipeline_dp"])
        for method in methods:
            worst = 0.0
            for i in range(args.runs):
                started = time.time()
                if method == "pipeline_dp":
                    got, extra = pipelinedp_quantiles(users, values, domain), ""
                else:
                    report, got = thresher_quantiles(path, work, domain, method)
                    mech = report["mechanism"]
                    extra = (f" [p={mech['sampling_rate']:.4g}, tau={mech['threshold']}, "
                             f"{mech['levels']} stages, resolution {mech['resolution']:.3g}]")
                errs = {r: (rank_error(ordered, got[r], r) if got[r] is not None else float("nan"))
                        for r in RANKS}
                worst = max(worst, max(errs.values()))
                print(f"  {method:13s} run {i + 1}: "
                      + ", ".join(f"{r}: {got[r]:.3f} (rank err {errs[r]:.4f})" for r in RANKS)
                      + f"{extra} {time.time() - started:.1f} s")
            print(f"  {method}: worst rank error over {args.runs} runs and 4 ranks: {worst:.4f}")


if __name__ == "__main__":
    main()

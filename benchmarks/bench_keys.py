"""Keys released on a real corpus: thresher's kinds against PipelineDP (issue 15).

The corpus (``benchmarks/docstring_corpus.py``, ``--unit file``): the distinct
lower-cased words of the module, class and function docstrings of every Python file
installed with this interpreter (standard library and site-packages), one user per
source file (module). It is assembled offline, from text people wrote, and has the shape
thresher exists for: an open-ended key space of words (identifiers, misspellings,
non-English words), one privacy unit per document, a heavy tail (most words belong to one
module, a few hundred to thousands of modules), and users holding far more distinct keys
than any sensible bound. On this installation (Python 3.11.7 with the project's
dependencies) it had 1.12e6 (user, word) rows, 10,684 users and 46,140 distinct words
(1,129,171 rows, 10,783 users, 46,276 words after later installs);
it is built once (about 80 s) and cached under ``--data-dir``.

For each epsilon in {0.5, 1, 2} and delta = 1e-6 the script prints

- for every release kind of thresher present in the tree (gaussian, laplace,
  sample_and_threshold, weighted_sampling, and weighted_gaussian / adaptive when
  ``pipelines/kinds/<kind>.py`` exists), with ``max_keys_per_user: auto`` and the kind's
  defaults: the keys released with a count, the bound the run chose, and the median and
  90th percentile of the relative error |released count - true distinct users| / true of
  the released keys (the ``estimate`` column where the kind has one, else ``count``). Each
  is one real ``pipelines.running.release.run`` on Beam's default in-process runner (the same
  code as ``thresher run``);
- PipelineDP 0.3.1 (``LocalBackend``, same rows, same (epsilon, delta)): its best counted
  release (``DPEngine.aggregate`` with PRIVACY_ID_COUNT and Laplace noise, max over its
  four partition-selection strategies and l0 =
  ``max_partitions_contributed`` in {16, 64}, selection before aggregation as issue 15
  measured it); on a row of its own its best with ``post_aggregation_thresholding``
  (Laplace/Gaussian thresholding on the count's own noise); and its best keys-only
  ``select_partitions`` (max over the strategies and l0), each with the configuration
  that won. Every configuration's figure is printed as it finishes.

All releases draw fresh noise, so a figure is one draw: rerun to see the spread (a few
keys). ``--quick`` runs epsilon = 1 only.

    python benchmarks/bench_keys.py              # 3 epsilons: 5.7 min CPU, 37 min wall at load 6-17 (PipelineDP's 20 runs per epsilon dominate)
    python benchmarks/bench_keys.py --quick      # epsilon = 1 only: 2 min 15 s wall, 2 min CPU (2 cores, load 2)
    python benchmarks/bench_keys.py --quick --corpus identifiers   # the small-population corpus (issue 28)
"""
import argparse
import logging
import os
import sys
import tempfile
import time

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

DELTA = 1e-6
EPSILONS = (0.5, 1.0, 2.0)
L0S = (16, 64)
RELEASE_KINDS = ("gaussian", "laplace", "sample_and_threshold", "weighted_sampling",
                 "weighted_gaussian", "adaptive")

SPEC = """name: keys-{kind}
input: {{path: {data}, user: user, keys: [word]}}
privacy: {{epsilon: {epsilon!r}, delta: {delta!r}}}
bounding: {{max_keys_per_user: auto{auto}}}
mechanism: {{kind: {kind}}}
output: {{path: {out}}}
"""


# ---- the corpus ----------------------------------------------------------------------------

def corpus(data_dir):
    path = os.path.join(data_dir, f"docstring_file_py{sys.version_info[0]}{sys.version_info[1]}.parquet")
    if not os.path.exists(path):
        from benchmarks import docstring_corpus
        os.makedirs(data_dir, exist_ok=True)
        t0 = time.perf_counter()
        table = docstring_corpus.build(units=("file",))["file"]
        pq.write_table(table, path + ".part")
        os.replace(path + ".part", path)
        print(f"# built {path} in {time.perf_counter() - t0:.0f} s", flush=True)
    return path


def true_counts(table):
    """{word: distinct users} (the corpus has one row per distinct (user, word))."""
    g = table.group_by("word").aggregate([("user", "count_distinct")])
    return dict(zip(g.column("word").to_pylist(), g.column("user_count_distinct").to_pylist()))


def error_figures(released, truth):
    """(median, 90th percentile) of |released - true| / true over released (word, value)."""
    if not released:
        return float("nan"), float("nan")
    rel = np.array([abs(v - truth[w]) / truth[w] for w, v in released])
    return float(np.median(rel)), float(np.quantile(rel, 0.9))


# ---- thresher ------------------------------------------------------------------------------

def present_kinds():
    from thresher.pipelines.specs import spec as spec_mod
    here = os.path.join(ROOT, "pipelines", "kinds")
    return [k for k in RELEASE_KINDS
            if k in spec_mod.KINDS and os.path.exists(os.path.join(here, f"{k}.py"))]


def thresher_release(kind, data, epsilon, tmp, objective=None):
    """One real release (pipelines.running.release.run, default in-process runner); returns
    (released [(word, value)], chosen bound, seconds)."""
    from thresher.pipelines.running import release
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    out = os.path.join(tmp, f"out-{kind}-{epsilon}-{objective}")
    auto = f", auto: {{objective: {objective}}}" if objective else ""
    path = os.path.join(tmp, f"{kind}-{epsilon}-{objective}.yaml")
    with open(path, "w") as f:
        f.write(SPEC.format(kind=kind, data=data, epsilon=float(epsilon), delta=DELTA, out=out,
                            auto=auto))
    t0 = time.perf_counter()
    report = release.run(make_plan(spec_mod.load(path)), overwrite=True)
    seconds = time.perf_counter() - t0
    table = pq.read_table(os.path.join(out, "released.parquet"))
    column = "estimate" if "estimate" in table.column_names else "count"
    released = list(zip(table.column("word").to_pylist(),
                        [float(v) for v in table.column(column).to_pylist()]))
    return released, report["bounding"]["max_keys_per_user"], seconds


# ---- PipelineDP ----------------------------------------------------------------------------

def pdp_rows(table):
    """(user id, word id) int pairs (PipelineDP hashes them faster than strings) and the
    words by id."""
    users = pc.dictionary_encode(table.column("user")).combine_chunks()
    words = pc.dictionary_encode(table.column("word")).combine_chunks()
    rows = list(zip(users.indices.to_pylist(), words.indices.to_pylist()))
    return rows, words.dictionary.to_pylist()


def pdp_configs():
    import pipeline_dp
    S = pipeline_dp.PartitionSelectionStrategy
    N = pipeline_dp.NoiseKind
    counted = []
    for l0 in L0S:
        for strategy in S:
            # Laplace count noise: Gaussian would take a share of delta from the selection
            # (PipelineDP splits the budget between the two), never more keys
            counted.append((l0, strategy, N.LAPLACE, False))
        counted.append((l0, S.LAPLACE_THRESHOLDING, N.LAPLACE, True))
        counted.append((l0, S.GAUSSIAN_THRESHOLDING, N.GAUSSIAN, True))
    select = [(l0, strategy) for l0 in L0S for strategy in S]
    return counted, select


def _memoise_weighted_gaussian():
    """PipelineDP 0.3.1 re-creates (and re-calibrates) its weighted Gaussian selector for
    every partition with the same (epsilon, delta, l0) -- minutes on this corpus. The
    selector is a pure function of those parameters (its ``should_keep`` draws fresh
    noise on every call), so memoising the factory changes the speed only."""
    import functools
    from pipeline_dp import partition_selection
    factory = partition_selection.create_weighted_gaussian_thresholding
    if not hasattr(factory, "cache_info"):
        partition_selection.create_weighted_gaussian_thresholding = functools.lru_cache(
            maxsize=16)(factory)


def _extractors():
    import pipeline_dp
    return pipeline_dp.DataExtractors(privacy_id_extractor=lambda r: r[0],
                                      partition_extractor=lambda r: r[1],
                                      value_extractor=lambda r: 0)


def pdp_counted(rows, epsilon, l0, strategy, noise, post_aggregation):
    import pipeline_dp
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=DELTA)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.AggregateParams(
        metrics=[pipeline_dp.Metrics.PRIVACY_ID_COUNT], noise_kind=noise,
        max_partitions_contributed=l0, max_contributions_per_partition=1,
        partition_selection_strategy=strategy, post_aggregation_thresholding=post_aggregation)
    out = engine.aggregate(rows, params, _extractors())
    accountant.compute_budgets()
    return [(k, float(m.privacy_id_count)) for k, m in out]


def pdp_select(rows, epsilon, l0, strategy):
    import pipeline_dp
    accountant = pipeline_dp.NaiveBudgetAccountant(total_epsilon=epsilon, total_delta=DELTA)
    engine = pipeline_dp.DPEngine(accountant, pipeline_dp.LocalBackend())
    params = pipeline_dp.SelectPartitionsParams(max_partitions_contributed=l0,
                                                partition_selection_strategy=strategy)
    out = engine.select_partitions(rows, params, _extractors())
    accountant.compute_budgets()
    return list(out)


def pdp_best(rows, words, epsilon):
    """{"counted": best over the four strategies and l0 (selection before aggregation),
    "post-agg": best with post_aggregation_thresholding, "select": best keys-only}, each
    (keys, config, released [(word, count)] or [])."""
    _memoise_weighted_gaussian()
    counted, select = pdp_configs()
    best = {"counted": (-1, None, []), "post-agg": (-1, None, []), "select": (-1, None, [])}
    for l0, strategy, noise, post in counted:
        t0 = time.perf_counter()
        try:
            out = pdp_counted(rows, epsilon, l0, strategy, noise, post)
        except Exception as e:   # a combination PipelineDP refuses
            print(f"#   PipelineDP refused l0={l0} {strategy.value} {noise.value} "
                  f"post={post}: {str(e).splitlines()[0][:100]}", flush=True)
            continue
        config = f"l0={l0}, {strategy.value}, {noise.value}" + (", post-agg" if post else "")
        print(f"#   eps={epsilon:g} PipelineDP counted {config}: {len(out)} keys, "
              f"{time.perf_counter() - t0:.0f} s", flush=True)
        which = "post-agg" if post else "counted"
        if len(out) > best[which][0]:
            best[which] = (len(out), config, [(words[k], v) for k, v in out])
    for l0, strategy in select:
        t0 = time.perf_counter()
        n = len(pdp_select(rows, epsilon, l0, strategy))
        print(f"#   eps={epsilon:g} PipelineDP select_partitions l0={l0}, {strategy.value}: "
              f"{n} keys, {time.perf_counter() - t0:.0f} s", flush=True)
        if n > best["select"][0]:
            best["select"] = (n, f"l0={l0}, {strategy.value}", [])
    return best


# ---- main ----------------------------------------------------------------------------------

def load_avg():
    return os.getloadavg()[0]


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="epsilon = 1 only")
    ap.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", "data"))
    ap.add_argument("--corpus", default=None, help="a (user, word) Parquet instead of the "
                    "docstring corpus, or 'identifiers': the small-population corpus "
                    "(benchmarks/identifier_corpus.py: identifiers of numpy, scipy, pandas "
                    "and pyarrow, one user per file, 2,810 users)")
    ap.add_argument("--kinds", default=None, help="comma-separated thresher kinds to run "
                    "(default: every present release kind)")
    ap.add_argument("--objective", default=None, choices=("keys", "l1"),
                    help="bounding.auto.objective for every thresher release (default: the "
                         "spec default)")
    ap.add_argument("--no-peer", action="store_true", help="skip PipelineDP")
    args = ap.parse_args(argv)
    logging.getLogger("thresher").setLevel(logging.WARNING)
    logging.getLogger().setLevel(logging.ERROR)
    if args.corpus == "identifiers":
        from benchmarks import identifier_corpus
        data = identifier_corpus.cached(args.data_dir)
    else:
        data = args.corpus or corpus(args.data_dir)
    table = pq.read_table(data, columns=["user", "word"])
    truth = true_counts(table)
    print(f"# corpus {data}: {table.num_rows} rows, "
          f"{len(set(table.column('user').to_pylist()))} users, {len(truth)} distinct words; "
          f"delta = {DELTA:g}; load average {load_avg():.2f}", flush=True)
    epsilons = (1.0,) if args.quick else EPSILONS
    kinds = present_kinds() if not args.kinds else [k for k in args.kinds.split(",") if k]
    rows = words = None
    if not args.no_peer:
        rows, words = pdp_rows(table)
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_keys_") as tmp:
        for eps in epsilons:
            for kind in kinds:
                released, bound, seconds = thresher_release(kind, data, eps, tmp, args.objective)
                med, p90 = error_figures(released, truth)
                results[(eps, f"thresher {kind}")] = (len(released), f"C={bound}", med, p90)
                print(f"# eps={eps:g} thresher {kind}: {len(released)} keys, C={bound}, "
                      f"{seconds:.1f} s, load {load_avg():.2f}", flush=True)
            if not args.no_peer:
                t0 = time.perf_counter()
                best = pdp_best(rows, words, eps)
                for which, name in (("counted", "PipelineDP best counted"),
                                    ("post-agg", "PipelineDP best counted, post-aggregation "
                                                 "thresholding"),
                                    ("select", "PipelineDP best select_partitions")):
                    n, config, rel = best[which]
                    med, p90 = error_figures(rel, truth) if rel else (float("nan"),) * 2
                    results[(eps, name)] = (n, config, med, p90)
                print(f"# eps={eps:g} PipelineDP: " + ", ".join(
                    f"{w} {best[w][0]} ({best[w][1]})" for w in best)
                    + f"; {time.perf_counter() - t0:.0f} s, load {load_avg():.2f}", flush=True)
    names = []
    for (_, name) in results:
        if name not in names:
            names.append(name)
    print()
    print("| release | " + " | ".join(f"keys at eps={e:g}" for e in epsilons)
          + " | median (p90) rel. error at eps=" + "/".join(f"{e:g}" for e in epsilons) + " |")
    print("|---|" + "---:|" * len(epsilons) + "---|")
    for name in names:
        cells = [f"{results[(e, name)][0]} ({results[(e, name)][1]})" for e in epsilons]
        errs = []
        for e in epsilons:
            med, p90 = results[(e, name)][2:]
            errs.append("-" if np.isnan(med) else f"{med:.3f} ({p90:.3f})")
        print(f"| {name} | " + " | ".join(cells) + " | " + " / ".join(errs) + " |")
    return results


if __name__ == "__main__":
    main()

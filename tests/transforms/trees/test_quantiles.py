"""transforms.trees.quantiles: hierarchical-histogram ranges/quantiles and the binary-search
quantile (paper 003 Sec. 4.2), on data with known ranks, errors within the stated bounds."""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from thresher.accounting import sample_threshold as acc
from thresher.transforms.trees import quantiles as q
from thresher.transforms.randomness import keyed_random

N = 1_000_000
BRANCHING, LEVELS = 4, 6
PHIS = (0.01, 0.05, 0.25, 0.5, 0.75, 0.95, 0.99)
FAILURE = 1e-9  # per rank bound; a union over <= 4**6 + 1 boundaries stays below 5e-6


class Ranks:
    """True ranks from per-value counts: rank(t) = number of values < t."""

    def __init__(self, values, counts):
        self.values = values
        self.below = np.concatenate(([0], np.cumsum(counts)))

    def __call__(self, t):
        return self.below[np.searchsorted(self.values, t, side="left")]


def data(seed):
    """N values on [0, 1) from a Beta(2, 5) rounded to 1e-4: per-value counts and their
    true ranks."""
    x = np.round(np.random.default_rng(seed).beta(2, 5, N), 4)
    values, counts = np.unique(x, return_counts=True)
    table = pa.table({"v": values, "count": pa.array(counts, pa.int64())})
    return table, Ranks(values, counts)


def true_rank(ranks, t):
    return int(ranks(t))


def assert_quantiles_within_bound(answers, ranks, params):
    p, tau = params.sampling_rate, params.threshold
    slack = (q.rank_error_bound(N, branching=BRANCHING, levels=answers.levels, sampling_rate=p,
                                threshold=tau, failure=FAILURE)
             + BRANCHING * (tau - 1) / p + q.bernstein_deviation(N, p, FAILURE))  # |N_hat - N|
    assert abs(answers.total() - N) <= BRANCHING * (tau - 1) / p + q.bernstein_deviation(N, p, FAILURE)
    leaf = 1.0 / answers.leaves
    for phi in PHIS:
        t = answers.quantile(phi)
        # the first boundary whose estimated rank reaches phi N_hat: the true rank at t is
        # not below phi N - slack, and one leaf earlier it is not above phi N + slack
        assert true_rank(ranks, t) >= phi * N - slack
        assert true_rank(ranks, t - leaf) <= phi * N + slack
    # the bound (conservative: 1e-9 failure per rank) still separates the quantiles asked
    assert slack / N < 0.06


def test_rank_of_every_leaf_boundary_is_within_the_rank_error_bound():
    table, ranks = data(1)
    params = acc.calibrate_levels(1.0, 1e-8, LEVELS, 1)
    released = q.hierarchical_release(table, "v", lo=0, hi=1, branching=BRANCHING,
                                      levels=LEVELS, params=params, rng=np.random.default_rng(2))
    answers = q.RangeAnswers(released, lo=0, hi=1, branching=BRANCHING, levels=LEVELS)
    edges = np.arange(answers.leaves + 1) / answers.leaves
    truth = ranks(edges)
    estimates = np.array([answers.rank(e) for e in edges])
    bounds = np.array([q.rank_error_bound(r, branching=BRANCHING, levels=LEVELS,
                                          sampling_rate=params.sampling_rate,
                                          threshold=params.threshold, failure=FAILURE)
                       for r in truth])
    assert (np.abs(estimates[:-1] - truth[:-1]) <= bounds[:-1]).all()
    # range queries are differences of ranks
    a, b = 0.1, 0.3
    assert abs(answers.range_count(a, b) - (true_rank(ranks, b) - true_rank(ranks, a))) \
        <= 2 * bounds.max()
    assert_quantiles_within_bound(answers, ranks, params)


def test_hierarchical_histogram_end_to_end_on_beam():
    levels = 4  # 256 leaves: fewer Beam stages than the kernel test
    table, ranks = data(5)
    params = acc.calibrate_levels(1.0, 1e-8, levels, 1)
    batches = [table.slice(i, 3000) for i in range(0, table.num_rows, 3000)]

    def check(out):
        released = pa.concat_tables(out)
        assert released.column_names == ["level", "bucket", "count", "estimate"]
        assert min(released.column("count").to_pylist()) >= params.threshold
        assert set(released.column("level").to_pylist()) == {1, 2, 3, 4}
        answers = q.RangeAnswers(released, lo=0, hi=1, branching=BRANCHING, levels=levels)
        assert_quantiles_within_bound(answers, ranks, params)

    with TestPipeline(runner=FnApiRunner()) as p:
        out = (p | beam.Create(batches)
               | q.HierarchicalHistogram("v", lo=0, hi=1, branching=BRANCHING, levels=levels,
                                         params=params.as_report(), num_shards=2,
                                         rng_factory=keyed_random.KeyedSource(bytes(32)).child("Hierarchy")))
        assert_that(out | beam.combiners.ToList(), lambda lists: check(lists[0]))


def test_binary_search_quantile_brackets_phi_within_eta():
    """h = 14 rounds at eps = 1 total. After the search, F(t - w) <= phi + eta and
    F(t + w) >= phi - eta with eta the largest per-round split_fraction_error (each
    holds with probability >= 1 - 2e-9 per round)."""
    table, ranks = data(9)
    values = table.column("v").to_numpy()
    counts = table.column("count").to_numpy()
    rounds = 14
    params = acc.calibrate_levels(1.0, 1e-8, rounds, 1)
    rng = np.random.default_rng(4)
    w = 1.0 / 2 ** (rounds + 1)
    for phi in (0.1, 0.5, 0.9):
        t, trace = q.binary_search_quantile(values, counts, phi=phi, lo=0, hi=1, rounds=rounds,
                                            sampling_rate=params.sampling_rate,
                                            threshold=params.threshold, rng=rng)
        assert len(trace) == rounds
        eta = max(q.split_fraction_error(true_rank(ranks, s), N - true_rank(ranks, s),
                                         sampling_rate=params.sampling_rate,
                                         threshold=params.threshold) for s, _, _ in trace)
        assert true_rank(ranks, t - w) / N <= phi + eta
        assert true_rank(ranks, t + w) / N >= phi - eta
        assert eta < 0.05  # the bound says something at this n


def test_domain_and_phi_are_validated():
    with pytest.raises(ValueError, match="domain"):
        q.bucket_of([0.5], lo=1, hi=0, branching=2, level=1)
    with pytest.raises(ValueError, match="branching"):
        q.HierarchicalHistogram("v", lo=0, hi=1, branching=1, levels=3, params={})
    answers = q.RangeAnswers([], lo=0, hi=1, branching=2, levels=2)
    with pytest.raises(ValueError, match="phi"):
        answers.quantile(1.5)
    assert list(q.bucket_of([-5, 0, 0.49, 0.5, 7], lo=0, hi=1, branching=2, level=1)) == [0, 0, 0, 1, 1]

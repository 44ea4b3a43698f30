"""Tests of transforms.bounding.rand_clip: exact per-user counts, uniform subsets, Beam wrapper."""
import collections
import itertools

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from thresher.transforms.randomness import samplers
from thresher.transforms.randomness import keyed_random
from thresher.transforms.bounding.rand_clip import (
    RandClip, rand_clip, rand_clip_counts, rand_clip_table, rank_within_user, user_codes_of)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(-5, 30), max_size=300), st.integers(1, 12), st.integers(0, 2**32))
def test_each_user_keeps_exactly_min_of_records_and_bound(users, bound, seed):
    users = np.array(users, dtype=np.int64)
    keep = rand_clip(users, np.random.default_rng(seed), bound)
    kept = collections.Counter(users[keep].tolist())
    for user, m in collections.Counter(users.tolist()).items():
        assert kept[user] == min(m, bound)


def _lexsort_ranks(users, priorities):
    """The ranks of rank_within_user's definition, in plain Python: records sorted by
    (user, priority, input position), numbered from 0 within each user."""
    order = sorted(range(len(users)), key=lambda i: (int(users[i]), priorities[i].item(), i))
    ranks, seen = np.empty(len(users), dtype=np.int64), collections.Counter()
    for row in order:
        ranks[row] = seen[int(users[row])]
        seen[int(users[row])] += 1
    return ranks


_USER_CODES = {
    "small": st.integers(-5, 30),
    "32-bit span": st.sampled_from([0, 1, 2**32 - 1, 2**31]),
    "hashes": st.integers(-2**63, 2**63 - 1),
}
_PRIORITIES = {
    "uniform": st.integers(0, 2**64 - 1),
    "tied": st.sampled_from([0, 7, 2**63, 2**64 - 1]),
    "one top word": st.integers(0, 2**20).map(lambda v: (5 << 40) + v),
}


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(sorted(_USER_CODES)), st.sampled_from(sorted(_PRIORITIES)), st.data())
def test_ranks_are_those_of_one_lexsort_by_user_priority_and_position(users, priorities, data):
    """rank_within_user's one-word sort gives the ranks of a lexsort by (user, priority,
    input position) on every kind of table: narrow and 64-bit user codes; uniform, tied,
    and equal-in-their-top-bits priorities (where it falls back to lexsort); float
    priorities. Deterministic (derandomized hypothesis)."""
    n = data.draw(st.integers(0, 200))
    codes = np.array(data.draw(st.lists(_USER_CODES[users], min_size=n, max_size=n)),
                     dtype=np.int64)
    words = np.array(data.draw(st.lists(_PRIORITIES[priorities], min_size=n, max_size=n)),
                     dtype=np.uint64)
    np.testing.assert_array_equal(rank_within_user(codes, words), _lexsort_ranks(codes, words))
    floats = words.astype(np.float64)
    np.testing.assert_array_equal(rank_within_user(codes, floats), _lexsort_ranks(codes, floats))


def test_kept_subsets_are_uniform():
    """20000 users with 5 records each, C = 2: each of the 10 subsets should appear with
    probability 1/10. Chi-square rejects at p < 1e-4 (false failure 1e-4; fixed seed)."""
    n_users = 20000
    users = np.repeat(np.arange(n_users), 5)
    keep = rand_clip(users, np.random.default_rng(4), 2).reshape(n_users, 5)
    subsets = list(itertools.combinations(range(5), 2))
    index = {s: i for i, s in enumerate(subsets)}
    ids = [index[tuple(np.flatnonzero(row))] for row in keep]
    counts = np.bincount(ids, minlength=len(subsets))
    assert stats.chisquare(counts).pvalue > 1e-4


def test_secure_random_keeps_exact_counts():
    users = np.array([3, 3, 3, 1, 3, 1, 7])
    keep = rand_clip(users, samplers.secure_random(), 2)
    assert collections.Counter(users[keep].tolist()) == {3: 2, 1: 2, 7: 1}


@pytest.mark.parametrize("bound", [0, -1, 1.5, True])
def test_invalid_bound_is_refused(bound):
    with pytest.raises(ValueError, match="max_records_per_user"):
        rand_clip(np.array([1, 2]), np.random.default_rng(0), bound)


def test_user_codes_of_any_type():
    strings = pa.table({"__user": pa.array(["a", "b", None, "a", None])})
    codes = user_codes_of(strings)
    assert codes[0] == codes[3] and codes[2] == codes[4] and len(set(codes.tolist())) == 3
    ints = pa.table({"__user": pa.chunked_array([[5, 9], [5]], type=pa.int32())})
    assert user_codes_of(ints).tolist() == [5, 9, 5]
    dictionary = pa.table({"__user": pa.array(["x", "y", "x"]).dictionary_encode()})
    assert user_codes_of(dictionary).tolist()[0] == user_codes_of(dictionary).tolist()[2]
    with pytest.raises(ValueError, match="user column"):
        user_codes_of(pa.table({"u": [1]}))


def _tables():
    rng = np.random.default_rng(1)
    tables = []
    for shard in range(3):
        users = rng.integers(0, 40, 400) + 1000 * shard
        tables.append(pa.table({"__user": pa.array([f"u{u}" for u in users]),
                                "key": pa.array(rng.integers(0, 9, 400))}))
    return tables


def _counts_per_user(tables):
    return collections.Counter(u for t in tables for u in t.column("__user").to_pylist())


def test_rand_clip_table_keeps_all_columns():
    table = _tables()[0]
    kept = rand_clip_table(table, 3, np.random.default_rng(0))
    assert kept.schema == table.schema
    assert max(_counts_per_user([kept]).values()) == 3


def test_rand_clip_counts_are_the_kept_records_per_key():
    table = _tables()[1]
    kept = rand_clip_table(table, 3, np.random.default_rng(8))
    counts = rand_clip_counts(table, ["key"], 3, np.random.default_rng(8))
    assert counts.column_names == ["key", "__key", "count"]
    got = dict(zip(counts.column("key").to_pylist(), counts.column("count").to_pylist()))
    assert got == dict(collections.Counter(kept.column("key").to_pylist()))


@pytest.mark.parametrize("as_side_input", [False, True])
def test_beam_rand_clip_counts_min_of_records_and_bound_per_user(as_side_input):
    """Every user keeps min(m_i, C) records, so the per-key counts add up to
    sum_i min(m_i, C), and no key gains records."""
    tables = _tables()
    bound = 4
    per_user = _counts_per_user(tables)
    per_key = collections.Counter(k for t in tables for k in t.column("key").to_pylist())
    pipeline = beam.Pipeline(runner=FnApiRunner())
    source = pipeline | "Tables" >> beam.Create(tables)
    if as_side_input:
        c = beam.pvalue.AsSingleton(pipeline | "C" >> beam.Create([bound]), default_value=1)
    else:
        c = bound
    counts = source | RandClip(["key"], c, rng_factory=keyed_random.seeded_for_tests(0))
    rows = counts | beam.FlatMap(lambda t: zip(t.column("key").to_pylist(),
                                               t.column("count").to_pylist()))

    def check(pairs):
        total = collections.Counter()
        for key, count in pairs:
            total[key] += count
        assert sum(total.values()) == sum(min(m, bound) for m in per_user.values())
        assert all(total[k] <= per_key[k] for k in total)

    assert_that(rows, check)
    result = pipeline.run()
    result.wait_until_finish()
    kept = result.metrics().query(MetricsFilter().with_name("records_kept"))["counters"]
    assert sum(r.committed for r in kept) == sum(min(m, bound) for m in per_user.values())


def test_beam_rand_clip_refuses_a_bad_side_input_value():
    with pytest.raises(Exception, match="max_records_per_user"):
        with beam.Pipeline(runner=FnApiRunner()) as pipeline:
            c = beam.pvalue.AsSingleton(pipeline | "C" >> beam.Create([0]))
            _ = pipeline | beam.Create(_tables()[:1]) | RandClip(
                ["key"], c, rng_factory=keyed_random.seeded_for_tests(0))

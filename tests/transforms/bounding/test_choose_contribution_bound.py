"""Tests of transforms.bounding.choose_contribution_bound on Beam's FnApiRunner.

The Beam stage's integer score sums are checked to equal, exactly, the one-process
reference ``accounting.contribution_bound.exact_score_sums`` on the same records (and to
lie within the proven rounding bound of the real-valued ``score_values``); the drawn C is
checked to be drawn exactly once however many consumers read it.
"""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.metrics.metric import MetricsFilter
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from thresher.accounting import contribution_bound as cb
from thresher.transforms.randomness import keyed_random
from thresher.transforms.bounding.choose_contribution_bound import (
    ChooseContributionBound, ContributionBoundSums, key_shards, table_statistics)

_CANDIDATES = (1, 2, 4, 8, 16)
_MAX_BOUND = 16


def _records(seed=0, n_tables=4, rows=1500):
    """User-sharded tables (users disjoint across tables), string user ids, a two-column
    key (string, int32), plus the same records as integer codes for the reference."""
    rng = np.random.default_rng(seed)
    tables, all_users, all_keys = [], [], []
    for shard in range(n_tables):
        users = rng.integers(0, 120, rows) + 1000 * shard
        users = users[np.argsort(rng.random(rows))]
        # heavy-tailed key popularity so some keys pass thresholds and some do not
        keys = np.minimum(rng.zipf(1.6, rows), 60)
        tables.append(pa.table({
            "__user": pa.array([f"user-{u}" for u in users]),
            "word": pa.array([f"w{k % 20}" for k in keys]),
            "bucket": pa.array(keys // 20, type=pa.int32()),
            "ignored": pa.array(np.zeros(rows)),
        }))
        all_users.append(users)
        all_keys.append(keys)
    return tables, np.concatenate(all_users), np.concatenate(all_keys)


def _scores():
    return [
        cb.make_score("laplace_l1", _CANDIDATES, _MAX_BOUND, {"epsilon": 1.0, "delta": 1e-5}),
        cb.make_score("gaussian", _CANDIDATES, _MAX_BOUND,
                      {"thresholds": [6.0, 9.0, 14.0, 22.0, 35.0], "sigmas": [1, 2, 3, 4, 6]}),
        cb.make_score("sample_and_threshold", _CANDIDATES, _MAX_BOUND,
                      {"thresholds": [3, 4, 5, 7, 9], "sampling_rates": [0.6, 0.4, 0.3, 0.2, 0.1]}),
    ]


@pytest.mark.parametrize("score", _scores(), ids=lambda s: s.kind)
def test_beam_sums_equal_the_one_process_reference(score):
    tables, users, keys = _records()
    pu, pk, pc = cb.pairs_from_records(users, keys)
    want = cb.exact_score_sums(pu, pk, pc, score)
    _, dropped, key_costs = cb.score_values(pu, pk, pc, score)
    # the exact scores are the real ones rounded down: per key by at most
    # s (keys x 2^-B) on the counts and 2^-K (+ float error) on the cost
    units = np.asarray(want[1], dtype=np.float64) / 2.0 ** score.cost_bits
    n_keys = len(np.unique(pk))
    slack = n_keys * (score.suppressed_weight * len(pu) * 2.0 ** -20 + 2.0 ** -score.cost_bits)
    assert np.all(units <= key_costs + 1e-9) and np.all(units >= key_costs - slack)
    assert list(want[0]) == dropped.tolist()

    def check(results):
        (sums,) = results
        assert sums == want

    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        sums = (pipeline | beam.Create(tables)
                | ContributionBoundSums(["word", "bucket"], score, num_key_shards=3))
        assert_that(sums, check)


def test_key_shards_depend_only_on_the_key_values():
    a = pa.table({"s": pa.array(["x", "yy", "q", "", "zzz"]),
                  "i": pa.array([1, 2, 3, 4, 5], type=pa.int32())})
    b = pa.Table.from_batches([
        pa.record_batch({"s": pa.array(["zzz", "x"], type=pa.large_string()),
                         "i": pa.array([5, 1], type=pa.int64())}),
        pa.record_batch({"s": pa.array(["", "q"], type=pa.large_string()),
                         "i": pa.array([4, 3], type=pa.int64())})])
    sa, sb = key_shards(a, ["s", "i"], 1000), key_shards(b, ["s", "i"], 1000)
    assert sb.tolist() == [sa[4], sa[0], sa[3], sa[2]]
    assert key_shards(a.slice(2), ["s", "i"], 1000).tolist() == sa[2:].tolist()
    # with the reader's __key column, the shard is __key mod num_shards
    keyed = a.append_column("__key", pa.array(np.arange(5, dtype=np.uint64) * 7))
    assert key_shards(keyed, ["s", "i"], 4).tolist() == [0, 3, 2, 1, 0]
    many = pa.table({"s": pa.array([f"key{i}" for i in range(2000)])})
    assert np.bincount(key_shards(many, ["s"], 8), minlength=8).min() > 150


def test_pipeline_shaped_input_uint64_user_hash_and_key_hash():
    """The reader's tables: __user a uint64 hash, __key the key hash, key columns."""
    from thresher.transforms.randomness.hashing import hash_array, hash_columns
    tables, users, keys = _records(seed=2, n_tables=3, rows=800)
    shaped = []
    for t in tables:
        keyed = t.select(["word", "bucket"])
        shaped.append(keyed.append_column("__key", pa.array(hash_columns(keyed, ["word", "bucket"])))
                      .append_column("__user", pa.array(hash_array(t.column("__user")))))
    score = _scores()[1]
    want = cb.exact_score_sums(*cb.pairs_from_records(users, keys), score)

    def check(results):
        (sums,) = results
        assert sums == want

    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        sums = (pipeline | beam.Create(shaped)
                | ContributionBoundSums(["word", "bucket"], score, num_key_shards=5))
        assert_that(sums, check)


def test_table_statistics_partials_cover_each_key_once_per_table():
    """Partials carry the key hash ``__key`` (no key strings): every distinct key of the
    table appears exactly once, in the shard key_shards gives it."""
    from thresher.transforms.randomness.hashing import hash_columns
    tables, _, _ = _records(n_tables=1)
    score = _scores()[0]
    _, partials = table_statistics(tables[0], ["word", "bucket"], score, num_key_shards=4)
    keys = [h for _, t in partials for h in t.column("__key").to_pylist()]
    assert len(keys) == len(set(keys))
    assert set(keys) == set(hash_columns(tables[0], ["word", "bucket"]).tolist())
    assert len({s for s, _ in partials}) == len(partials)
    for shard, t in partials:
        assert set(key_shards(t, ["word", "bucket"], 4).tolist()) == {shard}
        assert "word" not in t.column_names


def _choose(pipeline, tables, **overrides):
    kwargs = dict(candidates=_CANDIDATES, epsilon=1.0, model="l1", score="laplace_l1",
                  score_params={"epsilon": 1.0, "delta": 1e-5}, max_bound=_MAX_BOUND,
                  rng_factory=keyed_random.KeyedSource(b"choose-bound test secret........")
                  .child("ChooseContributionBound"))
    kwargs.update(overrides)
    return tables | ChooseContributionBound(["word", "bucket"], **kwargs)


def test_large_epsilon_chooses_the_minimiser_of_v():
    tables, users, keys = _records(seed=3)
    score = _scores()[0]
    values = cb.score_values(*cb.pairs_from_records(users, keys), score)[0]
    best = _CANDIDATES[int(np.argmin(values))]
    # epsilon 1e4 / Delta 31: every other candidate has probability < exp(-300)
    assert np.sort(values)[1] - values.min() > 1
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        chosen = _choose(pipeline, pipeline | beam.Create(tables), epsilon=1e4)
        assert_that(chosen, equal_to([best]))


def test_empty_input_still_yields_one_candidate():
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        empty = pipeline | beam.Create([pa.table({"__user": pa.array([], pa.string()),
                                                  "word": pa.array([], pa.string()),
                                                  "bucket": pa.array([], pa.int32())})])
        chosen = _choose(pipeline, empty)
        assert_that(chosen | beam.Map(lambda c: c in _CANDIDATES), equal_to([True]))


def test_chosen_bound_is_drawn_once_for_two_consumers():
    """The EM runs once (metric = 1) and both side-input consumers see the same C.

    With 64 candidates and a near-uniform distribution (epsilon 1e-9), two independent
    draws would agree with probability about 1/64; over the two runs below a stage that
    drew twice would pass with probability about 1/4096."""
    tables, _, _ = _records(seed=5, n_tables=2, rows=400)
    candidates = tuple(range(1, 65))
    for _ in range(2):
        pipeline = beam.Pipeline(runner=FnApiRunner())
        chosen = _choose(pipeline, pipeline | beam.Create(tables), candidates=candidates,
                         max_bound=64, epsilon=1e-9)
        side = beam.pvalue.AsSingleton(chosen, default_value=-1)
        seen = [(pipeline | f"Trigger{i}" >> beam.Create([i])
                 | f"Read{i}" >> beam.Map(lambda _, c: c, side)) for i in range(2)]
        pairs = ((seen[0] | "K0" >> beam.Map(lambda c: ("c", c)),
                  seen[1] | "K1" >> beam.Map(lambda c: ("c", c)))
                 | beam.Flatten() | beam.GroupByKey()
                 | beam.MapTuple(lambda _, cs: len(set(cs)) == 1 and list(cs)[0] in candidates))
        assert_that(pairs, equal_to([True]))
        result = pipeline.run()
        result.wait_until_finish()
        draws = result.metrics().query(MetricsFilter().with_name(
            "contribution_bound_draws"))["counters"]
        assert sum(r.committed for r in draws) == 1


def test_seeded_rng_factory_draws_what_the_kernel_draws():
    """With a seeded generator (tests only) the stage draws exactly what
    accounting.contribution_bound.choose_bound draws from the reference V(C) with the
    monotone exponential mechanism (the stage's default)."""
    tables, users, keys = _records(seed=6, n_tables=2, rows=300)
    score = _scores()[0]
    values = score.exact_values(*cb.exact_score_sums(*cb.pairs_from_records(users, keys),
                                                     score))
    want, _ = cb.choose_bound(values, _CANDIDATES, 0.05, score.selection_sensitivity,
                              np.random.default_rng(42), monotone=True)
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        chosen = _choose(pipeline, pipeline | beam.Create(tables), epsilon=0.05,
                         rng_factory=keyed_random.seeded_for_tests(42))
        assert_that(chosen, equal_to([want]))


@pytest.mark.parametrize("overrides, field", [
    (dict(model="l0"), "model"),
    (dict(model="l2"), "model"),
    (dict(score="gaussian", model="l0", score_params={}), "thresholds"),
    (dict(epsilon=0.0), "epsilon"),
    (dict(candidates=(1, 32)), "candidates"),
])
def test_invalid_configuration_is_refused_at_construction(overrides, field):
    kwargs = dict(candidates=_CANDIDATES, epsilon=1.0, model="l1", score="laplace_l1",
                  score_params={"epsilon": 1.0, "delta": 1e-5}, max_bound=_MAX_BOUND,
                  rng_factory=keyed_random.KeyedSource(b"choose-bound test secret........"))
    kwargs.update(overrides)
    with pytest.raises(ValueError, match=field):
        ChooseContributionBound(["word"], **kwargs)


def test_default_candidates_and_reported_sensitivity():
    stage = ChooseContributionBound(["word"], candidates=None, epsilon=0.1, model="l0",
                                    score="laplace_l0",
                                    score_params={"epsilon": 0.9, "delta": 1e-6},
                                    max_bound=128)
    assert stage.candidates == cb.default_candidates(128)
    # balanced weight w = sqrt(max_C t(C) / (C / eps)), t(C) = 1 + (C/eps) ln(C/(2 delta)):
    # the ratio eps / C + ln(C / (2 delta)) is largest at C = C_m = 128.
    w = math.sqrt(0.9 / 128 + math.log(128 / 2e-6))
    assert stage.score.dropped_weight == pytest.approx(w, rel=1e-12)
    assert stage.score.suppressed_weight == stage.score.dropped_weight
    assert stage.sensitivity == pytest.approx(w * 128, rel=1e-12)
    paper = ChooseContributionBound(["word"], candidates=None, epsilon=0.1, model="l0",
                                    score="laplace_l0",
                                    score_params={"epsilon": 0.9, "delta": 1e-6,
                                                  "dropped_weight": "paper"},
                                    max_bound=128)
    assert paper.sensitivity == 2 * 128 - 1


# ---- the value-sort kernels (issue 43) against the code they replace -------------------

def _pair_keys(seed, n, distinct, shared_top_bits=False):
    rng = np.random.default_rng(seed)
    keys = rng.integers(0, 2**63, distinct, dtype=np.uint64) * np.uint64(2) + np.uint64(1)
    if shared_top_bits:   # pairs of keys equal but in their lowest bits: the exact path
        keys[1::2] = keys[0::2][:len(keys[1::2])] ^ np.uint64(1 << 3)
    return keys[rng.integers(0, distinct, n)]


@pytest.mark.parametrize("seed,n,distinct,shared", [(0, 1, 1, False), (1, 5000, 300, False),
                                                    (2, 70000, 20000, False),
                                                    (3, 5000, 300, True), (4, 3, 3, True)])
def test_key_numbers_by_value_sort_equal_the_dictionary_encoding(seed, n, distinct, shared):
    from thresher.transforms.bounding.choose_contribution_bound import (
        _key_numbers_by_dictionary, key_numbers)
    keys = _pair_keys(seed, n, distinct, shared)
    got, want = key_numbers(keys), _key_numbers_by_dictionary(keys)
    for g, w in zip(got[:3], want[:3]):
        assert g.dtype == w.dtype and np.array_equal(g, w)
    if got.order is not None:   # the pairs by key number, ties in pair order
        assert np.array_equal(got.order, np.argsort(want.index, kind="stable"))
    assert shared or got.order is not None   # the value sort served (no fallback)


def test_key_numbers_of_no_pairs():
    from thresher.transforms.bounding.choose_contribution_bound import key_numbers
    numbers = key_numbers(np.zeros(0, dtype=np.uint64))
    assert len(numbers.keys) == len(numbers.index) == len(numbers.first) == 0


@pytest.mark.parametrize("candidates", [(1, 2, 4, 8, 16), (3,), (2, 5, 100, 1000)])
@pytest.mark.parametrize("seed", [0, 1])
def test_l0_key_units_equal_the_general_loop(candidates, seed):
    """Per key and candidate, the grouped l0 sums are the integers of the loop over every
    pair (``key_units``: ``exact_bincount`` of ``expected_count_units``), with light
    users (w <= min C), heavy ones (w > max C) and users in between."""
    from thresher.transforms.bounding.choose_contribution_bound import key_units, l0_key_units
    rng = np.random.default_rng(seed)
    sizes = np.concatenate([rng.integers(1, 4, 300), rng.zipf(1.5, 300) % 3000 + 1, [2500]])
    pair_users = np.repeat(np.arange(len(sizes)), sizes)
    num_keys = 5000   # some keys without a pair
    pair_position = rng.integers(0, num_keys, len(pair_users))
    weights = np.bincount(pair_users).astype(np.int64)
    score = cb.make_score("gaussian", candidates, max(candidates),
                          {"thresholds": [10.0 + c for c in candidates]})
    want = key_units(pair_users, None, weights, score, pair_position, num_keys)
    got = l0_key_units(pair_users, np.maximum(weights, 1), candidates, pair_position, num_keys)
    order = np.argsort(pair_position, kind="stable")
    assert all(np.array_equal(g, o) for g, o in zip(got, l0_key_units(
        pair_users, np.maximum(weights, 1), candidates, pair_position, num_keys, order)))
    assert len(got) == len(want) == len(candidates)
    for g, w in zip(got, want):
        assert g.dtype == np.int64 and np.array_equal(g, w)
    assert len({tuple(w) for w in want}) == len(candidates)   # the columns differ


def _running_sum_l0_key_units(pair_users, user_weight, candidates, pair_key, num_keys):
    """l0_key_units as it was before its levels (issue 43, round 6): per candidate, every
    pair's units gathered in key order and summed by an int64 running sum (the oracle of
    the level kernel)."""
    from thresher.accounting import exact_scores
    key_order = np.argsort(pair_key, kind="stable")
    sizes = np.bincount(pair_key, minlength=num_keys)
    held = np.flatnonzero(sizes)
    ends = np.cumsum(sizes)[held]
    starts = ends - sizes[held]
    weights, weight_of_user = np.unique(user_weight, return_inverse=True)
    pair_weight = weight_of_user.reshape(-1)[pair_users[key_order]]
    out = []
    for candidate in candidates:
        units = exact_scores.expected_count_units(None, weights, int(candidate))
        running = np.zeros(len(pair_weight) + 1, dtype=np.int64)
        np.cumsum(units[pair_weight], out=running[1:])
        column = np.zeros(num_keys, dtype=np.int64)
        column[held] = running[ends] - running[starts]
        out.append(column)
    return out


@pytest.mark.parametrize("seed", range(30))
def test_l0_key_units_by_levels_equal_the_running_sums_on_random_tables(seed):
    """The level kernel (pairs at full weight counted per level, the others summed over
    a shrinking prefix) gives the integers of the per-candidate running sums it replaced,
    on random tables: weights equal to a candidate, below the smallest and above the
    largest, candidates in any order, keys without pairs. Deterministic (fixed seeds)."""
    from thresher.transforms.bounding.choose_contribution_bound import l0_key_units
    rng = np.random.default_rng(1000 + seed)
    candidates = sorted(rng.choice(np.arange(1, 300), size=rng.integers(1, 15), replace=False))
    candidates = [int(c) for c in candidates]
    if seed % 3 == 1:
        candidates = candidates[::-1]
    pool = np.concatenate([candidates, np.array(candidates) + 1, [1, 2, 500, 4000]])
    sizes = np.where(rng.random(400) < 0.5, rng.choice(pool, 400),
                     rng.zipf(1.6, 400) % 600 + 1).astype(np.int64)
    pair_users = np.repeat(np.arange(len(sizes)), sizes)
    num_keys = int(rng.integers(1, 3000))
    pair_key = rng.integers(0, num_keys, len(pair_users))
    weights = np.maximum(np.bincount(pair_users), 1)
    want = _running_sum_l0_key_units(pair_users, weights, candidates, pair_key, num_keys)
    got = l0_key_units(pair_users, weights, candidates, pair_key, num_keys)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        assert g.dtype == np.int64 and np.array_equal(g, w)


def test_l0_key_units_by_levels_with_more_than_255_candidates():
    from thresher.transforms.bounding.choose_contribution_bound import l0_key_units
    rng = np.random.default_rng(7)
    candidates = list(range(1, 400))
    sizes = rng.integers(1, 700, 200)
    pair_users = np.repeat(np.arange(len(sizes)), sizes)
    pair_key = rng.integers(0, 900, len(pair_users))
    weights = np.bincount(pair_users)
    want = _running_sum_l0_key_units(pair_users, weights, candidates, pair_key, 900)
    got = l0_key_units(pair_users, weights, candidates, pair_key, 900)
    assert all(np.array_equal(g, w) for g, w in zip(got, want))


@pytest.mark.parametrize("num_key_shards", [2, 16, 256, 257, 300])
def test_key_shard_partials_hold_the_one_shard_partial_split_by_hash(num_key_shards):
    """pair_statistics' key shards (a stable radix sort of the shard numbers, one or two
    bytes, issue 43) split the one-shard partial: each key in shard hash mod the number
    of shards, keys in increasing hash within a shard, the same columns."""
    from thresher.transforms.bounding.choose_contribution_bound import pair_statistics
    rng = np.random.default_rng(num_key_shards)
    sizes = rng.integers(1, 40, 500)
    pair_users = np.repeat(np.arange(len(sizes)), sizes)
    pair_keys = (rng.integers(0, 3000, len(pair_users)).astype(np.uint64)
                 * np.uint64(0x9E3779B97F4A7C15))
    # one row per (user, key): drop repeats
    pairs = np.unique(np.stack([pair_users.astype(np.uint64), pair_keys]), axis=1)
    pair_users, pair_keys = pairs[0].astype(np.int64), pairs[1]
    score = cb.make_score("gaussian", (1, 2, 4, 8), 8, {"thresholds": [11.0, 12, 14, 18]})
    d1, one = pair_statistics(pair_users, pair_keys, None, score, 1)
    dn, many = pair_statistics(pair_users, pair_keys, None, score, num_key_shards)
    assert np.array_equal(d1, dn)
    whole = one[0][1]
    key = whole.column("__key").to_numpy()
    for shard, part in many:
        want = whole.filter(pa.array(key % np.uint64(num_key_shards) == shard))
        assert part.equals(want), shard
    assert sum(p.num_rows for _, p in many) == whole.num_rows

"""Pre-reduction of ``aggregates`` before the user shuffle (transforms/bounding/prereduce.py,
"Aggregates"; issue 43, item 2): a kept (user, key)'s rows travel as the exact expansion of
their per-table total (transforms/plumbing/exact_sums.py), and the totals after the shuffle
are the same exact sums. Checked here:

- the kernel: pre-reducing any split of the records into batches, then bounding with
  values, gives the same per-key counts and grid sums as bounding the whole records
  (decimal amounts: the float sums of the parts would round differently), with a fixed
  bound (the first C keys cut too) and with no key cut (``clip: auto``);
- through ``pipelines.running.release.run`` under one fixed secret: the published bytes
  are the same with and without the step, forced either way (``MODE``), for a sum with a
  fixed clip, a mean with ``clip: auto`` and a variance;
- a heavy user on one key (3,000 rows) runs at a whole-user limit of 300 rows, where
  without the step the same limit refuses the run naming ``aggregates``.

No statistical assertions: every comparison is exact under a fixed secret.
"""
import numpy as np
import pyarrow as pa
import pytest

from thresher.accounting.aggregates import fixed_point_grid
from thresher.pipelines.dataio import io as pio
from thresher.transforms.bounding import prereduce
from thresher.transforms.bounding.user_shards import exact_users
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.user_identity import TEST_KEY
from thresher.transforms.values.aggregate_values import bound_with_values, user_key_totals
from tests.transforms.release_runs import (
    bounded_not_refused, released, with_and_without, without_step)
from tests.transforms.release_runs import heavy_users_with_amounts as _records

SECRET = b"test-only secret: aggregates 43."
BOUND = 4


def _prepared():
    prepared, _ = pio.prepare_batch(_records(), "user_id", ["word"],
                                    value_columns=[("amount", "__v0")], identity_key=TEST_KEY)
    return prepared


def _source():
    return keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "S/PerUserBound")


def _bounded(table, bound):
    """Per-key (count, grid sum) of bounding the whole users of ``table`` with values."""
    grid = fixed_point_grid(-5.0, 10.0)
    out, _ = bound_with_values(exact_users(table), ["word"], [("__v0", grid)], bound, _source())
    return dict(zip(out.column("word").to_pylist(),
                    zip(out.column("count").to_pylist(), out.column("__s0").to_pylist())))


def _reduced(prepared, batch_rows, bound, mode):
    pieces = []
    for start in range(0, prepared.num_rows, batch_rows):
        batch = prepared.slice(start, batch_rows)
        out, _ = prereduce.prereduce_aggregates_table(batch, ["word"], ["__v0"], bound,
                                                       _source(), mode)
        pieces.append(batch if out is None else out)
    return pa.concat_tables(pieces)


@pytest.mark.parametrize("batch_rows", [97, 700, 5000])
@pytest.mark.parametrize("bound", [BOUND, None])
def test_bounding_with_values_after_the_step_is_unchanged(monkeypatch, batch_rows, bound):
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 16)
    prepared = _prepared()
    for mode in ("always", "auto"):
        reduced = _reduced(prepared, batch_rows, bound, mode)
        # h's 2,000 rows on w1 and g's 1,500 leave each batch as a few rows of partial
        # totals ("auto": only where a user bucket is heavy in the batch)
        assert reduced.num_rows < prepared.num_rows - (2500 if mode == "always" else 500)
        assert _bounded(reduced, BOUND) == _bounded(prepared, BOUND)
        if bound is None:    # clip: auto reads every (user, key)'s total: all the same
            whole = user_key_totals(exact_users(prepared), ["word"], ["__v0"])
            after = user_key_totals(exact_users(reduced), ["word"], ["__v0"])
            key = ["__user", "__user_lo", "word"]
            assert (sorted(zip(*[whole.column(c).to_pylist() for c in key + ["__v0"]]))
                    == sorted(zip(*[after.column(c).to_pylist() for c in key + ["__v0"]])))


def test_the_float_sums_of_the_parts_would_differ():
    """The reason for exact totals: summed per part in float64 and then added, some
    (user, key) totals of these records differ from the one-order sum."""
    prepared = _prepared()
    users = prepared.column("__user").to_numpy()
    words = np.array(prepared.column("word").to_pylist())
    values = np.nan_to_num(prepared.column("__v0").to_numpy(zero_copy_only=False))
    mine = (words == "w1") & (users == users[np.argmax(np.bincount(
        np.unique(users, return_inverse=True)[1]))])
    x = values[mine]
    def ascending(v):      # the float64 sum of the values in ascending order, one by one
        return float(np.cumsum(np.sort(v))[-1])

    parts = [ascending(p) for p in np.array_split(x, 7)]
    assert float(np.cumsum(parts)[-1]) != ascending(x)


AGGREGATES = {
    "sum": [{"column": "amount", "statistic": "sum", "clip": [-5.0, 10.0]}],
    "mean_auto": [{"column": "amount", "statistic": "mean", "clip": "auto"}],
    "variance": [{"column": "amount", "statistic": "variance", "clip": [-5.0, 10.0]}],
}


def _run(folder, table, aggregates):
    return released(folder, table, SECRET, "prereduce-aggregates", {"max_keys_per_user": BOUND},
                    {"kind": "gaussian", "pre_threshold": 1}, aggregates=aggregates)


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
@pytest.mark.parametrize("case", sorted(AGGREGATES))
def test_release_bytes_are_the_same_with_and_without_the_step(tmp_path, monkeypatch, mode,
                                                              case):
    monkeypatch.setattr(prereduce, "MODE", mode)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)   # small tables here
    table = _records()
    reduced, with_step, whole, seen = with_and_without(
        monkeypatch, lambda: _run(str(tmp_path), table, AGGREGATES[case]),
        lambda: without_step(monkeypatch))
    assert len(reduced) > 500 and reduced == whole
    assert max(seen) >= 2000                                  # h's rows, without the step
    if mode == "never":
        return
    if case == "mean_auto":   # no key cut: h's 201 keys, each a total of 1 to 3 terms
        assert max(with_step) <= 3 * 201
    else:                     # its C smallest hash ranks per table only
        assert max(with_step) <= 3 * BOUND


@pytest.mark.parametrize("case,limit", [("sum", 300), ("mean_auto", 700)])
def test_a_heavy_user_on_one_key_is_bounded_not_refused(tmp_path, monkeypatch, case, limit):
    """At a whole-user limit of 300 rows (``clip: auto``, which reads all of h's 201
    keys: 700), h (3,000 rows, 2,000 on one key) and g (1,500 rows on its two kept keys:
    the first-C cut alone leaves them all) run and publish the bytes of the unlimited run
    without the step; without the step the limit refuses the run, naming
    ``aggregates``."""
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)
    table = _records()
    bounded_not_refused(monkeypatch, lambda: _run(str(tmp_path), table, AGGREGATES[case]),
                        lambda: without_step(monkeypatch), limit,
                        f"aggregates: a user has more than {limit} rows")


def _hostile_prepared(seed):
    """3,000 rows of five users (h holds half) on 12 words, three value columns: a of
    float64 extremes (the largest float64, +-1e308, 2^970, subnormals, 0.1, -0.0, NaN),
    b the same but null on every row of w3 (pairs with no value: total 0), c decimals."""
    rng = np.random.default_rng(seed)
    n = 3000
    pool = np.array([0.1, 1 / 3, -0.7, 1e308, -1e308, np.finfo(np.float64).max,
                     5e-324, -5e-324, 1e-300, 1e16, -1e16, 1.0, 2.0 ** -53, np.nan, -0.0,
                     0.0, 2.0 ** 970])
    words = rng.choice([f"w{i}" for i in range(12)], size=n)
    b = rng.choice(pool, size=n)
    b[words == "w3"] = np.nan
    table = pa.table({"user_id": rng.choice(["h", "g", "a", "b", "c"], size=n,
                                            p=[.5, .2, .1, .1, .1]),
                      "word": words,
                      "a": pa.array(rng.choice(pool, size=n), from_pandas=True),
                      "b": pa.array(b, from_pandas=True),
                      "c": np.round(rng.normal(size=n), 2)})
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY,
                                    value_columns=[("a", "__v0"), ("b", "__v1"), ("c", "__v2")])
    return prepared


@pytest.mark.parametrize("bound", [3, None])
@pytest.mark.parametrize("seed", range(4))
def test_kept_totals_are_bitwise_the_same_for_hostile_values(monkeypatch, seed, bound):
    """Several value columns at once, pairs with no value, partial totals beyond the
    float64 range (their rows travel as they are) and totals that overflow to +-inf:
    after pre-reducing a random split of the shuffled rows, every kept (user, key)'s
    totals are bitwise those of the whole records (with a fixed bound: the same kept
    pairs first)."""
    from thresher.transforms.bounding.per_user_bound import bound_table_l0
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 4)
    names = ["__v0", "__v1", "__v2"]
    prepared = _hostile_prepared(seed)
    rng = np.random.default_rng(seed + 100)

    def kept(table):
        totals = user_key_totals(exact_users(table), ["word"], names)
        if bound is not None:
            totals = totals.take(pa.array(bound_table_l0(totals, ["word"], bound, _source())))
        columns = [totals.column(c).to_pylist() for c in ["__user", "__user_lo", "word"]]
        values = [totals.column(c).to_numpy(zero_copy_only=False) for c in names]
        return {k: np.array([v[i] for v in values]) for i, k in enumerate(zip(*columns))}

    whole = kept(prepared)
    assert any(np.isinf(v).any() for v in whole.values())
    for mode in ("always", "auto"):
        shuffled = prepared.take(pa.array(rng.permutation(prepared.num_rows)))
        cuts = [0, *np.sort(rng.choice(prepared.num_rows, size=5, replace=False)),
                prepared.num_rows]
        pieces = []
        for start, end in zip(cuts[:-1], cuts[1:]):
            batch = shuffled.slice(start, end - start)
            out, _ = prereduce.prereduce_aggregates_table(batch, ["word"], names, bound,
                                                           _source(), mode)
            pieces.append(batch if out is None else out)
        reduced = pa.concat_tables(pieces)
        assert reduced.num_rows < prepared.num_rows
        after = kept(reduced)
        assert after.keys() == whole.keys()
        for pair, totals in whole.items():
            assert np.array_equal(after[pair].view(np.int64), totals.view(np.int64)), pair


_SCALES = np.array([1.0, 1e-310, 2.0 ** 1000, 2.0 ** -1000, 1e300, 1e-300])


def _random_pairs(seed):
    """Records of 6 users on 5 words (n rows), three value columns drawn per (user, word):
    decimals at one of six scales (1, subnormal, 2^1000, 2^-1000, 1e300, 1e-300),
    the largest float64 (partials past the range), pairs cancelling to a tiny residual, or
    zeros; 10% null."""
    rng = np.random.default_rng(seed)
    n = 600
    users = rng.integers(0, 6, size=n)
    words = rng.integers(0, 5, size=n)
    pair = users * 5 + words
    columns = {}
    for name in ("a", "b", "c"):
        kind = rng.integers(0, 4, size=30)[pair]
        scale = rng.choice(_SCALES, size=30)[pair]
        v = np.round(rng.normal(size=n), 3) * scale
        v = np.where(kind == 1, rng.choice([_MAX_FLOAT, -_MAX_FLOAT, 1.0], size=n), v)
        v = np.where(kind == 2, rng.choice([-1.0, 1.0], size=n) * scale
                     + rng.choice([0.0, 5e-324], size=n), v)
        v = np.where(kind == 3, 0.0, v)
        v[rng.random(n) < 0.1] = np.nan
        columns[name] = pa.array(v, from_pandas=True)
    table = pa.table({"user_id": [f"u{u}" for u in users], "word": [f"w{w}" for w in words],
                      **columns})
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY,
                                    value_columns=[("a", "__v0"), ("b", "__v1"),
                                                   ("c", "__v2")])
    return prepared


_MAX_FLOAT = float(np.finfo(np.float64).max)


@pytest.mark.parametrize("block_cells", [1 << 23, 1])
def test_summed_pairs_keep_every_pairs_totals_on_random_tables(monkeypatch, block_cells):
    """summed_pairs (the ragged terms of every value column placed in the pair's copies,
    0 beyond a column's terms) on random tables of three value columns of unlike scales,
    split at random into partial tables: every (user, key)'s totals after it are bitwise
    those of the records, and a fifth of the rows at least gone. Deterministic (fixed seeds)."""
    from thresher.transforms.plumbing import exact_sums as es
    monkeypatch.setattr(es, "BLOCK_CELLS", block_cells)    # 1: one pair a block
    names = ["__v0", "__v1", "__v2"]
    key = ["__user", "__user_lo", "word"]

    def totals(table):
        out = user_key_totals(exact_users(table), ["word"], names)
        return {k: np.array(v, dtype=np.float64).view(np.int64).tolist()
                for k, v in zip(zip(*[out.column(c).to_pylist() for c in key]),
                                zip(*[out.column(c).to_numpy(zero_copy_only=False)
                                      for c in names]))}

    for seed in range(6):
        prepared = _random_pairs(seed)
        rng = np.random.default_rng(seed + 50)
        shuffled = prepared.take(pa.array(rng.permutation(prepared.num_rows)))
        cuts = [0, *np.sort(rng.choice(prepared.num_rows, size=2, replace=False)),
                prepared.num_rows]
        pieces = [prereduce.summed_pairs(shuffled.slice(a, b - a), ["word"], names)
                  for a, b in zip(cuts[:-1], cuts[1:])]
        reduced = pa.concat_tables(pieces)
        assert totals(reduced) == totals(prepared), seed
        assert reduced.num_rows < prepared.num_rows * 0.8, seed

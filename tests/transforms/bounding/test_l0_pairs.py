"""l0_distinct_pairs (transforms/bounding/l0_pairs.py) against the sort it replaces in the
automatic bound's pass, ``per_user_bound.l0_ranks`` at its distinct rows: the same pairs
(user number, key hash), the same rank of every pair in its user's order, the same user
numbers, on random shards (light and heavy users, duplicate rows, one-row users), with
the tie path forced (truncated ranks re-ordered exactly) and with the l0_ranks fallback.
Deterministic (fixed seeds and secret): no false failures."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.transforms.bounding import l0_pairs
from thresher.transforms.bounding.l0_pairs import l0_distinct_pairs
from thresher.transforms.bounding.per_user_bound import l0_ranks
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN, USER_LOW_COLUMN
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.hashing import mix64


def _table(seed, rows, users, keys, heavy=0):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, rows)
    if heavy:   # one user holding `heavy` rows over many keys
        user = np.concatenate([user, np.full(heavy, users)])
        key = np.concatenate([rng.zipf(1.3, rows) % keys, rng.integers(0, 20 * heavy, heavy)])
    else:
        key = rng.zipf(1.3, rows) % keys
    order = rng.permutation(len(user))
    user = mix64(user[order].astype(np.uint64) + np.uint64(1))
    key = mix64(key[order].astype(np.uint64) + np.uint64(7))
    return pa.table({USER_COLUMN: pa.array(user, pa.uint64()),
                     USER_LOW_COLUMN: pa.array(mix64(user), pa.uint64()),
                     "word": pa.array(key.astype(np.int64)),
                     KEY_HASH_COLUMN: pa.array(key, pa.uint64())})


def _rng(table):
    source = keyed_random.StageSource(keyed_random.KeyedSource(b"s" * 32), "PerUserBound")
    return keyed_random.bind_users(source, table, ["word"])


def _reference(table):
    users = table.column(USER_COLUMN).to_numpy()
    keys = table.column(KEY_HASH_COLUMN).to_numpy()
    ranks = l0_ranks(users, keys, _rng(table))
    d = ranks.distinct
    return keys[ranks.order[d]], ranks.rank_in_user[d], ranks.user_numbers()[d]


def _new(table, **kwargs):
    keys = table.column(KEY_HASH_COLUMN).to_numpy()
    rows, rank, users = l0_distinct_pairs(table.column(USER_COLUMN).to_numpy(), keys,
                                          _rng(table), **kwargs)
    return keys[rows], rank, users


def _assert_same(got, want):
    for g, w in zip(got, want):
        assert np.array_equal(g, w)


CASES = [(0, 5000, 400, 300, 0), (1, 20000, 3000, 5000, 0), (2, 3000, 50, 100, 4000),
         (3, 1, 1, 1, 0), (4, 200, 200, 1, 0), (5, 300, 1, 300, 0)]


@pytest.mark.parametrize("seed,rows,users,keys,heavy", CASES)
def test_pairs_ranks_and_user_numbers_are_those_of_l0_ranks(seed, rows, users, keys, heavy):
    table = _table(seed, rows, users, keys, heavy)
    _assert_same(_new(table), _reference(table))


@pytest.mark.parametrize("rank_bits", [1, 3, 8])
@pytest.mark.parametrize("seed,rows,users,keys,heavy", CASES[:3])
def test_tied_truncated_ranks_are_reordered_exactly(seed, rows, users, keys, heavy, rank_bits):
    """Few rank bits: most keys of a user tie on their truncated ranks and the users
    concerned are re-ordered by the exact lexsort (the path a rare real tie takes)."""
    table = _table(seed, rows, users, keys, heavy)
    _assert_same(_new(table, rank_bits=rank_bits), _reference(table))


def test_too_few_rank_bits_falls_back_to_l0_ranks(monkeypatch):
    table = _table(2, 3000, 50, 100, 4000)
    monkeypatch.setattr(l0_pairs, "MIN_RANK_BITS", 63)
    called = []
    monkeypatch.setattr(l0_pairs, "l0_ranks", lambda *a: called.append(1) or l0_ranks(*a))
    _assert_same(_new(table), _reference(table))
    assert called


def test_one_row_per_pair_and_the_first_row_in_table_order():
    table = _table(1, 20000, 3000, 5000)
    keys = table.column(KEY_HASH_COLUMN).to_numpy()
    users = table.column(USER_COLUMN).to_numpy()
    rows, _, _ = l0_distinct_pairs(users, keys, _rng(table))
    pairs = set(zip(users.tolist(), keys.tolist()))
    assert len(rows) == len(pairs) == len(set(zip(users[rows].tolist(), keys[rows].tolist())))
    first = {}
    for i, pair in enumerate(zip(users.tolist(), keys.tolist())):
        first.setdefault(pair, i)
    assert sorted(rows.tolist()) == sorted(first.values())


@pytest.mark.parametrize("rank_bits", [None, 3])
@pytest.mark.parametrize("seed,rows,users,keys,heavy", CASES)
def test_the_callers_user_order_gives_the_same_pairs_without_a_sort(
        seed, rows, users, keys, heavy, rank_bits, monkeypatch):
    """With the caller's UserOrder (user_shards.concat_shard_with_order hands it over in
    the automatic bound's pass, issue 43) the pairs, ranks and user numbers are the same,
    and the shard is not sorted by user again."""
    from thresher.transforms.bounding.user_shards import UserOrder, order_by_user
    table = _table(seed, rows, users, keys, heavy)
    want = _new(table, rank_bits=rank_bits)
    user_words = table.column(USER_COLUMN).to_numpy()
    order = order_by_user(user_words)
    given = UserOrder(order, user_words[order])
    sorts = []
    monkeypatch.setattr(l0_pairs, "_order_by_user",
                        lambda *a: sorts.append(1) or order_by_user(*a))
    _assert_same(_new(table, rank_bits=rank_bits, by_user=given), want)
    assert not sorts
    _assert_same(_new(table, rank_bits=rank_bits), want)
    assert sorts


def test_the_callers_user_order_reaches_the_l0_ranks_fallback(monkeypatch):
    from thresher.transforms.bounding.user_shards import UserOrder, order_by_user
    table = _table(2, 3000, 50, 100, 4000)
    user_words = table.column(USER_COLUMN).to_numpy()
    order = order_by_user(user_words)
    given = UserOrder(order, user_words[order])
    monkeypatch.setattr(l0_pairs, "MIN_RANK_BITS", 63)
    seen = []
    monkeypatch.setattr(l0_pairs, "l0_ranks",
                        lambda *a, **k: seen.append(k.get("by_user")) or l0_ranks(*a, **k))
    _assert_same(_new(table, by_user=given), _reference(table))
    assert seen == [given]

"""Contribution bounding from the release's keyed streams (transforms/randomness/keyed_random.py):
the kept set of a user depends on its records, the secret and the stage only -- not on
row order or on which other users share the element -- and keeps the uniform law.

False-failure probability: each frequency check allows 5 standard deviations (two-sided
normal tail about 5.7e-7); the secret is fixed (test-only), so outcomes are deterministic.
"""
import numpy as np
import pyarrow as pa
import pyarrow.compute  # noqa: F401 - pa.compute

from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.hashing import hash_array, mix64
from thresher.transforms.bounding.per_user_bound import bound_table_l0
from thresher.transforms.bounding.rand_clip import rand_clip_table
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN, USER_LOW_COLUMN

SECRET = b"test-only secret for bounding tests"
USERS = 30_000


def _table(words_per_user, users=USERS, first_user=0):
    """Each user u holds the records ``words_per_user`` (a list of words)."""
    k = len(words_per_user)
    user_ids = np.repeat(np.arange(first_user, first_user + users, dtype=np.uint64), k)
    words = pa.array(list(words_per_user) * users)
    return pa.table({USER_COLUMN: pa.array(user_ids, pa.uint64()),
                     USER_LOW_COLUMN: pa.array(mix64(user_ids), pa.uint64()),   # identity word 1
                     "word": words,
                     KEY_HASH_COLUMN: pa.array(hash_array(words), pa.uint64())})


def _source(stage="Bound"):
    return keyed_random.StageSource(keyed_random.KeyedSource(SECRET), stage)


def _kept_words(table):
    return sorted(zip(table.column(USER_COLUMN).to_pylist(), table.column("word").to_pylist()))


def _within(frequency, p, n):
    return abs(frequency - p) <= 5 * np.sqrt(p * (1 - p) / n)


def test_rand_clip_keeps_each_copy_with_its_share_and_ignores_row_order():
    """Records {a, a, b}, C = 1: a uniform record is 'a' with probability 2/3 (copies
    count); the same users in shuffled order, split across two elements, keep the same."""
    table = _table(["a", "a", "b"])
    kept = rand_clip_table(table, 1, _source())
    assert kept.num_rows == USERS
    share = np.mean(np.array(kept.column("word").to_pylist()) == "a")
    assert _within(share, 2 / 3, USERS), share
    order = np.random.default_rng(3).permutation(table.num_rows)
    shuffled = table.take(pa.array(order))
    odd = pa.array(shuffled.column(USER_COLUMN).to_numpy() % 2 == 1)
    parts = [shuffled.filter(odd), shuffled.filter(pa.compute.invert(odd))]
    again = [rand_clip_table(part, 1, _source()) for part in parts]
    first = dict(_kept_words(kept))
    second = {u: w for part in again for u, w in _kept_words(part)}
    assert len(first) == USERS and first == second
    # another stage draws independently (all 15,000+ users agreeing: probability ~0)
    other = dict(_kept_words(rand_clip_table(table, 1, _source("Other"))))
    assert any(other[u] != w for u, w in first.items())


def test_per_user_bound_is_uniform_over_distinct_keys_and_ignores_bundling():
    """Distinct keys {a, b, c} (a twice), C = 1: each kept with probability 1/3; the
    kept key of a user is the same when its records come with other users or alone."""
    table = _table(["a", "b", "a", "c"])
    rows = bound_table_l0(table, ["word"], 1, _source())
    kept = table.take(pa.array(rows))
    assert kept.num_rows == USERS
    words = np.array(kept.column("word").to_pylist())
    for w in "abc":
        assert _within(np.mean(words == w), 1 / 3, USERS), w
    by_user = dict(_kept_words(kept))
    for user in (0, 17, 12345):
        alone = _table(["c", "a", "b", "a"], users=1, first_user=user)
        got = alone.take(pa.array(bound_table_l0(alone, ["word"], 1, _source())))
        assert got.column("word").to_pylist() == [by_user[user]]


def test_rand_clip_ignores_row_order_when_different_records_collide(monkeypatch):
    """A crafted collision: every record of a user hashes alike (the record hash patched
    to a constant), so only the values can tell 'a' from 'b'. The kept record of each
    user (C = 1) must be the same in every row order; before the fix the copy numbering
    followed row order, so the first row was always kept and a reversed table kept the
    other record for every user."""
    from thresher.transforms.bounding import rand_clip

    def colliding(table, columns, salt=0):
        return np.full(table.num_rows, 12345, dtype=np.uint64)

    monkeypatch.setattr(rand_clip, "hash_columns", colliding)
    table = _table(["a", "b"], users=2_000)
    kept = dict(_kept_words(rand_clip_table(table, 1, _source())))
    reverse = table.take(pa.array(np.arange(table.num_rows)[::-1]))
    shuffled = table.take(pa.array(np.random.default_rng(5).permutation(table.num_rows)))
    for other in (reverse, shuffled):
        assert dict(_kept_words(rand_clip_table(other, 1, _source()))) == kept
    # both records are kept by some users (a user keeps 'a' with probability 1/2: all
    # 2,000 alike has probability 2 * 2^-2000)
    assert set(kept.values()) == {"a", "b"}

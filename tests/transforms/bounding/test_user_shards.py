"""split_by_shard puts every row in its shard exactly once, and its pieces own compact
buffers: a pickled piece (what Beam's shuffle moves) is about the piece's size, not its
batch's (pickling a pyarrow slice writes the parent's whole buffers)."""
import pickle

import numpy as np
import pyarrow as pa

from thresher.transforms.randomness.hashing import hash_array
from thresher.transforms.bounding.user_shards import concat, split_by_shard, user_shard_of


def _batch(n, seed=0):
    rng = np.random.default_rng(seed)
    words = pa.array([f"word{i}" for i in rng.integers(0, 5000, n)])
    users = pa.array([f"u{i}" for i in rng.integers(0, 20000, n)])
    return pa.table({"__user": pa.array(hash_array(users), type=pa.uint64()),
                     "__key": pa.array(hash_array(words), type=pa.uint64()),
                     "word": words})


def test_every_row_lands_in_its_shard_once():
    table = _batch(30_000)
    shards = user_shard_of(table.column("__user").to_numpy(), 7)
    pieces = list(split_by_shard(table, shards, 7))
    assert sorted(s for s, _ in pieces) == sorted(set(shards.tolist()))
    for shard, piece in pieces:
        assert (user_shard_of(piece.column("__user").to_numpy(), 7) == shard).all()
    together = concat([p for _, p in pieces])
    key = lambda t: sorted(zip(t.column("__user").to_pylist(), t.column("word").to_pylist()))  # noqa: E731
    assert key(together) == key(table)


def test_pieces_pickle_to_their_own_size():
    table = _batch(50_000, seed=1)
    full = len(pickle.dumps(table))
    shards = user_shard_of(table.column("__user").to_numpy(), 10)
    pieces = list(split_by_shard(table, shards, 10))
    total = sum(len(pickle.dumps(p)) for _, p in pieces)
    # 10 pieces of ~1/10 of the batch each: together about one batch (headers aside),
    # where slices of one taken table would pickle to ~10 batches.
    assert total < 1.2 * full, (total, full)
    for _, piece in pieces:
        assert len(pickle.dumps(piece)) < 2 * piece.nbytes + 4096


def test_many_shards_and_empty_shards():
    table = _batch(100, seed=2)
    shards = np.full(100, 4999, dtype=np.int64)
    pieces = list(split_by_shard(table, shards, 5000))
    assert [s for s, _ in pieces] == [4999] and pieces[0][1].num_rows == 100


def test_exact_users_hands_its_user_order_to_l0_ranks():
    """exact_users_with_order's sort by user (its collision check) is order_by_user of
    the table's __user, and l0_ranks gives the same ranks with it as without it (issue 43:
    the pre-reduction does not sort a table by user twice)."""
    from thresher.pipelines.dataio.io import prepare_batch
    from thresher.transforms.bounding import per_user_bound, user_shards
    from thresher.transforms.randomness import keyed_random
    from thresher.transforms.randomness.user_identity import TEST_KEY
    rng = np.random.default_rng(3)
    raw = pa.table({"user": [f"u{i}" for i in rng.integers(0, 300, 4000)],
                    "word": [f"w{i}" for i in rng.integers(0, 900, 4000)]})
    prepared, _ = prepare_batch(raw, "user", ["word"], identity_key=TEST_KEY)
    table, kept = user_shards.exact_users_with_order(prepared)
    users = table.column("__user").to_numpy()
    assert kept is not None
    np.testing.assert_array_equal(kept.order, user_shards.order_by_user(users))
    np.testing.assert_array_equal(kept.sorted_users, users[kept.order])
    source = keyed_random.StageSource(keyed_random.KeyedSource(bytes(range(32))), "S/Bound")
    ranks = per_user_bound.l0_ranks(users, table.column("__key").to_numpy(),
                                    keyed_random.bind_users(source, table, ["word"]), by_user=kept)
    again = per_user_bound.l0_ranks(users, table.column("__key").to_numpy(),
                                    keyed_random.bind_users(source, table, ["word"]))
    for a, b in zip(ranks, again):
        np.testing.assert_array_equal(a, b)


def test_concat_shard_with_order_is_the_concatenation_and_its_sort_by_user():
    """concat_shard_with_order (issue 43: the automatic bound's pass concatenates each
    shard itself) gives the table _concat_shard yields, ``__key`` recomputed where the
    pieces dropped it, and the UserOrder of that table's ``__user``; an empty group gives
    (None, None)."""
    from thresher.pipelines.dataio.io import prepare_batch
    from thresher.transforms.bounding import user_shards
    from thresher.transforms.randomness.user_identity import TEST_KEY
    rng = np.random.default_rng(4)
    raw = pa.table({"user": [f"u{i}" for i in rng.integers(0, 500, 6000)],
                    "word": [f"w{i}" for i in rng.integers(0, 700, 6000)]})
    prepared, _ = prepare_batch(raw, "user", ["word"], identity_key=TEST_KEY)
    pieces = [prepared.slice(0, 2500), prepared.slice(2500, 3500)]
    for drop in (False, True):
        given = [p.drop_columns(["__key"]) for p in pieces] if drop else pieces
        want = list(user_shards._concat_shard((3, given), key_columns=("word",)))
        table, order = user_shards.concat_shard_with_order((3, given), key_columns=("word",))
        assert len(want) == 1 and table.equals(want[0])
        users = table.column("__user").to_numpy()
        np.testing.assert_array_equal(order.order, user_shards.order_by_user(users))
        np.testing.assert_array_equal(order.sorted_users, users[order.order])
    assert user_shards.concat_shard_with_order((3, []), key_columns=("word",)) == (None, None)


def test_rows_without_a_shard_go_nowhere_at_the_uint16_edge():
    """A row whose id is num_shards (a row a pre-reduction did not keep) reaches no
    shard, in memory and held for spilling, also with 65,536 shards, where the radix
    sort's 16-bit ids would wrap that id to shard 0."""
    from thresher.transforms.plumbing.tables import ShardSlices
    table = _batch(2000, seed=4)
    for num_shards in (7, 1 << 16):
        shards = np.arange(2000, dtype=np.int64) % 3
        shards[::5] = num_shards                      # 400 rows go to no shard
        pieces = list(split_by_shard(table, shards, num_shards))
        slices = list(split_by_shard(table, shards, num_shards, slices=True))
        held = ShardSlices(num_shards)
        held.add(table, shards)
        assert held.rows == 1600
        for got in (pieces, slices, held.take()):
            assert [s for s, _ in got] == [0, 1, 2]
            assert sum(p.num_rows for _, p in got) == 1600


def test_a_column_named_kept_is_a_mark_only_where_the_split_is_told():
    """The user split reads ``__kept`` as the pre-reduction's mark only with
    ``ShardByUser(marked=True)`` (the release's automatic bound): a caller's own column
    of that name is data, its rows all travel and the column with them."""
    import apache_beam as beam
    from apache_beam.testing import test_pipeline
    from apache_beam.testing.util import assert_that, equal_to
    from thresher.transforms.bounding.user_shards import KEPT_COLUMN, ShardByUser
    table = _batch(300, seed=5)
    table = table.append_column("__user_lo", pa.array(np.arange(300, dtype=np.uint64)))
    table = table.append_column(KEPT_COLUMN, pa.array(np.arange(300) % 2 == 0))
    with test_pipeline.TestPipeline() as p:
        batches = p | beam.Create([table])
        for name, marked, rows, has_column in (("Data", False, 300, True),
                                                ("Mark", True, 150, False)):
            got = (batches | f"Shard{name}" >> ShardByUser(3, marked=marked)
                   | f"Rows{name}" >> beam.Map(lambda t: (t.num_rows,
                                                          KEPT_COLUMN in t.column_names))
                   | f"Sum{name}" >> beam.CombineGlobally(
                       lambda xs: (sum(x[0] for x in xs), all(x[1] for x in xs))))
            assert_that(got, equal_to([(rows, has_column)]), label=f"Check{name}")

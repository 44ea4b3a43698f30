"""The user and key shuffles' spilled pieces grow linearly with the rows (issue 43, item 3).

With a spill folder, ``_SplitByUser`` splits each table as it comes (``split_by_shard(...,
slices=True)``), holds the pieces (``tables.ShardSlices``) until about ``spill.PIECE_ROWS``
rows per shard are held, and writes each shard's held slices to one Arrow IPC file.
Without this, every pre-reduced table's pieces were written at once: tables x shards files
(rows^2: 19,100 files at 1e8 rows). The shards must hold exactly the rows they held
before: only the cut into pieces changes."""
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from thresher.pipelines.dataio.io import prepare_batch
from thresher.transforms.bounding import user_shards
from thresher.transforms.bounding.user_shards import ShardByUser, split_by_shard, user_shard_of
from thresher.transforms.plumbing import spill
from thresher.transforms.randomness.user_identity import TEST_KEY


def _rows(table):
    return sorted(zip(*[table.column(c).to_pylist() for c in table.column_names]))


def _recorded_pieces(monkeypatch):
    """A list that grows by the rows of every piece spill.write_piece writes."""
    pieces = []
    original = spill.write_piece
    monkeypatch.setattr(spill, "write_piece",
                        lambda table, where: pieces.append(table.num_rows) or original(table, where))
    return pieces


def _batches(n=8000, size=1000, seed=9):
    rng = np.random.default_rng(seed)
    raw = pa.table({"user": [f"user-{i}" for i in rng.integers(0, 900, n)],
                    "word": [f"w{j}" for j in rng.integers(0, 120, n)]})
    return [prepare_batch(raw.slice(i, size), "user", ["word"], identity_key=TEST_KEY)[0]
            for i in range(0, n, size)]


def test_sliced_pieces_are_the_taken_pieces_and_write_only_their_rows(tmp_path):
    """A sliced piece holds the rows (in order) of the piece one take per shard gives,
    and its IPC file is about its own size, not its parent's (the writer truncates a
    slice's buffers; a pickled slice would carry the parent's)."""
    table = pa.concat_tables(_batches())
    shards = user_shard_of(table.column("__user").to_numpy(), 13)
    taken = list(split_by_shard(table, shards, 13))
    sliced = list(split_by_shard(table, shards, 13, slices=True))
    assert [s for s, _ in sliced] == [s for s, _ in taken]
    for (_, a), (_, b) in zip(taken, sliced):
        assert b.equals(a)
        written = spill.read_piece(spill.write_piece(b, str(tmp_path)))
        assert written.equals(a)
    sizes = sorted(os.path.getsize(tmp_path / f) for f in os.listdir(tmp_path))
    whole = spill.write_piece(table, str(tmp_path / "whole"))
    # 13 pieces of ~1/13 each: together about the table (plus 13 files' headers), where
    # pieces carrying their parent's buffers would sum to ~13 tables
    assert sum(sizes) < 1.3 * os.path.getsize(whole) + 13 * 4096, (sum(sizes), whole)


def test_spilled_split_waits_for_rows_per_shard(tmp_path, monkeypatch):
    """Eight combined tables of 1,000 rows into 32 shards (as after the pre-reduction,
    coalesce_rows=1) are written once: at most one file per shard, where writing each
    table's pieces on arrival wrote up to 8 x 32. The shards hold the rows the in-memory shuffle
    gives them."""
    batches = _batches()
    folder = str(tmp_path / "users")
    everything = pa.concat_tables(batches)
    shard_of = user_shard_of(everything.column("__user").to_numpy(), 32)
    expected = [tuple(_rows(everything.filter(pa.array(shard_of == s))))
                for s in sorted(set(shard_of.tolist()))]
    assert len(expected) == 32
    monkeypatch.setattr(spill, "PIECE_ROWS", 1 << 14)
    with test_pipeline.TestPipeline() as p:
        batches_in = p | beam.Create(batches, reshuffle=False)
        in_memory = batches_in | "InMemory" >> ShardByUser(32, coalesce_rows=1)
        spilled = batches_in | "Spilled" >> ShardByUser(32, key_columns=["word"],
                                                       spill_dir=folder, coalesce_rows=1)
        assert_that(in_memory | "RowsA" >> beam.Map(lambda t: tuple(_rows(t))),
                    equal_to(expected), label="InMemoryShards")
        assert_that(spilled | "RowsB" >> beam.Map(lambda t: tuple(_rows(t))),
                    equal_to(expected), label="SpilledShards")
    pieces = _recorded_pieces(monkeypatch)
    with test_pipeline.TestPipeline() as p:
        _ = (p | beam.Create(batches, reshuffle=False)
             | ShardByUser(32, key_columns=["word"], spill_dir=str(tmp_path / "again"),
                           coalesce_rows=1))
    assert sum(pieces) == 8000
    assert len(pieces) <= 32, len(pieces)


def test_the_wait_is_capped():
    """Beyond SPLIT_MAX_ROWS / PIECE_ROWS shards a split holds at most SPLIT_MAX_ROWS
    rows (memory), never shards x PIECE_ROWS."""
    split = user_shards._SplitByUser(4096, coalesce_rows=1, spill_dir="/nonexistent")
    assert split._coalesce_rows == spill.SPLIT_MAX_ROWS
    split = user_shards._SplitByUser(10, coalesce_rows=1, spill_dir="/nonexistent")
    assert split._coalesce_rows == 10 * spill.PIECE_ROWS
    assert user_shards._SplitByUser(10, coalesce_rows=1)._coalesce_rows == 1   # in memory


def test_sliced_pieces_over_several_gathers():
    """300,000 rows into 50 shards (skewed: shard 7 holds a third of the rows): several
    gathers of about an eighth of the rows, every shard's piece equal to its own take."""
    rng = np.random.default_rng(4)
    n = 300_000
    shards = np.where(rng.random(n) < 1 / 3, 7, rng.integers(0, 50, n))
    shards[shards == 31] = 32                        # an empty shard among them
    table = pa.table({"x": np.arange(n), "s": pa.array(rng.integers(0, 1000, n)).cast(pa.string())})
    taken = list(split_by_shard(table, shards, 50))
    sliced = list(split_by_shard(table, shards, 50, slices=True))
    assert [s for s, _ in sliced] == [s for s, _ in taken] and 31 not in [s for s, _ in taken]
    assert all(b.equals(a) for (_, a), (_, b) in zip(taken, sliced))
    assert sum(p.num_rows for _, p in sliced) == n


def test_key_shuffle_gathers_a_bundles_partials_before_it_spills(tmp_path, monkeypatch):
    """SumCountsPerKey with a spill folder: twelve partial-count tables into 16 key shards
    in one bundle make at most 16 files (written once), where writing each table's pieces
    made up to 12 x 16; the sums per key are the true ones."""
    from thresher.transforms.plumbing.aggregate import SumCountsPerKey
    from tests.transforms.plumbing.test_spill import partial_counts
    partials, truth = partial_counts(seed=8, tables=12, rows=700, words=500)
    pieces = _recorded_pieces(monkeypatch)
    with test_pipeline.TestPipeline() as p:
        summed = (p | beam.Create(partials, reshuffle=False)
                  | SumCountsPerKey(["word"], 16, spill_dir=str(tmp_path / "keys"))
                  | beam.FlatMap(lambda t: zip(t.column("word").to_pylist(),
                                               t.column("count").to_pylist())))
        assert_that(summed, equal_to(sorted(truth.items())))
    assert sum(pieces) == 12 * 700
    assert len(pieces) <= 16, len(pieces)


def test_held_slices_are_the_split_of_the_concatenation_taken_table_by_table():
    """``tables.ShardSlices`` (what the spilled splits hold between writes) gives each
    shard the rows, in order, that splitting the tables' concatenation gives, while every
    ``take`` reads one table only (a take over the gathered tables reads rows scattered
    over more than the CPU's caches: 4x the time per row at 2e6 rows)."""
    from thresher.transforms.plumbing import tables as tables_mod
    batches = _batches(n=9000, size=3000) + [_batches(n=10, size=10, seed=2)[0].slice(0, 0)]
    everything = pa.concat_tables(batches)
    expected = list(split_by_shard(everything, user_shard_of(
        everything.column("__user").to_numpy(), 13), 13))
    taken_from = []   # the rows of each table split

    class Recording(tables_mod.ShardSlices):
        def add(self, table, shard_ids):
            taken_from.append(table.num_rows)
            return super().add(table, shard_ids)

    held = Recording(13)
    for table in batches:
        held.add(table, user_shard_of(table.column("__user").to_numpy(), 13))
    assert held.rows == 9000
    got = held.take()
    assert [s for s, _ in got] == [s for s, _ in expected]
    assert all(b.equals(a) for (_, a), (_, b) in zip(expected, got))
    assert taken_from == [3000, 3000, 3000, 0]
    assert held.rows == 0 and held.take() == []


def test_spilled_user_split_takes_within_each_table(tmp_path, monkeypatch):
    """The user shuffle's spilled split takes rows from one incoming table at a time,
    never from the gather of a bundle's tables (what made the split of 1e8 rows cost
    4x per row), and still writes one file per shard per gather."""
    batches = _batches()
    split_sizes = []   # the rows of each table split
    from thresher.transforms.plumbing import tables as tables_mod
    original_split = tables_mod.split_by_shard

    def recording(table, shard_ids, num_shards, slices=False):
        split_sizes.append(table.num_rows)
        return original_split(table, shard_ids, num_shards, slices=slices)

    monkeypatch.setattr(tables_mod, "split_by_shard", recording)
    pieces = _recorded_pieces(monkeypatch)
    monkeypatch.setattr(spill, "PIECE_ROWS", 1 << 14)
    with test_pipeline.TestPipeline() as p:
        _ = (p | beam.Create(batches, reshuffle=False)
             | ShardByUser(32, key_columns=["word"], spill_dir=str(tmp_path / "users"),
                           coalesce_rows=1))
    assert split_sizes and max(split_sizes) == 1000, split_sizes
    assert sum(pieces) == 8000 and len(pieces) <= 32, pieces

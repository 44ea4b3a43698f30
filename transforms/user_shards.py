"""ShardByUser: bring every record of a user into one element, by a hash-sharded shuffle.

Input: PCollection[pyarrow.Table] of record batches with columns ``__user`` (uint64
hash of the user id, see :mod:`transforms.hashing`), ``__key`` (uint64 hash of the key
columns), the key columns and, for ids that are not integers, ``__user_id`` (the exact
id). Output: PCollection[pyarrow.Table], each element holding *all* records of the users
whose hash falls in one shard — what contribution bounding (PerUserBound, RandClip) and
per-user statistics (ChooseContributionBound) need.

**Exact user identity.** The hash is public, so colliding ids can be crafted; colliding
users land in the same shard (the shard is a function of the hash). In the output,
``__user`` identifies users *exactly within the element*: where ``__user_id`` is present
it is replaced by a bijection of the id's dictionary code in the shard
(:func:`exact_user_ids`) and dropped. Every consumer of user shards groups users within
one element only, never across elements.

Rows travel as Arrow batches, never one Python object per row: batches (coalesced to about
``COALESCE_ROWS`` rows) are split into ``num_shards`` pieces with one radix argsort, and a
GroupByKey on the shard id gathers them.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.utils.windowed_value import WindowedValue

from thresher.transforms import spill
from thresher.transforms.arrow_coder import SHARD_AND_TABLE, TABLE
from thresher.transforms.hashing import hash_columns, mix64

SHARD_AND_PATH = beam.typehints.Tuple[int, str]

USER_COLUMN = "__user"
USER_ID_COLUMN = "__user_id"
KEY_HASH_COLUMN = "__key"


def split_by_shard(table, shard_ids, num_shards):
    """Yield (shard, sub-table) for every non-empty shard of one batch.

    Each sub-table owns compact buffers (one ``take`` per shard), never a slice of a
    shared table: pickling a pyarrow slice writes the *whole* parent buffers, which made
    every shard piece as large as its batch (num_shards times the data in the shuffle)."""
    shard_ids = np.asarray(shard_ids)
    # Shard ids are small non-negative integers: a stable radix sort on 16 bits.
    narrow = shard_ids.astype(np.uint16) if num_shards <= (1 << 16) else shard_ids
    order = np.argsort(narrow, kind="stable")
    bounds = np.searchsorted(narrow[order], np.arange(num_shards + 1))
    for shard in range(num_shards):
        lo, hi = int(bounds[shard]), int(bounds[shard + 1])
        if hi > lo:
            yield shard, table.take(pa.array(order[lo:hi]))


def user_shard_of(user_hash, num_shards):
    # The top bits pick the shard so that the low bits (used by bounding's ordering) stay
    # independent of it.
    return ((user_hash >> np.uint64(40)) % np.uint64(num_shards)).astype(np.int64)


def concat(tables):
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


# Read batches are coalesced up to this many rows before they are split: the shuffle then
# moves num_shards pieces per ~1M rows instead of per read batch (row group), which cuts
# the runner's per-element cost (about 0.6 s of CPU per 1e7 rows at 100k-row row groups).
COALESCE_ROWS = 1 << 20


class _SplitByUser(beam.DoFn):
    def __init__(self, num_shards, coalesce_rows=None, drop_key_hash=False, spill_dir=None):
        self._num_shards = num_shards
        self._coalesce_rows = COALESCE_ROWS if coalesce_rows is None else coalesce_rows
        self._drop_key_hash = drop_key_hash
        self._spill_dir = spill_dir

    def start_bundle(self):
        self._pending = {}  # window -> [tables]
        self._pending_rows = {}

    def _split(self, tables):
        table = concat(tables)
        if table is None:
            return
        user_hash = table.column(USER_COLUMN).to_numpy()
        if self._drop_key_hash and KEY_HASH_COLUMN in table.column_names:
            table = table.drop_columns([KEY_HASH_COLUMN])   # recomputed after the shuffle
        pieces = split_by_shard(table, user_shard_of(user_hash, self._num_shards), self._num_shards)
        if self._spill_dir is None:
            yield from pieces
            return
        for shard, piece in pieces:   # (shard, file name): the bytes stay on disk
            yield shard, spill.write_piece(piece, self._spill_dir)

    def process(self, table, window=beam.DoFn.WindowParam):
        if table.num_rows >= self._coalesce_rows:
            yield from self._split([table])
            return
        self._pending.setdefault(window, []).append(table)
        self._pending_rows[window] = self._pending_rows.get(window, 0) + table.num_rows
        if self._pending_rows[window] >= self._coalesce_rows:
            tables = self._pending.pop(window)
            del self._pending_rows[window]
            yield from self._split(tables)

    def finish_bundle(self):
        for window, tables in self._pending.items():
            for piece in self._split(tables):
                yield WindowedValue(piece, window.max_timestamp(), [window])
        self._pending = {}
        self._pending_rows = {}


def exact_user_ids(table):
    """``table`` with ``__user`` identifying the ``__user_id`` values exactly (then
    dropped), so two different ids are two users even when their hashes collide. Tables
    without ``__user_id`` (integer ids, whose hash is already a bijection) are returned
    as they are.

    The check is exact and cheap: the hash is a function of the id, so it is one-to-one
    on the table's ids iff both columns have equal numbers of distinct values. Only a shard where that fails (crafted or accidental collisions) pays
    for a dictionary encoding: ``__user`` becomes mix64 of each id's rank among the
    shard's distinct ids in sorted order, a bijection of the ranks. The rank, unlike the
    order of first appearance, does not depend on row order, so a recomputed or
    re-bundled shard gives every user the same ``__user`` and hence the same keyed
    stream (``transforms.keyed_random``)."""
    if USER_ID_COLUMN not in table.column_names:
        return table
    ids = table.column(USER_ID_COLUMN)
    ids = ids.combine_chunks() if ids.num_chunks != 1 else ids.chunk(0)
    if not _hash_is_exact(table.column(USER_COLUMN), ids):
        encoded = pc.dictionary_encode(ids)
        order = pc.array_sort_indices(encoded.dictionary).to_numpy(zero_copy_only=False)
        rank = np.empty(len(order), dtype=np.int64)
        rank[order] = np.arange(len(order))
        codes = rank[encoded.indices.to_numpy(zero_copy_only=False)]
        position = table.column_names.index(USER_COLUMN)
        table = table.set_column(position, USER_COLUMN,
                                 pa.array(mix64(codes.astype(np.uint64)), type=pa.uint64()))
    return table.drop_columns([USER_ID_COLUMN])


def _hash_is_exact(hashes, ids):
    """True if equal hashes always come with equal ids. The hash is a function of the
    id, so it is one-to-one on this table's ids exactly when both have as many distinct
    values (two hash-table counts; no sort of the rows, no take of the ids)."""
    if len(hashes) < 2:
        return True
    return len(pc.unique(hashes)) == len(pc.unique(ids))


def _concat_shard(shard_and_tables, key_columns=None, after=None):
    # ``after``: an unused side input that orders this step after its producer
    _, tables = shard_and_tables
    tables = [spill.read_piece(t) if isinstance(t, str) else t for t in tables]
    table = concat(tables)
    if table is not None:
        table = exact_user_ids(table)
        if key_columns is not None and KEY_HASH_COLUMN not in table.column_names:
            table = with_key_hash(table, key_columns)
        yield table


def with_key_hash(table, key_columns):
    """``table`` with ``__key`` (the reader's hash of the key columns,
    ``pipelines.io.prepare_batch``) back in second place, after ``__user``."""
    key_hash = pa.array(hash_columns(table, list(key_columns)), type=pa.uint64())
    return table.add_column(1, KEY_HASH_COLUMN, key_hash)


class ShardByUser(beam.PTransform):
    """Hash-shard record batches by user so each output element has whole users."""

    def __init__(self, num_shards, key_columns=None, spill_dir=None, label=None):
        super().__init__(label)
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self._num_shards = int(num_shards)
        self._key_columns = tuple(key_columns) if key_columns is not None else None
        self._spill_dir = spill_dir

    def expand(self, batches):
        grouped = self.grouped(batches)
        return grouped | "ConcatUserShard" >> self.concat()

    def grouped(self, batches):
        """The shuffle alone: PCollection[(shard, [Table])]. With ``key_columns`` the
        ``__key`` hash does not travel (8 of the ~36 bytes a string row moves): it is
        recomputed from the key columns in :meth:`concat`. With ``spill_dir`` (a local
        folder every worker can reach) the pieces are written there and only their file
        names are shuffled (:mod:`transforms.spill`)."""
        split = _SplitByUser(self._num_shards, drop_key_hash=self._key_columns is not None,
                             spill_dir=self._spill_dir)
        return (batches
                | "SplitByUserHash" >> beam.ParDo(split).with_output_types(
                    SHARD_AND_PATH if self._spill_dir is not None else SHARD_AND_TABLE)
                | "GroupUserShards" >> beam.GroupByKey())                          # (shard, [Table])

    def concat(self, after=None):
        """(shard, [Table]) -> one Table of whole users (exact ids, ``__key`` present).
        Applying it twice to :meth:`grouped`'s output gives two consumers their own copy
        without the runner materialising the concatenated shards between stages.
        ``after``: a side input (its value is not used) that this step must wait for, so
        that it runs in its consumer's stage rather than fused with the other consumer."""
        extra = {} if after is None else {"after": after}
        return beam.FlatMap(_concat_shard, key_columns=self._key_columns,
                            **extra).with_output_types(TABLE)

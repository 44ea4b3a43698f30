"""The columns every batch of records carries, and the Arrow helpers of the shuffles.

``__user`` / ``__user_lo`` are the two 64-bit words of a user's secret-keyed identity
(``transforms.randomness.user_identity``), ``__user_hi`` holds word 0 where
``transforms.bounding.user_shards.exact_users`` made ``__user`` a grouping code, and
``__key`` is the uint64 hash of the key columns. They live here, at the bottom layer,
because the keyed streams (``transforms.randomness.keyed_random``) key per-user draws by
the identity columns and the key shuffle (``transforms.plumbing.aggregate``) shards by
``__key``; ``transforms.bounding.user_shards`` imports and re-exports them.
"""
import numpy as np
import pyarrow as pa

USER_COLUMN = "__user"          # identity word 0 (picks the shard); the grouping word
USER_LOW_COLUMN = "__user_lo"   # identity word 1
USER_HIGH_COLUMN = "__user_hi"  # identity word 0, where __user had to become a grouping code
KEY_HASH_COLUMN = "__key"
# the metadata of a ``__key`` field that states which key columns it is the hash of
# (``hashing.hash_columns`` of exactly those, in order): set by the reader when it hashes
# fewer columns than it reads (``pipelines.dataio.io.prepare_batch``'s ``hashed_keys``)
KEY_HASH_OF = b"thresher.hash_of"


def key_hash_field(columns):
    """The ``__key`` field (uint64) stating that it is the hash of ``columns``."""
    return pa.field(KEY_HASH_COLUMN, pa.uint64(),
                    metadata={KEY_HASH_OF: "\x1f".join(columns).encode("utf-8")})


def key_hash_is_of(table, columns):
    """Whether ``table``'s ``__key`` field states (:func:`key_hash_field`) that it is the
    hash of exactly ``columns``, in that order. A table without the statement (any
    other reader, e.g. the Python API's) is not assumed to be hashed so."""
    index = table.schema.get_field_index(KEY_HASH_COLUMN)
    if index < 0:
        return False
    metadata = table.schema.field(index).metadata or {}
    return metadata.get(KEY_HASH_OF) == "\x1f".join(columns).encode("utf-8")


def split_by_shard(table, shard_ids, num_shards, slices=False):
    """Yield (shard, sub-table) for every non-empty shard of one batch.

    By default each sub-table owns compact buffers (one ``take`` per shard), never a slice
    of a shared table: pickling a pyarrow slice writes the *whole* parent buffers, which
    made every shard piece as large as its batch (num_shards times the data in the
    shuffle). ``slices=True`` is for a consumer that writes each piece to an Arrow IPC file
    (``transforms.plumbing.spill.write_piece``; the IPC writer writes only a slice's own
    rows): consecutive shards are gathered together, about an eighth of the rows (at least
    2^16) by one ``take``, and each piece is a zero-copy slice of its gather, so a split
    into many shards costs a few gathers instead of one per shard (at 1e8 rows, 100
    shards: ~19,000 ``take`` calls, 8 s of CPU), holding at most an eighth more rows.
    A row whose id is ``num_shards`` goes to no shard (a row a pre-reduction did not keep:
    ``user_shards.KEPT_COLUMN``)."""
    shard_ids = np.asarray(shard_ids)
    # Shard ids are small non-negative integers: a stable radix sort on 16 bits.
    narrow = shard_ids.astype(np.uint16) if num_shards < (1 << 16) else shard_ids
    order = np.argsort(narrow, kind="stable")
    bounds = np.searchsorted(narrow[order], np.arange(num_shards + 1))
    if not slices:
        for shard in range(num_shards):
            lo, hi = int(bounds[shard]), int(bounds[shard + 1])
            if hi > lo:
                yield shard, table.take(pa.array(order[lo:hi]))
        return
    block = max(1 << 16, -(-len(order) // 8))
    first = 0
    while first < num_shards:
        lo = int(bounds[first])
        # the shards first .. last - 1 (at least one) whose rows fit in one block
        last = max(first + 1, int(np.searchsorted(bounds, lo + block, side="right")) - 1)
        last = min(last, num_shards)
        hi = int(bounds[last])
        if hi > lo:
            gathered = table.take(pa.array(order[lo:hi]))
            for shard in range(first, last):
                a, b = int(bounds[shard]) - lo, int(bounds[shard + 1]) - lo
                if b > a:
                    yield shard, gathered.slice(a, b - a)
        first = last


class ShardSlices:
    """Tables split by shard one at a time, each shard's pieces held (as slices) until
    taken: what a splitting step whose pieces are written to files
    (``transforms.plumbing.spill``) gathers between two writes.

    Why not gather the tables and split their concatenation: its ``take`` then reads rows
    scattered over a table larger than the CPU's caches. The key strings' take costs
    ~16 ns a row from a 7e5-row table and ~68 ns from a 2e6-row one (issue 43: at 1e8
    rows the user shuffle gathers ~1.5e6 rows per write, and its takes cost 8.6 s of CPU
    against ~1 s per 1e7 rows at 1e7). Splitting each table as it comes keeps every take
    within one table. Each shard gets the same rows in the same order (the tables' order,
    then each table's own) as from the split of the concatenation, and as many files."""

    def __init__(self, num_shards):
        self._num_shards = int(num_shards)
        self._pieces = {}   # shard -> [slice]
        self.rows = 0

    def add(self, table, shard_ids):
        """Split ``table`` (its rows' shards ``shard_ids``; ``num_shards`` for none) and
        hold its pieces; ``rows`` counts the rows held."""
        for shard, piece in split_by_shard(table, shard_ids, self._num_shards, slices=True):
            self._pieces.setdefault(shard, []).append(piece)
            self.rows += piece.num_rows

    def take(self):
        """[(shard, table)] for every shard holding rows, in increasing shard order, each
        table the shard's slices in the order added (as chunks, not copied); nothing is
        held after."""
        pieces, self._pieces, self.rows = self._pieces, {}, 0
        return [(shard, chunked(pieces[shard])) for shard in sorted(pieces)]


def key_shard_of(table, num_shards):
    """Each row's key shard: its ``__key`` modulo ``num_shards``. Every split by key
    (``aggregate.SumCountsPerKey``, the automatic bound's running counts) uses it, so
    that each key's pieces meet in one shard."""
    return (table.column(KEY_HASH_COLUMN).to_numpy() % np.uint64(num_shards)).astype(np.int64)


def concat(tables):
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


def chunked(tables):
    """``tables`` as one table of their chunks (no copy), or None if they hold no row."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    return tables[0] if len(tables) == 1 else pa.concat_tables(tables,
                                                                promote_options="permissive")


def user_identity_columns(table, user_column=USER_COLUMN):
    """The columns that identify a row's user for its random streams
    (``transforms.randomness.keyed_random.bind``): the two identity words (``__user_hi`` in place
    of ``__user`` where ``user_shards.exact_users`` made ``__user`` a grouping code), or
    ``user_column`` itself when a caller groups users by a column of its own. Never the
    grouping code."""
    if user_column != USER_COLUMN:
        return [user_column]
    names = table.column_names
    if USER_LOW_COLUMN not in names:
        raise ValueError(f"a table of users needs the identity columns {USER_COLUMN!r} and "
                         f"{USER_LOW_COLUMN!r} (pipelines.io.prepare_batch, "
                         f"transforms.randomness.user_identity); it has {names}")
    return [USER_HIGH_COLUMN if USER_HIGH_COLUMN in names else USER_COLUMN, USER_LOW_COLUMN]


def user_columns(table):
    """The user columns present in ``table`` (grouping word and identity words): what a
    per-user regrouping (``aggregate_values.user_key_totals``) must carry along."""
    return [c for c in (USER_COLUMN, USER_HIGH_COLUMN, USER_LOW_COLUMN) if c in table.column_names]

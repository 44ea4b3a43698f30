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


def split_by_shard(table, shard_ids, num_shards, slices=False):
    """Yield (shard, sub-table) for every non-empty shard of one batch.

    By default each sub-table owns compact buffers (one ``take`` per shard), never a slice
    of a shared table: pickling a pyarrow slice writes the *whole* parent buffers, which
    made every shard piece as large as its batch (num_shards times the data in the
    shuffle). ``slices=True`` is for a consumer that writes each piece to an Arrow IPC file
    (``transforms.plumbing.spill.write_piece``; the IPC writer writes only a slice's own
    rows): the rows are put in shard order by one ``take`` and each piece is a zero-copy
    slice of it, so a split into many shards costs one gather instead of one per shard
    (at 1e8 rows, 100 shards: ~19,000 ``take`` calls, 8 s of CPU)."""
    shard_ids = np.asarray(shard_ids)
    # Shard ids are small non-negative integers: a stable radix sort on 16 bits.
    narrow = shard_ids.astype(np.uint16) if num_shards <= (1 << 16) else shard_ids
    order = np.argsort(narrow, kind="stable")
    bounds = np.searchsorted(narrow[order], np.arange(num_shards + 1))
    ordered = table.take(pa.array(order)) if slices else None
    for shard in range(num_shards):
        lo, hi = int(bounds[shard]), int(bounds[shard + 1])
        if hi > lo:
            yield shard, (ordered.slice(lo, hi - lo) if slices
                          else table.take(pa.array(order[lo:hi])))


def concat(tables):
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return None
    if len(tables) == 1:
        return tables[0]
    return pa.concat_tables(tables, promote_options="permissive").combine_chunks()


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

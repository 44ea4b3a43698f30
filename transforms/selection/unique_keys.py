"""OneRowPerKey: an existing weighted sample (``input.sample``) declares one row per key;
a key listed twice is refused, naming it, rather than summed (which would release a
frequency the declared sampling scheme never produced).

Input: PCollection[pyarrow.Table] of (``__key``, key columns, ``count``) batches
(``pipelines.io.prepare_sample_batch``). Output: PCollection[pyarrow.Table] of (key
columns, ``count``), each key exactly once, sharded by the key hash like
``transforms.plumbing.aggregate.SumCountsPerKey``.
"""
import pyarrow.compute as pc

from thresher.errors import InputError
from thresher.transforms.plumbing.aggregate import SumCountsPerKey, shard_table
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN


def unique_rows(table, key_columns):
    """The table's key columns and count; InputError on the first key listed twice."""
    keys = list(key_columns) + [KEY_HASH_COLUMN]
    rows = table.group_by(keys, use_threads=False).aggregate([("count", "count")])
    repeated = pc.greater(rows.column("count_count"), 1)
    if pc.any(repeated).as_py():
        first = rows.filter(repeated).slice(0, 1).select(list(key_columns)).to_pylist()[0]
        shown = ", ".join(f"{k}={v!r}"[:200] for k, v in first.items())
        raise InputError(f"input.sample: key ({shown}) is listed more than once; an existing "
                         f"sample has one row per key")
    return table.select(list(key_columns) + ["count"])


def _unique_shard(shard_and_tables, key_columns):
    table = shard_table(shard_and_tables)
    if table is None:
        return
    yield unique_rows(table, key_columns).combine_chunks()


class OneRowPerKey(SumCountsPerKey):
    """The key shuffle of ``SumCountsPerKey``, each shard checked for one row per key."""

    step = "OneRowPerKey"
    per_shard = staticmethod(_unique_shard)

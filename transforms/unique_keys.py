"""OneRowPerKey: an existing weighted sample (``input.sample``) declares one row per key;
a key listed twice is refused, naming it, rather than summed (which would release a
frequency the declared sampling scheme never produced).

Input: PCollection[pyarrow.Table] of (``__key``, key columns, ``count``) batches
(``pipelines.io.prepare_sample_batch``). Output: PCollection[pyarrow.Table] of (key
columns, ``count``), each key exactly once, sharded by the key hash like
``transforms.aggregate.SumCountsPerKey``.
"""
import apache_beam as beam
import pyarrow.compute as pc

from pipelines.errors import InputError
from transforms.aggregate import _SplitByKey
from transforms.arrow_coder import SHARD_AND_TABLE, TABLE
from transforms.user_shards import KEY_HASH_COLUMN, concat


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
    _, tables = shard_and_tables
    table = concat(list(tables))
    if table is None:
        return
    yield unique_rows(table, key_columns).combine_chunks()


class OneRowPerKey(beam.PTransform):
    def __init__(self, key_columns, num_shards, label=None):
        super().__init__(label)
        self._key_columns = tuple(key_columns)
        self._num_shards = int(num_shards)

    def expand(self, rows):
        return (rows
                | "SplitByKeyHash" >> beam.ParDo(_SplitByKey(self._num_shards)
                                                 ).with_output_types(SHARD_AND_TABLE)
                | "GroupKeyShards" >> beam.GroupByKey()
                | "OneRowPerKey" >> beam.FlatMap(_unique_shard, key_columns=self._key_columns
                                                 ).with_output_types(TABLE))

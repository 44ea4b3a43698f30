"""SumCountsPerKey: merge partial per-key counts from every user shard into one count per key.

Input: PCollection[pyarrow.Table] of partial counts (key columns, ``__key`` uint64 hash
of the key, int64 ``count``), possibly several rows per key across elements. Output:
PCollection[pyarrow.Table] with the key columns and ``count``, each key exactly once in
the whole collection; keys are sharded by their hash, so an element is a batch of keys
ready for a vectorised release kernel. With ``spill_dir`` (the in-process runner,
``transforms.plumbing.spill``) the key shuffle moves file names: the runner then holds no partial
counts, whose number grows with the input (one row per user shard and key).
"""
import apache_beam as beam
import numpy as np
from apache_beam.transforms.window import GlobalWindows

from thresher.transforms.plumbing import spill
from thresher.transforms.plumbing.arrow_coder import SHARD_AND_TABLE, TABLE
from thresher.transforms.plumbing.tables import (KEY_HASH_COLUMN, ShardSlices, concat,
                                                 key_shard_of, split_by_shard)


class _SplitByKey(beam.DoFn):
    """Tables -> (key shard, piece). With ``spilled`` (the pieces are written to files,
    ``transforms.plumbing.spill``) a bundle's tables are split as they come and their
    pieces held until ``spill.split_rows(num_shards)`` rows are (``tables.ShardSlices``):
    one piece per key shard per ~``split_rows`` rows, so the files stay linear in the rows
    (1e8 rows: one per user shard and key shard, 10,000, before)."""

    def __init__(self, num_shards, spilled=False):
        self._num_shards = num_shards
        self._spilled = spilled

    def start_bundle(self):
        self._held = ShardSlices(self._num_shards)

    def process(self, table):
        if not self._spilled:
            table = concat([table])
            if table is not None:
                yield from split_by_shard(table, key_shard_of(table, self._num_shards),
                                          self._num_shards)
            return
        # the key shuffle runs in the global window (release batches all are)
        self._held.add(table, key_shard_of(table, self._num_shards))
        if self._held.rows >= spill.split_rows(self._num_shards):
            yield from self._held.take()

    def finish_bundle(self):
        for piece in self._held.take():
            yield GlobalWindows.windowed_value(piece)


def shard_table(shard_and_tables):
    """One key shard's grouped pieces as one table (None if empty)."""
    _, tables = shard_and_tables
    return concat(list(tables))


def _sum_shard(shard_and_tables, key_columns):
    table = shard_table(shard_and_tables)
    if table is None:
        return
    keys = list(key_columns) + [KEY_HASH_COLUMN]
    # ``count`` and any int64 grid sums of aggregates (``__s<i>``) are summed alike
    summed_columns = [c for c in table.column_names if c not in keys]
    summed = table.group_by(keys, use_threads=False).aggregate([(c, "sum") for c in summed_columns])
    summed = summed.rename_columns(keys + summed_columns)
    yield summed.select(list(key_columns) + summed_columns).combine_chunks()


class SumCountsPerKey(beam.PTransform):
    """Shuffle tables by key hash and combine each key shard (``per_shard``; here: sum the
    counts per key). Subclasses change only ``step`` and ``per_shard``."""

    step = "SumPerKey"
    per_shard = staticmethod(_sum_shard)

    def __init__(self, key_columns, num_shards, spill_dir=None, label=None):
        super().__init__(label)
        self._key_columns = tuple(key_columns)
        self._num_shards = int(num_shards)
        self._spill_dir = spill_dir   # the pieces travel as files (transforms/plumbing/spill.py)

    def expand(self, partial_counts):
        return (partial_counts
                | "SplitByKeyHash" >> beam.ParDo(_SplitByKey(
                    self._num_shards, spilled=self._spill_dir is not None)
                ).with_output_types(SHARD_AND_TABLE)
                | "GroupKeyShards" >> spill.group_by_key(self._spill_dir)        # (shard, [Table])
                | self.step >> beam.FlatMap(type(self).per_shard, key_columns=self._key_columns
                                            ).with_output_types(TABLE))

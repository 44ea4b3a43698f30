"""The true counts of per-key quantiles' public cells straight from the bounded records of
each user shard (issue 43 item 4): no table of counts per (key, value), no shuffle.

``transforms.trees.public_cells`` releases every (level, key, bucket) cell of the selected
keys with discrete Gaussian noise. Its true count is the number of kept (user, key)
contributions (``transforms.bounding.key_value_bound``: one value per (user, key), at most
C keys per user) of that key whose value falls in that bucket. Until issue 43 round 7 the
count went through three tables: the users per (key, value), shuffled and summed over the
shards (``SumCountsPerValue``); its (level, key, bucket) cells, hashed
(``public_cells._cells``); and those summed once more by a second shuffle
(``SumPerCell``). Here each user shard is bounded as soon as it is grouped (no side
input: the shards are never held waiting for the key selection), and only its kept rows
(at most C per user) wait for the selected keys; they then become, with array operations
only, the sorted distinct cell indices they hit and how many times (:func:`shard_cells`).
The cells of all the shards reach the noise as one side input, and the noise adds them
up per cell (``public_cells._CellQuantilesFn``, ``np.add.at``).

Same counts, so the same bytes. The bounding is the same kernel with the same keyed draws
(its stage label is the caller's ``rng_factory``). A cell's index is the one
``public_cells._data_cells`` gives it: ``key_positions`` of the row's key tuple in the
selected keys' list (-1: not selected, dropped), times the cells per key, plus the
level's offset and ``quantiles.bucket_of`` of the value. ``key_positions`` is a function
of each row's key values alone and matches them as Arrow does, bitwise (a float -0.0 is
not 0.0), and Arrow's grouping of the old tables kept each key's bits, so a row lands in
the very cell where the old tables put its contribution. The old restriction to the
selected keys (``pipelines.kinds.quantiles._restrict_to``, which compares -0.0 and 0.0
as equal) kept a superset of the rows placed here; the rows it alone kept were dropped by
``_data_cells`` (position -1). Counts are int64 sums: exact in any order.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.transforms.bounding.key_value_bound import bound_key_values, stage_sources
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.randomness import keyed_random
from thresher.transforms.trees.public_cells import CELL_COLUMN, key_positions
from thresher.transforms.trees.quantiles import bucket_of


def level_offsets(branching, levels):
    """[0, b, b + b^2, ..., sum_l b^l]: where each level's buckets start among one key's
    cells (``public_cells.dense_levels``' layout)."""
    return np.cumsum([0] + [branching ** l for l in range(1, levels + 1)]).astype(np.int64)


def shard_cells(table, keys, value_column, key_list, *, lo, hi, branching, levels,
                count_column=None):
    """Rows (keys..., value) -> Table(cell, count): the sorted distinct cell indices
    (``public_cells.CELL_COLUMN``, module docstring) the rows of listed keys hit, over
    every level, and how many rows hit each -- or, with ``count_column``, the sum of
    that int64 column over them (rows that are already counts per (key, value)).
    ``key_list``: the selected key tuples, in the key table's order."""
    offsets = level_offsets(branching, levels)
    position = key_positions(table, list(keys), key_list)
    listed = np.flatnonzero(position >= 0)
    values = table.column(value_column).to_numpy(zero_copy_only=False)[listed]
    base = position[listed] * int(offsets[-1])
    cell = np.concatenate([base + int(offsets[level - 1])
                           + bucket_of(values, lo=lo, hi=hi, branching=branching, level=level)
                           for level in range(1, levels + 1)]).astype(np.int64)
    if count_column is None:
        cells, counts = np.unique(cell, return_counts=True)
    else:
        weight = table.column(count_column).to_numpy(zero_copy_only=False)[listed]
        order = np.argsort(cell, kind="stable")
        ordered = cell[order]
        start = np.ones(len(ordered), dtype=bool)
        start[1:] = ordered[1:] != ordered[:-1]
        first = np.flatnonzero(start)
        cells = ordered[first]
        counts = (np.add.reduceat(np.tile(weight.astype(np.int64), levels)[order], first)
                  if len(first) else np.zeros(0, np.int64))
    return pa.table({CELL_COLUMN: pa.array(cells.astype(np.int64)),
                     "count": pa.array(counts.astype(np.int64))})


class _BoundRowsFn(beam.DoFn):
    """One user shard -> its kept rows, Table(keys..., value): ``key_value_bound``'s
    choice (the draws of ``BoundKeyValues`` under the same stage), made numeric by
    ``numeric`` (a function of (table, value column): the caller's check of the value
    column). No side input: the shard is bounded as soon as it is grouped, and only its
    kept rows (at most C per user) wait for the selected keys."""

    def __init__(self, keys, column, bound, numeric, rng_factory, stage):
        self._keys, self._column, self._bound = tuple(keys), column, int(bound)
        self._numeric = numeric
        self._rng_factory = rng_factory
        self._stage = stage

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table):
        value_rng, key_rng = stage_sources(self._rng_factory, self._rng, self._stage)
        kept = bound_key_values(table, self._keys, self._column, self._bound, value_rng, key_rng)
        beam.metrics.Metrics.counter("thresher_not_private", "contributions_kept").inc(len(kept))
        if not len(kept):
            return
        rows = table.select([*self._keys, self._column]).take(pa.array(kept))
        if self._numeric is not None:
            rows = self._numeric(rows, self._column)
        yield rows.combine_chunks()


def _shard_cells(rows, key_list, keys, column, cells):
    out = shard_cells(rows, keys, column, key_list, **cells)
    if out.num_rows:
        yield out


class BoundedCells(beam.PTransform):
    """User-sharded record tables -> Table(cell, count) per shard: the true counts of the
    public cells of the keys in ``key_list`` (a singleton side input of distinct key
    tuples, the order of the released key table) after ``BoundKeyValues``' bounding
    (``rng_factory``: that stage's draws). ``numeric``: applied to the kept rows before
    the cells (e.g. the kind's check and cast of the value column), or None."""

    def __init__(self, keys, value_column, max_keys_per_user, key_list, *, lo, hi, branching,
                 levels, numeric=None, rng_factory=None, label=None):
        super().__init__(label)
        self._keys, self._column = tuple(keys), value_column
        self._bound = int(max_keys_per_user)
        self._key_list = key_list
        self._cells = {"lo": float(lo), "hi": float(hi), "branching": int(branching),
                       "levels": int(levels)}
        self._numeric = numeric
        self._rng_factory = rng_factory

    def expand(self, user_shards):
        fn = _BoundRowsFn(self._keys, self._column, self._bound, self._numeric,
                          *keyed_random.stage_of(self._rng_factory))
        return (user_shards
                | "BoundRows" >> keyed_random.par_do(fn).with_output_types(TABLE)
                | "Cells" >> beam.FlatMap(_shard_cells, self._key_list, list(self._keys),
                                          self._column, self._cells).with_output_types(TABLE))

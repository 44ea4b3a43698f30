"""PreReduceL0: drop, before the user shuffle, the rows fixed-bound l0 bounding cannot keep.

l0 bounding (:mod:`transforms.per_user_bound`) keeps each user's first C keys in one total
order of that user's exact keys: the hash rank mix64(``__key`` XOR the user's salt), keys
sharing a hash ordered by their ``pair`` stream (``per_user_bound.l0_tiebroken_ranks``).
The salt and the tie-breaks are keyed draws (:mod:`transforms.keyed_random`): functions of
the release secret, the bounding stage's label and the user's 128-bit identity (and key),
so they can be computed where the records are read, on any batch, with the values the
bounding will draw after the shuffle.

Why it is exact. A key k among a user's first C keys overall has fewer than C of the
user's keys before it; in any batch holding k, each distinct hash ranked below k's in
that batch carries at least one of those keys, so k's hash is among the user's C
smallest distinct hashes in the batch. Keeping, per user and batch, one row per distinct
(user, exact key) among the C smallest hashes therefore keeps a superset of the final
kept keys, and the bounding's choice on a superset containing the first C keys of a
total order is those C keys. The released bytes are the same with and without this step
(tests/pipelines/test_prereduce.py), and what a user's rows become depends on the secret
and that user's rows only (the batch decides nothing but which superset travels).

Memory. A heavy user's rows leave each batch as at most C rows per distinct hash kept
(one per exact key: C rows unless the user holds colliding keys); batches of one bundle
are combined again (``COMBINE_ROWS``), so a user spread over many batches also leaves the
bundle with about C rows. The shuffle then holds about C rows per user instead of all of
them (issue 30, D15: a 1e7-row user among 5,000 others peaked at 3.1 GB in process).

Only fixed-bound l0 bounding through ``PerUserBound`` uses it (``pipelines.release``),
and ``aggregates`` with fixed clips (``PerUserBoundWithValues``: every row of the kept
keys is kept, ``every_row``, since the bounding sums each kept (user, key)'s values, in a
canonical order, so the totals are the same). An automatic C scores every key of a user,
``clip: auto`` every user's totals, l1 rand-clip samples records (not keys) and adaptive
rounds re-bound the users' remaining keys, so none of those can drop a user's keys early.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from thresher.transforms import keyed_random
from thresher.transforms.arrow_coder import TABLE
from thresher.transforms.per_user_bound import (
    _runs, exact_key_codes, key_hash_is_exact, l0_ranks)
from thresher.transforms.user_shards import KEY_HASH_COLUMN, USER_COLUMN, concat, exact_users

# Reduced pieces of one bundle are held until they reach this many rows, then reduced
# together (a user spread over many batches leaves with about C rows, not C per batch).
COMBINE_ROWS = 1 << 20


def prereduce_l0(table, key_columns, max_keys_per_user, source, every_row=False):
    """Row indices (ascending) of ``table`` (prepared read batches: ``__user``,
    ``__user_lo``, ``__key``, key columns) that can still be among a user's first
    ``max_keys_per_user`` keys: per user, one row per distinct exact key whose hash is
    among the user's C smallest hash ranks in this table (module docstring).

    source: the bounding stage's ``keyed_random.StageSource`` (same secret, same stage
    label as the ``PerUserBound`` after the shuffle). every_row: keep every row of those
    keys (``aggregates``: the bounding then sums each kept (user, key)'s values)."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    grouped = exact_users(table)          # group by the full identity; rows keep their place
    users = grouped.column(USER_COLUMN).to_numpy()
    bound = keyed_random.bind_users(source, grouped, key_columns)
    ranks = l0_ranks(users, grouped.column(KEY_HASH_COLUMN).to_numpy(), bound)
    inside = ranks.rank_in_user < max_keys_per_user
    rows = ranks.order[inside & ranks.distinct]          # one row per (user, hash) kept
    candidates = ranks.order[inside]
    if every_row:
        return np.sort(candidates)
    if len(candidates) > len(rows):   # repeated rows of kept hashes: are they other keys?
        part = grouped.take(pa.array(candidates))
        if not key_hash_is_exact(part, key_columns):   # keep one row per exact key
            codes = exact_key_codes(part, key_columns)
            part_users = users[candidates]
            order = np.lexsort((codes, part_users))
            first = _runs(part_users[order])
            first[1:] |= codes[order][1:] != codes[order][:-1]
            rows = candidates[order[first]]
    return np.sort(rows)


class _PreReduceFn(beam.DoFn):
    def __init__(self, key_columns, max_keys_per_user, rng_factory, stage, every_row):
        self._key_columns = tuple(key_columns)
        self._max_keys_per_user = int(max_keys_per_user)
        self._rng_factory = rng_factory
        self._stage = stage
        self._every_row = every_row

    def start_bundle(self):
        # One list for the bundle: release batches are all in the global window (and the
        # secret's wrapper, keyed_random.par_do, passes no window parameter through).
        self._pending = []
        self._pending_rows = 0

    def _reduce(self, table):
        source = keyed_random.StageSource(self._rng_factory, self._stage)
        kept = prereduce_l0(table, self._key_columns, self._max_keys_per_user, source,
                            self._every_row)
        beam.metrics.Metrics.counter("thresher_not_private", "rows_prereduced_in").inc(
            table.num_rows)
        beam.metrics.Metrics.counter("thresher_not_private", "rows_prereduced_out").inc(
            len(kept))
        if len(kept) == table.num_rows:
            return table
        return table.take(pa.array(kept))

    def process(self, table):
        reduced = self._reduce(table)
        self._pending.append(reduced)
        self._pending_rows += reduced.num_rows
        if self._pending_rows >= COMBINE_ROWS:
            yield from self._flush()

    def _flush(self):
        tables, self._pending, self._pending_rows = self._pending, [], 0
        table = concat(tables)
        if table is None:
            return
        if len(tables) > 1:
            table = self._reduce(table)
        if table.num_rows:
            yield table

    def finish_bundle(self):
        for table in self._flush():
            yield GlobalWindows.windowed_value(table)


class PreReduceL0(beam.PTransform):
    """Prepared record batches -> the same batches without the rows fixed-bound l0
    bounding at C cannot keep (:func:`prereduce_l0`), combined within a bundle.

    ``stage``: the full label of the ``PerUserBound`` that bounds these records after the
    shuffle (its keyed draws are the ones computed here). ``rng_factory`` must be a
    ``keyed_random.KeyedSource`` (the release's secret): with fresh randomness the draws
    here and after the shuffle would differ, so the caller applies this step only then."""

    def __init__(self, key_columns, max_keys_per_user, rng_factory, stage, every_row=False,
                 label=None):
        super().__init__(label)
        if not isinstance(rng_factory, keyed_random.KeyedSource):
            raise TypeError("PreReduceL0 needs the release's KeyedSource")
        self._key_columns = tuple(key_columns)
        self._max_keys_per_user = int(max_keys_per_user)
        self._rng_factory = rng_factory
        self._stage = stage
        self._every_row = every_row

    def expand(self, batches):
        return batches | "PreReduce" >> keyed_random.par_do(_PreReduceFn(
            self._key_columns, self._max_keys_per_user, self._rng_factory, self._stage,
            self._every_row)
        ).with_output_types(TABLE)

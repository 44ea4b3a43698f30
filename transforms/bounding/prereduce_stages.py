"""PreReduceForBounds: one pre-reduction before the user shuffle for several l0 bounds.

The kinds that release from records (``heavy_hitters`` with ``method: trie``,
``quantiles``) bound whole users with one or more fixed-bound l0 ``PerUserBound`` stages
after the user shuffle, each over its own exact keys:

* heavy_hitters (trie): ``PerUserBound(keys, C, rows=True)``, the kept (user, key) rows;
* quantiles: ``PerUserBound(keys + [value], C)`` (the user's first C distinct (key, value)
  pairs), and with key selection also ``BoundKeys`` = ``PerUserBound(keys, C)`` over the
  key hash alone.

Until issue 43 every row of a user met in one element there, and a user with more than
``user_shards.MAX_USER_ROWS`` rows was refused. Each such stage keeps a user's first C
keys of one total order of that user's exact keys, keyed by the release secret and the
stage label; :func:`transforms.bounding.prereduce.prereduce_table` keeps, per table, a
set of rows holding every key that can be among those first C (the fixed bound's
argument, ``prereduce``'s module docstring: the bounding's choice on any superset of
rows holding the first C keys of the total order is those C keys).

Why the union serves every stage. Here the step keeps, per table, the union of the rows
each stage's kernel keeps (each computed with that stage's key hash and keyed draws).
A union of supersets of stage A's needed rows is again a subset of the user's rows that
holds a row of each of A's first C keys, so A keeps the same keys as on all the rows;
the same holds for every stage at once. ``PerUserBound`` reads of a kept key only its
identity and key columns (one row of the key, rows=True; or its distinct-user count),
never how many rows it has, so the published bytes are those of the release without the
step (tests/transforms/bounding/test_prereduce_stages.py, with the step forced on, off and
decided per table). Which rows travel depends on the table's rows only; what each user's
rows become depends on the secret and that user's records only.

Memory. A heavy user leaves each table as at most C rows per stage (one per exact key
among its C smallest ranks there), so the user shuffle holds about C rows per stage and
table of it, whatever its number of rows.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.transforms.window import GlobalWindows

from thresher.transforms.bounding import prereduce
from thresher.transforms.bounding.user_shards import (
    COALESCE_ROWS, KEY_HASH_COLUMN, concat, exact_users_with_order)
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.plumbing.tables import key_hash_field, key_hash_is_of
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.hashing import hash_columns


class Bound:
    """One fixed-bound stage after the shuffle: its exact ``key_columns``, C, and the
    full label of its transform (the stage of its keyed draws). ``rehash``: the stage
    hashes ``key_columns`` itself (the shuffled ``__key`` is a hash of more columns, e.g.
    quantiles' (key, value)). ``value_column``: the stage is ``BoundKeyValues`` (one
    value per (user, key), C keys per user) rather than ``PerUserBound``."""

    def __init__(self, key_columns, max_keys_per_user, stage, rehash=False,
                 value_column=None):
        self.key_columns = tuple(key_columns)
        self.max_keys_per_user = int(max_keys_per_user)
        self.stage = stage
        self.rehash = bool(rehash)
        self.value_column = value_column


def with_key_hash_of(table, key_columns):
    """``table`` with ``__key`` the hash of ``key_columns`` (what a stage that rehashes
    its keys reads), stating so (``tables.key_hash_field``)."""
    index = table.schema.get_field_index(KEY_HASH_COLUMN)
    return table.set_column(index, key_hash_field(key_columns),
                            pa.array(hash_columns(table, list(key_columns)), type=pa.uint64()))


def key_values_table(table, bound, rng_factory, mode, shared=None):
    """:func:`prereduce.prereduce_table` for a ``BoundKeyValues`` stage: (mask or None,
    rows read). Per table and user, the row of smallest value priority of each of the
    user's C smallest key priorities there: ``bound_key_values`` itself, run on the
    table with the stage's keyed draws. Exact: the priorities are keyed by (user, key,
    value) and (user, key), never by position, so a user's global choice of value for a
    key is its smallest value priority in some table, and its C kept keys are among its
    C smallest key priorities in every table that holds them; the rows kept here hold
    both, and the stage's choice on any such subset of a user's rows is the same."""
    from thresher.transforms.bounding.key_value_bound import bound_key_values
    if mode == "never" or table.num_rows == 0:
        return None, 0
    c = bound.max_keys_per_user
    rows, part, _ = heavy_part(table, c, mode, shared)
    if rows is None:
        return None, 0
    value_rng = keyed_random.StageSource(rng_factory, bound.stage + "/value")
    key_rng = keyed_random.StageSource(rng_factory, bound.stage + "/keys")
    kept = bound_key_values(part, list(bound.key_columns), bound.value_column, c,
                            value_rng, key_rng)
    keep = np.ones(table.num_rows, dtype=bool)
    keep[rows] = False
    keep[rows[kept]] = True
    return keep, len(rows)


def heavy_part(table, c, mode, shared=None):
    """(rows the kernels of bound C read, or None; those rows grouped by the full user
    identity, ``user_shards.exact_users_with_order``), made once per table and C for
    every stage of :func:`kept_rows` (``shared``: its memo; issue 43 round 8: the two
    stages of per-key quantiles each chose and grouped the same rows)."""
    memo = {} if shared is None else shared
    if c not in memo:
        rows = (np.arange(table.num_rows) if mode == "always"
                else prereduce.heavy_user_rows(table, c))
        memo[c] = ((None, None, None) if rows is None
                   else (rows, *exact_users_with_order(table.take(pa.array(rows)))))
    return memo[c]


def stage_rows(table, bound, rng_factory, mode, hashed=None, shared=None):
    """(mask or None, rows read) of one stage (:class:`Bound`). ``hashed``: the key
    columns ``table``'s ``__key`` is the hash of already (None: the reader's).
    ``shared``: :func:`heavy_part`'s memo for ``table``."""
    if bound.value_column is not None:
        return key_values_table(table, bound, rng_factory, mode, shared)
    rehash = bound.rehash and (hashed is None or tuple(hashed) != bound.key_columns)
    part = with_key_hash_of(table, bound.key_columns) if rehash else table
    source = keyed_random.StageSource(rng_factory, bound.stage)
    heavy = None
    if not rehash and mode != "never" and table.num_rows:
        heavy = heavy_part(table, bound.max_keys_per_user, mode, shared)
    return prereduce.prereduce_table(part, bound.key_columns, bound.max_keys_per_user,
                                     source, mode=mode, heavy=heavy)


def kept_rows(table, bounds, rng_factory, mode, hashed=None):
    """(boolean mask of the rows kept, or None for all; rows the kernels read): the union
    over ``bounds`` of the rows each stage's reduction keeps (:func:`stage_rows`)."""
    keep, examined, shared = None, 0, {}
    for bound in bounds:
        mask, read = stage_rows(table, bound, rng_factory, mode, hashed, shared)
        examined += read
        if mask is None:     # this stage keeps every row: so does the union
            return None, examined
        keep = mask if keep is None else keep | mask
    return keep, examined


class _CoalescingFn(beam.DoFn):
    """Gathers a bundle's tables to about ``coalesce_rows`` rows and hands each gathered
    table to ``_flush``. It draws nothing: only a subclass that is given the release's
    source holds one (``_rng_factory``), so an audit of the drawing stages sees exactly
    those (tests/distributed/test_pickling.py)."""

    def __init__(self, mode, coalesce_rows):
        self._mode = mode
        self._coalesce_rows = coalesce_rows

    def start_bundle(self):
        self._pending = []
        self._pending_rows = 0

    def process(self, table):
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self._coalesce_rows:
            yield from self._flush()

    def finish_bundle(self):
        for table in self._flush():
            yield GlobalWindows.windowed_value(table)


class _PreReduceForBoundsFn(_CoalescingFn):
    def __init__(self, bounds, rng_factory, mode, coalesce_rows, key_hash_of=None):
        super().__init__(mode, coalesce_rows)
        self._bounds = list(bounds)
        self._rng_factory = rng_factory
        self._key_hash_of = None if key_hash_of is None else tuple(key_hash_of)

    def _flush(self):
        tables, self._pending, self._pending_rows = self._pending, [], 0
        # the stages after the shuffle read __key as the hash of key_hash_of: hashed here
        # unless every table states it is that hash already (the CLI's reader of per-key
        # quantiles hashes the keys alone: issue 43 round 8, no second hash of every row)
        rehash = self._key_hash_of is not None and not all(
            key_hash_is_of(t, self._key_hash_of) for t in tables)
        table = concat(tables)
        del tables   # the gathered batches go before the kernels run (a copy is combined)
        if table is None:
            return
        mode = prereduce.MODE if self._mode is None else self._mode
        if rehash:
            table = with_key_hash_of(table, self._key_hash_of)
        kept, examined = kept_rows(table, self._bounds, self._rng_factory, mode,
                                   self._key_hash_of)
        counter = beam.metrics.Metrics.counter
        counter(prereduce.NOT_PRIVATE, "rows_prereduced_in").inc(table.num_rows)
        counter(prereduce.NOT_PRIVATE, "rows_prereduce_examined").inc(examined)
        if kept is not None and not kept.all():
            table = table.filter(pa.array(kept))
        counter(prereduce.NOT_PRIVATE, "rows_prereduced_out").inc(table.num_rows)
        if table.num_rows:
            yield table


class PreReduceForBounds(beam.PTransform):
    """Prepared record batches -> tables of about ``COALESCE_ROWS`` rows, without the
    rows none of ``bounds`` (:class:`Bound`) can keep, where removing them pays (module
    docstring). ``rng_factory`` must be the release's ``keyed_random.KeyedSource``: the
    draws here are those of the bounds after the shuffle. Feed the result to
    ``ShardByUser(..., coalesce_rows=1)`` (its tables are combined already).
    ``key_hash_of``: key columns whose hash replaces ``__key`` in every table handed on
    (a stage that rehashes exactly these reuses it; None: ``__key`` as read)."""

    def __init__(self, bounds, rng_factory, mode=None, coalesce_rows=None, key_hash_of=None,
                 label=None):
        super().__init__(label)
        if not isinstance(rng_factory, keyed_random.KeyedSource):
            raise TypeError("PreReduceForBounds needs the release's KeyedSource")
        if mode is not None and mode not in prereduce.MODES:
            raise ValueError(f"mode must be one of {prereduce.MODES}, got {mode!r}")
        self._bounds = list(bounds)
        self._rng_factory = rng_factory
        self._mode = mode
        self._coalesce_rows = COALESCE_ROWS if coalesce_rows is None else int(coalesce_rows)
        self._key_hash_of = key_hash_of

    def expand(self, batches):
        return batches | "PreReduce" >> keyed_random.par_do(_PreReduceForBoundsFn(
            self._bounds, self._rng_factory, self._mode, self._coalesce_rows,
            self._key_hash_of)).with_output_types(TABLE)


def prereduced_for_bounds(records, bounds, rng_factory, key_hash_of=None):
    """``records`` through :class:`PreReduceForBounds` when the release's keyed secret
    is in use (else the records unchanged, None): (records, whether they were reduced).
    ``bounds``: (key columns, C, label relative to the caller, rehash[, value column])
    per stage; each label is the stage's child of the caller's draws
    (``keyed_random.child``: the path the stage itself is handed)."""
    source = keyed_random.resolve(rng_factory)
    if not isinstance(source, keyed_random.KeyedSource):
        return records, False
    full = [Bound(keys, c, _stage(rng_factory, label), *rest)
            for keys, c, label, *rest in bounds]
    return records | "PreReduceUsers" >> PreReduceForBounds(full, source,
                                                            key_hash_of=key_hash_of), True


def _stage(rng_factory, label):
    """The stage identity the caller's stage ``label`` draws under."""
    draws = keyed_random.child(rng_factory, label)
    return draws.stage if isinstance(draws, keyed_random.KeyedDraws) else label


# ---- one row per distinct (user, key): the adaptive rounds ------------------------------
# ``kind: adaptive`` and heavy_hitters' ``method: adaptive`` (transforms.selection.
# adaptive_rounds) read a user's rows only through l0 kernels: each round's
# ``WeightedPerUserBound`` (``bound_table_l0`` on the keys not yet released, then weights
# from the number of kept keys) and the count stage's ``PerUserBound``; the filters between
# them keep or drop rows by their exact key values. ``bound_table_l0`` keeps one row per
# distinct (user, exact key) among a user's first C keys and reads nothing else of a pair
# (its number of rows is never read: ``prereduce``'s docstring, "The automatic bound",
# point 2). So every row repeating a (user identity, exact key) pair of its table can go
# before the shuffle with no change to any round, the counts or the published bytes
# (tests/transforms/bounding/test_prereduce_stages.py). No cap on a user's distinct keys is exact
# here: round r reads a user's first C keys among those not released before, which can
# lie arbitrarily deep in the user's order; a user with more than
# ``user_shards.MAX_USER_ROWS`` distinct keys is still refused, naming ``mechanism.kind``.


def distinct_key_rows(table, key_columns, mode="auto"):
    """(boolean mask of the rows kept, or None for all): one row (the first) per
    distinct (``__user``, ``__user_lo``, exact key) among the rows of user buckets with
    more than ``prereduce.AUTO_HEAVY_ROWS`` rows in the table, when that removes at least
    ``prereduce.MIN_REMOVED_ROWS`` rows ("auto"); of every row ("always"); none
    ("never"). Keys are compared on exact codes of the key columns, never on a hash."""
    n = table.num_rows
    if mode == "never" or n == 0:
        return None
    if mode == "always":
        rows = np.arange(n)
    else:
        from thresher.transforms.bounding.rand_clip_copies import _user_buckets
        bucket, counts = _user_buckets(table)
        heavy = counts > prereduce.AUTO_HEAVY_ROWS
        if int((counts[heavy] - 1).sum()) < prereduce.MIN_REMOVED_ROWS:
            return None
        rows = np.flatnonzero(heavy[bucket])
    part = table.take(pa.array(rows))
    from thresher.transforms.bounding.per_user_bound import exact_key_codes
    from thresher.transforms.bounding.user_shards import USER_COLUMN, USER_LOW_COLUMN
    words = part.column(USER_COLUMN).to_numpy()
    low = part.column(USER_LOW_COLUMN).to_numpy()
    keys = exact_key_codes(part, list(key_columns))
    order = np.lexsort((keys, low, words))     # stable: each pair's first row first
    w, lo, k = words[order], low[order], keys[order]
    first = np.empty(len(order), dtype=bool)
    first[0] = True
    first[1:] = (w[1:] != w[:-1]) | (lo[1:] != lo[:-1]) | (k[1:] != k[:-1])
    keep = np.ones(n, dtype=bool)
    keep[rows] = False
    keep[rows[order[first]]] = True
    return keep


class _DistinctPairsFn(_CoalescingFn):
    def __init__(self, key_columns, mode, coalesce_rows):
        super().__init__(mode, coalesce_rows)
        self._key_columns = tuple(key_columns)

    def _flush(self):
        tables, self._pending, self._pending_rows = self._pending, [], 0
        table = concat(tables)
        del tables   # the gathered batches go before the kernel runs (a copy is combined)
        if table is None:
            return
        mode = prereduce.MODE if self._mode is None else self._mode
        kept = distinct_key_rows(table, self._key_columns, mode)
        counter = beam.metrics.Metrics.counter
        counter(prereduce.NOT_PRIVATE, "rows_prereduced_in").inc(table.num_rows)
        if kept is not None and not kept.all():
            table = table.filter(pa.array(kept))
        counter(prereduce.NOT_PRIVATE, "rows_prereduced_out").inc(table.num_rows)
        if table.num_rows:
            yield table


class PreReduceDistinctPairs(beam.PTransform):
    """Prepared record batches -> tables of about ``COALESCE_ROWS`` rows, a heavy
    user's repeated (user, key) rows removed (:func:`distinct_key_rows`; the adaptive
    rounds' pre-reduction, comment above). No randomness is read; feed the result to
    ``ShardByUser(coalesce_rows=1)``."""

    def __init__(self, key_columns, mode=None, coalesce_rows=None, label=None):
        super().__init__(label)
        if mode is not None and mode not in prereduce.MODES:
            raise ValueError(f"mode must be one of {prereduce.MODES}, got {mode!r}")
        self._key_columns = tuple(key_columns)
        self._mode = mode
        self._coalesce_rows = COALESCE_ROWS if coalesce_rows is None else int(coalesce_rows)

    def expand(self, batches):
        return batches | "DistinctPairs" >> beam.ParDo(_DistinctPairsFn(
            self._key_columns, self._mode, self._coalesce_rows)).with_output_types(TABLE)


def distinct_pairs_for_rounds(records, key_columns, rng_factory):
    """(records through :class:`PreReduceDistinctPairs`, True) under the release's
    keyed secret; else (records, False): a test's seeded draws are consumed in row
    order, so the rows must stay as they are."""
    if not isinstance(keyed_random.resolve(rng_factory), keyed_random.KeyedSource):
        return records, False
    return records | "PreReduceDistinctPairs" >> PreReduceDistinctPairs(key_columns), True

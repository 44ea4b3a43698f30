"""Adaptive weighting over rounds: weighted Gaussian selections on the keys not yet released.

``mechanism.kind: adaptive`` (``accounting.adaptive``; docs/partition_selection.md,
"adaptive"). Round r runs the weighted Gaussian selection of
:mod:`transforms.selection.weighted_threshold` (Gopi et al., ICML 2020, Thm 5.1 on the integer
grid: ``WeightedPerUserBound`` then ``SumCountsPerKey``) on every user's records minus
the keys released in rounds < r; each user re-spreads a unit of l2 weight over at most C
of the keys they have left. A key is released in round r when its grid weight plus
N_Z(0, (sigma_r S)^2) reaches the round's integer threshold. The released keys then get
their noisy distinct-user count: each user keeps at most C_c = min(C,
count_keys_per_user) of their keys that were released (the l0 bound of
``per_user_bound``, fresh randomness), the counts are summed
and every released key (zero if no kept user holds it) gets N_Z(0, count_sigma^2).

Numpy kernels (one user shard or one key batch in, arrays out) beside the Beam
transforms. The released keys reach the next round as a side input (a list of key
tables, as large as the released set) matched on the key columns' values exactly (a
left-anti join for the rounds, the left-semi join of ``public_domain.restrict_to_domain``
for the count stage; never on the key hash ``__key``, which can collide): which of a
user's rows round r sees is a function of the user's own rows and of earlier rounds'
public output only, and the count stage counts only keys that were released.
"""
import functools
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding import user_shards
from thresher.transforms.bounding.per_user_bound import (
    PerUserBound, key_hash_is_exact, key_hash_known_exact, with_key_hash_exact)
from thresher.transforms.plumbing import spill
from thresher.transforms.plumbing.tables import KEY_HASH_COLUMN, concat
from thresher.transforms.selection.public_domain import restrict_to_domain, zero_counts
from thresher.transforms.selection.release_fn import KernelRelease
from thresher.transforms.selection.weighted_threshold import WEIGHT_COLUMN, WeightedPerUserBound


def released_keys(released_tables, key_columns):
    """The released keys as one table of the key columns, each key once, or None when no
    key was released (``released_tables``: the rounds' outputs, key columns first)."""
    tables = [t.select(list(key_columns)) for t in released_tables if t.num_rows]
    if not tables:
        return None
    keyed = pa.concat_tables(tables, promote_options="permissive").combine_chunks()
    return keyed.group_by(list(key_columns), use_threads=False).aggregate([])


def _matching_types(released, table, key_columns):
    """``released`` with its key columns cast to ``table``'s types (string vs
    large_string across stages); the join compares the values exactly."""
    target = pa.schema([table.schema.field(k) for k in key_columns])
    if released.schema.equals(target, check_metadata=False):
        return released
    return released.cast(target)


def rows_released(table, released, key_columns):
    """The rows of a user shard whose key values equal a released key (the count stage's
    input): the exact left-semi join of ``public_domain.restrict_to_domain``, on the key
    columns themselves, never on their hash (a key whose hash collides with a released
    key's is not released and must get no row)."""
    if released is None or table.num_rows == 0:
        return table.slice(0, 0)
    return restrict_to_domain(table, _matching_types(released, table, key_columns), key_columns)


def rows_not_released(table, released, key_columns):
    """The rows of a user shard whose key values equal no released key (a user's round-r
    input): exact left-anti join on the key columns."""
    if released is None or table.num_rows == 0:
        return table
    kept = table.join(_matching_types(released, table, key_columns).select(list(key_columns)),
                      keys=list(key_columns), join_type="left anti", use_threads=False)
    return kept.select(table.column_names).combine_chunks()


def select_keys(weights, *, sigma_grid, threshold_grid, rng):
    """The round's release rule: weights + N_Z(0, sigma_grid^2) >= threshold_grid."""
    weights = np.asarray(weights, dtype=np.int64)
    noisy = weights + samplers.discrete_gaussian(rng, sigma_grid, weights.size)
    return noisy >= int(threshold_grid)


def round_release_table(table, params, rng, round_index):
    """Keys + ``count`` + ``__w`` in; the keys round ``round_index`` (0-based) releases
    out (key columns only: the weight, its noise and the count are dropped)."""
    spec = params["rounds"][round_index]
    weights = table.column(WEIGHT_COLUMN).to_numpy(zero_copy_only=False)
    keep = select_keys(weights, sigma_grid=float(spec["sigma"]) * int(params["scale"]),
                       threshold_grid=int(spec["threshold_grid"]), rng=rng)
    return table.filter(pa.array(keep)).drop_columns([WEIGHT_COLUMN, "count"])


def noisy_counts_table(table, params, rng):
    """Released keys + their bounded ``count`` in; ``count`` + N_Z(0, count_sigma^2) out
    (every row: the keys are already public)."""
    counts = table.column("count").to_numpy(zero_copy_only=False).astype(np.int64)
    noisy = counts + samplers.discrete_gaussian(rng, float(params["count_sigma"]), counts.size)
    idx = table.schema.get_field_index("count")
    return table.set_column(idx, "count", pa.array(noisy, type=pa.int64()))


# ---------------------------------------------------------------------------------------
# Beam transforms.

class _FilterFn(beam.DoFn):
    """Keeps (count stage) or removes (rounds) the rows of released keys. The released
    keys (the side input, a list of tables) are concatenated and de-duplicated once per
    side-input value, not per element: memoised on the identity of the list object (the
    reference is held, so the identity cannot be reused while memoised)."""

    def __init__(self, key_columns, keep_released):
        self._key_columns = tuple(key_columns)
        self._keep_released = keep_released
        self._memo = None

    def setup(self):
        self._memo = None

    def _released(self, released):
        if self._memo is None or self._memo[0] is not released:
            self._memo = (released, released_keys(released, self._key_columns))
        return self._memo[1]

    def process(self, table, released):
        keys = self._released(released)
        out = (rows_released if self._keep_released else rows_not_released)(
            table, keys, self._key_columns)
        if out.num_rows:
            if key_hash_known_exact(table, self._key_columns):   # a row subset: still so
                out = with_key_hash_exact(out, self._key_columns)
            yield out


class RoundThreshold(KernelRelease):
    """One round's threshold over batches of per-key grid weights (key columns, ``count``,
    ``__w``): the released keys (key columns only). ``rng_factory``: its draws' source
    and stage label (``keyed_random.KeyedDraws``)."""

    stage_label = "RoundNoiseAndThreshold"

    def __init__(self, params, round_index, rng_factory=None, label=None):
        super().__init__(params, rng_factory=rng_factory, label=label)
        self._round_index = int(round_index)

    def expand(self, sums):
        from thresher.transforms.selection.release_fn import ReleaseBatchFn
        fn = functools.partial(round_release_table, round_index=self._round_index)
        return sums | self.stage_label >> keyed_random.par_do(
            ReleaseBatchFn(fn, *keyed_random.stage_of(self._rng_factory)),
            self._params).with_output_types(TABLE)


class NoisyCounts(KernelRelease):
    """Every row's ``count`` plus discrete Gaussian noise (the count stage)."""

    stage_label = "CountNoise"
    release_table = staticmethod(noisy_counts_table)


def counts_per_user(params):
    """C_c: how many released keys a user counts in, the calibrated section's
    ``count_stage.counts_per_user`` (the C_c the count noise was calibrated for). Fails
    closed: a section without it raises ValueError (no fallback to another bound)."""
    stage = params.get("count_stage") or {}
    value = stage.get("counts_per_user")
    if value is None or isinstance(value, bool) or int(value) != value or value < 1:
        raise ValueError("adaptive parameters: count_stage.counts_per_user must be the "
                         f"calibrated integer C_c >= 1 (the plan's report), got {value!r}")
    return int(value)


class ShardedUsers:
    """The user shuffle's grouped pieces (``ShardByUser.grouped``: (shard, [piece])),
    concatenated into whole-user tables afresh by each consumer (``ShardByUser.concat``)
    instead of once for all of them.

    Why (issue 43): the rounds and the count stage each read every user, and each after
    the previous round's released keys. Concatenated once, the whole-user tables (every
    distinct (user, key) pair of the input) were materialised between stages by the
    in-process runner and held until the count stage had read them: about 1.3 GB more
    peak memory than a fixed-bound count at 1e7 rows. With the shuffle spilled
    (``transforms.plumbing.spill``) the grouped pieces are file names, and each consumer
    holds one shard at a time. Every consumer reads the same pieces in the same order, so
    it gets the same tables as from one concatenation (same rounds, same bytes).
    ``after``: a side input (its value unused) every consumer's concatenation waits for
    (an automatic bound's choice); later consumers wait for the previous round instead."""

    #: False: one concatenation for every consumer, as before issue 43 (tests compare
    #: the two: the same released bytes).
    PER_CONSUMER = True

    def __init__(self, grouped, shard, after=None):
        self.grouped = grouped
        self.pipeline = grouped.pipeline
        self._shard = shard
        self._after = after
        self._once = None

    def users(self, label, after=None):
        """A fresh PCollection of whole-user tables, labelled ``label``, concatenated in
        the stage of its consumer (the one that reads ``after``)."""
        if not self.PER_CONSUMER:
            if self._once is None:
                self._once = self.grouped | "ConcatUserShard" >> self._shard.concat(
                    after=self._after)
            return self._once
        after = self._after if after is None else after
        return self.grouped | label >> self._shard.concat(after=after, fn=concat_shard)


# What the first consumer of a spilled user shard found, for the next ones in this
# process: (shard, its piece files) -> (exact_users left the table as it was, __key is
# one-to-one over the key columns). Spilled pieces are immutable files under fresh
# random names, so the pair names the shard's content; both facts are functions of it.
# A remembered fact is used only while every piece file is still the one it was found
# on (same device, inode, size and modification time, :func:`_pieces_identity`): a
# piece replaced or rewritten since makes the consumer check again.
_SHARD_FACTS = {}
_SHARD_FACTS_MAX = 4096


def _pieces_identity(shard, paths):
    """(shard, ((path, device, inode, size, mtime_ns), ...)) of spilled piece files, or
    None when one of them cannot be read (the consumer then checks for itself)."""
    try:
        stats = [os.stat(path) for path in paths]
    except OSError:
        return None
    return shard, tuple((path, st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
                        for path, st in zip(paths, stats))


def concat_shard(shard_and_tables, key_columns=None, after=None, max_user_rows=None,
                 setting=None):
    """``user_shards._concat_shard`` for the rounds, with two checks made once per
    spilled shard instead of once per consumer: ``exact_users``' collision sort and
    ``per_user_bound.key_hash_is_exact`` (the table comes out stamped
    ``with_key_hash_exact`` when it holds, so ``bound_table_l0`` skips it). The table
    is the one ``_concat_shard`` gives (same rows, columns and order)."""
    shard, tables = shard_and_tables
    tables = list(tables)
    ident = (_pieces_identity(shard, tables)
             if tables and all(isinstance(t, str) for t in tables) else None)
    known = _SHARD_FACTS.get(ident) if ident is not None else None
    if max_user_rows is not None:
        user_shards.check_user_rows(tables, max_user_rows, setting)
    table = concat([spill.read_piece(t) if isinstance(t, str) else t for t in tables])
    if table is None:
        return
    users_as_read = known[0] if known is not None else None
    if not users_as_read:
        exact = user_shards.exact_users(table)
        users_as_read, table = exact is table, exact
    if key_columns is not None and KEY_HASH_COLUMN not in table.column_names:
        table = user_shards.with_key_hash(table, key_columns)
    key_exact = None
    if key_columns is not None:
        key_exact = known[1] if known is not None else key_hash_is_exact(table, key_columns)
        if key_exact:
            table = with_key_hash_exact(table, key_columns)
    if ident is not None and known is None:
        if len(_SHARD_FACTS) >= _SHARD_FACTS_MAX:
            _SHARD_FACTS.clear()
        _SHARD_FACTS[ident] = (users_as_read, key_exact)
    yield table


def _users_for(users, name, after=None):
    """The whole-user tables round or stage ``name`` reads: ``users`` itself, or a fresh
    concatenation of :class:`ShardedUsers` waiting for ``after``."""
    if isinstance(users, ShardedUsers):
        return users.users(f"{name}Users", after)
    return users


class AdaptiveRelease(beam.PTransform):
    """Whole-user shards -> released keys with noisy counts (the ``adaptive`` kind).
    The input is a PCollection of whole-user tables, or (:meth:`apply`)
    :class:`ShardedUsers` (each round and the count stage then concatenate the shuffled
    pieces themselves).

    ``params``: the kind's report section (``rounds`` list of {sigma, threshold_grid},
    ``scale``, ``count_sigma``) as a dict or an ``AsSingleton`` side input;
    ``max_keys_per_user``: an int or a side input; the count stage bounds each user to
    ``counts_per_user`` of its released keys (a side input when either is). Output: tables of the key columns and
    int64 ``count``, each released key once. ``spill_dir``: passed to every
    ``SumCountsPerKey`` (the per-key shuffles' spill folder, in-process runner only)."""

    def __init__(self, key_columns, params, max_keys_per_user, num_rounds, num_shards,
                 rng_factory=None, label=None, spill_dir=None):
        super().__init__(label)
        self._keys = tuple(key_columns)
        self._params = params
        self._bound = max_keys_per_user
        self._rounds = int(num_rounds)
        self._num_shards = int(num_shards)
        self._rng_factory = rng_factory
        self._spill_dir = spill_dir
        self._sharded = None

    @classmethod
    def apply(cls, users, label, *args, **kwargs):
        """``users | label >> AdaptiveRelease(*args, **kwargs)``, where ``users`` may be
        :class:`ShardedUsers` (then applied to its grouped pieces)."""
        transform = cls(*args, **kwargs)
        if isinstance(users, ShardedUsers):
            transform._sharded = users
            users = users.grouped
        return users | label >> transform

    def _draws(self, name):
        """The draws of this release's stage ``name`` (its label path below this one's)."""
        return keyed_random.child(self._rng_factory, name)

    def _count_bound(self, pipeline):
        """C_c as an int, or as an AsSingleton when the params or the bound are side inputs."""
        params, bound = self._params, self._bound
        if isinstance(params, dict) and isinstance(bound, int):
            return counts_per_user(params)
        params_pc = (params.pvalue if isinstance(params, beam.pvalue.AsSingleton)
                     else pipeline | "CountParams" >> beam.Create([params]))
        return beam.pvalue.AsSingleton(
            params_pc | "CountKeysPerUser" >> beam.Map(counts_per_user))

    def expand(self, users):
        keys = list(self._keys)
        if self._sharded is not None:      # applied to its grouped pieces
            users = self._sharded
        released = []
        for r in range(self._rounds):
            name = f"Round{r + 1}"
            if released:
                so_far = (released[0] if len(released) == 1 else
                          tuple(released) | f"ReleasedBefore{name}" >> beam.Flatten())
                before = _users_for(users, name, beam.pvalue.AsList(so_far))
                remaining = before | f"{name}RemoveReleased" >> beam.ParDo(
                    _FilterFn(keys, keep_released=False),
                    beam.pvalue.AsList(so_far)).with_output_types(TABLE)
            else:
                remaining = _users_for(users, name)
            sums = (remaining
                    | f"{name}Bound" >> WeightedPerUserBound(
                        keys, self._bound, rng_factory=self._draws(f"{name}Bound"))
                    | f"{name}SumPerKey" >> SumCountsPerKey(keys, self._num_shards,
                                                               spill_dir=self._spill_dir))
            released.append(sums | f"{name}Threshold" >> RoundThreshold(
                self._params, r, rng_factory=self._draws(f"{name}Threshold")))
        every = tuple(released) | "ReleasedKeys" >> beam.Flatten()
        users_now = _users_for(users, "Count", beam.pvalue.AsList(every))
        kept = users_now | "CountKeepReleased" >> beam.ParDo(
            _FilterFn(keys, keep_released=True), beam.pvalue.AsList(every)
        ).with_output_types(TABLE)
        partial = kept | "CountBound" >> PerUserBound(keys, self._count_bound(users.pipeline),
                                                      rng_factory=self._draws("CountBound"))
        zeros = every | "CountZeros" >> beam.Map(zero_counts, key_columns=keys
                                                 ).with_output_types(TABLE)
        counts = ((partial, zeros)
                  | "CountPieces" >> beam.Flatten()
                  | "CountSumPerKey" >> SumCountsPerKey(keys, self._num_shards,
                                                               spill_dir=self._spill_dir))
        return counts | "CountNoise" >> NoisyCounts(self._params,
                                                  rng_factory=self._draws("CountNoise"))

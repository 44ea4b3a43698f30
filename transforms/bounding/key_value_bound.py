"""One value per (user, key), at most C keys per user: the bounding of per-key quantiles
over a public cell domain (``transforms.trees.public_cells``).

Paper 002 Sec. 3 / paper 004 Sec. 2 bound a user to C keys with l_inf = 1. For per-key
quantiles the "contribution" to key k is a value; keeping one value per (user, key) and
at most C keys makes every level of the per-key hierarchy move by at most 1 in at most C
cells when one user is added or removed (one bucket per kept key), so the L levels are
C L unit shifts (``accounting.known_domain.gaussian_delta`` with count C L).

Choice (depends only on the user's own records and the release's keyed randomness, as
``transforms.bounding.per_user_bound``): each distinct (user, key, value) gets a uniform 64-bit
priority and the user keeps, per key, its value of smallest priority (a uniform draw
among the user's distinct values for that key); each kept (user, key) then gets a
second priority and the user keeps its C keys of smallest priority (a uniform C-subset
of the user's keys). Exact codes group the rows (no hash collisions can merge keys).
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding.per_user_bound import count_per_key, exact_key_codes
from thresher.transforms.bounding.user_shards import USER_COLUMN, user_identity_columns


def _first_per_group(groups, priorities):
    """Index (into the arrays) of the smallest priority in each group."""
    order = np.lexsort((priorities, groups))
    g = groups[order]
    start = np.ones(len(g), dtype=bool)
    start[1:] = g[1:] != g[:-1]
    return order[start]


def bound_key_values(table, key_columns, value_column, max_keys_per_user, value_rng, key_rng):
    """Row indices of a user-sharded table kept: one row per kept (user, key) holding a
    uniformly drawn value of that user for that key, at most ``max_keys_per_user`` keys
    per user. ``value_rng`` / ``key_rng``: two independent sources (keyed stage sources
    in a release; seeded generators in tests)."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    keys = list(key_columns)
    triple = exact_key_codes(table, [USER_COLUMN, *keys, value_column])
    _, rows = np.unique(triple, return_index=True)       # one row per distinct (user, key, value)
    # streams keyed by the user's identity words, never the in-shard grouping code that
    # exact_users may have put in __user (it depends on the other users of the shard)
    users = (user_identity_columns(table)       # a release's keyed sources
             if isinstance(value_rng, keyed_random.StageSource)
             or isinstance(key_rng, keyed_random.StageSource) else [USER_COLUMN])
    value_rng = keyed_random.bind(value_rng, table, triple=[*users, *keys, value_column])
    prio = samplers.uniform_priorities(keyed_random.rows_of(value_rng, rows, "triple"), len(rows))
    pair = exact_key_codes(table, [USER_COLUMN, *keys])
    rows = rows[_first_per_group(pair[rows], prio)]       # one value per (user, key)
    key_rng = keyed_random.bind(key_rng, table, pair=[*users, *keys])
    prio = samplers.uniform_priorities(keyed_random.rows_of(key_rng, rows, "pair"), len(rows))
    user = exact_key_codes(table, [USER_COLUMN])[rows]
    order = np.lexsort((prio, user))
    u = user[order]
    start = np.ones(len(u), dtype=bool)
    start[1:] = u[1:] != u[:-1]
    position = np.arange(len(u))
    rank_in_user = position - np.maximum.accumulate(np.where(start, position, 0))
    return np.sort(rows[order[rank_in_user < int(max_keys_per_user)]])


class _BoundFn(beam.DoFn):
    def __init__(self, key_columns, value_column, max_keys_per_user, rng_factory, stage):
        self._keys = tuple(key_columns)
        self._column = value_column
        self._bound = int(max_keys_per_user)
        self._rng_factory = rng_factory
        self._stage = stage

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table):
        value_rng = keyed_random.stage_source(self._rng_factory, self._rng, self._stage + "/value")
        key_rng = keyed_random.stage_source(self._rng_factory, self._rng, self._stage + "/keys")
        kept = bound_key_values(table, self._keys, self._column, self._bound, value_rng, key_rng)
        beam.metrics.Metrics.counter("thresher_not_private", "contributions_kept").inc(len(kept))
        if len(kept):
            yield count_per_key(table.take(pa.array(kept)), (*self._keys, self._column))


class BoundKeyValues(beam.PTransform):
    """User-sharded record tables (key columns, the value column, ``__key`` hashed over
    both) -> partial counts (keys, value, ``__key``, ``count``): distinct users per
    (key, value) after keeping one value per (user, key) and at most C keys per user."""

    def __init__(self, key_columns, value_column, max_keys_per_user, rng_factory=None,
                 label=None):
        super().__init__(label)
        self._keys = tuple(key_columns)
        self._column = value_column
        self._bound = int(max_keys_per_user)
        self._rng_factory = rng_factory

    def expand(self, user_shards):
        return user_shards | "OneValuePerKey" >> keyed_random.par_do(_BoundFn(
            self._keys, self._column, self._bound, *keyed_random.stage_of(self._rng_factory))).with_output_types(TABLE)

"""Weighted Gaussian partition selection (Gopi et al., ICML 2020, Thm 5.1) on the integer grid.

Two steps, each a numpy kernel beside its Beam transform:

1. :class:`WeightedPerUserBound` — the l0 bound of :mod:`transforms.bounding.per_user_bound`
   (each user keeps at most Delta0 of their distinct keys, uniformly at random, through
   the same kernel), then every kept (user, key) carries the user's integer weight
   q_t = floor(S / sqrt(t)), t the user's number of kept keys
   (``accounting.weighted_gaussian.grid_weight``). Per shard of whole users the output
   is one row per key: ``count`` (kept users) and ``__w`` (their summed weights, int64).
   With ``count_keys_per_user`` = C_c, a user counts in ``count`` for only C_c of its
   kept keys (the same l0 kernel applied to its kept rows at C_c: a uniformly random
   C_c of them) while its weight goes to all of them.
   ``transforms.plumbing.aggregate.SumCountsPerKey`` then sums both columns across shards.
2. :class:`WeightedThreshold` — per key, draws Z ~ N_Z(0, (sigma S)^2) and releases the
   key when __w + Z >= T (grid threshold); every released key's ``count`` gets an
   independent N_Z(0, count_sigma^2). Only the key and the noisy count are published;
   the weight and its noise are dropped.

The accounting of exactly these draws is ``accounting.weighted_gaussian``
(docs/partition_selection.md).
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.accounting.weighted_gaussian import grid_weight
from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding.per_user_bound import bound_table_l0
from thresher.transforms.selection.release_fn import KernelRelease
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN

WEIGHT_COLUMN = "__w"
_COUNTED_COLUMN = "__c"   # 1 where the kept row also counts in ``count``


def user_weights(user_ids, scale):
    """Per row, q_t of the row's user, t the user's number of rows (each row one kept
    distinct key): int64 array aligned with ``user_ids``."""
    user_ids = np.asarray(user_ids)
    if user_ids.size == 0:
        return np.zeros(0, dtype=np.int64)
    _, inverse, counts = np.unique(user_ids, return_inverse=True, return_counts=True)
    return grid_weight(counts, scale)[inverse.reshape(-1)].astype(np.int64)


def weighted_counts(table, key_columns, max_keys_per_user, rng, scale,
                    count_keys_per_user=None):
    """One shard of whole users -> (key columns, __key, count, __w): the l0 bound of
    ``per_user_bound.bound_table_l0``, then per key the number of kept users and the sum
    of their grid weights. With ``count_keys_per_user`` C_c, ``count`` has each user in
    at most C_c of its kept keys (``bound_table_l0`` again on the kept rows at C_c).
    None if nothing is kept."""
    kept = bound_table_l0(table, key_columns, int(max_keys_per_user), rng)
    if len(kept) == 0:
        return None
    rows = table.take(pa.array(kept))
    weights = user_weights(rows.column(USER_COLUMN).to_numpy(), scale)
    counted = np.ones(len(kept), dtype=np.int64)
    if count_keys_per_user is not None and int(count_keys_per_user) < int(max_keys_per_user):
        counted[:] = 0
        counted[bound_table_l0(rows, key_columns, int(count_keys_per_user), rng)] = 1
    group = list(key_columns) + [KEY_HASH_COLUMN]
    rows = rows.select(group).append_column(WEIGHT_COLUMN, pa.array(weights, type=pa.int64()))
    rows = rows.append_column(_COUNTED_COLUMN, pa.array(counted, type=pa.int64()))
    grouped = rows.group_by(group, use_threads=False).aggregate(
        [(_COUNTED_COLUMN, "sum"), (WEIGHT_COLUMN, "sum")])
    # aggregate() puts the aggregates first, then the group keys
    grouped = grouped.select([f"{_COUNTED_COLUMN}_sum", f"{WEIGHT_COLUMN}_sum"] + group)
    grouped = grouped.rename_columns(["count", WEIGHT_COLUMN] + group)
    return grouped.select(group + ["count", WEIGHT_COLUMN]).combine_chunks()


class _WeightedBoundFn(beam.DoFn):
    def __init__(self, key_columns, scale, rng_factory, stage="", count_keys_per_user=None):
        self._key_columns = tuple(key_columns)
        self._scale = int(scale)
        self._rng_factory = rng_factory
        self._stage = stage
        self._count_keys_per_user = count_keys_per_user

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table, max_keys_per_user):
        # keyed per-user streams (transforms.randomness.keyed_random): a recomputed shard keeps the
        # same keys, as in per_user_bound._BoundL0Fn
        rng = keyed_random.stage_source(self._rng_factory, self._rng, self._stage)
        out = weighted_counts(table, self._key_columns, max_keys_per_user, rng,
                              self._scale, self._count_keys_per_user)
        beam.metrics.Metrics.counter("thresher_not_private", "rows_bounded").inc(table.num_rows)
        if out is not None:
            beam.metrics.Metrics.counter("thresher_not_private", "contributions_kept").inc(
                int(np.asarray(out.column("count")).sum()))   # those counted
            yield out


class WeightedPerUserBound(beam.PTransform):
    """l0 bounding of user-sharded record tables with per-user grid weights.

    Input: PCollection[pyarrow.Table] from ``ShardByUser`` (whole users per element).
    Output: PCollection[pyarrow.Table] of partial sums — key columns, ``__key``, int64
    ``count`` and int64 ``__w``. ``max_keys_per_user`` is an int or a side input;
    ``count_keys_per_user`` (an int, or None for all kept keys) caps the keys a user
    counts in."""

    def __init__(self, key_columns, max_keys_per_user, rng_factory=None, label=None,
                 scale=None, count_keys_per_user=None):
        super().__init__(label)
        from thresher.accounting.weighted_gaussian import WEIGHT_SCALE
        self._key_columns = tuple(key_columns)
        self._max_keys_per_user = max_keys_per_user
        self._rng_factory = rng_factory
        self._scale = WEIGHT_SCALE if scale is None else int(scale)
        self._count_keys_per_user = (None if count_keys_per_user is None
                                     else int(count_keys_per_user))

    def expand(self, user_shards):
        return user_shards | "BoundL0Weighted" >> keyed_random.par_do(
            _WeightedBoundFn(self._key_columns, self._scale,
                             *keyed_random.stage_of(self._rng_factory),
                             self._count_keys_per_user),
            self._max_keys_per_user).with_output_types(TABLE)


def weighted_threshold(counts, weights, *, sigma_grid, threshold_grid, count_sigma, rng):
    """The release rule: keep keys with weights + N_Z(0, sigma_grid^2) >= threshold_grid;
    returns (keep mask, int64 noisy counts: counts + N_Z(0, count_sigma^2) where kept,
    0 elsewhere so no true count leaks by accident)."""
    counts = np.asarray(counts, dtype=np.int64)
    weights = np.asarray(weights, dtype=np.int64)
    if counts.shape != weights.shape:
        raise ValueError("counts and weights must have the same shape")
    noisy = weights + samplers.discrete_gaussian(rng, sigma_grid, weights.size)
    keep = noisy >= int(threshold_grid)
    values = np.zeros(counts.size, dtype=np.int64)
    n = int(keep.sum())
    if n:
        values[keep] = counts[keep] + samplers.discrete_gaussian(
            samplers.take(rng, keep), count_sigma, n)   # the kept keys' own streams
    return keep, values


def kernel_arguments(params):
    """From a mechanism's report section: sigma (weight units) * scale, the grid
    threshold, and the count's sigma."""
    return {"sigma_grid": float(params["sigma"]) * int(params["scale"]),
            "threshold_grid": int(params["threshold_grid"]),
            "count_sigma": float(params["count_sigma"])}


def release_table(table, params, rng):
    """Keys + ``count`` + ``__w`` in; released keys with the noisy ``count`` out."""
    counts = table.column("count").to_numpy(zero_copy_only=False)
    weights = table.column(WEIGHT_COLUMN).to_numpy(zero_copy_only=False)
    keep, values = weighted_threshold(counts, weights, rng=rng, **kernel_arguments(params))
    released = table.filter(pa.array(keep)).drop_columns([WEIGHT_COLUMN])
    idx = released.schema.get_field_index("count")
    return released.set_column(idx, "count", pa.array(values[keep], type=pa.int64()))


class WeightedThreshold(KernelRelease):
    """Weighted Gaussian selection and noisy counts over batches of per-key sums
    (key columns, int64 ``count`` and ``__w``; keys unique across the collection)."""

    stage_label = "WeightedNoiseAndThreshold"
    release_table = staticmethod(release_table)

"""Adaptive weighting over rounds: weighted Gaussian selections on the keys not yet released.

``mechanism.kind: adaptive`` (``accounting.adaptive``; docs/partition_selection.md,
"adaptive"). Round r runs the weighted Gaussian selection of
:mod:`transforms.weighted_threshold` (Gopi et al., ICML 2020, Thm 5.1 on the integer
grid: ``WeightedPerUserBound`` then ``SumCountsPerKey``) on every user's records minus
the keys released in rounds < r; each user re-spreads a unit of l2 weight over at most C
of the keys they have left. A key is released in round r when its grid weight plus
N_Z(0, (sigma_r S)^2) reaches the round's integer threshold. The released keys then get
their noisy distinct-user count: each user keeps at most C of their keys that were
released (the l0 bound of ``per_user_bound``, fresh randomness), the counts are summed
and every released key (zero if no kept user holds it) gets N_Z(0, count_sigma^2).

Numpy kernels (one user shard or one key batch in, arrays out) beside the Beam
transforms. The released keys reach the next round as a side input (a list of key
tables, as large as the released set) matched on the key hash ``__key`` (the reader's
``transforms.hashing.hash_columns`` of the key columns): which of a user's rows round r
sees is a function of the user's own rows and of earlier rounds' public output only.
"""
import functools

import apache_beam as beam
import numpy as np
import pyarrow as pa

from transforms import keyed_random, samplers
from transforms.aggregate import SumCountsPerKey
from transforms.arrow_coder import TABLE
from transforms.hashing import hash_columns
from transforms.per_user_bound import PerUserBound
from transforms.release_fn import KernelRelease
from transforms.user_shards import KEY_HASH_COLUMN, concat
from transforms.weighted_threshold import WEIGHT_COLUMN, WeightedPerUserBound


def released_hashes(released_tables, key_columns):
    """Sorted unique uint64 key hashes of the released keys (tables of key columns)."""
    tables = [t for t in released_tables if t.num_rows]
    if not tables:
        return np.zeros(0, dtype=np.uint64)
    return np.unique(np.concatenate([hash_columns(t, list(key_columns)) for t in tables]))


def released_mask(table, hashes):
    """Per row of a user shard: is its key (``__key``) among ``hashes`` (sorted)?"""
    keys = table.column(KEY_HASH_COLUMN).to_numpy()
    if len(hashes) == 0:
        return np.zeros(len(keys), dtype=bool)
    pos = np.minimum(np.searchsorted(hashes, keys), len(hashes) - 1)
    return hashes[pos] == keys


def rows_not_released(table, hashes):
    """The rows of a user shard whose key was not released (a user's round-r input)."""
    mask = released_mask(table, hashes)
    return table if not mask.any() else table.filter(pa.array(~mask))


def rows_released(table, hashes):
    """The rows of a user shard whose key was released (the count stage's input)."""
    return table.filter(pa.array(released_mask(table, hashes)))


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


def zero_counts_table(released, key_columns):
    """Released keys as zero partial counts (key columns, ``__key``, ``count`` = 0)."""
    keyed = released.select(list(key_columns)).combine_chunks()
    return keyed.append_column(
        KEY_HASH_COLUMN, pa.array(hash_columns(keyed, list(key_columns)), type=pa.uint64())
    ).append_column("count", pa.array(np.zeros(keyed.num_rows, dtype=np.int64)))


# ---------------------------------------------------------------------------------------
# Beam transforms.

class _FilterFn(beam.DoFn):
    def __init__(self, key_columns, keep_released):
        self._key_columns = tuple(key_columns)
        self._keep_released = keep_released

    def process(self, table, released):
        hashes = released_hashes(released, self._key_columns)
        out = (rows_released if self._keep_released else rows_not_released)(table, hashes)
        if out.num_rows:
            yield out


class RoundThreshold(KernelRelease):
    """One round's threshold over batches of per-key grid weights (key columns, ``count``,
    ``__w``): the released keys (key columns only). Its label is the draws' stage."""

    stage_label = "RoundNoiseAndThreshold"

    def __init__(self, params, round_index, rng_factory=None, label=None):
        super().__init__(params, rng_factory=rng_factory, label=label)
        self._round_index = int(round_index)

    def expand(self, sums):
        from transforms.release_fn import ReleaseBatchFn
        stage = keyed_random.stage_name(sums)
        fn = functools.partial(round_release_table, round_index=self._round_index)
        return sums | self.stage_label >> beam.ParDo(
            ReleaseBatchFn(fn, keyed_random.resolve(self._rng_factory), stage),
            self._params).with_output_types(TABLE)


class NoisyCounts(KernelRelease):
    """Every row's ``count`` plus discrete Gaussian noise (the count stage)."""

    stage_label = "CountNoise"
    release_table = staticmethod(noisy_counts_table)


class AdaptiveRelease(beam.PTransform):
    """Whole-user shards -> released keys with noisy counts (the ``adaptive`` kind).

    ``params``: the kind's report section (``rounds`` list of {sigma, threshold_grid},
    ``scale``, ``count_sigma``) as a dict or an ``AsSingleton`` side input;
    ``max_keys_per_user``: an int or a side input. Output: tables of the key columns and
    int64 ``count``, each released key once."""

    def __init__(self, key_columns, params, max_keys_per_user, num_rounds, num_shards,
                 rng_factory=None, label=None):
        super().__init__(label)
        self._keys = tuple(key_columns)
        self._params = params
        self._bound = max_keys_per_user
        self._rounds = int(num_rounds)
        self._num_shards = int(num_shards)
        self._rng_factory = rng_factory

    def expand(self, users):
        keys = list(self._keys)
        released = []
        for r in range(self._rounds):
            name = f"Round{r + 1}"
            if released:
                so_far = (released[0] if len(released) == 1 else
                          tuple(released) | f"ReleasedBefore{name}" >> beam.Flatten())
                remaining = users | f"{name}RemoveReleased" >> beam.ParDo(
                    _FilterFn(keys, keep_released=False),
                    beam.pvalue.AsList(so_far)).with_output_types(TABLE)
            else:
                remaining = users
            sums = (remaining
                    | f"{name}Bound" >> WeightedPerUserBound(keys, self._bound,
                                                             rng_factory=self._rng_factory)
                    | f"{name}SumPerKey" >> SumCountsPerKey(keys, self._num_shards))
            released.append(sums | f"{name}Threshold" >> RoundThreshold(
                self._params, r, rng_factory=self._rng_factory))
        every = tuple(released) | "ReleasedKeys" >> beam.Flatten()
        kept = users | "CountKeepReleased" >> beam.ParDo(
            _FilterFn(keys, keep_released=True), beam.pvalue.AsList(every)
        ).with_output_types(TABLE)
        partial = kept | "CountBound" >> PerUserBound(keys, self._bound,
                                                      rng_factory=self._rng_factory)
        zeros = every | "CountZeros" >> beam.Map(zero_counts_table, key_columns=keys
                                                 ).with_output_types(TABLE)
        counts = ((partial, zeros)
                  | "CountPieces" >> beam.Flatten()
                  | "CountSumPerKey" >> SumCountsPerKey(keys, self._num_shards))
        return counts | "CountNoise" >> NoisyCounts(self._params, rng_factory=self._rng_factory)

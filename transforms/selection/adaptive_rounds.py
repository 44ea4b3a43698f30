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

import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding.per_user_bound import PerUserBound
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


class AdaptiveRelease(beam.PTransform):
    """Whole-user shards -> released keys with noisy counts (the ``adaptive`` kind).

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
                    | f"{name}Bound" >> WeightedPerUserBound(
                        keys, self._bound, rng_factory=self._draws(f"{name}Bound"))
                    | f"{name}SumPerKey" >> SumCountsPerKey(keys, self._num_shards,
                                                               spill_dir=self._spill_dir))
            released.append(sums | f"{name}Threshold" >> RoundThreshold(
                self._params, r, rng_factory=self._draws(f"{name}Threshold")))
        every = tuple(released) | "ReleasedKeys" >> beam.Flatten()
        kept = users | "CountKeepReleased" >> beam.ParDo(
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

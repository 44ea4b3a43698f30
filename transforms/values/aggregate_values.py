"""Per-key clamped sums on a fixed-point grid, and their noisy release beside the count.

Kernels (numpy / Arrow, no Beam):

* :func:`prepare_values` -- a record column as float64 with NaN, +-inf and null (and, for
  text input, anything that is not a number) as null: dropped values, counted.
* :func:`bound_with_values` -- per user shard: each user's *total* per key (the sum of
  their non-null values, 0 if none), the l0 bound (``transforms.bounding.per_user_bound.bound_table_l0``:
  at most C keys per user, uniformly at random), each kept total clamped and put on its
  grid (``accounting.aggregates.FixedPointGrid``), then per key: ``count`` (users) and one
  int64 grid sum per sum column. The grid values of one user lie in [-D_g, D_g], D_g <=
  2**GRID_BITS, and a key has at most MAX_USERS users, so no int64 sum can overflow.
* :func:`release_with_aggregates` -- the count is released as the kind does (GSHM /
  Laplace thresholding, or every public key with noise), then every released key's grid
  sums get integer noise from the CSPRNG samplers and become the output columns
  (``pipelines.specs.aggregates``: sum = (grid sum + noise) / g; mean = clamp(sum / count,
  low, high), null if count <= 0).
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding.per_user_bound import bound_table_l0
from thresher.transforms.selection.release_fn import KernelRelease
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, user_columns
from thresher.transforms.plumbing.exact_sums import exact_sums, pair_groups

NOT_PRIVATE = "thresher_not_private"
# Staged (never published) noisy sums behind a variance / stddev, for its interval.
NOISY_SUM_PREFIX = "__ns"
# |noise| above this would risk int64 overflow when added to a grid sum (|sum| <= 2**62);
# a draw this large has probability far below 2**-1000 at any allowed sigma or scale.
_NOISE_LIMIT = 1 << 62


def prepare_values(column, as_text=False):
    """(float64 pyarrow array with null for dropped values, number dropped)."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(column.type.value_type)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks()
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        try:
            values = pc.cast(column, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            values = pa.array([_to_float(v) for v in column.to_pylist()], type=pa.float64())
    elif pa.types.is_integer(column.type) or pa.types.is_floating(column.type) \
            or pa.types.is_boolean(column.type) or pa.types.is_decimal(column.type):
        # Values are carried as float64: an integer beyond 2^53 (e.g. int64's maximum,
        # issue 30 D3) becomes the nearest float64 (safe=False: Arrow's safe cast refuses
        # it), a relative change < 2^-53 before the clip to [low, high] bounds it anyway.
        values = pc.cast(column, pa.float64(), safe=False)
    elif pa.types.is_null(column.type):
        values = pa.nulls(len(column), type=pa.float64())
    else:
        raise TypeError(f"not a numeric column: {column.type}")
    x = values.to_numpy(zero_copy_only=False)
    ok = np.isfinite(x)  # null became NaN in to_numpy
    dropped = int(len(x) - ok.sum())
    return pa.array(np.where(ok, x, 0.0), type=pa.float64(), mask=~ok), dropped


def _to_float(text):
    if text is None:
        return None
    try:
        return float(text)
    except ValueError:
        return None


def user_key_totals(table, key_columns, value_names):
    """One row per (user, key): key columns, the user columns (``__user`` and the
    identity words, ``transforms.bounding.user_shards.user_columns``: the bounding after it keys
    each user's streams by them), __key and each value column's total (the exact sum of
    the user's non-null values for the key, rounded once to float64; 0 if none:
    :mod:`transforms.plumbing.exact_sums`).

    The total is a function of the multiset of the values only: the order of a user's
    records in a user shard depends on how the runner grouped them (issue 25, F2:
    ``clip: auto`` compares these totals with the candidates, and the release sums them),
    and a heavy user's rows may arrive as per-table partial totals
    (``transforms.bounding.prereduce.aggregate_partials``: exact expansions, issue 43).
    Before issue 43 the total was the float64 sum in ascending order; the two differ in
    the last bits for some inputs (published bytes can change by a grid unit there)."""
    group = [*user_columns(table), KEY_HASH_COLUMN, *key_columns]
    rows, groups = pair_groups(table, group)
    out = groups.select(group)
    for name in value_names:
        values = table.column(name)
        values = (values.combine_chunks() if values.num_chunks != 1 else values.chunk(0))
        x = values.to_numpy(zero_copy_only=False)
        if values.null_count:
            x = np.where(values.is_valid().to_numpy(zero_copy_only=False), x, 0.0)
        out = out.append_column(name, pa.array(exact_sums(x, rows, out.num_rows),
                                               type=pa.float64()))
    return out.combine_chunks()




def bound_with_values(table, key_columns, sum_columns, max_keys_per_user, rng):
    """Per-key partial counts and grid sums of one user shard (whole users).

    sum_columns: [(value column name, FixedPointGrid)], one per sum column i; the output
    has the key columns, __key, int64 ``count`` and int64 ``__s<i>``."""
    value_names = sorted({v for v, _ in sum_columns})
    totals = user_key_totals(table, key_columns, value_names)
    kept = bound_table_l0(totals, key_columns, int(max_keys_per_user), rng)
    kept_rows = totals.take(pa.array(kept))
    cols = {k: kept_rows.column(k) for k in (*key_columns, KEY_HASH_COLUMN)}
    cols["count"] = pa.array(np.ones(len(kept), dtype=np.int64))
    for i, (name, grid) in enumerate(sum_columns):
        t = kept_rows.column(name).to_numpy(zero_copy_only=False)
        cols[f"__s{i}"] = pa.array(grid.to_units(t), type=pa.int64())
    rows = pa.table(cols)
    group = [*key_columns, KEY_HASH_COLUMN]
    sums = [c for c in rows.column_names if c not in group]
    out = rows.group_by(group, use_threads=False).aggregate([(c, "sum") for c in sums])
    return out.rename_columns(group + sums).combine_chunks(), len(kept)


class _BoundWithValuesFn(beam.DoFn):
    def __init__(self, key_columns, sum_columns, rng_factory, stage=""):
        self._keys = tuple(key_columns)
        self._sums = list(sum_columns)
        self._rng_factory = rng_factory
        self._stage = stage

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table, max_keys_per_user, clips=None):
        sums = self._sums
        if clips:   # clip: auto -- [0, chosen bound] for those sum columns
            from thresher.accounting.aggregates import fixed_point_grid
            sums = [(name, fixed_point_grid(0.0, clips[i]) if i in clips else grid)
                    for i, (name, grid) in enumerate(sums)]
        rng = keyed_random.stage_source(self._rng_factory, self._rng, self._stage)
        out, kept = bound_with_values(table, self._keys, sums, max_keys_per_user, rng)
        beam.metrics.Metrics.counter(NOT_PRIVATE, "contributions_kept").inc(kept)
        beam.metrics.Metrics.counter(NOT_PRIVATE, "rows_bounded").inc(table.num_rows)
        if out.num_rows:
            yield out


class PerUserBoundWithValues(beam.PTransform):
    """:class:`transforms.bounding.per_user_bound.PerUserBound` that also carries each kept user's
    clamped grid totals: user shards -> partial (key columns, __key, count, __s<i>)."""

    def __init__(self, key_columns, max_keys_per_user, sum_columns, rng_factory=None, label=None,
                 clips=None):
        super().__init__(label)
        self._clips = clips   # side input {sum index: upper bound} of clip: auto, or None
        self._keys = tuple(key_columns)
        self._bound = max_keys_per_user
        self._sums = list(sum_columns)
        self._rng_factory = rng_factory

    def expand(self, user_shards):
        extra = () if self._clips is None else (self._clips,)
        return user_shards | "BoundL0WithValues" >> keyed_random.par_do(
            _BoundWithValuesFn(self._keys, self._sums, *keyed_random.stage_of(self._rng_factory)), self._bound, *extra
        ).with_output_types(TABLE)


def zero_sums(table, num_sums):
    """Public-domain zero counts with zero grid sums (so every domain key has the columns)."""
    for i in range(num_sums):
        table = table.append_column(f"__s{i}", pa.array(np.zeros(table.num_rows, dtype=np.int64)))
    return table


# ---------------------------------------------------------------------------------------
# Release.


def sum_noise(rng, entry, size):
    """Integer noise for one sum column, from the CSPRNG samplers (grid units)."""
    if entry["noise"] == "discrete_gaussian":
        draws = samplers.discrete_gaussian(rng, float(entry["sigma_grid_units"]), size)
    elif entry["noise"] == "discrete_laplace":
        draws = samplers.discrete_laplace(rng, float(entry["scale_grid_units"]), size)
    else:
        raise ValueError(f"unknown sum noise {entry['noise']!r}")
    draws = np.asarray(draws, dtype=np.int64)
    if draws.size and int(np.abs(draws).max()) >= _NOISE_LIMIT:
        raise OverflowError("a sum noise draw exceeded 2**62; refusing to publish")
    return draws


def noisy_outputs(counts, grid_sums, params, rng):
    """Released aggregate columns for released keys.

    counts: int64 noisy counts; grid_sums: {sum index: int64 true grid sums}. Returns
    {output name: float64 array (NaN where null)}."""
    counts = np.asarray(counts, dtype=np.int64)
    entries = params["aggregates"]
    noisy = {}
    # Each sum column's noise is drawn once, in the order the entries first name it (a
    # variance's sum of squares right after its sum): fresh words of every key's stream.
    for e in entries:
        for column in (e, e.get("squares")):
            if column is None:
                continue
            i = column["sum_column"]
            if i not in noisy:
                s = np.asarray(grid_sums[i], dtype=np.int64)
                noisy[i] = ((s + sum_noise(rng, column, s.size)).astype(np.float64)
                            / float(column["grid_scale"]))
    out = {}
    for e in entries:
        value = noisy[e["sum_column"]]
        if e["statistic"] == "sum":
            out[e["output"]] = value
            continue
        low, high = e["clip"]
        with np.errstate(divide="ignore", invalid="ignore"):
            mean = np.clip(value / counts, low, high)
        if e["statistic"] == "mean":
            out[e["output"]] = np.where(counts > 0, mean, np.nan)
            continue
        # variance / stddev: population variance of the clamped totals,
        # clamp(Q/n - mean^2, 0, ((high - low) / 2)^2) (its largest possible value)
        squares = noisy[e["squares"]["sum_column"]]
        with np.errstate(divide="ignore", invalid="ignore"):
            variance = np.clip(squares / counts - mean * mean, 0.0, ((high - low) / 2.0) ** 2)
        value = variance if e["statistic"] == "variance" else np.sqrt(variance)
        out[e["output"]] = np.where(counts > 0, value, np.nan)
        # the noisy sums behind it, for its interval (pipelines/dataio/intervals.py: read and
        # dropped in the launcher before publishing)
        for i in (e["sum_column"], e["squares"]["sum_column"]):
            out[f"{NOISY_SUM_PREFIX}{i}"] = noisy[i]
    return out


def release_with_aggregates(table, params, rng):
    """One batch of per-key counts and grid sums -> released rows (key columns, noisy
    ``count``, the aggregate columns; ``debiased`` with public-key debiasing)."""
    counts = table.column("count").to_numpy(zero_copy_only=False)
    debiased = None
    if params.get("public_keys"):
        from thresher.transforms.selection.public_domain import noisy_domain_counts
        noisy, debiased = noisy_domain_counts(counts, params, rng)
        keep = np.ones(len(counts), dtype=bool)
    else:
        from thresher.transforms.selection.noisy_threshold import kernel_arguments, noisy_threshold
        keep, noisy = noisy_threshold(counts, rng=rng, **kernel_arguments(params))
    num_sums = 1 + max(max(e["sum_column"], e.get("squares", {}).get("sum_column", -1))
                       for e in params["aggregates"])
    mask = pa.array(keep)
    released = table.filter(mask)
    sums = {i: released.column(f"__s{i}").to_numpy(zero_copy_only=False) for i in range(num_sums)}
    released = released.drop_columns([f"__s{i}" for i in range(num_sums)])
    idx = released.schema.get_field_index("count")
    released = released.set_column(idx, "count", pa.array(noisy[keep], type=pa.int64()))
    if debiased is not None:
        released = released.append_column("debiased", pa.array(debiased[keep], type=pa.float64()))
    outputs = noisy_outputs(noisy[keep], sums, params, samplers.take(rng, keep))
    for name, values in outputs.items():
        released = released.append_column(
            name, pa.array(values, type=pa.float64(), mask=np.isnan(values)))
    return released


class ReleaseWithAggregates(KernelRelease):
    """Per-key counts and grid sums -> released keys with the aggregate columns."""

    stage_label = "NoiseCountsAndSums"
    release_table = staticmethod(release_with_aggregates)

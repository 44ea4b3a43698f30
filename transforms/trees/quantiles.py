"""Range and quantile queries from sample-and-threshold histograms (paper 003, Sec. 4.2).

Two recipes on top of the sample-and-threshold kernel:

* :class:`HierarchicalHistogram` (Beam) / :func:`hierarchical_release` (kernel): a
  branching-``beta`` hierarchy over a numeric column on [lo, hi): level l = 1..L has
  beta**l equal-width buckets; each level is a sample-and-threshold histogram with fresh
  sampling (L levels compose: paper 003 Lemma 1). :class:`RangeAnswers` answers rank,
  range and quantile queries from the released rows by the greedy beta-ary decomposition
  (at most beta - 1 nodes per level). The same levels per key (cells (keys..., bucket)):
  :func:`release_levels` / :class:`LevelHistograms`, which ``transforms.trees.quantile_release``
  uses for ``mechanism.kind: quantiles``.
* :func:`binary_search_quantile`: the interactive search of paper 003 Sec. 4.2 (Lemma
  "single quantiles"): ``rounds`` two-bucket histograms [lo, t) / [t, hi), each a fresh
  sample-and-threshold release, bisecting t towards the phi-quantile.

Both take per-value counts (a numeric key column + int64 ``count``, l_inf = 1, l0 <= C);
a level's bucket counts (user, value) contributions, so parameters come from
``accounting.sample_threshold.calibrate_levels(epsilon, delta, L or rounds, C)``. Values
outside [lo, hi) are clamped into the first / last bucket (say so to the analyst: the
domain is public and chosen without the data).

Error (:func:`rank_error_bound`): a rank estimate sums at most L (beta - 1) nodes; each
suppressed one had a sampled count <= tau - 1, so suppression loses at most
L (beta - 1)(tau - 1)/p, and the kept nodes' estimates sum independent Bin(c, p)/p with
total variance R (1 - p)/p over the R values counted, bounded by Bernstein's inequality.
"""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.transforms.randomness import hashing, keyed_random
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.trees.heavy_hitters import LEVEL_COLUMN
from thresher.transforms.selection.sample_and_threshold import SampleAndThreshold, release_table, sample_and_threshold
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN

BUCKET_COLUMN = "bucket"


def _check_domain(lo, hi, branching, levels):
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ValueError(f"domain must be finite with lo < hi, got [{lo}, {hi})")
    if isinstance(branching, bool) or int(branching) != branching or branching < 2:
        raise ValueError(f"branching must be an integer >= 2, got {branching}")
    if isinstance(levels, bool) or int(levels) != levels or levels < 1 \
            or branching ** levels > 2 ** 40:
        raise ValueError(f"levels must be an integer >= 1 with branching**levels <= 2**40, got {levels}")


def bucket_of(values, *, lo, hi, branching, level):
    """Index of each value's level-``level`` bucket: floor((x - lo) / width) with
    width = (hi - lo) / branching**level, clamped to [0, branching**level - 1]."""
    _check_domain(lo, hi, branching, level)
    n = branching ** level
    x = np.asarray(values, dtype=np.float64)
    idx = np.floor((x - lo) * (n / (hi - lo)))
    return np.clip(idx, 0, n - 1).astype(np.int64)


def _grouped(columns, count, group_by):
    """Table(group_by..., count): sums of ``count`` per group (an empty table keeps the types)."""
    table = pa.table({**columns, "count": count})
    if table.num_rows == 0:
        return pa.table({**{k: v.slice(0, 0) if hasattr(v, "slice") else v for k, v in columns.items()},
                         "count": pa.array([], pa.int64())})
    grouped = table.group_by(group_by, use_threads=False).aggregate([("count", "sum")])
    return grouped.rename_columns(group_by + ["count"]).select(group_by + ["count"])


def level_cells(table, keys, value_column, *, lo, hi, branching, level):
    """Table(keys..., bucket, count): per (key, level-``level`` bucket) sums of ``count``;
    ``keys`` = [] gives the global hierarchy's per-bucket counts."""
    values = table.column(value_column).to_numpy(zero_copy_only=False).astype(np.float64)
    buckets = bucket_of(values, lo=lo, hi=hi, branching=branching, level=level)
    columns = {k: table.column(k) for k in keys}
    columns[BUCKET_COLUMN] = pa.array(buckets, pa.int64())
    return _grouped(columns, table.column("count"), list(keys) + [BUCKET_COLUMN])


def level_counts(table, value_column, *, lo, hi, branching, level):
    """Table(bucket, count): per-bucket sums of ``count`` at one level."""
    return level_cells(table, [], value_column, lo=lo, hi=hi, branching=branching, level=level)


def _with_level(table, level):
    return table.add_column(0, LEVEL_COLUMN, pa.array(np.full(table.num_rows, level, np.int32)))


def release_levels(table, keys, value_column, *, lo, hi, branching, levels, params, rng):
    """Kernel: every level 1..L of the (keyed) hierarchy on one in-memory table of
    per-(key, value) counts. Returns Table(level, keys..., bucket, count, estimate)."""
    _check_domain(lo, hi, branching, levels)
    out = []
    for level in range(1, levels + 1):
        cells = level_cells(table, keys, value_column, lo=lo, hi=hi, branching=branching, level=level)
        out.append(_with_level(release_table(cells, params, rng), level))
    return pa.concat_tables(out)


def hierarchical_release(table, value_column, *, lo, hi, branching, levels, params, rng):
    """Kernel: release every level (1..L) of the hierarchy from one in-memory table of
    per-value counts. Returns Table(level, bucket, count, estimate)."""
    return release_levels(table, [], value_column, lo=lo, hi=hi, branching=branching,
                          levels=levels, params=params, rng=rng)


def _cells_with_hash(table, keys, value_column, lo, hi, branching, level):
    out = level_cells(table, keys, value_column, lo=lo, hi=hi, branching=branching, level=level)
    return out.append_column(KEY_HASH_COLUMN, pa.array(
        hashing.hash_columns(out, list(keys) + [BUCKET_COLUMN]), pa.uint64()))


class LevelHistograms(beam.PTransform):
    """Per-(key, value) counts -> Table(level, keys..., bucket, count, estimate): L
    sample-and-threshold levels of the beta-ary hierarchy, fresh sampling each (paper 003
    Sec. 4.2; L levels compose, Lemma 1). ``keys`` = [] is the global hierarchy."""

    def __init__(self, keys, value_column, *, lo, hi, branching, levels, params, num_shards=16,
                 rng_factory=None, label=None):
        super().__init__(label)
        _check_domain(lo, hi, branching, levels)
        self._keys, self._column = list(keys), value_column
        self._lo, self._hi, self._branching, self._levels = float(lo), float(hi), int(branching), int(levels)
        self._params, self._num_shards, self._rng_factory = params, int(num_shards), rng_factory

    def expand(self, counts):
        levels = []
        for level in range(1, self._levels + 1):
            levels.append(
                counts
                | f"Cells{level}" >> beam.Map(_cells_with_hash, self._keys, self._column, self._lo,
                                              self._hi, self._branching, level)
                | f"SumPerCell{level}" >> SumCountsPerKey(self._keys + [BUCKET_COLUMN], self._num_shards)
                | f"SampleAndThreshold{level}" >> SampleAndThreshold(
                    self._params, keyed_random.child(self._rng_factory, f"SampleAndThreshold{level}"))
                | f"Level{level}" >> beam.Map(_with_level, level))
        return levels | "FlattenLevels" >> beam.Flatten()


class HierarchicalHistogram(LevelHistograms):
    """Sample-and-threshold hierarchy over a numeric column (paper 003 Sec. 4.2).

    Input: PCollection[pyarrow.Table] with ``value_column`` and int64 ``count``. Output:
    PCollection[pyarrow.Table(level, bucket, count, estimate)], level 1..L, bucket in
    [0, branching**level). ``params``: dict / LevelParams / side input (sampling_rate,
    threshold) from ``calibrate_levels(epsilon, delta, levels, C)``."""

    def __init__(self, value_column, *, lo, hi, branching, levels, params, num_shards=16,
                 rng_factory=None, label=None):
        super().__init__([], value_column, lo=lo, hi=hi, branching=branching, levels=levels,
                         params=params, num_shards=num_shards, rng_factory=rng_factory, label=label)


class RangeAnswers:
    """Rank, range and quantile answers from released hierarchy rows (post-processing).

    ``released``: Table(level, bucket, count, estimate) (one table or a list of them);
    a bucket absent from it was suppressed and counts as 0."""

    def __init__(self, released, *, lo, hi, branching, levels):
        _check_domain(lo, hi, branching, levels)
        if isinstance(released, (list, tuple)):
            released = pa.concat_tables(released) if released else None
        self.lo, self.hi, self.branching, self.levels = float(lo), float(hi), int(branching), int(levels)
        self._estimates = []
        for level in range(1, levels + 1):
            est = np.zeros(branching ** level)
            if released is not None and released.num_rows:
                rows = released.filter(pc.equal(released.column(LEVEL_COLUMN), level))
                est[rows.column(BUCKET_COLUMN).to_numpy()] = rows.column("estimate").to_numpy()
            self._estimates.append(est)
        self._ranks = self._all_ranks()

    @property
    def leaves(self):
        return self.branching ** self.levels

    def total(self):
        """Estimated number of values: the sum of the level-1 estimates."""
        return float(self._estimates[0].sum())

    def _all_ranks(self):
        """rank[r] = estimated count of values in leaves [0, r), r = 0..leaves, by the
        greedy decomposition: at each level l, the siblings before r's level-l ancestor."""
        b, L = self.branching, self.levels
        r = np.arange(self.leaves)
        ranks = np.zeros(self.leaves + 1)
        for level in range(1, L + 1):
            est = self._estimates[level - 1].reshape(-1, b)  # sibling groups
            before = (np.cumsum(est, axis=1) - est).ravel()   # exclusive sums within a group
            ranks[:-1] += before[r // b ** (L - level)]
        ranks[-1] = self.total()
        return ranks

    def leaf_edge(self, r):
        return self.lo + (self.hi - self.lo) * r / self.leaves

    def rank(self, x):
        """Estimated number of values < the leaf boundary at or below x."""
        r = int(np.clip(math.floor((x - self.lo) * self.leaves / (self.hi - self.lo)), 0, self.leaves))
        return float(self._ranks[r])

    def range_count(self, a, b):
        """Estimated number of values in [a, b), both rounded down to leaf boundaries."""
        return self.rank(b) - self.rank(a)

    def quantile(self, phi):
        """The first leaf boundary t whose estimated rank reaches phi * total()."""
        return self.leaf_edge(self._answer_leaf_edge(phi))

    def _answer_leaf_edge(self, phi):
        if not 0 <= phi <= 1:
            raise ValueError(f"phi must be in [0, 1], got {phi}")
        target = phi * self.total()
        return int(np.argmax(self._ranks >= target)) if (self._ranks >= target).any() else self.leaves

    def resolution(self, phi):
        """The width of the bucket that locates :meth:`quantile` (phi) -- the resolution the
        released value actually has (issue 36 D9). The answer's rank is reached inside leaf
        r - 1; at each level l the released estimates of that leaf's level-l sibling group
        place it within its level-(l - 1) bucket. The first level whose sibling group was
        released with no count at all (every bucket suppressed) places nothing, so the
        value is only known to the width of the bucket one level up: (hi - lo) / b**d for
        the deepest informing level d (the leaf width when every level informs it). 0 levels
        (nothing released) gives the whole domain's width."""
        b, depth = self.branching, self.levels
        leaf = max(self._answer_leaf_edge(phi) - 1, 0)
        for level in range(1, self.levels + 1):
            ancestor = leaf // b ** (self.levels - level)
            group = self._estimates[level - 1].reshape(-1, b)[ancestor // b]
            if not np.any(group != 0):
                depth = level - 1
                break
        return (self.hi - self.lo) / b ** depth


def bernstein_deviation(total, sampling_rate, failure):
    """t with P[|sum_i B_i / p - total| >= t] <= failure for ``total`` independent
    Bernoulli(p) contributions B_i (Bernstein: variance total (1-p)/p, terms bounded by 1/p)."""
    p = sampling_rate
    log_term = math.log(2 / failure)
    var = total * (1 - p) / p
    return (log_term / (3 * p)) + math.sqrt((log_term / (3 * p)) ** 2 + 2 * var * log_term)


def rank_error_bound(rank, *, branching, levels, sampling_rate, threshold, failure=1e-6):
    """Bound on |estimated rank - true rank| for a rank R, holding with probability
    >= 1 - failure: L (beta - 1)(tau - 1)/p (suppressed nodes) + the Bernstein deviation
    of the kept nodes' estimates (paper 003 Sec. 4.2, made explicit)."""
    suppressed = levels * (branching - 1) * (threshold - 1) / sampling_rate
    return suppressed + bernstein_deviation(rank, sampling_rate, failure)


def binary_search_quantile(values, counts, *, phi, lo, hi, rounds, sampling_rate, threshold, rng):
    """The interactive phi-quantile search of paper 003 Sec. 4.2 over per-value counts.

    Each round releases a two-bucket sample-and-threshold histogram [lo', t) / [t, hi)
    (fresh sampling) and moves t by half the remaining interval towards the side holding
    the phi-quantile; ``rounds`` = h releases compose (parameters from
    ``calibrate_levels(epsilon, delta, h, C)``). Returns (t, trace): t the midpoint of the
    final interval (within (hi - lo) / 2**(h + 1) of every point of it), trace the released
    (split, left count, right count) per round (suppressed buckets are 0)."""
    if not 0 < phi < 1:
        raise ValueError(f"phi must be in (0, 1), got {phi}")
    _check_domain(lo, hi, 2, 1)
    values = np.asarray(values, dtype=np.float64)
    counts = np.asarray(counts, dtype=np.int64)
    left_edge, right_edge = float(lo), float(hi)
    trace = []
    for _ in range(int(rounds)):
        t = 0.5 * (left_edge + right_edge)
        below = values < t
        split = np.array([counts[below].sum(), counts[~below].sum()], dtype=np.int64)
        keep, sampled = sample_and_threshold(split, sampling_rate=sampling_rate,
                                             threshold=threshold, rng=rng)
        left, right = (int(v) if k else 0 for k, v in zip(keep, sampled))
        trace.append((t, left, right))
        if left + right == 0:
            break  # nothing released: no information to move on
        if left / (left + right) < phi:
            left_edge = t
        else:
            right_edge = t
    return 0.5 * (left_edge + right_edge), trace


def split_fraction_error(n_left, n_right, *, sampling_rate, threshold, failure=1e-9):
    """eta with |F_hat - F| <= eta with probability >= 1 - 2 failure for one round of
    :func:`binary_search_quantile`: F = n_left / (n_left + n_right), F_hat the released
    left / (left + right). Each side's estimate is within its Bernstein deviation d; the
    ratio moves at most to (n_L -+ d_L) / (n_L -+ d_L + n_R +- d_R); a side whose sampled
    count falls below tau reads 0, which can only happen if n_side - d_side < tau / p.

    Consequence (by induction over rounds): the returned t satisfies
    F(t - w) <= phi + eta and F(t + w) >= phi - eta, w = (hi - lo) / 2**(rounds + 1),
    eta = the largest per-round error -- paper 003's "t +- 2**-h is a phi +- O(m**-1/2)
    quantile" with the constant made explicit."""
    p = sampling_rate
    n = n_left + n_right
    if n == 0:
        return 1.0
    d_l = bernstein_deviation(n_left, p, failure)
    d_r = bernstein_deviation(n_right, p, failure)
    lo_l, hi_l = max(n_left - d_l, 0.0), n_left + d_l
    lo_r, hi_r = max(n_right - d_r, 0.0), n_right + d_r
    # suppression: a side that can fall below tau / p may read 0
    if lo_l * p < threshold:
        lo_l = 0.0
    if lo_r * p < threshold:
        lo_r = 0.0
    f = n_left / n
    worst_low = lo_l / (lo_l + hi_r) if lo_l + hi_r > 0 else 0.0
    worst_high = hi_l / (hi_l + lo_r) if hi_l + lo_r > 0 else 1.0
    return max(f - worst_low, worst_high - f)

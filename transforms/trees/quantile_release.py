"""Quantiles per key (or globally) from sample-and-threshold histograms (paper 003 Sec. 4.2).

The kernels of ``mechanism.kind: quantiles`` beside their Beam transforms:

* :func:`hierarchy_release` (kernel) / :class:`KeyedHierarchy` (Beam): the beta-ary
  hierarchical histogram of ``transforms.trees.quantiles`` (``level_cells``,
  ``release_levels``, ``LevelHistograms``) with the cells (key columns..., bucket) at
  each level 1..L, so one release answers every key's quantiles. Each level is a
  sample-and-threshold histogram with fresh Poisson sampling.
* :func:`hierarchy_quantiles`: post-processing -- per key, ``transforms.trees.quantiles.RangeAnswers``
  on the key's released rows, the first leaf boundary whose estimated rank reaches
  phi * total (greedy decomposition, at most L (beta - 1) nodes).
* :func:`search_cells` / :func:`search_update` / :class:`BinarySearchQuantiles` (Beam): the
  interactive search of paper 003 Sec. 4.2, all ranks and keys at once: round r releases,
  for every (key, rank), the two-bucket histogram [left, t) / [t, right) at the midpoint
  t of that search's interval, and moves the interval towards the rank's side.

Input: per-(key, value) counts (key columns, the numeric ``value`` column, int64 ``count``)
after each user was bounded to at most C distinct (key, value) pairs. Values outside
[lo, hi) are clamped into the first or last bucket (``transforms.trees.quantiles.bucket_of``);
the binary search compares values with t, so a value below lo counts on the left of
every split and one >= hi on the right -- the same clamping.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import hashing, keyed_random
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.trees.quantiles import LevelHistograms, RangeAnswers, _grouped, release_levels
from thresher.transforms.selection.sample_and_threshold import SampleAndThreshold
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN

RANK_COLUMN = "rank"
VALUE_COLUMN = "value"
# The resolution each released value actually has (issue 36 D9): the width of the bucket
# that locates it (hierarchical), the half-width of its final search interval (binary
# search); null with the value.
RESOLUTION_COLUMN = "resolution"
SIDE_COLUMN = "__side"
RANK_INDEX_COLUMN = "__rank_index"


def hierarchy_release(table, keys, value_column, *, lo, hi, branching, levels, params, rng):
    """Kernel: every level 1..L of the keyed hierarchy on one in-memory table of
    per-(key, value) counts. Returns Table(level, keys..., bucket, count, estimate)."""
    return release_levels(table, keys, value_column, lo=lo, hi=hi, branching=branching,
                          levels=levels, params=params, rng=rng)


def _key_tuples(table, keys):
    return list(zip(*[table.column(k).to_pylist() for k in keys])) if keys else [()] * table.num_rows


def hierarchy_quantiles(released, keys, key_list, ranks, *, lo, hi, branching, levels):
    """Post-processing: Table(keys..., rank, value) with one row per (key in ``key_list``,
    rank). ``value`` is null for a key none of whose level-1 buckets was released (no
    information about it); ``key_list`` is [()] for a global release."""
    by_key = {}
    if released is not None and released.num_rows:
        for i, kt in enumerate(_key_tuples(released, keys)):
            by_key.setdefault(kt, []).append(i)
    out = {k: [] for k in keys}
    out[RANK_COLUMN], out[VALUE_COLUMN], out[RESOLUTION_COLUMN] = [], [], []
    for kt in key_list:
        answers = None
        if kt in by_key:      # a key with nothing released needs no hierarchy (null values)
            rows = released.take(pa.array(by_key[kt]))
            answers = RangeAnswers(rows, lo=lo, hi=hi, branching=branching, levels=levels)
            if not answers.total() > 0:
                answers = None
        for phi in ranks:
            for k, v in zip(keys, kt):
                out[k].append(v)
            out[RANK_COLUMN].append(float(phi))
            out[VALUE_COLUMN].append(answers.quantile(phi) if answers is not None else None)
            out[RESOLUTION_COLUMN].append(answers.resolution(phi) if answers is not None
                                          else None)
    return out


class KeyedHierarchy(LevelHistograms):
    """Per-(key, value) counts -> Table(level, keys..., bucket, count, estimate): L
    sample-and-threshold levels of the beta-ary hierarchy, fresh sampling each
    (``transforms.trees.quantiles.LevelHistograms`` with the key columns)."""


# ---- binary search (paper 003 Sec. 4.2, "Single quantiles via interactive search") --------

def initial_state(key_list, ranks, lo, hi):
    """{(key tuple, rank index): (left, right, informed)}: every search starts on [lo, hi)."""
    return {(kt, j): (float(lo), float(hi), False) for kt in key_list for j in range(len(ranks))}


def _splits(state, key_list, num_ranks):
    """Array [key index, rank index] of the current split points t (interval midpoints)."""
    t = np.empty((len(key_list), num_ranks))
    for i, kt in enumerate(key_list):
        for j in range(num_ranks):
            left, right, _ = state[(kt, j)]
            t[i, j] = 0.5 * (left + right)
    return t


def search_cells(table, keys, value_column, key_list, num_ranks, state):
    """Kernel of one round: Table(keys..., __rank_index, __side, count), the two-bucket
    counts [left, t) (side 0) / [t, right) (side 1) of every (key, rank) search.
    Rows of keys outside ``key_list`` are ignored (there are none after RestrictToDomain)."""
    index = {kt: i for i, kt in enumerate(key_list)}
    rows = np.array([index.get(kt, -1) for kt in _key_tuples(table, keys)], dtype=np.int64)
    ok = rows >= 0
    values = table.column(value_column).to_numpy(zero_copy_only=False).astype(np.float64)[ok]
    counts = table.column("count").to_numpy(zero_copy_only=False)[ok]
    rows = rows[ok]
    t = _splits(state, key_list, num_ranks)
    parts = []
    base = table.filter(pa.array(ok)).select(list(keys))
    for j in range(num_ranks):
        side = (values >= t[rows, j]).astype(np.int8)
        columns = {k: base.column(k) for k in keys}
        columns[RANK_INDEX_COLUMN] = pa.array(np.full(len(rows), j, np.int32))
        columns[SIDE_COLUMN] = pa.array(side)
        parts.append(_grouped(columns, pa.array(counts, pa.int64()),
                              list(keys) + [RANK_INDEX_COLUMN, SIDE_COLUMN]))
    return pa.concat_tables(parts)


def search_update(released, keys, key_list, ranks, state):
    """Post-processing of one round: move every (key, rank) interval towards the side
    holding its rank (``transforms.trees.quantiles.binary_search_quantile``'s rule: suppressed
    sides read 0; if both are 0 the interval stays). Returns the new state."""
    left_right = {}
    for table in released:
        if not table.num_rows:
            continue
        kts = _key_tuples(table, keys)
        for kt, j, side, count in zip(kts, table.column(RANK_INDEX_COLUMN).to_pylist(),
                                      table.column(SIDE_COLUMN).to_pylist(),
                                      table.column("count").to_pylist()):
            pair = left_right.setdefault((kt, j), [0, 0])
            pair[side] += count
    new = dict(state)
    for (kt, j), (left, right, informed) in state.items():
        n_left, n_right = left_right.get((kt, j), (0, 0))
        if n_left + n_right == 0:
            continue
        t = 0.5 * (left + right)
        if n_left / (n_left + n_right) < ranks[j]:
            new[(kt, j)] = (t, right, True)
        else:
            new[(kt, j)] = (left, t, True)
    return new


def search_answers(state, keys, key_list, ranks):
    """Table columns (keys..., rank, value, resolution): the final interval's midpoint and
    its half-width (the resolution the search reached: rounds that released nothing did
    not halve it), null for a search no round released anything for."""
    out = {k: [] for k in keys}
    out[RANK_COLUMN], out[VALUE_COLUMN], out[RESOLUTION_COLUMN] = [], [], []
    for kt in key_list:
        finals = [state[(kt, j)] for j in range(len(ranks))]
        values = [0.5 * (left + right) if informed else None for left, right, informed in finals]
        halves = [0.5 * (right - left) if informed else None for left, right, informed in finals]
        for j, phi in enumerate(ranks):
            for k, v in zip(keys, kt):
                out[k].append(v)
            out[RANK_COLUMN].append(float(phi))
        values, halves = monotone_in_rank(ranks, values, halves)
        out[VALUE_COLUMN].extend(values)
        out[RESOLUTION_COLUMN].extend(halves)
    return out


def monotone_in_rank(ranks, values, carried=None):
    """Post-processing: the answered values (None stays None) rearranged to be
    non-decreasing in rank (the sorted values assigned to the ranks in increasing order;
    rearranging never increases the L_p distance to the true quantile function, which is
    monotone: Chernozhukov, Fernandez-Val, Galichon, Biometrika 2010, Prop. 1). With
    ``carried`` (one item per value, e.g. its resolution), returns (values, carried), each
    item moved with its value."""
    answered = [j for j, v in enumerate(values) if v is not None]
    order = sorted(answered, key=lambda j: ranks[j])
    by_value = sorted(answered, key=lambda j: values[j])     # stable: ties keep rank order
    out = list(values)
    moved = None if carried is None else list(carried)
    for j, source in zip(order, by_value):
        out[j] = values[source]
        if moved is not None:
            moved[j] = carried[source]
    return out if carried is None else (out, moved)


def _search_cells_with_hash(table, keys, value_column, key_list, num_ranks, state):
    out = search_cells(table, keys, value_column, key_list, num_ranks, state)
    cols = list(keys) + [RANK_INDEX_COLUMN, SIDE_COLUMN]
    return out.append_column(KEY_HASH_COLUMN, pa.array(hashing.hash_columns(out, cols), pa.uint64()))


def _initial_state_for(key_list, ranks, lo, hi):
    return initial_state([tuple(k) for k in key_list], ranks, lo, hi)


class BinarySearchQuantiles(beam.PTransform):
    """Per-(key, value) counts -> one dict of columns (keys..., rank, value): ``rounds``
    sequential sample-and-threshold releases of two-bucket histograms per (key, rank),
    each round's split points a side input computed from the previous round's release.
    ``key_list``: the key tuples to answer for ([()] for a global release), as a list or
    as a one-element PCollection holding the list (keys found by an earlier stage)."""

    def __init__(self, keys, value_column, *, key_list, ranks, lo, hi, rounds, params,
                 num_shards=16, rng_factory=None, label=None):
        super().__init__(label)
        self._keys, self._column = list(keys), value_column
        self._key_list, self._ranks = key_list, [float(r) for r in ranks]
        self._lo, self._hi, self._rounds = float(lo), float(hi), int(rounds)
        self._params, self._num_shards, self._rng_factory = params, int(num_shards), rng_factory

    def expand(self, counts):
        key_pc = self._key_list
        if not isinstance(key_pc, beam.pvalue.PCollection):
            key_pc = counts.pipeline | "KeyList" >> beam.Create([[tuple(k) for k in self._key_list]])
        key_list = beam.pvalue.AsSingleton(key_pc)
        state = key_pc | "InitialState" >> beam.Map(_initial_state_for, self._ranks, self._lo, self._hi)
        cell_cols = self._keys + [RANK_INDEX_COLUMN, SIDE_COLUMN]
        for r in range(1, self._rounds + 1):
            released = (
                counts
                | f"Split{r}" >> beam.Map(_search_cells_with_hash, self._keys, self._column,
                                          key_list, len(self._ranks),
                                          beam.pvalue.AsSingleton(state))
                | f"SumPerSide{r}" >> SumCountsPerKey(cell_cols, self._num_shards)
                | f"SampleAndThreshold{r}" >> SampleAndThreshold(
                    self._params, keyed_random.child(self._rng_factory, f"SampleAndThreshold{r}"))
                | f"Gather{r}" >> beam.combiners.ToList())
            state = released | f"Move{r}" >> beam.Map(
                search_update, self._keys, key_list, self._ranks, beam.pvalue.AsSingleton(state))
        return state | "Answers" >> beam.Map(search_answers, self._keys, key_list, self._ranks)

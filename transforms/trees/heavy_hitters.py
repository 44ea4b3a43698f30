"""TrieHeavyHitters: TrieHH++ heavy hitters from sample-and-threshold prefix histograms.

Paper 003, Sec. 4.1 (after Zhu et al. 2020's TrieHH): level i releases a sample-and-
threshold histogram of the length-l_i prefixes of the keys, each level with fresh
Poisson sampling. Every level is released over *all* prefixes (no level looks at another
level's output); the trie constraint -- a prefix is kept only if its parent prefix was
released one level up -- is post-processing of the released levels (the paper's remark)
and is applied by :func:`prune_trie`.

Two inputs:

- (user, key) pairs (``user_column`` given; what the ``heavy_hitters`` kind passes: each
  user's at most C bounded keys, whole users per element): a level's cell counts the
  *distinct users* holding a key with that prefix (:func:`user_prefix_counts`), so one user
  moves at most C cells per level, each by one. That is what
  ``accounting.sample_threshold.trie`` composes (C x L one-cell mechanisms).
- per-key counts (key column + int64 ``count``; no user column): a prefix's count sums the
  counts of its keys (:func:`prefix_counts`) -- the distinct users of the prefix when each
  user holds one key (paper 003's model, C = 1; the paper-scale benchmark); with several
  keys per user it counts (user, key) contributions, which only the group-privacy
  accounting ``accounting.sample_threshold.calibrate_levels`` covers.

Parameters: one (sampling_rate, threshold) for every level.

Output rows: ``level`` (int32, 0-based index into ``prefix_lengths``), the key column
holding the prefix (the whole key at a level of length None), ``count`` (sampled count)
and ``estimate`` (count / p).
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.transforms.randomness import hashing, keyed_random
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.selection.sample_and_threshold import SampleAndThreshold, release_table
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN, concat

LEVEL_COLUMN = "level"


def _check_lengths(prefix_lengths):
    lengths = list(prefix_lengths)
    if not lengths:
        raise ValueError("prefix_lengths must list at least one level")
    finite = [n for n in lengths if n is not None]
    if any(isinstance(n, bool) or int(n) != n or n < 1 for n in finite):
        raise ValueError(f"prefix_lengths must be integers >= 1 (or None for the whole key), "
                         f"got {lengths}")
    if finite != sorted(set(finite)) or (None in lengths and lengths[-1] is not None) \
            or lengths.count(None) > 1:
        raise ValueError(f"prefix_lengths must increase, with None (whole key) only last, "
                         f"got {lengths}")
    return lengths


def prefix_counts(table, key_column, length):
    """Sum of ``count`` per length-``length`` prefix of ``key_column`` (None: the whole key).
    Keys shorter than ``length`` are their own prefix."""
    keys = table.column(key_column)
    if length is not None:
        keys = pc.utf8_slice_codeunits(keys, 0, int(length))
    grouped = pa.table({key_column: keys, "count": table.column("count")}).group_by(
        key_column, use_threads=False).aggregate([("count", "sum")])
    return grouped.rename_columns([key_column, "count"]).select([key_column, "count"])


def user_prefix_counts(pairs, key_column, length, user_column=USER_COLUMN):
    """Distinct users per length-``length`` prefix of ``key_column`` (None: the whole key)
    in a table of (user, key) rows holding whole users: Table(key_column = prefix, count).
    A user whose keys share a prefix counts once in that prefix's cell."""
    keys = pairs.column(key_column)
    if length is not None:
        keys = pc.utf8_slice_codeunits(keys, 0, int(length))
    distinct = pa.table({"u": pairs.column(user_column), key_column: keys}).group_by(
        ["u", key_column], use_threads=False).aggregate([])
    grouped = distinct.group_by(key_column, use_threads=False).aggregate([([], "count_all")])
    return grouped.rename_columns([key_column, "count"]).select([key_column, "count"])


def _cells(table, key_column, length, user_column):
    if user_column is None:
        return prefix_counts(table, key_column, length)
    return user_prefix_counts(table, key_column, length, user_column)


def _with_level(table, level):
    return table.add_column(0, LEVEL_COLUMN, pa.array(np.full(table.num_rows, level, np.int32)))


def trie_heavy_hitters(table, key_column, prefix_lengths, params, rng, prune=True,
                       user_column=None):
    """Kernel: every level of TrieHH++ on one in-memory table.

    Args:
      table: pyarrow.Table with ``key_column`` (strings) and int64 ``count`` (per-key
        counts), or with ``user_column`` and ``key_column`` ((user, key) rows, every
        user's rows present; cells count distinct users, see the module docstring).
      prefix_lengths: increasing prefix lengths, e.g. (1, 2, 3, None); None = whole key.
      params: sampling_rate and threshold (dict or LevelParams / SampleThresholdParams).
      rng: keyed streams (``transforms.randomness.keyed_random``) or a seeded numpy Generator (tests).
      prune: apply the trie constraint (:func:`prune_trie`).
      user_column: the user column of (user, key) rows; None for per-key counts.
    Returns: pyarrow.Table(level, key_column, count, estimate).
    """
    lengths = _check_lengths(prefix_lengths)
    levels = [_with_level(release_table(_cells(table, key_column, n, user_column), params, rng),
                          i)
              for i, n in enumerate(lengths)]
    released = pa.concat_tables(levels)
    return prune_trie(released, key_column, lengths) if prune else released


def prune_trie(released, key_column, prefix_lengths):
    """Keep a level-i prefix only if its parent (its first prefix_lengths[i-1] characters)
    was kept at level i - 1: the TrieHH trie constraint, as post-processing."""
    lengths = _check_lengths(prefix_lengths)
    if released.num_rows == 0:
        return released
    level = released.column(LEVEL_COLUMN).to_numpy()
    keys = released.column(key_column)
    keep = level == 0
    kept_parents = set(keys.filter(pa.array(keep)).to_pylist())
    for i in range(1, len(lengths)):
        here = level == i
        parent_len = lengths[i - 1]
        parents = pc.utf8_slice_codeunits(keys, 0, parent_len).to_numpy(zero_copy_only=False)
        ok = here & np.isin(parents, np.array(sorted(kept_parents), dtype=object))
        keep |= ok
        kept_parents = set(keys.filter(pa.array(ok)).to_pylist())
    return released.filter(pa.array(keep))


def heavy_hitters(released, key_column, k=None, level=None):
    """The whole-key level's released keys by decreasing estimate (the top ``k`` if
    given). ``level``: its index (len(prefix_lengths) - 1); None takes the largest level
    present, which is a prefix level when the whole-key level released nothing -- pass it."""
    last = pc.max(released.column(LEVEL_COLUMN)).as_py() if level is None else int(level)
    rows = released.filter(pc.equal(released.column(LEVEL_COLUMN), last))
    rows = rows.sort_by([("estimate", "descending"), (key_column, "ascending")])
    return rows if k is None else rows.slice(0, k)


def _prefix_with_hash(table, key_column, length, user_column=None):
    out = _cells(table, key_column, length, user_column)
    return out.append_column(KEY_HASH_COLUMN, pa.array(hashing.hash_columns(out, [key_column])))


def _prune_all(tables, key_column, lengths):
    table = concat(list(tables))
    if table is not None:
        pruned = prune_trie(table, key_column, lengths)
        if pruned.num_rows:
            yield pruned


class TrieHeavyHitters(beam.PTransform):
    """TrieHH++ over a PCollection[pyarrow.Table] of per-key counts (key column + ``count``)
    or, with ``user_column``, of (user, key) rows holding whole users (user-sharded, e.g.
    after contribution bounding): then each level's cells count distinct users.

    One SumCountsPerKey + SampleAndThreshold per level, fresh sampling each; the released
    levels are flattened and (``prune``) gathered once to apply the trie constraint (they
    are only the released prefixes, so they fit one worker). ``params``: dict, LevelParams
    or side input with sampling_rate and threshold. Output: Table(level, key, count,
    estimate)."""

    def __init__(self, key_column, prefix_lengths, params, num_shards=16, prune=True,
                 rng_factory=None, label=None, user_column=None):
        super().__init__(label)
        self._user = user_column
        self._key = key_column
        self._lengths = _check_lengths(prefix_lengths)
        self._params = params
        self._num_shards = int(num_shards)
        self._prune = prune
        self._rng_factory = rng_factory

    def expand(self, counts):
        levels = []
        for i, length in enumerate(self._lengths):
            levels.append(
                counts
                | f"Prefixes{i}" >> beam.Map(_prefix_with_hash, self._key, length, self._user)  # Table(prefix, count, __key)
                | f"SumPerPrefix{i}" >> SumCountsPerKey([self._key], self._num_shards)
                | f"SampleAndThreshold{i}" >> SampleAndThreshold(
                    self._params, keyed_random.child(self._rng_factory, f"SampleAndThreshold{i}"))
                | f"Level{i}" >> beam.Map(_with_level, i))                          # Table(level, prefix, count, estimate)
        released = levels | "FlattenLevels" >> beam.Flatten()
        if not self._prune:
            return released
        return (released
                | "GatherLevels" >> beam.combiners.ToList()
                | "PruneTrie" >> beam.FlatMap(_prune_all, self._key, self._lengths))


__all__ = ["TrieHeavyHitters", "trie_heavy_hitters", "prune_trie", "heavy_hitters",
           "prefix_counts", "user_prefix_counts"]

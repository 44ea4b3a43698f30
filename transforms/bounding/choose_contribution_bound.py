"""ChooseContributionBound: pick the per-user bound C privately (paper 002, Algorithm 4).

Stages (one pass over the user-sharded records, vectorised over all candidates):

1. ``UserStatistics`` -- per element (all records of a set of users): (user, key hash)
   pairs (keys are the ``__key`` hash buckets that bounding de-duplicates; no key
   strings are grouped or shuffled) with counts N_ij, user weights w_i (records m_i in
   the l1 model, distinct keys k_i in the l0 model), the dropped contributions
   sum_i max(min(w_i, C_m) - C, 0) for every C, and each key's expected bounded count
   sum_i N_ij C / max(C, w_i) for every C,
   split into key shards by the key hash ``__key`` (as ``SumCountsPerKey`` does).
2. ``SumByKey`` -- a GroupByKey on the key shard brings every partial of a key
   together; each shard sums them and reduces its keys to sum_j cost_C(h_j(C)).
3. ``SumScores`` -- a global combiner adds the dropped and key-cost vectors.
4. ``ExponentialMechanism`` -- V(C) -> the exponential mechanism
   (``accounting.selection``) with a CSPRNG created in ``DoFn.setup``; the
   non-private V(C) and probabilities go to the operator log only.
5. ``Materialise`` -- a Reshuffle, so the one drawn C is committed once and every
   consumer of ``AsSingleton(chosen)`` reads the same value.

Every sum is exact (issue 25, F2): the per-pair expected counts are integer units of
2^-B (``accounting.exact_scores.expected_count_units``), the per-key costs are rounded
down to units of 2^-K (``BoundScore.key_cost_units``), and all sums -- per shard, per key,
across shards -- are integer sums, so the scores and the draw do not depend on the order
in which a runner adds the pieces (bundling, sharding, worker processes, retries). The
rounding is charged to the exponential mechanism's sensitivity
(``BoundScore.selection_sensitivity``).

Scores, sensitivity and their proofs: ``accounting.contribution_bound``,
``accounting.exact_scores`` and docs/contribution_bound.md.
"""
import logging
from typing import NamedTuple, Optional

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.accounting import contribution_bound, exact_scores
from thresher.transforms.randomness import keyed_random
from thresher.transforms.plumbing import spill
from thresher.transforms.plumbing.arrow_coder import SHARD_AND_TABLE
from thresher.transforms.randomness.hashing import hash_columns
from thresher.transforms.bounding.per_user_bound import _order_by_user, _runs
from thresher.transforms.bounding.rand_clip import user_codes_of
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN

_LOG = logging.getLogger("thresher.choose_contribution_bound")

_DEFAULT_KEY_SHARDS = 16


def key_shards(table, key_columns, num_shards):
    """Key shard in [0, num_shards) of each row: ``__key`` (the key hash the reader adds,
    ``transforms.randomness.hashing``) modulo num_shards, as ``SumCountsPerKey`` shards keys; the
    hash is computed from the key columns when the table has no ``__key``."""
    if KEY_HASH_COLUMN in table.column_names:
        hashes = table.column(KEY_HASH_COLUMN).to_numpy()
    else:
        hashes = hash_columns(table, key_columns)
    return (np.asarray(hashes, dtype=np.uint64) % np.uint64(num_shards)).astype(np.int64)


# --------------------------------------------------------------------------------------
# Per-element statistics (pure given the table)
# --------------------------------------------------------------------------------------

def _contribution_columns(k):
    return [f"__h{i}" for i in range(k)]


# Keys per block when a shard's (keys x candidates) cost is evaluated: bounds the
# temporaries of BoundScore.key_cost to ~_COST_BLOCK * K floats.
_COST_BLOCK = 1 << 16


def _key_hashes(table, key_columns):
    """The key hash of each row: ``__key`` (the reader's ``transforms.randomness.hashing`` hash of
    the key columns) or, without it, the same hash computed from ``key_columns``."""
    if KEY_HASH_COLUMN in table.column_names:
        return np.asarray(table.column(KEY_HASH_COLUMN).to_numpy(), dtype=np.uint64)
    return np.asarray(hash_columns(table, key_columns), dtype=np.uint64)


def _user_words(table, user_column):
    """One uint64 per row identifying its user: the reader's ``__user`` hash as is, else
    ``rand_clip.user_codes_of`` (integer ids or dictionary codes) reinterpreted."""
    column = table.column(user_column) if user_column in table.column_names else None
    if column is not None and column.type == pa.uint64() and column.null_count == 0:
        return np.asarray(column.to_numpy(), dtype=np.uint64)
    return user_codes_of(table, user_column).view(np.uint64)


def user_key_pairs(user_words, key_hashes):
    """Distinct (user, key hash) pairs with their record counts N_ij.

    Returns (pair_users, pair_keys, pair_counts): dense user numbers 0..U-1 (int64), the
    key hashes (uint64) and the counts (int64). Two value sorts as in
    ``per_user_bound.bound_l0``: rows are ordered by user, then one argsort of the packed
    word (user number in the top b = bit_length(U - 1) bits, the key hash's top 64 - b
    bits below). Two keys of one user sharing those top bits could interleave; that is
    detected and the exact (user, key) lexsort is used instead, so the pairs are exact."""
    by_user = _order_by_user(user_words)
    codes = np.cumsum(_runs(user_words[by_user]), dtype=np.int64) - 1
    keys = key_hashes[by_user]
    del by_user
    shift = max(1, int(codes[-1]).bit_length())
    packed = (codes.astype(np.uint64) << np.uint64(64 - shift)) | (keys >> np.uint64(shift))
    order = np.argsort(packed)
    packed = packed[order]
    same = packed[1:] == packed[:-1]
    del packed
    if np.any(same & (keys[order[1:]] != keys[order[:-1]])):
        order = np.lexsort((keys, codes))
    codes, keys = codes[order], keys[order]
    del order, same
    starts = _runs(codes)
    starts[1:] |= keys[1:] != keys[:-1]
    first = np.flatnonzero(starts)
    counts = np.diff(np.append(first, len(starts))).astype(np.int64)
    return codes[first], keys[first], counts


def table_statistics(table, key_columns, score, *, num_key_shards=_DEFAULT_KEY_SHARDS,
                     user_column=USER_COLUMN):
    """Statistics of one user-sharded table for every candidate of ``score``.

    Keys are identified by their hash ``__key`` (computed from ``key_columns`` when the
    table has none), the unit that bounding de-duplicates and keeps: two keys sharing a
    hash are one key to the bound, so they are one key here too (a collision only merges
    two h_j; the sensitivity argument of docs/contribution_bound.md is unchanged).

    Returns (dropped, partials): ``dropped`` the int64 vector
    sum_i max(min(w_i, C_m) - C, 0) over this table's users, and ``partials`` a list of
    (shard, pyarrow.Table) with the uint64 column ``__key`` and one int64 column per
    candidate holding the keys' partial expected bounded counts in units of 2^-B,
    sum_i floor(2^B N_ij min(1, C / w_i)) (``exact_scores.expected_count_units``;
    computed candidate by candidate: no pairs x candidates matrix)."""
    k = len(score.candidates)
    if table.num_rows == 0:
        return np.zeros(k, dtype=np.int64), []
    pair_users, pair_keys, counts = user_key_pairs(
        _user_words(table, user_column), _key_hashes(table, key_columns))
    return pair_statistics(pair_users, pair_keys, counts, score, num_key_shards)


class KeyNumbers(NamedTuple):
    """The distinct key hashes of some pairs, in increasing order (``keys``, J of them),
    each pair's key number 0..J-1 (``index``) and one pair of each key (``first``);
    ``order``: the pairs sorted by key number, ties in pair order (a stable argsort of
    ``index``), or None when not at hand."""
    keys: np.ndarray
    index: np.ndarray
    first: np.ndarray
    order: Optional[np.ndarray] = None


def key_numbers(pair_keys):
    """:class:`KeyNumbers` of ``pair_keys`` (uint64 key hashes): the numbers of a sort of
    the pairs by key hash, ``first`` the first pair (lowest index) of each key.

    One value sort (numpy's sort of uint64 is ~4x faster than its argsort): the pair
    index rides in the low b = bit_length(n - 1) bits of the key hash, so the sorted
    words list the pairs by key and, within a key, in index order. Two keys sharing their
    top 64 - b bits (probability about J^2 2^-(65-b) for J keys) could interleave: that is
    detected and :func:`_key_numbers_by_dictionary` is used instead (the same numbers)."""
    pair_keys = np.asarray(pair_keys, dtype=np.uint64)
    n = len(pair_keys)
    if n == 0:
        empty = np.zeros(0, dtype=np.int64)
        return KeyNumbers(np.zeros(0, dtype=np.uint64), empty, empty)
    bits = max(1, (n - 1).bit_length())
    if bits > 40:
        return _key_numbers_by_dictionary(pair_keys)
    low = np.uint64((1 << bits) - 1)
    packed = (pair_keys & ~low) | np.arange(n, dtype=np.uint64)
    packed.sort()
    pair = (packed & low).astype(np.int64)
    keys = pair_keys[pair]
    new_top = _runs(packed >> np.uint64(bits))
    del packed
    new_key = _runs(keys)
    if not np.array_equal(new_top, new_key):   # keys sharing their top bits: exact path
        return _key_numbers_by_dictionary(pair_keys)
    starts = np.flatnonzero(new_key)
    index = np.empty(n, dtype=np.int64)
    index[pair] = np.cumsum(new_key, dtype=np.int64) - 1
    return KeyNumbers(keys[starts], index, pair[starts], pair)


def _key_numbers_by_dictionary(pair_keys):
    """:func:`key_numbers` by one hash pass (Arrow's dictionary encoding: the distinct
    keys in order of first appearance) and a sort of the J distinct keys only; exact
    whatever the keys' bits (the sort-based path's fallback, and its test oracle)."""
    pair_keys = np.asarray(pair_keys, dtype=np.uint64)
    if len(pair_keys) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return KeyNumbers(np.zeros(0, dtype=np.uint64), empty, empty)
    encoded = pc.dictionary_encode(pa.array(pair_keys, pa.uint64()))
    codes = encoded.indices.to_numpy()            # 0..J-1 in order of first appearance
    distinct = encoded.dictionary.to_numpy()
    by_value = np.argsort(distinct)
    number = np.empty(len(distinct), dtype=np.int64)
    number[by_value] = np.arange(len(distinct), dtype=np.int64)
    # a code's first pair is where the running maximum of the codes first reaches it
    reached = np.maximum.accumulate(codes)
    new_code = np.empty(len(codes), dtype=bool)
    new_code[0] = True
    np.greater(reached[1:], reached[:-1], out=new_code[1:])
    first = np.flatnonzero(new_code)[by_value]
    return KeyNumbers(distinct[by_value], number[codes], first)


def pair_statistics(pair_users, pair_keys, counts, score, num_key_shards=_DEFAULT_KEY_SHARDS,
                    numbers=None):
    """:func:`table_statistics` from the table's distinct (user, key hash) pairs: dense
    user numbers 0..U-1 (users numbered in the order of their hash), key hashes and
    record counts N_ij (unused in the l0 model: None there is allowed), every user's
    pairs contiguous and users in increasing number (the order of :func:`user_key_pairs`
    and of ``per_user_bound.l0_ranks``; each key's partial sums then add its users in the
    same order, so both give bit-identical statistics). ``numbers``: ``key_numbers(
    pair_keys)`` when the caller has it already (``transforms.bounding.scored_bound``; then
    ``pair_keys`` is not read and may be None)."""
    k = len(score.candidates)
    if len(pair_users) == 0:
        return np.zeros(k, dtype=np.int64), []
    if score.model == "l0":
        counts = np.ones(len(pair_users), dtype=np.int64)
    weights = contribution_bound.user_weights(pair_users, counts, score.model)
    dropped = contribution_bound.dropped_contributions(weights, score.candidates,
                                                       score.max_bound)
    # Key numbers 0..J-1 in key hash order (key_numbers).
    if numbers is None:
        numbers = key_numbers(pair_keys)
    keys, key_index = numbers.keys, numbers.index
    # Shards are hash mod num_key_shards (key_shards); rows of each shard contiguous.
    # (a stable sort of the shard numbers; radix on one or two bytes, the same order)
    small = (np.uint8 if num_key_shards <= 1 << 8 else
             np.uint16 if num_key_shards <= 1 << 16 else np.int64)
    shard = (keys % np.uint64(num_key_shards)).astype(small)
    by_shard = np.argsort(shard, kind="stable")
    bounds = np.searchsorted(shard[by_shard], np.arange(num_key_shards + 1))
    # contribution_bound.expected_bounded_counts, N_ij * min(1, C / max(w_i, 1)) (or
    # min(x, sqrt(x)) in user weights), one candidate at a time, as integer units of
    # 2^-B rounded down (exact_scores.expected_count_units: the same integers on every
    # platform, summed exactly). In the l0 model the term depends on the user only, so
    # it is computed per user and gathered.
    # Every key's sums are indexed by its place in shard order (``position``): the
    # columns then come out in that order, with no gather of each column afterwards
    # (a permutation of the keys' numbers; each key's sum is the same integer).
    columns = {KEY_HASH_COLUMN: keys[by_shard]}
    names = _contribution_columns(k)
    position = np.empty(len(keys), dtype=np.int64)
    position[by_shard] = np.arange(len(keys))
    pair_position = position[key_index]
    if (score.model == "l0" and not score.user_weighted
            and len(pair_users) << exact_scores.COUNT_BITS < exact_scores.EXACT_FLOAT):
        columns.update(zip(names, l0_key_units(pair_users, np.maximum(weights, 1),
                                               score.candidates, pair_position, len(keys))))
    else:
        columns.update(zip(names, key_units(pair_users, counts, weights, score,
                                            pair_position, len(keys))))
    del key_index, numbers
    del pair_users, pair_keys
    partials = []
    for s in range(num_key_shards):
        lo, hi = int(bounds[s]), int(bounds[s + 1])
        if hi > lo:
            # Fresh arrays per shard (copies, never views of a shared buffer).
            partials.append((s, pa.table({name: pa.array(values[lo:hi].copy())
                                          for name, values in columns.items()})))
    return dropped, partials


def key_units(pair_users, counts, weights, score, pair_position, num_keys):
    """Per candidate, each key's sum of its pairs' ``exact_scores.expected_count_units``
    (``exact_bincount`` at ``pair_position``, 0..num_keys-1): the general loop, any model
    (the oracle of :func:`l0_key_units`)."""
    if score.model == "l1":
        pair_weights = weights[pair_users]
    else:
        user_weight = np.maximum(weights, 1)
    out = []
    for candidate in score.candidates:
        if score.model == "l1":
            units = exact_scores.expected_count_units(counts, pair_weights, candidate)
        else:
            units = exact_scores.expected_count_units(
                None, user_weight, candidate, user_weighted=score.user_weighted)[pair_users]
        out.append(exact_scores.exact_bincount(pair_position, units, num_keys))
    return out


def l0_key_units(pair_users, user_weight, candidates, pair_key, num_keys, key_order=None):
    """:func:`key_units` in the l0 model without user weighting (issue 43), with the
    same integers and less work. A pair's units at C depend on its user's weight w_i
    alone: 2^B for w_i <= C, else floor(C 2^B / w_i) (``exact_scores.
    expected_count_units``). So each key's sum at C is 2^B times its number of pairs with
    w_i <= C, plus the units of its pairs with w_i > C only:

    * the pairs are put in *levels*, the number of candidates below their weight (level
      <= i iff w_i <= the i-th smallest candidate), one bincount of (level, key) cells
      and a running sum over the levels count, for every candidate at once, each key's
      pairs at full weight;
    * sorted by level, highest first (a stable radix sort of a byte), the pairs with
      w_i > C are a prefix, shorter as C grows: only those are gathered and summed
      per key (one float64 bincount, exact when n 2^B < 2^53 as the caller checks: every
      partial sum is then an integer below 2^53; ``exact_scores.exact_bincount`` else).

    Every term is the same integer as in the general loop and every sum is an exact
    integer sum (the caller checks n 2^B < 2^53), so the columns are the same whatever
    the order of the terms. ``pair_key``: each pair's key number 0..num_keys-1 (the sums
    are indexed by it); ``key_order`` is not needed (kept for the API)."""
    pair_users = np.asarray(pair_users)
    pair_key = np.asarray(pair_key, dtype=np.int64)
    weights, weight_of_user = np.unique(user_weight, return_inverse=True)
    weight_of_user = weight_of_user.reshape(-1).astype(
        np.uint16 if len(weights) <= 1 << 16 else np.int64)
    pair_weight = weight_of_user[pair_users]
    ladder = np.unique(np.asarray([int(c) for c in candidates], dtype=np.int64))
    levels = len(ladder) + 1
    # level of each distinct weight: the number of candidates below it
    small = np.uint8 if levels <= 1 << 8 else np.uint16 if levels <= 1 << 16 else np.int64
    weight_level = np.searchsorted(ladder, weights, side="left").astype(small)
    pair_level = weight_level[pair_weight]
    # pairs at full weight per key and level, summed over the levels <= i
    cells = np.bincount(pair_level.astype(np.int64) * num_keys + pair_key,
                        minlength=levels * num_keys)
    full = cells.reshape(levels, num_keys)
    for level in range(1, levels):       # running sums over the levels, row by row
        full[level] += full[level - 1]
    # pairs by level, highest first: those above ladder[i] are the first `above[i]`
    by_level = np.argsort(small(levels - 1) - pair_level, kind="stable")
    above = len(pair_level) - np.cumsum(np.bincount(pair_level, minlength=levels))
    key_by_level = pair_key[by_level]
    # gathered from at every candidate: as intp once (a uint16 index is converted on
    # every gather)
    weight_by_level = pair_weight[by_level].astype(np.intp)
    del by_level, pair_level
    unit = np.int64(1) << np.int64(exact_scores.COUNT_BITS)
    # every partial sum below is an integer below n 2^B: exact in a float64 bincount when
    # that is below 2^53 (the caller's case), else exact_bincount decides
    in_float = len(pair_key) << exact_scores.COUNT_BITS < exact_scores.EXACT_FLOAT
    out = []
    for candidate in candidates:
        i = int(np.searchsorted(ladder, int(candidate)))
        column = full[i] * unit
        m = int(above[i])
        if m:
            units = exact_scores.expected_count_units(None, weights, int(candidate))
            if in_float:
                column += np.bincount(key_by_level[:m],
                                      weights=np.take(units.astype(np.float64),
                                                      weight_by_level[:m]),
                                      minlength=num_keys).astype(np.int64)
            else:
                column += exact_scores.exact_bincount(key_by_level[:m],
                                                      units[weight_by_level[:m]], num_keys)
        out.append(column)
    return out


def shard_key_costs(partials, key_columns, score):
    """sum over the keys of one shard of floor(2^K c~(h_j(C))) (``BoundScore.
    key_cost_units``), a tuple of Python ints, from partial tables (``__key`` and one
    int64 column of 2^-B units per candidate); every sum is exact, so the order of the
    partials does not matter. ``key_columns`` is unused (kept for the API)."""
    names = _contribution_columns(len(score.candidates))
    tables = [t for t in partials if t.num_rows]
    if not tables:
        return (0,) * len(names)
    keys = np.concatenate([t.column(KEY_HASH_COLUMN).to_numpy() for t in tables])
    # the distinct keys in increasing order and each row's number among them, as
    # np.unique(keys, return_inverse=True) gives them (key_numbers: a value sort)
    numbers = key_numbers(keys)
    unique, key_index = numbers.keys, numbers.index
    del keys, numbers
    h = np.empty((len(unique), len(names)), dtype=np.int64)
    for i, name in enumerate(names):
        values = np.concatenate([t.column(name).to_numpy() for t in tables])
        h[:, i] = exact_scores.exact_bincount(key_index, values, len(unique))
    total = [0] * len(names)
    for lo in range(0, len(unique), _COST_BLOCK):
        units = score.key_cost_units(h[lo:lo + _COST_BLOCK])
        for i in range(len(names)):
            total[i] += exact_scores.exact_sum(units[:, i])
    return tuple(total)


# --------------------------------------------------------------------------------------
# Beam stages
# --------------------------------------------------------------------------------------

class _UserStatisticsFn(beam.DoFn):
    DROPPED = "dropped"

    def __init__(self, key_columns, score, num_key_shards, user_column):
        self._key_columns = list(key_columns)
        self._score = score
        self._num_key_shards = num_key_shards
        self._user_column = user_column

    def process(self, table):
        dropped, partials = table_statistics(
            table, self._key_columns, self._score, num_key_shards=self._num_key_shards,
            user_column=self._user_column)
        yield beam.pvalue.TaggedOutput(self.DROPPED, dropped)
        for shard, partial in partials:
            yield shard, partial


class SumIntegers(beam.CombineFn):
    """Element-wise exact sum of fixed-length sequences of Python ints (the score units
    of ``accounting.exact_scores``): any order and grouping of the inputs gives the same
    tuple, so a selection draws the same on every runner. The empty input sums to zeros,
    so a selection stage still draws on an empty dataset."""

    def __init__(self, length):
        self._sum = exact_scores.SumExact(length)

    def create_accumulator(self):
        return self._sum.zero()

    def add_input(self, accumulator, vector):
        return self._sum.add(accumulator, vector)

    def merge_accumulators(self, accumulators):
        total = self._sum.zero()
        for accumulator in accumulators:
            total = self._sum.add(total, accumulator)
        return total

    def extract_output(self, accumulator):
        return accumulator


class _ExponentialMechanismFn(beam.DoFn):
    def __init__(self, score, epsilon, monotone, rng_factory=None, stage=""):
        self._score = score
        self._epsilon = epsilon
        self._monotone = monotone
        self._rng_factory = rng_factory
        self._stage = stage
        self._draws = beam.metrics.Metrics.counter("thresher", "contribution_bound_draws")

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, sums):
        # The stage's keyed stream (release secret + stage label): a recomputed or
        # retried draw picks the same C, so the selection's epsilon is spent once.
        rng = keyed_random.stage_stream(self._rng_factory, self._rng, self._stage)
        score = self._score
        values = score.exact_values(sums[0], sums[1])
        chosen, probabilities = contribution_bound.choose_bound(
            values, score.candidates, self._epsilon, score.selection_sensitivity, rng,
            monotone=self._monotone)
        self._draws.inc()
        _LOG.info(
            "NOT PRIVATE (operator log only, never in outputs): contribution bound "
            "score %s, candidates %s, V(C) %s (dropped %s, key cost %s), exponential "
            "mechanism probabilities %s; epsilon %g, sensitivity %g, monotone %s; "
            "chosen C = %d", score.kind, list(score.candidates),
            [round(float(v), 3) for v in values], list(sums[0]),
            [round(u / 2.0 ** score.cost_bits, 3) for u in sums[1]],
            np.round(probabilities, 6).tolist(),
            self._epsilon, float(score.selection_sensitivity), self._monotone, chosen)
        yield chosen


class ContributionBoundSums(beam.PTransform):
    """Stages 1-3: (dropped(C), sum_j floor(2^K c~(h~_j(C)))), two tuples of K Python
    ints, exact (``accounting.contribution_bound.exact_score_sums`` computes the same
    integers in one process; ``BoundScore.exact_values`` makes V(C) of them).

    NOT PRIVATE: the input of the exponential mechanism. Never write it to an output;
    it is public only so tests can check it against the one-process reference
    ``accounting.contribution_bound.exact_score_sums``."""

    def __init__(self, key_columns, score, *, num_key_shards=_DEFAULT_KEY_SHARDS,
                 user_column=USER_COLUMN, spill_dir=None, label=None):
        super().__init__(label)
        self._key_columns = list(key_columns)
        self._score = score
        self._num_key_shards = int(num_key_shards)
        self._user_column = user_column
        self._spill_dir = spill_dir   # the partials' shuffle through files (transforms/plumbing/spill.py)

    def expand(self, tables):
        """``tables``: whole users (PCollection[pa.Table]), or their statistics already
        computed (a dict: ``dropped`` PCollection[int64 K-vector] and ``partials``
        PCollection[(key shard, pa.Table)], as :func:`table_statistics` returns them,
        or of (key shard, piece reference) when their producer spilled them itself
        (element type ``spill.SHARD_AND_PIECE_REF``: ``spill.write_pieces``);
        ``transforms.bounding.scored_bound`` makes them in the bounding pass)."""
        k = len(self._score.candidates)
        key_columns, score = self._key_columns, self._score
        if isinstance(tables, dict):
            stats_dropped, stats_partials = tables["dropped"], tables["partials"]
        else:
            # pa.Table of whole users -> (shard, pa.Table of partial key sums) + dropped[K]
            stats = tables | "UserStatistics" >> beam.ParDo(_UserStatisticsFn(
                key_columns, score, self._num_key_shards, self._user_column)
                ).with_output_types(SHARD_AND_TABLE).with_outputs(
                    _UserStatisticsFn.DROPPED, main="partials")
            stats_dropped, stats_partials = stats[_UserStatisticsFn.DROPPED], stats.partials
        # 2K Python ints: dropped contributions, then key cost units
        dropped = stats_dropped | "DroppedRow" >> beam.Map(
            lambda v, k=k: tuple(int(x) for x in v) + (0,) * k)
        # (shard, [partials]) -> key cost units[K] of the shard's keys
        costs = (stats_partials
                 | "ShardByKey" >> (spill.GroupSpilledByKey()
                                    if stats_partials.element_type == spill.SHARD_AND_PIECE_REF
                                    else spill.group_by_key(self._spill_dir))
                 | "SumByKey" >> beam.MapTuple(
                     lambda _, parts, key_columns=key_columns, score=score:
                     (0,) * len(score.candidates)
                     + shard_key_costs(list(parts), key_columns, score)))
        return ((dropped, costs)
                | "Merge" >> beam.Flatten()
                | "SumScores" >> beam.CombineGlobally(SumIntegers(2 * k))
                | "Split" >> beam.Map(lambda v, k=k: (tuple(v[:k]), tuple(v[k:]))))


class ChooseContributionBound(beam.PTransform):
    """Choose the contribution bound C privately (paper 002, Algorithm 4).

    Input: PCollection[pyarrow.Table], user-sharded (every record of a user in one
    element), with the user id in ``__user`` and the key columns ``key_columns``.
    Output: a PCollection holding exactly one int, the chosen C (one of
    ``candidates``), drawn once and materialised: use it as
    ``beam.pvalue.AsSingleton(chosen, default_value=...)`` in any number of consumers.

    Args:
      key_columns: names of the key columns.
      candidates: the grid of bounds (strictly increasing ints in [1, max_bound]);
        None means ``accounting.contribution_bound.default_candidates(max_bound)``.
      epsilon: the selection's budget; the stage is (epsilon, 0)-DP.
      model: "l1" (records, rand-clip) or "l0" (distinct keys per user).
      score: "laplace_l1" | "laplace_l0" | "gaussian" | "sample_and_threshold".
      score_params: see ``accounting.contribution_bound.make_score``.
      max_bound: C_m; user weights are capped at C_m in the score.
      monotone: use the monotone exponential mechanism, Pr proportional to
        exp(-epsilon V / Delta) (every score here is monotone: adding a user never
        decreases V(C); docs/contribution_bound.md). False gives exp(-epsilon V / 2 Delta).
      rng_factory: the draw's source and stage label (``keyed_random.KeyedDraws``:
        ``source.child("ChooseContributionBound")``; tests: ``seeded_for_tests``).
      spill_dir: a local folder for the key-shard partials' shuffle (the in-process
        runner, ``transforms.plumbing.spill``); None uses the runner's GroupByKey.
    """

    def __init__(self, key_columns, *, candidates, epsilon, model, score, score_params,
                 max_bound, monotone=True, rng_factory=None, user_column=USER_COLUMN,
                 num_key_shards=_DEFAULT_KEY_SHARDS, spill_dir=None, label=None):
        super().__init__(label)
        if model not in contribution_bound.MODELS:
            raise ValueError(f"model must be one of {contribution_bound.MODELS}, got {model!r}")
        if score in contribution_bound.SCORE_MODELS and \
                contribution_bound.SCORE_MODELS[score] != model:
            raise ValueError(f"score {score!r} belongs to the "
                             f"{contribution_bound.SCORE_MODELS[score]} model, not {model!r}")
        if candidates is None:
            candidates = contribution_bound.default_candidates(max_bound)
        if not (isinstance(epsilon, (int, float)) and 0 < epsilon < float("inf")):
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        if not key_columns:
            raise ValueError("key_columns must name at least one column")
        if int(num_key_shards) < 1:
            raise ValueError(f"num_key_shards must be >= 1, got {num_key_shards}")
        self.score = contribution_bound.make_score(score, candidates, max_bound, score_params)
        self.epsilon = float(epsilon)
        self.monotone = bool(monotone)
        self._key_columns = list(key_columns)
        self._rng_factory = rng_factory
        self._user_column = user_column
        self._num_key_shards = int(num_key_shards)
        self._spill_dir = spill_dir

    @property
    def sensitivity(self):
        """Delta of the score (Prop. 1 / Prop. 3); the draw uses
        ``score.selection_sensitivity``, Delta plus the exact scores' rounding allowance."""
        return self.score.sensitivity

    @property
    def candidates(self):
        return self.score.candidates

    def expand(self, tables):
        """``tables``: user-sharded tables, or their statistics (a dict, see
        :meth:`ContributionBoundSums.expand`)."""
        sums = tables | "Scores" >> ContributionBoundSums(
            self._key_columns, self.score, num_key_shards=self._num_key_shards,
            user_column=self._user_column, spill_dir=self._spill_dir)
        return (sums
                | "ExponentialMechanism" >> keyed_random.par_do(_ExponentialMechanismFn(
                    self.score, self.epsilon, self.monotone,
                    *keyed_random.stage_of(self._rng_factory)))
                | "Materialise" >> beam.Reshuffle())

"""ScoredPerUserBound: l0 bounding for every candidate C and the choice's statistics, in
one pass over the user shards (``max_keys_per_user: auto``).

With an automatic bound a release needs two things from every user shard: the statistics
of the score V(C) that the exponential mechanism draws C from (paper 002, Algorithm 4;
``transforms.bounding.choose_contribution_bound``) and the per-key counts bounded at the drawn C
(``transforms.bounding.per_user_bound``). C is not known while the shards are read, but bounding
keeps, for every user, the first C keys of one uniformly random order of the user's
distinct keys (``per_user_bound.l0_ranks``), and that order does not depend on C. So one
pass per shard

1. sorts the shard once (``l0_pairs.l0_distinct_pairs``: ``l0_ranks``' order, by value
   sorts), which lists its distinct (user, key hash) pairs, users in order, the input
   of the score's statistics (``choose_contribution_bound.pair_statistics``,
   bit-identical to ``table_statistics``);
2. counts, per key and per *candidate bucket* b, the users whose rank of that key falls
   in [c_{b-1}, c_b) (b = 0 for ranks below c_0 = min C; ranks >= max C are never kept):
   the users keeping the key at C = c_i are those of buckets 0..i. One row per key holds
   the running sums over the buckets (:func:`running_counts`; grouped by the key numbers
   the statistics sort already makes, ``choose_contribution_bound.key_numbers``).

After the draw, :func:`select_bucket_counts` takes the running sum of bucket i of each
shard's table: per key, exactly the count ``bound_l0`` gives at C = c_i with the same
keyed randomness (same stage label ``PerUserBound``, same per-user salts), one row per key
as ``count_per_key`` makes (so ``SumCountsPerKey`` shuffles as many rows as with a fixed
bound), and the release is the one the two-pass pipeline publishes, byte for byte; the
privacy argument is unchanged: the draw is made once (keyed, ``transforms.randomness.keyed_random``)
and the published counts are a function of it and of the bounded data only. The shards
are concatenated, id-checked, key-hashed and sorted once instead of twice.

The running counts wait for the draw between stages; with ``spill_dir`` (the in-process
runner, ``transforms.plumbing.spill``) they wait as Arrow files and only their names are held.
With ``count_shards`` (the release's route, issue 43) the pass splits them by the key
shards ``SumCountsPerKey`` would use, and :meth:`ScoredPerUserBound.counts` selects each
piece at the drawn C and sums each key shard: the pieces ``SumCountsPerKey`` would have cut
from the selected tables (selecting rows of a piece is the piece of the selected rows), so
the same per-key counts, without a second split and spill. Spilled, each user shard's
pieces (the running counts' and the key-shard partials') go into one file per kind
(``spill.write_pieces``): two files per user shard instead of one per piece.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.transforms.randomness import keyed_random
from thresher.transforms.plumbing import spill
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.plumbing.arrow_coder import SHARD_AND_TABLE, TABLE
from thresher.transforms.plumbing.tables import key_shard_of, split_by_shard
from thresher.transforms.bounding.choose_contribution_bound import (
    _DEFAULT_KEY_SHARDS, KeyNumbers, _UserStatisticsFn, key_numbers, pair_statistics,
    table_statistics)
from thresher.transforms.bounding.l0_pairs import l0_distinct_pairs
from thresher.transforms.bounding.per_user_bound import (
    exact_key_codes, key_hash_is_exact_at, l0_pair_ranks_per_user)
from thresher.transforms.bounding.user_shards import (
    KEY_HASH_COLUMN, USER_COLUMN, concat_shard_with_order)


def candidate_buckets(rank_in_user, candidates):
    """Bucket of each rank: the index of the smallest candidate C with rank < C (so a
    row is kept at C = candidates[i] iff its bucket is <= i); len(candidates) when the
    rank is kept by no candidate."""
    return np.searchsorted(np.asarray(candidates, dtype=np.int64), rank_in_user, side="right")


def running_counts(table, key_columns, key_rows, pair_key, buckets, num_buckets):
    """(key columns, ``__key``, ``__n0`` .. ``__n{m-1}``): one row per key that some
    candidate keeps, ``__n<i>`` the number of the table's distinct (user, key) pairs of
    that key in buckets 0..i, i.e. its users at C = candidates[i] (columns past the
    shard's last used bucket, m - 1, would repeat ``__n{m-1}`` and are left out).

    ``pair_key``: each distinct pair's key number 0..J-1 (one per exact key);
    ``key_rows``: a table row of each key (its key columns, J of them);
    ``buckets``: each pair's :func:`candidate_buckets` (``num_buckets`` = no candidate).
    One row per key instead of one per key and bucket: ``SumCountsPerKey`` gets as many
    rows from the chosen C as from a fixed bound (issue 19)."""
    kept = buckets < num_buckets
    pair_key, buckets = pair_key[kept], buckets[kept]
    if len(pair_key) == 0:
        return None
    # keys with a kept pair, renumbered densely 0..J'-1 in key order
    present = np.bincount(pair_key, minlength=len(key_rows)) > 0
    renumber = np.cumsum(present, dtype=np.int64) - 1
    pair_key = renumber[pair_key]
    num_keys = int(renumber[-1]) + 1
    # a radix sort: buckets fit in 8 (or 16) bits
    buckets = buckets.astype(np.uint8 if num_buckets < 256 else np.uint16)
    by_bucket = np.argsort(buckets, kind="stable")
    bounds = np.searchsorted(buckets[by_bucket], np.arange(int(buckets.max()) + 2))
    pair_key = pair_key[by_bucket]
    dtype = np.int32 if len(pair_key) < np.iinfo(np.int32).max else np.int64
    out = table.select(list(key_columns) + [KEY_HASH_COLUMN]).take(
        pa.array(key_rows[present]))
    running = np.zeros(num_keys, dtype=np.int64)
    for b in range(len(bounds) - 1):
        running += np.bincount(pair_key[bounds[b]:bounds[b + 1]], minlength=num_keys)
        out = out.append_column(_count_column(b), pa.array(running.astype(dtype)))
    return out.combine_chunks()


def _count_column(bucket):
    return f"__n{bucket}"


# The keys of one user that the automatic bound reads (issue 43): a user with more
# distinct keys is scored on the first USER_KEY_CAP of its random order of keys
# (:func:`user_key_cap`), a uniform random subset drawn by the keyed randomness of its
# identity, and may hand the shuffle about that many rows per table
# (``transforms.bounding.prereduce``): a heavy user is bounded, not refused.
USER_KEY_CAP = 1 << 16


def user_key_cap(candidates):
    """The number of keys of a user the score reads: ``USER_KEY_CAP``, or the largest
    candidate when that is larger (the cap never cuts a key some candidate keeps)."""
    return max(USER_KEY_CAP, int(max(candidates)))


def scored_table(table, key_columns, score, rng, num_key_shards=_DEFAULT_KEY_SHARDS,
                 by_user=None):
    """One user shard -> (running counts table or None, dropped[K], key-shard partials).

    ``rng``: the bounding stage's source (as ``per_user_bound._BoundL0Fn`` uses it). The
    statistics are ``table_statistics`` of each user's first :func:`user_key_cap` keys
    (of the same random order the bounding keeps the first C of: every key of a user
    with at most that many keys); the running counts (:func:`running_counts`) select to
    ``per_user_bound.bound_table_l0(table, key_columns, C, rng)``'s counts for every
    candidate C.

    The cap and privacy. For a user with k_i > cap = :func:`user_key_cap` distinct keys,
    the score reads a set S_i of ``cap`` of them: the first ``cap`` of the user's
    uniformly random order (keyed by the secret and the user's identity alone), so S_i is
    a function of the user's own records and the secret, and a neighbouring dataset
    (one user added or removed) changes one S_i only. V(C) on the S_i is the paper's
    score on a dataset of users each holding at most ``cap`` keys; its sensitivity
    (``accounting.contribution_bound.score_sensitivity``) bounds any one user's effect
    whatever its number of keys, so the exponential mechanism's guarantee is unchanged.
    The dropped term is unchanged too (min(k_i, C_m) = min(cap, C_m) = C_m for
    cap >= C_m), and so is every candidate's kept set (the first C <= cap keys of the same
    order). Only the key-cost term of such users changes: C / cap instead of C / k_i on
    cap of their keys instead of all of them.

    ``by_user``: the ``user_shards.UserOrder`` of the table's ``__user`` when the caller
    has it (``user_shards.concat_shard_with_order``), handed to
    ``l0_pairs.l0_distinct_pairs`` so that the shard is sorted by user once."""
    candidates = score.candidates
    cap = user_key_cap(candidates)
    if table.num_rows == 0:
        return None, *table_statistics(table, key_columns, score,
                                       num_key_shards=num_key_shards)
    users = table.column(USER_COLUMN).to_numpy()
    bound_rng = keyed_random.bind_users(rng, table, key_columns)
    key_hash = np.asarray(table.column(KEY_HASH_COLUMN).to_numpy(), dtype=np.uint64)
    # every row's key number (distinct hashes in increasing order) and the first row of
    # each: the hash check compares every row's key with its hash's first row
    # (key_hash_is_exact without its own hash pass), and the numbers serve the
    # statistics and the running counts
    row_numbers = key_numbers(key_hash)
    if key_hash_is_exact_at(table, key_columns, row_numbers.first[row_numbers.index]):
        # the distinct (user, key hash) pairs, users contiguous and in increasing number
        # (l0_ranks' distinct rows)
        pair_rows, rank_in_user, pair_users = l0_distinct_pairs(users, key_hash, bound_rng,
                                                                by_user=by_user)
        if int(rank_in_user.max()) >= cap:   # a user beyond the cap: its first cap keys
            inside = rank_in_user < cap
            pair_rows, rank_in_user = pair_rows[inside], rank_in_user[inside]
            pair_users = pair_users[inside]
            numbers = key_numbers(key_hash[pair_rows])   # the keys of the pairs read
            key_rows = pair_rows[numbers.first]
        else:   # every row's pair is read: the pairs' keys are the rows' keys
            numbers = KeyNumbers(row_numbers.keys, row_numbers.index[pair_rows], None)
            key_rows = row_numbers.first
        del row_numbers
        dropped, partials = pair_statistics(pair_users, None, None, score,
                                            num_key_shards, numbers=numbers)
        del pair_users
        pair_key = numbers.index
    else:   # colliding key hashes: the users whose own keys collide are ranked on exact
        # key codes, every other user by its hash ranking (as bound_table_l0 does)
        beam.metrics.Metrics.counter("thresher_not_private",
                                     "shards_with_key_hash_collisions").inc()
        codes = exact_key_codes(table, key_columns)
        pair_rows, rank_in_user = l0_pair_ranks_per_user(table, key_columns, rng)
        scored = table
        if np.any(rank_in_user >= cap):      # a user beyond the cap: its first cap keys
            inside = rank_in_user < cap
            pair_rows, rank_in_user = pair_rows[inside], rank_in_user[inside]
            scored = table.take(pa.array(np.sort(pair_rows)))
        _, first_pair, pair_key = np.unique(codes[pair_rows], return_index=True,
                                            return_inverse=True)
        pair_key = pair_key.reshape(-1)
        key_rows = pair_rows[first_pair]
        dropped, partials = table_statistics(scored, key_columns, score,
                                             num_key_shards=num_key_shards)
    buckets = candidate_buckets(rank_in_user, candidates)
    counts = running_counts(table, key_columns, key_rows, pair_key, buckets,
                            len(candidates))
    return counts, dropped, partials


def select_bucket_counts(counts, bound, candidates):
    """Per-key counts at C = ``bound`` (one of ``candidates``) from a running counts
    table: (key columns, ``__key``, int64 ``count``), one row per key with a user at that
    C (what ``bound_table_l0`` and ``count_per_key`` give at C), or None if none."""
    index = list(candidates).index(int(bound))
    names = [n for n in counts.column_names if n.startswith("__n")]
    count = pc.cast(counts.column(_count_column(min(index, len(names) - 1))), pa.int64())
    selected = counts.drop_columns(names).append_column("count", count)
    selected = selected.filter(pc.greater(count, pa.scalar(0, pa.int64())))
    return selected if selected.num_rows else None


class _ScoredBoundFn(beam.DoFn):
    DROPPED = _UserStatisticsFn.DROPPED
    PARTIALS = "partials"

    def __init__(self, key_columns, score, num_key_shards, rng_factory, stage, spill_dir,
                 concat=None, count_shards=None):
        self._concat = None if concat is None else dict(concat)
        self._count_shards = None if count_shards is None else int(count_shards)
        self._key_columns = tuple(key_columns)
        self._score = score
        self._num_key_shards = num_key_shards
        self._rng_factory = rng_factory
        self._stage = stage
        self._spill_dir = spill_dir

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, element):
        if self._concat is None:              # a table of whole users
            table, by_user = element, None
        else:                                 # (shard, [pieces]): concatenated here
            table, by_user = concat_shard_with_order(element, **self._concat)
            if table is None:
                return
        rng = keyed_random.stage_source(self._rng_factory, self._rng, self._stage)
        counts, dropped, partials = scored_table(table, self._key_columns, self._score, rng,
                                                 self._num_key_shards, by_user=by_user)
        beam.metrics.Metrics.counter("thresher_not_private", "rows_bounded").inc(table.num_rows)
        yield beam.pvalue.TaggedOutput(self.DROPPED, dropped)
        if self._spill_dir is not None:   # one file of all the shard's partials
            partials = spill.write_pieces(partials, self._spill_dir)
        for shard_and_partial in partials:
            yield beam.pvalue.TaggedOutput(self.PARTIALS, shard_and_partial)
        if counts is None:
            return
        if self._count_shards is None:        # one running counts table (select)
            yield counts if self._spill_dir is None else spill.write_piece(counts, self._spill_dir)
            return
        # split by the key shards of the per-key sums (counts_at_chosen_bound), as
        # SumCountsPerKey splits its input: one file of all the pieces when spilling
        pieces = split_by_shard(counts, key_shard_of(counts, self._count_shards),
                                self._count_shards, slices=self._spill_dir is not None)
        yield from (pieces if self._spill_dir is None
                    else spill.write_pieces(pieces, self._spill_dir))


def sum_selected_counts(shard_and_pieces, bound, candidates, key_columns):
    """One key shard's per-key counts at C = ``bound``: each running counts piece
    selected to that C (:func:`select_bucket_counts`), then summed per key as
    ``aggregate.SumCountsPerKey`` sums its shard (the same pieces: selecting a piece of
    a table is the piece of the selected table, rows in the same order). A spilled piece
    (its reference, ``spill.write_pieces``) is read when its turn comes and only its
    selection is kept: the shard's running counts of every candidate are never held at
    once."""
    shard, pieces = shard_and_pieces
    selected = []
    for piece in pieces:
        if not isinstance(piece, pa.Table):
            piece = spill.read_piece(piece)
        chosen = select_bucket_counts(piece, bound, candidates)
        del piece
        if chosen is not None:
            beam.metrics.Metrics.counter("thresher_not_private", "contributions_kept").inc(
                int(pc.sum(chosen.column("count")).as_py()))
            selected.append(chosen)
    yield from SumCountsPerKey.per_shard((shard, selected), key_columns=key_columns)


def _select(counts_or_path, bound, candidates):
    counts = (spill.read_piece(counts_or_path) if isinstance(counts_or_path, str)
              else counts_or_path)
    selected = select_bucket_counts(counts, bound, candidates)
    if selected is not None:
        beam.metrics.Metrics.counter("thresher_not_private", "contributions_kept").inc(
            int(pc.sum(selected.column("count")).as_py()))
        yield selected


class ScoredPerUserBound(beam.PTransform):
    """The bounding pass of an automatic bound (module docstring).

    Input: PCollection[pa.Table] of whole users (``ShardByUser``), or, with ``concat``
    (``ShardByUser.concat_arguments()``), the groups of ``ShardByUser.grouped``: each
    is then concatenated in the bounding step itself
    (``user_shards.concat_shard_with_order``), whose sort by user also orders the
    bounding (one sort by user per shard instead of two; the same tables, so the same
    outputs). Hand it the draws
    ``release.child("PerUserBound")`` (the fixed-bound pipeline's; that label path keys
    the per-user salts).
    Output: a dict — ``dropped`` and ``partials``, the statistics that
    ``ChooseContributionBound`` takes instead of user shards (:meth:`statistics`), and
    ``buckets``: the running counts tables (or their spilled file names) for :meth:`select`,
    or with ``count_shards`` their (key shard, piece) splits for :meth:`counts`.
    """

    def __init__(self, key_columns, score, rng_factory=None, spill_dir=None,
                 num_key_shards=_DEFAULT_KEY_SHARDS, concat=None, count_shards=None,
                 label=None):
        super().__init__(label)
        self._concat = concat
        # count_shards: the running counts leave the pass split by the key shards of the
        # per-key sums (:meth:`counts`); None: one table per user shard (:meth:`select`)
        self._count_shards = None if count_shards is None else int(count_shards)
        self._key_columns = tuple(key_columns)
        self._score = score
        self._rng_factory = rng_factory
        self._spill_dir = spill_dir
        self._num_key_shards = int(num_key_shards)

    def expand(self, user_shards):
        fn = _ScoredBoundFn(self._key_columns, self._score, self._num_key_shards,
                            *keyed_random.stage_of(self._rng_factory), self._spill_dir,
                            concat=self._concat, count_shards=self._count_shards)
        out = user_shards | "BoundL0AndScore" >> keyed_random.par_do(fn).with_outputs(
            _ScoredBoundFn.DROPPED, _ScoredBoundFn.PARTIALS, main="buckets")
        out[_ScoredBoundFn.PARTIALS].element_type = (
            SHARD_AND_TABLE if self._spill_dir is None
            else spill.SHARD_AND_PIECE_REF)
        buckets = out.buckets
        if self._count_shards is None:
            buckets.element_type = str if self._spill_dir is not None else TABLE
        else:
            buckets.element_type = (SHARD_AND_TABLE if self._spill_dir is None
                                    else spill.SHARD_AND_PIECE_REF)
        return {"dropped": out[_ScoredBoundFn.DROPPED],
                "partials": out[_ScoredBoundFn.PARTIALS], "buckets": buckets}

    @staticmethod
    def statistics(outputs):
        """The input of ``ChooseContributionBound`` among this transform's outputs. With
        ``spill_dir`` the partials are references to the pieces the pass spilled (one
        file per user shard, ``spill.write_pieces``; their element type says so:
        ``spill.SHARD_AND_PIECE_REF``)."""
        return {"dropped": outputs["dropped"], "partials": outputs["partials"]}

    def select(self, buckets, chosen, default):
        """Per-key partial counts at the chosen C (a one-int PCollection): the input of
        ``SumCountsPerKey`` (without ``count_shards``)."""
        return buckets | "SelectChosenBound" >> beam.FlatMap(
            _select, bound=beam.pvalue.AsSingleton(chosen, default_value=default),
            candidates=tuple(self._score.candidates)).with_output_types(TABLE)

    def counts(self, buckets, chosen, default, label="SumCountsAtChosenBound"):
        """Per-key counts at the chosen C (a one-int PCollection), each key once (with
        ``count_shards``): what ``SumCountsPerKey(key_columns, count_shards)`` gives of
        :meth:`select`'s tables, the same rows per key shard, without a second split
        and spill of the selected counts (issue 43): the pass already split its running
        counts by key shard (one file per user shard when spilling)."""
        if self._count_shards is None:
            raise ValueError("ScoredPerUserBound.counts needs count_shards")
        return buckets | label >> _SumAtChosenBound(
            chosen, default, tuple(self._score.candidates), self._key_columns)


class _SumAtChosenBound(beam.PTransform):
    """(key shard, running counts piece) -> the shard's per-key counts at the chosen C
    (:func:`sum_selected_counts`; :meth:`ScoredPerUserBound.counts`)."""

    def __init__(self, chosen, default, candidates, key_columns):
        super().__init__()
        self._chosen, self._default = chosen, default
        self._candidates, self._key_columns = candidates, key_columns

    def expand(self, buckets):
        # spilled: the references are grouped, and sum_selected_counts reads each piece
        return (buckets
                | "GroupKeyShards" >> beam.GroupByKey()
                | "SumPerKey" >> beam.FlatMap(
                    sum_selected_counts,
                    bound=beam.pvalue.AsSingleton(self._chosen, default_value=self._default),
                    candidates=self._candidates,
                    key_columns=self._key_columns).with_output_types(TABLE))

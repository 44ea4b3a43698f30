"""ShardByUser: bring every record of a user into one element, by a hash-sharded shuffle.

Input: PCollection[pyarrow.Table] of record batches with columns ``__user`` and
``__user_lo`` (the two 64-bit words of the user's identity, a secret-keyed PRF of the
user id computed when the record is read: :mod:`transforms.randomness.user_identity`), ``__key``
(uint64 hash of the key columns) and the key columns. Output: PCollection[pyarrow.Table],
each element holding *all* records of the users whose ``__user`` falls in one shard --
what contribution bounding (PerUserBound, RandClip) and per-user statistics
(ChooseContributionBound) need.

**Users.** A user is a distinct (``__user``, ``__user_lo``) pair: the identity is a
function of the user's own id and the release secret alone, so it cannot be crafted to
collide and never depends on the other users present (issue 25, F1). Every per-user
random stream is keyed by the two words (:func:`user_identity_columns`). The bounding
kernels group users by the one word ``__user``; :func:`exact_users` (applied to every
shard) makes that grouping exact: in the rare table where two users share ``__user``
(probability about U^2 / 2^65 for U users), ``__user`` becomes a dense grouping code and
the identity's word moves to ``__user_hi``. The grouping code is used to group and sort
rows only, never as a stream identity.

Rows travel as Arrow batches, never one Python object per row: batches (coalesced to about
``COALESCE_ROWS`` rows) are split into ``num_shards`` pieces with one radix argsort, and a
GroupByKey on the shard id gathers them.
"""
import typing

import apache_beam as beam
import numpy as np
import pyarrow as pa
from apache_beam.utils.windowed_value import WindowedValue

from thresher.transforms.plumbing import spill
from thresher.transforms.plumbing.arrow_coder import SHARD_AND_TABLE, TABLE
# The column names and table helpers live in plumbing.tables (the layers below bounding use
# them); imported here, they stay importable from this module as before.
from thresher.transforms.plumbing.tables import (  # noqa: F401
    KEY_HASH_COLUMN, USER_COLUMN, USER_HIGH_COLUMN, USER_LOW_COLUMN, ShardSlices, chunked,
    concat, split_by_shard, user_columns, user_identity_columns)
from thresher.transforms.randomness.hashing import hash_columns, mix64

SHARD_AND_PATH = beam.typehints.Tuple[int, str]


def user_shard_of(user_hash, num_shards):
    # The top bits pick the shard so that the low bits (used by bounding's ordering) stay
    # independent of it.
    return ((user_hash >> np.uint64(40)) % np.uint64(num_shards)).astype(np.int64)


# Read batches are coalesced up to this many rows before they are split: the shuffle then
# moves num_shards pieces per ~1M rows instead of per read batch (row group), which cuts
# the runner's per-element cost (about 0.6 s of CPU per 1e7 rows at 100k-row row groups).
COALESCE_ROWS = 1 << 20

# A pre-reduction may hand the split its combined table whole, with the rows it keeps
# marked in this boolean column (``prereduce.PreReducePairs(mark_kept=True)``, where it
# keeps at least ``prereduce.MARK_MIN_KEPT`` of them), instead of a filtered copy: the
# split's gathers then take the kept rows only (issue 43: a filter copied ~93 % of every
# table of the automatic bound, ~12 ms per 1e6 rows). The column never leaves the split;
# a null (a table without the column, concatenated with one that has it) keeps its row.
KEPT_COLUMN = "__kept"


def _without_kept_column(table, marked):
    """(``table`` without ``KEPT_COLUMN``, its mask of kept rows or None when unmarked).
    ``marked``: the split's input comes from a pre-reduction that marks its rows
    (``ShardByUser(marked=True)``); any other table is unmarked, whatever its columns (a
    column of a caller's own named ``__kept`` is data, never a mask)."""
    if not marked or KEPT_COLUMN not in table.column_names:
        return table, None
    kept = table.column(KEPT_COLUMN).fill_null(True).to_numpy(zero_copy_only=False)
    return table.drop_columns([KEPT_COLUMN]), kept


def _shards_of_kept(table, kept, num_shards):
    """Each row's user shard; ``num_shards`` (no shard: ``split_by_shard`` leaves the row)
    for a row the pre-reduction did not keep (``kept``: the ``KEPT_COLUMN`` mask, or None)."""
    shards = user_shard_of(table.column(USER_COLUMN).to_numpy(), num_shards)
    if kept is not None:
        shards[~kept] = num_shards
    return shards


class _SplitByUser(beam.DoFn):
    def __init__(self, num_shards, coalesce_rows=None, drop_key_hash=False, spill_dir=None,
                 gate_min_rows=None, marked=False):
        # gate_min_rows: also emit, tagged GATE_STATS, the per-user row counts of each
        # split table's heavy buckets (heavy_user_counts: the gate before the group);
        # marked: the tables carry KEPT_COLUMN (a pre-reduction's mark_kept)
        self._gate_min_rows = gate_min_rows
        self._marked = bool(marked)
        self._num_shards = num_shards
        self._coalesce_rows = COALESCE_ROWS if coalesce_rows is None else coalesce_rows
        if spill_dir is not None:
            # spilled pieces: linear in the rows (transforms.plumbing.spill.PIECE_ROWS)
            self._coalesce_rows = max(self._coalesce_rows, spill.split_rows(num_shards))
        self._drop_key_hash = drop_key_hash
        self._spill_dir = spill_dir

    def start_bundle(self):
        self._pending = {}  # window -> [tables]
        self._pending_rows = {}
        self._held = {}     # spilled: window -> (ShardSlices, [user columns for the gate])

    def _split(self, tables):
        table = concat(tables)
        del tables   # the gathered tables go before the split's gathers (a copy is combined)
        if table is None:
            return
        table, kept = _without_kept_column(table, self._marked)
        if self._gate_min_rows is not None:
            counted = heavy_user_counts(table, self._gate_min_rows, kept=kept)
            if counted is not None:
                yield beam.pvalue.TaggedOutput(GATE_STATS, counted)
        if self._drop_key_hash and KEY_HASH_COLUMN in table.column_names:
            table = table.drop_columns([KEY_HASH_COLUMN])   # recomputed after the shuffle
        yield from split_by_shard(table, _shards_of_kept(table, kept, self._num_shards),
                                  self._num_shards)

    def _hold(self, table, window):
        """Spilled pieces: split ``table`` now (``tables.ShardSlices``: each take within
        one table) and write the window's pieces once it holds ``coalesce_rows`` rows."""
        held = self._held.get(window)
        if held is None:
            held = self._held[window] = (ShardSlices(self._num_shards), [])
        slices, users = held
        table, kept = _without_kept_column(table, self._marked)
        if self._gate_min_rows is not None:   # the gate counts the kept rows one write holds
            identities = table.select([USER_COLUMN, USER_LOW_COLUMN])
            users.append(identities if kept is None else identities.filter(pa.array(kept)))
        slices.add(table, _shards_of_kept(table, kept, self._num_shards))
        if slices.rows >= self._coalesce_rows:
            del self._held[window]
            yield from self._write(slices, users)

    def _write(self, slices, users):
        """(shard, file name) of each held piece, after the gate's counts of their rows
        (the counts the split of their concatenation gives)."""
        users = chunked(users)
        if users is not None:
            counted = heavy_user_counts(users, self._gate_min_rows)
            if counted is not None:
                yield beam.pvalue.TaggedOutput(GATE_STATS, counted)
        for shard, piece in slices.take():   # the bytes stay on disk
            yield shard, spill.write_piece(piece, self._spill_dir)

    def process(self, table, window=beam.DoFn.WindowParam):
        if self._spill_dir is not None:
            yield from self._hold(table, window)
            return
        if table.num_rows >= self._coalesce_rows:
            yield from self._split([table])
            return
        self._pending.setdefault(window, []).append(table)
        self._pending_rows[window] = self._pending_rows.get(window, 0) + table.num_rows
        if self._pending_rows[window] >= self._coalesce_rows:
            del self._pending_rows[window]
            yield from self._split(self._pending.pop(window))   # _split holds the only list

    def finish_bundle(self):
        outputs = [(window, self._split(tables)) for window, tables in self._pending.items()]
        outputs += [(window, self._write(*held)) for window, held in self._held.items()]
        for window, pieces in outputs:
            for piece in pieces:
                if isinstance(piece, beam.pvalue.TaggedOutput):
                    yield beam.pvalue.TaggedOutput(piece.tag, WindowedValue(
                        piece.value, window.max_timestamp(), [window]))
                else:
                    yield WindowedValue(piece, window.max_timestamp(), [window])
        self._pending = {}
        self._pending_rows = {}
        self._held = {}


def order_by_user(user_hash):
    """A permutation that makes each user's rows contiguous, users in increasing
    ``user_hash`` and each user's rows in their table order.

    Value sorts of uint64 are ~7x faster than argsorts here, so the row number rides in
    the low b = bit_length(n - 1) bits of the user hash and one ``np.sort`` of the packed
    words gives the order. Two users sharing their top 64 - b bits (probability about
    U^2 2^-(65-b) for U users) could interleave: that is detected and the exact (stable)
    argsort is used instead."""
    user_hash = np.asarray(user_hash, dtype=np.uint64)
    n = len(user_hash)
    bits = max(1, (n - 1).bit_length())
    if bits > 32:
        return np.argsort(user_hash, kind="stable")
    low = np.uint64((1 << bits) - 1)
    packed = (user_hash & ~low) | np.arange(n, dtype=np.uint64)
    packed.sort()
    order = (packed & low).astype(np.intp)
    top = packed & ~low
    users = user_hash[order]
    if np.any((top[1:] == top[:-1]) & (users[1:] != users[:-1])):
        return np.argsort(user_hash, kind="stable")
    return order


class UserOrder(typing.NamedTuple):
    """A table's rows by user (:func:`order_by_user` of its ``__user``): ``order`` the
    permutation, ``sorted_users`` the ``__user`` words in that order. Handed from
    :func:`exact_users_with_order` to ``per_user_bound.l0_ranks`` so that a shard is
    sorted by user once, not twice."""
    order: np.ndarray
    sorted_users: np.ndarray


def exact_users(table):
    """:func:`exact_users_with_order`'s table."""
    return exact_users_with_order(table)[0]


def exact_users_with_order(table):
    """(table, user order): ``table`` with ``__user`` one-to-one on its users (the
    (``__user``, ``__user_lo``) pairs), so grouping rows by ``__user`` alone groups them by the full
    128-bit identity. Works on a user shard or on a single read batch (to group a
    batch's rows by user before the shuffle, e.g. to pre-reduce a heavy user: use the
    result locally; what is shuffled keeps word 0 in ``__user``, which picks the shard).

    The check is one sort (:func:`order_by_user`, a value sort of packed words; a hash
    pass, Arrow's dictionary encoding of the words, cost 8x more): ``__user_lo`` must be
    constant on each run of equal ``__user``. Where it is not (two users sharing word 0:
    accidental, about U^2 / 2^65 for U users, and not craftable without the release
    secret), ``__user`` becomes mix64 of the rank of each (word 0, word 1) pair among the
    table's distinct pairs, a bijection of the pairs used for grouping and sorting only,
    and word 0 is kept as ``__user_hi`` for the streams (:func:`user_identity_columns`).
    Tables without ``__user_lo`` (built by hand in tests) are returned as they are.

    The second value is the :class:`UserOrder` of the returned table's ``__user`` (the
    check's sort), or None where the check did not sort it (a table of fewer than two
    rows or without ``__user_lo``) or ``__user`` was replaced."""
    names = table.column_names
    if USER_LOW_COLUMN not in names or USER_HIGH_COLUMN in names or table.num_rows < 2:
        return table, None
    high = table.column(USER_COLUMN)
    high = high.combine_chunks() if high.num_chunks != 1 else high.chunk(0)
    words = high.to_numpy(zero_copy_only=False)
    low = table.column(USER_LOW_COLUMN).to_numpy()
    order = order_by_user(words)
    sorted_words, sorted_low = words[order], low[order]
    if not np.any((sorted_words[1:] == sorted_words[:-1])
                  & (sorted_low[1:] != sorted_low[:-1])):
        return table, UserOrder(order, sorted_words)
    order = np.lexsort((low, words))
    new = np.ones(len(order), dtype=bool)
    new[1:] = (words[order][1:] != words[order][:-1]) | (low[order][1:] != low[order][:-1])
    rank = np.empty(len(order), dtype=np.uint64)
    rank[order] = np.cumsum(new) - 1
    position = names.index(USER_COLUMN)
    table = table.set_column(position, USER_COLUMN, pa.array(mix64(rank), type=pa.uint64()))
    return table.add_column(position + 1, USER_HIGH_COLUMN, high), None


# The most rows of one user that a consumer of whole users accepts, where its kernels
# hold all of them in one element (pipelines.running.release names the setting that makes it so:
# an automatic bound, l1, adaptive rounds, aggregates): ~500 bytes a row in the automatic
# bound's kernels, so 2**21 rows stay near 1 GB; one user with more fails the run.
MAX_USER_ROWS = 1 << 21
# Refuse a user known to pass MAX_USER_ROWS before the shuffle's group, not only after it
# (gated, "The gate before the group" below); the check after the group stays.
GATE_BEFORE_GROUP = True


def user_row_counts(pieces):
    """(largest number of rows of one user, that user's __user word) over shuffle pieces
    (tables or spilled paths), reading only the user columns: per piece the counts per
    (``__user``, ``__user_lo``) pair, merged across pieces (memory grows with the users,
    not the rows)."""
    users, counts = [], []
    for piece in pieces:
        part = (spill.read_piece_columns(piece, [USER_COLUMN, USER_LOW_COLUMN])
                if isinstance(piece, str) else piece.select([USER_COLUMN, USER_LOW_COLUMN]))
        if part.num_rows:
            pairs = np.stack([part.column(USER_COLUMN).to_numpy(),
                              part.column(USER_LOW_COLUMN).to_numpy()], axis=1)
            unique, count = np.unique(pairs, axis=0, return_counts=True)
            users.append(unique)
            counts.append(count)
    if not users:
        return 0, None
    unique, inverse = np.unique(np.concatenate(users), axis=0, return_inverse=True)
    total = np.bincount(inverse.ravel(), weights=np.concatenate(counts)).astype(np.int64)
    top = int(np.argmax(total))
    return int(total[top]), int(unique[top, 0])


def _piece_rows(piece):
    if isinstance(piece, str):
        with pa.memory_map(piece, "rb") as source:
            return pa.ipc.open_file(source).read_all().num_rows
    return piece.num_rows


def check_user_rows(pieces, max_user_rows, setting):
    """Raise ``InputError`` when one user has more than ``max_user_rows`` rows in a
    shard's pieces, before they are concatenated. ``setting``: (the spec field that makes
    the consumers hold all of a user's rows, what to do instead). Costs nothing while the
    shard itself has fewer rows (the usual case).

    The message says only that the limit was passed, never the user's count: an exact
    statistic of one user must not leave the run (review F3). The refusal comes after the
    data was read, so the run keeps its ledger charge (``ledger.Reservation.reading``)."""
    if sum(_piece_rows(p) for p in pieces) <= max_user_rows:
        return
    rows, _ = user_row_counts(pieces)
    if rows > max_user_rows:
        raise refusal(max_user_rows, setting)


def refusal(max_user_rows, setting):
    """The ``InputError`` refusing a user over ``max_user_rows`` (never its count)."""
    from thresher.errors import InputError
    field, remedy = setting
    return InputError(
        f"{field}: a user has more than {max_user_rows:,} rows, and with this setting "
        f"all of a user's rows are held in one place: at most {max_user_rows:,} rows "
        f"per user are accepted (memory); {remedy}. Nothing was published.")


def _concat_shard(shard_and_tables, key_columns=None, after=None, max_user_rows=None,
                  setting=None):
    # ``after``: an unused side input that orders this step after its producer
    table, _ = concat_shard_with_order(shard_and_tables, key_columns, max_user_rows, setting)
    if table is not None:
        yield table


def concat_shard_with_order(shard_and_tables, key_columns=None, max_user_rows=None,
                            setting=None):
    """(one table of whole users, its :class:`UserOrder`) from a ``(shard, [Table or
    spilled path])`` group (:meth:`ShardByUser.grouped`), or (None, None) for an empty
    group: the table :meth:`ShardByUser.concat` yields (:func:`exact_users`, ``__key``
    present) and the sort by user its check made (``exact_users_with_order``; None where
    it made none), so that a consumer doing both in one step sorts the shard by user once
    (issue 43: ``scored_bound``'s bounding pass; the order is handed on within that one
    call, never kept between elements)."""
    _, tables = shard_and_tables
    tables = list(tables)
    if max_user_rows is not None:
        check_user_rows(tables, max_user_rows, setting)
    tables = [spill.read_piece(t) if isinstance(t, str) else t for t in tables]
    table = concat(tables)
    del tables   # the pieces read go before the shard is sorted (their copy is combined)
    if table is None:
        return None, None
    table, order = exact_users_with_order(table)
    if key_columns is not None and KEY_HASH_COLUMN not in table.column_names:
        table = with_key_hash(table, key_columns)     # a column more: the rows stay
    return table, order


def with_key_hash(table, key_columns):
    """``table`` with ``__key`` (the reader's hash of the key columns,
    ``pipelines.io.prepare_batch``) back in its place, after the user columns."""
    key_hash = pa.array(hash_columns(table, list(key_columns)), type=pa.uint64())
    return table.add_column(len(user_columns(table)), KEY_HASH_COLUMN, key_hash)


class ShardByUser(beam.PTransform):
    """Hash-shard record batches by user so each output element has whole users."""

    def __init__(self, num_shards, key_columns=None, spill_dir=None, coalesce_rows=None,
                 max_user_rows=None, setting=None, grouped_only=False, marked=False,
                 label=None):
        """``coalesce_rows``: read batches are combined up to this many rows before they
        are split (``COALESCE_ROWS`` by default; 1 when the input's tables are combined
        already, e.g. by ``transforms.bounding.prereduce.PreReduceL0``); with
        ``spill_dir`` each table is split as it comes and its pieces are held until this
        many rows (at least ``spill.split_rows``) are, then written (``tables.ShardSlices``). ``max_user_rows``: refuse
        (``InputError`` naming ``setting``, the spec setting that makes the consumers hold
        every row of a user) a user with more rows (:func:`check_user_rows`).
        ``grouped_only``: the output is :meth:`grouped`'s ``(shard, [pieces])``, for a
        consumer that concatenates each shard itself with :meth:`concat_arguments`.
        ``marked``: the input is ``prereduce.PreReducePairs(mark_kept=True)``'s, whose
        tables carry the rows they keep in ``KEPT_COLUMN``: the split hands on those rows
        only (without it, no column is read as a mark)."""
        super().__init__(label)
        self._marked = bool(marked)
        self._grouped_only = grouped_only
        self._coalesce_rows = coalesce_rows
        self._max_user_rows = max_user_rows
        self._setting = setting
        if num_shards < 1:
            raise ValueError(f"num_shards must be >= 1, got {num_shards}")
        self._num_shards = int(num_shards)
        self._key_columns = tuple(key_columns) if key_columns is not None else None
        self._spill_dir = spill_dir

    def expand(self, batches):
        grouped = self.grouped(batches)
        if self._grouped_only:
            return grouped
        return grouped | "ConcatUserShard" >> self.concat()

    def grouped(self, batches):
        """The shuffle alone: PCollection[(shard, [Table])]. With ``key_columns`` and no
        ``spill_dir`` the ``__key`` hash does not travel through the runner's shuffle (8
        of the ~36 bytes a string row moves): it is recomputed from the key columns in
        :meth:`concat`. With ``spill_dir`` (a local folder every worker can reach) the
        pieces, ``__key`` included, are written there and only their file names are
        shuffled (:mod:`transforms.plumbing.spill`)."""
        # a spilled piece keeps __key: 8 bytes a row on local disk cost less than hashing
        # every key again after the shuffle (~0.6 s of CPU per 1e7 string keys)
        gate = self._max_user_rows is not None and GATE_BEFORE_GROUP
        split = _SplitByUser(self._num_shards, coalesce_rows=self._coalesce_rows,
                             drop_key_hash=(self._key_columns is not None
                                            and self._spill_dir is None),
                             spill_dir=self._spill_dir,
                             gate_min_rows=(gate_min_rows(self._max_user_rows)
                                            if gate else None),
                             marked=self._marked)
        piece_type = SHARD_AND_PATH if self._spill_dir is not None else SHARD_AND_TABLE
        if not gate:
            pieces = batches | "SplitByUserHash" >> beam.ParDo(split).with_output_types(
                piece_type)
        else:   # a user over the limit is refused before the group (gated)
            split = batches | "SplitByUserHash" >> beam.ParDo(split).with_outputs(
                GATE_STATS, main="pieces")
            pieces = split.pieces
            pieces.element_type = piece_type
            pieces = gated(pieces, split[GATE_STATS],
                                         self._max_user_rows, self._setting)
        return pieces | "GroupUserShards" >> beam.GroupByKey()                  # (shard, [Table])

    def concat(self, after=None, fn=None):
        """(shard, [Table]) -> one Table of whole users (:func:`exact_users`, ``__key`` present).
        Applying it twice to :meth:`grouped`'s output gives two consumers their own copy
        without the runner materialising the concatenated shards between stages.
        ``after``: a side input (its value is not used) that this step must wait for, so
        that it runs in its consumer's stage rather than fused with the other consumer.
        ``fn``: the concatenation (default :func:`_concat_shard`; same arguments)."""
        extra = {} if after is None else {"after": after}
        extra.update(self.concat_arguments())
        return beam.FlatMap(fn or _concat_shard, **extra).with_output_types(TABLE)

    def concat_arguments(self):
        """The keyword arguments :meth:`concat` hands the concatenation
        (:func:`_concat_shard`, :func:`concat_shard_with_order`), for a consumer of
        :meth:`grouped` that concatenates the shards itself."""
        extra = {"key_columns": self._key_columns}
        if self._max_user_rows is not None:
            extra.update(max_user_rows=self._max_user_rows, setting=self._setting)
        return extra

# ---- The gate before the group --------------------------------------------------
# Refuse a user over the whole-user limit before the user shuffle groups its rows.
#
# Where no bounded algorithm cuts a user's rows before the shuffle (``bounding.model: l1``
# and ``kind: adaptive`` for a user's distinct records or keys, ``aggregates`` with
# ``clip: auto`` for its distinct keys: "What is still refused" below;
# ``pipelines.running.release._whole_user_setting``), every such row of a user meets in
# one element, and a user with more than ``user_shards.MAX_USER_ROWS`` rows is refused
# (``user_shards.check_user_rows``). That check reads the grouped shard, so it runs after
# the runner has gathered the shard: on a runner that holds a group's values in memory
# (Flink) a 1e8-row user ends the job with out-of-memory inside the group, before the check
# (docs/scale.md, "Where it breaks", item 3).
#
# This gate counts rows per user where the shuffle's tables are split (every row passes
# ``ShardByUser``'s split once) and holds the split pieces back, by a side input, until the
# counts are summed over the whole input: a user known to pass the limit fails the run
# there, before any piece reaches the group.
#
# Cheap statistics only. Per split table (about ``COALESCE_ROWS`` rows), users are counted
# in ``2**BUCKET_BITS`` buckets of the top bits of ``__user`` (one ``bincount``); only the
# rows of buckets holding at least ``min_rows`` rows are counted exactly per identity
# (``__user``, ``__user_lo``), so a table of light users costs one bincount and sends
# nothing. The per-user counts so collected are lower bounds of the users' totals (the
# rows of a user in tables where it had fewer than ``min_rows`` rows are not counted), so
# the gate never refuses a user within the limit; a user spread thinly over very many
# tables (fewer than ``min_rows`` rows in each) passes the gate and is still refused by
# the check after the group. The refusal says only that the limit was passed (review F3),
# like the check after the group.
#
# Why the release is unchanged when nothing is refused: the gate passes every piece
# through as it is; it only orders the group after the counts.
#
# What is still refused (issue 43, item 2). Most bounds now cut a user before the shuffle,
# each with the published bytes unchanged (its module says why): the fixed l0 bound and
# weighted_gaussian (``prereduce.PreReduceL0``, also after a public key domain's filter),
# ``auto`` (``prereduce.PreReducePairs``), quantiles and heavy_hitters' trie
# (``prereduce_stages.PreReduceForBounds``): at most about C rows per stage and table, so
# the gate is off for them. Aggregates send a kept (user, key)'s rows as one exact partial
# total per table (``prereduce.summed_pairs``) and keep the gate on; three settings still
# refuse a heavy user, since what they send grows with its *distinct* records or keys:
#
# * l1 rand-clip (``rand_clip_copies``): a user's repeated records travel as one row per
#   table with their count, and the kernel numbers the copies over all of them. Dropping
#   a distinct record early is not exact: its copy numbers, hence its priorities, depend
#   on its count in every table (only a shuffle by (user, record) would give it first).
# * adaptive rounds (``prereduce_stages.PreReduceDistinctPairs``): one row per (user, key)
#   and table; no cap is exact, since round r reads a user's first C keys among those not
#   released before, arbitrarily deep in the user's order.
# * aggregates with ``clip: auto``: its score reads every key's total of every user
#   (weight 1/k_u over the user's k_u keys), so no key can go before the shuffle; each
#   travels as one partial total per table. (A bounded design exists: shuffle by (user,
#   key) for the totals, then per user only k_u and the counts of its totals below each
#   candidate, K + 2 integers; not built.) With a fixed clip the gate stays on only for
#   partial totals beyond the float64 range (``prereduce``, "Aggregates").

# A user is counted in a split table when its bucket holds at least this many rows there
# (never more than the limit itself: a lowered limit counts smaller users).
GATE_MIN_ROWS = 4096
BUCKET_BITS = 20
GATE_STATS = "user_row_stats"


def gate_min_rows(max_user_rows):
    return max(1, min(GATE_MIN_ROWS, int(max_user_rows)))


def heavy_user_counts(table, min_rows, kept=None):
    """(identity pairs (k, 2) uint64, row counts (k,) int64) of the users of ``table``
    whose bucket (top ``BUCKET_BITS`` bits of ``__user``) holds at least ``min_rows``
    rows; None when no bucket does (the usual table). ``kept``: a boolean mask of the
    rows to count (the others are not the table's: ``KEPT_COLUMN``), None for all."""
    n = table.num_rows if kept is None else int(np.count_nonzero(kept))
    if n < min_rows:
        return None
    words = table.column(USER_COLUMN)
    words = (words.combine_chunks() if words.num_chunks != 1 else words.chunk(0)).to_numpy(
        zero_copy_only=False)
    if kept is not None:
        words = words[kept]
    bits = min(BUCKET_BITS, max(1, (n - 1).bit_length()))
    bucket = (words >> np.uint64(64 - bits)).astype(np.intp)
    counts = np.bincount(bucket, minlength=1 << bits)
    heavy = counts >= min_rows
    if not heavy.any():
        return None
    rows = np.flatnonzero(heavy[bucket])
    low = table.column(USER_LOW_COLUMN)
    low = (low.combine_chunks() if low.num_chunks != 1 else low.chunk(0)).to_numpy(
        zero_copy_only=False)
    if kept is not None:
        low = low[kept]
    pairs = np.stack([words[rows], low[rows].astype(np.uint64)], axis=1)
    unique, count = np.unique(pairs, axis=0, return_counts=True)
    return unique, count.astype(np.int64)


def _compact(pairs, counts):
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    total = np.bincount(inverse.ravel(), weights=counts, minlength=len(unique))
    return unique, total.astype(np.int64)


class MostRowsOfOneUser(beam.CombineFn):
    """Per-user partial counts -> the largest counted total of one user (0 if none).
    The accumulator holds the users counted so far (a few: users with at least
    ``min_rows`` rows in some table), compacted when it grows."""

    def create_accumulator(self):
        return (np.zeros((0, 2), dtype=np.uint64), np.zeros(0, dtype=np.int64))

    def add_input(self, acc, element):
        pairs, counts = element
        pairs = np.concatenate([acc[0], pairs])
        counts = np.concatenate([acc[1], counts])
        if len(counts) > 2 * len(acc[1]) + 1024:
            return _compact(pairs, counts)
        return pairs, counts

    def merge_accumulators(self, accs):
        accs = list(accs)
        return _compact(np.concatenate([a[0] for a in accs]),
                        np.concatenate([a[1] for a in accs]))

    def extract_output(self, acc):
        if not len(acc[1]):
            return 0
        return int(_compact(*acc)[1].max())


def _verdict(most_rows, max_user_rows, setting):
    if most_rows > max_user_rows:
        raise refusal(max_user_rows, setting)
    return True


def _pass(piece, ready):
    return piece


def gated(pieces, stats, max_user_rows, setting):
    """``pieces`` (the split's output) held back until ``stats`` (per-user partial
    counts, :func:`heavy_user_counts`) are summed; the run fails (``InputError`` naming
    ``setting``) when one user's counted rows pass ``max_user_rows``."""
    verdict = (stats
               | "MostRowsOfOneUser" >> beam.CombineGlobally(MostRowsOfOneUser())
               | "RefuseUserOverLimit" >> beam.Map(_verdict, max_user_rows, setting))
    return pieces | "AfterUserRowCheck" >> beam.Map(
        _pass, beam.pvalue.AsSingleton(verdict)).with_output_types(
            pieces.element_type)

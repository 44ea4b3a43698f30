"""PerUserBound: the l0/l_inf contribution bound of the sparse-histogram papers.

Each user counts at most once per key (l_inf = 1) and in at most C keys (l0 <= C),
chosen uniformly at random among the user's distinct keys (paper 004 Sec. 2 "each user
contributes to at most C_u keys, at most once each"; paper 002 Sec. 3; mechanisms.md
"Contribution bounding"). Which keys survive depends only on the user's own records and
fresh CSPRNG randomness, so neighbouring datasets differ in one user's kept contributions
only.

Kernel: :func:`bound_l0`, sort-based on uint64 hashes (no ``np.unique``): sorting
orders a shard's rows by (user, random rank of the key); duplicates of a (user, key)
are then adjacent and the first C distinct keys of each user are a uniform random subset.
The random rank of key k for user u is mix64(key_hash(k) XOR s_u), where s_u is a 64-bit
word per user (in a release the first word of the user's keyed stream,
``transforms.randomness.keyed_random``, so a recomputation keeps the same keys): a pseudorandom
permutation of the user's keys that is equal for equal keys (so de-duplication happens
in the same sort) and independent across users.
"""
import typing

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.randomness.hashing import mix64
from thresher.transforms.bounding.user_shards import (
    KEY_HASH_COLUMN, USER_COLUMN, order_by_user)


def _runs(sorted_values):
    """Boolean mask: True where a new run of equal values starts."""
    starts = np.empty(len(sorted_values), dtype=bool)
    if len(sorted_values):
        starts[0] = True
        np.not_equal(sorted_values[1:], sorted_values[:-1], out=starts[1:])
    return starts


_order_by_user = order_by_user   # (moved to user_shards: exact_users uses it too)


def bound_l0(user_hash, key_hash, max_keys_per_user, rng):
    """Indices of the rows kept: one row per kept distinct (user, key), at most
    ``max_keys_per_user`` distinct keys per user, chosen uniformly at random.

    The kept rows are those of :func:`l0_ranks` whose rank within their user is below
    ``max_keys_per_user``.

    Args:
      user_hash, key_hash: uint64 arrays (one entry per record).
      max_keys_per_user: C >= 1.
      rng: ``transforms.randomness.samplers.SecureRandom`` or a seeded numpy Generator (tests).

    Two single-word sorts instead of a two-word lexsort (5x faster at 1e6 rows): the
    first orders rows by user and numbers the users 0..U-1; the second sorts the packed
    word (user number in the top b = bit_length(U - 1) bits, the top 64 - b bits of the
    random rank below). Ranks are a bijection of the key hash for a fixed user, so equal
    packed words within a user are the same key unless two different keys share their
    top 64 - b rank bits (probability about k^2 2^-(65-b) for a user with k keys); that is
    detected and the shard is then ordered by the exact (user, full rank) lexsort, so the
    kept set is exactly the one the two-word sort defines.
    """
    if len(user_hash) == 0:
        return np.zeros(0, dtype=np.int64)
    ranks = l0_ranks(user_hash, key_hash, rng)
    return ranks.order[ranks.distinct & (ranks.rank_in_user < max_keys_per_user)]


class L0Ranks(typing.NamedTuple):
    """The sort of :func:`l0_ranks`: rows in (user, random key rank) order."""
    order: np.ndarray         # row indices, users contiguous, each user's keys by random rank
    distinct: np.ndarray      # bool, in ``order``: first row of a distinct (user, key)
    rank_in_user: np.ndarray  # int, in ``order``: 0 for the user's first distinct key, ...
    by_user_number: np.ndarray  # int64: user number 0..U-1 (users by hash), in by-user order
    second: np.ndarray        # ``order`` = by-user order taken at ``second``

    def user_numbers(self):
        """The user number 0..U-1 of each row, in ``order``."""
        return self.by_user_number[self.second]


def l0_ranks(user_hash, key_hash, rng, by_user=None):
    """Every row's place in its user's uniformly random order of distinct keys (the
    sort :func:`bound_l0` keeps the first C of; one sort serves every C).
    ``user_hash`` must be non-empty. ``by_user``: the caller's ``UserOrder`` of
    ``user_hash`` (``user_shards.exact_users_with_order``: the sort by user that
    grouped the table), so that it is not sorted again."""
    user_hash = np.asarray(user_hash, dtype=np.uint64)
    key_hash = np.asarray(key_hash, dtype=np.uint64)
    n = len(user_hash)
    # Per-user salt: one CSPRNG word per distinct user, looked up through a sort by user.
    if by_user is None:
        by_user = _order_by_user(user_hash)
        user_start = _runs(user_hash[by_user])
    else:
        by_user, user_start = by_user.order, _runs(by_user.sorted_users)
    user_number = np.cumsum(user_start) - 1          # 0..U-1, in by_user order
    n_users = int(user_number[-1]) + 1
    salts = samplers.uniform_priorities(
        keyed_random.rows_of(rng, by_user[user_start], "user"), n_users)
    rank = mix64(key_hash[by_user] ^ salts[user_number])  # in by_user order
    shift = max(1, (n_users - 1).bit_length())
    packed = (user_number.astype(np.uint64) << np.uint64(64 - shift)) | (rank >> np.uint64(shift))
    second = np.argsort(packed)
    p = packed[second]
    r = rank[second]
    same = p[1:] == p[:-1]
    if np.any(same & (r[1:] != r[:-1])):  # truncated ranks of two different keys tie
        second = np.lexsort((rank, user_number))
        p = None
        r = rank[second]
        u = user_number[second]
        new_user = _runs(u)
        distinct = new_user.copy()
        distinct[1:] |= r[1:] != r[:-1]
    else:
        new_user = _runs(p >> np.uint64(64 - shift))
        distinct = np.empty(n, dtype=bool)
        distinct[0] = True
        np.logical_not(same, out=distinct[1:])
    order = by_user[second]
    # rank of each distinct key within its user: running count of distinct rows minus the
    # count at the user's first row
    running = np.cumsum(distinct)
    at_user_start = np.maximum.accumulate(np.where(new_user, running, 0))
    rank_in_user = running - at_user_start  # 0 for the user's first distinct key
    return L0Ranks(order, distinct, rank_in_user, user_number, second)


def bound_l0_exact(user_hash, key_codes, max_keys_per_user, rng):
    """:func:`bound_l0` for keys identified by exact codes (any integers that are equal
    exactly for equal keys), used when the key hash is not one-to-one on a shard's keys.

    Each distinct (user, key) pair gets a fresh CSPRNG rank; each user keeps the pairs of
    its ``max_keys_per_user`` smallest ranks: a uniform random subset of the user's
    distinct keys whose law depends on nothing but the user's own keys (the codes only
    group rows; their values never enter the choice). Returns one row index per kept pair.
    """
    if len(user_hash) == 0:
        return np.zeros(0, dtype=np.int64)
    pair_rows, rank_in_user = l0_exact_ranks(user_hash, key_codes, rng)
    return np.sort(pair_rows[rank_in_user < max_keys_per_user])


def l0_exact_ranks(user_hash, key_codes, rng):
    """:func:`bound_l0_exact`'s order: (one row index per distinct (user, key) pair, the
    pair's rank in its user's random order of keys). ``user_hash`` must be non-empty."""
    user_hash = np.asarray(user_hash, dtype=np.uint64)
    key_codes = np.asarray(key_codes)
    order = np.lexsort((key_codes, user_hash))
    users, codes = user_hash[order], key_codes[order]
    pair_start = _runs(users)
    pair_start[1:] |= codes[1:] != codes[:-1]
    pair_rows = order[pair_start]
    pair_users = users[pair_start]
    ranks = samplers.uniform_priorities(keyed_random.rows_of(rng, pair_rows, "pair"),
                                        len(pair_rows))
    by_rank = np.lexsort((ranks, pair_users))
    new_user = _runs(pair_users[by_rank])
    position = np.arange(len(by_rank))
    rank_in_user = position - np.maximum.accumulate(np.where(new_user, position, 0))
    return pair_rows[by_rank], rank_in_user


def l0_tiebroken_ranks(user_hash, key_hash, key_codes, rng):
    """The ranking of a user who holds two different keys with equal ``__key``: one row
    index per distinct (user, exact key) pair and the pair's rank in its user's order,
    where keys are ordered by the same hash rank as :func:`l0_ranks` (mix64(key hash XOR
    the user's salt), the salt the user's ``user`` stream's first word) and keys sharing a
    hash by a CSPRNG priority from their ``pair`` stream. For keys whose hashes differ
    this is exactly :func:`l0_ranks`' order, so every user's order of keys is one total
    order of its exact keys whatever part of its records a shard or batch holds; that is
    what lets :func:`prereduce_l0` drop keys before the shuffle without changing the kept
    set. ``user_hash`` must be non-empty; ``user_hash``/``key_hash``/``key_codes`` are per
    row."""
    user_hash = np.asarray(user_hash, dtype=np.uint64)
    key_hash = np.asarray(key_hash, dtype=np.uint64)
    key_codes = np.asarray(key_codes)
    order = np.lexsort((key_codes, user_hash))
    users, codes = user_hash[order], key_codes[order]
    pair_start = _runs(users)
    pair_start[1:] |= codes[1:] != codes[:-1]
    pair_rows = order[pair_start]
    pair_users = users[pair_start]
    user_start = _runs(pair_users)
    user_number = np.cumsum(user_start) - 1
    salts = samplers.uniform_priorities(
        keyed_random.rows_of(rng, pair_rows[user_start], "user"), int(user_number[-1]) + 1)
    rank = mix64(key_hash[pair_rows] ^ salts[user_number])
    tie = samplers.uniform_priorities(keyed_random.rows_of(rng, pair_rows, "pair"),
                                      len(pair_rows))
    by_rank = np.lexsort((tie, rank, pair_users))
    new_user = _runs(pair_users[by_rank])
    position = np.arange(len(by_rank))
    rank_in_user = position - np.maximum.accumulate(np.where(new_user, position, 0))
    return pair_rows[by_rank], rank_in_user


def exact_key_codes(table, key_columns):
    """int64 codes equal exactly for equal key tuples (per-column dictionary codes,
    combined column by column)."""
    codes = None
    for name in key_columns:
        codes = more_key_codes(codes, table, name)
    return codes


def more_key_codes(codes, table, name):
    """The codes of :func:`exact_key_codes` for one more column ``name`` after the
    columns ``codes`` stand for (None: none yet): ``exact_key_codes(table, [*cols, name])``
    is ``more_key_codes(exact_key_codes(table, cols), table, name)``, so a caller that
    needs the codes of a prefix of its columns too encodes each column once. Sorting the
    result sorts by ``codes`` first (the new column only orders rows of equal ``codes``)."""
    return combine_codes(codes, *column_codes(table, name))


def column_codes(table, name):
    """(int64 dictionary codes of column ``name``, their number): equal codes exactly
    where the values are equal (bitwise for floats)."""
    column = table.column(name)
    column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    encoded = pc.dictionary_encode(column)
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), len(encoded.dictionary)


def combine_codes(codes, part, width):
    """Codes of (``codes``, ``part``) pairs, ``part`` < ``width`` (``codes`` None: ``part``)."""
    if codes is None:
        return part
    if int(codes.max(initial=0)) < (np.iinfo(np.int64).max - width) // max(width, 1):
        return codes * width + part
    # re-number the pairs densely (lexicographic order) before they could overflow
    return np.unique(np.stack([codes, part]), axis=1, return_inverse=True)[1].ravel()


def _bytewise_equal(arrow_type):
    """Key types whose ``pc.equal`` is equality of the values as ``count_distinct`` and
    the key hash tell them apart (no float: 0.0 == -0.0)."""
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type)
            or pa.types.is_integer(arrow_type))


def _flat(column):
    return column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)


def hash_exact_per_user(table, key_columns, ranks, rows=None):
    """True if no user of ``table`` holds two different key tuples with equal ``__key``,
    read off :func:`l0_ranks`' order ``ranks`` of the table: the rows of one (user,
    hash) are adjacent there (every row but the first of each is not ``distinct``), so
    each such row is compared with the one before it. ``rows`` (bool, in ``ranks``
    order): compare only these repeated rows (a run's rows are all in or all out).

    False also where the comparison cannot tell (a key type whose ``pc.equal`` is not
    equality of values, or a null key): the caller then asks :func:`key_hash_is_exact`.
    Costs a gather of the repeated rows' keys only (the table-wide check hashes every
    row's ``__key`` and gathers every key)."""
    types = [table.schema.field(name).type for name in key_columns]
    if not all(_bytewise_equal(t) for t in types) \
            or any(table.column(name).null_count for name in key_columns):
        return False
    repeated = ~ranks.distinct if rows is None else (~ranks.distinct & rows)
    later = np.flatnonzero(repeated)
    if len(later) == 0:
        return True
    this, before = pa.array(ranks.order[later]), pa.array(ranks.order[later - 1])
    for name in key_columns:
        column = _flat(table.column(name))
        if not pc.all(pc.equal(column.take(this), column.take(before))).as_py():
            return False
    return True


def key_hash_is_exact(table, key_columns):
    """True if ``__key`` is one-to-one on the table's key tuples (the hash is a function
    of the key, so equal numbers of distinct values on both sides suffice).

    Text, binary and integer keys (non-null after ``prepare_batch``): one hash pass over
    the uint64 ``__key`` (``dictionary_encode``: codes in order of first appearance), and
    every row's key compared with the key of its hash's first row (a gather and a
    ``pc.equal``): the same answer as counting distinct key tuples, at about two thirds
    of the cost (no hash pass over the strings; the bound and the pre-reduction ask this
    of every table). Other key types count distinct values as before."""
    types = [table.schema.field(name).type for name in key_columns]
    if table.num_rows and all(_bytewise_equal(t) for t in types) \
            and not any(table.column(name).null_count for name in key_columns):
        encoded = pc.dictionary_encode(_flat(table.column(KEY_HASH_COLUMN)))
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        if len(encoded.dictionary) == len(codes):
            return True
        first = np.empty(len(codes), dtype=bool)          # a code's first row
        first[0] = True
        np.greater(codes[1:], np.maximum.accumulate(codes)[:-1], out=first[1:])
        representative = pa.array(np.flatnonzero(first)[codes])
        for name in key_columns:
            column = _flat(table.column(name))
            if not pc.all(pc.equal(column, column.take(representative))).as_py():
                return False
        return True
    distinct_hashes = pc.count_distinct(table.column(KEY_HASH_COLUMN)).as_py()
    if len(key_columns) == 1:
        distinct_keys = pc.count_distinct(table.column(key_columns[0])).as_py()
    else:
        distinct_keys = table.select(list(key_columns)).group_by(
            list(key_columns), use_threads=False).aggregate([]).num_rows
    return distinct_hashes == distinct_keys


def key_hash_is_exact_at(table, key_columns, representative):
    """:func:`key_hash_is_exact` given, for every row, a row holding the same ``__key``
    (``representative``, int64 row indices; e.g. the first row of each key hash, from a
    sort by key hash the caller made anyway: ``choose_contribution_bound.key_numbers``):
    True iff every row's key tuple equals its representative's, i.e. iff each hash holds
    one key tuple. The same answer as :func:`key_hash_is_exact` without its hash pass over
    ``__key`` (issue 43: the automatic bound's pass sorts the keys already); other key
    types and null keys are decided by :func:`key_hash_is_exact` itself."""
    types = [table.schema.field(name).type for name in key_columns]
    if not table.num_rows or not all(_bytewise_equal(t) for t in types) \
            or any(table.column(name).null_count for name in key_columns):
        return key_hash_is_exact(table, key_columns)
    representative = pa.array(np.asarray(representative, dtype=np.int64))
    for name in key_columns:
        column = _flat(table.column(name))
        if not pc.all(pc.equal(column, column.take(representative))).as_py():
            return False
    return True


# Schema metadata a whole-user table may carry: the key columns over which ``__key`` is
# known to be one-to-one (checked by :func:`key_hash_is_exact` on this table or on a
# table it is a row subset of: a subset of one-to-one pairs is one-to-one). Set only by
# transforms.selection.adaptive_rounds (its rounds read each user shard three times).
KEY_HASH_EXACT_METADATA = b"thresher.key_hash_exact_over"


def _columns_tag(key_columns):
    return "\x1f".join(key_columns).encode("utf-8")


def with_key_hash_exact(table, key_columns):
    """``table`` stamped: ``__key`` is one-to-one over ``key_columns`` (the caller checked)."""
    metadata = dict(table.schema.metadata or {})
    metadata[KEY_HASH_EXACT_METADATA] = _columns_tag(key_columns)
    return table.replace_schema_metadata(metadata)


def key_hash_known_exact(table, key_columns):
    """True if ``table`` carries the stamp of :func:`with_key_hash_exact` for exactly
    ``key_columns``."""
    metadata = table.schema.metadata or {}
    return metadata.get(KEY_HASH_EXACT_METADATA) == _columns_tag(key_columns)


def users_with_colliding_keys(table, key_columns):
    """Boolean per row: the row's user holds two different key tuples whose ``__key``
    hashes are equal (keys that only different users hold never collide for a user)."""
    users = table.column(USER_COLUMN).to_numpy()
    hashes = table.column(KEY_HASH_COLUMN).to_numpy()
    codes = exact_key_codes(table, key_columns)
    order = np.lexsort((codes, hashes, users))
    u, h, c = users[order], hashes[order], codes[order]
    clash = (u[1:] == u[:-1]) & (h[1:] == h[:-1]) & (c[1:] != c[:-1])
    return np.isin(users, u[1:][clash])


def l0_pair_ranks_per_user(table, key_columns, rng):
    """(one row index per distinct (user, key) pair, the pair's rank in its user's random
    order of keys) for a user-sharded table, with the exact/hash choice made per user: a
    user who holds two different keys with equal ``__key`` is ranked on exact key codes
    (:func:`l0_tiebroken_ranks`: its colliding keys stay two keys, ordered by the hash
    rank and, between themselves, by a CSPRNG tie-break); every other user by its hash
    ranking (:func:`l0_ranks`), exactly as in a shard without the colliding user. Both
    are the same total order of the user's keys (a colliding user's kept set is not a
    uniform C-subset of its keys any more: its keys sharing a hash are adjacent in the
    order; it is still a function of the secret and that user's records alone).
    ``rng`` is the stage's source (unbound): each part is bound to its own rows (keyed
    streams follow the rows' users and keys, not their positions)."""
    exact = users_with_colliding_keys(table, key_columns)
    pair_rows, ranks = [], []
    for rows, hashed in ((np.flatnonzero(~exact), True), (np.flatnonzero(exact), False)):
        if len(rows) == 0:
            continue
        part = table.take(pa.array(rows))
        users = part.column(USER_COLUMN).to_numpy()
        bound = keyed_random.bind_users(rng, part, key_columns)
        if hashed:
            r = l0_ranks(users, part.column(KEY_HASH_COLUMN).to_numpy(), bound)
            part_rows, part_ranks = r.order[r.distinct], r.rank_in_user[r.distinct]
        else:
            part_rows, part_ranks = l0_tiebroken_ranks(
                users, part.column(KEY_HASH_COLUMN).to_numpy(),
                exact_key_codes(part, key_columns), bound)
        pair_rows.append(rows[part_rows])
        ranks.append(part_ranks)
    return np.concatenate(pair_rows), np.concatenate(ranks)


def bound_table_l0(table, key_columns, max_keys_per_user, rng):
    """Rows of a user-sharded table that l0 bounding keeps (see :func:`bound_l0`).

    The key hash de-duplicates a user's keys only where it is one-to-one on that user's
    keys, and the choice is per user (:func:`l0_pair_ranks_per_user`): a user who holds
    crafted (or accidental) colliding keys is bounded on exact key codes, so its colliding
    keys stay two keys; every other user keeps the hash ranking, so its kept keys under one
    release secret are the same whether or not such a user is in the shard. (A shard-wide
    switch, as before, re-drew every other user's kept set from the other source.) A shard
    whose hash is one-to-one on its keys takes :func:`bound_l0` directly, as before.
    The kept set is each user's first C keys in one total order of its exact keys
    (:func:`l0_tiebroken_ranks`), so it is unchanged when rows outside a user's first C
    keys are removed beforehand (:func:`prereduce_l0`). A table stamped by
    :func:`with_key_hash_exact` for these key columns skips the check (made on its shard).

    The check is first made per user, on the ranking itself (:func:`hash_exact_per_user`:
    the rows of a repeated (user, hash) compared with each other, far fewer than the
    table's rows); only where that finds two different keys (or cannot compare: nulls,
    other key types) does the table-wide :func:`key_hash_is_exact` decide. Both lead to
    the same kept rows: a table whose hash ties different keys of different users only
    holds no colliding user, and :func:`l0_pair_ranks_per_user` then ranks every user by
    :func:`l0_ranks`."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    users = table.column(USER_COLUMN).to_numpy()
    ranks = l0_ranks(users, table.column(KEY_HASH_COLUMN).to_numpy(),
                     keyed_random.bind_users(rng, table, key_columns))
    if (key_hash_known_exact(table, key_columns)
            or hash_exact_per_user(table, key_columns, ranks)
            or key_hash_is_exact(table, key_columns)):
        return ranks.order[ranks.distinct & (ranks.rank_in_user < max_keys_per_user)]
    pair_rows, rank_in_user = l0_pair_ranks_per_user(table, key_columns, rng)
    beam.metrics.Metrics.counter("thresher_not_private", "shards_with_key_hash_collisions").inc()
    return np.sort(pair_rows[rank_in_user < max_keys_per_user])


def count_per_key(table, key_columns):
    """Aggregate rows into (key columns, __key, count) with pyarrow's hash group-by."""
    grouped = table.select(list(key_columns) + [KEY_HASH_COLUMN]).group_by(
        list(key_columns) + [KEY_HASH_COLUMN], use_threads=False).aggregate([([], "count_all")])
    # group_by returns chunks sharing buffers; one compact chunk per column
    return grouped.rename_columns(list(key_columns) + [KEY_HASH_COLUMN, "count"]).combine_chunks()


class _BoundL0Fn(beam.DoFn):
    def __init__(self, key_columns, rng_factory, stage="", rows=False):
        self._key_columns = tuple(key_columns)
        self._rows = rows
        self._rng_factory = rng_factory
        self._stage = stage

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table, max_keys_per_user):
        rng = keyed_random.stage_source(self._rng_factory, self._rng, self._stage)
        kept = bound_table_l0(table, self._key_columns, int(max_keys_per_user), rng)
        beam.metrics.Metrics.counter("thresher_not_private", "contributions_kept").inc(len(kept))
        beam.metrics.Metrics.counter("thresher_not_private", "rows_bounded").inc(table.num_rows)
        if len(kept) and self._rows:
            yield table.take(pa.array(kept)).select([USER_COLUMN, *self._key_columns])
        elif len(kept):
            # counted in table order: a gather in ascending rows reads the key strings
            # in sequence (1e6-row shard: ~0.1 s less than in the users' random key order);
            # the counts per key are the same, only the order of the partial table's rows
            # differs, which the per-key sum and the canonical output do not read
            kept = np.sort(kept)
            yield count_per_key(table.take(pa.array(kept)), self._key_columns)


class PerUserBound(beam.PTransform):
    """l0/l_inf bounding of user-sharded record tables, then per-shard counts per key.

    Input: PCollection[pyarrow.Table] from :class:`transforms.bounding.user_shards.ShardByUser`
    (whole users per element). Output: PCollection[pyarrow.Table] of partial counts —
    key columns, ``__key`` and int64 ``count`` (distinct users per key in that shard).
    ``max_keys_per_user`` is an int or a side input (``AsSingleton``) carrying one.
    ``rows=True``: the kept (``__user``, key columns) rows instead, whole users per element
    (what per-user statistics of the kept keys need, e.g. TrieHH++'s distinct users per
    prefix).
    """

    def __init__(self, key_columns, max_keys_per_user, rng_factory=None, label=None,
                 rows=False):
        super().__init__(label)
        self._rows = rows
        self._key_columns = tuple(key_columns)
        self._max_keys_per_user = max_keys_per_user
        self._rng_factory = rng_factory

    def expand(self, user_shards):
        return user_shards | "BoundL0" >> keyed_random.par_do(
            _BoundL0Fn(self._key_columns, *keyed_random.stage_of(self._rng_factory), rows=self._rows),
            self._max_keys_per_user
        ).with_output_types(TABLE)

"""The distinct (user, key) pairs of a user shard in l0 bounding's order, by value sorts.

``per_user_bound.l0_ranks`` returns every row's place in its user's random order of
distinct keys; the automatic bound's one pass (``transforms.bounding.scored_bound``)
needs only the distinct pairs: one row of each, its rank in its user's order and its
user number. :func:`l0_distinct_pairs` gives exactly those, with the same user numbers
(users in increasing hash), the same salts and the same order of every user's keys
(mix64(key hash XOR the user's salt), paper 002 Sec. 3 / mechanisms.md "Contribution
bounding"), so every quantity the pass derives (statistics, running counts) is the one
``l0_ranks`` gives (tests/transforms/bounding/test_l0_pairs.py pins the two against each
other).

Why it is faster (issue 43). ``l0_ranks`` orders the by-user rows with an argsort of
one packed word (user number, top rank bits); numpy's value sort of uint64 is ~4x faster
than its argsort here. So the row's place inside its user (``local``, r bits, r the
bit length of the largest user's row count minus one) rides in the low bits of the word:
(user number: b bits | top 64 - b - r rank bits | local: r bits), and one ``np.sort``
gives both the order and the permutation. Two different keys of one user whose ranks
share the top 64 - b - r bits could interleave (probability about k^2 2^-(65-b-r) for a
user with k keys); that is detected (equal truncated words, different full ranks) and
only the users concerned are re-ordered by the exact (user, full rank) lexsort. When
fewer than ``MIN_RANK_BITS`` rank bits would remain (very large users in a shard of
many users), ``l0_ranks`` itself is used.

Which row of a pair with several rows is returned differs from ``l0_ranks`` (here the
first in table order; there whichever the argsort put first): the pass reads of that row
its key hash and, where ``__key`` is one-to-one on the shard's keys, its key columns,
which every row of the pair holds alike.
"""
import numpy as np

from thresher.transforms.bounding.per_user_bound import _order_by_user, _runs, l0_ranks
from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.randomness.hashing import mix64

# Below this many rank bits in the packed word, the truncated ranks of a large user's
# keys would tie often and l0_ranks (two-word argsort) is used instead.
MIN_RANK_BITS = 24


def l0_distinct_pairs(user_hash, key_hash, rng, rank_bits=None, by_user=None):
    """(pair_rows, rank_in_user, pair_users) of the distinct (user, key hash) pairs, users
    contiguous in increasing number, each user's keys in its random order:
    ``pair_rows`` one row index per pair, ``rank_in_user`` 0 for a user's first key, ...,
    ``pair_users`` the user number 0..U-1 (users numbered in increasing hash) — as
    ``l0_ranks`` gives them at its distinct rows (``order[distinct]``,
    ``rank_in_user[distinct]``, ``user_numbers()[distinct]``). ``user_hash`` must be
    non-empty. ``rank_bits`` (tests only): keep at most that many rank bits in the
    packed word and treat every tie of truncated ranks as a clash (the exact re-order
    of the users concerned), so that path is exercised. ``by_user``: the caller's
    ``user_shards.UserOrder`` of ``user_hash`` (``user_shards.concat_shard_with_order``:
    the sort by user that checked the shard's users), so that it is not sorted again;
    it is ``order_by_user(user_hash)`` itself, so the result is the same."""
    user_hash = np.asarray(user_hash, dtype=np.uint64)
    key_hash = np.asarray(key_hash, dtype=np.uint64)
    n = len(user_hash)
    given = by_user
    if by_user is None:
        by_user = _order_by_user(user_hash)
        user_start = _runs(user_hash[by_user])
    else:
        by_user, user_start = by_user.order, _runs(by_user.sorted_users)
    starts = np.flatnonzero(user_start)
    n_users = len(starts)
    user_number = np.cumsum(user_start, dtype=np.int64) - 1          # by_user order
    largest = int(np.max(np.diff(np.append(starts, n))))
    b = max(1, (n_users - 1).bit_length())
    r = (largest - 1).bit_length()
    if rank_bits is not None:
        r = 64 - b - min(rank_bits, 64 - b - r)
    elif 64 - b - r < MIN_RANK_BITS:
        ranks = (l0_ranks(user_hash, key_hash, rng) if given is None
                 else l0_ranks(user_hash, key_hash, rng, by_user=given))
        return (ranks.order[ranks.distinct], ranks.rank_in_user[ranks.distinct],
                ranks.user_numbers()[ranks.distinct])
    salts = samplers.uniform_priorities(
        keyed_random.rows_of(rng, by_user[starts], "user"), n_users)
    rank = mix64(key_hash[by_user] ^ salts[user_number])           # by_user order
    local = np.arange(n, dtype=np.int64) - starts[user_number]
    packed = user_number.astype(np.uint64) << np.uint64(64 - b)
    packed |= (rank >> np.uint64(b + r)) << np.uint64(r)
    packed |= local.astype(np.uint64)
    del local
    packed.sort()
    users = (packed >> np.uint64(64 - b)).astype(np.int64)
    place = starts[users] + (packed & np.uint64((1 << r) - 1)).astype(np.int64)
    # rows of one (user, truncated rank): the same key (compared on full ranks) unless
    # two keys' truncated ranks tie
    tied = np.flatnonzero((packed[1:] >> np.uint64(r)) == (packed[:-1] >> np.uint64(r))) + 1
    del packed
    if rank_bits is None:
        clash = rank[place[tied]] != rank[place[tied - 1]]
    else:   # tests: order as if only rank_bits bits fitted (forces clashes)
        clash = np.ones(len(tied), dtype=bool)
    if np.any(clash):   # truncated ranks of two keys of a user tie: re-order those users
        redo = np.flatnonzero(np.isin(users, users[tied[clash]]))
        rows = place[redo]
        place[redo] = rows[np.lexsort((rank[rows], user_number[rows]))]
        full = rank[place]
        tied = np.flatnonzero(full[1:] == full[:-1]) + 1
        tied = tied[users[tied] == users[tied - 1]]
    distinct = np.ones(len(place), dtype=bool)
    distinct[tied] = False
    pairs = np.flatnonzero(distinct)
    pair_users = users[pairs]
    position = np.arange(len(pairs), dtype=np.int64)
    first_of_user = np.maximum.accumulate(np.where(_runs(pair_users), position, 0))
    return by_user[place[pairs]], position - first_of_user, pair_users

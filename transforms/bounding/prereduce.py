"""PreReduceL0: drop, before the user shuffle, the rows fixed-bound l0 bounding cannot keep.

l0 bounding (:mod:`transforms.bounding.per_user_bound`) keeps each user's first C keys in one total
order of that user's exact keys: the hash rank mix64(``__key`` XOR the user's salt), keys
sharing a hash ordered by their ``pair`` stream (``per_user_bound.l0_tiebroken_ranks``).
The salt and the tie-breaks are keyed draws (:mod:`transforms.randomness.keyed_random`): functions of
the release secret, the bounding stage's label and the user's 128-bit identity (and key),
so they can be computed where the records are read, on any batch, with the values the
bounding will draw after the shuffle.

Why it is exact. A key k among a user's first C keys overall has fewer than C of the
user's keys before it; in any batch holding k, each distinct hash ranked below k's in
that batch carries at least one of those keys, so k's hash is among the user's C
smallest distinct hashes in the batch. Keeping, per user and batch, one row per distinct
(user, exact key) among the C smallest hashes therefore keeps a superset of the final
kept keys, and the bounding's choice on a superset containing the first C keys of a
total order is those C keys. The released bytes are the same with and without this step
(tests/transforms/bounding/test_prereduce.py), and what a user's rows become depends on the secret
and that user's rows only (the batch decides nothing but which superset travels).

Where it pays, once per row. Read batches are first combined into tables of about
``COALESCE_ROWS`` rows (the size the user shuffle splits, ``transforms.bounding.user_shards``),
and each row passes the step once. Only the rows of users with more than
``HEAVY_FACTOR * C`` rows in the table go through the kernel (any other user keeps all
its rows: a superset too), and the table is reduced only when that can remove at least
``MIN_REMOVED_ROWS`` rows (:func:`heavy_user_rows`; one sort of the user words decides).
The decision is a function of the table's rows; whichever way it goes, what travels is a
superset of the kept keys, so it picks the superset and nothing else
(tests/transforms/bounding/test_prereduce.py forces it either way: ``MODE``). Measured on 1e7 rows
of ~1e6 Zipf-active users (docs/performance.md, issue 34): a quarter of the rows are
those of users with more than 2C rows in a 1e6-row table, and almost all of them go.

Memory. A heavy user's rows leave each table as at most C rows per distinct hash kept
(one per exact key: C rows unless the user holds colliding keys), so the shuffle holds
about C rows per user and table instead of all of them (issue 30, D15: a 1e7-row user
among 5,000 others peaked at 3.1 GB in process). The buffer is one table.

``PreReduceL0`` serves fixed-bound l0 bounding through ``PerUserBound`` (``pipelines.running.release``),
also after a public key domain's filter (``input.public_keys``: the bounding keeps a
user's first C keys among its in-domain keys, and the filter runs before this step, so
the argument above applies to the filtered rows), and ``aggregates`` (below). l1
rand-clip samples records (not keys) and adaptive rounds re-bound the users' remaining
keys, so neither can drop a user's keys early (``user_shards``, "The gate before the
group", says what they do instead); the automatic bound has a step of its own
(``PreReducePairs``, below).

Aggregates (``PerUserBoundWithValues``; issue 43). The bounding sums each kept (user,
key)'s values into one total, clamps it to [low, high] and puts it on its grid
(``transforms.values.aggregate_values``); ``clip: auto`` first scores every (user, key)'s
total (``transforms.values.choose_clip``). A total is the exact sum of the pair's values
rounded once to float64 (``transforms.plumbing.exact_sums``): a function of the multiset of
the values, whatever their order or split. So, per table, a pair's rows can be replaced
by any rows whose values have the same exact sum: :func:`summed_pairs` keeps the pair's
first row once per term of the exact expansion of its partial total (float64 terms, each
exact, summing exactly to it; usually one to three). Across tables the terms of all
partials add, exactly, to the pair's total: the same total, hence the same clamped grid
value, the same score input and the same kept set (the kept set reads the pair's key and
identity only, never its number of rows), and the same published bytes
(tests/transforms/bounding/test_prereduce_aggregates.py). With a fixed clip the rows are
first cut to the user's C smallest hash ranks (:func:`prereduce_l0` with ``every_row``:
every row of those keys, the fixed bound's argument above); with ``clip: auto`` no key is
cut (its score reads every key of a user, with weight 1/k_u over the user's k_u keys), so
a user still sends each distinct key per table, and one with more than ``MAX_USER_ROWS``
distinct keys is refused there, naming ``aggregates``. The sensitivity argument is the one
of docs/aggregates.md (paper 002 Sec. 3's per-user contribution bounding, with totals
clamped after summing): unchanged, since only where the sum is computed changes. A pair
whose partial total passes the float64 range (about 1.8e308: no finite expansion) keeps
its rows.

The automatic bound (``max_keys_per_user: auto``, ``PreReducePairs``; issue 43). Its one
pass (``transforms.bounding.scored_bound.scored_table``) scores every candidate C with
V(C) (paper 002, Algorithm 4) and keeps, at every candidate, each user's first C keys.
Dropping the keys a user holds beyond the largest candidate C_m, as the fixed bound
drops those beyond C, would keep the kept sets but change the scores: in the l0 model
each of user i's k_i distinct keys adds min(1, C / k_i) to its key's expected bounded
count, and min(k_i, C_m) enters the dropped term, so a user's keys beyond C_m are read
by V(C) at every C (and k_i itself would shrink). What can go is every row that repeats
a (user, exact key) pair: this step keeps one row per distinct (user identity, exact
key) of a table (:func:`distinct_pair_rows`), for the users with more than
``AUTO_HEAVY_ROWS`` rows in the table. In the release (``mark_kept``) a table that keeps
at least ``MARK_MIN_KEPT`` of its rows leaves whole with its kept rows marked
(``user_shards.KEPT_COLUMN``) and the user split gathers those rows only: the same rows
reach the shuffle, without a filtered copy of the table; one that keeps fewer leaves as
that copy (what Beam holds after the split is then the few kept rows, not the table).

Claim: for every user i, the set D_i of i's distinct exact keys is the same with and
without the step, and everything the one pass computes is a function of the D_i, the
identities and the keyed randomness only; so the dropped term and the key costs, hence
V(C) for every candidate C, the exponential mechanism's draw (keyed: same secret, same
stage), and the kept set of every user at every candidate (the chosen one included) are
identical, and so are the published bytes. Proof. (1) D_i is preserved: a row is removed
only when an earlier row of the same table holds the same identity (both words) and the
same exact key (pairs are compared on ``__key`` only when ``__key`` is one-to-one on the
table's keys, else on exact key codes), and that row stays; every user's rows in all
tables are the union over tables, so each (i, key) in D_i keeps a row. Nothing else
changes: the step adds no row and edits no value. (2) What the one pass reads of a user:
``l0_ranks`` ranks distinct (user, key hash) pairs by mix64(hash XOR the user's salt),
the salt a keyed draw of the user's identity (``keyed_random.rows_of(..., "user")`` is
keyed by the identity words of the row it is given, not by its position), and a user
whose keys collide is ranked by ``l0_pair_ranks_per_user`` over distinct (user, exact
key) pairs with tie-breaks keyed by (user, key); the statistics
(``pair_statistics``/``table_statistics``) read the distinct (user, key hash) pairs
(N_ij = 1 in the l0 model: a pair's number of rows is never read); the running counts
count distinct pairs per rank bucket; the output key columns are taken from one row of a
kept pair, and every row of a pair holds the same key. None of these reads how many rows
a pair has or where they sit. (3) The kept set at C is the first C keys of i's order of
D_i, a function of D_i and the keyed draws by (2). (4) The user key cap: the one pass reads
only a user's first ``cap`` keys of that order (``scored_bound.user_key_cap``, its
docstring has the privacy argument), and a user bucket with more than ``HEAVY_FACTOR *
cap`` rows in a table goes through :func:`prereduce_l0` at ``cap`` instead, which keeps a
superset of the user's first ``cap`` keys (the fixed bound's argument above, C = cap);
the first ``cap`` keys of any such subset of D_i are those of D_i, so (2) and (3) hold for
the keys the pass reads. Which rows go depends on the table's rows only (a user's pairs
stay whatever the split), so the step is also a function of each user's own records. tests/transforms/bounding/test_prereduce.py checks the statistics, the
running counts and the kept set at every candidate on split records (colliding keys
included), and the published bytes with the step forced on and off.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.transforms.window import GlobalWindows

from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.hashing import mix64
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding.per_user_bound import (
    _bytewise_equal, _flat, _runs, exact_key_codes, hash_exact_per_user, key_hash_is_exact,
    l0_ranks)
from thresher.transforms.bounding.user_shards import (
    COALESCE_ROWS, KEPT_COLUMN, KEY_HASH_COLUMN, USER_COLUMN, USER_LOW_COLUMN, concat,
    exact_users_with_order)
from thresher.transforms.plumbing.exact_sums import exact_sums, pair_groups, term_slots

NOT_PRIVATE = "thresher_not_private"

# A user with more than HEAVY_FACTOR * C rows in a table goes through the kernel (which
# can then remove at least half of them); a table is reduced when at least
# MIN_REMOVED_ROWS rows could go (below that the copy costs more than the shuffle saves).
HEAVY_FACTOR = 2
MIN_REMOVED_ROWS = 1024
BUCKET_BITS = 20     # at most 2**20 user buckets in the decision (one per row of 1e6)
# The automatic bound de-duplicates the rows of users with more than AUTO_HEAVY_ROWS rows
# in a table (prereduce_pairs_table). On the benchmark's Zipf data (1e6-row tables) such
# users hold 17 % of the rows and 60 % of the table's repeated (user, key) rows: the
# kernel reads a sixth of the rows and removes 6.5 % of them (threshold 8: reads 27 %,
# removes 7.6 %; 256: reads 8 %, removes 4.1 %).
AUTO_HEAVY_ROWS = 32
# "auto": decide per table (heavy_user_rows); "always": every user of every table
# through the kernel; "never": no row removed (the tables are still combined). Only the
# superset that travels differs, never the release (tests/transforms/bounding/test_prereduce.py).
MODES = ("auto", "always", "never")
MODE = "auto"


def prereduce_l0(table, key_columns, max_keys_per_user, source, every_row=False,
                 grouped=None):
    """Row indices (ascending) of ``table`` (prepared read batches: ``__user``,
    ``__user_lo``, ``__key``, key columns) that can still be among a user's first
    ``max_keys_per_user`` keys: per user, one row per distinct exact key whose hash is
    among the user's C smallest hash ranks in this table (module docstring).

    source: the bounding stage's ``keyed_random.StageSource`` (same secret, same stage
    label as the ``PerUserBound`` after the shuffle). every_row: keep every row of those
    keys (``aggregates``: the bounding then sums each kept (user, key)'s values).
    grouped: ``exact_users_with_order(table)``, if the caller has it."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    # group by the full identity (rows keep their place); its sort by user serves l0_ranks
    grouped, by_user = exact_users_with_order(table) if grouped is None else grouped
    users = grouped.column(USER_COLUMN).to_numpy()
    bound = keyed_random.bind_users(source, grouped, key_columns)
    ranks = l0_ranks(users, grouped.column(KEY_HASH_COLUMN).to_numpy(), bound, by_user=by_user)
    inside = ranks.rank_in_user < max_keys_per_user
    rows = ranks.order[inside & ranks.distinct]          # one row per (user, hash) kept
    candidates = ranks.order[inside]
    if every_row:
        return np.sort(candidates)
    # repeated rows of kept hashes: are they other keys? (first per user, on the ranking)
    if len(candidates) > len(rows) \
            and not hash_exact_per_user(grouped, key_columns, ranks, rows=inside):
        part = grouped.take(pa.array(candidates))
        if not key_hash_is_exact(part, key_columns):   # keep one row per exact key
            codes = exact_key_codes(part, key_columns)
            part_users = users[candidates]
            order = np.lexsort((codes, part_users))
            first = _runs(part_users[order])
            first[1:] |= codes[order][1:] != codes[order][:-1]
            rows = candidates[order[first]]
    return np.sort(rows)


def heavy_user_rows(table, max_keys_per_user):
    """Row indices (ascending) that the kernel should read, or None when pre-reducing
    could remove fewer than ``MIN_REMOVED_ROWS`` rows.

    Users are counted in ``2**BUCKET_BITS`` buckets of the top bits of their word 0 (one
    ``bincount``; no sort, no hash table): a bucket with more than ``HEAVY_FACTOR * C``
    rows is heavy, and its rows are read (the heavy users', and those of the few light
    users sharing a heavy bucket, who lose only duplicate keys: any subset of users is a
    superset of the kept keys). Removable rows are at most the heavy buckets' rows less
    C each."""
    words = table.column(USER_COLUMN)
    words = (words.combine_chunks() if words.num_chunks != 1 else words.chunk(0)).to_numpy(
        zero_copy_only=False)
    limit = HEAVY_FACTOR * max_keys_per_user
    if len(words) <= limit:
        return None
    bits = min(BUCKET_BITS, max(1, (len(words) - 1).bit_length()))
    bucket = (words >> np.uint64(64 - bits)).astype(np.intp)
    counts = np.bincount(bucket, minlength=1 << bits)
    heavy = counts > limit
    if int((counts[heavy] - max_keys_per_user).sum()) < MIN_REMOVED_ROWS:
        return None
    return np.flatnonzero(heavy[bucket])


def distinct_pair_rows(table, key_columns):
    """Row indices (ascending) of ``table`` (prepared batches) keeping one row per
    distinct (user identity, exact key): the first row in table order of each distinct
    (``__user``, ``__user_lo``, key). No randomness is read.

    Pairs are told apart by the key hash ``__key``; where two different key tuples of
    one user share a hash (possible only by a collision of the 64-bit key hash), by
    exact key codes instead, so a user's colliding keys stay two keys (the automatic
    bound's ranking counts them as two: module docstring, "The automatic bound"). The
    rows are grouped by one value sort (:func:`first_rows_of_triples`), checked exact,
    with :func:`first_rows_by_lexsort` (the earlier kernel, and its test oracle) as the
    fallback.

    The collision check reads the grouping itself (issue 43): every row the grouping
    by hash drops is compared, on its key columns, with the row before it in its
    (user, hash) group (:func:`_repeats_hold_their_keys`). Where they all hold the same
    key tuple, the groups by hash are the groups by exact key (a hash is a function of
    the key), so the rows are those the exact codes give; otherwise the exact codes are
    used. Before, the table-wide ``key_hash_is_exact`` chose: a collision between keys
    of two different users sent the table to the exact codes too, which group it the
    same way, so the rows are the same."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    words = table.column(USER_COLUMN)
    words = (words.combine_chunks() if words.num_chunks != 1 else words.chunk(0)).to_numpy(
        zero_copy_only=False)
    low = table.column(USER_LOW_COLUMN).to_numpy()
    first, later, earlier = first_rows_of_triples(
        words, low, table.column(KEY_HASH_COLUMN).to_numpy(), repeats=True)
    if _repeats_hold_their_keys(table, key_columns, later, earlier):
        return first
    return first_rows_of_triples(words, low, exact_key_codes(table, key_columns))


def _repeats_hold_their_keys(table, key_columns, later, earlier):
    """True if rows ``later`` hold the key tuples of rows ``earlier`` (pairwise), on key
    types whose ``pc.equal`` is equality of values and without nulls; else (those
    cannot be compared so) whether ``__key`` is one-to-one on the table's keys
    (``key_hash_is_exact``, the check this replaces)."""
    types = [table.schema.field(name).type for name in key_columns]
    if not all(_bytewise_equal(t) for t in types) \
            or any(table.column(name).null_count for name in key_columns):
        return key_hash_is_exact(table, key_columns)
    if len(later) == 0:
        return True
    this, before = pa.array(later), pa.array(earlier)
    for name in key_columns:
        column = _flat(table.column(name))
        if not pc.all(pc.equal(column.take(this), column.take(before))).as_py():
            return False
    return True


def first_rows_of_triples(words, low, keys, hash_bits=None, repeats=False):
    """The first row (lowest index), ascending, of each distinct (words, low, keys)
    triple: :func:`first_rows_by_lexsort`'s rows, by one value sort (issue 43; numpy's
    sort of uint64 is ~4x faster than an argsort, and a three-key lexsort is three).

    Each row gets h = mix64(key) XOR user word, truncated to its top 64 - b bits with the
    row index in the low b = bit_length(n - 1) bits; sorting those words groups rows of
    equal truncated h, rows ascending within a group. Equal triples have equal h, so
    they share a group; a group holding two different triples (two pairs whose truncated
    h collide: probability about D^2 2^-(65-b) for D pairs) is detected by comparing
    every row of a group with the previous one on all three words, and then the lexsort
    is used. Without such a group every group is one triple, and its first row is the
    triple's first. ``hash_bits`` (tests only): keep that many bits of h, forcing
    collisions. ``repeats``: also return (later, earlier), every row but the first of
    its triple and a row of the same triple before it (int64 row indices)."""
    words = np.asarray(words, dtype=np.uint64)
    n = len(words)
    bits = max(1, (n - 1).bit_length())
    if n == 0 or bits > 40:
        return first_rows_by_lexsort(words, low, keys, repeats)
    mask = np.uint64((1 << bits) - 1)
    keys = np.asarray(keys)
    packed = mix64(keys.view(np.uint64) if keys.dtype == np.int64 else keys)
    packed ^= words
    packed &= ~mask
    if hash_bits is not None:
        packed &= ~np.uint64((1 << (64 - hash_bits)) - 1)
    packed |= np.arange(n, dtype=np.uint64)
    packed.sort()
    rows = (packed & mask).astype(np.intp)
    new_group = _runs(packed >> np.uint64(bits))
    del packed
    inner = ~new_group[1:]
    later = earlier = np.zeros(0, dtype=np.int64)
    if inner.any():
        later, earlier = rows[1:][inner], rows[:-1][inner]
        if not (np.array_equal(words[later], words[earlier])
                and np.array_equal(low[later], low[earlier])
                and np.array_equal(keys[later], keys[earlier])):
            return first_rows_by_lexsort(words, low, keys, repeats)
    first = np.sort(rows[new_group]).astype(np.int64)
    if repeats:
        return first, later.astype(np.int64), earlier.astype(np.int64)
    return first


def first_rows_by_lexsort(words, low, keys, repeats=False):
    """:func:`first_rows_of_triples` by a stable (words, low, keys) lexsort: each
    triple's first row comes first in its run."""
    if len(words) == 0:
        empty = np.zeros(0, dtype=np.int64)
        return (empty, empty, empty) if repeats else empty
    order = np.lexsort((keys, low, words))   # stable: each pair's first row comes first
    first = np.empty(len(order), dtype=bool)
    first[0] = True
    w, lo, k = words[order], low[order], keys[order]
    first[1:] = (w[1:] != w[:-1]) | (lo[1:] != lo[:-1]) | (k[1:] != k[:-1])
    rows = np.sort(order[first])
    if repeats:
        inner = ~first[1:]
        return rows, order[1:][inner].astype(np.int64), order[:-1][inner].astype(np.int64)
    return rows


def _buckets(table):
    """(bucket of each row, rows per bucket): ``heavy_user_rows``' user buckets."""
    words = table.column(USER_COLUMN)
    words = (words.combine_chunks() if words.num_chunks != 1 else words.chunk(0)).to_numpy(
        zero_copy_only=False)
    bits = min(BUCKET_BITS, max(1, (len(words) - 1).bit_length()))
    bucket = (words >> np.uint64(64 - bits)).astype(np.intp)
    return bucket, np.bincount(bucket, minlength=1 << bits)


def prereduce_pairs_table(table, key_columns, cap, source, mode="auto"):
    """:func:`prereduce_table` of the automatic bound: (boolean mask of the rows kept, or
    None for all of them; rows the kernel read).

    ``cap``: the keys of a user the score reads (``scored_bound.user_key_cap``);
    ``source``: the bounding stage's keyed source. In ``mode`` "auto", the rows of user
    buckets with more than ``HEAVY_FACTOR * cap`` rows go through :func:`prereduce_l0`
    at ``cap`` (one row per exact key among the user's ``cap`` smallest hash ranks in
    the table: a superset of its first ``cap`` keys, the fixed bound's argument), and
    those of buckets with more than ``AUTO_HEAVY_ROWS`` rows through
    :func:`distinct_pair_rows`, when the latter could remove at least
    ``MIN_REMOVED_ROWS`` rows; "always": every row through both (the l0 kernel first:
    what it keeps is already one row per pair); "never": none."""
    if mode == "never" or table.num_rows == 0:
        return None, 0
    if mode == "always":
        keep = np.zeros(table.num_rows, dtype=bool)
        keep[prereduce_l0(table, key_columns, cap, source)] = True
        return keep, table.num_rows
    if table.num_rows <= AUTO_HEAVY_ROWS:
        return None, 0
    bucket, counts = _buckets(table)
    capped = counts > HEAVY_FACTOR * cap
    heavy = (counts > AUTO_HEAVY_ROWS) & ~capped
    keep = np.ones(table.num_rows, dtype=bool)
    examined = 0
    if int((counts[heavy] - 1).sum()) >= MIN_REMOVED_ROWS:
        rows = np.flatnonzero(heavy[bucket])
        keep[rows] = False
        keep[rows[distinct_pair_rows(table.take(pa.array(rows)), key_columns)]] = True
        examined += len(rows)
    if capped.any():
        rows = np.flatnonzero(capped[bucket])
        keep[rows] = False
        keep[rows[prereduce_l0(table.take(pa.array(rows)), key_columns, cap, source)]] = True
        examined += len(rows)
    return (keep if examined else None), examined


def prereduce_table(table, key_columns, max_keys_per_user, source, every_row=False,
                    mode="auto", heavy=None):
    """(boolean mask of the rows kept, or None for all of them; rows the kernel read).
    ``heavy``: (rows, their table grouped by user, its ``UserOrder``) that a caller
    made already for this table, C and mode (``prereduce_stages.heavy_part``)."""
    if mode == "never" or table.num_rows == 0:
        return None, 0
    grouped = None
    if heavy is not None:
        rows, part, order = heavy
        if rows is None:
            return None, 0
        grouped = (part, order)
    elif mode == "always":
        rows = np.arange(table.num_rows)
        part = table
    else:
        rows = heavy_user_rows(table, max_keys_per_user)
        if rows is None:
            return None, 0
        part = table.take(pa.array(rows))
    kept = prereduce_l0(part, key_columns, max_keys_per_user, source, every_row, grouped)
    keep = np.ones(table.num_rows, dtype=bool)
    keep[rows] = False
    keep[rows[kept]] = True
    return keep, len(rows)


def summed_pairs(table, key_columns, value_names, min_rows=2):
    """``table`` with the rows of each (user identity, exact key) holding at least
    ``min_rows`` rows replaced by the exact expansion of their totals
    (:mod:`transforms.plumbing.exact_sums`, ``terms``): the pair's first row, repeated once
    per term, each copy carrying one term of every value column (0 where a column has
    fewer terms). The exact sum of a pair's values is unchanged, hence its total after
    the shuffle (module docstring, "Aggregates"). A pair is left as it is where that
    would not remove a row, or where a term would pass the float64 range (a partial
    total beyond about 1.8e308)."""
    n = table.num_rows
    if n < 2:
        return table
    group = [USER_COLUMN, USER_LOW_COLUMN, KEY_HASH_COLUMN, *key_columns]
    pair, groups = pair_groups(table, group)
    sizes = np.bincount(pair, minlength=groups.num_rows)
    candidate = sizes >= max(2, min_rows)
    if not candidate.any():
        return table
    rows = candidate[pair]
    renumber = np.cumsum(candidate) - 1
    which = np.flatnonzero(candidate)
    sub = renumber[pair[rows]]
    first = np.full(len(which), n, dtype=np.int64)
    np.minimum.at(first, sub, np.flatnonzero(rows))
    expansions, width = {}, np.ones(len(which), dtype=np.int64)
    finite = np.ones(len(which), dtype=bool)
    columns = {}
    for name in value_names:
        column = table.column(name)
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
        x = column.to_numpy(zero_copy_only=False)
        if column.null_count:
            x = np.where(column.is_valid().to_numpy(zero_copy_only=False), x, 0.0)
        columns[name] = column
        terms, count, ok = exact_sums(x[rows], sub, len(which), terms=True)
        expansions[name] = (terms, count)
        width = np.maximum(width, count)
        finite &= ok
    summed = finite & (width < sizes[which])
    if not summed.any():
        return table
    raw = np.flatnonzero(~(summed[renumber[pair]] & candidate[pair]))
    copies = width[summed]
    repeated = np.repeat(first[summed], copies)
    copy_start = np.cumsum(copies) - copies       # each summed pair's first copy
    out = table.take(pa.array(np.concatenate([raw, repeated])))
    for name in value_names:
        terms, count = expansions[name]           # ragged: the pair's terms, then the next's
        start = np.cumsum(count) - count
        mine = count[summed]
        slot = term_slots(mine)
        placed = np.zeros(len(repeated), dtype=np.float64)   # 0 beyond a column's terms
        placed[np.repeat(copy_start, mine) + slot] = terms[np.repeat(start[summed], mine) + slot]
        values = pa.concat_arrays([columns[name].take(pa.array(raw)).cast(pa.float64()),
                                   pa.array(placed, type=pa.float64())])
        position = out.schema.get_field_index(name)
        out = out.set_column(position, out.schema.field(name), values)
    return out


def prereduce_aggregates_table(table, key_columns, value_names, max_keys_per_user, source,
                               mode="auto"):
    """The pre-reduction of ``aggregates`` (module docstring, "Aggregates"): (the reduced
    table, or None for the table as it is; rows the kernels read).

    With a fixed bound (``max_keys_per_user`` an int): the rows of heavy user buckets
    (:func:`heavy_user_rows`) are cut to their C smallest hash ranks (every row of those
    keys, :func:`prereduce_l0` with ``every_row``), then each kept (user, key)'s rows to
    its exact expansion (:func:`summed_pairs`). With ``clip: auto``
    (``max_keys_per_user`` None: the clip's score reads every key of a user), the rows of
    user buckets with more than ``AUTO_HEAVY_ROWS`` rows go through
    :func:`summed_pairs` only. ``mode``: as :func:`prereduce_table`."""
    if mode == "never" or table.num_rows == 0:
        return None, 0
    if mode == "always":
        rows = np.arange(table.num_rows)
    elif max_keys_per_user is not None:
        rows = heavy_user_rows(table, max_keys_per_user)
    else:
        bucket, counts = _buckets(table)
        heavy = counts > AUTO_HEAVY_ROWS
        rows = (np.flatnonzero(heavy[bucket])
                if int((counts[heavy] - 1).sum()) >= MIN_REMOVED_ROWS else None)
    if rows is None or not len(rows):
        return None, 0
    part = table.take(pa.array(rows))
    if max_keys_per_user is not None:
        part = part.take(pa.array(prereduce_l0(part, key_columns, max_keys_per_user, source,
                                               every_row=True)))
    part = summed_pairs(part, key_columns, value_names)
    rest = np.ones(table.num_rows, dtype=bool)
    rest[rows] = False
    out = pa.concat_tables([table.filter(pa.array(rest)), part.cast(table.schema)])
    return out, len(rows)


# A pre-reduction that marks its kept rows (``mark_kept``) hands on the table whole only
# where it keeps at least this share of the rows; below it, a filtered copy. The split's
# input element outlives its processing: Beam holds each DoFn's last element (its
# ``DoFnContext`` and its invoker's arguments) until the next one arrives, i.e. through
# the next table's read and pre-reduction. A whole table kept for a few of its rows (one
# heavy user's table: ~1 % of 1e6 rows) was held so (issue 43 round 9: +30 MB of Arrow
# at the pre-reduction, +44 MB of peak RSS), where its filtered copy costs a copy of
# those few rows and spares the split a pass over the others.
MARK_MIN_KEPT = 0.5


class _PreReduceFn(beam.DoFn):
    def __init__(self, key_columns, max_keys_per_user, rng_factory, stage, every_row, mode,
                 coalesce_rows, auto_cap=None, value_names=None, mark_kept=False):
        self._mark_kept = mark_kept
        self._auto_cap = auto_cap
        self._value_names = None if value_names is None else tuple(value_names)
        self._key_columns = tuple(key_columns)
        self._max_keys_per_user = None if max_keys_per_user is None else int(max_keys_per_user)
        self._rng_factory = rng_factory
        self._stage = stage
        self._every_row = every_row
        self._mode = mode
        self._coalesce_rows = coalesce_rows

    def start_bundle(self):
        # One list for the bundle: release batches are all in the global window (and the
        # secret's wrapper, keyed_random.par_do, passes no window parameter through).
        self._pending = []
        self._pending_rows = 0

    def process(self, table):
        self._pending.append(table)
        self._pending_rows += table.num_rows
        if self._pending_rows >= self._coalesce_rows:
            yield from self._flush()

    def _flush(self):
        tables, self._pending, self._pending_rows = self._pending, [], 0
        table = concat(tables)
        del tables   # the gathered batches go before the kernels run (a copy is combined)
        if table is None:
            return
        source = keyed_random.StageSource(self._rng_factory, self._stage)
        if self._value_names is not None:   # aggregates: exact partial totals
            reduced, examined = prereduce_aggregates_table(
                table, self._key_columns, self._value_names, self._max_keys_per_user,
                source, self._mode)
            table = table if reduced is None else reduced
            kept = None
        elif self._auto_cap is not None:     # the automatic bound
            kept, examined = prereduce_pairs_table(table, self._key_columns, self._auto_cap,
                                                   source, self._mode)
        else:
            kept, examined = prereduce_table(table, self._key_columns,
                                             self._max_keys_per_user, source,
                                             self._every_row, self._mode)
        counter = beam.metrics.Metrics.counter
        counter(NOT_PRIVATE, "rows_prereduced_in").inc(table.num_rows)
        counter(NOT_PRIVATE, "rows_prereduce_examined").inc(examined)
        out_rows = table.num_rows
        if kept is not None and not kept.all():
            out_rows = int(np.count_nonzero(kept))
            if self._mark_kept and out_rows >= MARK_MIN_KEPT * table.num_rows:
                # the split gathers the kept rows (user_shards.KEPT_COLUMN)
                table = table.append_column(KEPT_COLUMN, pa.array(kept))
            else:
                table = table.filter(pa.array(kept))
                out_rows = table.num_rows
        counter(NOT_PRIVATE, "rows_prereduced_out").inc(out_rows)
        if out_rows:
            yield table

    def finish_bundle(self):
        for table in self._flush():
            yield GlobalWindows.windowed_value(table)


class PreReduceL0(beam.PTransform):
    """Prepared record batches -> tables of about ``COALESCE_ROWS`` rows (the read
    batches of a bundle combined), without rows fixed-bound l0 bounding at C cannot keep
    where removing them pays (:func:`prereduce_table`): every row passes once.

    ``stage``: the label path handed to the ``PerUserBound`` that bounds these records after the
    shuffle (its keyed draws are the ones computed here). ``rng_factory`` must be a
    ``keyed_random.KeyedSource`` (the release's secret): with fresh randomness the draws
    here and after the shuffle would differ, so the caller applies this step only then.
    ``mode``: :data:`MODE` by default (module constants)."""

    def __init__(self, key_columns, max_keys_per_user, rng_factory, stage, every_row=False,
                 mode=None, coalesce_rows=None, label=None, value_names=None):
        super().__init__(label)
        if not isinstance(rng_factory, keyed_random.KeyedSource):
            raise TypeError("PreReduceL0 needs the release's KeyedSource")
        # value_names (aggregates): kept (user, key) rows travel as exact partial totals
        # (prereduce_aggregates_table); max_keys_per_user None: no key is cut (clip: auto)
        self._value_names = None if value_names is None else tuple(value_names)
        mode = MODE if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"PreReduceL0 mode must be one of {MODES}, got {mode!r}")
        self._key_columns = tuple(key_columns)
        self._max_keys_per_user = (None if max_keys_per_user is None
                                   else int(max_keys_per_user))
        self._rng_factory = rng_factory
        self._stage = stage
        self._every_row = every_row
        self._mode = mode
        self._coalesce_rows = COALESCE_ROWS if coalesce_rows is None else int(coalesce_rows)

    def expand(self, batches):
        return batches | "PreReduce" >> keyed_random.par_do(_PreReduceFn(
            self._key_columns, self._max_keys_per_user, self._rng_factory, self._stage,
            self._every_row, self._mode, self._coalesce_rows, value_names=self._value_names)
        ).with_output_types(TABLE)


class PreReducePairs(beam.PTransform):
    """Prepared record batches -> tables of about ``COALESCE_ROWS`` rows (the read
    batches of a bundle combined), reduced where it pays by :func:`prereduce_pairs_table`:
    the pre-reduction of ``max_keys_per_user: auto`` (module docstring, "The automatic
    bound", says why it changes no score and no kept set). ``cap``: the user key cap of
    the score (``scored_bound.user_key_cap``); ``stage``, ``rng_factory``: as for
    :class:`PreReduceL0` (the release's ``KeyedSource`` only). ``mode``: :data:`MODE` by
    default. ``mark_kept``: a reduced table that keeps at least ``MARK_MIN_KEPT`` of its
    rows leaves whole, its kept rows marked in ``user_shards.KEPT_COLUMN`` (for
    ``ShardByUser``, whose split gathers those rows only), not as a filtered copy."""

    def __init__(self, key_columns, cap, rng_factory, stage, mode=None, coalesce_rows=None,
                 label=None, mark_kept=False):
        super().__init__(label)
        if not isinstance(rng_factory, keyed_random.KeyedSource):
            raise TypeError("PreReducePairs needs the release's KeyedSource")
        mode = MODE if mode is None else mode
        if mode not in MODES:
            raise ValueError(f"PreReducePairs mode must be one of {MODES}, got {mode!r}")
        self._key_columns = tuple(key_columns)
        self._cap = int(cap)
        self._rng_factory = rng_factory
        self._stage = stage
        self._mode = mode
        self._coalesce_rows = COALESCE_ROWS if coalesce_rows is None else int(coalesce_rows)
        self._mark_kept = bool(mark_kept)

    def expand(self, batches):
        return batches | "PreReducePairs" >> keyed_random.par_do(_PreReduceFn(
            self._key_columns, None, self._rng_factory, self._stage, False, self._mode,
            self._coalesce_rows, auto_cap=self._cap,
            mark_kept=self._mark_kept)).with_output_types(TABLE)

"""One value per (user, key), at most C keys per user: the bounding of per-key quantiles
over a public cell domain (``transforms.trees.public_cells``).

Paper 002 Sec. 3 / paper 004 Sec. 2 bound a user to C keys with l_inf = 1. For per-key
quantiles the "contribution" to key k is a value; keeping one value per (user, key) and
at most C keys makes every level of the per-key hierarchy move by at most 1 in at most C
cells when one user is added or removed (one bucket per kept key), so the L levels are
C L unit shifts (``accounting.known_domain.gaussian_delta`` with count C L).

Choice (depends only on the user's own records and the release's keyed randomness, as
``transforms.bounding.per_user_bound``): each distinct (user, key, value) gets a uniform 64-bit
priority and the user keeps, per key, its value of smallest priority (a uniform draw
among the user's distinct values for that key); each kept (user, key) then gets a
second priority and the user keeps its C keys of smallest priority (a uniform C-subset
of the user's keys). Exact codes group the rows (no hash collisions can merge keys).
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding.per_user_bound import (
    column_codes, combine_codes, count_per_key)
from thresher.transforms.bounding.user_shards import (
    KEY_HASH_COLUMN, USER_COLUMN, user_identity_columns)


_NEGATIVE_ZERO = np.uint64(1 << 63)   # the bits of -0.0
_RANK_BITS = 24       # a group's rank in _by_group_then_priority's one-word sort keys


def _by_group_then_priority(groups, priorities):
    """``np.lexsort((priorities, groups))`` (uint64 priorities), for ``groups`` sorted:
    one argsort of one word per row, (the group's rank, the priority's top 40 bits),
    which orders the rows the same way whenever those words are distinct; when two
    are equal (one chance in about 2**41 per pair of rows of a group) or there are
    more than 2**24 groups, the lexsort itself. Exactly lexsort's order either way."""
    n = len(groups)
    if n < 2:
        return np.arange(n)
    start = np.ones(n, dtype=bool)
    start[1:] = groups[1:] != groups[:-1]
    rank = np.cumsum(start, dtype=np.int64) - 1
    if int(rank[-1]) >= (1 << _RANK_BITS):
        return np.lexsort((priorities, groups))
    shift = np.uint64(64 - _RANK_BITS)
    word = (rank.astype(np.uint64) << shift) | (priorities.astype(np.uint64) >> np.uint64(_RANK_BITS))
    order = np.argsort(word)
    ordered = word[order]
    if (ordered[1:] == ordered[:-1]).any():
        return np.lexsort((priorities, groups))
    return order


def _first_per_group(groups, priorities, groups_sorted=False):
    """Index (into the arrays) of the smallest priority in each group (ties: the first),
    in group order (``groups_sorted``: the groups come sorted, a faster sort applies)."""
    order = (_by_group_then_priority(groups, priorities) if groups_sorted
             else np.lexsort((priorities, groups)))
    g = groups[order]
    start = np.ones(len(g), dtype=bool)
    start[1:] = g[1:] != g[:-1]
    return order[start]


def _runs(sorted_codes):
    """(first index of each run of equal codes, run lengths) of a sorted array."""
    start = np.ones(len(sorted_codes), dtype=bool)
    start[1:] = sorted_codes[1:] != sorted_codes[:-1]
    first = np.flatnonzero(start)
    return first, np.diff(np.append(first, len(sorted_codes)))


def _keyed(*sources):
    """True for a release's keyed draws (a stage source, bound to a table or not): one
    stream per row, a function of the row's identity alone."""
    return any(isinstance(s, (keyed_random.StageSource, keyed_random.TableStreams))
               for s in sources)


def _one_value_per_pair(rows, pair, value_rng, texts):
    """Indices into ``rows`` (one per distinct (user, key, value), sorted by their (user,
    key) code ``pair``) of the kept value of each (user, key): its smallest value
    priority, in (user, key) order. ``texts``: exact codes of the (key, value) columns,
    per row of the table (the draws' text identities are found through them).

    Keyed draws are asked only for the (user, key) groups with two values or more: a
    row's keyed priority depends on its identity alone (``keyed_random.RowStreams``),
    and a group of one value keeps it whatever its priority, so skipping those draws
    changes no choice (the published bytes are those of drawing every row). A seeded test
    generator is consumed in order, one word per row, as it always was."""
    if not _keyed(value_rng):
        prio = samplers.uniform_priorities(value_rng, len(rows))
        return _first_per_group(pair, prio)
    first, length = _runs(pair)
    chosen = first.copy()
    several = length > 1
    if several.any():
        members = np.flatnonzero(np.repeat(several, length))     # rows of those groups
        prio = samplers.uniform_priorities(
            keyed_random.rows_of(value_rng, rows[members], "triple", texts), len(members))
        chosen[several] = members[_first_per_group(pair[members], prio, groups_sorted=True)]
    return chosen


def _first_keys_per_user(rows, user, max_keys, key_rng, texts):
    """Indices into ``rows`` (one per (user, key), sorted by ``user``) of each user's
    ``max_keys`` (user, key) rows of smallest key priority. Keyed draws only for the
    users with more than ``max_keys`` keys (the others keep all theirs, whatever the
    draws: :func:`_one_value_per_pair`'s argument); a seeded generator as always.
    ``texts``: exact codes of the key columns, per row of the table."""
    keyed = _keyed(key_rng)
    if keyed:
        first, length = _runs(user)
        keep = ~np.repeat(length > max_keys, length)
        members = np.flatnonzero(~keep)
        if len(members) == 0:
            return np.arange(len(rows))
        rows, user = rows[members], user[members]
    prio = samplers.uniform_priorities(keyed_random.rows_of(key_rng, rows, "pair", texts),
                                       len(rows))
    order = _by_group_then_priority(user, prio) if keyed else np.lexsort((prio, user))
    u = user[order]
    start = np.ones(len(u), dtype=bool)
    start[1:] = u[1:] != u[:-1]
    position = np.arange(len(u))
    rank_in_user = position - np.maximum.accumulate(np.where(start, position, 0))
    chosen = order[rank_in_user < max_keys]
    if keyed:
        return np.concatenate((np.flatnonzero(keep), members[chosen]))
    return chosen


def _value_codes(table, name):
    """``column_codes(table, name)`` up to a renumbering: (int64 codes equal exactly where
    the values are equal, their number). A null-free integer column, or float64 column
    without NaN or -0.0, is ranked by one value sort of its bits (equal bits, equal value,
    as Arrow's dictionary encoding of doubles, which is bitwise), cheaper than the hash
    pass; any other column goes through ``column_codes``. Distinct values there have
    distinct identity texts, so their keyed draws do not tie. The codes only
    group rows, so which number a value gets changes no keyed choice (a keyed draw
    depends on its row's identity alone; ``bound_key_values``)."""
    column = table.column(name)
    t = column.type
    if column.null_count or not (pa.types.is_float64(t) or pa.types.is_int64(t)
                                 or pa.types.is_uint64(t)):
        return column_codes(table, name)
    bits = column.to_numpy().view(np.uint64)
    if len(bits) == 0:
        return np.zeros(0, dtype=np.int64), 0
    if pa.types.is_float64(t) and (np.isnan(bits.view(np.float64)).any()
                                   or (bits == _NEGATIVE_ZERO).any()):
        # -0.0 and 0.0 (NaNs of any payload) are two codes but one identity text
        # (hashing.canonical_text), so their draws tie and the codes' order breaks the
        # tie: keep the hash pass's numbering there
        return column_codes(table, name)
    order = np.argsort(bits)
    ordered = bits[order]
    new = np.ones(len(bits), dtype=bool)
    new[1:] = ordered[1:] != ordered[:-1]
    codes = np.empty(len(bits), dtype=np.int64)
    codes[order] = np.cumsum(new) - 1
    return codes, int(codes[order[-1]]) + 1


def _first_of_each(codes):
    """``np.unique(codes, return_index=True)[1]``: the index of the first occurrence of
    each distinct code, in code order -- from one unstable sort (the first occurrence of
    a code is the smallest index among its run), not unique's stable one."""
    if len(codes) == 0:
        return np.zeros(0, dtype=np.int64)
    order = np.argsort(codes)
    ordered = codes[order]
    start = np.ones(len(codes), dtype=bool)
    start[1:] = ordered[1:] != ordered[:-1]
    return np.minimum.reduceat(order, np.flatnonzero(start)).astype(np.int64)


def bound_key_values(table, key_columns, value_column, max_keys_per_user, value_rng, key_rng):
    """Row indices of a user-sharded table kept: one row per kept (user, key) holding a
    uniformly drawn value of that user for that key, at most ``max_keys_per_user`` keys
    per user. ``value_rng`` / ``key_rng``: two independent sources (keyed stage sources
    in a release; seeded generators in tests)."""
    if table.num_rows and _keyed(value_rng) and _keyed(key_rng):
        kept = _keyed_rows(table, list(key_columns), value_column, int(max_keys_per_user),
                           value_rng, key_rng)
        if kept is not None:
            return kept
    return _bound_with_codes(table, key_columns, value_column, max_keys_per_user,
                             value_rng, key_rng)[0]


def _rows_by_code(codes):
    """The rows by (code, row index): one value sort of each row's non-negative code
    with its index in the low bits (a uint64 sort is several times faster than an
    argsort); the argsort of (code, index) pairs where they do not fit in 64 bits."""
    n = len(codes)
    bits = max(1, (n - 1).bit_length())
    if n == 0 or int(codes.min()) < 0 or int(codes.max()) >= 1 << (64 - bits):
        return np.lexsort((np.arange(n), codes))
    packed = (codes.astype(np.uint64) << np.uint64(bits)) | np.arange(n, dtype=np.uint64)
    packed.sort()
    return (packed & np.uint64((1 << bits) - 1)).astype(np.int64)


def _keyed_rows(table, keys, value_column, max_keys, value_rng, key_rng):
    """:func:`bound_key_values` under keyed draws, with (user, key, value) told apart
    only among the rows of kept pairs that hold two rows or more (issue 43 round 8):
    the value column is read for those rows alone, not de-duplicated over the whole
    table. The same rows as :func:`_bound_with_codes`' keyed path, and the same draws:

    - the C keys: a pair's key priority is keyed by (user, key), whichever of its rows
      stands for it (here its first row; there the first row of its first triple), and
      the pairs come in the same order (the same pair codes), so ties break alike;
    - the value: a kept pair of one distinct value keeps its first row with no draw, as
      there; a pair of several draws once per distinct value (its first row) and keeps
      the one of smallest priority, as there -- unless two of its values tie on their
      priority (equal identity texts, as -0.0 and 0.0, or a 64-bit collision): then
      None, and the caller takes that path, whose tie order is the triples' codes."""
    n = table.num_rows
    user = combine_codes(None, *column_codes(table, USER_COLUMN))
    pair, key = user, None
    for name in keys:
        part, width = column_codes(table, name)
        pair, key = combine_codes(pair, part, width), combine_codes(key, part, width)
    order = _rows_by_code(pair)
    first, length = _runs(pair[order])
    reps = order[first]                             # each pair's first row, in pair order
    users = user_identity_columns(table)
    value_rng = keyed_random.bind(value_rng, table, triple=[*users, *keys, value_column])
    key_rng = keyed_random.bind(key_rng, table, pair=[*users, *keys])
    kept = np.sort(_first_keys_per_user(reps, user[reps], max_keys, key_rng, key))
    several = length[kept] > 1
    chosen = [reps[kept[~several]]]
    multi = kept[several]
    if len(multi):
        take = np.zeros(len(first), dtype=bool)
        take[multi] = True
        members = order[np.repeat(take, length)]   # rows of those pairs, pair by pair
        group = np.repeat(np.arange(len(multi)), length[multi])
        part, width = column_codes(table.take(pa.array(members)), value_column)
        triple = combine_codes(group, part, width)
        by = np.argsort(triple)
        heads, _ = _runs(triple[by])
        rows = np.minimum.reduceat(members[by], heads)      # each triple's first row
        of_group, values = group[by[heads]], part[by[heads]]
        group_first, group_length = _runs(of_group)
        alone = group_length == 1
        chosen.append(rows[group_first[alone]])
        draw = np.repeat(~alone, group_length)
        if draw.any():
            rows, of_group = rows[draw], of_group[draw]
            texts = np.zeros(n, dtype=np.int64)       # read at ``rows`` only
            texts[rows] = combine_codes(key[rows], values[draw], width)
            prio = samplers.uniform_priorities(
                keyed_random.rows_of(value_rng, rows, "triple", texts), len(rows))
            by = np.lexsort((prio, of_group))
            g, p = of_group[by], prio[by]
            if ((g[1:] == g[:-1]) & (p[1:] == p[:-1])).any():
                return None
            chosen.append(rows[by[_runs(g)[0]]])
    return np.sort(np.concatenate(chosen))


def _bound_with_codes(table, key_columns, value_column, max_keys_per_user, value_rng,
                      key_rng):
    """:func:`bound_key_values`' rows, and the exact codes of (key columns, value) per
    row of the table that it computed on the way (None for an empty table)."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64), None
    keys = list(key_columns)
    # each column dictionary-encoded once: the codes of (user), (user, key), (user, key,
    # value) as exact_key_codes gives them, and of (key), (key, value) for the draws'
    # text identities
    user = combine_codes(None, *column_codes(table, USER_COLUMN))
    pair, key = user, None
    for name in keys:
        part, width = column_codes(table, name)
        pair, key = combine_codes(pair, part, width), combine_codes(key, part, width)
    # keyed draws depend on each row's identity alone, so the codes' numbering is free;
    # a seeded test generator is consumed in the order of the hash codes, as always
    part, width = (_value_codes(table, value_column) if _keyed(value_rng, key_rng)
                   else column_codes(table, value_column))
    triple, key_value = combine_codes(pair, part, width), combine_codes(key, part, width)
    rows = _first_of_each(triple)       # one row per distinct (user, key, value)
    pair_of = pair[rows]               # sorted: a triple's code orders by its pair's first
    if len(pair_of) > 1 and not (pair_of[1:] >= pair_of[:-1]).all():  # pragma: no cover
        raise AssertionError("exact key codes lost their prefix order")
    # streams keyed by the user's identity words, never the in-shard grouping code that
    # exact_users may have put in __user (it depends on the other users of the shard)
    users = user_identity_columns(table) if _keyed(value_rng, key_rng) else [USER_COLUMN]
    value_rng = keyed_random.bind(value_rng, table, triple=[*users, *keys, value_column])
    key_rng = keyed_random.bind(key_rng, table, pair=[*users, *keys])
    if _keyed(value_rng) and _keyed(key_rng):
        return _keys_then_values(rows, pair_of, user, int(max_keys_per_user), value_rng,
                                 key_rng, key, key_value), key_value
    rows = rows[_one_value_per_pair(rows, pair_of, value_rng, key_value)]
    user_of = user[rows]               # sorted too: a pair's code orders by its user's first
    kept = _first_keys_per_user(rows, user_of, int(max_keys_per_user), key_rng, key)
    return np.sort(rows[kept]), key_value


def _keys_then_values(rows, pair_of, user, max_keys, value_rng, key_rng, key, key_value):
    """The keyed choice of :func:`_bound_with_codes` with its two steps swapped: each user's
    C keys first (one row per (user, key) stands for the pair), then a value for the kept
    pairs only (issue 43 round 7: a value drawn for a pair the user does not keep was
    drawn for nothing). The same rows: a pair's key priority is keyed by (user, key), the same
    for each of its rows, so which row stands for it changes no key choice; and a pair's
    value is its smallest value priority among its own rows, whatever the other pairs.
    ``rows``: one per distinct (user, key, value), in pair order (``pair_of``)."""
    first, length = _runs(pair_of)
    reps = rows[first]                 # one row per (user, key), in user order
    kept = np.sort(_first_keys_per_user(reps, user[reps], max_keys, key_rng, key))
    if len(kept) == len(first):
        members, pairs = rows, pair_of
    else:
        take = np.zeros(len(first), dtype=bool)
        take[kept] = True
        keep_rows = np.repeat(take, length)
        members, pairs = rows[keep_rows], pair_of[keep_rows]
    return np.sort(members[_one_value_per_pair(members, pairs, value_rng, key_value)])


def counts_of_kept(table, kept, key_value, columns):
    """``count_per_key(table.take(kept), columns)`` (``columns``: the key columns and the
    value) up to the order of its rows, from the exact (key, value) codes of the rows
    (``key_value``): one sort of the kept rows' codes, a row per run and its length. The
    group of ``count_per_key`` is (key, value, ``__key``); where ``__key`` is not one
    per (key, value) (it is their hash in a release) that group_by itself is used."""
    codes = key_value[kept]
    order = np.argsort(codes)
    ordered = codes[order]
    start = np.ones(len(order), dtype=bool)
    start[1:] = ordered[1:] != ordered[:-1]
    hashes = table.column(KEY_HASH_COLUMN).to_numpy()[kept][order]
    if (hashes[1:] != hashes[:-1])[~start[1:]].any():
        return count_per_key(table.take(pa.array(kept)), columns)
    first = np.flatnonzero(start)
    runs = np.diff(np.append(first, len(order)))
    rows = kept[order[first]]
    out = table.select([*columns, KEY_HASH_COLUMN]).take(pa.array(rows))
    return out.append_column("count", pa.array(runs.astype(np.int64))).combine_chunks()


def stage_sources(rng_factory, rng, stage):
    """(value draws, key draws): the two keyed streams of one ``BoundKeyValues`` stage,
    for every DoFn that bounds as that stage does (here and ``transforms.trees.
    bounded_cells``), so that both draw the very same values and keys."""
    return (keyed_random.stage_source(rng_factory, rng, stage + "/value"),
            keyed_random.stage_source(rng_factory, rng, stage + "/keys"))


class _BoundFn(beam.DoFn):
    def __init__(self, key_columns, value_column, max_keys_per_user, rng_factory, stage):
        self._keys = tuple(key_columns)
        self._column = value_column
        self._bound = int(max_keys_per_user)
        self._rng_factory = rng_factory
        self._stage = stage

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table):
        value_rng, key_rng = stage_sources(self._rng_factory, self._rng, self._stage)
        kept, key_value = _bound_with_codes(table, self._keys, self._column, self._bound,
                                            value_rng, key_rng)
        beam.metrics.Metrics.counter("thresher_not_private", "contributions_kept").inc(len(kept))
        if len(kept):
            yield counts_of_kept(table, kept, key_value, (*self._keys, self._column))


class BoundKeyValues(beam.PTransform):
    """User-sharded record tables (key columns, the value column, ``__key`` hashed over
    both) -> partial counts (keys, value, ``__key``, ``count``): distinct users per
    (key, value) after keeping one value per (user, key) and at most C keys per user."""

    def __init__(self, key_columns, value_column, max_keys_per_user, rng_factory=None,
                 label=None):
        super().__init__(label)
        self._keys = tuple(key_columns)
        self._column = value_column
        self._bound = int(max_keys_per_user)
        self._rng_factory = rng_factory

    def expand(self, user_shards):
        return user_shards | "OneValuePerKey" >> keyed_random.par_do(_BoundFn(
            self._keys, self._column, self._bound, *keyed_random.stage_of(self._rng_factory))).with_output_types(TABLE)

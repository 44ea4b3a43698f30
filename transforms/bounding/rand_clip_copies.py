"""Rand-clip (l1) on (record, copies) rows: a heavy user bounded, not refused (issue 43).

:mod:`transforms.bounding.rand_clip` keeps, per user u, the C records of smallest
priority mix64(mix64(h(r) XOR s_u) + j), j the copy number of record r among u's rows
(copies numbered per (user, record hash), in content order where two different records
share a hash: ``rand_clip.keyed_priorities``). The kept multiset is a function of u's
multiset of records, nothing else: a record's priorities are fixed by its total number
of copies N_r, whatever rows they sit in.

So a user's rows can travel as (record, count) pairs. :class:`PreReduceCopies` (before
the user shuffle) replaces, where it pays, the rows of each distinct (user identity,
record) of a table by its first row carrying the count in a ``__copies`` column
(:func:`collapse_copies`; a table where nothing is collapsed travels as it is): a
repeated record of a heavy user travels as one row per table. After the shuffle :func:`kept_copies` sums the counts per (user, record),
numbers the copies as the row kernel does (a record's copies 0..N_r - 1; records sharing
a hash continue each other's numbering in content order), computes every copy's
priority and keeps each user's C smallest: the same kept copies as the row kernel on the
expanded rows, hence the same per-key counts and the same published bytes
(tests/transforms/bounding/test_rand_clip_copies.py, with the step on and off).

Memory. The copies are enumerated in blocks of ``BLOCK`` copies (vectorised; a Python
loop over blocks, never over rows), each block keeping its C smallest priorities per
user, so a record with 1e7 copies costs one block's arrays at a time. What a user sends
through the shuffle is one row per distinct record and table: a user with more than
``user_shards.MAX_USER_ROWS`` *distinct* records is still held in one place, and is
refused (``pipelines.running.release._whole_user_setting`` names ``bounding.model``).
An exact bound of distinct records would need each record's total N_r before choosing
(a shuffle by (user, record)); that is not built.

Ties. The row kernel breaks a tie between two 64-bit priorities of one user by row
position, this one by (record, copy) order: they differ only when two different records
of one user tie, probability below n^2 / 2^65 for a user's n copies.
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from apache_beam.transforms.window import GlobalWindows

from thresher.transforms.bounding import prereduce
from thresher.transforms.bounding.per_user_bound import count_per_key, exact_key_codes
from thresher.transforms.bounding.rand_clip import (
    RandClip, _RandClipFn, _bound, _content_order, _copies_are_identical, rand_clip_counts,
    rank_within_user, user_codes_of)
from thresher.transforms.bounding.user_shards import (
    COALESCE_ROWS, USER_COLUMN, USER_HIGH_COLUMN, USER_LOW_COLUMN, concat)
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.randomness.hashing import hash_columns, mix64

COPIES_COLUMN = "__copies"
USER_COLUMNS = (USER_COLUMN, USER_HIGH_COLUMN, USER_LOW_COLUMN)
# Copies enumerated at once by kept_copies (about 60 bytes each while a block is live:
# 2**20 of them added ~70 MB of peak memory to an ordinary 3e6-row l1 release).
BLOCK = 1 << 18
# A user bucket with more than this many rows in a table (~2**20 rows) is collapsed
# (module docstring). High, so that ordinary data pays nothing: on Zipf-active users
# (benchmarks/datagen.py, 3e6 rows, 300,000 users; the heaviest has 13,934 rows in a
# table) collapsing the users with more than 1,024 rows cost +0.5 s of CPU and +65 MB of
# peak memory per 3e6 rows (load 13.6), none without it. A heavy user has 1e5 or more
# rows in each table; one that stays below this in every table reaches the whole-user
# limit only over more than 2**21 / HEAVY_ROWS = 128 tables (about 1.3e8 rows).
HEAVY_ROWS = 1 << 14


def record_columns(table, user_column=USER_COLUMN):
    """The columns of a record (what ``rand_clip.keyed_priorities`` hashes): all but
    the user columns and ``__copies``."""
    skip = {user_column, *USER_COLUMNS, COPIES_COLUMN}
    return [c for c in table.column_names if c not in skip]


def _user_buckets(table):
    """(bucket of each row, rows per bucket): users counted in at most
    ``prereduce.BUCKET_BITS`` bits of the top of word 0 (one bincount, no sort)."""
    words = table.column(USER_COLUMN)
    words = (words.combine_chunks() if words.num_chunks != 1 else words.chunk(0)).to_numpy(
        zero_copy_only=False)
    bits = min(prereduce.BUCKET_BITS, max(1, (len(words) - 1).bit_length()))
    bucket = (words >> np.uint64(64 - bits)).astype(np.intp)
    return bucket, np.bincount(bucket, minlength=1 << bits)


def collapse_copies(table, mode="auto"):
    """``table`` (prepared batches: ``__user``, ``__user_lo``, ``__key``, key columns)
    with ``__copies`` (int64) appended, and, per distinct (user identity, record) among
    the rows collapsed, one row (the first) carrying the number of its rows; the table
    as it is (no ``__copies``: one copy a row) when nothing is collapsed. A user shard
    concatenates tables with and without the column (Arrow fills it with nulls: one
    copy), and a shard without it goes to the row kernel unchanged. ``mode``:
    "auto" collapses the rows of user buckets with more than ``HEAVY_ROWS`` rows when
    that removes at least ``prereduce.MIN_REMOVED_ROWS`` rows; "always" every row;
    "never" none. Records are compared on exact codes of every record column (never on
    a hash)."""
    n = table.num_rows
    if mode == "never" or n == 0:
        return table
    if mode == "always":
        rows = np.arange(n)
    else:
        bucket, counts = _user_buckets(table)
        heavy = counts > HEAVY_ROWS
        if int((counts[heavy] - 1).sum()) < prereduce.MIN_REMOVED_ROWS:
            return table
        rows = np.flatnonzero(heavy[bucket])
    copies = np.ones(n, dtype=np.int64)
    part = table.take(pa.array(rows))
    words = part.column(USER_COLUMN).to_numpy()
    low = part.column(USER_LOW_COLUMN).to_numpy()
    records = exact_key_codes(part, record_columns(part))
    order = np.lexsort((records, low, words))       # stable: each group's first row first
    w, lo, r = words[order], low[order], records[order]
    first = np.empty(len(order), dtype=bool)
    first[0] = True
    first[1:] = (w[1:] != w[:-1]) | (lo[1:] != lo[:-1]) | (r[1:] != r[:-1])
    starts = np.flatnonzero(first)
    sizes = np.diff(np.append(starts, len(order)))
    keep = np.ones(n, dtype=bool)
    keep[rows] = False
    keep[rows[order[starts]]] = True
    copies[rows[order[starts]]] = sizes
    out = table.append_column(COPIES_COLUMN, pa.array(copies))
    return out.filter(pa.array(keep))


def kept_copies(table, user_codes, streams, max_records_per_user, user_column=USER_COLUMN):
    """Row indices of ``table`` (whole users, with ``__copies``) repeated once per kept
    copy: rand-clip's choice (``rand_clip.keyed_priorities`` and rank < C) on the rows
    the counts stand for (module docstring). ``streams``: the stage's keyed streams
    bound to ``table`` (``keyed_random.bind_users``)."""
    n = table.num_rows
    c = int(max_records_per_user)
    # a null count is a row of a table that was not collapsed: one copy
    copies = pc.fill_null(table.column(COPIES_COLUMN), 1).to_numpy().astype(np.int64)
    content = table.drop_columns([COPIES_COLUMN])
    users = {user_column, *USER_COLUMNS}
    columns = [name for name in content.column_names if name not in users]
    record = hash_columns(content, columns)
    order = np.lexsort((record, user_codes))
    new_user = np.r_[True, user_codes[order][1:] != user_codes[order][:-1]]
    new_hash = new_user | np.r_[True, record[order][1:] != record[order][:-1]]
    new_group = new_hash
    if not new_hash.all() and not _copies_are_identical(content, order, new_hash):
        # two different records share a hash: content order, groups of equal content
        order = _content_order(content, user_codes, record)
        new_user = np.r_[True, user_codes[order][1:] != user_codes[order][:-1]]
        new_hash = new_user | np.r_[True, record[order][1:] != record[order][:-1]]
        codes = exact_key_codes(content.take(pa.array(order)), columns)
        new_group = new_hash | np.r_[True, codes[1:] != codes[:-1]]
    starts = np.flatnonzero(new_group)
    totals = np.add.reduceat(copies[order], starts) if n else np.zeros(0, np.int64)
    # copy numbers continue across the groups of one hash run (content order)
    hash_run = np.cumsum(new_hash)[starts] - 1
    before = np.cumsum(totals) - totals
    run_start = before[np.r_[True, hash_run[1:] != hash_run[:-1]]][hash_run] if n else before
    offset = before - run_start
    first_rows = order[new_user]
    salts = samplers.uniform_priorities(
        keyed_random.rows_of(streams, first_rows, "user"), len(first_rows))
    group_user = (np.cumsum(new_user) - 1)[starts]
    inner = mix64(record[order][starts] ^ salts[group_user])
    end = np.cumsum(totals)
    kept_group, kept_priority = [], []
    for start in range(0, int(end[-1]) if n else 0, BLOCK):
        index = np.arange(start, min(start + BLOCK, int(end[-1])), dtype=np.int64)
        group = np.searchsorted(end, index, side="right")
        copy = index - before[group] + offset[group]
        priority = mix64(inner[group] + copy.astype(np.uint64))
        inside = rank_within_user(group_user[group], priority) < c
        kept_group.append(group[inside])
        kept_priority.append(priority[inside])
    if not kept_group:
        return np.zeros(0, dtype=np.int64)
    group = np.concatenate(kept_group)
    priority = np.concatenate(kept_priority)
    group = group[rank_within_user(group_user[group], priority) < c]
    kept = np.bincount(group, minlength=len(starts))
    return np.sort(np.repeat(order[starts], kept))


class _PreReduceCopiesFn(beam.DoFn):
    def __init__(self, mode, coalesce_rows):
        self._mode = mode
        self._coalesce_rows = coalesce_rows

    def start_bundle(self):
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
        del tables   # the gathered batches go before the kernel runs (a copy is combined)
        if table is None:
            return
        mode = prereduce.MODE if self._mode is None else self._mode
        counter = beam.metrics.Metrics.counter
        counter(prereduce.NOT_PRIVATE, "rows_prereduced_in").inc(table.num_rows)
        table = collapse_copies(table, mode)
        counter(prereduce.NOT_PRIVATE, "rows_prereduced_out").inc(table.num_rows)
        if table.num_rows:
            yield table

    def finish_bundle(self):
        for table in self._flush():
            yield GlobalWindows.windowed_value(table)


class PreReduceCopies(beam.PTransform):
    """Prepared record batches -> tables of about ``COALESCE_ROWS`` rows with
    ``__copies``, a heavy user's repeated records collapsed (:func:`collapse_copies`).
    For ``RandClip`` under the release's keyed secret only (its kernel then reads the
    counts: :func:`kept_copies`); feed the result to ``ShardByUser(coalesce_rows=1)``.
    No randomness is read here."""

    def __init__(self, mode=None, coalesce_rows=None, label=None):
        super().__init__(label)
        if mode is not None and mode not in prereduce.MODES:
            raise ValueError(f"mode must be one of {prereduce.MODES}, got {mode!r}")
        self._mode = mode
        self._coalesce_rows = COALESCE_ROWS if coalesce_rows is None else int(coalesce_rows)

    def expand(self, batches):
        return batches | "CollapseCopies" >> beam.ParDo(_PreReduceCopiesFn(
            self._mode, self._coalesce_rows)).with_output_types(TABLE)


def rand_clip_copies_counts(table, key_columns, max_records_per_user, rng,
                            user_column=USER_COLUMN):
    """``rand_clip.rand_clip_counts`` of a shard whose rows carry ``__copies``
    (:func:`kept_copies`); a shard without the column goes to the row kernel."""
    if COPIES_COLUMN not in table.column_names:
        return rand_clip_counts(table, key_columns, max_records_per_user, rng, user_column)
    if table.num_rows == 0:
        return count_per_key(table.drop_columns([COPIES_COLUMN]), key_columns)
    bound = keyed_random.bind_users(rng, table, user_column=user_column)
    if not isinstance(bound, keyed_random.TableStreams):
        raise ValueError("rows with __copies need the release's keyed streams")
    codes = user_codes_of(table, user_column)
    kept = kept_copies(table, codes, bound, _bound(max_records_per_user), user_column)
    return count_per_key(table.take(pa.array(kept)).drop_columns([COPIES_COLUMN]),
                         key_columns)


class _RandClipCopiesFn(_RandClipFn):
    def process(self, table, max_records_per_user):
        rng = keyed_random.stage_source(self._rng_factory, self._rng, self._stage)
        counts = rand_clip_copies_counts(table, self._key_columns, max_records_per_user, rng,
                                         self._user_column)
        kept = int(np.sum(counts.column("count").to_numpy())) if counts.num_rows else 0
        beam.metrics.Metrics.counter("thresher_not_private", "records_kept").inc(kept)
        beam.metrics.Metrics.counter("thresher_not_private", "rows_bounded").inc(table.num_rows)
        if counts.num_rows:
            yield counts


class RandClipCopies(RandClip):
    """:class:`rand_clip.RandClip` of user shards whose rows carry ``__copies`` (after
    :class:`PreReduceCopies`): the same kept records, read from the counts. Apply it
    with the label ``RandClip`` would have (its keyed draws are that stage's)."""

    def expand(self, user_shards):
        return user_shards | "RandClipRecords" >> keyed_random.par_do(
            _RandClipCopiesFn(self._key_columns, self._user_column,
                              *keyed_random.stage_of(self._rng_factory)),
            self._max_records_per_user)

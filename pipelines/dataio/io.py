"""Reading a release's input as Arrow batches, and writing its output atomically.

Input rows become ``pyarrow.Table`` batches with ``__user`` and ``__user_lo`` (the two
uint64 words of the user's identity: a secret-keyed 128-bit PRF of the user id, computed
here, when the record is read, from the release secret: ``transforms.randomness.user_identity``),
``__key`` (uint64 hash of the key columns) and the key columns. The identity is all that
travels of a user id: users are grouped and their random streams keyed by it
(``transforms.bounding.user_shards``). Rows that cannot be attributed are dropped and counted
(Beam metrics and the operator log, labelled not private), as documented in docs/input.md:

- a null or empty-string user id (the record belongs to no identifiable user);
- a null key value, or NaN in a floating-point key column.

CSV and JSONL key columns are read as text (so ``02139`` stays ``02139``); Parquet keeps
its column types (dictionary-encoded columns are decoded). User ids are identified by
value, not by type (``transforms.randomness.user_identity``, "Type-stable ids"): CSV and JSONL ids
as their text (``user_identity.text_ids``), and a Parquet dataset whose files store the
user column as text in some and numbers in others is refused (:func:`check_input`), as is
a JSONL dataset writing the user ids as JSON numbers in one file and strings in another
(a number's text depends on its spelling: ``1e3`` is not ``"1e3"``); within one file
pyarrow's reader refuses a column of two JSON types (``formats.json_input_error``).
"""
import collections
import json
import math
import os
import shutil
import uuid

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from thresher.pipelines.dataio import formats
# The schema checks live in input_schema (thresher validate imports them without Beam);
# io.check_input, io.read_schema and the helpers below are still reachable from here.
from thresher.pipelines.dataio.input_schema import (  # noqa: F401
    _first_line, _is_local, _is_text, _open, check_input, column_fields, read_schema)

from thresher.pipelines.common import progress
from thresher.pipelines.dataio.publish import _json_default
from thresher.pipelines.errors import InputError, SpecError, ThresherError
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.hashing import hash_columns
from thresher.transforms.randomness.user_identity import (
    check_identity_source, flat_array, identify, identity_key, text_ids)
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN, USER_LOW_COLUMN
from thresher.transforms.plumbing.tables import key_hash_field
from thresher.transforms.randomness.user_identity import identities_of_bytes
from thresher.transforms.values.aggregate_values import prepare_values

NOT_PRIVATE = "thresher_not_private"
BATCH_ROWS = 1 << 18
ROWS_PER_SHARD = 1_000_000
MIN_SHARDS = 4
MAX_SHARDS = 4096
SMALL_INPUT_DIVISOR = 64     # up to ROWS_PER_SHARD / 64 rows (15,625): one shard, no spill


def is_small_input(rows, exact):
    """An input known to have at most ROWS_PER_SHARD / SMALL_INPUT_DIVISOR rows (a few MB
    in memory): one shard, shuffles in memory. Only an exact count qualifies (Parquet
    footers): a text file's count is estimated from its size, and a compressed or
    unlisted file can hold far more rows than its estimate."""
    return bool(exact) and rows * SMALL_INPUT_DIVISOR <= ROWS_PER_SHARD


def num_shards_for(rows, exact=False):
    """Shards grow with the data so that one shard (all records of its users) stays near
    ROWS_PER_SHARD rows and fits any worker's memory. A small input (``is_small_input``)
    is one shard: splitting it would only add shuffle pieces and elements (each a Beam
    bundle step), never useful parallelism."""
    if is_small_input(rows, exact):
        return 1
    return int(min(MAX_SHARDS, max(MIN_SHARDS, math.ceil(rows / ROWS_PER_SHARD))))


# ---- reading ------------------------------------------------------------------------------

def _normalise_keys(table, key_columns, as_text):
    cols = {}
    for name in key_columns:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if as_text and not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
            col = pc.cast(col, pa.string())
        if pa.types.is_large_string(col.type):
            col = col.cast(pa.string())
        if pa.types.is_floating(col.type):
            # -0.0 and 0.0 are one key (IEEE: -0.0 + 0.0 = +0.0; NaN stays NaN, dropped)
            col = pc.add(col, pa.scalar(0.0, col.type))
        cols[name] = col
    return cols


# Keys longer than this (bytes of a text or binary key value) are refused: a release groups
# and shuffles every distinct key, and keys of megabytes exhaust workers' buffers.
MAX_KEY_BYTES = 64 * 1024


def _read_row_group(source, group, columns, keys, user=None, metadata=None):
    """One row group, its text key columns first read as dictionaries so that
    :func:`check_key_sizes` refuses an over-long key before the column is decoded (the
    decoded column is what the release uses, as before), and a text ``user`` column read
    as a dictionary too: the file's dictionary of ids is what :func:`prepare_batch`
    identifies (one MAC per distinct id, no hash of every row's id), never decoded.
    ``metadata``: the file's footer, already parsed (:class:`_Footers`), or None to parse
    it here."""
    schema = pq.ParquetFile(source, metadata=metadata).schema_arrow
    text_keys = [k for k in keys if k in columns and _is_text(schema.field(k).type)]
    dictionaries = list(text_keys)
    if user is not None and user in columns and user not in dictionaries \
            and _is_text(schema.field(user).type):
        dictionaries.append(user)
    if not dictionaries:
        return pq.ParquetFile(source, metadata=metadata).read_row_group(group,
                                                                        columns=columns), []
    table = pq.ParquetFile(source, metadata=metadata,
                           read_dictionary=dictionaries).read_row_group(
        group, columns=columns)
    return table, text_keys


def _decoded(table, text_keys):
    for name in text_keys:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            table = table.set_column(table.column_names.index(name), name,
                                     col.cast(col.type.value_type))
    return table


def check_key_sizes(table, key_columns, where, row_offset=0):
    """InputError naming the column and row of the first key value over MAX_KEY_BYTES."""
    for name in key_columns:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            # measure the dictionary, never the decoded column: a few long keys repeated
            # on many rows decode to gigabytes (issue 30 D15: a 229 KB file peaked at 3 GB)
            if not _is_text(col.type.value_type):
                continue
            col = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
            sizes = pc.fill_null(pc.binary_length(col.dictionary), 0).to_numpy(
                zero_copy_only=False)
            if not len(sizes) or sizes.max() <= MAX_KEY_BYTES:
                continue
            indices = pc.fill_null(col.indices, 0).to_numpy(zero_copy_only=False)
            lengths = pa.array(sizes[indices]) if len(indices) else pa.array([], pa.int64())
        elif not _is_text(col.type):
            continue
        else:
            lengths = pc.fill_null(pc.binary_length(col), 0)
        if table.num_rows and pc.max(lengths).as_py() > MAX_KEY_BYTES:
            row = int(np.flatnonzero(lengths.to_numpy(zero_copy_only=False) > MAX_KEY_BYTES)[0])
            raise InputError(f"input.keys: {where} row {row_offset + row + 1}: column {name!r} "
                             f"holds a key of {pc.max(lengths).as_py():,} bytes; keys may have at "
                             f"most {MAX_KEY_BYTES:,} bytes")


def prepare_batch(table, user_column, key_columns, as_text=False, value_columns=(),
                  identity_key=None, hashed_keys=None):
    """Drop unattributable rows, identify users and hash keys.

    value_columns: [(input column, prepared name)] of ``aggregates``: carried as float64,
    NaN/inf/null (or non-numeric text) as null, counted (transforms.values.aggregate_values).
    hashed_keys: the key columns ``__key`` hashes (None: all of ``key_columns``; a prefix
    of them, e.g. without the value column quantiles reads like a key, whose float text
    form costs most of the hash).
    identity_key: the release's user identity key (``transforms.randomness.user_identity.
    identity_key``); required -- there is no default, and tests pass
    ``transforms.randomness.user_identity.TEST_KEY`` (public, no privacy claim) by name.
    Returns (prepared table: __user, __user_lo, __key, key columns, values; dict of drop
    counts)."""
    if identity_key is None:
        raise ThresherError("prepare_batch: identity_key is required: pass "
                            "transforms.randomness.user_identity.identity_key(source) for the release's "
                            "KeyedSource (tests: transforms.randomness.user_identity.TEST_KEY, public)")
    drops = {}
    user = table.column(user_column)
    words = None    # a text dictionary (Parquet): identities of the dictionary, per row
    if pa.types.is_dictionary(user.type) and not as_text and _is_text(user.type.value_type):
        valid, words = _identify_dictionary(user, identity_key)
    else:
        if pa.types.is_dictionary(user.type):
            user = user.cast(user.type.value_type)
        valid = pc.is_valid(user)
        if _is_text(user.type):
            # fill_null: binary_length of a null is null, and and_(False, null) is null
            valid = pc.and_(valid, pc.fill_null(pc.greater(pc.binary_length(user), 0), False))
        elif pa.types.is_floating(user.type):
            # NaN identifies no user (NaN != NaN): dropped like a null user id, as NaN keys are
            valid = pc.and_(valid, pc.fill_null(pc.invert(pc.is_nan(user)), False))
    drops["rows_dropped_null_or_empty_user"] = table.num_rows - (pc.sum(valid).as_py() or 0) if table.num_rows else 0
    keys = _normalise_keys(table, key_columns, as_text)
    # a text key read as a dictionary (Parquet) is hashed per distinct value
    # (hashing.hash_array), the decoded column is what the release carries
    coded = {k: table.column(k) for k in key_columns
             if _text_dictionary(table.column(k).type)}
    key_valid = None
    for col in keys.values():
        ok = pc.is_valid(col)
        if pa.types.is_floating(col.type):
            ok = pc.and_(ok, pc.fill_null(pc.invert(pc.is_nan(col)), False))
        key_valid = ok if key_valid is None else pc.and_(key_valid, ok)
    both = pc.and_(valid, key_valid)
    n_ok = pc.sum(both).as_py() or 0
    drops["rows_dropped_null_key"] = (pc.sum(valid).as_py() or 0) - n_ok
    if n_ok < table.num_rows:
        keys = {k: pc.filter(v, both) for k, v in keys.items()}
        coded = {k: pc.filter(v, both) for k, v in coded.items()}
        if words is None:
            user = pc.filter(user, both)
        else:
            keep = flat_array(both).to_numpy(zero_copy_only=False)
            words = (words[0][keep], words[1][keep])
    keyed = pa.table(keys)
    hashed = list(key_columns if hashed_keys is None else hashed_keys)
    if as_text:   # CSV/JSONL ids are their text, whatever type the reader inferred per file
        user = text_ids(user)
    word0, word1 = identify(user, identity_key) if words is None else words
    prepared = pa.table({USER_COLUMN: pa.array(word0, type=pa.uint64()),
                         USER_LOW_COLUMN: pa.array(word1, type=pa.uint64()),
                         KEY_HASH_COLUMN: pa.array(hash_columns(
                             pa.table({k: coded.get(k, keys[k]) for k in hashed}),
                             hashed), type=pa.uint64()),
                         **{k: keyed.column(k) for k in key_columns}})
    if hashed_keys is not None:   # __key states what it hashes (tables.key_hash_is_of)
        prepared = prepared.cast(prepared.schema.set(
            prepared.schema.get_field_index(KEY_HASH_COLUMN), key_hash_field(hashed)))
    if value_columns:
        dropped = 0
        for source, name in value_columns:
            col = table.column(source)
            if n_ok < table.num_rows:
                col = pc.filter(col, both)
            try:
                values, n_bad = prepare_values(col, as_text)
            except TypeError as exc:
                raise InputError(f"aggregates: column {source!r} is not numeric ({exc})") from None
            prepared = prepared.append_column(name, values)
            dropped += n_bad
        drops["aggregate_values_dropped_nan_inf_null"] = dropped
    return prepared, drops


def _text_dictionary(arrow_type):
    """A dictionary of strings: its decoded values are the normalised key
    (``_normalise_keys`` only decodes it), so its hash may be taken per dictionary value."""
    return pa.types.is_dictionary(arrow_type) and (
        pa.types.is_string(arrow_type.value_type)
        or pa.types.is_large_string(arrow_type.value_type))


def _identify_dictionary(user, key):
    """(validity, (word 0, word 1)) of a dictionary-encoded text user column, every row:
    the identity (``transforms.randomness.user_identity``) of each dictionary value, taken to the
    rows by their indices. The file's dictionary holds each distinct id once, so no row's
    id is hashed or decoded (a duplicate value would only be MACed twice, to the same
    identity). A null row, a null or empty value is not valid (dropped by the caller)."""
    chunks = user.chunks if isinstance(user, pa.ChunkedArray) else [user]
    valid, word0, word1 = [], [], []
    for chunk in chunks:
        values = chunk.dictionary
        lengths = pc.binary_length(values)
        if values.null_count:
            lengths = pc.fill_null(lengths, 0)
            values = pc.fill_null(values, pa.scalar(b"", pa.binary()).cast(values.type))
        # index len(values): a null row; a null or empty value is not usable
        usable = np.append(lengths.to_numpy(zero_copy_only=False) > 0, False)
        identities = identities_of_bytes(values, key)
        index = chunk.indices
        if index.null_count:
            index = pc.fill_null(index, len(values))
            identities = np.append(identities, np.zeros((1, 2), np.uint64), axis=0)
        index = index.to_numpy(zero_copy_only=False)
        valid.append(usable[index] if not usable[:len(values)].all() or chunk.null_count
                     else np.ones(len(index), dtype=bool))
        word0.append(np.ascontiguousarray(identities[:, 0])[index])
        word1.append(np.ascontiguousarray(identities[:, 1])[index])
    if len(chunks) == 1:
        return pa.array(valid[0]), (word0[0], word1[0])
    empty = np.zeros(0, np.uint64)
    return (pa.array(np.concatenate([np.zeros(0, bool)] + valid)),
            (np.concatenate([empty] + word0), np.concatenate([empty] + word1)))


# A frequency counts distinct users; above this it is not a user count (and not exact in
# float64 or int64 arithmetic further on).
MAX_SAMPLE_FREQUENCY = 1e15


def prepare_sample_batch(table, key_columns, frequency_column, as_text=False):
    """An existing sample's rows -> (__key, key columns, count); drops rows with a null key
    or frequency (counted). A frequency that is not a whole number >= 0 is an error."""
    keys = _normalise_keys(table, key_columns, as_text)
    freq = table.column(frequency_column)
    if as_text or not pa.types.is_integer(freq.type):
        try:
            freq = pc.cast(freq, pa.float64()) if not pa.types.is_floating(freq.type) else freq
        except pa.ArrowInvalid as exc:
            raise InputError(f"input.sample.frequency: column {frequency_column!r} is not "
                             f"numeric: {_first_line(exc)}") from None
    valid = pc.is_valid(freq)
    for col in keys.values():
        valid = pc.and_(valid, pc.is_valid(col))
    n_ok = pc.sum(valid).as_py() or 0
    drops = {"sample_rows_dropped_null": table.num_rows - n_ok}
    freq = pc.filter(freq, valid)
    keys = {k: pc.filter(v, valid) for k, v in keys.items()}
    values = freq.to_numpy(zero_copy_only=False)
    if pa.types.is_floating(freq.type):
        bad = ~np.isfinite(values) | (values != np.floor(values))
        if bad.any():
            raise InputError(f"input.sample.frequency: {values[bad][0]!r} is not a whole number; "
                             f"frequencies must be integers >= 0")
    if len(values) and values.max() > MAX_SAMPLE_FREQUENCY:
        raise InputError(f"input.sample.frequency: {values.max():.6g} is larger than "
                         f"{MAX_SAMPLE_FREQUENCY:g}, the largest frequency (distinct users) "
                         f"thresher accepts")
    if len(values) and values.min() < 0:
        raise InputError(f"input.sample.frequency: {values.min()!r} is negative; frequencies "
                         f"must be integers >= 0")
    keyed = pa.table(keys)
    prepared = pa.table({KEY_HASH_COLUMN: pa.array(hash_columns(keyed, key_columns), type=pa.uint64()),
                         **{k: keyed.column(k) for k in key_columns},
                         "count": pa.array(values.astype(np.int64), type=pa.int64())})
    return prepared, drops


class _PrepareSampleBatches(beam.DoFn):
    def __init__(self, key_columns, frequency_column, as_text):
        self._keys = tuple(key_columns)
        self._frequency = frequency_column
        self._as_text = as_text

    def process(self, table):
        beam.metrics.Metrics.counter(NOT_PRIVATE, "rows_read").inc(table.num_rows)
        progress.count_rows(table.num_rows)
        prepared, drops = prepare_sample_batch(table, self._keys, self._frequency, self._as_text)
        for name, value in drops.items():
            if value:
                beam.metrics.Metrics.counter(NOT_PRIVATE, name).inc(value)
        if prepared.num_rows:
            yield prepared


class _PrepareBatches(beam.DoFn):
    """Raw batches -> prepared batches (:func:`prepare_batch`). ``rng_factory``: the
    release's ``KeyedSource`` (its secret keys the user identities), or in tests
    ``keyed_random.seeded_for_tests`` (the public test key); anything else is refused
    here, when the pipeline is built (``user_identity.check_identity_source``)."""

    def __init__(self, user_column, key_columns, as_text, value_columns=(), rng_factory=None,
                 hashed_keys=None):
        check_identity_source(rng_factory)
        self._user = user_column
        self._keys = tuple(key_columns)
        self._hashed = None if hashed_keys is None else tuple(hashed_keys)
        self._as_text = as_text
        self._values = list(value_columns)
        self._rng_factory = rng_factory

    def process(self, table):
        beam.metrics.Metrics.counter(NOT_PRIVATE, "rows_read").inc(table.num_rows)
        progress.count_rows(table.num_rows)
        # the key comes from the release secret, which a release's PipelineSecret receives
        # as a side input before each call (keyed_random.par_do): never in setup()
        prepared, drops = prepare_batch(table, self._user, self._keys, self._as_text,
                                        self._values,
                                        identity_key=identity_key(self._rng_factory),
                                        hashed_keys=self._hashed)
        for name, value in drops.items():
            if value:
                beam.metrics.Metrics.counter(NOT_PRIVATE, name).inc(value)
        if prepared.num_rows:
            yield prepared


def _check_utf8(table, path):
    """pyarrow's JSON reader passes invalid UTF-8 through into string columns; refuse it
    (naming the column and row) rather than publish keys that are not text."""
    for name in table.column_names:
        column = table.column(name)
        if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
            continue
        offset = 0
        for chunk in column.chunks:
            try:
                chunk.validate(full=True)
            except pa.ArrowInvalid:
                bad = next(i for i, v in enumerate(chunk.cast(pa.binary()).to_pylist())
                           if v is not None and not _is_utf8(v))
                raise InputError(f"input.path: {path!r} line {offset + bad + 1}: column {name!r} "
                                 f"is not valid UTF-8 text") from None
            offset += len(chunk)


def _is_utf8(value):
    try:
        value.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


class _ParquetRowGroups(beam.DoFn):
    """One Parquet file -> (path, row group index) for each of its row groups, so a large
    file is read in parallel, one row group per element after a Reshuffle."""

    def process(self, path):
        try:
            with _open(path) as handle:
                groups = pq.ParquetFile(handle).metadata.num_row_groups
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"input.path: cannot read {path!r} as parquet: "
                             f"{_first_line(exc)}") from None
        for group in range(groups):
            yield path, group


# The serialized bytes of the footers a reading worker keeps (:class:`_Footers`): a parsed
# footer takes about 8x its serialized size in memory (measured: 223 KB -> 1.7 MB, 1.1 MB ->
# 8.2 MB), and its size grows with row groups x columns (~1.8 KB parsed a row group with 2
# columns, ~41 KB with 50), so the bound is on bytes: ~128 MB of parsed footers at most.
MAX_KEPT_FOOTER_BYTES = 16 << 20


class _Footers:
    """Parsed Parquet footers of local files, kept by a reading DoFn across its elements
    (Beam calls one DoFn instance from one thread at a time: no lock).

    A row group is one element, and opening the file parses its whole footer, which grows
    with the row groups: a file of G row groups read one group at a time parsed G footers
    of G groups each (1e8 rows in 1,000 row groups: ~2.7 s of CPU, growing as G^2). A
    kept footer is re-verified before each use: it is used only while the file's size,
    modification time (ns) and inode are the ones it was parsed at (a file replaced under
    the same path is parsed again).

    Bounded: a footer of one row group is not kept (its file is read in one element), and
    the kept footers' serialized sizes add up to at most ``max_bytes``
    (``MAX_KEPT_FOOTER_BYTES``), the least recently used dropped first (the newest is kept
    whatever its size: it is the one being read). Within the bound a footer is parsed once
    per file and worker. Past it (inputs whose footers add up to more, e.g. hundreds of
    files of thousands of row groups each, read in the Reshuffle's random order) a row
    group of a dropped file parses its footer again, a cost in proportion to that file's
    row groups: memory stays bounded, and the time grows again as in the unbounded-G case
    for those files only."""

    def __init__(self, max_bytes=None):
        self._footers = collections.OrderedDict()   # path -> (signature, metadata)
        self._bytes = 0
        self._max_bytes = MAX_KEPT_FOOTER_BYTES if max_bytes is None else int(max_bytes)

    def get(self, path):
        stat = os.stat(path)
        signature = (stat.st_size, stat.st_mtime_ns, stat.st_ino)
        kept = self._footers.get(path)
        if kept is not None and kept[0] == signature:
            self._footers.move_to_end(path)
            return kept[1]
        if kept is not None:
            self._drop(path)
        metadata = pq.read_metadata(path)
        if metadata.num_row_groups > 1:
            self._footers[path] = (signature, metadata)
            self._bytes += metadata.serialized_size
            while self._bytes > self._max_bytes and len(self._footers) > 1:
                self._drop(next(iter(self._footers)))
        return metadata

    def _drop(self, path):
        self._bytes -= self._footers.pop(path)[1].serialized_size

    def kept(self):
        """(paths of the kept footers, least recently used first; their serialized bytes):
        for tests."""
        return list(self._footers), self._bytes


class _ReadParquetRowGroup(beam.DoFn):
    """Read one row group's columns as Arrow batches of at most BATCH_ROWS rows. A file
    whose data pages are corrupt is an input error naming the file and row group, never
    a partial release."""

    def __init__(self, columns, keys=(), user=None):
        self._columns = list(columns)
        self._keys = tuple(keys)
        self._user = user
        self._footers = None     # made per worker (setup, or the first element)

    def setup(self):
        self._footers = _Footers()

    def process(self, path_and_group):
        path, group = path_and_group
        if self._footers is None:
            self._footers = _Footers()
        try:
            if _is_local(path):  # pyarrow's own file reader, no Python file object
                table, text_keys = _read_row_group(path, group, self._columns, self._keys,
                                                   self._user, self._footers.get(path))
            else:
                with _open(path) as handle:
                    table, text_keys = _read_row_group(handle, group, self._columns,
                                                       self._keys, self._user)
        except (pa.ArrowInvalid, OSError) as exc:
            raise InputError(f"input.path: cannot read {path!r} as parquet (row group "
                             f"{group}): {_first_line(exc)}") from None
        check_key_sizes(table, self._keys, f"{path!r} (row group {group})")
        if self._user is not None:
            check_float_user_ids(table.column(self._user), f"{path!r} (row group {group})",
                                 self._user)
        # text keys stay dictionaries: prepare_batch hashes each distinct key once and
        # decodes them (_normalise_keys)
        for batch in table.to_batches(max_chunksize=BATCH_ROWS):
            yield pa.Table.from_batches([batch])


def check_float_user_ids(column, where, name, hint=None):
    """Refuse a floating-point user column holding a whole number at or above 2**53
    (float64; 2**24 for float32, 2**11 for float16) in magnitude: floating point no longer
    holds every integer there, so such an id has usually been rounded already (a 64-bit
    id in a float column, e.g. after pandas made an integer column with a missing value
    float), and the same user stored exactly as an integer elsewhere would become a
    second identity with a bound of its own. ``where``: the file (and row group) or
    "the input rows". Raises InputError naming the field, the row and what to do."""
    t = column.type
    if not pa.types.is_floating(t.value_type if pa.types.is_dictionary(t) else t):
        return      # (before flat_array: a dictionary of text ids is never decoded here)
    column = flat_array(column)
    dtype = column.type.to_pandas_dtype()
    exact = 2.0 ** (np.finfo(dtype).nmant + 1)
    values = column.to_numpy(zero_copy_only=False).astype(np.float64)
    with np.errstate(invalid="ignore"):
        far = np.flatnonzero(np.isfinite(values) & (np.abs(values) >= exact))
    if len(far):
        raise InputError(
            f"input.user: {where} row {int(far[0]) + 1}: the user id {float(values[far[0]])!r} "
            f"in column {name!r} is a {column.type} at or above 2**{np.finfo(dtype).nmant + 1}, "
            f"where floating point cannot hold every integer (the id may have lost digits "
            f"and name another user); " + (hint or "store user ids as integers or text"))


# pyarrow's JSON reader reads an integer beyond int64 (>= 2**63, e.g. a 64-bit unsigned
# id) as a double: the id has then lost its last digits, and is refused (issue 42).
JSON_BIG_ID_HINT = ("a JSON integer at or above 2**63 is read as floating point: write the "
                    "user ids as JSON strings (\"9223372036854775808\"), or as integers "
                    "below 2**63")


class _ReadTextFile(beam.DoFn):
    """Read one CSV or JSONL file into Arrow batches of at most BATCH_ROWS rows."""

    def __init__(self, fmt, columns, keys=(), delimiter=",", user=None, fields=None):
        self._fmt = fmt
        self._columns = tuple(columns)
        self._keys = tuple(keys)
        self._delimiter = delimiter
        self._user = user
        self._fields = dict(fields or {})

    def process(self, path):
        import pyarrow.csv as pcsv  # heavy: pyarrow.csv
        import pyarrow.json as pjson  # heavy: pyarrow.json
        try:
            with _open(path) as handle:
                if self._fmt == "csv":
                    convert = pcsv.ConvertOptions(
                        include_columns=list(self._columns),
                        column_types={c: pa.string() for c in self._columns})
                    reader = pcsv.open_csv(handle, convert_options=convert,
                                           read_options=pcsv.ReadOptions(block_size=8 << 20),
                                           parse_options=pcsv.ParseOptions(delimiter=self._delimiter))
                    offset = 0
                    for batch in reader:
                        table = pa.Table.from_batches([batch])
                        check_key_sizes(table, self._keys, repr(path), offset)
                        offset += table.num_rows
                        yield table
                else:
                    table = pjson.read_json(handle).select(list(self._columns))
                    _check_utf8(table, path)
                    if self._user is not None:
                        check_float_user_ids(table.column(self._user), repr(path), self._user,
                                             hint=JSON_BIG_ID_HINT)
                    check_key_sizes(table, self._keys, repr(path))
                    for batch in table.to_batches(max_chunksize=BATCH_ROWS):
                        yield pa.Table.from_batches([batch])
        except (pa.ArrowInvalid, UnicodeDecodeError, EOFError, OSError) as exc:
            if self._fmt == "jsonl":
                raise formats.json_input_error(path, exc, _open, self._fields) from None
            raise InputError(f"input.path: cannot read {path!r} as {self._fmt}: "
                             f"{_first_line(exc)}") from None


class ReadRecords(beam.PTransform):
    """Files -> PCollection[pyarrow.Table] of prepared record batches (see prepare_batch).
    ``rng_factory``: the release's ``KeyedSource``, which keys the user identities (given
    explicitly by the release; none is refused, ``keyed_random.resolve``)."""

    def __init__(self, input_spec, files, label=None, rng_factory=None):
        super().__init__(label)
        self._rng_factory = rng_factory
        self._spec = input_spec
        self._files = list(files)
        # aggregates: the value columns travel as __v<k> (only when asked for)
        self._values = [(c, f"__v{k}") for k, c in enumerate(input_spec.values)]

    def expand(self, pbegin):
        columns = self._spec.columns
        single = self._single_row_group()
        if single is not None:   # nothing to spread: no Reshuffle, one stage fewer
            raw = (pbegin
                   | "InputFiles" >> beam.Create([single])                     # (path, 0)
                   | "ReadParquet" >> beam.ParDo(_ReadParquetRowGroup(columns, self._spec.keys, user=self._spec.user)).with_output_types(pa.Table))
            return self._prepare(raw)
        files = pbegin | "InputFiles" >> beam.Create(self._files)
        if self._spec.format == "parquet":
            raw = (files
                   | "ParquetRowGroups" >> beam.ParDo(_ParquetRowGroups())       # (path, group)
                   | "SpreadRowGroups" >> beam.Reshuffle()
                   | "ReadParquet" >> beam.ParDo(_ReadParquetRowGroup(columns, self._spec.keys, user=self._spec.user)).with_output_types(pa.Table))
        else:
            raw = files | "ReadText" >> beam.ParDo(
                _ReadTextFile(self._spec.format, columns, self._spec.keys,
                              getattr(self._spec, "delimiter", ","),
                              user=self._spec.user, fields=column_fields(self._spec))
            ).with_output_types(pa.Table)
        return self._prepare(raw)

    def _single_row_group(self):
        """(path, 0) when the input is one local Parquet file of one row group (a small
        input: its one element has nowhere to be spread to), else None."""
        if self._spec.format != "parquet" or len(self._files) != 1 or not _is_local(self._files[0]):
            return None
        try:
            groups = pq.ParquetFile(self._files[0]).metadata.num_row_groups
        except (pa.ArrowInvalid, OSError):
            return None          # the read reports it, naming the file
        return (self._files[0], 0) if groups == 1 else None

    def _prepare(self, raw):
        as_text = self._spec.format != "parquet"
        if self._spec.sample is not None:
            return raw | "PrepareSample" >> beam.ParDo(_PrepareSampleBatches(
                self._spec.keys, self._spec.sample["frequency"], as_text)).with_output_types(pa.Table)
        return raw | "PrepareBatches" >> keyed_random.par_do(
            _PrepareBatches(self._spec.user, self._spec.keys, as_text, self._values,
                            keyed_random.resolve(self._rng_factory),
                            hashed_keys=self._spec.hashed_keys)
        ).with_output_types(pa.Table)


# ---- output ---------------------------------------------------------------------------------

REPORT_FILE = "release_report.json"
RELEASED_PREFIX = "released"
RELEASED_FILE = RELEASED_PREFIX + ".parquet"


def output_holds_release(path):
    return os.path.exists(os.path.join(path, REPORT_FILE)) or (
        os.path.isdir(path) and any(f.startswith(RELEASED_PREFIX) for f in os.listdir(path)))


def check_output(path, overwrite):
    """Refuse to replace an earlier release unless asked; refuse a path that is a file."""
    if not _is_local(path):
        return
    if os.path.exists(path) and not os.path.isdir(path):
        raise SpecError("output.path", f"{path!r} is a file; it must be a folder (or not exist)")
    if os.path.isdir(path) and output_holds_release(path) and not overwrite:
        raise SpecError("output.path", f"{path!r} already holds a release; pass --overwrite to "
                        f"replace it, or choose another output.path")
    if os.path.isdir(path) and os.listdir(path) and not output_holds_release(path):
        raise SpecError("output.path", f"{path!r} is a non-empty folder that holds no release; "
                        f"thresher will not write into it")
    parent = os.path.dirname(os.path.abspath(path))
    if os.path.exists(parent) and not os.path.isdir(parent):
        raise SpecError("output.path", f"{parent!r} is a file, not a folder")


def staging_path(path):
    """A sibling folder the release is written to before it is moved into place (its
    parent folders are created)."""
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    return f"{path.rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}"


# Files a release writes into its output folder; --overwrite replaces these and nothing else.
OWN_FILES = ("released.parquet", "release_report.json", "release_report.html")


def is_own_file(name):
    return name in OWN_FILES or (name.startswith(RELEASED_PREFIX) and name.endswith(".parquet"))


def promote(staging, final):
    """Move a finished release into place, replacing an earlier one.

    (``pipelines.running.release`` resolves a symlinked output folder to its target first.) A
    folder holding only thresher's files is swapped with the staging folder by renames;
    one that also holds the user's own files (notes, plots) keeps them: thresher's old
    files are removed (the report first, so the folder never looks complete with mixed
    files) and the new ones moved in, the report last."""
    if os.path.isdir(final) and any(not is_own_file(n) for n in os.listdir(final)):
        old_report = os.path.join(final, REPORT_FILE)
        if os.path.exists(old_report):
            os.remove(old_report)
        for name in os.listdir(final):
            if is_own_file(name):
                os.remove(os.path.join(final, name))
        for name in sorted(os.listdir(staging)):
            if name != REPORT_FILE:
                os.replace(os.path.join(staging, name), os.path.join(final, name))
        os.replace(os.path.join(staging, REPORT_FILE), old_report)
        shutil.rmtree(staging, ignore_errors=True)
    elif os.path.isdir(final):
        trash = f"{final.rstrip('/')}.old-{uuid.uuid4().hex[:12]}"
        os.replace(final, trash)
        os.replace(staging, final)
        shutil.rmtree(trash, ignore_errors=True)
    else:
        os.replace(staging, final)


def remove_sink_scratch(staging):
    """Remove Beam's ``beam-temp-*`` scratch folders from a finished staging folder.

    A file sink writes into such a folder and deletes it when it finalises, but a
    replayed sink initialisation (``--direct_runner_bundle_repeat``, a runner's retry)
    leaves an extra, uncommitted one behind. Nothing in them is part of the release."""
    for name in os.listdir(staging):
        if name.startswith("beam-temp-") and os.path.isdir(os.path.join(staging, name)):
            shutil.rmtree(os.path.join(staging, name))


def discard(staging):
    shutil.rmtree(staging, ignore_errors=True)


def released_files(folder):
    return sorted(os.path.join(folder, f) for f in os.listdir(folder)
                  if f.startswith(RELEASED_PREFIX) and f.endswith(".parquet"))


def count_released(files):
    return int(sum(pq.ParquetFile(f).metadata.num_rows for f in files))


def write_json(path, document):
    with open(path, "w", encoding="utf-8") as handle:
        json.dump(document, handle, indent=2, sort_keys=False, default=_json_default)
        handle.write("\n")

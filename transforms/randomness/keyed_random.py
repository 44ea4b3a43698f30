"""Randomness that survives recomputation: a keyed PRF over a per-release secret.

A runner may run a bundle twice (retries), recompute a stage, or materialise a side
input once per consumer (Beam's DaskRunner recomputes side inputs per partition). With
fresh OS randomness each recomputation would draw new noise, and a private choice
recomputed k times would spend its epsilon k times. thresher therefore derives every
random word of a release from

* a **release secret**: 32 bytes drawn from the OS CSPRNG (``os.urandom``) *inside the
  pipeline*, once per run, as a materialised singleton side input
  (:class:`PipelineSecret`: Impulse -> draw -> Reshuffle, the way the chosen bound is
  committed), never carried in the pipeline graph, so it is in no staged job, template
  or jar; never logged, never written to the report, the spec or any output
  (``docs/running.md``); and
* a **stable identity** of what is drawn: the stage (a label path the release hands
  the stage that draws, :class:`KeyedDraws`: passed as an argument, never looked up in
  the pipeline being built, so it is the same wherever a user's pipeline applies the
  release) and the
  identity of the row: for per-user draws the user's 128-bit identity (the two words
  ``__user_hi``/``__user`` and ``__user_lo``, a secret-keyed PRF of the user id computed
  when the record is read, ``transforms.randomness.user_identity``; never a grouping code, a public
  hash or a rank, so a user's streams depend on nothing but its id and the secret); for
  per-key draws the canonical text of the key (:func:`row_identity_array`); for per
  (user, key) draws both.

**Construction** ``aes256-cbcmac-v1`` (:data:`CONSTRUCTION`, named in every release
report; docs/privacy_testing.md, "Keyed randomness", has the argument):

1. stage key ``K_s = SHAKE256("thresher-stage" || len || secret || stage)`` (64 bytes;
   :meth:`KeyedSource.stage_key`, unchanged from the SHAKE256 construction before it);
2. one AES-256 key per stream group and message shape,
   ``K_{s,l} = SHAKE256("thresher/aes256-cbcmac-v1\\0" || K_s || l)[:32]`` for a label
   ``l`` such as ``user:id:2`` (the group, where its identity comes from, the number of
   blocks of its messages) -- so messages of different shapes never share a key;
3. a text identity (a key's canonical text, a caller's own user column, the identity
   bytes of :meth:`KeyedSource.stream`) is its prefix-free CBC-MAC
   ``k = CBC-MAC_{K_{s,group:text}}("thr:txt\\0" || len || text || 0-padding)``, 128 bits
   (``transforms.randomness.block_prf.mac_bytes``);
4. stream word block ``b`` of a row is the fixed-length CBC-MAC of its identity blocks
   and the counter block ``<b>`` (``b`` little-endian, then 8 zero bytes):
   ``E(E(u) xor <b>)`` for a user ``u`` or a text identity, ``E(E(E(u) xor k) xor <b>)``
   for a (user, key) pair, under the group's ``K_{s,l}``; the block's two words
   (little-endian) are words ``2b`` and ``2b + 1`` of the row's stream.

All of it is vectorised (``transforms.randomness.block_prf``): a batch's streams cost one AES call
per block position over all its rows -- the state ``E(u)`` (or ``E(E(u) xor k)``) once
per row, then one call per further block the samplers ask for -- and the key texts are
de-duplicated and MACed together. Nothing is called per row, user, pair or key. A row's
stream depends on neither the bundle it arrives in nor the order of rows, and a
recomputation draws the very same words. The exact samplers of ``transforms.randomness.samplers``
consume these words unchanged (:class:`RowStreams` gives every row its own stream, so
vectorised sampling takes one word per row per round, and the slow paths continue each
row's own stream), so the noise laws stay exact; the privacy guarantee becomes
computational (an adversary who cannot distinguish AES-256 from a random permutation,
nor SHAKE256 keyed by a secret prefix from a random function, sees exactly distributed
noise).

How a stage that draws gets the secret and its label (the pattern every draw site
follows, e.g. a per-user identity computed by the record reader):

1. its PTransform takes ``rng_factory``, a :class:`KeyedDraws` (``source.child(name)``:
   the release's source and the stage's label path), as a constructor argument; a
   composite holding drawing stages hands each of them ``self._rng_factory.child(...)``;
2. at expansion it calls :func:`stage_of` for (source, stage label) and hands both to
   its DoFn (the source stored as the DoFn's ``_rng_factory``; in a release that is the
   release's :class:`PipelineSecret`, no secret in it);
3. it applies the DoFn with ``keyed_random.par_do(dofn, *side_inputs)`` instead of
   ``beam.ParDo``: for a :class:`PipelineSecret` this adds the secret's singleton side
   input and sets it on the DoFn's source before each ``process`` call;
4. ``process`` draws through :func:`stage_stream`, :func:`table_streams` or
   :func:`stage_source` (``setup`` calls :func:`worker_rng`).

Tests fix the randomness through the same argument: a child of a ``KeyedSource`` with a
known secret, or the test-only :func:`seeded_for_tests` (a seeded numpy generator, asked
for by name). Nothing else is accepted (:func:`stage_of`): a plain generator factory
such as ``numpy.random.default_rng`` would draw fresh, unkeyed randomness per worker and
per retry.

**Fail closed.** A transform given no ``rng_factory`` raises :class:`NoSecretError` (a
``ThresherError`` and ``TypeError`` naming ``rng_factory`` and what to pass) when it is
applied, and one given a source without its own label raises
:class:`UnlabelledSourceError`: there is no ambient source and no fallback to per-worker
OS randomness, and user identities need a ``KeyedSource`` (or, in tests,
:func:`seeded_for_tests` asked for by name:
``transforms.randomness.user_identity.identity_key``). Someone chaining the building
blocks in their own pipeline draws the secret once with ``PipelineSecret.draw(pipeline)``
and gives each transform its own child of it (docs/running.md, "Secrets for the building
blocks").
"""
import hashlib
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.errors import ThresherError
from thresher.transforms.randomness import block_prf, samplers
from thresher.transforms.randomness.hashing import canonical_text
from thresher.transforms.randomness.stream_construction import CONSTRUCTION

SECRET_BYTES = 32
_STAGE_PREFIX = b"thresher-stage"
_SUBKEY_PREFIX = b"thresher/" + CONSTRUCTION.encode("ascii") + b"\x00"
_TAG_TEXT = b"thr:txt\x00"          # the first 8 bytes of a text identity's message
_WORDS_PER_BLOCK = 2                # one AES block: two 64-bit words
_TEXT_GROUP = "rows"                # the group of stream(stage, bytes) and table_streams
_MAX_BLOCKS = 1 << 32               # blocks of one row's stream a batch may ask for
_DENSE_CODES = 1 << 16              # _coded_text_identities: codes below this (or the rows)
                                    # are numbered by a scatter


def new_secret():
    """A fresh release secret from the OS CSPRNG (once per run, inside the pipeline:
    :class:`PipelineSecret`)."""
    return os.urandom(SECRET_BYTES)


class StageKeys:
    """The AES-256 keys of one stage, one per label (module docstring, step 2), and their
    encryptors, made on first use."""

    def __init__(self, stage_key):
        self._stage_key = bytes(stage_key)
        self._keys = {}
        self._encryptors = {}

    def key(self, label):
        key = self._keys.get(label)
        if key is None:
            key = self._keys[label] = hashlib.shake_256(
                _SUBKEY_PREFIX + self._stage_key + label.encode("utf-8")).digest(
                    block_prf.KEY_BYTES)
        return key

    def encryptor(self, label):
        enc = self._encryptors.get(label)
        if enc is None:
            enc = self._encryptors[label] = block_prf.encryptor(self.key(label))
        return enc

    def text_identities(self, group, texts):
        """(n, 2) uint64: the 128-bit identity of each text (a null-free binary Array)
        under the group's text key; equal texts are MACed once."""
        if len(texts) == 0:
            return np.zeros((0, 2), dtype=np.uint64)
        encoded = pc.dictionary_encode(texts)
        distinct = block_prf.mac_bytes(encoded.dictionary, self.key(f"{group}:text"),
                                       _TAG_TEXT)
        return np.take(distinct, encoded.indices.to_numpy(zero_copy_only=False), axis=0)

    def streams(self, group, users=None, texts=None):
        """:class:`RowStreams`, one stream per row, of identity ``users`` ((n, 2) uint64
        identity words), ``texts`` ((n, 2) uint64 text identities), or both (a pair)."""
        if users is not None and texts is not None:
            enc = self.encryptor(f"{group}:id+text:3")
            return RowStreams(enc, block_prf.cbc_chain(enc, users, texts))
        shape, ident = ("id", users) if users is not None else ("text", texts)
        enc = self.encryptor(f"{group}:{shape}:2")
        return RowStreams(enc, block_prf.encrypt(enc, ident))


def _as_words(identities):
    """Identity words as an (n, 2) uint64 array, from such an array or a
    ``fixed_size_binary(16)`` Arrow array (each 16 bytes: two little-endian words);
    None for anything else (byte strings, taken as texts)."""
    if isinstance(identities, np.ndarray) and identities.ndim == 2 \
            and identities.shape[1] == 2 and identities.dtype.kind == "u":
        return identities.astype(np.uint64, copy=False)
    if isinstance(identities, pa.ChunkedArray):
        identities = identities.combine_chunks()
    if isinstance(identities, pa.Array) and pa.types.is_fixed_size_binary(identities.type) \
            and identities.type.byte_width == block_prf.BLOCK:
        if identities.null_count:
            raise ValueError("an identity array must not hold nulls")
        data = np.frombuffer(identities.buffers()[1], dtype=block_prf.WORD,
                             count=2 * (identities.offset + len(identities)))
        return data.reshape(-1, 2)[identities.offset:].astype(np.uint64)
    return None


class KeyedSource:
    """The release secret, as a picklable argument of the transforms that draw.

    ``stream(stage, identity)`` is one sequential stream, ``rows(stage, identities)`` one
    stream per row. The secret never appears in ``repr`` or ``str``."""

    def __init__(self, secret):
        if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
            raise ValueError("a release secret must be at least 16 bytes")
        self._secret = bytes(secret)

    def __repr__(self):
        return "KeyedSource(<release secret, not shown>)"

    __str__ = __repr__

    def stage_key(self, stage):
        """``K_s``, 64 bytes (module docstring, step 1)."""
        return hashlib.shake_256(
            _STAGE_PREFIX + len(self._secret).to_bytes(2, "little") + self._secret
            + stage.encode("utf-8")).digest(64)

    def stream(self, stage, identity=b""):
        """One sequential stream (a ``SecureRandom``-like generator) for (stage, identity
        bytes): the stream ``rows(stage, [identity])`` gives its row."""
        return KeyedStream(StageKeys(self.stage_key(stage)), identity)

    def rows(self, stage, identities):
        """One stream per identity (:class:`RowStreams`). ``identities``: byte strings
        (a list or a binary Arrow array: text identities, the streams of
        :meth:`stream`), or user identity words -- an (n, 2) uint64 array or a
        ``fixed_size_binary(16)`` array -- whose streams are those of :func:`bind_users`'
        group ``user`` in the same stage (the fast entry point: no text at all)."""
        keys = StageKeys(self.stage_key(stage))
        words = _as_words(identities)
        if words is not None:
            return keys.streams("user", users=words)
        if not isinstance(identities, (pa.Array, pa.ChunkedArray)):
            identities = pa.array([bytes(i) for i in identities], pa.binary())
        return keys.streams(_TEXT_GROUP, texts=keys.text_identities(_TEXT_GROUP, identities))

    def child(self, name):
        """The draws of stage ``name`` under this secret (:class:`KeyedDraws`)."""
        return KeyedDraws(self).child(name)

    def __call__(self):  # pragma: no cover - every stage asks for its stream by name
        raise TypeError("a KeyedSource is not a generator factory: use stream() or rows()")


class KeyedStream(samplers.SecureRandom):
    """The uniform 64-bit words of one identity's stream, in order (module docstring,
    steps 3-4: the identity bytes as a text identity of group ``rows``)."""

    def __init__(self, stage_keys, identity):
        texts = stage_keys.text_identities(_TEXT_GROUP, pa.array([bytes(identity)], pa.binary()))
        self._enc = stage_keys.encryptor(f"{_TEXT_GROUP}:text:2")
        self._state = block_prf.encrypt(self._enc, texts)
        self._words = np.zeros(0, dtype=np.uint64)
        self._block = 0

    def bits(self, size):
        n = int(np.prod(size)) if size is not None else 1
        if len(self._words) < n:
            count = -(-(n - len(self._words)) // _WORDS_PER_BLOCK)
            counters = np.arange(self._block, self._block + count, dtype=np.uint64)
            blocks = block_prf.encrypt(self._enc, self._state ^ block_prf.counter_blocks(counters))
            self._block += count
            self._words = np.concatenate((self._words, blocks.reshape(-1)))
        words, self._words = self._words[:n], self._words[n:]
        return words.reshape(size) if size is not None else words[0]


class RowStreams:
    """Independent streams, one per row: word ``2b + j`` of row i is word j of
    ``E(state_i xor <b>)``, where ``state_i`` is the CBC-MAC state after the row's
    identity blocks (module docstring, step 4). Block 0 (the first two words, what most
    draws need) is computed for every row at once; later blocks when a sampler's slow
    path asks for them, one AES call for all the blocks a call needs.

    The samplers draw through :meth:`element_words` one word per element of a view; a
    view maps its elements to rows (``take`` a subset, ``repeat`` a row for several
    draws, ``element`` one row for a scalar slow path). Each row's words are consumed in
    the order its own draws ask for them, so a row's values depend only on its identity
    and its own parameters, never on the other rows of the batch."""

    def __init__(self, encryptor, states):
        self._enc = encryptor
        self._states = np.asarray(states, dtype=np.uint64).reshape(-1, 2)
        n = len(self._states)
        self._first = block_prf.encrypt(encryptor, self._states)   # <0> is the zero block
        self._cursor = np.zeros(n, dtype=np.int64)
    @property
    def view(self):
        """A view of every row (made on demand: a view stored here would make a reference
        cycle, and each batch's streams would wait for a full garbage collection: peak
        memory grew with the input, issue 34)."""
        return _RowView(self, np.arange(len(self._states)), True)

    def __len__(self):
        return len(self._states)

    def _gather(self, rows, positions):
        out = np.empty(len(rows), dtype=np.uint64)
        first = positions < _WORDS_PER_BLOCK
        out[first] = self._first[rows[first], positions[first]]
        later = np.flatnonzero(~first)
        if len(later):
            blocks, offsets = np.divmod(positions[later], _WORDS_PER_BLOCK)
            if int(blocks.max()) >= _MAX_BLOCKS:
                raise ValueError("a row stream was asked for more than 2**33 words")
            wanted = rows[later] * _MAX_BLOCKS + blocks
            unique, inverse = np.unique(wanted, return_inverse=True)
            at, block = np.divmod(unique, _MAX_BLOCKS)
            words = block_prf.encrypt(self._enc, self._states[at] ^ block_prf.counter_blocks(block))
            out[later] = words[inverse.ravel(), offsets]
        return out


class _RowView:
    def __init__(self, root, owner, unique, runs=None):
        self._root = root
        self._owner = np.asarray(owner, dtype=np.int64)
        self._unique = unique
        self._runs = runs      # (distinct rows, run lengths) when owner is contiguous runs

    def __len__(self):
        return len(self._owner)

    def take(self, index):
        """The elements selected by a boolean mask or an index array."""
        index = np.asarray(index)
        return _RowView(self._root, self._owner[index], self._unique)

    def repeat(self, counts):
        """Element i repeated counts[i] times (several draws from one row's stream)."""
        counts = np.asarray(counts, dtype=np.int64)
        unique = self._unique and (len(counts) == 0 or int(counts.max()) <= 1)
        runs = (self._owner, counts) if self._unique else None
        return _RowView(self._root, np.repeat(self._owner, counts), unique, runs)

    def element(self, i):
        return _RowView(self._root, self._owner[[int(i)]], True)

    def element_words(self, n):
        owner = self._owner
        unique = self._unique
        if n != len(owner):
            if len(owner) != 1:
                raise ValueError(f"{n} words asked of {len(owner)} row streams")
            owner = np.repeat(owner, n)
            unique = n <= 1
        root = self._root
        if unique:
            positions = root._cursor[owner]
            root._cursor[owner] += 1
        elif self._runs is not None and n == len(owner):
            rows, counts = self._runs
            starts = np.cumsum(counts) - counts
            positions = np.arange(n) - np.repeat(starts - root._cursor[rows], counts)
            root._cursor[rows] += counts
        else:
            order = np.argsort(owner, kind="stable")
            ranked = owner[order]
            step = np.arange(len(ranked))
            starts = np.r_[True, ranked[1:] != ranked[:-1]] if len(ranked) else np.zeros(0, bool)
            rank_sorted = step - np.maximum.accumulate(np.where(starts, step, 0))
            rank = np.empty(len(ranked), dtype=np.int64)
            rank[order] = rank_sorted
            positions = root._cursor[owner] + rank
            np.add.at(root._cursor, owner, 1)
        return root._gather(owner, positions)

    def bits(self, size):
        n = int(np.prod(size)) if size is not None else 1
        words = self.element_words(n)
        return words.reshape(size) if size is not None else words[0]

    def random(self, size=None):
        """Uniform floats on [0, 1) with 53 bits (estimates only, as SecureRandom.random)."""
        words = self.bits(size if size is not None else 1)
        out = (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        return out if size is not None else float(out[0])

    def __getstate__(self):
        raise TypeError("row streams are made on the worker, per batch, never pickled")


# --------------------------------------------------------------------------------------
# Identities and the DoFn helpers.

def _field_text(column):
    """Each value as bytes: strings/binaries as they are, integers and booleans in
    decimal, everything else in ``canonical_text`` form; nulls stay null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else (
            column.chunk(0) if column.num_chunks else pa.array([], column.type))
    t = column.type
    if pa.types.is_dictionary(t):
        column = column.cast(t.value_type)
        t = column.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        column = pc.cast(column, pa.string())
    elif not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
              or pa.types.is_large_binary(t)):
        column = canonical_text(column)
    return column.cast(pa.large_binary())


def row_identity_array(table, columns):
    """The canonical identity (a ``large_binary`` Arrow array) of each row's values in
    ``columns``: per value ``<length>:<bytes>`` (``N`` for null), joined by ``|``.
    Length prefixes make the encoding injective for a fixed column list. Arrow kernels
    only (no Python per row)."""
    fields = []
    for name in columns:
        text = _field_text(table.column(name))
        length = pc.cast(pc.cast(pc.binary_length(text), pa.string()), pa.large_binary())
        field = pc.binary_join_element_wise(length, text, pa.scalar(b":", pa.large_binary()))
        fields.append(pc.fill_null(field, pa.scalar(b"N", pa.large_binary())))
    if not fields:   # rows without identity would all share one stream
        raise ValueError("row_identities needs at least one identity column")
    return fields[0] if len(fields) == 1 else pc.binary_join_element_wise(
        *fields, pa.scalar(b"|", pa.large_binary()))


def row_identities(table, columns):
    """:func:`row_identity_array` as a list of bytes (for tests and small tables; the
    draw sites use the array)."""
    return row_identity_array(table, columns).to_pylist()


def _codes(column):
    """(int64 codes, number of codes) of a column: equal values get equal codes (nulls
    one code of their own). Codes only de-duplicate work: two codes for one value would
    still give that value one identity (its text)."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks else pa.array([], column.type)
    if pa.types.is_dictionary(column.type):
        size = len(column.dictionary)
        codes = column.indices
        if codes.null_count:
            codes = pc.fill_null(codes, size)
        return codes.to_numpy(zero_copy_only=False).astype(np.int64), size + 1
    encoded = pc.dictionary_encode(column, null_encoding="encode")
    return (encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            max(len(encoded.dictionary), 1))


def _dense(codes):
    """Codes renumbered 0..m-1 (hash-based, no sort): (codes, m)."""
    encoded = pc.dictionary_encode(pa.array(codes, pa.int64()))
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64), len(encoded.dictionary)


def text_identities(keys, group, table, columns, distinct_rows=False):
    """(n, 2) uint64: the text identity of each row of ``table`` in ``columns`` (the
    prefix-free CBC-MAC of :func:`row_identity_array` under the group's text key). The
    rows' distinct value combinations are found by dictionary codes, and only one row of
    each is encoded and MACed -- unless the caller knows the rows are distinct
    (``distinct_rows``: a batch of per-key counts has each key once), when that search
    would only cost time."""
    n = table.num_rows
    if n == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    if distinct_rows:
        return block_prf.mac_bytes(row_identity_array(table, columns),
                                   keys.key(f"{group}:text"), _TAG_TEXT)
    codes, size = None, 1
    for name in columns:
        column_codes, m = _codes(table.column(name))
        if codes is None:
            codes, size = column_codes, m
            continue
        if size > (1 << 62) // m:
            codes, size = _dense(codes)
        codes, size = codes * m + column_codes, size * m
    if len(columns) > 1:
        codes, size = _dense(codes)
    representative = np.zeros(size, dtype=np.int64)
    representative[codes] = np.arange(n)        # any row of a combination: one text
    texts = row_identity_array(table.take(pa.array(representative)), columns)
    distinct = block_prf.mac_bytes(texts, keys.key(f"{group}:text"), _TAG_TEXT)
    return np.take(distinct, codes, axis=0)


def _identity_words(table, columns):
    """The user identity words of ``columns`` when they start with them (``__user_hi``
    or ``__user``, then ``__user_lo``, uint64): ((n, 2) uint64, the other columns);
    (None, columns) otherwise. ``__user`` is refused where ``__user_hi`` exists: it is
    then a grouping code (``transforms.bounding.user_shards.exact_users``), never an identity."""
    from thresher.transforms.plumbing.tables import USER_COLUMN, USER_HIGH_COLUMN, USER_LOW_COLUMN
    names = table.column_names
    if USER_COLUMN in columns and USER_HIGH_COLUMN in names:
        raise ValueError(f"{USER_COLUMN!r} is a grouping code in this table (it has "
                         f"{USER_HIGH_COLUMN!r}): streams are keyed by the identity words "
                         f"(user_shards.user_identity_columns)")
    if len(columns) < 2 or columns[0] not in (USER_COLUMN, USER_HIGH_COLUMN) \
            or columns[1] != USER_LOW_COLUMN:
        return None, list(columns)
    words = np.empty((table.num_rows, 2), dtype=np.uint64)
    for j, name in enumerate(columns[:2]):
        column = table.column(name)
        if column.type != pa.uint64() or column.null_count:
            raise ValueError(f"identity column {name!r} must be uint64 without nulls, "
                             f"got {column.type}")
        words[:, j] = column.to_numpy()
    return words, list(columns[2:])


def worker_rng(factory):
    """For ``DoFn.setup``: the seeded generator of :func:`seeded_for_tests`, ``None``
    for a :class:`KeyedSource` (streams are made per element, see below). Anything else
    is refused (:func:`resolve`): a DoFn never draws from a generator of its own, which a
    retried bundle or another worker would draw afresh."""
    if isinstance(factory, KeyedSource):
        return None
    if factory is None:
        raise NoSecretError()
    return resolve(factory)()


def stage_stream(factory, fallback, stage, identity=b""):
    """For ``process``: the keyed stream of (stage, identity), or the setup generator."""
    if isinstance(factory, KeyedSource):
        return factory.stream(stage, identity)
    return fallback


def table_streams(factory, fallback, stage, table, columns):
    """For ``process``: one keyed stream per row of ``table`` identified by its values
    in ``columns`` (a :class:`_RowView`; the streams of
    ``factory.rows(stage, row_identities(table, columns))``), or the setup generator."""
    if isinstance(factory, KeyedSource):
        keys = StageKeys(factory.stage_key(stage))
        streams = TableStreams(keys, table, {_TEXT_GROUP: list(columns)},
                               distinct_rows=(_TEXT_GROUP,))   # a batch holds a key once
        return streams.rows(np.arange(table.num_rows), _TEXT_GROUP)
    return fallback


def text_streams(factory, fallback, stage, identities):
    """For ``process``: :func:`table_streams` of a table whose rows are distinct keys,
    given the rows' identities already (``identities``: a binary Arrow array,
    :func:`row_identity_array` of the identity columns, built by a caller that knows
    their structure), or the setup generator. The same streams as :func:`table_streams`
    of that table: the identities MACed as one text each (group ``rows``)."""
    if isinstance(factory, KeyedSource):
        keys = StageKeys(factory.stage_key(stage))
        texts = block_prf.mac_bytes(identities, keys.key(f"{_TEXT_GROUP}:text"), _TAG_TEXT)
        return keys.streams(_TEXT_GROUP, texts=texts).view
    return fallback


def text_streams_of(factory, fallback, stage, macs):
    """:func:`text_streams` with the identities' MACs made by the caller: ``macs(key,
    tag)`` -> (n, 2) uint64, what ``block_prf.mac_bytes(identities, key, tag)`` gives
    (e.g. ``transforms.trees.public_cells.grid_macs``, which never makes the
    identities); or the setup generator."""
    if isinstance(factory, KeyedSource):
        keys = StageKeys(factory.stage_key(stage))
        texts = macs(keys.key(f"{_TEXT_GROUP}:text"), _TAG_TEXT)
        return keys.streams(_TEXT_GROUP, texts=texts).view
    return fallback


class PipelineSecret(KeyedSource):
    """The release secret drawn inside the pipeline: a :class:`KeyedSource` that holds no
    secret in the graph. :meth:`draw` adds ``ReleaseSecret`` to the pipeline (Impulse ->
    ``new_secret()`` -> Reshuffle: the one drawn value is committed once, so retries and
    recomputations of consumers see the same secret); :func:`par_do` gives each drawing
    DoFn that singleton side input and sets it here before the DoFn processes an element.
    Pickling keeps neither the secret nor the side input."""

    def __init__(self):
        self._secret = None
        self._side = None

    @classmethod
    def draw(cls, pipeline):
        """The release's source, its secret drawn by a new ``ReleaseSecret`` stage."""
        source = cls()
        source._side = (pipeline
                        | "ReleaseSecret" >> beam.Impulse()
                        | "ReleaseSecret/Draw" >> beam.Map(_draw_secret)
                        | "ReleaseSecret/Materialise" >> beam.Reshuffle())
        return source

    def side_input(self):
        if self._side is None:
            raise RuntimeError("this PipelineSecret was not drawn in the pipeline being built")
        return beam.pvalue.AsSingleton(self._side)

    def set_secret(self, secret):
        if secret is not self._secret:
            if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
                raise ValueError("a release secret must be at least 16 bytes")
            self._secret = bytes(secret)

    def stage_key(self, stage):
        if self._secret is None:
            raise RuntimeError("the release secret side input did not reach this DoFn: "
                               "apply it with keyed_random.par_do")
        return super().stage_key(stage)

    def __getstate__(self):
        return {"_secret": None, "_side": None}    # never the secret, never the graph

    def __setstate__(self, state):
        self.__dict__.update(state)


def _draw_secret(_):
    return new_secret()


def par_do(dofn, *args, **kwargs):
    """``beam.ParDo(dofn, *args, **kwargs)``, with the release secret's side input when
    the DoFn's ``_rng_factory`` is a :class:`PipelineSecret` (module docstring); then the
    stage also commits to the secret it read (``transforms.randomness.secret_commitment``: one secret
    per run, checked by the publisher)."""
    source = getattr(dofn, "_rng_factory", None)
    if isinstance(source, PipelineSecret):   # and its commitments, for the publisher's check
        from thresher.transforms.randomness.secret_commitment import CommittedParDo
        return CommittedParDo(dofn, source, args, kwargs)
    return beam.ParDo(dofn, *args, **kwargs)


class _WithSecret(beam.DoFn):
    """Runs ``inner`` with the secret side input set on its source first (the inner DoFn
    and this one share that source object: they are pickled together)."""

    def __init__(self, inner):
        super().__init__()
        self._inner = inner

    def setup(self):
        self._inner.setup()

    def start_bundle(self):
        self._inner.start_bundle()

    def process(self, element, *args, **kwargs):
        self._inner._rng_factory.set_secret(kwargs.pop("release_secret"))
        return self._inner.process(element, *args, **kwargs)

    def finish_bundle(self):
        return self._inner.finish_bundle()

    def teardown(self):
        self._inner.teardown()

    def default_label(self):
        return self._inner.default_label()


class KeyedDraws:
    """What a stage that draws is handed: the release's source and the stage's label
    path, its **stage identity** (module docstring, step 1).

    The release makes one root (``KeyedDraws(source)``, path "") and hands each stage
    ``draws.child(name)`` explicitly, as a constructor argument; a composite that holds
    drawing stages derives their sources from its own the same way (``self._draws.child
    ("SampleAndThreshold0")``). Nothing is looked up while the pipeline is built: the
    labels are the names the release gives, independent of where a user's pipeline
    applies the release or of Beam's own labels (which they equal by convention, so the
    draws of ``thresher run`` are unchanged: tests/pipelines/test_released_bytes_frozen.py).
    Two stages of one release must never be handed equal paths: their draws would be
    the same words."""

    def __init__(self, source, stage=""):
        if not isinstance(source, (KeyedSource, SeededForTests)):
            raise (NoSecretError() if source is None else NotASecretError(source))
        if not isinstance(stage, str):
            raise TypeError(f"a stage label path is a str, got {stage!r}")
        self.source = source
        self.stage = stage

    def child(self, name):
        """The draws of the stage ``name`` inside this one (path ``stage/name``)."""
        if not isinstance(name, str) or not name or "/" in name or "\x00" in name:
            # no NUL: the reserved stages (user identities, commitments) start with one
            raise ValueError(f"a stage label is a non-empty str without '/' or NUL, "
                             f"got {name!r}")
        return KeyedDraws(self.source, f"{self.stage}/{name}" if self.stage else name)

    def __repr__(self):
        return f"KeyedDraws({self.source!r}, {self.stage!r})"


class NoSecretError(ThresherError, TypeError):
    """A transform that draws was applied with no source to draw from (:func:`stage_of`,
    :func:`resolve`); a TypeError too: a required argument is missing."""

    def __init__(self):
        super().__init__(
            "this thresher transform draws random values and was given no secret: pass "
            "rng_factory=keyed_random.PipelineSecret.draw(pipeline).child(\"<stage>\") (a "
            "secret drawn once inside the pipeline; draw it once and give every transform "
            "of one release its own child of it) or "
            "rng_factory=keyed_random.KeyedSource(secret).child(\"<stage>\") (a secret of "
            "at least 16 bytes that you keep), or use thresher.Release(spec), which draws "
            "its own. Without one, user identities would be public and a retried bundle "
            "would draw different noise, so thresher refuses to run.")


class UnlabelledSourceError(ThresherError, ValueError):
    """A drawing transform was given a source without its stage label (:func:`stage_of`)."""

    def __init__(self, source):
        super().__init__(
            f"rng_factory={source!r} names no stage: a thresher transform that draws takes "
            "its own child of the release's source, rng_factory=source.child(\"<stage>\") "
            "with a label no other transform of the release is given (the label keys its "
            "draws: two transforms handed one source would draw the same noise)")


def child(rng_factory, name):
    """For a composite that holds drawing stages: the ``rng_factory`` of its stage
    ``name``, ``rng_factory.child(name)`` for a :class:`KeyedDraws`; anything else is
    passed on as it is (a seeded test generator draws the same for any stage; a missing
    or unlabelled source is refused by the stage that would draw from it, naming it)."""
    return rng_factory.child(name) if isinstance(rng_factory, KeyedDraws) else rng_factory


def stage_of(rng_factory):
    """At expansion of a transform that draws: (source, stage label) of its
    ``rng_factory``, a :class:`KeyedDraws` (``source.child(name)``), or the test-only
    :func:`seeded_for_tests` (whose draws no label keys). Given nothing it raises
    :class:`NoSecretError`; a source without a label, :class:`UnlabelledSourceError`;
    anything else, :class:`NotASecretError`. There is no other place to draw from."""
    if isinstance(rng_factory, SeededForTests):
        return rng_factory, ""
    if isinstance(rng_factory, KeyedDraws):
        if not rng_factory.stage and not isinstance(rng_factory.source, SeededForTests):
            raise UnlabelledSourceError(rng_factory)
        return rng_factory.source, rng_factory.stage
    if isinstance(rng_factory, KeyedSource):
        raise UnlabelledSourceError(rng_factory)
    if rng_factory is None:
        raise NoSecretError()
    raise NotASecretError(rng_factory)


def resolve(factory):
    """The source itself (no stage label): the one given (a :class:`KeyedSource`, such as
    the :class:`PipelineSecret` of ``PipelineSecret.draw(pipeline)``, the source of a
    :class:`KeyedDraws`, or the test-only :func:`seeded_for_tests`), else
    :class:`NoSecretError`. Anything else is refused (:class:`NotASecretError`): a plain
    generator factory (``numpy.random.default_rng``, ``samplers.secure_random``) would
    be called per worker and per retry, drawing fresh, unkeyed randomness that a
    recomputed stage spends its epsilon on again. There is no silent fallback."""
    if isinstance(factory, KeyedDraws):
        return factory.source
    if isinstance(factory, (KeyedSource, SeededForTests)):
        return factory
    if factory is not None:
        raise NotASecretError(factory)
    raise NoSecretError()


class NotASecretError(ThresherError, TypeError):
    """A drawing transform was given an ``rng_factory`` that is not a secret source."""

    def __init__(self, factory):
        super().__init__(
            f"rng_factory={factory!r} is not a secret source: a thresher transform that "
            "draws takes rng_factory=keyed_random.PipelineSecret.draw(pipeline).child(...) "
            "(one secret per release, a child of it per transform) or "
            "keyed_random.KeyedSource(secret).child(...) (tests: "
            "keyed_random.seeded_for_tests(seed), which makes no privacy claim). A "
            "generator factory would draw fresh, unkeyed randomness on every worker and "
            "every retry, so thresher refuses it.")


class SeededForTests:
    """TESTS ONLY, asked for by name: a seeded numpy Generator per worker
    (``seeded_for_tests(seed)()``) and the PUBLIC test user-identity key
    (``transforms.randomness.user_identity.TEST_KEY``). Reproducible and fast for tests; it makes
    no privacy claim (anyone can compute the identities and the draws)."""

    public_test_identity = True

    def __init__(self, seed):
        self.seed = seed

    def __call__(self):
        return np.random.default_rng(self.seed)

    def __repr__(self):
        return f"seeded_for_tests({self.seed!r})"

    def child(self, name):
        """The same seeded generator for any stage (:class:`KeyedDraws`, for uniformity)."""
        return KeyedDraws(self).child(name)


def seeded_for_tests(seed):
    """TESTS ONLY: :class:`SeededForTests` (a seeded generator and the public test key)."""
    return SeededForTests(seed)


class StageSource:
    """A release secret's stage: per-table row streams on demand (:meth:`bind`)."""

    def __init__(self, source, stage):
        self._keys = StageKeys(source.stage_key(stage))

    def bind(self, table, **groups):
        return TableStreams(self._keys, table, groups)

    def __getstate__(self):
        raise TypeError("stage sources are made on the worker, never pickled")


class TableStreams:
    """Row streams over one table, named column groups giving the rows' identities
    (``user=[...]``: one stream per user; ``pair=[...]``: per (user, key)). A group's
    columns either start with the user identity words (``__user_hi``/``__user``,
    ``__user_lo``: the user's 128 bits as they are; the columns after them, if any, are
    MACed to a 128-bit text identity, so a pair's message is (user, key, counter)) or
    are all MACed to one text identity (a key; a caller's own user column)."""

    def __init__(self, stage_keys, table, groups, distinct_rows=()):
        self._keys = stage_keys
        self._table = table
        self._groups = groups
        self._distinct = frozenset(distinct_rows)   # groups whose rows are distinct keys
        self._words = {}

    def _user_words(self, group):
        if group not in self._words:
            self._words[group] = _identity_words(self._table, self._groups[group])
        return self._words[group]

    def rows(self, index, group, text_codes=None):
        """A view with one stream per row ``index`` of the table, identified by the
        group's columns. ``text_codes`` (optional, int64 per row of the table): codes of
        the group's text columns the caller already has, equal exactly where the
        columns' values are equal (``pyarrow.compute.dictionary_encode`` codes, combined
        column by column, as :func:`text_identities` finds them): then only one row per
        code is read and MACed, and the streams are the same as without them."""
        index = np.asarray(index, dtype=np.int64)
        words, rest = self._user_words(group)
        # np.take of whole rows: the same words as words[index], several times faster
        users = np.take(words, index, axis=0) if words is not None else None
        texts = None
        if rest and text_codes is not None:
            texts = _coded_text_identities(self._keys, group, self._table, rest, index,
                                           np.take(np.asarray(text_codes), index))
        elif rest:
            part = self._table.select(rest).take(pa.array(index))
            texts = text_identities(self._keys, group, part, rest,
                                    distinct_rows=group in self._distinct)
        return self._keys.streams(group, users=users, texts=texts).view


def _coded_text_identities(keys, group, table, columns, index, codes):
    """:func:`text_identities` of rows ``index`` of ``table`` whose value combinations
    in ``columns`` the caller has coded (``codes``, one per row of ``index``): one row
    per code (any, as :func:`text_identities` takes) encoded and MACed, the identities
    spread back by code. Hash-based de-duplication, no sort, nothing per row in Python."""
    if len(index) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    codes = np.asarray(codes, dtype=np.int64)
    low, high = int(codes.min()), int(codes.max())
    if low >= 0 and high < max(_DENSE_CODES, len(codes)):
        # small codes (a column's dictionary codes): numbered by one scatter, no hash pass
        seen = np.full(high + 1, -1, dtype=np.int64)
        seen[codes] = index                           # any row of a combination: one text
        present = np.flatnonzero(seen >= 0)
        number = np.empty(high + 1, dtype=np.int64)
        number[present] = np.arange(len(present), dtype=np.int64)
        position, representative = number[codes], seen[present]
    else:
        encoded = pc.dictionary_encode(pa.array(codes, pa.int64()))
        position = encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)
        representative = np.zeros(len(encoded.dictionary), dtype=np.int64)
        representative[position] = index              # any row of a combination: one text
    part = table.select(list(columns)).take(pa.array(representative))
    distinct = text_identities(keys, group, part, columns, distinct_rows=True)
    return np.take(distinct, position, axis=0)   # whole rows: faster than distinct[position]


def stage_source(factory, fallback, stage):
    """For ``process`` of a per-user stage: a :class:`StageSource`, or the setup generator."""
    if isinstance(factory, KeyedSource):
        return StageSource(factory, stage)
    return fallback


def bind(rng, table, **groups):
    """``rng`` bound to ``table`` (a StageSource), or ``rng`` itself."""
    return rng.bind(table, **groups) if isinstance(rng, StageSource) else rng


def bind_users(rng, table, key_columns=(), user_column="__user"):
    """``rng`` bound to a table of whole users: group ``user`` gives one stream per user,
    ``pair`` one per (user, key), both identified by the user's 128-bit identity
    (``transforms.plumbing.tables.user_identity_columns``: the secret-keyed PRF of the id,
    never a grouping code; a caller's own user column is MACed to 128 bits), or ``rng``
    itself (tests' seeded generators)."""
    if not isinstance(rng, StageSource):
        return rng
    from thresher.transforms.plumbing.tables import user_identity_columns
    users = user_identity_columns(table, user_column)
    return rng.bind(table, user=users, pair=[*users, *key_columns])


def rows_of(rng, index, group, text_codes=None):
    """Streams for rows ``index`` of a bound table (``text_codes``:
    :meth:`TableStreams.rows`), or ``rng`` itself (tests' seeded generators, which are
    consumed in order)."""
    return rng.rows(index, group, text_codes) if isinstance(rng, TableStreams) else rng

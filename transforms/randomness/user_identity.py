"""The identity of a user: a secret-keyed 128-bit PRF of the user id, computed at read time.

Every per-user random stream of a release (``transforms.randomness.keyed_random``: the l0 ranks of
``per_user_bound``, rand-clip's priorities, the scored bound's and the weighted and
adaptive rounds' bounding, the aggregates' bounding) is keyed by this identity, and users
are grouped by it. It is a function of the user's own id and of the release secret only
-- never of a public hash, a rank within a shard, a shard number, or of which other users
are present (issue 25, F1). So user v's randomness and kept records are a function of the
secret, v's own records and the outputs of earlier private stages only
(docs/privacy_testing.md, "Seams").

**Construction.** ``F_K(id)`` is CBC-MAC under AES-256 with key ``K`` (FIPS 197; the
``cryptography`` package, a dependency of Apache Beam) over a prefix-free encoding of the
id's canonical bytes:

- integer and boolean ids (the 64-bit two's-complement word ``w`` of the value, so
  ``True`` is 1 and the uint64 ``2**64 - 1`` is the int64 ``-1``, as the public hash of
  :mod:`transforms.randomness.hashing` identified them): one block ``"thr:int\\0" || w`` (8 bytes
  each, ``w`` little-endian);
- every other id (strings and binaries as their bytes, other types as
  ``hashing.canonical_text``): the block ``"thr:str\\0" || len`` (8 bytes each) and the
  bytes, zero-padded to whole 16-byte blocks.

The first 8 bytes of every message name its kind and a byte message starts with its
length, so no message is a prefix of another; CBC-MAC of a block cipher is a PRF on any
prefix-free message set (Petrank and Rackoff, J. Cryptology 2000; Bellare, Kilian and
Rogaway, JCSS 2000), with distinguishing advantage at most about ``q^2 m^2 / 2^128`` for
``q`` ids of at most ``m`` blocks, plus AES's own. Without ``K`` no one can craft two
ids with equal identities; the accidental rate for ``q`` ids of at most ``m`` blocks is
at most about ``q^2 m^2 / 2^128`` (a random function's ``q^2 / 2^129`` plus the PRF bound,
which dominates: ``m = 2`` for text ids of up to 16 bytes, one more block per further 16
bytes), and zero for integer ids (one AES block is a permutation).

**Key.** ``K`` is the first 32 bytes of the release secret's stage key for the reserved
stage :data:`IDENTITY_STAGE` (``KeyedSource.stage_key``), so it is as secret as the
release's other streams and changes with every release. There is no default key: a
reader given no ``KeyedSource`` refuses to run (:func:`check_identity_source`, a
``ThresherError`` naming what to pass). :data:`TEST_KEY`, a fixed public constant, is
used only when asked for by name -- ``prepare_batch(..., identity_key=TEST_KEY)`` or the
test-only ``keyed_random.seeded_for_tests(seed)`` -- and then identities are
reproducible but public, collisions of them can be crafted, and no privacy claim is made
(a release always has a ``KeyedSource``: ``pipelines.running.release.run``, the Beam YAML
transform).

**Type-stable ids.** A user is its id's value, not the Arrow type a file stored it
in: one real user split into two identities would have its contribution bound doubled.
So integers of every width and booleans are one 64-bit word (above), a floating-point
id that is a whole number in [-2**63, 2**64) is the integer it equals (``1.0`` is the
user ``1``, ``-0.0`` is ``0``; exact, no rounding: :func:`integral_float_words`), and
other floats go by their canonical text. CSV and JSONL user ids are read as text
(``pipelines.dataio.io.prepare_batch``: the JSON number ``1`` and the string ``"1"`` are
one user). Text and numbers are never equated: a Parquet dataset whose files store the
user column as text in one file and as numbers in another is refused before any row is
read (``pipelines.dataio.io.check_input``, naming the files and types), since whether
``"01"`` is the user ``1`` is a question only the data's owner can answer. (Merging two
real users into one identity only costs accuracy: they share one bound.)

**Columns.** The 16 bytes are two little-endian uint64 words: ``__user`` (word 0; its top
bits pick the user shard, ``transforms.bounding.user_shards.user_shard_of``) and ``__user_lo``
(word 1). Users are the distinct (``__user``, ``__user_lo``) pairs;
``transforms.bounding.user_shards.exact_users`` makes ``__user`` alone one-to-one on them in a
table (a read batch or a user shard), so a DoFn right after reading can group a batch's
rows by user with one uint64 sort or hash.

**Cost.** Integer ids: one AES block per row (no de-duplication needed). Other ids: the
batch's distinct ids (one Arrow dictionary encoding) are MACed together, one AES call per
block position over all ids still that long, and the identities taken back to the rows;
ids longer than ``block_prf.LONG_BYTES`` are MACed one by one (CBC mode, one call each).
"""
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.errors import ThresherError
from thresher.transforms.randomness import block_prf

IDENTITY_STAGE = "\x00thresher/user-identity"   # NUL: no stage label is this stage
TEST_KEY = hashlib.shake_256(b"thresher: public test-only user identity key").digest(32)
_TAG_INT = b"thr:int\x00"
_TAG_BYTES = b"thr:str\x00"


def check_identity_source(factory):
    """Refuse, when a reader is built, a randomness source that cannot key user
    identities: a :class:`~transforms.randomness.keyed_random.KeyedSource` (the release secret) or
    the test-only :func:`~transforms.randomness.keyed_random.seeded_for_tests`, asked for by name.
    Anything else -- no source, or a plain generator factory -- would give identities
    under the public :data:`TEST_KEY` without saying so."""
    from thresher.transforms.randomness.keyed_random import KeyedSource, NoSecretError, SeededForTests
    if isinstance(factory, (KeyedSource, SeededForTests)):
        return factory
    if factory is None:
        raise NoSecretError()
    raise ThresherError(
        f"user identities are keyed by the release secret, and rng_factory={factory!r} "
        "holds none: pass keyed_random.PipelineSecret.draw(pipeline) or "
        "keyed_random.KeyedSource(secret) (tests: keyed_random.seeded_for_tests(seed), "
        "which uses the public test key and makes no privacy claim)")


def identity_key(factory):
    """The AES-256 key of the identities of a release: from its ``KeyedSource``;
    :data:`TEST_KEY` only for :func:`~transforms.randomness.keyed_random.seeded_for_tests`; any
    other source is refused (:func:`check_identity_source`; module docstring, "Key")."""
    from thresher.transforms.randomness.keyed_random import KeyedSource
    check_identity_source(factory)
    if isinstance(factory, KeyedSource):
        return factory.stage_key(IDENTITY_STAGE)[:32]
    return TEST_KEY


def identities_of_integers(words, key):
    """(n, 2) uint64 identities of 64-bit words (an integer id column, as uint64)."""
    blocks = np.empty((len(words), 2), dtype=np.uint64)
    blocks[:, 0] = block_prf.tag_word(_TAG_INT)
    blocks[:, 1] = words
    return block_prf.encrypt(block_prf.encryptor(key), blocks)


def identities_of_bytes(arr, key):
    """(n, 2) uint64 identities of the values of a null-free binary/string Array: the
    prefix-free CBC-MAC of ``"thr:str\\0" || len`` and the bytes (``block_prf.mac_bytes``)."""
    return block_prf.mac_bytes(arr, key, _TAG_BYTES)


def flat_array(arr):
    """One plain Arrow array of a column: chunks combined, dictionary values decoded."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    return arr


def identify(arr, key):
    """(word 0, word 1): uint64 arrays, the identity of each value of a null-free user id
    Array (module docstring). Values are de-duplicated first (non-integer ids)."""
    from thresher.transforms.randomness.hashing import _integer_words, canonical_text
    arr = flat_array(arr)
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        words = identities_of_integers(_integer_words(arr), key)
        return words[:, 0].copy(), words[:, 1].copy()
    if pa.types.is_floating(t):
        return _identify_floats(arr, key)
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        arr = canonical_text(arr)
    encoded = pc.dictionary_encode(arr)
    distinct = identities_of_bytes(encoded.dictionary, key)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    return distinct[:, 0][codes], distinct[:, 1][codes]


_TWO_63 = float(2 ** 63)
_TWO_64 = float(2 ** 64)


def integral_float_words(values):
    """(mask, words) for a float64 numpy array: which values are whole numbers in
    [-2**63, 2**64) and, for those, the 64-bit word of the integer they equal (the word
    ``hashing._integer_words`` gives that integer in an int64 or uint64 column). The
    conversion is exact: such a float is an integer and fits the word."""
    finite = np.isfinite(values)
    mask = finite & (values == np.floor(np.where(finite, values, 0.0))) \
        & (values >= -_TWO_63) & (values < _TWO_64)
    whole = values[mask]
    words = np.empty(len(whole), dtype=np.uint64)
    low = whole < _TWO_63
    words[low] = whole[low].astype(np.int64).view(np.uint64)
    words[~low] = whole[~low].astype(np.uint64)
    return mask, words


def _identify_floats(arr, key):
    """Floating user ids (module docstring, "Type-stable ids"): a whole number is the
    user of that integer (1.0 in one file and 1 in another are one user, -0.0 is 0);
    any other value by its canonical text."""
    from thresher.transforms.randomness.hashing import canonical_text
    values = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    mask, words = integral_float_words(values)
    out0 = np.empty(len(values), dtype=np.uint64)
    out1 = np.empty(len(values), dtype=np.uint64)
    if mask.any():
        ids = identities_of_integers(words, key)
        out0[mask], out1[mask] = ids[:, 0], ids[:, 1]
    rest = np.flatnonzero(~mask)
    if len(rest):
        text = canonical_text(arr.take(pa.array(rest)))
        encoded = pc.dictionary_encode(text)
        distinct = identities_of_bytes(encoded.dictionary, key)
        codes = encoded.indices.to_numpy(zero_copy_only=False)
        out0[rest], out1[rest] = distinct[:, 0][codes], distinct[:, 1][codes]
    return out0, out1


def text_ids(arr):
    """A user id column of a text format (CSV, JSONL) as text, whatever type the reader
    inferred for it: strings as they are, integers and booleans in decimal / ``true``,
    floats that are whole numbers as the integer's decimal (JSON ``1.0`` and ``1e3`` are
    the users ``"1"`` and ``"1000"``, as ``1`` and ``1000`` are; ``-0.0`` is ``"0"``),
    other values by ``hashing.canonical_text``; nulls stay null. So two files of one
    dataset that a reader typed differently still name each user alike."""
    from thresher.transforms.randomness.hashing import canonical_text
    arr = flat_array(arr)
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return arr
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return pc.cast(arr, pa.string())
    if not pa.types.is_floating(t):
        return canonical_text(arr)
    values = arr.cast(pa.float64()).to_numpy(zero_copy_only=False)
    mask, words = integral_float_words(values)
    text = canonical_text(arr)
    if not mask.any():
        return text
    high = values[mask] >= _TWO_63
    signed = pc.cast(pa.array(words.view(np.int64)), pa.string())
    unsigned = pc.cast(pa.array(words), pa.string())
    whole = pc.if_else(pa.array(high), unsigned, signed)
    return pc.replace_with_mask(text, pa.array(mask), whole)

"""The identity of a user: a secret-keyed 128-bit PRF of the user id, computed at read time.

Every per-user random stream of a release (``transforms.keyed_random``: the l0 ranks of
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
  :mod:`transforms.hashing` identified them): one block ``"thr:int\\0" || w`` (8 bytes
  each, ``w`` little-endian);
- every other id (strings and binaries as their bytes, other types as
  ``hashing.canonical_text``): the block ``"thr:str\\0" || len`` (8 bytes each) and the
  bytes, zero-padded to whole 16-byte blocks.

The first 8 bytes of every message name its kind and a byte message starts with its
length, so no message is a prefix of another; CBC-MAC of a block cipher is a PRF on any
prefix-free message set (Petrank and Rackoff, J. Cryptology 2000; Bellare, Kilian and
Rogaway, JCSS 2000), with distinguishing advantage at most about ``q^2 m^2 / 2^128`` for
``q`` ids of at most ``m`` blocks, plus AES's own. Without ``K`` no one can craft two
ids with equal identities; the accidental rate for ``q`` ids is about ``q^2 / 2^129``
(and zero for integer ids: one AES block is a permutation).

**Key.** ``K`` is the first 32 bytes of the release secret's stage key for the reserved
stage :data:`IDENTITY_STAGE` (``KeyedSource.stage_key``), so it is as secret as the
release's other streams and changes with every release. Without a ``KeyedSource`` (tests
that pass a seeded generator factory, transforms used on their own) the key is
:data:`TEST_KEY`, a fixed public constant: identities are then reproducible but public,
collisions of them can be crafted, and no privacy claim is made (a release always has a
``KeyedSource``: ``pipelines.release.run``, the Beam YAML transform).

**Columns.** The 16 bytes are two little-endian uint64 words: ``__user`` (word 0; its top
bits pick the user shard, ``transforms.user_shards.user_shard_of``) and ``__user_lo``
(word 1). Users are the distinct (``__user``, ``__user_lo``) pairs;
``transforms.user_shards.exact_users`` makes ``__user`` alone one-to-one on them in a
table (a read batch or a user shard), so a DoFn right after reading can group a batch's
rows by user with one uint64 sort or hash.

**Cost.** Integer ids: one AES block per row (no de-duplication needed). Other ids: the
batch's distinct ids (one Arrow dictionary encoding) are MACed together, one AES call per
block position over all ids still that long, and the identities taken back to the rows;
ids longer than :data:`_LONG_BYTES` are MACed one by one (CBC mode, one call each).
"""
import hashlib

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

IDENTITY_STAGE = "\x00thresher/user-identity"   # NUL: no Beam label is this stage
TEST_KEY = hashlib.shake_256(b"thresher: public test-only user identity key").digest(32)
_TAG_INT = b"thr:int\x00"
_TAG_BYTES = b"thr:str\x00"
_BLOCK = 16
_LONG_BYTES = 1024     # ids longer than this are MACed one by one


def identity_key(factory):
    """The AES-256 key of the identities of a release: from its ``KeyedSource``, else
    :data:`TEST_KEY` (see the module docstring)."""
    from thresher.transforms.keyed_random import KeyedSource
    if isinstance(factory, KeyedSource):
        return factory.stage_key(IDENTITY_STAGE)[:32]
    return TEST_KEY


def _ecb(key):
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    return Cipher(algorithms.AES(key), modes.ECB()).encryptor()


def _encrypt_words(encryptor, words):
    """AES of each row of an (n, 2) uint64 array (16 bytes per row, little-endian)."""
    data = np.ascontiguousarray(words, dtype="<u8")
    out = np.empty((len(data) + 1, 2), dtype="<u8")   # update_into wants a spare block
    if len(data):   # no bytes copies: the arrays' own buffers
        encryptor.update_into(memoryview(data.view(np.uint8).reshape(-1)),
                              memoryview(out.view(np.uint8).reshape(-1)))
    return out[:len(data)].astype(np.uint64, copy=False)


def _word(tag):
    return np.frombuffer(tag, dtype="<u8")[0]


def identities_of_integers(words, key):
    """(n, 2) uint64 identities of 64-bit words (an integer id column, as uint64)."""
    blocks = np.empty((len(words), 2), dtype=np.uint64)
    blocks[:, 0] = _word(_TAG_INT)
    blocks[:, 1] = words
    return _encrypt_words(_ecb(key), blocks)


def _binary(arr):
    """``arr`` as a binary-like Array Arrow can join (string, binary or their large forms
    as they are: no copy of the offsets or data)."""
    t = arr.type
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        return arr
    return arr.cast(pa.large_binary())


def identities_of_bytes(arr, key):
    """(n, 2) uint64 identities of the values of a null-free binary/string Array."""
    n = len(arr)
    out = np.zeros((n, 2), dtype=np.uint64)
    if n == 0:
        return out
    from thresher.transforms.hashing import _offsets_and_data
    arr = _binary(arr)
    lengths = pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    long = lengths > _LONG_BYTES
    if long.any():
        offsets, data = _offsets_and_data(arr)
        for i in np.flatnonzero(long):
            out[i] = _mac_one(bytes(data[offsets[i]:offsets[i + 1]]), key)
        short = np.flatnonzero(~long)
        out[short] = _mac_short(arr.take(pa.array(short)), lengths[short], key)
    else:
        out[:] = _mac_short(arr, lengths, key)
    return out


_PADS = pa.array([bytes(k) for k in range(_BLOCK)], pa.binary())


def _header_blocks(lengths):
    header = np.empty((len(lengths), 2), dtype=np.uint64)
    header[:, 0] = _word(_TAG_BYTES)
    header[:, 1] = lengths.astype(np.uint64)
    return header


def _mac_short(arr, lengths, key):
    """CBC-MAC of many short messages at once. Arrow appends each value's zero padding
    (one element-wise join, no per-byte Python or index arrays), so the data buffer is
    the messages' blocks back to back; then block position j of every message that has
    one goes through AES in a single call (messages ordered by block count, longest
    first, so those still running are a prefix)."""
    from thresher.transforms.hashing import _offsets_and_data
    if len(arr) == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    pads = _PADS.take(pa.array((-lengths) % _BLOCK)).cast(arr.type)
    padded = pc.binary_join_element_wise(arr, pads, pa.scalar(b"", arr.type))
    offsets, data = _offsets_and_data(padded)
    base = int(offsets[0])
    blocks = np.frombuffer(data[base:int(offsets[-1])].tobytes() if base % 8 else
                           data[base:int(offsets[-1])], dtype="<u8").reshape(-1, 2)
    first = (offsets[:-1] - base) // _BLOCK
    data_blocks = np.diff(offsets) // _BLOCK
    order = np.argsort(-data_blocks, kind="stable")
    first, data_blocks = first[order], data_blocks[order]
    encryptor = _ecb(key)
    state = _encrypt_words(encryptor, _header_blocks(lengths[order]))
    descending = -data_blocks                 # ascending, for searchsorted
    for j in range(int(data_blocks.max(initial=0))):
        active = int(np.searchsorted(descending, -j, side="left"))   # data_blocks > j
        state[:active] = _encrypt_words(encryptor, state[:active] ^ blocks[first[:active] + j])
    out = np.empty_like(state)
    out[order] = state
    return out


def _mac_one(message, key):
    """CBC-MAC of one long message (CBC encryption with a zero IV; its last block)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    header = _TAG_BYTES + len(message).to_bytes(8, "little")
    padded = header + message + bytes(-len(message) % _BLOCK)
    encryptor = Cipher(algorithms.AES(key), modes.CBC(bytes(_BLOCK))).encryptor()
    last = encryptor.update(padded)[-_BLOCK:]
    return np.frombuffer(last, dtype="<u8").astype(np.uint64)


def identify(arr, key):
    """(word 0, word 1): uint64 arrays, the identity of each value of a null-free user id
    Array (module docstring). Values are de-duplicated first (non-integer ids)."""
    from thresher.transforms.hashing import _integer_words, canonical_text
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        arr = arr.cast(arr.type.value_type)
    t = arr.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        words = identities_of_integers(_integer_words(arr), key)
        return words[:, 0].copy(), words[:, 1].copy()
    if not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        arr = canonical_text(arr)
    encoded = pc.dictionary_encode(arr)
    distinct = identities_of_bytes(encoded.dictionary, key)
    codes = encoded.indices.to_numpy(zero_copy_only=False)
    return distinct[:, 0][codes], distinct[:, 1][codes]

"""AES-256 pseudo-random functions over packed 16-byte blocks, a whole batch per call.

The keyed randomness of a release (``transforms.randomness.keyed_random``) and the user identities
(``transforms.randomness.user_identity``) are CBC-MACs under AES-256 (FIPS 197; the ``cryptography``
package). This module holds the vectorised building blocks they share; no function here
makes a Python call per row:

* :func:`encrypt`: AES of every row of an ``(n, 2)`` uint64 array (a row is one 16-byte
  block, its two words little-endian on every platform) -- one ECB call for the batch;
* :func:`cbc_chain`: the CBC-MAC state after a fixed number of blocks per row,
  ``E(...E(E(m_1) xor m_2)... xor m_j)`` -- one ECB call per block *position* over all
  rows (the chaining is a numpy XOR between the calls);
* :func:`mac_bytes`: the prefix-free CBC-MAC of many byte strings (a header block
  ``tag || length``, then the bytes zero-padded to whole blocks), one ECB call per block
  position over the strings still that long.

Why CBC-MAC is a PRF here: CBC-MAC of a block cipher is a PRF on messages of one fixed
number of blocks (Bellare, Kilian and Rogaway, "The security of the cipher block chaining
message authentication code", JCSS 2000) and on any prefix-free message set (Petrank and
Rackoff, "CBC MAC for real-time data sources", J. Cryptology 2000), with distinguishing
advantage at most about ``q^2 m^2 / 2^128`` for ``q`` messages of at most ``m`` blocks,
plus AES-256's own advantage as a pseudo-random permutation. A caller keeps one key per
message set (``transforms.randomness.keyed_random``: one derived key per stream group and message
shape), so the messages under a key are always all of one length or all prefix-free.
"""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

BLOCK = 16
KEY_BYTES = 32
WORD = np.dtype("<u8")       # the two words of a block are little-endian on every platform
LONG_BYTES = 1024            # mac_bytes: strings longer than this are MACed one by one


def encryptor(key):
    """An AES-256 ECB encryptor (``cryptography``); ECB is stateless, so one encryptor
    serves any number of :func:`encrypt` calls."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    if not isinstance(key, (bytes, bytearray)) or len(key) != KEY_BYTES:
        raise ValueError(f"an AES-256 key is {KEY_BYTES} bytes")
    return Cipher(algorithms.AES(bytes(key)), modes.ECB()).encryptor()


def encrypt(enc, words):
    """AES of each row of an ``(n, 2)`` uint64 array: ``(n, 2)`` uint64 (native order),
    the two words of each 16-byte block read little-endian. One library call."""
    data = np.ascontiguousarray(words, dtype=WORD)
    out = np.empty((len(data) + 1, 2), dtype=WORD)   # update_into wants a spare block
    if len(data):   # no bytes copies: the arrays' own buffers
        enc.update_into(memoryview(data.view(np.uint8).reshape(-1)),
                        memoryview(out.view(np.uint8).reshape(-1)))
    return out[:len(data)].astype(np.uint64, copy=False)


def counter_blocks(counters):
    """The blocks ``<b>``: word 0 the counter ``b``, word 1 zero."""
    counters = np.asarray(counters, dtype=np.uint64)
    blocks = np.zeros((len(counters), 2), dtype=np.uint64)
    blocks[:, 0] = counters
    return blocks


def cbc_chain(enc, *blocks):
    """The CBC-MAC state of each row after the blocks ``blocks[0], blocks[1], ...`` (each
    an ``(n, 2)`` uint64 array): ``E(...E(E(m_1) xor m_2)... xor m_j)``. With the last
    block a counter this is the fixed-length CBC-MAC of ``(m_1, ..., m_j, <b>)``."""
    state = encrypt(enc, blocks[0])
    for block in blocks[1:]:
        state = encrypt(enc, state ^ block)
    return state


def tag_word(tag):
    """An 8-byte tag as the uint64 word it is read as (little-endian)."""
    if len(tag) != 8:
        raise ValueError("a tag is 8 bytes")
    return np.frombuffer(tag, dtype=WORD)[0].astype(np.uint64)


def offsets_and_data(arr):
    """(int64 value offsets into the data buffer, uint8 data buffer) of a binary/string Array."""
    n = len(arr)
    buffers = arr.buffers()
    if pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type):
        offsets = np.frombuffer(buffers[1], dtype=np.int64, count=n + 1, offset=arr.offset * 8)
    else:
        offsets = np.frombuffer(buffers[1], dtype=np.int32, count=n + 1,
                                offset=arr.offset * 4).astype(np.int64)
    data = (np.frombuffer(buffers[2], dtype=np.uint8) if buffers[2] is not None
            else np.zeros(0, np.uint8))
    return offsets, data


def _binary(arr):
    """``arr`` as a binary-like Array Arrow can join (string, binary or their large forms
    as they are: no copy of the offsets or data)."""
    t = arr.type
    if (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
            or pa.types.is_large_binary(t)):
        return arr
    return arr.cast(pa.large_binary())


def mac_bytes(arr, key, tag):
    """(n, 2) uint64: the prefix-free CBC-MAC under AES-256 ``key`` of each value of a
    null-free binary/string Array. The message of a value of ``L`` bytes is the block
    ``tag || L`` (8 bytes each, little-endian) followed by the bytes, zero-padded to
    whole blocks: the length in the first block makes the set prefix-free."""
    n = len(arr)
    if n == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    arr = _binary(arr)
    lengths = pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    long = lengths > LONG_BYTES
    if not long.any():
        return _mac_short(arr, lengths, key, tag)
    out = np.zeros((n, 2), dtype=np.uint64)
    offsets, data = offsets_and_data(arr)
    for i in np.flatnonzero(long):   # rare: ids over a kilobyte, one CBC call each
        out[i] = mac_one(bytes(data[offsets[i]:offsets[i + 1]]), key, tag)
    short = np.flatnonzero(~long)
    out[short] = _mac_short(arr.take(pa.array(short)), lengths[short], key, tag)
    return out


# _LOW_BYTES[k]: the word whose k low bytes are ones (k = 0 ... 8)
_LOW_BYTES = np.array([(1 << (8 * k)) - 1 for k in range(9)], dtype=np.uint64)


def _words_at(arr):
    """(windows, starts): ``windows[p]`` is the 16 bytes at byte ``p`` of the values'
    data (zero past its end), ``starts`` each value's first byte. A strided view of one
    copy of the data: no index arrays per byte."""
    offsets, data = offsets_and_data(arr)
    lo, hi = int(offsets[0]), int(offsets[-1])
    extended = np.zeros(hi - lo + 2 * BLOCK, dtype=np.uint8)
    extended[:hi - lo] = data[lo:hi]
    windows = np.lib.stride_tricks.as_strided(extended, shape=(hi - lo + BLOCK, BLOCK),
                                              strides=(1, 1))
    return windows, offsets[:-1] - lo


def _block(windows, starts, lengths, j):
    """Block j (bytes 16j ... 16j + 15, zero-padded) of each value: an ``(n, 2)`` uint64
    array, one 16-byte load per value masked to the value's length."""
    out = windows[starts + j * BLOCK].view(WORD)
    rest = lengths - j * BLOCK
    out[:, 0] &= _LOW_BYTES[np.clip(rest, 0, 8)]
    out[:, 1] &= _LOW_BYTES[np.clip(rest - 8, 0, 8)]
    return out


def _mac_short(arr, lengths, key, tag):
    """CBC-MAC of many short messages at once: the header blocks in one AES call, then
    block position j of every message that has one in a single call, each block read
    straight from the Arrow data buffer (``_block``). When every value has the same
    number of blocks (ids of 1 to 16 bytes: one) all messages run at every position;
    otherwise they are ordered by block count, longest first, so those still running
    are a prefix."""
    n = len(arr)
    if n == 0:
        return np.zeros((0, 2), dtype=np.uint64)
    data_blocks = (lengths + (BLOCK - 1)) // BLOCK
    enc = encryptor(key)
    # the header block tag || L depends on the length alone: one AES call per length
    header = np.empty((int(lengths.max()) + 1, 2), dtype=np.uint64)
    header[:, 0] = tag_word(tag)
    header[:, 1] = np.arange(len(header), dtype=np.uint64)
    by_length = encrypt(enc, header)
    state = np.empty((n, 2), dtype=np.uint64)
    state[:, 0] = by_length[:, 0].take(lengths)     # two 1-d gathers: a 2-d one is slower
    state[:, 1] = by_length[:, 1].take(lengths)
    width = int(data_blocks.max(initial=0))
    if width == 0:
        return state
    words, starts = _words_at(arr)
    if int(data_blocks.min()) == width:
        for j in range(width):
            state = encrypt(enc, state ^ _block(words, starts, lengths, j))
        return state
    order = np.argsort(-data_blocks, kind="stable")
    starts, lengths, data_blocks = starts[order], lengths[order], data_blocks[order]
    state = state[order]
    descending = -data_blocks                 # ascending, for searchsorted
    for j in range(width):
        active = int(np.searchsorted(descending, -j, side="left"))   # data_blocks > j
        state[:active] = encrypt(enc, state[:active] ^ _block(
            words, starts[:active], lengths[:active], j))
    out = np.empty_like(state)
    out[order] = state
    return out


def mac_one(message, key, tag):
    """The same CBC-MAC of one message (CBC encryption with a zero IV; its last block)."""
    from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes
    header = tag + len(message).to_bytes(8, "little")
    padded = header + message + bytes(-len(message) % BLOCK)
    enc = Cipher(algorithms.AES(key), modes.CBC(bytes(BLOCK))).encryptor()
    last = enc.update(padded)[-BLOCK:]
    return np.frombuffer(last, dtype=WORD).astype(np.uint64)

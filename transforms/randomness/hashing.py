"""Stable 64-bit hashes of Arrow columns, vectorised, for sharding keys.

The same value hashes to the same word in every process and on every worker (no Python
``hash()``, whose string seed differs per process), so a key's partial counts meet in one
key shard.

These hashes are public, unkeyed functions, so anyone can craft colliding values (for
example Thue-Morse strings collide for every odd base mod 2**64). No privacy claim rests
on them being collision-free:

- **users** are not hashed here at all: a user's identity is a secret-keyed 128-bit PRF
  of the id, computed at read time (:mod:`transforms.randomness.user_identity`); it picks the user
  shard, groups users and keys their random streams. (Before issue 25 users were sharded
  by this public hash and, in a shard where two ids collided, re-encoded by their rank in
  the shard, which made one user's streams depend on the others present.)
- **keys**: keys are aggregated by their true values, never by hash alone; bounding
  de-duplicates a user's keys by hash only after checking, per shard, that the hash is
  one-to-one on the shard's key values, and otherwise identifies keys exactly
  (``transforms.bounding.per_user_bound``). Where scores group keys by hash (the private choice of
  C), the hash is a fixed public map applied to each user's own records, which changes
  no sensitivity (docs/privacy_testing.md, "Artifact-level threats").

Strings are hashed as UTF-8 bytes with a polynomial hash mod 2**64 finished by the
splitmix64 mixer.
"""
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.transforms.randomness.block_prf import offsets_and_data as _offsets_and_data

_P = np.uint64(0x100000001B3)  # FNV-1 64-bit prime: odd, so powers never vanish mod 2**64
_CHUNK_BYTES = 1 << 18  # power-table size (2 MiB each); longer values are folded chunk by chunk


def mix64(x):
    """splitmix64 finaliser on a uint64 array (a bijection of 64-bit words)."""
    x = np.asarray(x, dtype=np.uint64).copy()
    x ^= x >> np.uint64(30)
    x *= np.uint64(0xBF58476D1CE4E5B9)
    x ^= x >> np.uint64(27)
    x *= np.uint64(0x94D049BB133111EB)
    x ^= x >> np.uint64(31)
    return x


def _inverse_mod_2_64(a):
    """Multiplicative inverse of an odd 64-bit word mod 2**64 (Newton iteration)."""
    a = int(a)
    inv = a
    for _ in range(6):
        inv = (inv * (2 - a * inv)) % (1 << 64)
    return inv


_POWERS = None
_INV_POWERS = None


def _power_tables():
    """P**k and P**-k mod 2**64 for k < _CHUNK_BYTES, built once per process."""
    global _POWERS, _INV_POWERS
    if _POWERS is None:
        powers = np.full(_CHUNK_BYTES, _P, dtype=np.uint64)
        powers[0] = 1
        np.cumprod(powers, out=powers)  # wraps mod 2**64
        inv = np.full(_CHUNK_BYTES, np.uint64(_inverse_mod_2_64(_P)), dtype=np.uint64)
        inv[0] = 1
        np.cumprod(inv, out=inv)
        _POWERS, _INV_POWERS = powers, inv
    return _POWERS, _INV_POWERS


def _hash_binary(arr):
    """Polynomial hash sum_k b_k P**k of each value's bytes (a non-null binary/string Array).

    Within a chunk of the data buffer, sum_{k in s} b_k P**(k - start_s) is
    P**(-start_s) * sum_{k in s} b_k P**k, so one pass over the bytes with global powers,
    a segmented sum and one multiply per string give every hash."""
    if not (pa.types.is_string(arr.type) or pa.types.is_binary(arr.type)
            or pa.types.is_large_string(arr.type) or pa.types.is_large_binary(arr.type)):
        arr = arr.cast(pa.large_binary())
    n = len(arr)
    out = np.zeros(n, dtype=np.uint64)
    if n == 0:
        return out
    offsets, data = _offsets_and_data(arr)
    lengths = np.diff(offsets)
    powers, inv_powers = _power_tables()
    start = 0
    while start < n:
        # whole strings, at most _CHUNK_BYTES bytes (a longer single string is hashed alone)
        stop = int(np.searchsorted(offsets, offsets[start] + _CHUNK_BYTES, side="right")) - 1
        stop = min(max(stop, start + 1), n)
        lo, hi = int(offsets[start]), int(offsets[stop])
        if hi - lo > _CHUNK_BYTES:  # one very long value: fold it in chunk-sized pieces
            out[start] = _hash_long(data[lo:hi], powers)
        elif hi > lo:
            seg = data[lo:hi].astype(np.uint64)
            seg *= powers[: hi - lo]
            starts = offsets[start:stop] - lo
            nonempty = lengths[start:stop] > 0
            sums = np.zeros(stop - start, dtype=np.uint64)
            sums[nonempty] = np.add.reduceat(seg, starts[nonempty])
            out[start:stop] = sums * inv_powers[starts]
        start = stop
    return mix64(out ^ _length_mix(lengths))


_LENGTH_MIX = None


def _length_mix(lengths):
    """mix64(length + 1), from a table for the usual short lengths."""
    global _LENGTH_MIX
    if _LENGTH_MIX is None:
        _LENGTH_MIX = mix64(np.arange(1, 1025, dtype=np.uint64))
    if len(lengths) and int(lengths.max()) < len(_LENGTH_MIX):
        return _LENGTH_MIX[lengths]
    return mix64(lengths.astype(np.uint64) + np.uint64(1))


def _hash_long(data, powers):
    """Hash of one value longer than a chunk, folded chunk by chunk in Python ints."""
    h = 0
    for lo in range(0, len(data), _CHUNK_BYTES):
        piece = data[lo:lo + _CHUNK_BYTES]
        part = int(np.multiply(piece, powers[: len(piece)], dtype=np.uint64).sum(dtype=np.uint64))
        h = (h + part * pow(int(_P), lo, 1 << 64)) % (1 << 64)
    return np.uint64(h)


def hash_array(arr):
    """uint64 hash of each value of an Arrow array (nulls must be removed first). A
    dictionary array hashes each dictionary value once and takes the hashes to the rows
    (the same words as hashing the decoded values: the hash is a function of the value)."""
    if isinstance(arr, pa.ChunkedArray):
        if pa.types.is_dictionary(arr.type) and arr.num_chunks != 1:   # own dictionaries
            return np.concatenate([np.zeros(0, np.uint64)]
                                  + [hash_array(chunk) for chunk in arr.chunks])
        arr = arr.combine_chunks() if arr.num_chunks != 1 else arr.chunk(0)
    if pa.types.is_dictionary(arr.type):
        indices = arr.indices
        if indices.null_count:
            indices = pc.fill_null(indices, 0)
        return hash_array(arr.dictionary)[indices.to_numpy(zero_copy_only=False)]
    t = arr.type
    if pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t) \
            or pa.types.is_large_binary(t):
        return _hash_binary(arr)
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        return mix64(_integer_words(arr) ^ np.uint64(0x9E3779B97F4A7C15))
    # Anything else (dates, floats, decimals): hash its canonical string form.
    return _hash_binary(canonical_text(arr))


def _integer_words(arr):
    """The 64-bit two's-complement word of each value of an integer/boolean Array, as
    uint64 (a bijection within one column type; uint64 values >= 2**63 included)."""
    t = arr.type
    if pa.types.is_unsigned_integer(t):
        return arr.cast(pa.uint64()).to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
    return arr.cast(pa.int64()).to_numpy(zero_copy_only=False).view(np.uint64)


def canonical_text(arr):
    """The text form that identifies a non-string, non-integer value (floats, dates,
    decimals): Arrow's cast to string, with -0.0 written as 0.0 (one value)."""
    if pa.types.is_floating(arr.type):
        arr = pc.if_else(pc.equal(arr, 0), pa.scalar(0.0, arr.type), arr)
    return pc.cast(arr, pa.string())


def hash_columns(table, columns, salt=0):
    """Combined hash of several columns of a table (order matters)."""
    h = np.full(table.num_rows, np.uint64(salt), dtype=np.uint64)
    for name in columns:
        h = mix64(h * np.uint64(0x9E3779B97F4A7C15) + hash_array(table.column(name)))
    return h

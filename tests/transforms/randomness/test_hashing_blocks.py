"""The string hash is computed chunk by chunk over the data buffer (chunks of whole values
up to the power table's size); values that straddle chunks, fill one or exceed one must
all hash as the plain-Python polynomial reference says, for every layout and offset width."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.transforms.randomness import hashing


def _reference(data: bytes) -> int:
    p = int(hashing._P)
    h = 0
    power = 1
    for byte in data:
        h = (h + byte * power) % (1 << 64)
        power = power * p % (1 << 64)
    length = hashing.mix64(np.array([len(data) + 1], dtype=np.uint64))
    return int(hashing.mix64(np.array([h], dtype=np.uint64) ^ length)[0])


def _values():
    rng = np.random.default_rng(4)
    block = hashing._CHUNK_BYTES
    values = [bytes(rng.integers(0, 256, int(n), dtype=np.uint8))
              for n in rng.integers(0, 300, 1500)]           # many blocks of short values
    values += [b"", b"b" * block, b"c" * (block - 1), b"d" * (block + 1), b"\x00" * 3,
               bytes(rng.integers(0, 256, 3 * block + 5, dtype=np.uint8))]  # > power table
    values += [bytes(rng.integers(0, 256, int(n), dtype=np.uint8))
               for n in rng.integers(0, 40, 500)]
    return values


@pytest.mark.parametrize("typ", [pa.binary(), pa.large_binary()])
def test_block_boundaries_match_reference(typ):
    values = _values()
    expected = [_reference(v) for v in values]
    arr = pa.array(values, type=typ)
    assert [int(h) for h in hashing.hash_array(arr)] == expected
    assert [int(h) for h in hashing.hash_array(arr.slice(1501))] == expected[1501:]


def test_strings_hash_as_their_utf8_bytes():
    text = [f"wörd{i}" * (i % 7) for i in range(3000)]
    raw = [t.encode("utf-8") for t in text]
    for typ in (pa.string(), pa.large_string()):
        got = hashing.hash_array(pa.array(text, type=typ))
        assert (got == hashing.hash_array(pa.array(raw, type=pa.binary()))).all()
    assert int(hashing.hash_array(pa.array(text[:5]))[3]) == _reference(raw[3])

"""The user identity PRF (transforms/user_identity.py) against an independent CBC-MAC.

The reference below encrypts one 16-byte block at a time (AES-256 in ECB mode, one call
per block) and chains the blocks in plain Python, on the documented message encoding;
the module computes the same function vectorised (block position by block position over
many ids) or, for long ids, with CBC mode."""
import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from thresher.transforms import user_identity as ui

KEY = bytes(range(32))


def _aes(key, block):
    encryptor = Cipher(algorithms.AES(key), modes.ECB()).encryptor()
    return encryptor.update(block) + encryptor.finalize()


def _reference_bytes(value, key=KEY):
    message = b"thr:str\x00" + len(value).to_bytes(8, "little") + value
    message += bytes(-len(message) % 16)
    state = bytes(16)
    for i in range(0, len(message), 16):
        state = _aes(key, bytes(a ^ b for a, b in zip(state, message[i:i + 16])))
    return (int.from_bytes(state[:8], "little"), int.from_bytes(state[8:], "little"))


def _reference_int(word, key=KEY):
    state = _aes(key, b"thr:int\x00" + (word % 2**64).to_bytes(8, "little"))
    return (int.from_bytes(state[:8], "little"), int.from_bytes(state[8:], "little"))


LENGTHS = [0, 1, 7, 8, 15, 16, 17, 31, 32, 33, 100, 1023, 1024, 1025, 1040, 5000]


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.large_string(), pa.binary(),
                                        pa.large_binary()])
def test_byte_ids_are_the_length_prefixed_cbc_mac(arrow_type):
    rng = np.random.default_rng(7)
    values = [bytes(rng.integers(97, 123, n, dtype=np.uint8)) for n in LENGTHS]
    arr = pa.array([v.decode() if pa.types.is_unicode(arrow_type) or
                    pa.types.is_large_unicode(arrow_type) else v for v in values], arrow_type)
    for view, expected in ((arr, values), (arr.slice(3, 9), values[3:12])):
        got = ui.identities_of_bytes(view, KEY)
        assert [tuple(int(w) for w in row) for row in got] == [_reference_bytes(v)
                                                                for v in expected]


def test_integer_ids_are_one_aes_block_of_their_word():
    words = [0, 1, -1, 2**63 - 1, -2**63, 12345]
    hi, lo = ui.identify(pa.array(words, pa.int64()), KEY)
    assert list(zip(hi.tolist(), lo.tolist())) == [_reference_int(w) for w in words]


def test_identify_maps_rows_through_their_distinct_ids():
    ids = pa.array(["b", "a", "b", "c" * 2000, "a"]).dictionary_encode()
    hi, lo = ui.identify(ids, KEY)
    assert list(zip(hi.tolist(), lo.tolist())) == [
        _reference_bytes(v.encode()) for v in ["b", "a", "b", "c" * 2000, "a"]]
    floats = ui.identify(pa.array([1.5, -0.0]), KEY)
    assert list(zip(*(w.tolist() for w in floats))) == [_reference_bytes(b"1.5"),
                                                         _reference_bytes(b"0")]

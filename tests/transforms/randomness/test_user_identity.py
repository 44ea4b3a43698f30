"""The user identity PRF (transforms/randomness/user_identity.py) against an independent CBC-MAC.

The reference below encrypts one 16-byte block at a time (AES-256 in ECB mode, one call
per block) and chains the blocks in plain Python, on the documented message encoding;
the module computes the same function vectorised (block position by block position over
many ids) or, for long ids, with CBC mode."""
import numpy as np
import pyarrow as pa
import pytest
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms, modes

from thresher.transforms.randomness import user_identity as ui

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
    floats = ui.identify(pa.array([1.5, -0.0]), KEY)       # -0.0 is the whole number 0
    assert list(zip(*(w.tolist() for w in floats))) == [_reference_bytes(b"1.5"),
                                                         _reference_int(0)]


def _reference_float(x, arrow_type=pa.float64()):
    """The documented rule (module docstring, "Type-stable ids"), written from Python's
    exact int/float comparison: a float equal to an integer in [-2**63, 2**64) is that
    integer's word, anything else its text (Arrow's cast, as the reference for text)."""
    if x == x and x not in (float("inf"), float("-inf")) and x == int(x) \
            and -2**63 <= int(x) < 2**64:
        return _reference_int(int(x))
    text = pa.compute.cast(pa.array([x], arrow_type), pa.string())[0].as_py()
    return _reference_bytes(text.encode())


FLOATS = [0.0, -0.0, 1.0, -1.0, 7.0, 0.5, -2.5, 1e-300, 2.0**52 + 1, 2.0**53, 2.0**62,
          2.0**63, 2.0**64 - 2048, 2.0**64, -2.0**63, -2.0**63 - 4096, 1e300, float("inf"),
          float("-inf")]


@pytest.mark.parametrize("arrow_type", [pa.float64(), pa.float32()])
def test_whole_floats_are_the_integer_they_equal(arrow_type):
    values = [x for x in FLOATS if arrow_type == pa.float64() or abs(x) < 3.4e38]
    arr = pa.array(values, pa.float64()).cast(arrow_type)
    hi, lo = ui.identify(arr, KEY)
    exact = [float(v) for v in arr.to_pylist()]          # what float32 holds
    assert list(zip(hi.tolist(), lo.tolist())) == [_reference_float(x, arrow_type) for x in exact]


def test_one_user_whatever_numeric_type_a_file_stored_it_in():
    """int64 1, uint8 1, True, float64 1.0 and float32 1.0 are one user; 2**63 as uint64
    and as float; -1 as int64 and -1.0 (the brief's int-vs-float split)."""
    one = [ui.identify(pa.array([v], t), KEY) for v, t in (
        (1, pa.int64()), (1, pa.uint8()), (True, pa.bool_()), (1.0, pa.float64()),
        (1.0, pa.float32()))]
    assert len({(int(h[0]), int(l[0])) for h, l in one}) == 1
    assert ui.identify(pa.array([2**63], pa.uint64()), KEY)[0][0] == \
        ui.identify(pa.array([2.0**63]), KEY)[0][0]
    assert ui.identify(pa.array([-1], pa.int64()), KEY)[0][0] == \
        ui.identify(pa.array([-1.0]), KEY)[0][0]
    # ... and text is not a number (Parquet files that disagree are refused instead)
    assert ui.identify(pa.array(["1"]), KEY)[0][0] != one[0][0][0]


def test_text_ids_of_a_text_format_name_numbers_by_their_integer():
    assert ui.text_ids(pa.array([1.0, -0.0, 1.5, 1e16, 2.0**63, -2.0**63, None])).to_pylist() \
        == ["1", "0", "1.5", "10000000000000000", "9223372036854775808",
            "-9223372036854775808", None]
    assert ui.text_ids(pa.array([10**16, -3])).to_pylist() == ["10000000000000000", "-3"]
    assert ui.text_ids(pa.array([True])).to_pylist() == ["true"]
    assert ui.text_ids(pa.array(["01", "1"])).to_pylist() == ["01", "1"]


@pytest.mark.parametrize("low, high", [(1, 16), (16, 16), (17, 32), (33, 48)])
def test_ids_of_one_block_count_are_the_cbc_mac(low, high):
    # issue 43: ids that all have one number of data blocks (most user ids: 1 to 16
    # bytes) take a path of their own in block_prf._mac_short (no ordering by length);
    # a sliced array starts mid-buffer
    rng = np.random.default_rng(43)
    values = [bytes(rng.integers(0, 256, int(rng.integers(low, high + 1)), dtype=np.uint8))
              for _ in range(300)]
    arr = pa.array(values, pa.binary())
    for view, expected in ((arr, values), (arr.slice(5, 200), values[5:205])):
        got = ui.identities_of_bytes(view, KEY)
        assert [tuple(int(w) for w in row) for row in got] == [_reference_bytes(v)
                                                                for v in expected]

"""The vectorised hashes are stable, agree with a plain-Python reference, and do not
depend on how a column is chunked or typed (string vs large_string vs dictionary)."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.transforms.randomness import hashing


def _reference(value: str) -> int:
    data = value.encode("utf-8")
    h = 0
    for k, byte in enumerate(data):
        h = (h + byte * pow(int(hashing._P), k, 1 << 64)) % (1 << 64)
    raw = np.array([h], dtype=np.uint64)
    length = hashing.mix64(np.array([len(data) + 1], dtype=np.uint64))
    return int(hashing.mix64(raw ^ length)[0])


def test_string_hash_matches_python_reference():
    values = ["", "a", "bb", "héllo wörld", "x" * 1000, "\u4e2d\u6587", "a\x00b"]
    got = hashing.hash_array(pa.array(values))
    assert [int(g) for g in got] == [_reference(v) for v in values]


def test_hash_independent_of_layout():
    rng = np.random.default_rng(3)
    values = [f"user{i}" for i in rng.integers(0, 5000, 20000)]
    plain = hashing.hash_array(pa.array(values))
    large = hashing.hash_array(pa.array(values, type=pa.large_string()))
    dictionary = hashing.hash_array(pa.array(values).dictionary_encode())
    chunked = hashing.hash_array(pa.chunked_array([pa.array(values[:7]), pa.array(values[7:])]))
    sliced = hashing.hash_array(pa.array(values).slice(11))
    assert (plain == large).all() and (plain == dictionary).all() and (plain == chunked).all()
    assert (plain[11:] == sliced).all()


def test_distinct_values_get_distinct_hashes():
    values = pa.array([f"k{i}" for i in range(200_000)])
    assert len(np.unique(hashing.hash_array(values))) == 200_000


def test_integer_and_multi_column_hashes():
    ints = pa.array([1, 2, 1, 3], type=pa.int32())
    h = hashing.hash_array(ints)
    assert h[0] == h[2] and len(set(h.tolist())) == 3
    table = pa.table({"a": ["x", "x", "y"], "b": [1, 2, 1]})
    hc = hashing.hash_columns(table, ["a", "b"])
    assert len(set(hc.tolist())) == 3
    swapped = hashing.hash_columns(pa.table({"a": ["x", "y"], "b": [1, 1]}), ["a", "b"])
    assert swapped[0] == hc[0]


def test_value_longer_than_a_chunk():
    long_value = "z" * (hashing._CHUNK_BYTES + 17)
    h = hashing.hash_array(pa.array([long_value, "z"]))
    assert int(h[0]) == _reference(long_value)


@pytest.mark.parametrize("shards", [1, 4, 97])
def test_mix64_is_a_bijection_on_samples(shards):
    x = np.arange(100_000, dtype=np.uint64) * np.uint64(shards)
    assert len(np.unique(hashing.mix64(x))) == len(np.unique(x))


def test_dictionary_columns_hash_as_their_decoded_values():
    # issue 43: a dictionary column (Parquet text keys as read) is hashed per dictionary
    # value and taken to the rows; chunks carry dictionaries of their own
    first = pa.array(["ka", "lo", "ka", "", "mi" * 40]).dictionary_encode()
    second = pa.DictionaryArray.from_arrays(pa.array([2, 0, 0, 1], pa.int32()),
                                            pa.array(["zz", "ka", "é"]))
    chunked = pa.chunked_array([first, second])
    decoded = pa.array(["ka", "lo", "ka", "", "mi" * 40, "é", "zz", "zz", "ka"])
    assert np.array_equal(hashing.hash_array(chunked), hashing.hash_array(decoded))
    assert np.array_equal(hashing.hash_array(second), hashing.hash_array(decoded[5:]))
    table = pa.table({"k": chunked, "j": decoded})
    plain = pa.table({"k": decoded, "j": decoded})
    assert np.array_equal(hashing.hash_columns(table, ["k", "j"]),
                          hashing.hash_columns(plain, ["k", "j"]))

"""Text user ids are identified from the Parquet file's dictionary (issue 34, item 5).

``pipelines.dataio.io._read_row_group`` reads a text user column as a dictionary, and
``prepare_batch`` identifies each dictionary value once and takes the identities to the
rows, instead of decoding the ids and hashing every row's id again. Checked: the
prepared batch (identity words, keys, drop counts) is exactly that of the decoded
column, with null and empty ids, with binary ids, for a file whose dictionary pages fell
back to plain encoding, and for a column of several chunks, each with its own
dictionary. Exact comparisons, no randomness.
"""
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.dataio import io as pio
from thresher.transforms.randomness.user_identity import TEST_KEY


def _table(binary=False):
    ids = [None if i % 97 == 0 else "" if i % 89 == 0 else f"user-{(i * 7919) % 1500}"
           for i in range(6000)]
    words = [None if i % 101 == 0 else f"w{i % 37}" for i in range(6000)]
    user = pa.array([None if v is None else v.encode() for v in ids], pa.binary()) \
        if binary else pa.array(ids, pa.string())
    return pa.table({"user_id": user, "word": pa.array(words)})


@pytest.mark.parametrize("binary", [False, True])
@pytest.mark.parametrize("page_limit", [None, 256])
def test_text_user_ids_are_identified_from_the_file_dictionary(tmp_path, binary, page_limit):
    table = _table(binary)
    path = str(tmp_path / "ids.parquet")
    options = {} if page_limit is None else {"dictionary_pagesize_limit": page_limit}
    pq.write_table(table, path, row_group_size=4000, **options)
    for group in range(pq.ParquetFile(path).metadata.num_row_groups):
        read, text_keys = pio._read_row_group(path, group, ["user_id", "word"], ["word"],
                                              "user_id")
        assert pa.types.is_dictionary(read.column("user_id").type)   # never decoded
        read = pio._decoded(read, text_keys)
        plain = pq.ParquetFile(path).read_row_group(group)
        expected, expected_drops = pio.prepare_batch(plain, "user_id", ["word"],
                                                     identity_key=TEST_KEY)
        prepared, drops = pio.prepare_batch(read, "user_id", ["word"], identity_key=TEST_KEY)
        assert prepared.equals(expected) and drops == expected_drops
        assert drops["rows_dropped_null_or_empty_user"] > 0 and expected.num_rows > 1000


def test_chunks_with_their_own_dictionaries():
    table = _table()
    halves = [table.column("user_id").slice(0, 2500).combine_chunks().dictionary_encode(),
              table.column("user_id").slice(2500).combine_chunks().dictionary_encode()]
    chunked = table.set_column(0, "user_id", pa.chunked_array(halves))
    assert len(halves[0].dictionary) != len(halves[1].dictionary)
    expected = pio.prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY)
    prepared = pio.prepare_batch(chunked, "user_id", ["word"], identity_key=TEST_KEY)
    assert prepared[0].equals(expected[0]) and prepared[1] == expected[1]

"""An over-long key is refused before its column is decoded (issue 30 D15).

A Parquet file repeating one key of MAX_KEY_BYTES + 1 bytes on many rows is tiny on disk
(the key is stored once, dictionary-encoded) but decodes to rows x 64 KiB: a 229 KB file
peaked at 3.0 GB before its refusal. The reader now reads text key columns as
dictionaries and measures the dictionary (pipelines/dataio/io.py ``_read_row_group``,
``check_key_sizes``). Checked in a fresh process, whose Arrow memory pool's peak
(``max_memory``, a byte count, not a time) must stay far below the decoded size (2,000
rows: 131 MB decoded; the peak is about 1 MB).
"""
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq

from thresher.pipelines.dataio.io import MAX_KEY_BYTES

ROWS = 2000

_CHILD = """
import sys
import pyarrow as pa
from thresher.pipelines.dataio.io import _ReadParquetRowGroup
from thresher.pipelines.errors import InputError
try:
    list(_ReadParquetRowGroup(["user_id", "word"], keys=("word",)).process((sys.argv[1], 0)))
    print("accepted")
except InputError as exc:
    print(pa.default_memory_pool().max_memory())
    print(exc)
"""


def test_long_key_is_refused_before_the_column_is_decoded(tmp_path):
    path = str(tmp_path / "long.parquet")
    key = "x" * (MAX_KEY_BYTES + 1)
    pq.write_table(pa.table({"user_id": [f"u{i % 50}" for i in range(ROWS)],
                             "word": [key] * ROWS}), path, compression="zstd")
    assert os.path.getsize(path) < 100_000
    out = subprocess.run([sys.executable, "-c", _CHILD, path], capture_output=True,
                         text=True, check=True, timeout=300).stdout.splitlines()
    assert out[0] != "accepted", out
    peak, message = int(out[0]), out[1]
    assert "row 1: column 'word' holds a key of 65,537 bytes" in message, message
    decoded = ROWS * (MAX_KEY_BYTES + 1)
    assert peak < decoded / 10, (peak, decoded)

"""A Parquet file's footer is parsed once per reading worker, not once per row group
(issue 43, item 3: 1e8 rows in 1,000 row groups parsed 2,000 footers of 1,000 groups,
~2.7 s of CPU growing as groups^2), and a kept footer is re-verified before each use: a
file replaced under the same path is parsed again."""
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.testing import test_pipeline
from apache_beam.testing.util import assert_that, equal_to

from thresher.pipelines.dataio import io


def _write(path, rows, groups, seed):
    rng = np.random.default_rng(seed)
    table = pa.table({"user_id": [f"u{i}" for i in rng.integers(0, 50, rows)],
                      "word": [f"w{i}" for i in rng.integers(0, 20, rows)]})
    pq.write_table(table, path, row_group_size=rows // groups)
    return table


def test_a_footer_is_parsed_once_and_reparsed_when_the_file_changes(tmp_path, monkeypatch):
    path = str(tmp_path / "data.parquet")
    _write(path, 400, 8, seed=1)
    parsed = []
    real = pq.read_metadata
    monkeypatch.setattr(io.pq, "read_metadata", lambda p: parsed.append(p) or real(p))
    footers = io._Footers()
    first = footers.get(path)
    assert footers.get(path) is first and first.num_row_groups == 8
    assert parsed == [path]
    _write(str(tmp_path / "other.parquet"), 500, 5, seed=2)
    os.replace(str(tmp_path / "other.parquet"), path)     # a new file under the same path
    second = footers.get(path)
    assert second.num_row_groups == 5 and len(parsed) == 2


def test_row_groups_read_with_a_kept_footer_are_the_file(tmp_path, monkeypatch):
    """Every row group of a 40-group file read through the DoFn: the rows of the file,
    with far fewer footer parses than groups (one per DoFn instance)."""
    path = str(tmp_path / "data.parquet")
    table = _write(path, 4000, 40, seed=3)
    parsed = []
    real = pq.read_metadata
    monkeypatch.setattr(io.pq, "read_metadata", lambda p: parsed.append(p) or real(p))
    expected = sorted(zip(table.column("user_id").to_pylist(), table.column("word").to_pylist()))
    with test_pipeline.TestPipeline() as p:
        rows = (p | beam.Create([(path, g) for g in range(40)])
                | beam.ParDo(io._ReadParquetRowGroup(["user_id", "word"], keys=["word"],
                                                     user="user_id"))
                | beam.FlatMap(lambda t: zip(t.column("user_id").to_pylist(),
                                             t.column("word").cast(pa.string()).to_pylist())))
        assert_that(rows, equal_to(expected))
    assert 1 <= len(parsed) <= 4, len(parsed)


def test_the_kept_footers_are_bounded_least_recently_used_first(tmp_path, monkeypatch):
    """Many input files: the kept footers' serialized bytes stay within the bound, the
    least recently used dropped first (not the oldest parsed), a one-group file's footer is
    never kept, a kept footer is parsed once while its file is read group after group, a
    replaced file's bytes leave the account, and a footer over the bound is kept while it
    is the newest."""
    paths = []
    for i in range(12):
        paths.append(str(tmp_path / f"part{i}.parquet"))
        _write(paths[-1], 100, 4, seed=10 + i)          # 4 row groups each
    size = max(pq.read_metadata(p).serialized_size for p in paths)
    parsed = []
    real = pq.read_metadata
    monkeypatch.setattr(io.pq, "read_metadata", lambda p: parsed.append(p) or real(p))
    footers = io._Footers(max_bytes=2 * size + size // 2)    # room for two
    for path in paths:
        for _ in range(4):                               # the file's groups, one by one
            assert footers.get(path).num_row_groups == 4
        assert footers.kept()[1] <= 2 * size + size // 2
    assert parsed == paths                               # each parsed once while read
    assert footers.kept()[0] == paths[-2:]
    footers.get(paths[-2])                               # used: now the most recent
    footers.get(paths[0])                                # evicts paths[-1], not paths[-2]
    assert footers.kept()[0] == [paths[-2], paths[0]]
    assert parsed.count(paths[-2]) == 1 and parsed[-1] == paths[0]
    single = str(tmp_path / "single.parquet")
    _write(single, 100, 1, seed=30)
    footers.get(single)
    footers.get(single)
    assert parsed[-2:] == [single, single] and single not in footers.kept()[0]
    # a file replaced under a kept path: its old footer's bytes leave the account
    _write(str(tmp_path / "new.parquet"), 100, 1, seed=31)
    os.replace(str(tmp_path / "new.parquet"), paths[0])
    assert footers.get(paths[0]).num_row_groups == 1
    kept, total = footers.kept()
    assert kept == [paths[-2]] and total == real(paths[-2]).serialized_size
    # a file bigger than the bound is still kept while it is the newest
    big = str(tmp_path / "big.parquet")
    _write(big, 4000, 200, seed=40)
    assert real(big).serialized_size > 2 * size + size // 2
    footers.get(big)
    footers.get(big)
    assert parsed.count(big) == 1 and footers.kept()[0] == [big]

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


def test_the_kept_footers_are_bounded_by_their_row_groups(tmp_path, monkeypatch):
    """Many input files: the kept footers describe at most the bound's row groups (the
    least recently used dropped first), a one-group file's footer is never kept, and a
    kept footer is still parsed once while its file is read group after group."""
    paths = []
    for i in range(12):
        paths.append(str(tmp_path / f"part{i}.parquet"))
        _write(paths[-1], 100, 4, seed=10 + i)          # 4 row groups each
    single = str(tmp_path / "single.parquet")
    _write(single, 100, 1, seed=30)
    parsed = []
    real = pq.read_metadata
    monkeypatch.setattr(io.pq, "read_metadata", lambda p: parsed.append(p) or real(p))
    footers = io._Footers(max_groups=10)
    for path in paths:
        for _ in range(4):                               # the file's groups, one by one
            assert footers.get(path).num_row_groups == 4
        assert footers.kept_groups() <= 10
    assert parsed == paths                               # each parsed once while read
    footers.get(single)
    footers.get(single)
    assert parsed[-2:] == [single, single] and footers.kept_groups() <= 10
    # the two most recent files are kept (8 groups), the older ones were dropped
    footers.get(paths[-1])
    footers.get(paths[0])
    assert parsed[-1] == paths[0] and parsed.count(paths[-1]) == 1
    # a file bigger than the bound is still kept while it is the newest
    big = str(tmp_path / "big.parquet")
    _write(big, 400, 20, seed=40)
    footers.get(big)
    footers.get(big)
    assert parsed.count(big) == 1 and footers.kept_groups() == 20

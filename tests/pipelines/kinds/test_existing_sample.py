"""Releasing an existing weighted sample through `input.sample` (paper 001's
post-processing use): spec checks, the real pipeline, and the report's stated assumption."""
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.cli import main


@pytest.fixture
def sample_spec(tmp_path):
    freq = pa.table({"word": [f"w{i}" for i in range(300)] + [None],
                     "frequency": list(range(1, 301)) + [5]})
    pq.write_table(freq, tmp_path / "sample.parquet")

    def _spec(extra=""):
        path = tmp_path / "s.yaml"
        path.write_text(
            f"name: s\ninput:\n  path: {tmp_path / 'sample.parquet'}\n  keys: [word]\n"
            f"  sample: {{frequency: frequency, scheme: none}}\n{extra}"
            f"privacy: {{epsilon: 1.0, delta: 1.0e-8}}\nbounding: {{max_keys_per_user: 4}}\n"
            f"mechanism: {{kind: weighted_sampling}}\noutput: {{path: {tmp_path / 'out'}}}\n")
        return str(path)
    return _spec


def test_existing_sample_release(sample_spec, tmp_path, capsys):
    assert main(["run", sample_spec()]) == 0
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    assert report["mechanism"]["presampled"] is True
    assert "drawn as declared" in report["privacy"]["assumes"]
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert released.schema.names == ["word", "token", "estimate"]
    # keys far above the reporting threshold are released, keys far below are not
    words = set(released.column("word").to_pylist())
    threshold = report["mechanism"]["threshold"]
    assert {f"w{i}" for i in range(299, 300)} <= words
    assert not {f"w{i}" for i in range(0, max(1, threshold // 4))} & words
    assert report["released_keys"] == released.num_rows


@pytest.mark.parametrize("extra,field", [
    ("  user: user_id\n", "input.user"),
])
def test_existing_sample_spec_errors(sample_spec, capsys, extra, field):
    assert main(["validate", sample_spec(extra)]) == 2
    assert field in capsys.readouterr().err


def test_existing_sample_needs_weighted_sampling_and_fixed_bound(sample_spec, capsys, tmp_path):
    text = open(sample_spec()).read()
    bad_kind = tmp_path / "k.yaml"
    bad_kind.write_text(text.replace("kind: weighted_sampling", "kind: gaussian"))
    assert main(["validate", str(bad_kind)]) == 2
    assert "mechanism.kind" in capsys.readouterr().err
    bad_bound = tmp_path / "b.yaml"
    bad_bound.write_text(text.replace("max_keys_per_user: 4", "max_keys_per_user: auto"))
    assert main(["validate", str(bad_bound)]) == 2
    assert "bounding.max_keys_per_user" in capsys.readouterr().err

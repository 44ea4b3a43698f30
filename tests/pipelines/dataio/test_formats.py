"""YAML and input files as people write them: exponent floats, globs, gzip, TSV and other
delimiters, and a JSON array where JSONL is expected (pipelines/dataio/formats.py)."""
import gzip
import json
import os

import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run

BASE = """name: t
input: {{path: {path}, user: user_id, keys: [word]{extra}}}
privacy: {{epsilon: {epsilon}, delta: {delta}}}
bounding: {{max_keys_per_user: 1000}}
mechanism: {{kind: gaussian}}
output: {{path: {out}}}
"""


def _spec(tmp_path, path, *, epsilon="1.0", delta="1e-8", extra="", name="spec.yaml"):
    spec = tmp_path / name
    spec.write_text(BASE.format(path=path, epsilon=epsilon, delta=delta, extra=extra,
                                out=tmp_path / "out"))
    return str(spec)


@pytest.mark.parametrize("epsilon, delta", [("1.0", "1e-8"), ("1e0", "1E-6"), ("1e308", "1.0e-6"),
                                            ("2", "+5e-7")])
def test_exponent_floats_are_numbers(tmp_path, small_parquet, epsilon, delta):
    spec = spec_mod.load(_spec(tmp_path, small_parquet, epsilon=epsilon, delta=delta))
    assert spec.privacy.epsilon == float(epsilon) and spec.privacy.delta == float(delta)


def test_exponent_floats_in_nested_sections(write_spec, tmp_path):
    text = open(write_spec()).read().replace("max_keys_per_user: 8", (
        "max_keys_per_user: auto\n  auto: {epsilon: 1e-1, dropped_weight: 2e0, objective: l1}"))
    spec = spec_mod.parse(spec_mod.load_yaml(text), text)
    assert spec.bounding.auto.epsilon == 0.1 and spec.bounding.auto.dropped_weight == 2.0


def test_an_infinite_exponent_float_is_refused_as_a_number(tmp_path, small_parquet, capsys):
    assert main(["validate", _spec(tmp_path, small_parquet, epsilon="1e309")]) == 2
    assert capsys.readouterr().err.strip() == "thresher: error: privacy.epsilon: must be finite, got inf"


def test_quoted_exponent_stays_a_string(tmp_path, small_parquet, capsys):
    assert main(["validate", _spec(tmp_path, small_parquet, delta="'1e-8'")]) == 2
    assert ("privacy.delta: must be a number > 0 and < 1, got str '1e-8'"
            in capsys.readouterr().err)


@pytest.mark.parametrize("pattern, fmt, delimiter", [
    ("data/*.parquet", "parquet", ","), ("data/part-*.csv.gz", "csv", ","),
    ("data/*.tsv", "csv", "\t"), ("logs/2024-??.jsonl.gz", "jsonl", ","),
    ("data/[ab].ndjson", "jsonl", ","), ("x/*.PQ", "parquet", ","),
])
def test_format_from_globs_and_compressed_names(pattern, fmt, delimiter):
    parsed = spec_mod._parse_input({"path": pattern, "user": "u", "keys": ["k"]})
    assert (parsed.format, parsed.delimiter) == (fmt, delimiter)


@pytest.mark.parametrize("pattern", ["data/*", "data/*.txt", "data/*.parquet.gz"])
def test_unknown_names_ask_for_input_format(pattern):
    with pytest.raises(spec_mod.SpecError, match="^input.format: cannot tell the format"):
        spec_mod._parse_input({"path": pattern, "user": "u", "keys": ["k"]})


def test_the_readme_glob_validates(tmp_path, small_parquet, capsys):
    folder = tmp_path / "data"
    folder.mkdir()
    table = pq.read_table(small_parquet)
    pq.write_table(table.slice(0, 10000), folder / "a.parquet")
    pq.write_table(table.slice(10000), folder / "b.parquet")
    assert main(["validate", _spec(tmp_path, str(folder / "*.parquet"))]) == 0
    assert "valid (gaussian, 2 input files;" in capsys.readouterr().out


def _write_text(table, path, fmt, delimiter=","):
    opener = gzip.open if str(path).endswith(".gz") else open
    if fmt == "csv":
        import io as _io
        buf = _io.BytesIO()
        pcsv.write_csv(table, buf, pcsv.WriteOptions(delimiter=delimiter))
        with opener(path, "wb") as handle:
            handle.write(buf.getvalue())
    else:
        with opener(path, "wt") as handle:
            for row in table.to_pylist():
                handle.write(json.dumps(row) + "\n")


@pytest.mark.parametrize("name, fmt, delimiter, extra", [
    ("data.csv.gz", "csv", ",", ""),
    ("data.jsonl.gz", "jsonl", ",", ""),
    ("data.tsv", "csv", "\t", ""),
    ("data.csv", "csv", ";", ", delimiter: ';'"),
    ("data.txt", "csv", "|", ", format: csv, delimiter: '|'"),
])
def test_text_variants_release_the_true_keys(tmp_path, small_parquet, name, fmt, delimiter, extra):
    table = pq.read_table(small_parquet)
    path = tmp_path / name
    _write_text(table, path, fmt, delimiter)
    spec = spec_mod.load(_spec(tmp_path, path, extra=extra))
    assert spec.input.format == fmt and spec.input.delimiter == delimiter
    report = run(make_plan(spec))
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert released.num_rows == report["released_keys"] > 0
    # Bound 1000 does not bind: counts are distinct users per word plus noise (7 sigma:
    # a false failure has probability below 1e-11 per key).
    pairs = table.group_by(["user_id", "word"]).aggregate([])
    truth = dict(zip(*pairs.group_by(["word"]).aggregate([([], "count_all")]).to_pydict().values()))
    sigma = report["mechanism"]["sigma"]
    for word, count in zip(released.column("word").to_pylist(), released.column("count").to_pylist()):
        assert abs(count - truth[word]) <= 7 * sigma


def test_delimiter_errors(tmp_path, small_parquet, capsys):
    assert main(["validate", _spec(tmp_path, small_parquet, extra=", delimiter: ';'")]) == 2
    assert "input.delimiter: is only for csv input, not parquet" in capsys.readouterr().err
    csv = tmp_path / "d.csv"
    csv.write_text("user_id,word\n1,a\n")
    assert main(["validate", _spec(tmp_path, csv, extra=", delimiter: ';;'")]) == 2
    assert "input.delimiter: must be one character" in capsys.readouterr().err


def test_a_json_array_in_a_jsonl_file_says_one_object_per_line(tmp_path, capsys):
    path = tmp_path / "rows.jsonl"
    path.write_text(json.dumps([{"user_id": i, "word": "w"} for i in range(5)], indent=1))
    assert main(["validate", _spec(tmp_path, path)]) == 2
    err = capsys.readouterr().err
    assert "one object per line" in err and "JSON array" in err and str(path) in err
    assert len(err.strip().splitlines()) == 1
    assert main(["run", _spec(tmp_path, path)]) == 2
    assert "one object per line" in capsys.readouterr().err
    assert not os.path.exists(tmp_path / "out")

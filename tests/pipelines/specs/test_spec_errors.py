"""Every spec error is one line naming the field and what is allowed, with exit code 2
and no traceback (thresher validate, in process)."""
import os

import pytest

from thresher.pipelines.cli import main


def _validate(path, capsys):
    rc = main(["validate", path])
    captured = capsys.readouterr()
    return rc, captured.err


@pytest.mark.parametrize("changes,field,allowed", [
    ({"extra": 1}, "extra", "unknown field"),
    ({"input.columns": ["a"]}, "input.columns", "unknown field"),
    ({"mechanism.noise_law": "cauchy"}, "mechanism.noise_law", "unknown field"),
    ({"mechanism.noise": "cauchy"}, "mechanism.noise", "one of discrete_gaussian, correlated, auto"),
    ({"privacy.epsilon": 0}, "privacy.epsilon", "must be > 0"),
    ({"privacy.epsilon": -1}, "privacy.epsilon", "must be > 0"),
    ({"privacy.epsilon": "one"}, "privacy.epsilon", "must be a number"),
    ({"privacy.epsilon": True}, "privacy.epsilon", "must be a number"),
    ({"privacy.delta": 0}, "privacy.delta", "must be > 0 and < 1"),
    ({"privacy.delta": 1}, "privacy.delta", "must be > 0 and < 1"),
    ({"privacy.delta": 1.5}, "privacy.delta", "must be > 0 and < 1"),
    ({"bounding.max_keys_per_user": 0}, "bounding.max_keys_per_user", ">= 1"),
    ({"bounding.max_keys_per_user": 2.5}, "bounding.max_keys_per_user", "integer"),
    ({"bounding.max_keys_per_user": "many"}, "bounding.max_keys_per_user", "auto"),
    ({"bounding.model": "l2"}, "bounding.model", "l0, l1"),
    ({"bounding.max_keys_per_user": "auto", "bounding.auto": {"dropped_weight": 0.5}},
     "bounding.auto.dropped_weight", ">= 1"),
    ({"bounding.max_keys_per_user": "auto", "bounding.auto": {"dropped_weight": "heavy"}},
     "bounding.auto.dropped_weight", "balanced, paper or a number"),
    ({"bounding.max_keys_per_user": "auto", "bounding.auto": {"dropped_weight": True}},
     "bounding.auto.dropped_weight", "balanced, paper or a number >= 1"),
    ({"bounding.max_keys_per_user": "auto", "bounding.auto": {"objective": "count"}},
     "bounding.auto.objective", "keys, l1"),
    ({"bounding.max_keys_per_user": "auto", "bounding.auto": {"dropped_weight": 2}},
     "bounding.auto.dropped_weight", "only applies with bounding.auto.objective: l1"),
    ({"mechanism.kind": "cauchy"}, "mechanism.kind", "gaussian, laplace"),
    ({"mechanism.pre_threshold": 0}, "mechanism.pre_threshold", ">= 1"),
    ({"mechanism.sigma": -2}, "mechanism.sigma", "> 0"),
    ({"input.keys": []}, "input.keys", "non-empty list"),
    ({"input.keys": ["word", "word"]}, "input.keys", "twice"),
    ({"input.keys": ["count"]}, "input.keys[0]", "rename"),
    ({"input.user": 5}, "input.user", "non-empty string"),
    ({"input.format": "xlsx"}, "input.format", "parquet, csv, jsonl"),
    ({"input.path": "/nonexistent/data.parquet"}, "input.path", "does not exist"),
    ({"input.path": "/nonexistent/*.parquet"}, "input.path", "matches no files"),
    ({"input.user": "uid"}, "input.user", "column 'uid' is not in"),
    ({"input.keys": ["word", "lang"]}, "input.keys[1]", "column 'lang' is not in"),
])
def test_spec_error_names_field(write_spec, capsys, changes, field, allowed):
    rc, err = _validate(write_spec(changes), capsys)
    assert rc == 2
    assert err.startswith("thresher: error: "), err
    assert field in err and allowed in err, err
    assert "Traceback" not in err and err.count("\n") == 1


@pytest.mark.parametrize("section", ["name", "input", "privacy", "bounding", "mechanism", "output"])
def test_missing_required_section(write_spec, capsys, delete, section):
    rc, err = _validate(write_spec({section: delete}), capsys)
    assert rc == 2 and f"{section}: is required" in err


@pytest.mark.parametrize("text,needle", [
    ("name: [unclosed\n", "malformed YAML: line"),
    ("name: !!python/object/apply:os.system ['echo pwned']\n", "!!python"),
    ("name: a\nname: b\n", "duplicate key 'name'"),
    ("- just\n- a list\n", "must be a YAML mapping"),
    ("", "must be a YAML mapping"),
])
def test_malformed_yaml(write_spec, capsys, text, needle):
    rc, err = _validate(write_spec(text=text), capsys)
    assert rc == 2 and needle in err, err


def test_python_tag_is_never_executed(write_spec, capsys, tmp_path):
    marker = tmp_path / "pwned"
    text = f"name: !!python/object/apply:os.system ['touch {marker}']\n"
    rc, _ = _validate(write_spec(text=text), capsys)
    assert rc == 2 and not marker.exists()


def test_missing_spec_file(capsys, tmp_path):
    rc, err = _validate(str(tmp_path / "nope.yaml"), capsys)
    assert rc == 2 and "does not exist" in err


def test_output_holding_a_release_needs_overwrite(write_spec, capsys, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    (out / "release_report.json").write_text("{}")
    path = write_spec()
    rc = main(["run", path])
    err = capsys.readouterr().err
    assert rc == 2 and "output.path" in err and "--overwrite" in err
    assert os.listdir(out) == ["release_report.json"]


def test_fixed_parameters_that_miss_the_budget_refuse_to_run(write_spec, capsys):
    rc, err = _validate(write_spec({"mechanism.sigma": 1.0, "mechanism.threshold": 3}), capsys)
    assert rc == 2 and "gaussian release" in err, err


def test_valid_spec(write_spec, capsys):
    rc = main(["validate", write_spec()])
    assert rc == 0 and "valid" in capsys.readouterr().out


def test_usage_errors_exit_2(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["frobnicate"])
    assert exc.value.code == 2
    assert main(["plan", "x.yaml", "--", "--runner=DirectRunner"]) == 2

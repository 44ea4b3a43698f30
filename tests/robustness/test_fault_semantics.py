"""Fault semantics of ``thresher run``: replayed bundles give one consistent release, an
earlier release is never overwritten without ``--overwrite`` (nor lost when a replacing
run fails), and a failed run publishes nothing."""
import glob
import importlib.util
import os

import pyarrow.parquet as pq
import pytest

from tests.robustness.conftest import (assert_clean_error, assert_nothing_published, read_release,
                                       run_cli, words_table, write_parquet, write_spec)


def _consistent(output):
    """The folder holds exactly one release whose parts agree with each other."""
    assert sorted(os.listdir(output)) == ["release_report.json", "released.parquet"], os.listdir(output)
    assert not glob.glob(f"{output}.tmp-*") and not glob.glob(f"{output}.old-*")
    report, table = read_release(output)
    assert report["released_keys"] == table.num_rows > 0
    words = table.column("word").to_pylist()
    assert len(set(words)) == len(words), "a key was released twice"
    if "threshold" in report["mechanism"] and "count" in table.column_names:
        assert all(c >= report["mechanism"]["threshold"] for c in table.column("count").to_pylist())
    return report, table


KINDS = [kind for kind in ("gaussian", "laplace", "sample_and_threshold", "weighted_sampling")
         if importlib.util.find_spec(f"thresher.pipelines.kinds.{kind}") is not None]


@pytest.mark.parametrize("kind", KINDS)
def test_replayed_bundles_give_one_consistent_release(tmp_path, kind):
    """--direct_runner_bundle_repeat=2 makes the runner process every bundle twice (as a
    retrying runner may): the output must still be one release, each key once."""
    data = write_parquet(tmp_path / "in.parquet", words_table(n_users=5000))
    spec, output = write_spec(tmp_path, data)
    if kind != "gaussian":
        import yaml
        doc = yaml.safe_load(open(spec))
        doc["mechanism"] = {"kind": kind}
        yaml.safe_dump(doc, open(spec, "w"))
    code, _, err = run_cli("run", spec, "--", "--direct_runner_bundle_repeat=2")
    assert code == 0, err
    assert "Traceback" not in err
    _consistent(output)


@pytest.mark.skipif(importlib.util.find_spec("thresher.transforms.bounding.choose_contribution_bound") is None,
                    reason="transforms/bounding/choose_contribution_bound.py does not exist yet")
def test_replayed_bundles_choose_one_bound(tmp_path):
    data = write_parquet(tmp_path / "in.parquet", words_table(n_users=5000))
    spec, output = write_spec(tmp_path, data, max_keys_per_user="auto")
    code, _, err = run_cli("run", spec, "--", "--direct_runner_bundle_repeat=2")
    assert code == 0, err
    report, _ = _consistent(output)
    assert report["bounding"]["chosen_by"] != "spec"


def test_rerun_refuses_to_overwrite_and_keeps_the_earlier_release(tmp_path):
    data = write_parquet(tmp_path / "in.parquet", words_table())
    spec, output = write_spec(tmp_path, data)
    assert run_cli("run", spec)[0] == 0
    before = {f: open(os.path.join(output, f), "rb").read() for f in os.listdir(output)}
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "output.path", "--overwrite")
    assert {f: open(os.path.join(output, f), "rb").read() for f in os.listdir(output)} == before
    code, _, err = run_cli("run", spec, "--overwrite")
    assert code == 0, err
    _consistent(output)
    assert open(os.path.join(output, "released.parquet"), "rb").read() != before["released.parquet"]


def test_failed_overwrite_keeps_the_earlier_release(tmp_path):
    """--overwrite replaces a release only once the new one is complete."""
    data = write_parquet(tmp_path / "in.parquet", words_table())
    spec, output = write_spec(tmp_path, data)
    assert run_cli("run", spec)[0] == 0
    before = {f: open(os.path.join(output, f), "rb").read() for f in os.listdir(output)}
    bad = tmp_path / "bad.jsonl"
    bad.write_bytes(b'{"user_id": "u1", "word": "ok"}\n{"user_id": "u2", "word": "\xff"}\n')
    import yaml
    doc = yaml.safe_load(open(spec))
    doc["input"].update(path=str(bad), format="jsonl")
    yaml.safe_dump(doc, open(spec, "w"))
    code, _, err = run_cli("run", spec, "--overwrite")
    assert_clean_error(code, err, "bad.jsonl")
    assert {f: open(os.path.join(output, f), "rb").read() for f in os.listdir(output)} == before
    assert not glob.glob(f"{output}.tmp-*") and not glob.glob(f"{output}.old-*")


def test_output_path_that_is_a_file_is_refused(tmp_path):
    data = write_parquet(tmp_path / "in.parquet", words_table())
    spec, output = write_spec(tmp_path, data)
    open(output, "w").write("not a folder")
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "output.path")
    assert open(output).read() == "not a folder"


def test_a_failed_run_publishes_nothing(tmp_path):
    bad = tmp_path / "in.csv"
    bad.write_bytes(b"user_id,word\n" + b"".join(b"u%d,w\n" % i for i in range(100)) + b"u,\xfe\n")
    spec, output = write_spec(tmp_path, bad, fmt="csv")
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "in.csv")
    assert_nothing_published(output)


@pytest.mark.slow
def test_replayed_bundles_in_a_fresh_interpreter(tmp_path):
    data = write_parquet(tmp_path / "in.parquet", words_table(n_users=5000))
    spec, output = write_spec(tmp_path, data)
    code, _, err = run_cli("run", spec, "--", "--direct_runner_bundle_repeat=2", in_process=False)
    assert code == 0 and "Traceback" not in err, err
    _consistent(output)
    table = pq.read_table(os.path.join(output, "released.parquet"))
    assert table.schema.names == ["word", "count", "count_low", "count_high"]

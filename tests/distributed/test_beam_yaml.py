"""Beam YAML: thresher's release called from a Beam YAML pipeline through a
``providers:`` entry (pipelines/beam_yaml.py, configs/beam_yaml/quickstart_release.yaml).

The shipped example runs with ``python -m apache_beam.yaml.main`` (needs the ``yaml``
extra) on two worker processes; its report must carry the parameters ``thresher plan``
computes for the equivalent ``thresher run`` spec (configs/examples/quickstart.yaml), and
its released rows pass the same count check as the CLI's releases
(release_check.check_counts: false-failure probability < 5e-6).
"""
import json
import os
import subprocess
import sys

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.beam_yaml import ThresherRelease
from thresher.pipelines.errors import SpecError
from thresher.pipelines.planning.plan import make_plan

from .conftest import QUICKSTART, ROOT
from .release_check import check_counts

EXAMPLE = os.path.join(ROOT, "configs", "beam_yaml", "quickstart_release.yaml")
CONFIG = {"user": "user_id", "keys": ["word"], "privacy": {"epsilon": 1.0, "delta": 1e-8},
          "bounding": {"max_keys_per_user": 8}, "mechanism": {"kind": "gaussian"}}


def _transform(doc, name):
    return next(t for t in doc["pipeline"]["transforms"] if t["name"] == name)


@pytest.mark.slow
def test_example_runs_with_beam_yaml_main(tmp_path):
    try:
        import docstring_parser  # noqa: F401 - one of the yaml extra's packages
    except ImportError:
        pytest.fail("Beam YAML needs the yaml extra: pip install '.[yaml]'")
    with open(EXAMPLE, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    read = _transform(doc, "ReadWords")
    input_path = os.path.join(ROOT, read["config"]["path"])
    read["config"]["path"] = input_path
    _transform(doc, "WriteReleased")["config"]["path"] = str(tmp_path / "out" / "released")
    _transform(doc, "WriteReport")["config"]["path"] = str(tmp_path / "out" / "report.json")
    pipeline_file = tmp_path / "pipeline.yaml"
    pipeline_file.write_text(yaml.safe_dump(doc, sort_keys=False))

    env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                              if os.environ.get("PYTHONPATH") else ""))
    done = subprocess.run(
        [sys.executable, "-m", "apache_beam.yaml.main", f"--yaml_pipeline_file={pipeline_file}",
         "--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner",
         "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        capture_output=True, text=True, env=env, cwd=str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]

    outputs = sorted(os.listdir(tmp_path / "out"))
    reports = [f for f in outputs if f.startswith("report.json")]
    shards = [f for f in outputs if f.startswith("released")]
    assert len(reports) == 1 and shards and len(reports) + len(shards) == len(outputs), outputs
    lines = (tmp_path / "out" / reports[0]).read_text().splitlines()
    assert len(lines) == 1
    report = json.loads(lines[0])

    # Same parameters as `thresher plan` for the equivalent CLI spec.
    cli_plan = make_plan(spec_mod.load(QUICKSTART)).report()
    for section in ("thresher_version", "mechanism", "bounding", "privacy"):
        assert report[section] == json.loads(json.dumps(cli_plan[section])), section
    assert report["name"] == _transform(doc, "Release")["config"]["name"]

    released = pq.read_table([str(tmp_path / "out" / f) for f in shards])
    assert released.column_names == ["word", "count", "count_low", "count_high"]
    assert report["released_keys"] == released.num_rows
    check_counts(released, report, input_path)


def _documented_command():
    """The Beam YAML command of docs/running.md, which the example's own comment repeats."""
    import re
    with open(os.path.join(ROOT, "docs", "running.md"), encoding="utf-8") as handle:
        docs = re.findall(r"^    (python -m apache_beam\.yaml\.main .*)$", handle.read(), re.M)
    with open(EXAMPLE, encoding="utf-8") as handle:
        comment = re.findall(r"^#   (python -m apache_beam\.yaml\.main .*)$", handle.read(), re.M)
    assert len(docs) == 1 and comment == docs, (docs, comment)
    return docs[0].split()


def test_the_documented_command_names_its_runner():
    """Issue 36 D7: without --runner, Beam's DirectRunner first tries to download Prism
    from GitHub; the documented command gives the runner explicitly."""
    assert "--runner=FnApiRunner" in _documented_command()


@pytest.mark.slow
def test_the_documented_command_runs_as_written(tmp_path):
    """The command of docs/running.md, word for word (``python`` is this interpreter),
    from a folder where its relative paths resolve (``configs`` links to the repository's):
    it publishes the release without trying to download anything."""
    os.symlink(os.path.join(ROOT, "configs"), tmp_path / "configs")
    argv = [sys.executable, *_documented_command()[1:]]
    env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                              if os.environ.get("PYTHONPATH") else ""))
    done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=str(tmp_path),
                          timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "prism" not in done.stderr.lower(), done.stderr[-4000:]
    outputs = os.listdir(tmp_path / "out" / "quickstart_yaml")
    assert any(f.startswith("released") for f in outputs), outputs
    assert any(f.startswith("release_report.json") for f in outputs), outputs


def test_importing_thresher_first_hides_beams_apitools_warning():
    """Issue 36 D7: the API's path (thresher imported before Beam) prints no "apitools not
    found" warning; other warnings still show; Beam imported alone still prints it (the
    check can fail)."""
    code = ("import logging, thresher, apache_beam; "
            "logging.warning('another warning')")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "apitools" not in done.stderr and "another warning" in done.stderr, done.stderr
    alone = subprocess.run([sys.executable, "-c", "import apache_beam"], capture_output=True,
                           text=True, timeout=300)
    assert "apitools not found" in alone.stderr, alone.stderr


def test_config_errors_name_the_transform_field():
    with pytest.raises(SpecError, match=r"^ThresherRelease\.keys: "):
        ThresherRelease(**dict(CONFIG, keys=[]))
    with pytest.raises(SpecError, match=r"^ThresherRelease\.user: "):
        ThresherRelease(**dict(CONFIG, user=""))
    with pytest.raises(SpecError, match=r"^ThresherRelease\.privacy\.epsilon: must be > 0"):
        ThresherRelease(**dict(CONFIG, privacy={"epsilon": -1, "delta": 1e-8}))
    with pytest.raises(SpecError, match=r"^ThresherRelease\.num_shards: "):
        ThresherRelease(**CONFIG, num_shards=0)


def test_input_without_the_key_field_is_refused_when_the_pipeline_is_built():
    pipeline = beam.Pipeline()
    rows = pipeline | beam.Create([beam.Row(user_id="u", term="w")])
    with pytest.raises(SpecError, match=r"ThresherRelease\.keys\[0\]: field 'word' is not in "
                                        r"the input; its fields are: user_id, term"):
        _ = rows | ThresherRelease(**CONFIG)


def test_input_without_a_schema_is_refused():
    pipeline = beam.Pipeline()
    rows = pipeline | beam.Create([("u", "w")]).with_output_types(tuple)
    with pytest.raises(SpecError, match=r"rows with a schema"):
        _ = rows | ThresherRelease(**CONFIG)


_SEEN = {"rows": [], "reports": []}


def _keep_row(row):
    _SEEN["rows"].append(row._asdict())


def _keep_report(row):
    _SEEN["reports"].append(json.loads(row.report))


def test_aggregates_are_accepted_and_released_as_the_cli_does():
    """`aggregates:` (refused before issue 29: an unexpected keyword): the released rows
    carry <column>_<statistic> columns and the report the aggregates' calibration, the
    same as `thresher plan` computes for the equivalent spec. Values: each user's total
    per key is clamped to [0, 200] and every record's amount is 50, so a key's noisy sum
    is at most the sum over its users of min(50 x (the user's records of the key), 200)
    (bounding only drops users' keys) + noise (sigma from the report): the check allows 6
    sigma each way (false failure < 2e-9 per key, 1e-7 over <= 50 keys). (It used 50 x
    (the key's users), which users holding a word more than once exceed: 'anjo' has 2,052
    users and a clamped total of 124,100, not 102,600, so its noisy sum failed the check
    whenever the noise passed about +0.75 sigma.)"""
    data = pq.read_table(os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet"))
    data = data.slice(0, 20_000).to_pylist()
    aggregates = [{"column": "amount", "statistic": "sum", "clip": [0, 200]},
                  {"column": "amount", "statistic": "mean", "clip": [0, 200]}]
    config = dict(CONFIG, aggregates=aggregates)
    records = {}
    for row in data:
        key = (row["word"], row["user_id"])
        records[key] = records.get(key, 0) + 1
    clamped = {}        # per word: the sum over its users of their clamped totals
    for (word, _), n in records.items():
        clamped[word] = clamped.get(word, 0.0) + min(50.0 * n, 200.0)
    got, reports = _SEEN["rows"], _SEEN["reports"]
    got.clear()
    reports.clear()
    with beam.Pipeline() as pipeline:     # the in-process runner: same process, same _SEEN
        rows = pipeline | beam.Create([beam.Row(user_id=r["user_id"], word=r["word"], amount=50.0)
                                       for r in data])
        out = rows | ThresherRelease(**config)
        _ = out["released"] | beam.Map(_keep_row)
        _ = out["report"] | beam.Map(_keep_report)
    assert got and len(reports) == 1
    report = reports[0]
    # with thresher run's interval columns (tests/distributed/test_beam_yaml_parity.py
    # compares their values with the CLI's)
    assert list(got[0]) == ["word", "count", "count_low", "count_high",
                            "amount_sum", "amount_sum_low", "amount_sum_high",
                            "amount_mean", "amount_mean_low", "amount_mean_high"]
    spec_doc = {"name": "beam_yaml_release", "input": {"path": "x.parquet", "user": "user_id",
                                                       "keys": ["word"]},
                "privacy": CONFIG["privacy"], "bounding": CONFIG["bounding"],
                "mechanism": CONFIG["mechanism"], "aggregates": aggregates,
                "output": {"path": "out"}}
    cli_plan = make_plan(spec_mod.parse(spec_doc, source_text="")).report()
    assert report["mechanism"] == json.loads(json.dumps(cli_plan["mechanism"]))
    assert report["released_keys"] == len(got)
    sigma = {a["output"]: a["sigma"] for a in report["mechanism"]["aggregates"]}["amount_sum"]
    for row in got:
        # bounding keeps each user in at most 8 keys: the bounded total is <= the clamped one
        assert -6 * sigma <= row["amount_sum"] <= clamped[row["word"]] + 6 * sigma, row
        assert 0.0 <= row["amount_mean"] <= 200.0


def test_a_bad_aggregate_and_a_missing_value_field_are_refused_by_name():
    # clip: auto is accepted since issue 29 (tests/distributed/test_beam_yaml_parity.py)
    with pytest.raises(SpecError, match=r"^ThresherRelease\.aggregates\[0\]"):
        ThresherRelease(**dict(CONFIG, aggregates=[{"column": "amount", "statistic": "median",
                                                    "clip": [0, 1]}]))
    pipeline = beam.Pipeline()
    rows = pipeline | beam.Create([beam.Row(user_id="u", word="w")])
    with pytest.raises(SpecError, match=r"ThresherRelease\.aggregates: field 'amount' is not in "
                                        r"the input; its fields are: user_id, word"):
        _ = rows | ThresherRelease(**dict(CONFIG, aggregates=[
            {"column": "amount", "statistic": "sum", "clip": [0, 200]}]))


def test_a_decimal_user_field_is_refused_when_the_pipeline_is_built():
    """A decimal's Arrow precision and scale follow each batch's values, so one user read
    as "7" in one batch and "7.0" in another would be two identities (two bounds): the
    transform takes integer, float, boolean, text or bytes user fields only."""
    import decimal
    pipeline = beam.Pipeline()
    rows = pipeline | beam.Create([beam.Row(user_id=decimal.Decimal("7"), word="w")])
    with pytest.raises(SpecError, match=r"^ThresherRelease\.user: the user field has type "
                                        r".*Decimal"):
        _ = rows | ThresherRelease(**CONFIG)


def test_windowed_or_triggered_input_is_refused_when_the_pipeline_is_built():
    """A release bounds each user over all of their rows once and is charged once: rows in
    fixed windows, or in the global window with a repeated trigger (which released 0 keys
    on the direct runner while the ledger was charged), are refused by name."""
    from apache_beam.transforms import trigger, window
    pipeline = beam.Pipeline()
    rows = pipeline | beam.Create([beam.Row(user_id="u", word="w")])
    with pytest.raises(SpecError, match=r"^ThresherRelease: its input is in windows "
                                        r"\(FixedWindows\)"):
        _ = rows | "Fixed" >> beam.WindowInto(window.FixedWindows(60)) | "R1" >> ThresherRelease(**CONFIG)
    triggered = rows | "Triggered" >> beam.WindowInto(
        window.GlobalWindows(), trigger=trigger.Repeatedly(trigger.AfterCount(500)),
        accumulation_mode=trigger.AccumulationMode.DISCARDING)
    with pytest.raises(SpecError, match=r"^ThresherRelease: its input has a trigger"):
        _ = triggered | "R2" >> ThresherRelease(**CONFIG)
    _ = rows | "R3" >> ThresherRelease(**CONFIG)     # the global window, default trigger: built

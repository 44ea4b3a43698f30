"""End-to-end releases on the real local runner: report fields, output schema, counts
close to the truth, CSV/JSONL inputs, and the real `thresher` CLI."""
import json
import logging
import math
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run
from thresher.transforms.randomness import keyed_random

from tests.pipelines.conftest import ROOT


def _true_counts(path, user, key):
    table = pq.read_table(path, columns=[user, key])
    pairs = table.group_by([user, key]).aggregate([])
    return dict(zip(*pairs.group_by([key]).aggregate([([], "count_all")]).to_pydict().values()))


def test_gaussian_release_report_and_schema(write_spec, small_parquet, tmp_path):
    spec = spec_mod.load(write_spec({"input.path": small_parquet,
                                     "bounding.max_keys_per_user": 1000}))
    plan = make_plan(spec)
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(17))
    out = tmp_path / "out"
    assert sorted(os.listdir(out)) == ["release_report.json", "released.parquet"]
    on_disk = json.loads((out / "release_report.json").read_text())
    assert on_disk == json.loads(json.dumps(report))
    assert on_disk["privacy"]["epsilon"] == 1.0 and on_disk["privacy"]["delta"] == 1e-8
    assert on_disk["privacy"]["stages"] == [{"name": "release", "epsilon": 1.0, "delta": 1e-8}]
    assert on_disk["privacy"]["neighbouring"] == "add/remove all records of one user"
    mech = on_disk["mechanism"]
    assert mech["kind"] == "gaussian" and mech["noise"] == "discrete_gaussian"
    assert mech["sigma"] > 0 and mech["threshold"] > mech["pre_threshold"] == 1
    assert on_disk["bounding"] == {"max_keys_per_user": 1000, "model": "l0", "chosen_by": "spec"}
    for field in ("thresher_version", "config_sha256", "released_keys", "outputs"):
        assert field in on_disk
    released = pq.read_table(out / "released.parquet")
    assert released.schema == pa.schema([("word", pa.string()), ("count", pa.int64()),
                                         ("count_low", pa.int64()), ("count_high", pa.int64())])
    assert released.num_rows == on_disk["released_keys"] > 0
    # Bound 1000 is not binding here, so released counts are true distinct-user counts plus
    # discrete Gaussian noise: all within 7 sigma, and every key 7 sigma above tau* released.
    truth = _true_counts(small_parquet, "user_id", "word")
    got = dict(zip(released.column("word").to_pylist(), released.column("count").to_pylist()))
    sigma, tau = mech["sigma"], mech["threshold"]
    assert all(abs(got[w] - truth[w]) <= 7 * sigma for w in got)
    assert all(c >= tau for c in got.values())
    assert {w for w, c in truth.items() if c >= tau + 7 * sigma} <= set(got)


def test_plan_json_equals_run_report_without_data_fields(write_spec, capsys, small_parquet):
    path = write_spec({"input.path": small_parquet})
    assert main(["plan", path, "--json"]) == 0
    planned = json.loads(capsys.readouterr().out)
    spec = spec_mod.load(path)
    report = run(make_plan(spec))
    for field in ("released_keys", "outputs"):
        report.pop(field)
    assert planned == json.loads(json.dumps(report))


@pytest.mark.parametrize("fmt", ["csv", "jsonl"])
def test_text_inputs(write_spec, small_parquet, tmp_path, fmt):
    table = pq.read_table(small_parquet)
    path = tmp_path / f"data.{fmt}"
    if fmt == "csv":
        pcsv.write_csv(table, path)
    else:
        with open(path, "w") as handle:
            for row in table.to_pylist():
                handle.write(json.dumps(row) + "\n")
    spec = spec_mod.load(write_spec({"input.path": str(path), "input.format": fmt}))
    report = run(make_plan(spec))
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert released.num_rows == report["released_keys"] > 0
    truth = _true_counts(small_parquet, "user_id", "word")
    assert set(released.column("word").to_pylist()) <= set(truth)


def test_every_key_suppressed_gives_an_empty_valid_release(write_spec, small_parquet, tmp_path):
    spec = spec_mod.load(write_spec({"input.path": small_parquet, "mechanism.pre_threshold": 10**6}))
    report = run(make_plan(spec))
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert report["released_keys"] == 0 and released.num_rows == 0
    assert released.schema.names == ["word", "count", "count_low", "count_high"]


@pytest.mark.parametrize("bound", ["8", "auto"])
def test_quickstart_through_the_real_cli(tmp_path, bound):
    """`thresher run` as a user runs it (a new process; default local runner), on the whole
    quickstart data, with the spec's bound and with `max_keys_per_user: auto`."""
    spec = open(os.path.join(ROOT, "configs", "examples", "quickstart.yaml")).read()
    spec = spec.replace("configs/examples/data", os.path.join(ROOT, "configs/examples/data"))
    spec = spec.replace("out/quickstart", str(tmp_path / "qs"))
    assert "max_keys_per_user: 8\n" in spec
    spec = spec.replace("max_keys_per_user: 8\n", f"max_keys_per_user: {bound}\n")
    path = tmp_path / "quickstart.yaml"
    path.write_text(spec)
    cmd = [sys.executable, "-m", "thresher.pipelines.cli", "run", str(path)]
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "released" in done.stdout
    report = json.loads((tmp_path / "qs" / "release_report.json").read_text())
    assert report["privacy"]["epsilon"] == 1.0 and report["privacy"]["delta"] == 1e-8
    stages = report["privacy"]["stages"]
    assert math.fsum(s["epsilon"] for s in stages) == pytest.approx(1.0, rel=1e-12)
    assert report["released_keys"] > 0
    if bound == "auto":
        assert report["bounding"]["chosen_by"] == "exponential_mechanism"
        assert report["bounding"]["candidates"] == [1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64,
                                                    91, 128]
        assert report["bounding"]["max_keys_per_user"] in report["bounding"]["candidates"]
        assert [s["name"] for s in stages] == ["choose_contribution_bound", "release"]
        assert stages[0]["epsilon"] == pytest.approx(0.1) and stages[0]["delta"] == 0
        assert f"max_keys_per_user={report['bounding']['max_keys_per_user']}" in done.stdout
    else:
        assert report["bounding"]["max_keys_per_user"] == 8
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 2 and "--overwrite" in again.stderr
    assert "Traceback" not in again.stderr


def test_beam_flags_after_double_dash_reach_the_runner(write_spec, small_parquet, capsys, tmp_path):
    path = write_spec({"input.path": small_parquet})
    assert main(["run", path, "--", "--runner=DirectRunner"]) == 0
    assert (tmp_path / "out" / "released.parquet").exists()
    assert main(["run", path, "--overwrite", "--", "--runner=NoSuchRunner"]) != 0
    err = capsys.readouterr().err
    assert "NoSuchRunner" in err and "Traceback" not in err
    # the failed run left the earlier release in place, untouched
    assert (tmp_path / "out" / "release_report.json").exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]


KIND_CASES = [   # with the interval columns of issue 27 (docs/intervals.md)
    ({"mechanism": {"kind": "gaussian"}}, ["count", "count_low", "count_high"]),
    ({"mechanism": {"kind": "laplace"}}, ["count", "count_low", "count_high"]),
    ({"mechanism": {"kind": "laplace"}, "bounding.model": "l1"},
     ["count", "count_low", "count_high"]),
    ({"mechanism": {"kind": "sample_and_threshold"}},
     ["count", "estimate", "estimate_low", "estimate_high"]),
    ({"mechanism": {"kind": "weighted_sampling"}}, ["token", "estimate"]),
]


@pytest.mark.parametrize("bound", [8, "auto"])
@pytest.mark.parametrize("changes,columns", KIND_CASES,
                         ids=["gaussian", "laplace_l0", "laplace_l1", "sample_and_threshold",
                              "weighted_sampling"])
def test_every_kind_with_fixed_and_auto_bound(write_spec, small_parquet, tmp_path, changes,
                                              columns, bound):
    """Each mechanism kind runs end to end; with `auto` the chosen bound is one of the
    candidates and the stages add up to the spec's total budget."""
    spec = spec_mod.load(write_spec({"input.path": small_parquet,
                                     "bounding.max_keys_per_user": bound, **changes}))
    plan = make_plan(spec)
    report = run(plan)
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert released.schema.names == ["word", *columns]
    assert released.num_rows == report["released_keys"]
    stages = report["privacy"]["stages"]
    assert sum(s["epsilon"] for s in stages) == pytest.approx(1.0, rel=1e-12)
    assert sum(s["delta"] for s in stages) == pytest.approx(1e-8, rel=1e-12)
    assert report["privacy"]["epsilon"] == 1.0 and report["privacy"]["delta"] == 1e-8
    if bound == "auto":
        chosen = report["bounding"]["max_keys_per_user"]
        assert report["bounding"]["chosen_by"] == "exponential_mechanism"
        assert chosen in report["bounding"]["candidates"]
        assert [s["name"] for s in stages] == ["choose_contribution_bound", "release"]
        assert stages[1]["delta"] == 1e-8 and stages[0]["delta"] == 0
        assert report["mechanism"] == plan.params_by_bound[chosen]
        selection = report["bounding"]["selection"]
        # the default objective: the smoothed key count, Delta = max_C C / (s(C) sqrt(2 pi))
        assert selection["objective"] == "keys" and "dropped_weight" not in selection
        assert 0 < selection["sensitivity"] <= 128 / math.sqrt(2 * math.pi)
        if spec.kind == "gaussian":
            want = max(c / (max(p["sigma"], 1.0) * math.sqrt(2 * math.pi))
                       for c, p in plan.params_by_bound.items())
            assert selection["sensitivity"] == pytest.approx(want, rel=1e-12)
    else:
        assert report["bounding"]["chosen_by"] == "spec"
        assert report["bounding"]["max_keys_per_user"] == 8


@pytest.mark.parametrize("weight,want,sensitivity", [("paper", 2.0, 2 * 128 - 1),
                                                    (3, 3.0, 3 * 128)])
def test_dropped_weight_from_the_spec_reaches_the_report_and_the_selection_stage(
        write_spec, small_parquet, caplog, monkeypatch, weight, want, sensitivity):
    """bounding.auto.dropped_weight sets w in V(C) = w D(C) + key costs: the report's
    sensitivity is 2 C_m - 1 for the paper's V and w C_m for thresher's form, and the Beam
    stage draws with that sensitivity (its operator log line, not private, states it)."""
    spec = spec_mod.load(write_spec({"input.path": small_parquet,
                                     "bounding.max_keys_per_user": "auto",
                                     "bounding.auto": {"dropped_weight": weight,
                                                       "objective": "l1"}}))
    plan = make_plan(spec)
    # An in-process CLI run earlier in the session stops "thresher" propagating to the root
    # logger, where caplog listens.
    monkeypatch.setattr(logging.getLogger("thresher"), "propagate", True)
    with caplog.at_level(logging.INFO, logger="thresher"):
        report = run(plan)
    selection = report["bounding"]["selection"]
    assert selection["dropped_weight"] == want
    assert selection["dropped_weight_rule"] == ("paper" if weight == "paper" else "spec")
    assert selection["suppressed_weight"] == (1.0 if weight == "paper" else want)
    assert selection["sensitivity"] == sensitivity
    lines = [r.getMessage() for r in caplog.records if "exponential mechanism" in r.getMessage()]
    assert lines and f"sensitivity {sensitivity:g}," in lines[-1]


def test_plan_text_states_the_selection_weights_and_sensitivity(write_spec, small_parquet, capsys):
    path = write_spec({"input.path": small_parquet, "bounding.max_keys_per_user": "auto",
                       "bounding.auto": {"dropped_weight": "paper", "objective": "l1"}})
    assert main(["plan", path, "--verbose"]) == 0
    out = capsys.readouterr().out
    assert ("  selection: score gaussian, objective l1, dropped_weight 2 (paper), suppressed_weight 1, "
            "sensitivity 255\n") in out


def test_plan_states_the_default_key_objective_and_its_sensitivity(write_spec, small_parquet,
                                                                   capsys):
    """bounding.auto.objective defaults to keys: the plan text and the plan's JSON name it
    with Delta = max_C C / (max(sigma_C, 1) sqrt(2 pi)) from the calibrated sigmas."""
    path = write_spec({"input.path": small_parquet, "bounding.max_keys_per_user": "auto"})
    plan = make_plan(spec_mod.load(path))
    want = max(c / (max(p["sigma"], 1.0) * math.sqrt(2 * math.pi))
               for c, p in plan.params_by_bound.items())
    assert main(["plan", path, "--verbose"]) == 0
    out = capsys.readouterr().out
    assert (f"  selection: score gaussian, objective keys (smoothed count of released keys), "
            f"sensitivity {want:.6g}\n") in out
    assert main(["plan", path, "--json"]) == 0
    selection = json.loads(capsys.readouterr().out)["bounding"]["selection"]
    assert selection["objective"] == "keys"
    assert selection["sensitivity"] == pytest.approx(want, rel=1e-12)

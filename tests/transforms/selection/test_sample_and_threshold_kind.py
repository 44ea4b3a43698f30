"""pipelines.kinds.sample_and_threshold: spec fields, calibration report, plan and run."""
import glob
import json
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.accounting import sample_threshold as acc
from thresher.pipelines import cli
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.kinds import sample_and_threshold as kind
from thresher.pipelines.specs.spec import parse_mechanism

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
QUICKSTART = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")


def test_parse_defaults_and_values():
    assert kind.parse({}) == {"sampling_rate": None, "threshold": None, "accounting": "exact",
                              "composition": None}
    assert kind.parse({"sampling_rate": 0.2, "threshold": 7, "accounting": "kl"}) == {
        "sampling_rate": 0.2, "threshold": 7, "accounting": "kl", "composition": None}
    assert kind.parse({"composition": "basic"})["composition"] == "basic"
    assert kind.for_auto_bound(kind.parse({}))["composition"] == "basic"
    with pytest.raises(SpecError) as err:
        kind.for_auto_bound(kind.parse({"composition": "pld"}))
    assert err.value.field == "mechanism.composition" and "auto" in err.value.message


@pytest.mark.parametrize("section,field,message", [
    ({"sampling_rate": 0}, "mechanism.sampling_rate", "> 0"),
    ({"sampling_rate": 1.5}, "mechanism.sampling_rate", "<= 1"),
    ({"sampling_rate": "half"}, "mechanism.sampling_rate", "must be a number"),
    ({"threshold": 0}, "mechanism.threshold", ">= 1"),
    ({"threshold": 2.5}, "mechanism.threshold", "must be an integer"),
    ({"accounting": "rdp"}, "mechanism.accounting", "exact, kl, alpha"),
    ({"composition": "rdp"}, "mechanism.composition", "pld, basic"),
    ({"composition": "pld", "accounting": "kl"}, "mechanism.composition", "accounting: exact"),
])
def test_parse_errors_name_the_field(section, field, message):
    with pytest.raises(SpecError) as err:
        parse_mechanism({"kind": "sample_and_threshold", **section})
    assert err.value.field == field
    assert message in err.value.message


def test_calibrate_reports_parameters_the_paper_comparison_and_meets_the_budget():
    out = kind.calibrate(kind.parse({}), epsilon=1.0, delta=1e-8, max_keys_per_user=1, model="l0")
    json.dumps(out)
    assert out["kind"] == "sample_and_threshold"
    assert out["delta_achieved"] <= 1e-8
    assert acc.delta(1.0, out["sampling_rate"], out["threshold"]) == out["per_key_delta"]
    cmp = out["comparison"]
    # paper 003: p = 0.105, tau = 20 at eps 1, delta 1e-8; exact accounting needs 11 there
    assert cmp["paper_threshold"] == 20
    assert cmp["paper_sampling_rate"] == pytest.approx(0.105, abs=5e-4)
    assert cmp["exact_threshold_at_paper_rate"] == 11
    assert cmp["exact_threshold"] == out["threshold"] < cmp["kl_threshold"]
    assert out["release_point"] < cmp["paper_release_point"]


def test_calibrate_composes_over_the_users_keys_by_pld_by_default():
    out = kind.calibrate(kind.parse({"sampling_rate": 0.05}), epsilon=1.0, delta=1e-8,
                         max_keys_per_user=4, model="l0")
    assert out["composition"] == "pld" and "per_key_epsilon" not in out
    assert out["delta_achieved"] <= 1e-8
    basic = acc.min_threshold(0.25, 2.5e-9, 0.05)
    assert out["threshold"] < basic  # the tight composition needs a lower threshold
    assert "privacy-loss distribution" in out["accounting"]


def test_calibrate_composes_over_the_users_keys_basic():
    out = kind.calibrate(kind.parse({"sampling_rate": 0.05, "composition": "basic"}),
                         epsilon=1.0, delta=1e-8, max_keys_per_user=4, model="l0")
    assert out["per_key_epsilon"] == 0.25
    assert out["threshold"] == acc.min_threshold(0.25, 2.5e-9, 0.05)
    assert out["delta_achieved"] == pytest.approx(4 * out["per_key_delta"])


def test_calibrate_refuses_the_l1_model_and_infeasible_fixed_parameters():
    with pytest.raises(SpecError) as err:
        kind.calibrate(kind.parse({}), epsilon=1.0, delta=1e-8, max_keys_per_user=1, model="l1")
    assert err.value.field == "bounding.model"
    with pytest.raises(CalibrationError, match="threshold >= 24 at sampling_rate 0.3"):
        kind.calibrate(kind.parse({"sampling_rate": 0.3, "threshold": 5}), epsilon=1.0,
                       delta=1e-8, max_keys_per_user=1, model="l0")


def _spec(tmp_path, mechanism, max_keys=1):
    spec = {"name": "st", "input": {"path": QUICKSTART, "format": "parquet", "user": "user_id",
                                    "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8},
            "bounding": {"max_keys_per_user": max_keys},
            "mechanism": {"kind": "sample_and_threshold", **mechanism},
            "output": {"path": str(tmp_path / "out")}}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def test_thresher_plan_shows_the_exact_threshold_beside_the_papers(tmp_path, capsys):
    assert cli.main(["plan", _spec(tmp_path, {"sampling_rate": 0.10535}), "--verbose"]) == 0
    text = capsys.readouterr().out
    assert "sampling_rate=0.10535, threshold=11" in text
    assert "alpha_threshold: 20" in text and "kl_threshold: 14" in text
    assert "paper_threshold: 20" in text


def test_thresher_run_releases_sampled_counts_and_estimates(tmp_path, capsys):
    assert cli.main(["run", _spec(tmp_path, {}, max_keys=2)]) == 0
    files = glob.glob(str(tmp_path / "out" / "*.parquet"))
    table = pq.read_table(files[0])
    assert table.column_names == ["word", "count", "estimate", "estimate_low", "estimate_high"]
    assert table.schema.field("count").type == pa.int64()
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    mech = report["mechanism"]
    assert mech["kind"] == "sample_and_threshold"
    counts = table.column("count").to_numpy()
    assert table.num_rows > 0 and (counts >= mech["threshold"]).all()
    assert table.column("estimate").to_numpy() == pytest.approx(counts / mech["sampling_rate"])


def test_pld_composition_is_bounded_to_keep_plans_within_seconds(tmp_path):
    """Above 64 keys per user the PLD calibration would take minutes: the default is basic
    composition there, and an explicit pld is refused naming the field."""
    import yaml
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.errors import SpecError
    from thresher.pipelines.planning.plan import make_plan
    base = {"name": "t", "input": {"path": "x.parquet", "user": "u", "keys": ["k"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8},
            "bounding": {"max_keys_per_user": 100},
            "mechanism": {"kind": "sample_and_threshold"}, "output": {"path": str(tmp_path)}}
    assert make_plan(spec_mod.parse(base)).report()["mechanism"]["composition"] == "basic"
    base["mechanism"]["composition"] = "pld"
    with pytest.raises(SpecError, match="mechanism.composition"):
        make_plan(spec_mod.parse(yaml.safe_load(yaml.safe_dump(base))))

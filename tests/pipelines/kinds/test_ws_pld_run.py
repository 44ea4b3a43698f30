"""weighted_sampling with composition pld (the default for report: keys) through the real
CLI: plan and run on FnApiRunner, and the refusal of pld with frequency tokens (exit 2)."""
import json

import pyarrow.parquet as pq

from thresher.pipelines.cli import main


def test_keys_release_runs_with_pld_by_default(write_spec, small_parquet, tmp_path, capsys):
    path = write_spec({"input.path": small_parquet,
                       "mechanism": {"kind": "weighted_sampling", "report": "keys"}})
    assert main(["run", path]) == 0
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    mech = report["mechanism"]
    assert mech["composition"] == "pld" and mech["key_mu"] is not None
    assert mech["delta_achieved"] <= 1e-8 and mech["threshold"] == 88
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert released.num_rows == report["released_keys"] > 0


def test_pld_with_frequencies_is_refused_naming_the_field(write_spec, capsys):
    path = write_spec({"mechanism": {"kind": "weighted_sampling", "composition": "pld"}})
    assert main(["plan", path]) == 2
    err = capsys.readouterr().err
    assert "mechanism.composition" in err and "report: keys" in err
    assert "Traceback" not in err

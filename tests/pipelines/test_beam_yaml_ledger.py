"""The Beam YAML command with a budget (issue 42), run as a user runs it: ``python -m
apache_beam.yaml.main --yaml_pipeline_file=...`` in a real process, real SQLite.

- A second run of the same pipeline is a second release, charged again, whose sinks
  replace the first run's files: it says so on stderr (before: silently).
- A run the ledger refuses ends with one line ``thresher: error: ThresherRelease.budget:
  ...`` and exit code 2, no traceback (before: the refusal at the end of a Beam
  traceback, exit code 1).
"""
import os
import subprocess
import sys

import pytest
import yaml

from thresher.pipelines.ledgers import ledger

from .conftest import QUICKSTART_DATA, ROOT

pytest.importorskip("apache_beam.yaml.main")


def _pipeline_file(tmp_path, ledger_path, total):
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump({
        "pipeline": {"transforms": [
            {"type": "ReadFromParquet", "name": "Read", "config": {"path": QUICKSTART_DATA}},
            {"type": "ThresherRelease", "name": "Release", "input": "Read", "config": {
                "name": "yaml_release", "user": "user_id", "keys": ["word"],
                "privacy": {"epsilon": 1.0, "delta": 1e-8},
                "bounding": {"max_keys_per_user": 4},
                "mechanism": {"kind": "gaussian", "pre_threshold": 1}, "num_shards": 2,
                "budget": {"ledger": str(ledger_path), "dataset": "d", "epsilon": total,
                           "delta": 1e-6}}},
            {"type": "WriteToText", "name": "WriteReport", "input": "Release.report",
             "config": {"path": str(tmp_path / "out" / "report.json")}},
        ]},
        "providers": [{"type": "python", "config": {}, "transforms": {
            "ThresherRelease": "thresher.pipelines.beam_yaml.ThresherRelease"}}],
    }))
    return str(path)


def _run(pipeline_file, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.run([sys.executable, "-m", "apache_beam.yaml.main",
                           f"--yaml_pipeline_file={pipeline_file}", "--runner=FnApiRunner"],
                          cwd=cwd, env=env, capture_output=True, text=True, timeout=900)


@pytest.mark.slow      # two Beam YAML processes: ~40 s
def test_a_yaml_pipeline_run_twice_says_it_is_charged_again(tmp_path):
    ledger_path = tmp_path / "l.sqlite"
    pipeline_file = _pipeline_file(tmp_path, ledger_path, total=2.5)
    first = _run(pipeline_file, str(tmp_path))
    assert first.returncode == 0, first.stderr[-3000:]
    assert "already released" not in first.stderr
    second = _run(pipeline_file, str(tmp_path))
    assert second.returncode == 0, second.stderr[-3000:]
    assert ("this run is a new release of 'yaml_release' on dataset 'd', charged again "
            "(release 2); the same spec was already released 1 time in this ledger") \
        in second.stderr, second.stderr[-3000:]
    assert "replace its output" in second.stderr
    shown = ledger.summary(str(ledger_path))[0]
    assert [r["state"] for r in shown["releases"]] == ["published", "published"]


@pytest.mark.slow      # one Beam YAML process: ~20 s
def test_a_yaml_budget_refusal_is_one_line_and_exit_2(tmp_path):
    """The dataset's total (1.5) already holds a release of 1 (charged through the API):
    the YAML release of 1 is refused when the pipeline is built."""
    from thresher.pipelines.ledgers import composition as comp
    ledger_path = tmp_path / "l.sqlite"
    budget = ledger.BudgetSpec(ledger=str(ledger_path), dataset="d", epsilon=1.5, delta=1e-6)
    ledger.reserve_charge(budget, "earlier", "0" * 64, comp.Charge(
        comp.dec(1.0), comp.dec(1e-8), comp.dec("0.02"), comp.dec("1E-9"))).commit("o")
    done = _run(_pipeline_file(tmp_path, ledger_path, total=1.5), str(tmp_path))
    assert done.returncode == 2, done.stderr[-3000:]
    assert "Traceback" not in done.stderr, done.stderr[-3000:]
    assert done.stderr.splitlines()[-1].startswith(
        "thresher: error: ThresherRelease.budget: dataset 'd' (basic composition) has spent "
        "epsilon=1")
    assert "refused: it needs 1 of the epsilon budget, 0.5 left" in done.stderr
    assert len(ledger.summary(str(ledger_path))[0]["releases"]) == 1

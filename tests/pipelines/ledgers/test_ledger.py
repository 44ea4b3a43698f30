"""The privacy-budget ledger (pipelines/ledgers/ledger.py): releases charged across runs, refused
past the dataset's total, reservations released on refusals and kept once publishing
began, and concurrent runs decided by SQLite transactions — with real processes."""
import json
import os
import subprocess
import sys

import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.ledgers import ledger

from thresher.pipelines.dataio import publish
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run

from tests.pipelines.conftest import QUICKSTART_DATA, ROOT
from tests.pipelines.ledgers.ledger_race import assert_exactly_two_reserved, race


def _spec_text(name, data, out, ledger_path, *, epsilon=1.0, total=2.5, dataset="ds",
               delta=1e-8, total_delta=1e-6):
    return yaml.safe_dump({
        "name": name,
        "input": {"path": str(data), "user": "user_id", "keys": ["word"]},
        "privacy": {"epsilon": epsilon, "delta": delta},
        "bounding": {"max_keys_per_user": 4},
        "mechanism": {"kind": "gaussian"},
        "output": {"path": str(out)},
        "budget": {"ledger": str(ledger_path), "dataset": dataset, "epsilon": total,
                   "delta": total_delta},
    })


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.parquet"
    pq.write_table(pq.read_table(QUICKSTART_DATA).slice(0, 3000), path)
    return path


def _cli(args, cwd):
    env = dict(os.environ, PYTHONPATH=ROOT)
    return subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish(proc):
    out, err = proc.communicate(timeout=600)
    return proc.returncode, out, err


def test_three_releases_at_one_against_two_and_a_half(tmp_path, tiny):
    """The issue's done-when: the third release exits 2 naming budget, publishes nothing,
    and the ledger says 2.0 spent."""
    ledger_path = tmp_path / "ledgers" / "search-logs.sqlite"
    codes = []
    for i in range(3):
        spec = tmp_path / f"r{i}.yaml"
        spec.write_text(_spec_text(f"r{i}", tiny, tmp_path / f"out{i}", ledger_path))
        codes.append(_finish(_cli(["run", str(spec)], tmp_path)))
    assert [c for c, _, _ in codes] == [0, 0, 2], codes
    assert codes[2][2].startswith("thresher: error: budget:") and "Traceback" not in codes[2][2]
    assert (tmp_path / "out0" / "released.parquet").exists()
    assert (tmp_path / "out1" / "released.parquet").exists()
    assert not (tmp_path / "out2").exists()
    assert not [p for p in os.listdir(tmp_path) if ".tmp-" in p]
    code, out, err = _finish(_cli(["ledger", "show", str(ledger_path), "--json"], tmp_path))
    assert code == 0, err
    shown = json.loads(out)
    assert shown["dataset"] == "ds"
    assert shown["budget"] == {"epsilon": 2.5, "delta": 1e-6}
    assert shown["spent"] == {"epsilon": 2.0, "delta": 2e-8}
    assert [r["name"] for r in shown["releases"]] == ["r0", "r1"]
    for i, r in enumerate(shown["releases"]):
        assert r["epsilon"] == 1.0 and r["delta"] == 1e-8 and r["state"] == "published"
        text = (tmp_path / f"r{i}.yaml").read_text()
        assert r["config_sha256"] == json.loads(
            (tmp_path / f"out{i}" / "release_report.json").read_text())["config_sha256"]
        assert r["output"] == str(tmp_path / f"out{i}") and r["time"].endswith("Z") and text


def test_two_concurrent_runs_with_room_for_one(tmp_path, tiny):
    """Two `thresher run` processes started together against a total with room for one
    release: exactly one publishes, the other exits 2 naming budget."""
    ledger_path = tmp_path / "l.sqlite"
    procs = []
    for i in range(2):
        spec = tmp_path / f"c{i}.yaml"
        spec.write_text(_spec_text(f"c{i}", tiny, tmp_path / f"out{i}", ledger_path, total=1.5))
    procs = [_cli(["run", str(tmp_path / f"c{i}.yaml")], tmp_path) for i in range(2)]
    results = [_finish(p) for p in procs]
    assert sorted(c for c, _, _ in results) == [0, 2], results
    loser = next(r for r in results if r[0] == 2)
    assert "budget:" in loser[2]
    published = [i for i in range(2) if (tmp_path / f"out{i}").exists()]
    assert len(published) == 1
    shown = ledger.summary(str(ledger_path))[0]
    assert shown["spent"]["epsilon"] == 1.0
    assert [r["state"] for r in shown["releases"]] == ["published"]


def _reserve_in_child(spec_text, barrier, results):
    plan = make_plan(spec_mod.parse(yaml.safe_load(spec_text), source_text=spec_text))
    barrier.wait()
    try:
        ledger.reserve(plan)
        results.put("reserved")
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"refused: {exc}")


def test_reservations_race_in_one_transaction(tmp_path, tiny):
    """Six processes reserve at the same instant with room for two: exactly two get it
    (a check-then-write would let more through)."""
    ledger_path = tmp_path / "race.sqlite"
    text = _spec_text("race", tiny, tmp_path / "o", ledger_path, total=2.5)
    outcomes = race("spawn", _reserve_in_child, text)
    assert_exactly_two_reserved(outcomes, str(ledger_path))


def _plan(tmp_path, tiny, name="x", **kw):
    text = _spec_text(name, tiny, tmp_path / f"out-{name}", tmp_path / "l.sqlite", **kw)
    return make_plan(spec_mod.parse(yaml.safe_load(text), source_text=text))


def test_a_refusal_before_publishing_releases_the_reservation(tmp_path, tiny):
    plan = _plan(tmp_path, tiny, "a")
    run(plan)
    # Refused: the output already holds a release (no --overwrite).
    with pytest.raises(spec_mod.SpecError, match="output.path"):
        run(plan)
    # Refused: a key column the input lacks (found when the input is opened).
    bad = dict(yaml.safe_load(plan.spec.source_text))
    bad["input"]["keys"] = ["no_such_column"]
    bad["output"]["path"] = str(tmp_path / "out-b")
    text = yaml.safe_dump(bad)
    with pytest.raises(spec_mod.SpecError, match="no_such_column"):
        run(make_plan(spec_mod.parse(bad, source_text=text)))
    shown = ledger.summary(str(tmp_path / "l.sqlite"))[0]
    assert [r["state"] for r in shown["releases"]] == ["published"]
    assert shown["spent"]["epsilon"] == 1.0


def test_a_release_whose_publishing_failed_stays_charged(tmp_path, tiny, monkeypatch):
    def broken_promote(staging, final):
        raise OSError("disk vanished while moving the release into place")
    monkeypatch.setattr(publish, "promote", broken_promote)
    with pytest.raises(OSError):
        run(_plan(tmp_path, tiny, "p"))
    shown = ledger.summary(str(tmp_path / "l.sqlite"))[0]
    assert [r["state"] for r in shown["releases"]] == ["publish_failed"]
    assert shown["spent"]["epsilon"] == 1.0


def test_sums_are_exact_decimals(tmp_path, tiny):
    """Ten releases at 0.1 fill a total of 1.0 exactly; the eleventh is refused."""
    for i in range(10):
        ledger.reserve(_plan(tmp_path, tiny, f"d{i}", epsilon=0.1, total=1.0)).commit("o")
    with pytest.raises(spec_mod.SpecError, match="^budget:"):
        ledger.reserve(_plan(tmp_path, tiny, "d10", epsilon=0.1, total=1.0))
    assert ledger.summary(str(tmp_path / "l.sqlite"))[0]["spent"]["epsilon"] == 1.0


def test_a_dataset_total_cannot_change(tmp_path, tiny):
    ledger.reserve(_plan(tmp_path, tiny, "t1", total=3.0)).commit("o")
    with pytest.raises(spec_mod.SpecError, match="^budget: .*cannot change"):
        ledger.reserve(_plan(tmp_path, tiny, "t2", total=4.0))


@pytest.mark.parametrize("changes, field", [
    ({"ledger": "sqlite:///l.sqlite"}, "budget.ledger: the database URLs supported are postgresql://"),
    ({"ledger": "mysql://u:pw@db.example/l"}, "budget.ledger: the database URLs supported are postgresql://"),
    ({"epsilon": 0.5}, "budget.epsilon:"),
    ({"delta": 1.0}, "budget.delta:"),
    ({"datset": "x"}, "budget.datset: unknown field"),
])
def test_budget_section_errors(write_spec, capsys, changes, field):
    budget = {"ledger": "l.sqlite", "dataset": "d", "epsilon": 3.0, "delta": 1e-6, **changes}
    path = write_spec({"budget": budget})
    assert main(["validate", path]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"thresher: error: {field}") and len(err.strip().splitlines()) == 1


def test_ledger_show_several_datasets(tmp_path, tiny, capsys):
    ledger.reserve(_plan(tmp_path, tiny, "a1", dataset="alpha")).commit("o1")
    ledger.reserve(_plan(tmp_path, tiny, "b1", dataset="beta", total=5.0)).commit("o2")
    path = str(tmp_path / "l.sqlite")
    assert main(["ledger", "show", path, "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert [d["dataset"] for d in both] == ["alpha", "beta"]
    assert main(["ledger", "show", path, "--dataset", "beta", "--json"]) == 0
    beta = json.loads(capsys.readouterr().out)
    assert beta["budget"]["epsilon"] == 5.0 and beta["releases"][0]["name"] == "b1"
    assert main(["ledger", "show", path]) == 0
    text = capsys.readouterr().out
    assert "dataset alpha: spent epsilon 1 of 2.5" in text and "b1" in text
    assert main(["ledger", "show", path, "--dataset", "gamma"]) == 2
    assert main(["ledger", "show", str(tmp_path / "missing.sqlite")]) == 2
    assert not (tmp_path / "missing.sqlite").exists()

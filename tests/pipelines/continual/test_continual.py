"""Continual release through the real CLI (``thresher run SPEC --period P``): six periods
against a ledger, charged once; keys only grow; re-runs publish the same bytes; crashes at
every step leave a re-runnable period with the state and the ledger in agreement."""
import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.continual import command, state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
HORIZON, PERIODS, C = 8, 6, 3
SECRET = bytes(range(32))        # a fixed horizon secret: the runs are reproducible


def _write_periods(folder, periods=PERIODS, seed=45):
    """Synthetic (user, word) records: each user holds at most C distinct words over the
    whole horizon (so the bounded count is the plain distinct-user count), appears in
    random periods, and repeats records. Returns the true cumulative counts
    {period: {word: users}}."""
    rng = np.random.default_rng(seed)
    users = 6000
    weights = 1.0 / np.arange(1, 31)
    weights /= weights.sum()
    held = [rng.choice(30, size=rng.integers(1, C + 1), replace=False, p=weights)
            for _ in range(users)]
    first = {}
    os.makedirs(folder, exist_ok=True)
    for t in range(1, periods + 1):
        active = np.flatnonzero(rng.random(users) < 0.35)
        rows_u, rows_w = [], []
        for u in active:            # test data only: the release itself has no such loop
            for w in held[u]:
                if rng.random() < 0.7:
                    rows_u += [f"user{u}"] * 2
                    rows_w += [f"w{w}"] * 2
                    first.setdefault((u, w), t)
        pq.write_table(pa.table({"user": rows_u, "word": rows_w}),
                       os.path.join(folder, f"day{t}.parquet"))
    truth = {}
    for t in range(1, periods + 1):
        counts = {}
        for (u, w), t0 in first.items():
            if t0 <= t:
                counts[f"w{w}"] = counts.get(f"w{w}", 0) + 1
        truth[t] = counts
    return truth


def _spec(tmp_path, epsilon=1.0, confidence=None, horizon=HORIZON, name="daily"):
    out = {"path": "out"}
    if confidence is not None:
        out["confidence"] = confidence
    spec = {"name": name,
            "input": {"path": "data/day{period}.parquet", "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": epsilon, "delta": 1e-8},
            "bounding": {"max_keys_per_user": C},
            "mechanism": {"kind": "gaussian"},
            "output": out,
            "budget": {"ledger": "ledger.sqlite", "dataset": "words", "epsilon": 10.0,
                       "delta": 1e-6},
            "continual": {"horizon": horizon}}
    path = tmp_path / "spec.yaml"
    path.write_text(json.dumps(spec))            # JSON is YAML
    return path


def _state_folder(tmp_path, name="daily"):
    class B:
        ledger = str(tmp_path / "ledger.sqlite")
        dataset = "words"
    return state.folder_for(B, name)


def _fix_secret(tmp_path, name="daily"):
    folder = _state_folder(tmp_path, name)
    os.makedirs(folder, exist_ok=True)
    with open(os.path.join(folder, state.SECRET), "wb") as f:
        f.write(SECRET)


def _cli(tmp_path, *args, fault=None):
    env = dict(os.environ, PYTHONPATH=ROOT)
    env.pop(command.FAULT_ENV, None)
    if fault:
        env[command.FAULT_ENV] = fault
    done = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", *args],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def _ledger(tmp_path):
    done = _cli(tmp_path, "ledger", "show", "ledger.sqlite", "--json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def _digests(folder):
    return {name: hashlib.sha256(open(os.path.join(folder, name), "rb").read()).hexdigest()
            for name in sorted(os.listdir(folder))}


def test_six_periods_charged_once_keys_grow_intervals_cover(tmp_path):
    """Intervals at confidence 1 - 1e-6: each (key, period) misses with probability
    <= 1e-6, so with at most 30 x 6 intervals any miss has probability <= 1.8e-4 over the
    secret; the secret is fixed, so the run is reproducible."""
    truth = _write_periods(tmp_path / "data")
    spec = _spec(tmp_path, confidence=1 - 1e-6)
    _fix_secret(tmp_path)
    spent, keys, first = [], [], {}
    for p in range(1, PERIODS + 1):
        done = _cli(tmp_path, "run", str(spec), "--period", str(p))
        assert done.returncode == 0, done.stderr
        spent.append(_ledger(tmp_path)["spent"])
        table = pq.read_table(tmp_path / "out" / f"period={p}" / "released.parquet").to_pylist()
        keys.append({r["word"] for r in table})
        for r in table:
            assert first.setdefault(r["word"], r["first_period"]) == r["first_period"]
            assert r["first_period"] <= p
            assert r["count_low"] <= truth[p][r["word"]] <= r["count_high"], (p, r)
    assert spent[0] == spent[-1] == {"epsilon": 1.0, "delta": 1e-8}
    assert all(a <= b for a, b in zip(keys, keys[1:]))
    assert len(keys[-1]) > len(keys[0]) > 0          # the data let keys arrive over time
    releases = _ledger(tmp_path)["releases"]
    assert len(releases) == 1 and releases[0]["state"] == "published"
    # a re-run of a published period publishes the same bytes and charges nothing
    before = _digests(tmp_path / "out" / "period=3")
    done = _cli(tmp_path, "run", str(spec), "--period", "3")
    assert done.returncode == 0 and "same bytes" in done.stdout
    assert _digests(tmp_path / "out" / "period=3") == before
    assert _ledger(tmp_path)["spent"] == spent[0]
    # out of order: refused
    done = _cli(tmp_path, "run", str(spec), "--period", str(PERIODS + 2))
    assert done.returncode == 2 and "--period" in done.stderr


def _run_clean(tmp_path, periods):
    _write_periods(tmp_path / "data")
    spec = _spec(tmp_path)
    _fix_secret(tmp_path)
    for p in range(1, periods + 1):
        assert _cli(tmp_path, "run", str(spec), "--period", str(p)).returncode == 0
    return spec


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """Periods 1-2 run without faults, under the fixed secret: the bytes every repaired run
    must publish."""
    folder = tmp_path_factory.mktemp("reference")
    _run_clean(folder, 2)
    return {p: _digests(folder / "out" / f"period={p}") for p in (1, 2)}


# One crash point runs by default; the whole matrix is marked slow (seconds per CLI run).
@pytest.mark.parametrize("period,point", [
    pytest.param(1, "before_charge", marks=pytest.mark.slow),
    pytest.param(1, "after_charge", marks=pytest.mark.slow),
    pytest.param(1, "after_publish", marks=pytest.mark.slow),
    pytest.param(2, "after_pending", marks=pytest.mark.slow),
    pytest.param(2, "after_stage", marks=pytest.mark.slow),
    (2, "after_publish"),
    pytest.param(2, "after_state_files", marks=pytest.mark.slow),
    pytest.param(2, "after_commit", marks=pytest.mark.slow)])
def test_a_crash_at_each_step_leaves_the_period_rerunnable(tmp_path, reference, period, point):
    assert point in command.FAULT_POINTS
    spec = _run_clean(tmp_path, period - 1)
    done = _cli(tmp_path, "run", str(spec), "--period", str(period), fault=point)
    assert done.returncode == command.FAULT_EXIT
    folder = _state_folder(tmp_path)
    head = json.load(open(os.path.join(folder, state.HEAD))) if os.path.exists(
        os.path.join(folder, state.HEAD)) else {"period": 0}
    # the state and the ledger agree: charged exactly when the horizon's token is recorded
    # and the charge step has run; never twice
    ledger = _ledger(tmp_path) if (tmp_path / "ledger.sqlite").exists() else None
    charged = ledger is not None and len(ledger["releases"]) == 1
    assert charged == (period > 1 or point != "before_charge")
    if ledger is not None:
        assert len(ledger["releases"]) <= 1
    published = (tmp_path / "out" / f"period={period}").exists()
    assert published == (point in ("after_publish", "after_state_files", "after_commit"))
    assert head["period"] == (period if point == "after_commit" else period - 1)
    # re-run: the period completes with the reference bytes, charged once in all
    done = _cli(tmp_path, "run", str(spec), "--period", str(period))
    assert done.returncode == 0, done.stderr
    assert _digests(tmp_path / "out" / f"period={period}") == reference[period]
    assert len(_ledger(tmp_path)["releases"]) == 1
    assert json.load(open(os.path.join(folder, state.HEAD)))["period"] == period


def test_refusals_exit_2(tmp_path):
    _write_periods(tmp_path / "data", periods=2)
    spec = _spec(tmp_path)
    assert _cli(tmp_path, "run", str(spec), "--period", "1").returncode == 0
    spent = _ledger(tmp_path)["spent"]
    # a missing period's input is an error, not zeros
    os.remove(tmp_path / "data" / "day2.parquet")
    done = _cli(tmp_path, "run", str(spec), "--period", "2")
    assert done.returncode == 2 and "input.path" in done.stderr and "missing period" in done.stderr
    _write_periods(tmp_path / "data", periods=2)
    # the spec changed since the charge
    changed = _spec(tmp_path, epsilon=0.9)
    done = _cli(tmp_path, "run", str(changed), "--period", "2")
    assert done.returncode == 2 and "changed" in done.stderr
    spec = _spec(tmp_path)
    # a tampered state table
    folder = _state_folder(tmp_path)
    users = [n for n in os.listdir(folder) if n.startswith("users-")][0]
    with open(os.path.join(folder, users), "ab") as f:
        f.write(b"x")
    done = _cli(tmp_path, "run", str(spec), "--period", "2")
    assert done.returncode == 2 and "digest" in done.stderr
    assert _ledger(tmp_path)["spent"] == spent
    assert not (tmp_path / "out" / "period=2").exists()
    # --period without a continual section, and a continual spec without --period
    done = _cli(tmp_path, "run", str(spec))
    assert done.returncode == 2 and "--period" in done.stderr


def test_unknown_continual_field_is_refused(tmp_path):
    spec = _spec(tmp_path)
    data = json.loads(spec.read_text())
    data["continual"]["horizn"] = 3
    spec.write_text(json.dumps(data))
    done = _cli(tmp_path, "validate", str(spec))
    assert done.returncode == 2 and "continual" in done.stderr and "horizn" in done.stderr


def test_plan_prints_the_ratio_and_recommends_one_shot_where_the_tree_does_not_pay(tmp_path):
    from thresher.accounting import continual as acc
    done = _cli(tmp_path, "plan", str(_spec(tmp_path, horizon=365)))
    assert done.returncode == 0, done.stderr
    assert f"ratio {acc.noise_ratio(365):.3f}" in done.stdout and "continual (tree)" in done.stdout
    done = _cli(tmp_path, "plan", str(_spec(tmp_path, horizon=3)))
    assert done.returncode == 0 and "one-shot" in done.stdout
    done = _cli(tmp_path, "plan", str(_spec(tmp_path, horizon=365)), "--json")
    plan = json.loads(done.stdout)
    assert plan["noise"]["ratio"] == pytest.approx(acc.noise_ratio(365))
    assert plan["privacy"]["delta_selection"] <= 0.5e-8
    assert plan["privacy"]["zcdp_record"] == {"rho": 0.5, "delta0": 1e-8}


def test_a_period_published_before_a_crash_is_never_republished_with_other_bytes(tmp_path):
    """A crash after period 2 is published but before the state records it; the operator
    removes the period's folder and changes its input (one user fewer). The re-run draws the
    same node noise (keyed by key and node), so publishing the new counts would disclose the
    change exactly, uncharged: it must be refused, nothing published. Without the digests
    written before publishing, the re-run published (exit 0)."""
    spec = _run_clean(tmp_path, 1)
    done = _cli(tmp_path, "run", str(spec), "--period", "2", fault="after_publish")
    assert done.returncode == command.FAULT_EXIT
    assert (tmp_path / "out" / "period=2").exists()
    import shutil
    shutil.rmtree(tmp_path / "out" / "period=2")
    day = tmp_path / "data" / "day2.parquet"
    table = pq.read_table(day)
    # a user first seen at period 2: its pairs count there, so the counts change
    before = set(pq.read_table(tmp_path / "data" / "day1.parquet").column("user").to_pylist())
    dropped = next(u for u in table.column("user").to_pylist() if u not in before)
    import pyarrow.compute as pc
    table = table.filter(pc.not_equal(table.column("user"), dropped))
    pq.write_table(table, day)
    done = _cli(tmp_path, "run", str(spec), "--period", "2")
    assert done.returncode == 2 and "input.path" in done.stderr, done.stderr
    assert not (tmp_path / "out" / "period=2").exists()
    assert len(_ledger(tmp_path)["releases"]) == 1


def test_a_ledger_or_state_inside_the_output_folder_is_refused(tmp_path):
    """The horizon's state (its secret, the users' pairs) lives beside the ledger; a ledger
    inside the output folder would put it among the published files. Refused by run and
    validate (exit 2, naming budget.ledger), nothing written. Without the check, period 1
    ran and wrote the secret under out/."""
    _write_periods(tmp_path / "data", periods=1)
    spec = _spec(tmp_path)
    data = json.loads(spec.read_text())
    data["budget"]["ledger"] = "out/ledger.sqlite"
    spec.write_text(json.dumps(data))
    for command_name in ("validate", "run"):
        args = [command_name, str(spec)] + (["--period", "1"] if command_name == "run" else [])
        done = _cli(tmp_path, *args)
        assert done.returncode == 2 and "budget.ledger" in done.stderr, done.stderr
    assert not (tmp_path / "out").exists() or not any(
        "secret" in files for _, _, files in os.walk(tmp_path / "out"))

"""``output.confidence`` and the ``<column>_low/_high`` intervals (issue 27) through real
releases; the independence of the noises the intervals rely on."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.dataio import intervals
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run
from thresher.transforms.randomness import keyed_random

AGGREGATES = [{"column": "amount", "statistic": "sum", "clip": [0.0, 100.0]},
              {"column": "amount", "statistic": "mean", "clip": [0.0, 100.0]}]


@pytest.mark.parametrize("value,allowed", [(0, "> 0 and < 1"), (1, "> 0 and < 1"),
                                           (1.5, "> 0 and < 1"), (-0.1, "> 0 and < 1"),
                                           ("high", "must be a number"),
                                           (True, "must be a number")])
def test_confidence_outside_the_open_unit_interval_is_refused(write_spec, capsys, value, allowed):
    rc = main(["validate", write_spec({"output.confidence": value})])
    err = capsys.readouterr().err
    assert rc == 2 and "output.confidence" in err and allowed in err, err
    assert "Traceback" not in err and err.count("\n") == 1


def _data(tmp_path, n_users=4000, seed=3):
    rng = np.random.default_rng(seed)
    users, keys, amounts = [], [], []
    for u in range(n_users):
        for k in rng.choice(12, size=rng.integers(1, 4), replace=False,
                            p=np.array([30, 20, 12, 9, 7, 6, 5, 4, 3, 2, 1, 1]) / 100):
            users.append(u)
            keys.append(f"k{k}")
            amounts.append(float(rng.gamma(2.0, 15.0)))
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"uid": users, "key": keys, "amount": amounts}), path)
    return str(path)


def _release(write_spec, tmp_path, seed=5, **changes):
    base = {"input.path": _data(tmp_path), "input.user": "uid", "input.keys": ["key"],
            "privacy.delta": 1e-6, "bounding.max_keys_per_user": 3}
    base.update(changes)
    plan = make_plan(spec_mod.load(write_spec(base)))
    report = run(plan, rng_factory=keyed_random.KeyedSource(bytes(range(32))))
    return plan, report, pq.read_table(tmp_path / "out" / "released.parquet")


def test_gaussian_release_publishes_intervals_beside_each_value(write_spec, tmp_path):
    plan, report, table = _release(write_spec, tmp_path, aggregates=AGGREGATES,
                                   **{"output.confidence": 0.9})
    assert table.column_names == ["key", "count", "count_low", "count_high",
                                  "amount_sum", "amount_sum_low", "amount_sum_high",
                                  "amount_mean", "amount_mean_low", "amount_mean_high"]
    assert table.num_rows >= 5
    rows = table.to_pylist()
    for r in rows:
        assert r["pre" if False else "count_low"] <= r["count"] <= r["count_high"]
        assert r["count_low"] >= report["mechanism"]["pre_threshold"]
        assert r["amount_sum_low"] < r["amount_sum"] < r["amount_sum_high"]
        assert 0.0 <= r["amount_mean_low"] <= r["amount_mean"] <= r["amount_mean_high"] <= 100.0
    assert report["intervals"]["confidence"] == 0.9
    assert set(report["intervals"]["columns"]) == {"count", "amount_sum", "amount_mean"}
    # post-processing: the columns are a function of the released values and the report
    values = table.select(["key", "count", "amount_sum", "amount_mean"])
    again = intervals.add_columns(values, report["mechanism"], plan.spec)
    assert again.equals(table)


def test_kinds_without_an_interval_say_so(write_spec, tmp_path):
    plan, report, table = _release(write_spec, tmp_path, **{
        "mechanism": {"kind": "weighted_sampling"}})
    assert not [c for c in table.column_names if c.endswith(("_low", "_high"))]
    # named by the column it released (issue 36: said "count", which it has not)
    assert list(report["intervals"]["without_interval"]) == ["estimate"]
    assert "estimate" in table.column_names and "count" not in table.column_names
    assert report["intervals"]["columns"] == {}


def test_sample_and_threshold_publishes_an_interval_for_its_estimate(write_spec, tmp_path):
    plan, report, table = _release(write_spec, tmp_path, **{
        "mechanism": {"kind": "sample_and_threshold"}})
    assert table.column_names == ["key", "count", "estimate", "estimate_low", "estimate_high"]
    assert table.num_rows >= 3
    for r in table.to_pylist():
        assert r["count"] <= r["estimate_low"] <= r["estimate"] <= r["estimate_high"]
    assert set(report["intervals"]["columns"]) == {"estimate"}
    assert "count" in report["intervals"]["without_interval"]


@pytest.mark.parametrize("kind", ["weighted_gaussian", "adaptive"])
def test_count_stage_kinds_publish_count_intervals(write_spec, tmp_path, kind):
    plan, report, table = _release(write_spec, tmp_path, **{"mechanism": {"kind": kind}})
    assert table.column_names == ["key", "count", "count_low", "count_high"]
    low, high = intervals.count_interval(table.column("count").to_numpy(), report["mechanism"],
                                         0.05)
    assert (table.column("count_low").to_numpy() == low).all()
    assert (table.column("count_high").to_numpy() == high).all()
    assert "independently of the selection" in report["intervals"]["columns"]["count"]["construction"]


# --------------------------------------------------------------------------------------
# Independence of the noises the intervals take as independent.

def _streams(keys, stage="stage"):
    table = pa.table({"key": [f"k{i}" for i in range(keys)]})
    source = keyed_random.KeyedSource(bytes(range(32)))
    return table, keyed_random.table_streams(source, None, stage, table, ["key"])


# |correlation| of independent noises over m >= 2,500 released keys has sd <= 0.02; the
# bound 0.12 is 6 sd (false failure < 2e-9). Redrawing the second noise from the start of
# the key's stream makes it a monotone function of the first noise's uniform: |r| ~ 1.
_MAX_CORRELATION = 0.12


def test_sum_noise_is_independent_of_the_count_noise_that_selected_the_key():
    from thresher.transforms.values.aggregate_values import release_with_aggregates
    n_keys, true_count = 4000, 45
    table, rng = _streams(n_keys)
    table = table.append_column("count", pa.array(np.full(n_keys, true_count, dtype=np.int64)))
    table = table.append_column("__s0", pa.array(np.zeros(n_keys, dtype=np.int64)))
    params = {"noise": "discrete_gaussian", "sigma": 10.0, "pre_threshold": 1, "threshold": 40,
              "aggregates": [{"sum_column": 0, "statistic": "sum", "output": "s",
                              "noise": "discrete_gaussian", "sigma_grid_units": 160.0,
                              "grid_scale": 16.0, "clip": [0.0, 100.0]}]}
    out = release_with_aggregates(table, params, rng)
    count_noise = out.column("count").to_numpy() - true_count
    sum_noise = out.column("s").to_numpy() * 16.0
    assert out.num_rows >= 2500
    r = np.corrcoef(count_noise, sum_noise)[0, 1]
    assert abs(r) < _MAX_CORRELATION, r


def test_weighted_gaussian_count_noise_is_independent_of_the_selection_noise():
    from thresher.transforms.randomness import samplers
    from thresher.transforms.selection.weighted_threshold import weighted_threshold
    n_keys, sigma_grid, threshold = 4000, 300.0, 1000
    _, rng = _streams(n_keys)
    weights = np.full(n_keys, 1100, dtype=np.int64)
    keep, values = weighted_threshold(np.full(n_keys, 50, dtype=np.int64), weights,
                                      sigma_grid=sigma_grid, threshold_grid=threshold,
                                      count_sigma=8.0, rng=rng)
    _, replay = _streams(n_keys)      # the same streams: their first draw is the selection's
    selection_noise = np.asarray(samplers.discrete_gaussian(replay, sigma_grid, n_keys))
    assert (keep == (weights + selection_noise >= threshold)).all()   # replayed right
    assert keep.sum() >= 2500
    r = np.corrcoef(selection_noise[keep], values[keep] - 50)[0, 1]
    assert abs(r) < _MAX_CORRELATION, r


def test_adaptive_count_noise_has_a_stage_of_its_own(write_spec, tmp_path, monkeypatch):
    """The adaptive count stage draws from streams keyed by its own stage label, never a
    round's: its noise is independent of every selection draw."""
    from thresher.transforms.selection import release_fn
    stages = []
    original = release_fn.ReleaseBatchFn.__init__

    def record(self, release_table, rng_factory=None, stage=""):
        stages.append((getattr(release_table, "__name__", str(release_table)), stage))
        original(self, release_table, rng_factory, stage)
    monkeypatch.setattr(release_fn.ReleaseBatchFn, "__init__", record)
    _release(write_spec, tmp_path, **{"mechanism": {"kind": "adaptive"}})
    count = [s for name, s in stages if "CountNoise" in s]
    rounds = [s for name, s in stages if "CountNoise" not in s]
    assert len(count) == 1 and len(rounds) >= 2, stages
    assert count[0] not in rounds

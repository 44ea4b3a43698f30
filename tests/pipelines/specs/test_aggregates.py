"""End-to-end releases with ``aggregates`` (issue 14): real Beam runs (FnApiRunner), real
Parquet/CSV, the real CLI; spec errors naming the field; stages adding up."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.errors import SpecError
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run
from thresher.transforms.randomness import keyed_random

CLIP = [0.0, 200.0]
AGGREGATES = [{"column": "amount", "statistic": "sum", "clip": CLIP},
              {"column": "amount", "statistic": "mean", "clip": CLIP}]


def _data(tmp_path, fmt="parquet", n_users=6000, seed=4):
    """Users with 1-3 distinct keys (so a bound of 3 keeps every user-key), 1-4 records per
    user-key, log-normal amounts with some NaN / inf / null values."""
    rng = np.random.default_rng(seed)
    users, keys, amounts = [], [], []
    for u in range(n_users):
        for k in rng.choice(6, size=rng.integers(1, 4), replace=False, p=[.35, .25, .15, .1, .1, .05]):
            for _ in range(rng.integers(1, 5)):
                users.append(u)
                keys.append(f"k{k}")
                amounts.append(float(rng.lognormal(3.0, 1.2)))
    amounts = np.array(amounts)
    amounts[::97] = np.nan
    amounts[5::211] = np.inf
    table = pa.table({"uid": users, "key": keys,
                      "amount": pa.array(amounts, mask=np.arange(len(amounts)) % 301 == 7)})
    if fmt == "parquet":
        path = tmp_path / "data.parquet"
        pq.write_table(table, path)
    else:
        path = tmp_path / "data.csv"
        pcsv.write_csv(table, path)
    return str(path), table


def _truth(table, low=0.0, high=200.0):
    """Per key: users and the sum of their clamped totals (finite values only)."""
    df = table.to_pandas()
    df["amount"] = df["amount"].where(np.isfinite(df["amount"]), 0.0).fillna(0.0)
    per_user = df.groupby(["key", "uid"])["amount"].sum().clip(low, high)
    g = per_user.groupby("key")
    return {k: (int(n), float(s)) for k, n, s in zip(g.size().index, g.size(), g.sum())}


def _spec(write_spec, path, tmp_path, **changes):
    base = {"input.path": path, "input.user": "uid", "input.keys": ["key"],
            "input.format": path.rsplit(".", 1)[1],
            "privacy.epsilon": 1.0, "privacy.delta": 1e-6,
            "bounding.max_keys_per_user": 3, "aggregates": AGGREGATES}
    base.update(changes)
    return spec_mod.load(write_spec(base))


def _check_release(tmp_path, report, table, *, public=False):
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert released.schema.field("amount_sum").type == pa.float64()
    assert released.schema.field("amount_mean").type == pa.float64()
    truth = _truth(table)
    mech = report["mechanism"]
    count_sd = mech.get("sigma") or mech["scale"] * 2 ** 0.5
    entry = mech["aggregates"][0]
    sum_sd = entry.get("sigma") or entry["scale"] * 2 ** 0.5
    rows = released.to_pylist()
    assert {r["key"] for r in rows} == (set(truth) | ({"zz"} if public else set()))
    for r in rows:
        n, s = truth.get(r["key"], (0, 0.0))
        # within 7 noise sd (false failure < 7 keys x 2 x 1e-11 Gaussian; Laplace 7 sd
        # = 9.9 scales: < 7 x 2 x 5e-5) plus the grid rounding (<= n steps / 2)
        assert abs(r["count"] - n) <= 7 * count_sd
        assert abs(r["amount_sum"] - s) <= 7 * sum_sd + n * entry["grid_resolution"] / 2
        if r["count"] > 0:
            assert r["amount_mean"] == pytest.approx(min(200.0, max(0.0, r["amount_sum"] / r["count"])))
        else:
            assert r["amount_mean"] is None
    return rows


def test_gaussian_release_with_sum_and_mean_through_the_cli(write_spec, tmp_path, capsys):
    path, table = _data(tmp_path)
    spec_path = write_spec({"input.path": path, "input.user": "uid", "input.keys": ["key"],
                            "privacy.delta": 1e-6, "bounding.max_keys_per_user": 3,
                            "aggregates": AGGREGATES})
    assert main(["run", spec_path]) == 0
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    mech = report["mechanism"]
    assert mech["kind"] == "gaussian" and mech["delta_achieved"] <= 1e-6
    entry = mech["aggregates"][0]
    assert entry["grid_resolution"] == 2.0 ** -4 and entry["sensitivity_grid_units"] == 3200
    assert entry["sigma_grid_units"] == pytest.approx(3200 * mech["sigma"])
    assert mech["mu_o"] == pytest.approx(1 / mech["sigma"])
    assert report["privacy"]["stages"] == [{"name": "release", "epsilon": 1.0, "delta": 1e-6}]
    _check_release(tmp_path, report, table)
    assert main(["plan", spec_path, "--users", "2000", "--verbose"]) == 0
    out = capsys.readouterr().out
    assert "amount_sum: clip [0, 200], grid step 0.0625, discrete Gaussian sigma" in out
    assert "E|error| of the mean at 2000 users" in out


def test_laplace_release_with_aggregates_splits_epsilon(write_spec, tmp_path):
    path, table = _data(tmp_path)
    plan = make_plan(_spec(write_spec, path, tmp_path, **{"mechanism.kind": "laplace"}))
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(7))
    mech = report["mechanism"]
    assert mech["epsilon_count"] == 0.5 and mech["scale"] == pytest.approx(3 / 0.5)
    assert mech["aggregates"][0]["scale"] == pytest.approx(3 * 200 / 0.5)
    assert mech["aggregates"][0]["epsilon"] == 0.5
    _check_release(tmp_path, report, table)


@pytest.mark.parametrize("kind", ["gaussian", "laplace"])
def test_public_keys_release_with_aggregates(write_spec, tmp_path, kind):
    path, table = _data(tmp_path, fmt="csv")        # text values: parsed, bad ones dropped
    domain = tmp_path / "keys.csv"
    domain.write_text("key\n" + "\n".join(f"k{i}" for i in range(6)) + "\nzz\n")
    plan = make_plan(_spec(write_spec, path, tmp_path, **{
        "mechanism.kind": kind, "input.public_keys": {"path": str(domain)}}))
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(8))
    rows = _check_release(tmp_path, report, table, public=True)
    assert len(rows) == 7
    if kind == "laplace":
        assert report["privacy"]["delta_spent"] == 0
    else:
        from thresher.accounting.aggregates import joint_shift_delta
        sigma = report["mechanism"]["sigma"]
        assert joint_shift_delta(1.0, sigma, 3, ((3200, 3200 * sigma),)) <= 1e-6


def test_stages_add_up_with_aggregates_and_an_automatic_bound(write_spec, tmp_path):
    path, _ = _data(tmp_path, n_users=1500)
    plan = make_plan(_spec(write_spec, path, tmp_path, **{
        "bounding.max_keys_per_user": "auto", "bounding.auto": {"max_bound": 4}}))
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(2))
    stages = report["privacy"]["stages"]
    assert [s["name"] for s in stages] == ["choose_contribution_bound", "release"]
    assert sum(s["epsilon"] for s in stages) == pytest.approx(1.0)
    assert sum(s["delta"] for s in stages) == pytest.approx(1e-6)
    assert report["mechanism"]["delta_achieved"] <= stages[1]["delta"]
    assert "aggregates" in report["mechanism"]


@pytest.mark.parametrize("changes,field", [
    ({"mechanism": {"kind": "sample_and_threshold"}}, "aggregates"),
    ({"mechanism": {"kind": "weighted_sampling"}}, "aggregates"),
    ({"bounding.model": "l1", "mechanism.kind": "laplace"}, "aggregates"),
    ({"aggregates": [{"column": "amount", "statistic": "median", "clip": CLIP}]}, "aggregates[0].statistic"),
    ({"aggregates": [{"column": "amount", "statistic": "sum", "clip": [5, 1]}]}, "aggregates[0].clip"),
    ({"aggregates": [{"column": "amount", "statistic": "sum", "clip": [0, 1e-300]}]}, "aggregates[0].clip"),
    ({"aggregates": [{"column": "amount", "statistic": "sum", "clip": [0, ".inf"]}]}, "aggregates[0].clip[1]"),
    ({"aggregates": [{"column": "amount", "statistic": "sum", "clip": [0]}]}, "aggregates[0].clip"),
    ({"aggregates": [{"column": "amount", "statistic": "sum", "clip": "automatic"}]}, "aggregates[0].clip"),
    ({"aggregates": [{"column": "key", "statistic": "sum", "clip": CLIP}]}, "aggregates[0].column"),
    ({"aggregates": [{"column": "amount", "statistic": "sum"}]}, "aggregates[0].clip"),
    ({"aggregates": [{"column": "amount", "statistic": "sum", "clip": CLIP, "x": 1}]}, "aggregates[0].x"),
    ({"aggregates": AGGREGATES + [{"column": "amount", "statistic": "sum", "clip": [0, 5]}]}, "aggregates[2]"),
    ({"aggregates": []}, "aggregates"),
])
def test_aggregate_spec_errors_name_the_field(write_spec, tmp_path, changes, field):
    path, _ = _data(tmp_path, n_users=50)
    base = {"input.path": path, "input.user": "uid", "input.keys": ["key"],
            "bounding.max_keys_per_user": 3, "aggregates": AGGREGATES}
    base.update(changes)
    with pytest.raises(SpecError) as err:
        spec_mod.load(write_spec(base))
    assert err.value.field == field, str(err.value)


def test_missing_value_column_is_a_spec_error_with_exit_code_2(write_spec, tmp_path, capsys):
    path, _ = _data(tmp_path, n_users=50)
    spec_path = write_spec({"input.path": path, "input.user": "uid", "input.keys": ["key"],
                            "bounding.max_keys_per_user": 3,
                            "aggregates": [{"column": "price", "statistic": "sum", "clip": CLIP}]})
    assert main(["validate", spec_path]) == 2
    assert "column 'price' is not in" in capsys.readouterr().err


def test_value_column_shuffles_only_with_aggregates(write_spec, tmp_path):
    path, _ = _data(tmp_path, n_users=50)
    plain = spec_mod.load(write_spec({"input.path": path, "input.user": "uid",
                                      "input.keys": ["key"]}))
    assert plain.input.columns == ["uid", "key"]
    with_values = _spec(write_spec, path, tmp_path)
    assert with_values.input.columns == ["uid", "key", "amount"]


def test_clip_auto_with_auto_bound_stages_add_up_and_bounds_are_reported(write_spec, tmp_path):
    """clip: auto and max_keys_per_user: auto together: three stages adding up to the spec's
    (epsilon, delta); the chosen clip is a power of two within a factor 2 of the 0.99
    quantile of the per-(user, key) totals (the 60 users above it against the draw's rank
    error: exp(-0.25 * 60) per far candidate at epsilon 0.5, 31 candidates), and the sums
    are within noise of the truth clamped at the chosen bound."""
    path, table = _data(tmp_path)
    spec = _spec(write_spec, path, tmp_path, **{
        "bounding.max_keys_per_user": "auto", "bounding.auto": {"max_bound": 4},
        "aggregates": [{"column": "amount", "statistic": "sum", "clip": "auto"},
                       {"column": "amount", "statistic": "mean", "clip": "auto"}],
        "aggregates_auto": {"epsilon": 0.5, "quantile": 0.99}})
    plan = make_plan(spec)
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(12))
    stages = report["privacy"]["stages"]
    assert [s["name"] for s in stages] == ["choose_contribution_bound", "choose_aggregate_clip",
                                           "release"]
    assert sum(s["epsilon"] for s in stages) == pytest.approx(1.0)
    assert sum(s["delta"] for s in stages) == pytest.approx(1e-6)
    assert stages[1]["epsilon"] == 0.5
    entries = report["mechanism"]["aggregates"]
    low, high = entries[0]["clip"]
    assert low == 0 and entries[1]["clip"] == [low, high]
    assert entries[0]["clip_chosen_by"] == "exponential_mechanism"
    df = table.to_pandas()
    df["amount"] = df["amount"].where(np.isfinite(df["amount"]), 0.0).fillna(0.0)
    q99 = df.groupby(["key", "uid"])["amount"].sum().quantile(0.99)
    assert q99 / 2 <= high <= q99 * 2
    assert entries[0]["sigma"] == pytest.approx(entries[0]["sigma_grid_units"] / entries[0]["grid_scale"])
    assert entries[0]["grid_scale"] * high == 4096
    released = pq.read_table(tmp_path / "out" / "released.parquet").to_pylist()
    truth = _truth(table, 0.0, high)
    c = report["bounding"]["max_keys_per_user"]
    for r in released:
        n, s = truth[r["key"]]
        if c >= 3:   # every user-key kept: the clamped truth is exact
            assert abs(r["amount_sum"] - s) <= 7 * entries[0]["sigma"] + n * entries[0]["grid_resolution"]


def test_aggregates_auto_needs_an_auto_clip(write_spec, tmp_path):
    path, _ = _data(tmp_path, n_users=50)
    with pytest.raises(SpecError) as err:
        _spec(write_spec, path, tmp_path, aggregates_auto={"epsilon": 0.1})
    assert err.value.field == "aggregates_auto"
    with pytest.raises(SpecError) as err:
        _spec(write_spec, path, tmp_path, aggregates_auto={"quantile": 1.5},
              aggregates=[{"column": "amount", "statistic": "sum", "clip": "auto"}])
    assert err.value.field == "aggregates_auto.quantile"


def test_inputs_beyond_the_overflow_bound_are_refused():
    from thresher.accounting.aggregates import MAX_USERS
    from thresher.pipelines.specs.aggregates import check_rows
    from thresher.pipelines.errors import InputError
    check_rows(MAX_USERS)
    with pytest.raises(InputError, match="input.path"):
        check_rows(MAX_USERS + 1)

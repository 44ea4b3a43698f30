"""transforms.values.aggregate_values: value preparation, per-(user, key) totals, clamping on the
grid, bounding, and the release kernel."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.accounting.aggregates import fixed_point_grid
from thresher.transforms.values import aggregate_values as av
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN


def test_prepare_values_drops_nan_inf_null_and_non_numbers():
    col = pa.array([1.5, None, float("nan"), float("inf"), -float("inf"), -2.0])
    values, dropped = av.prepare_values(col)
    assert dropped == 4
    assert values.to_pylist() == [1.5, None, None, None, None, -2.0]
    text = pa.array(["3", "abc", "", None, "nan", "1e3", "-inf"])
    values, dropped = av.prepare_values(text, as_text=True)
    assert values.to_pylist() == [3.0, None, None, None, None, 1000.0, None] and dropped == 5
    ints, dropped = av.prepare_values(pa.array([1, 2, None], type=pa.int32()))
    assert ints.to_pylist() == [1.0, 2.0, None] and dropped == 1
    with pytest.raises(TypeError):
        av.prepare_values(pa.array([[1], [2]]))


def _records(rows):
    """rows: (user, key, value) -> a prepared table (hashes are the ids themselves)."""
    users, keys, values = zip(*rows)
    return pa.table({USER_COLUMN: pa.array(users, type=pa.uint64()),
                     KEY_HASH_COLUMN: pa.array(keys, type=pa.uint64()),
                     "k": pa.array([f"key{k}" for k in keys]),
                     "__v0": pa.array(values, type=pa.float64())})


def test_totals_are_summed_per_user_then_clamped():
    """User 1 has 150 + 150 for key 7: the total 300 is clamped to 200 (a user moves one
    key's sum by at most the clip); user 2's values for key 7 are all dropped (total 0);
    user 3 has a negative total clamped to 0."""
    table = _records([(1, 7, 150.0), (1, 7, 150.0), (2, 7, None), (3, 7, -5.0), (3, 7, 1.0),
                      (1, 8, 10.0), (2, 8, 20.0), (2, 8, 0.25)])
    grid = fixed_point_grid(0, 200)                          # scale 16
    out, kept = av.bound_with_values(table, ["k"], [("__v0", grid)], 5, np.random.default_rng(0))
    assert kept == 5
    rows = {r["k"]: r for r in out.to_pylist()}
    assert rows["key7"]["count"] == 3 and rows["key7"]["__s0"] == 200 * 16
    assert rows["key8"]["count"] == 2 and rows["key8"]["__s0"] == int(30.25 * 16)


def test_bound_keeps_at_most_c_keys_per_user_with_their_totals():
    rows = [(1, k, float(k)) for k in range(1, 11) for _ in range(3)]   # 10 keys, 3 records each
    grid = fixed_point_grid(0, 100)
    out, kept = av.bound_with_values(_records(rows), ["k"], [("__v0", grid)], 3,
                                     np.random.default_rng(1))
    assert kept == 3 and out.num_rows == 3
    for r in out.to_pylist():
        k = int(r["k"][3:])
        assert r["count"] == 1 and r["__s0"] == 3 * k * int(grid.scale)


def _params(noise_sd=2.0, public=False):
    p = {"noise": "discrete_gaussian", "sigma": 1.0, "pre_threshold": 1, "threshold": 5,
         "aggregates": [
             {"column": "v", "statistic": "sum", "output": "v_sum", "clip": [0.0, 10.0],
              "sum_column": 0, "grid_scale": 256.0, "noise": "discrete_gaussian",
              "sigma_grid_units": noise_sd},
             {"column": "v", "statistic": "mean", "output": "v_mean", "clip": [0.0, 10.0],
              "sum_column": 0, "grid_scale": 256.0, "noise": "discrete_gaussian",
              "sigma_grid_units": noise_sd}]}
    if public:
        p["public_keys"] = True
        del p["threshold"]
    return p


def test_release_kernel_outputs_sum_and_clamped_mean():
    table = pa.table({"k": ["a", "b", "c"], "count": pa.array([100, 1, 40], type=pa.int64()),
                      "__s0": pa.array([256 * 500, 256 * 3, 256 * 400], type=pa.int64())})
    out = av.release_with_aggregates(table, _params(), np.random.default_rng(3))
    assert out.column_names == ["k", "count", "v_sum", "v_mean"]
    rows = {r["k"]: r for r in out.to_pylist()}
    assert "b" not in rows                                   # below the threshold
    a = rows["a"]
    assert abs(a["count"] - 100) <= 8 and abs(a["v_sum"] - 500) <= 16 / 256
    assert a["v_mean"] == pytest.approx(a["v_sum"] / a["count"])
    # mean of 400 / ~40 = ~10: clamped to the clip's high end at most
    assert rows["c"]["v_mean"] <= 10.0


def test_release_kernel_mean_is_null_when_the_noisy_count_is_not_positive():
    table = pa.table({"k": ["a", "b"], "count": pa.array([0, 0], type=pa.int64()),
                      "__s0": pa.array([0, 0], type=pa.int64())})
    params = _params(public=True)
    params["sigma"] = 1e-9 + 0.3                              # noisy counts mostly 0
    out = av.release_with_aggregates(table, params, np.random.default_rng(0))
    assert out.num_rows == 2
    for r in out.to_pylist():
        assert (r["v_mean"] is None) == (r["count"] <= 0)


def test_noisy_outputs_draw_integer_noise_on_the_grid():
    params = _params(noise_sd=5.0)
    out = av.noisy_outputs(np.full(20000, 10), {0: np.zeros(20000, dtype=np.int64)}, params,
                           np.random.default_rng(9))["v_sum"] * 256
    assert np.all(out == np.rint(out))                       # integers on the grid
    # sd 5 grid units; the sample sd of 20000 draws is within 5% (false failure < 1e-9)
    assert np.std(out) == pytest.approx(5.0, rel=0.05)

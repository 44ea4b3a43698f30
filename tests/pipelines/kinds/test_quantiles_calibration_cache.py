"""quantiles' forward check of a cached public-cells calibration (issue 43 item 4): the
plan rebuilt from the cached sigma and key selection is the calibrated plan, field for
field; a sigma or selection that misses the budget, or any edited field, is refused (the
cache then recalibrates)."""
import copy

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.kinds import quantiles
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod


def _mech(tmp_path, public_keys):
    data = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"user": ["u"], "country": ["a"], "x": [1.0]}), data)
    spec = {"name": "q", "input": {"path": data, "user": "user", "keys": ["country"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "bounding": {"max_keys_per_user": 3},
            "mechanism": {"kind": "quantiles", "column": "x", "ranks": [0.25, 0.5],
                          "domain": [0, 1000]},
            "output": {"path": str(tmp_path / "out")}}
    if public_keys:
        domain = tmp_path / "keys.csv"
        domain.write_text("country\na\nb\n")
        spec["input"]["public_keys"] = {"path": str(domain)}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    mech = make_plan(spec_mod.load(str(path))).spec.mechanism
    assert mech.get("public_cells") and bool(mech.get("key_selection")) is not public_keys
    return mech


@pytest.mark.parametrize("public_keys", [False, True])
def test_cached_public_cells_plan_is_rechecked_not_searched(tmp_path, public_keys):
    mech = _mech(tmp_path, public_keys)
    kw = dict(epsilon=0.5, delta=5e-7, max_keys_per_user=3, model="l0")
    plan = quantiles.calibrate(mech, **kw)
    assert quantiles.verify_calibration(copy.deepcopy(plan), mech, **kw)
    assert quantiles.Quantiles.verify_calibration is not None
    # a sigma that misses the budget, a smaller delta than the plan was made for, an
    # edited report field: all refused
    low = dict(plan, sigma=plan["sigma"] * 0.9)
    assert not quantiles.verify_calibration(low, mech, **kw)
    assert not quantiles.verify_calibration(plan, mech, **dict(kw, delta=1e-9))
    assert not quantiles.verify_calibration(dict(plan, support_floor=0.0), mech, **kw)
    assert not quantiles.verify_calibration(dict(plan, sigma=int(plan["sigma"]) + 1), mech, **kw)
    if not public_keys:
        sel = dict(plan["key_selection"], threshold=1)
        assert not quantiles.verify_calibration(dict(plan, key_selection=sel), mech, **kw)
        sel = dict(plan["key_selection"], threshold=plan["key_selection"]["threshold"] + 5)
        assert not quantiles.verify_calibration(dict(plan, key_selection=sel), mech, **kw)

"""A user too large for a release that holds all of a user's rows fails closed (issue 34).

With ``max_keys_per_user: auto``, ``bounding.model: l1``, ``kind: adaptive`` or
``aggregates``, every row of a user meets in one element of the user shuffle: one user
with 1e7 rows took 1.6-5.5 GB in process. Each consumer of the shuffle now counts a
shard's rows per user before concatenating it (``transforms.user_shards.
check_user_rows``) and refuses a user above ``MAX_USER_ROWS``: exit 2, a message naming
the setting, nothing published. A fixed l0 bound pre-reduces the user instead and
releases. Real CLI runs on real Parquet (more than 15,625 rows, so the shuffle spills to
files); the limit is lowered to 300 rows for the test. Deterministic.
"""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines import cli, release
from thresher.transforms import prereduce

HEAVY_ROWS = 2000


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    rng = np.random.default_rng(34)
    users = [f"u{u}" for u in range(3600) for _ in range(5)] + ["heavy"] * HEAVY_ROWS
    words = [f"w{w}" for w in rng.integers(0, 40, size=18000)] + ["w1"] * HEAVY_ROWS
    order = rng.permutation(len(users))
    table = pa.table({"user_id": pa.array(users).take(order),
                      "word": pa.array(words).take(order),
                      "amount": pa.array(rng.integers(0, 9, size=len(users)) / 2.0)})
    path = str(tmp_path_factory.mktemp("heavy") / "input.parquet")
    pq.write_table(table, path, row_group_size=5000)
    return path


CASES = {
    "auto": ({"bounding": {"max_keys_per_user": "auto"}}, "bounding.max_keys_per_user"),
    "l1": ({"bounding": {"max_keys_per_user": 4, "model": "l1"},
            "mechanism": {"kind": "laplace"}}, "bounding.model"),
    "adaptive": ({"bounding": {"max_keys_per_user": 4}, "mechanism": {"kind": "adaptive"}},
                 "mechanism.kind"),
    "aggregates": ({"bounding": {"max_keys_per_user": 4},
                    "aggregates": [{"column": "amount", "statistic": "sum",
                                    "clip": [0.0, 5.0]}]}, "aggregates"),
    "fixed": ({"bounding": {"max_keys_per_user": 4}}, None),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_a_user_over_the_limit_fails_closed_naming_the_setting(tmp_path, monkeypatch, capsys,
                                                               data, case):
    monkeypatch.setattr(release, "MAX_USER_ROWS", 300)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)   # small tables here
    change, field = CASES[case]
    doc = {"name": case, "input": {"path": data, "format": "parquet", "user": "user_id",
                                   "keys": ["word"]},
           "privacy": {"epsilon": 1.0, "delta": 1.0e-8},
           "mechanism": {"kind": "gaussian"},
           "output": {"path": str(tmp_path / "out")}}
    for section, values in change.items():
        if isinstance(values, dict):
            doc.setdefault(section, {}).update(values)
        else:
            doc[section] = values
    spec = tmp_path / "spec.yaml"
    spec.write_text(yaml.safe_dump(doc))
    code = cli.main(["run", str(spec), "--quiet"])
    err = capsys.readouterr().err
    if field is None:   # fixed l0: the heavy user is pre-reduced, the release goes ahead
        assert code == 0 and os.path.exists(tmp_path / "out" / "released.parquet")
        return
    assert code == 2, err
    assert f"{field}: one user has {HEAVY_ROWS:,} rows" in err and "at most 300" in err
    assert not os.path.exists(tmp_path / "out")

"""A public key domain (``input.public_keys``) pre-reduces a heavy user too (issue 43,
item 2): the domain filter runs before the user shuffle, and the fixed bound's
pre-reduction (transforms/bounding/prereduce.py) after it, so it keeps a superset of a
user's first C keys among its in-domain keys, which is what the bounding keeps.

Through ``pipelines.running.release.run`` under one fixed secret: the published bytes are
the same with and without the step, forced either way (``MODE``), for counts and for an
aggregate sum; and heavy users (3,000 rows, 2,000 on one in-domain key; 1,500 on two) run at a
whole-user limit of 300 rows, where without the step the same limit refuses the run
naming ``input.public_keys``. Deterministic (no statistical assertions).
"""
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running import release
from thresher.pipelines.specs import spec as spec_mod
from thresher.transforms.bounding import prereduce, user_shards
from thresher.transforms.randomness import keyed_random
from tests.transforms.bounding.test_prereduce_aggregates import _records

SECRET = b"test-only secret: public keys 43"
BOUND = 4
SUM = [{"column": "amount", "statistic": "sum", "clip": [-5.0, 10.0]}]


def _run(folder, table, aggregates=None):
    data = os.path.join(folder, "input.parquet")
    domain = os.path.join(folder, "keys.parquet")
    if not os.path.exists(data):
        pq.write_table(table, data, row_group_size=1000)        # several read batches
        # w0..w19 and half of h's own words: h's rows are in and out of the domain
        words = [f"w{i}" for i in range(20)] + [f"h{i}" for i in range(0, 200, 2)]
        pq.write_table(pa.table({"word": words}), domain)
    doc = {"name": "prereduce-public-keys",
           "input": {"path": data, "format": "parquet", "user": "user_id", "keys": ["word"],
                     "public_keys": {"path": domain}},
           "privacy": {"epsilon": 1.0, "delta": 1.0e-8},
           "bounding": {"max_keys_per_user": BOUND},
           "mechanism": {"kind": "gaussian"},
           "output": {"path": os.path.join(folder, "out")}}
    if aggregates:
        doc["aggregates"] = aggregates
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    release.run(make_plan(spec_mod.load(path)), [],
                rng_factory=keyed_random.KeyedSource(SECRET))
    with open(os.path.join(folder, "out", "released.parquet"), "rb") as handle:
        return handle.read()


def _most_rows_of_one_user_per_split(monkeypatch):
    seen = []
    split = user_shards.split_by_shard

    def recording(table, shard_ids, num_shards):
        users = table.column(user_shards.USER_COLUMN).to_numpy()
        seen.append(int(np.unique(users, return_counts=True)[1].max()))
        return split(table, shard_ids, num_shards)

    monkeypatch.setattr(user_shards, "split_by_shard", recording)
    return seen


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
@pytest.mark.parametrize("aggregates", [None, SUM], ids=["counts", "sum"])
def test_release_bytes_are_the_same_with_and_without_the_step(tmp_path, monkeypatch, mode,
                                                              aggregates):
    monkeypatch.setattr(prereduce, "MODE", mode)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)   # small tables here
    table = _records()
    seen = _most_rows_of_one_user_per_split(monkeypatch)
    reduced = _run(str(tmp_path), table, aggregates)
    with_step = list(seen)
    seen.clear()
    shutil.rmtree(tmp_path / "out")     # the same spec and paths: the same config digest
    monkeypatch.setattr(release, "_prereduced", lambda records, plan, rng_factory: records)
    whole = _run(str(tmp_path), table, aggregates)
    assert len(reduced) > 500 and reduced == whole
    assert max(seen) >= 2000                          # h's in-domain rows, without the step
    if mode != "never":
        assert max(with_step) <= 3 * BOUND


@pytest.mark.parametrize("aggregates", [None, SUM], ids=["counts", "sum"])
def test_a_heavy_user_is_bounded_not_refused(tmp_path, monkeypatch, aggregates):
    from thresher.errors import ThresherError
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)
    table = _records()
    monkeypatch.setattr(release, "MAX_USER_ROWS", 300)
    bounded = _run(str(tmp_path), table, aggregates)
    shutil.rmtree(tmp_path / "out")
    monkeypatch.setattr(release, "_prereduced", lambda records, plan, rng_factory: records)
    field = "aggregates" if aggregates else "input.public_keys"
    with pytest.raises(ThresherError, match=f"{field}: a user has more than 300 rows"):
        _run(str(tmp_path), table, aggregates)
    shutil.rmtree(tmp_path / "out", ignore_errors=True)
    monkeypatch.setattr(release, "MAX_USER_ROWS", 1 << 21)
    assert _run(str(tmp_path), table, aggregates) == bounded


SEVERAL = [{"column": "amount", "statistic": "sum", "clip": [-5.0, 10.0]},
           {"column": "amount", "statistic": "variance", "clip": [-5.0, 10.0]},
           {"column": "b", "statistic": "mean", "clip": [0.0, 3.0]},
           {"column": "b", "statistic": "stddev", "clip": [-1.0, 5.0]}]


@pytest.mark.parametrize("auto", [False, True], ids=["fixed", "clip_auto"])
def test_several_aggregate_columns_give_the_same_bytes(tmp_path, monkeypatch, auto):
    """Two value columns at once (b: null on every row of the in-domain word w1, where h
    holds 2,000 rows, and on a tenth of the others; its magnitudes spread over six decimal
    orders), a sum, a variance, a mean and a stddev, with fixed clips and with one
    ``clip: auto`` (no key cut): the published bytes with the step forced on every table
    are those without it."""
    monkeypatch.setattr(prereduce, "MODE", "always")
    table = _records()
    rng = np.random.default_rng(5)
    words = np.array(table.column("word").to_pylist())
    b = np.round(rng.normal(1.0, 1.0, table.num_rows), 3) * 10.0 ** rng.integers(
        -3, 3, table.num_rows)
    b[(words == "w1") | (rng.random(table.num_rows) < 0.1)] = np.nan
    table = table.append_column("b", pa.array(b, from_pandas=True))
    aggregates = [dict(a) for a in SEVERAL]
    if auto:
        aggregates[0]["clip"] = "auto"
        aggregates[0]["statistic"] = "mean"
    reduced = _run(str(tmp_path), table, aggregates)
    shutil.rmtree(tmp_path / "out")
    monkeypatch.setattr(release, "_prereduced", lambda records, plan, rng_factory: records)
    assert _run(str(tmp_path), table, aggregates) == reduced

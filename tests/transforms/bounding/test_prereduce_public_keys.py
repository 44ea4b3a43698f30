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

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.transforms.bounding import prereduce
from tests.transforms.release_runs import (
    bounded_not_refused, released, with_and_without, without_step)
from tests.transforms.release_runs import heavy_users_with_amounts as _records

SECRET = b"test-only secret: public keys 43"
BOUND = 4
SUM = [{"column": "amount", "statistic": "sum", "clip": [-5.0, 10.0]}]


def _run(folder, table, aggregates=None):
    domain = os.path.join(folder, "keys.parquet")
    # w0..w19 and half of h's own words: h's rows are in and out of the domain
    words = [f"w{i}" for i in range(20)] + [f"h{i}" for i in range(0, 200, 2)]
    pq.write_table(pa.table({"word": words}), domain)
    return released(folder, table, SECRET, "prereduce-public-keys",
                    {"max_keys_per_user": BOUND}, {"kind": "gaussian"}, public_keys=domain,
                    aggregates=aggregates)


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
@pytest.mark.parametrize("aggregates", [None, SUM], ids=["counts", "sum"])
def test_release_bytes_are_the_same_with_and_without_the_step(tmp_path, monkeypatch, mode,
                                                              aggregates):
    monkeypatch.setattr(prereduce, "MODE", mode)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)   # small tables here
    table = _records()
    reduced, with_step, whole, seen = with_and_without(
        monkeypatch, lambda: _run(str(tmp_path), table, aggregates),
        lambda: without_step(monkeypatch))
    assert len(reduced) > 500 and reduced == whole
    assert max(seen) >= 2000                          # h's in-domain rows, without the step
    if mode != "never":
        assert max(with_step) <= 3 * BOUND


@pytest.mark.parametrize("aggregates", [None, SUM], ids=["counts", "sum"])
def test_a_heavy_user_is_bounded_not_refused(tmp_path, monkeypatch, aggregates):
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)
    table = _records()
    field = "aggregates" if aggregates else "input.public_keys"
    bounded_not_refused(monkeypatch, lambda: _run(str(tmp_path), table, aggregates),
                        lambda: without_step(monkeypatch), 300,
                        f"{field}: a user has more than 300 rows")


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
    without_step(monkeypatch)
    assert _run(str(tmp_path), table, aggregates) == reduced

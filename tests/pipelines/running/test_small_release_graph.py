"""The pipeline of a small release (docs/performance.md, Start-up): one local Parquet file
of one row group is read without a Reshuffle, an input of at most ROWS_PER_SHARD / 64 rows
is one user shard and one key shard whose shuffles stay in memory, a fixed bound's
parameters are an argument rather than a one-element side input, and the released
tables reach the writer as one side input rather than through a global combine. The
in-process runner then runs four fused stages instead of seven, and publishes the same
bytes under one secret as the general graph (Reshuffle, four shards, spilled shuffles)."""
import os

import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.dataio import io

from thresher.pipelines.running import live_metrics

from thresher.pipelines.running import release

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from tests.privacy import harness
from thresher.transforms.randomness import keyed_random
from thresher.transforms.plumbing import spill

SECRET = b"test-only release secret: 32 B.."


def _run(folder, spec, monkeypatch, general=False):
    """Release ``spec`` on a 999-row, one-row-group input under SECRET; returns (the
    published bytes, the fused stages the runner ran, spill pieces written)."""
    os.makedirs(folder)
    pq.write_table(harness.dataset(n_users=333), os.path.join(folder, "data.parquet"),
                   row_group_size=10**6)
    with open(os.path.join(folder, "domain.csv"), "w", encoding="utf-8") as handle:
        handle.write("word\n" + "\n".join(harness.DOMAIN) + "\n")
    path = os.path.join(folder, "spec.yaml")   # relative paths: the same spec text
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle)
    stages, pieces = [], []
    real_bundle, real_write = live_metrics.LiveMetricsRunner._execute_bundle, spill.write_piece

    def bundle(self, context, manager, data):
        stages.append(manager.stage.name)
        return real_bundle(self, context, manager, data)
    with monkeypatch.context() as patch:
        patch.chdir(folder)
        patch.setattr(live_metrics.LiveMetricsRunner, "_execute_bundle", bundle)
        patch.setattr(spill, "write_piece", lambda t, f: pieces.append(1) or real_write(t, f))
        if general:   # the graph of a larger input: Reshuffle, 4 shards, spilled shuffles
            patch.setattr(io, "SMALL_INPUT_DIVISOR", 10**9)
            patch.setattr(io.ReadRecords, "_single_row_group", lambda self: None)
        plan = make_plan(spec_mod.load("spec.yaml"))
        release.run(plan, rng_factory=keyed_random.KeyedSource(SECRET))
    out = os.path.join(folder, "out")
    published = {name: open(os.path.join(out, name), "rb").read() for name in sorted(os.listdir(out))}
    return published, stages, len(pieces)


@pytest.mark.parametrize("case", [
    dict(kind="gaussian"),
    dict(kind="gaussian", auto=True),
    dict(kind="laplace", public_keys=True),
    dict(kind="gaussian", aggregates=[{"column": "amount", "statistic": "sum", "clip": [0, 100]}]),
], ids=["gaussian", "gaussian_auto", "laplace_public_keys", "gaussian_aggregates"])
def test_small_input_graph_publishes_the_general_graphs_bytes(case, tmp_path, monkeypatch):
    spec = harness.spec_dict(**case)
    small, small_stages, small_pieces = _run(str(tmp_path / "small"), spec, monkeypatch)
    general, general_stages, general_pieces = _run(str(tmp_path / "general"), spec, monkeypatch,
                                                   general=True)
    assert sorted(small) == ["release_report.json", "released.parquet"]
    assert small == general
    assert small_pieces == 0 and general_pieces > 0         # the general graph did spill
    assert len(small_stages) < len(general_stages)
    assert not any("SpreadRowGroups" in s for s in small_stages)
    assert any("SpreadRowGroups" in s for s in general_stages)


def test_a_thousand_row_fixed_bound_release_runs_four_stages(tmp_path, monkeypatch):
    """Read to user shuffle; bound to key shuffle; sum and release; write. (Seven before:
    the parameters' Create, the read's Reshuffle and ToList's merge and default stages.)"""
    _, stages, pieces = _run(str(tmp_path / "a"), harness.spec_dict(kind="gaussian"), monkeypatch)
    assert len(stages) == 4, stages
    assert pieces == 0
    assert not any(word in s for s in stages for word in ("Params", "CombinePerKey", "DoOnce"))


def test_shard_count_of_small_and_large_inputs():
    per_shard = io.ROWS_PER_SHARD
    small = per_shard // io.SMALL_INPUT_DIVISOR
    assert [io.num_shards_for(r, exact=True) for r in (0, 1, 1000, small)] == [1, 1, 1, 1]
    assert io.num_shards_for(small + 1, exact=True) == io.MIN_SHARDS
    # an estimated count (text input: from the file's size, compressed or unlisted files
    # can hold far more rows) never takes the one-shard, in-memory path
    assert [io.num_shards_for(r) for r in (1, 1000, small)] == [io.MIN_SHARDS] * 3
    assert not io.is_small_input(1000, exact=False) and io.is_small_input(1000, exact=True)
    assert io.num_shards_for(4 * per_shard) == 4 and io.num_shards_for(4 * per_shard + 1) == 5
    assert io.num_shards_for(10**13) == io.MAX_SHARDS

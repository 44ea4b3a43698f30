"""The seam "summation order" end to end (issue 25, F2): under one secret, a release with
private choices (``max_keys_per_user: auto``, ``clip: auto``) publishes the same bytes on
the in-process runner, on two worker processes, with repeated bundles and with other
user-shard counts.

Before the exact scores (``accounting.exact_scores``) the score vectors were float sums
whose order depended on the runner: on the 1e6-row, two-file input below the in-process
runner chose C = 6 and two worker processes chose C = 8 (same secret, same data; the
first test reproduces that and failed on 364e7c4). Both tests run several full releases
(about 1-2 minutes each on an idle machine), so they are marked slow:

    python -m pytest tests/pipelines/running/test_summation_order.py -m slow

The fast guard of the same seam is tests/accounting/test_exact_scores.py.
"""
import os
import shutil

import numpy as np
import pytest
import yaml

from benchmarks import datagen
from thresher.pipelines.dataio import io as pio
from thresher.pipelines.running import release
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.transforms.randomness import keyed_random

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
SECRET = b"test-only release secret: 32 B.."
TWO_WORKERS = ["--direct_running_mode=multi_processing", "--direct_num_workers=2"]

pytestmark = pytest.mark.slow


def _write_parts(folder, rows, users, seed, values=False):
    """``rows`` synthetic (user_id, word[, amount]) records in two Parquet files."""
    table = datagen.generate(rows, users=users, vocabulary_size=50_000, seed=seed)
    if values:
        rng = np.random.default_rng(seed)
        import pyarrow as pa
        table = table.append_column("amount", pa.array(rng.lognormal(2.0, 1.5, rows)))
    os.makedirs(folder, exist_ok=True)
    half = rows // 2
    datagen.write(table.slice(0, half), os.path.join(folder, "part-0.parquet"))
    datagen.write(table.slice(half), os.path.join(folder, "part-1.parquet"))
    return os.path.join(folder, "part-*.parquet")


def _release(folder, data, extra, beam_args=()):
    """One release under SECRET; (C, released.parquet bytes, release_report.json bytes).
    Every run of a test uses the same ``folder`` (the report carries the spec, output path
    included); the output is removed after it is read."""
    spec = {"name": "summation-order",
            "input": {"path": data, "format": "parquet", "user": "user_id", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8},
            "bounding": {"max_keys_per_user": "auto"},
            "mechanism": {"kind": "gaussian"},
            "output": {"path": os.path.join(folder, "out")}}
    spec.update(extra)
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle)
    report = release.run(make_plan(spec_mod.load(path)), list(beam_args),
                         rng_factory=keyed_random.KeyedSource(SECRET))
    out = os.path.join(folder, "out")
    with open(os.path.join(out, "released.parquet"), "rb") as handle:
        released = handle.read()
    with open(os.path.join(out, "release_report.json"), "rb") as handle:
        report_bytes = handle.read()
    shutil.rmtree(out)
    return report["bounding"]["max_keys_per_user"], released, report_bytes


@pytest.fixture
def workers_import_thresher(monkeypatch):
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))


def test_auto_bound_of_1e6_rows_is_the_same_in_process_and_on_two_workers(
        tmp_path, workers_import_thresher):
    """The reported case: 1e6 rows in two files, ``auto``, one secret. On 364e7c4 the
    in-process runner chose C = 6 and two worker processes C = 8 (float score sums added
    in another order); with exact scores both choose one C and publish the same bytes."""
    data = _write_parts(str(tmp_path / "data"), 1_000_000, users=100_000, seed=3)
    run = str(tmp_path / "run")
    in_process = _release(run, data, {})
    two_workers = _release(run, data, {}, TWO_WORKERS)
    assert in_process[0] == two_workers[0]
    assert in_process[1] == two_workers[1]
    assert in_process[2] == two_workers[2]


def test_auto_bound_and_auto_clip_publish_the_same_bytes_on_every_runner_and_layout(
        tmp_path, monkeypatch, workers_import_thresher):
    """``auto`` and ``clip: auto`` together: the in-process runner, two worker processes,
    repeated bundles and 4 vs 12 user shards publish identical released.parquet and
    release_report.json bytes."""
    data = _write_parts(str(tmp_path / "data"), 300_000, users=30_000, seed=5, values=True)
    extra = {"aggregates": [{"column": "amount", "statistic": "sum", "clip": "auto"},
                            {"column": "amount", "statistic": "mean", "clip": "auto"}]}
    run = str(tmp_path / "run")
    runs = {"in_process": _release(run, data, extra),
            "bundle_repeat": _release(run, data, extra, ["--direct_runner_bundle_repeat=2"]),
            "two_workers": _release(run, data, extra, TWO_WORKERS)}
    # 300,000 rows: 4 user shards by default (pipelines.io.MIN_SHARDS); 12 with 25,000 rows
    # per shard
    monkeypatch.setattr(pio, "ROWS_PER_SHARD", 25_000)
    runs["twelve_shards"] = _release(run, data, extra)
    first = runs["in_process"]
    assert b"amount_sum" in first[1] and b"clip" in first[2]
    for name, got in runs.items():
        assert got[0] == first[0], name
        assert got[1] == first[1], name
        assert got[2] == first[2], name

"""Randomness that survives recomputation (transforms/randomness/keyed_random.py), end to end.

A release draws every value from its secret and the identity of what is drawn, so
(a) the same spec run twice under one secret publishes the same bytes; (b) re-running
bundles (``--direct_runner_bundle_repeat``), a different runner and bundling
(BundleBasedDirectRunner, multi-process FnApiRunner workers), different bundle splits of
a release DoFn, and a stage materialised twice from the same PCollection draw the same
values; (c) another secret publishes other values. The secret is fixed here through the
test-only ``rng_factory`` argument of ``pipelines.running.release.run``; production draws it in
``run`` from ``os.urandom``.

Failure probabilities of the "differs" checks are stated where they are made.
"""
import copy
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that

from thresher.pipelines.running import release

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from tests.transforms.bounding.test_choose_contribution_bound import _choose, _records
from thresher.transforms.randomness import keyed_random
from thresher.transforms.selection.noisy_threshold import release_table as noisy_release
from thresher.transforms.selection.release_fn import ReleaseBatchFn
from thresher.transforms.selection.sample_and_threshold import release_table as sample_release

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
QUICKSTART = os.path.join(ROOT, "configs", "examples", "quickstart.yaml")
SECRET = b"test-only release secret: 32 B.."


def _release(folder, secret, beam_args=(), changes=None, rows=None):
    """Run the quickstart (optionally changed) under ``secret``; the released bytes."""
    with open(QUICKSTART, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    doc = copy.deepcopy(doc)
    doc["input"]["path"] = os.path.join(ROOT, doc["input"]["path"])
    if rows is not None:   # a smaller input keeps the multi-process run short
        small = os.path.join(folder, "input.parquet")
        pq.write_table(pq.read_table(doc["input"]["path"]).slice(0, rows), small)
        doc["input"]["path"] = small
    doc["output"]["path"] = os.path.join(folder, "out")
    for dotted, value in (changes or {}).items():
        node = doc
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    plan = make_plan(spec_mod.load(path))
    factory = keyed_random.KeyedSource(secret) if secret else None
    report = release.run(plan, list(beam_args), rng_factory=factory)
    with open(os.path.join(folder, "out", "released.parquet"), "rb") as handle:
        return handle.read(), report


def _run_many(tmp_path, runs, **common):
    out = {}
    for name, (secret, args) in runs.items():
        folder = tmp_path / name
        folder.mkdir()
        out[name] = _release(str(folder), secret, args, **common)
    return out


def test_quickstart_is_bit_identical_under_one_secret_across_runs_and_runners(tmp_path):
    runs = _run_many(tmp_path, {
        "first": (SECRET, []),
        "again": (SECRET, []),
        "bundle_repeat": (SECRET, ["--direct_runner_bundle_repeat=2"]),
        "bundle_based": (SECRET, ["--runner=BundleBasedDirectRunner"]),
        "other_secret": (SECRET[::-1], []),
        "production": (None, []),
    })
    first = runs["first"][0]
    assert len(first) > 500
    for name in ("again", "bundle_repeat", "bundle_based"):
        assert runs[name][0] == first, name
    # Another secret re-draws the noise of ~120 keys (sigma about 16 users): equal bytes
    # would need every key's discrete Gaussian draw to repeat (probability < 0.1**100).
    assert runs["other_secret"][0] != first
    assert runs["production"][0] not in (first, runs["other_secret"][0])
    # the secret appears nowhere in what is published
    for data, report in runs.values():
        assert SECRET not in data and SECRET[::-1] not in data
        assert SECRET.decode() not in repr(report) and SECRET[::-1].decode() not in repr(report)


def test_auto_bound_release_is_bit_identical_under_one_secret(tmp_path):
    """The private choice of C is a stage draw: same secret, same C, same release."""
    auto = {"bounding.max_keys_per_user": "auto"}
    runs = _run_many(tmp_path, {"a": (SECRET, []), "b": (SECRET, ["--direct_runner_bundle_repeat=1"]),
                                "c": (SECRET[::-1], [])}, changes=auto)
    assert runs["a"][0] == runs["b"][0]
    assert runs["a"][0] != runs["c"][0]   # as above: every key's noise would have to repeat


@pytest.mark.parametrize("kind", ["weighted_gaussian", "adaptive"])
def test_weighted_kinds_are_bit_identical_under_one_secret(tmp_path, kind):
    """The weighted bound (per-user keyed streams) and the weighted selection + count
    (per-key keyed streams) draw the same values when a bundle is repeated."""
    changes = {"mechanism": {"kind": kind}}
    runs = _run_many(tmp_path, {"a": (SECRET, []),
                                "b": (SECRET, ["--direct_runner_bundle_repeat=2"]),
                                "c": (SECRET[::-1], [])}, changes=changes)
    assert runs["a"][0] == runs["b"][0]
    assert runs["a"][0] != runs["c"][0]   # every released key's count noise would repeat


def test_multi_processing_workers_receive_the_secret(tmp_path, monkeypatch):
    """Two subprocess SDK workers (every DoFn pickled across a process boundary) publish
    what the in-process runner publishes under the same secret."""
    monkeypatch.setenv("PYTHONPATH", ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    runs = _run_many(tmp_path, {
        "in_process": (SECRET, []),
        "two_workers": (SECRET, ["--direct_running_mode=multi_processing",
                                 "--direct_num_workers=2"]),
    }, rows=20_000)
    assert runs["in_process"][0] == runs["two_workers"][0]


def _counts(n_keys=400, seed=1):
    rng = np.random.default_rng(seed)
    return pa.table({"word": [f"k{i}" for i in range(n_keys)],
                     "__key": pa.array(rng.integers(0, 2**63, n_keys), pa.uint64()),
                     "count": pa.array(rng.integers(1, 300, n_keys), pa.int64())})


def _per_key(tables):
    rows = {}
    for t in tables:
        for word, count in zip(t.column("word").to_pylist(), t.column("count").to_pylist()):
            assert word not in rows
            rows[word] = count
    return rows


@pytest.mark.parametrize("kernel, params", [
    (noisy_release, {"noise": "discrete_gaussian", "sigma": 40.0, "pre_threshold": 1,
                     "threshold": -10**6}),
    (sample_release, {"sampling_rate": 0.5, "threshold": 1}),
])
def test_release_dofn_repeated_and_resplit_bundles_draw_the_same_per_key(kernel, params):
    """The noising DoFn run twice on one bundle, and on the same keys split into other
    bundles in another order, releases the same value for every key."""
    source = keyed_random.KeyedSource(SECRET)
    table = _counts()
    fn = ReleaseBatchFn(kernel, source, stage="Release/Stage")
    fn.setup()
    once = _per_key(fn.process(table, params))
    twice = _per_key(fn.process(table, params))
    order = np.random.default_rng(7).permutation(table.num_rows)
    shuffled = table.take(pa.array(order))
    parts = [shuffled.slice(0, 13), shuffled.slice(13, 200), shuffled.slice(213)]
    other = ReleaseBatchFn(kernel, source, stage="Release/Stage")
    other.setup()
    resplit = _per_key(out for part in parts[::-1] for out in other.process(part, params))
    assert len(once) > 100
    assert once == twice == resplit
    # another stage (or secret) draws independently: with sigma 40 (or Bin(c, 1/2) over
    # c up to 300) all 400 keys agreeing has probability far below 1e-100
    moved = ReleaseBatchFn(kernel, source, stage="Release/Other")
    moved.setup()
    assert _per_key(moved.process(table, params)) != once


def test_choice_materialised_twice_from_one_pcollection_is_the_same_draw():
    """A runner that recomputes the private choice (Beam's DaskRunner recomputes side
    inputs per partition) is modelled by applying the stage twice to the same
    PCollection under one stage identity, each result read by several consumers: every
    read sees one C. Under distinct stage identities the draws are independent: with 64
    near-uniform candidates (epsilon 1e-9) six stages agreeing has probability about
    64**-5 < 1e-9."""
    tables, _, _ = _records(seed=5, n_tables=2, rows=400)
    candidates = tuple(range(1, 65))
    source = keyed_random.KeyedSource(SECRET)

    def one_candidate(values):
        assert len(values) == 6 and len(set(values)) == 1 and values[0] in candidates, values

    def not_all_equal(values):
        assert len(values) == 6 and len(set(values)) > 1, values

    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        users = pipeline | beam.Create(tables)
        reads = []
        for copy_index in range(2):
            chosen = _choose(pipeline, users, candidates=candidates, max_bound=64, epsilon=1e-9,
                             rng_factory=source.child("ChooseContributionBound"),
                             label=f"Recomputed{copy_index}")
            side = beam.pvalue.AsSingleton(chosen)
            for consumer in range(3):
                reads.append(pipeline | f"Trigger{copy_index}{consumer}" >> beam.Create([0])
                             | f"Read{copy_index}{consumer}" >> beam.Map(lambda _, c: c, side))
        assert_that(reads | "AllReads" >> beam.Flatten(), one_candidate, label="SameDraw")
        independent = [_choose(pipeline, users, candidates=candidates, max_bound=64,
                               epsilon=1e-9, rng_factory=source.child(f"Independent{stage}"),
                               label=f"Independent{stage}")
                       for stage in range(6)]
        assert_that(independent | "AllIndependent" >> beam.Flatten(), not_all_equal,
                    label="IndependentDraws")


@pytest.mark.parametrize("runner", ["DaskRunner", "apache_beam.runners.dask.dask_runner.DaskRunner"])
def test_the_dask_runner_is_refused_in_one_line(tmp_path, capsys, runner):
    """Beam's DaskRunner drops finish_bundle outputs, mixes tagged outputs and ignores
    Reshuffle (docs/running.md): thresher refuses it before reading any input."""
    from thresher.pipelines.cli import main
    with open(QUICKSTART, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    doc["input"]["path"] = os.path.join(ROOT, doc["input"]["path"])
    doc["output"]["path"] = str(tmp_path / "out")
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    assert main(["run", str(path), "--", f"--runner={runner}"]) == 2
    err = capsys.readouterr().err
    assert "DaskRunner is not supported" in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1, err
    assert not (tmp_path / "out").exists()

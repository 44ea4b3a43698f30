"""Everything a release ships to workers pickles and needs nothing from the process that
built the pipeline.

Each release variant's pipeline is built with ``pipelines.running.release.build`` and turned
into its Runner API proto (which pickles every DoFn and CombineFn, as submission to any
runner does). A fresh interpreter (``_unpickle_audit.py``) then unpickles each of them as
an SDK worker would, checks that no random generator or open file travelled inside them,
and calls ``setup()``. Every DoFn that draws must carry the release's keyed source
(``transforms.randomness.keyed_random.KeyedSource``, built as ``thresher run`` builds it) and
create no generator of its own: its streams are derived per element on the worker. The multi-process and portable runs of test_runners.py execute the
quickstart variant end to end; this audit covers the variants they do not run.
"""
import copy
import glob
import json
import os
import subprocess
import sys

import apache_beam as beam
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.dataio import io

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import build

from .conftest import ROOT

EXAMPLES = sorted(glob.glob(os.path.join(ROOT, "configs", "examples", "*.yaml")))
QUICKSTART = os.path.join(ROOT, "configs", "examples", "quickstart.yaml")

# Variants of the quickstart that exercise the other DoFns of a release.
VARIANTS = {
    "csv_input": {"input.format": "csv"},
    "laplace_l0": {"mechanism": {"kind": "laplace"}},
    "laplace_l1": {"mechanism": {"kind": "laplace"}, "bounding.model": "l1"},
    "auto_bound": {"bounding.max_keys_per_user": "auto"},
    "weighted_gaussian": {"mechanism": {"kind": "weighted_gaussian"}},
    "adaptive": {"mechanism": {"kind": "adaptive"}},
}
OWN_PACKAGES = ("transforms", "pipelines", "accounting")


def _load_example(path):
    with open(path, encoding="utf-8") as handle:
        return yaml.safe_load(handle)


def _spec_document(name, folder):
    if name.startswith("example:"):
        doc = _load_example(os.path.join(ROOT, "configs", "examples", name.split(":", 1)[1]))
        changes = {}
    else:
        doc = _load_example(QUICKSTART)
        changes = VARIANTS[name]
    doc = copy.deepcopy(doc)
    if not os.path.isabs(doc["input"]["path"]):
        doc["input"]["path"] = os.path.join(ROOT, doc["input"]["path"])
    doc["output"]["path"] = os.path.join(folder, name.replace(":", "_"), "out")
    for dotted, value in changes.items():
        node = doc
        *parents, last = dotted.split(".")
        for part in parents:
            node = node[part]
        node[last] = value
    if doc["input"].get("format") == "csv":
        csv_path = os.path.join(folder, "input.csv")
        if not os.path.exists(csv_path):
            pcsv.write_csv(pq.read_table(doc["input"]["path"]).slice(0, 1000), csv_path)
        doc["input"]["path"] = csv_path
    return doc


def _build_proto(name, folder):
    """The variant's pipeline as serialised Runner API proto bytes (and no skip reason)."""
    doc = _spec_document(name, folder)
    spec = spec_mod.parse(doc, source_text=yaml.safe_dump(doc))
    plan = make_plan(spec)
    files = spec_mod.input_files(spec.input)
    pipeline = beam.Pipeline()
    staging = os.path.join(folder, name.replace(":", "_"), "staging")
    from thresher.transforms.randomness.keyed_random import PipelineSecret, building
    with building(PipelineSecret.draw(pipeline)):    # as pipelines.running.release.run builds it
        build(pipeline, plan, files, io.check_input(spec.input, files), staging)
    return pipeline.to_runner_api().SerializeToString(), None


NAMES = [f"example:{os.path.basename(p)}" for p in EXAMPLES] + list(VARIANTS)


@pytest.fixture(scope="module")
def verdicts(tmp_path_factory):
    folder = str(tmp_path_factory.mktemp("pickling"))
    protos, skipped, broken = {}, {}, {}
    for name in NAMES:
        try:
            proto, why = _build_proto(name, folder)
        except Exception as exc:  # noqa: BLE001 - reported by that variant's test
            broken[name] = f"building the pipeline failed: {type(exc).__name__}: {exc}"
            continue
        if proto is None:
            skipped[name] = why
            continue
        path = os.path.join(folder, f"{name.replace(':', '_')}.pb")
        with open(path, "wb") as handle:
            handle.write(proto)
        protos[name] = path
    env = dict(os.environ, PYTHONPATH=ROOT + (os.pathsep + os.environ["PYTHONPATH"]
                                               if os.environ.get("PYTHONPATH") else ""))
    done = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(__file__), "_unpickle_audit.py"),
         json.dumps(protos)], capture_output=True, text=True, env=env, cwd=folder, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    result.update({name: {"skipped": why} for name, why in skipped.items()})
    result.update({name: {"broken": why} for name, why in broken.items()})
    return result


@pytest.mark.slow
@pytest.mark.parametrize("name", NAMES)
def test_shipped_functions_unpickle_in_a_fresh_process(verdicts, name):
    verdict = verdicts[name]
    if "skipped" in verdict:
        pytest.skip(verdict["skipped"])
    assert "broken" not in verdict, verdict.get("broken")
    assert verdict["dofns"], "no DoFn was audited"
    assert not verdict["problems"], verdict["problems"]
    # Every DoFn that draws randomness carries the release's in-pipeline secret source
    # (no secret in the graph) and made no generator of its own in setup() (no seeded or
    # per-worker stream to replay).
    assert verdict["rngs"], f"no randomised DoFn found among {verdict['dofns']}"
    assert all(r.endswith("transforms.randomness.keyed_random.PipelineSecret (setup made NoneType)")
               for r in verdict["rngs"]), verdict["rngs"]


def test_audit_finds_a_generator_pickled_into_a_dofn(tmp_path):
    """The audit has teeth: a DoFn built with a numpy Generator in its state is reported."""
    import numpy as np

    from thresher.transforms.selection.noisy_threshold import release_table
    from thresher.transforms.selection.release_fn import ReleaseBatchFn

    from thresher.transforms.randomness.keyed_random import PipelineSecret
    fn = ReleaseBatchFn(release_table, PipelineSecret())   # no secret: it refuses to set up without one
    fn._carried = np.random.default_rng(0)  # what building an RNG in __init__ would ship
    pipeline = beam.Pipeline()
    _ = pipeline | beam.Create([pa.table({"count": [1]})]) | beam.ParDo(fn, {})
    path = tmp_path / "leaky.pb"
    path.write_bytes(pipeline.to_runner_api().SerializeToString())
    env = dict(os.environ, PYTHONPATH=ROOT)
    done = subprocess.run(
        [sys.executable, os.path.join(os.path.dirname(__file__), "_unpickle_audit.py"),
         json.dumps({"leaky": str(path)})], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    problems = json.loads(done.stdout.strip().splitlines()[-1])["leaky"]["problems"]
    assert any("_carried: Generator" in p for p in problems), problems

"""The release secret is drawn inside the pipeline (issue 25 F4): a materialised singleton
side input (transforms.randomness.keyed_random.PipelineSecret), never carried in the pipeline graph.
The production path runs through the real CLI with ``keyed_random.new_secret`` tapped to
return a recognisable pattern; the serialised graph (``Pipeline.to_runner_api()`` bytes,
what a runner stages: Dataflow's pipeline.pb, a job server's artifacts, a Flink jar) is
captured when the pipeline is run and searched for it. On the code before, the secret was
pickled into the drawing transforms, so it was in those bytes (the same search finds a
secret given through the test-only hook, which does put it in the graph)."""
import base64
import bz2
import json
import re
import zlib

import apache_beam as beam
import pytest

from thresher.pipelines import cli
from thresher.transforms.randomness import keyed_random

PATTERN = bytes(range(0x41, 0x41 + 32))          # b"ABCD...": 32 recognisable bytes


@pytest.fixture
def tapped(monkeypatch):
    """new_secret returns PATTERN (counted); Pipeline.run records the graph's bytes."""
    drawn, graphs = [], []

    def secret():
        drawn.append(PATTERN)
        return PATTERN
    monkeypatch.setattr(keyed_random, "new_secret", secret)
    real_run = beam.Pipeline.run

    def run(self, *args, **kwargs):
        graphs.append(self.to_runner_api().SerializeToString())
        return real_run(self, *args, **kwargs)
    monkeypatch.setattr(beam.Pipeline, "run", run)
    return drawn, graphs


def _unpacked(blob):
    """The graph's bytes and every payload in it that Beam's pickler packed (base64 of
    zlib or bz2: pickled DoFns, CombineFns, side-input view functions), unpacked."""
    out = [blob]
    for run in re.findall(rb"[A-Za-z0-9+/=]{40,}", blob):
        for unpack in (zlib.decompress, bz2.decompress):
            try:
                out.append(unpack(base64.b64decode(run)))
            except (ValueError, OSError, zlib.error):
                pass
    return out


def _contains(blob, secret):
    # the secret as bytes, and in the text forms a pickle or proto might hold it
    forms = (secret, secret.hex().encode(), repr(secret).encode(), base64.b64encode(secret))
    return any(form in part for part in _unpacked(blob) for form in forms)


@pytest.mark.parametrize("changes", [
    {},                                                          # gaussian, fixed bound
    {"bounding.max_keys_per_user": "auto"},                      # exponential mechanism too
    {"mechanism": {"kind": "laplace", "pre_threshold": 1}, "bounding.model": "l1"},
    {"mechanism": {"kind": "sample_and_threshold"}},
    {"mechanism": {"kind": "weighted_gaussian"}},
    {"mechanism": {"kind": "adaptive"}},
], ids=["gaussian", "auto_bound", "laplace_l1", "sample_and_threshold", "weighted_gaussian",
        "adaptive"])
def test_the_secret_is_drawn_in_the_pipeline_and_never_in_its_graph(write_spec, tmp_path,
                                                                    capsys, tapped, changes):
    drawn, graphs = tapped
    assert cli.main(["run", write_spec(changes), "--quiet"]) == 0
    assert len(graphs) == 1 and len(drawn) == 1        # drawn once, by the pipeline
    assert not _contains(graphs[0], PATTERN)
    assert b"ReleaseSecret" in graphs[0]                 # the drawing stage is in the graph
    with open(tmp_path / "out" / "release_report.json", encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["released_keys"] > 0                    # the draws happened with it


def test_the_search_finds_a_secret_that_is_in_the_graph(write_spec, tmp_path, tapped):
    """The test-only hook (a fixed KeyedSource) carries its secret in the graph: the same
    search finds it there, so the test above would see a secret pickled into a DoFn."""
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    drawn, graphs = tapped
    run(make_plan(spec_mod.load(write_spec())), rng_factory=keyed_random.KeyedSource(PATTERN))
    assert len(graphs) == 1 and not drawn
    assert _contains(graphs[0], PATTERN)


def test_a_pipeline_secret_pickles_without_its_secret():
    import pickle
    source = keyed_random.PipelineSecret()
    source.set_secret(PATTERN)
    assert source.stage_key("s") == keyed_random.KeyedSource(PATTERN).stage_key("s")
    clone = pickle.loads(pickle.dumps(source))
    assert PATTERN not in pickle.dumps(source) and clone._secret is None
    with pytest.raises(RuntimeError, match="par_do"):
        clone.stage_key("s")

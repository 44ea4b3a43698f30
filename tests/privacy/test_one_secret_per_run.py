"""One secret per run, or the run fails (issue 36 P2; transforms/randomness/secret_commitment.py).

A runner that recomputes the secret's stage (Flink's rebalance for Reshuffle, Spark's
lineage) could give two consumers two secrets: one user, two identities, a bound of 2C.
The stand-in for such a runner is a ``PipelineSecret`` whose every consumer gets its own
draw (its own Impulse -> draw -> Reshuffle branch), so the reader, the bounding, the noise
and the publisher each see a different secret. Through the real CLI and the Python API
the run must fail with exit 2 / ``MixedSecretsError`` and publish nothing; the same
stand-in drawing one value for every consumer must publish (so the failure is the check's,
not the stand-in's). On the code before, the mixed-secret run published (exit 0).
"""
import os

import apache_beam as beam
import pyarrow.parquet as pq
import pytest

from thresher.transforms.randomness import keyed_random, secret_commitment
from tests.robustness.conftest import (assert_clean_error, assert_nothing_published, run_cli,
                                       words_table, write_spec)


class PerConsumerSecret(keyed_random.PipelineSecret):
    """A secret stage that yields a different value to each consumer (``fixed``: the same
    value to each, the control)."""

    fixed = None

    @classmethod
    def draw(cls, pipeline):
        source = cls()
        source._pipeline = pipeline
        source._consumers = 0
        return source

    def side_input(self):
        self._consumers += 1
        label = f"PerConsumerSecret{self._consumers}"
        side = (self._pipeline
                | label >> beam.Impulse()
                | f"{label}/Draw" >> beam.Map(_draw, fixed=self.fixed)
                | f"{label}/Materialise" >> beam.Reshuffle())
        return beam.pvalue.AsSingleton(side)


def _draw(unused_impulse, fixed):
    return fixed if fixed is not None else os.urandom(32)


class SameForEveryConsumer(PerConsumerSecret):
    fixed = bytes(range(32))


@pytest.fixture
def data(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(words_table(n_users=600), path)
    return str(path)


@pytest.mark.parametrize("case", [
    dict(),
    dict(max_keys_per_user="auto"),
    dict(mechanism_kind="sample_and_threshold"),
], ids=["gaussian", "gaussian_auto", "sample_and_threshold"])
def test_cli_refuses_a_run_whose_stages_read_different_secrets(tmp_path, data, monkeypatch,
                                                               case):
    import yaml
    spec, output = write_spec(tmp_path, data, max_keys_per_user=case.get("max_keys_per_user", 3))
    if "mechanism_kind" in case:
        doc = yaml.safe_load(open(spec, encoding="utf-8"))
        doc["mechanism"] = {"kind": case["mechanism_kind"]}
        with open(spec, "w", encoding="utf-8") as handle:
            yaml.safe_dump(doc, handle)
    monkeypatch.setattr(keyed_random.PipelineSecret, "draw",
                        classmethod(lambda cls, p: PerConsumerSecret.draw(p)))
    code, _, err = run_cli("run", spec)
    assert_clean_error(code, err, "different release secrets", "nothing was published")
    assert_nothing_published(output)


def test_cli_publishes_when_every_consumer_reads_the_same_secret(tmp_path, data, monkeypatch):
    """The control: the same stand-in, one value for all consumers, publishes."""
    spec, output = write_spec(tmp_path, data)
    monkeypatch.setattr(keyed_random.PipelineSecret, "draw",
                        classmethod(lambda cls, p: SameForEveryConsumer.draw(p)))
    code, _, err = run_cli("run", spec)
    assert code == 0, err
    assert os.path.exists(os.path.join(output, "released.parquet"))


def _api_release(monkeypatch, secret_class):
    import thresher
    monkeypatch.setattr(keyed_random.PipelineSecret, "draw",
                        classmethod(lambda cls, p: secret_class.draw(p)))
    spec = {"name": "words", "input": {"user": "user_id", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8}, "bounding": {"max_keys_per_user": 3},
            "mechanism": {"kind": "gaussian"}}
    rows = [beam.Row(user_id=u, word=w) for u, w in zip(
        *(words_table(n_users=600).column(c).to_pylist() for c in ("user_id", "word")))]
    from apache_beam.testing.util import assert_that

    def one_report(rows):
        assert len(rows) == 1 and '"released_keys"' in rows[0].report, rows

    with beam.Pipeline(runner="FnApiRunner") as pipeline:
        out = pipeline | beam.Create(rows) | thresher.Release(spec)
        assert_that(out["report"], one_report)


def test_the_python_api_fails_a_run_whose_stages_read_different_secrets(monkeypatch):
    with pytest.raises(Exception, match="different release secrets"):
        _api_release(monkeypatch, PerConsumerSecret)


def test_the_python_api_control_releases(monkeypatch):
    _api_release(monkeypatch, SameForEveryConsumer)


def test_the_check_itself():
    """Exactly one commitment, equal to the publisher's own; a commitment is 16 bytes
    of a PRF under the reserved stage, not the secret."""
    a = keyed_random.KeyedSource(bytes(range(32)))
    b = keyed_random.KeyedSource(bytes(range(1, 33)))
    own = secret_commitment.commitment(a)
    assert len(own) == 16 and own not in bytes(range(32))
    assert own == bytes(a.stage_key(secret_commitment.COMMITMENT_STAGE)[:16])
    assert "\x00" in secret_commitment.COMMITMENT_STAGE
    secret_commitment.check(own, [])
    secret_commitment.check(own, [own, own])
    for others in ([secret_commitment.commitment(b)], [own, secret_commitment.commitment(b)]):
        with pytest.raises(secret_commitment.MixedSecretsError, match="2 different"):
            secret_commitment.check(own, others)


def test_a_stage_reading_the_secret_after_the_publisher_is_refused_when_built():
    """The publisher is added last; a secret reader added after it would go unchecked."""
    from thresher.transforms.selection.noisy_threshold import NoisyThreshold
    pipeline = beam.Pipeline(runner="FnApiRunner")
    secret = keyed_random.PipelineSecret.draw(pipeline)
    params = {"noise": "laplace", "scale": 1.0, "pre_threshold": 0, "threshold": 1.0}
    counts = pipeline | "Counts" >> beam.Create([])
    _ = counts | "Before" >> NoisyThreshold(params, rng_factory=secret.child("Before"))
    _ = (pipeline | beam.Impulse()
         | "Publish" >> secret_commitment.publisher(lambda _: None, secret))
    with pytest.raises(RuntimeError, match="added after the publisher"):
        _ = counts | "After" >> NoisyThreshold(params, rng_factory=secret.child("After"))

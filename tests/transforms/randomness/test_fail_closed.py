"""The public building blocks fail closed without a secret (transforms/randomness/keyed_random.py,
"Fail closed"; transforms/randomness/user_identity.py, "Key").

Used outside ``thresher.Release`` (a user chaining ``PerUserBound``, ``RandClip``, ... in
their own pipeline) a transform given no ``rng_factory`` used to draw per-worker OS
randomness (a retried bundle draws different noise and spends its epsilon again) and the
reader keyed user identities by a PUBLIC constant. Now each refuses with a
``ThresherError`` naming what to pass; given a secret they run as before."""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

import thresher
from thresher.errors import ThresherError
from thresher.pipelines.dataio import io as pio
from thresher.pipelines.specs import spec as spec_mod
from thresher.transforms.randomness import keyed_random, user_identity
from thresher.transforms.selection.release_fn import ReleaseBatchFn
from thresher.transforms.bounding.user_shards import ShardByUser

SECRET = b"fail-closed test secret........."


def _prepared(identity_key):
    raw = pa.table({"user": [f"u{i % 7}" for i in range(40)],
                    "word": [f"w{i % 5}" for i in range(40)]})
    return pio.prepare_batch(raw, "user", ["word"], identity_key=identity_key)[0]


def _counts():
    return pa.table({"word": [f"w{i}" for i in range(5)],
                     "count": pa.array([100] * 5, pa.int64())})


def _building_blocks(rng_factory):
    """(name, input kind, transform) of every building block ``thresher`` exports."""
    from thresher.accounting import pws
    nt_params = {"noise": "laplace", "scale": 1.0, "pre_threshold": 0, "threshold": 1.0}
    return [
        ("PerUserBound", "users", thresher.PerUserBound(["word"], 2, rng_factory=rng_factory)),
        ("RandClip", "users", thresher.RandClip(["word"], 2, rng_factory=rng_factory)),
        ("ChooseContributionBound", "users", thresher.ChooseContributionBound(
            ["word"], candidates=[1, 2, 4], epsilon=1.0, model="l0", score="laplace_l0",
            score_params={"epsilon": 1.0, "delta": 1e-6}, max_bound=4, rng_factory=rng_factory)),
        ("SampleAndThreshold", "counts", thresher.SampleAndThreshold(
            {"sampling_rate": 0.5, "threshold": 1}, rng_factory=rng_factory)),
        ("NoisyThreshold", "counts", thresher.NoisyThreshold(nt_params, rng_factory=rng_factory)),
        ("SanitizeSample", "counts", thresher.SanitizeSample(
            pws.calibrate(1.0, 1e-6, 1), ["word"], rng_factory=rng_factory)),
    ]


def _apply(pipeline, kind, transform):
    if kind == "users":
        users = (pipeline | beam.Create([_prepared(user_identity.TEST_KEY)]) | ShardByUser(2))
        return users | transform
    return pipeline | beam.Create([_counts()]) | transform


def test_the_list_covers_every_exported_building_block():
    exported = set(thresher.__all__) - {"Release", "plan", "load_spec"}
    assert {name for name, _, _ in _building_blocks(None)} == exported


@pytest.mark.parametrize("index", range(6))
def test_every_building_block_without_a_secret_is_refused_naming_rng_factory(index):
    name, kind, transform = _building_blocks(None)[index]
    with pytest.raises(ThresherError, match=r"rng_factory=keyed_random\.PipelineSecret\.draw"):
        with beam.Pipeline(runner=FnApiRunner()) as p:
            _apply(p, kind, transform)


def test_per_user_bound_refuses_a_plain_generator_factory():
    """issue 36 P3: ``resolve`` returned any factory as is, and ``worker_rng`` called it
    in every DoFn's ``setup``: ``PerUserBound(rng_factory=np.random.default_rng)`` drew
    fresh, unkeyed randomness per worker and per retry. Now refused when applied."""
    transform = thresher.PerUserBound(["word"], 2, rng_factory=np.random.default_rng)
    with pytest.raises(ThresherError, match=r"not a secret source.*PipelineSecret\.draw"):
        with beam.Pipeline(runner=FnApiRunner()) as p:
            _apply(p, "users", transform)


@pytest.mark.parametrize("index", range(6))
def test_every_building_block_refuses_a_plain_generator_factory(index):
    name, kind, transform = _building_blocks(lambda: np.random.default_rng(0))[index]
    with pytest.raises(ThresherError, match="not a secret source"):
        with beam.Pipeline(runner=FnApiRunner()) as p:
            _apply(p, kind, transform)


def test_only_the_secret_sources_resolve():
    source = keyed_random.KeyedSource(SECRET)
    seeded = keyed_random.seeded_for_tests(3)
    assert keyed_random.resolve(source) is source and keyed_random.resolve(seeded) is seeded
    for plain in (np.random.default_rng, lambda: np.random.default_rng(0), object()):
        with pytest.raises(keyed_random.NotASecretError, match="seeded_for_tests"):
            keyed_random.resolve(plain)
        with pytest.raises(keyed_random.NotASecretError):
            keyed_random.worker_rng(plain)
    assert keyed_random.NotASecretError(np.random.default_rng).exit_code == 2


def test_the_error_is_a_one_line_exit_2_error():
    err = keyed_random.NoSecretError()
    assert err.exit_code == 2 and "\n" not in str(err)
    assert "KeyedSource(secret)" in str(err) and "thresher.Release" in str(err)


def test_no_dofn_falls_back_to_os_randomness():
    with pytest.raises(ThresherError, match="rng_factory"):
        keyed_random.worker_rng(None)
    fn = ReleaseBatchFn(lambda table, params, rng: table)      # built with no factory
    with pytest.raises(ThresherError, match="rng_factory"):
        fn.setup()


def test_the_reader_refuses_no_secret_and_a_plain_generator_factory(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user": ["a"], "word": ["w"]}), path)
    read_spec = spec_mod.InputSpec(path=str(path), format="parquet", user="user",
                                   keys=("word",))
    for unkeyed, match in ((None, r"PipelineSecret\.draw"),
                           (lambda: np.random.default_rng(0), "seeded_for_tests")):
        with pytest.raises(ThresherError, match=match):
            with beam.Pipeline(runner=FnApiRunner()) as p:
                p | pio.ReadRecords(read_spec, [str(path)], rng_factory=unkeyed)


def test_prepare_batch_has_no_default_identity_key():
    raw = pa.table({"user": ["a"], "word": ["w"]})
    with pytest.raises(ThresherError, match="identity_key is required"):
        pio.prepare_batch(raw, "user", ["word"])
    with pytest.raises(ThresherError, match="rng_factory"):
        user_identity.identity_key(None)
    # the test key is there, but only by name
    assert user_identity.identity_key(keyed_random.seeded_for_tests(1)) == user_identity.TEST_KEY


def test_with_a_secret_drawn_in_the_pipeline_the_blocks_run():
    """The documented way: one ``PipelineSecret.draw(pipeline)``, a child of it (its own
    label) for every block."""
    prepared = _prepared(user_identity.TEST_KEY)
    pairs = set(zip(prepared.column("__user").to_pylist(), prepared.column("word").to_pylist()))
    want = sorted((w, sum(1 for _, v in pairs if v == w)) for w in {v for _, v in pairs})
    with beam.Pipeline(runner=FnApiRunner()) as p:
        secret = keyed_random.PipelineSecret.draw(p)
        kept = (p | beam.Create([prepared]) | ShardByUser(2)
                | thresher.PerUserBound(["word"], 5, rng_factory=secret.child("Bound"))  # 5 words: not binding
                | beam.FlatMap(lambda t: zip(t.column("word").to_pylist(),
                                             t.column("count").to_pylist()))
                | beam.CombinePerKey(sum))
        assert_that(kept, equal_to(want))
        released = (p | "Counts" >> beam.Create([_counts()])
                    | thresher.NoisyThreshold({"noise": "laplace", "scale": 1e-3,
                                               "pre_threshold": 0, "threshold": 1.0},
                                              rng_factory=secret.child("Release"))
                    | beam.FlatMap(lambda t: t.column("word").to_pylist()))
        assert_that(released, equal_to([f"w{i}" for i in range(5)]), label="Released")


def test_with_a_keyed_source_the_reader_uses_the_secret_key():
    source = keyed_random.KeyedSource(SECRET)
    assert user_identity.check_identity_source(source) is source
    assert user_identity.identity_key(source) != user_identity.TEST_KEY

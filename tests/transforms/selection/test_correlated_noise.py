"""NoisyThreshold with correlated noise (accounting.correlated_gshm): the kernel adds the
release's shared component to every eligible key and keeps a key with exactly
P[c + Z + X >= tau*]; the Beam wrapper draws that component once per release from the
stream whose identity is the stage alone, the same in every bundle, and never outputs it."""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline

from thresher.accounting import discrete_gaussian as dg
from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.selection.noisy_threshold import NoisyThreshold, noisy_threshold, shared_component

SIGMA, SHARED = 3.0, 40.0
PARAMS = {"noise": "correlated", "sigma": SIGMA, "shared_sigma": SHARED, "pre_threshold": 1,
          "threshold": 100}


def test_kernel_needs_the_shared_component_exactly_for_correlated_noise():
    rng = np.random.default_rng(0)
    kw = dict(scale=2.0, pre_threshold=1, threshold=5, rng=rng)
    with pytest.raises(ValueError, match="shared"):
        noisy_threshold(np.array([3]), noise="correlated", **kw)
    with pytest.raises(ValueError, match="shared"):
        noisy_threshold(np.array([3]), noise="gaussian", shared=4, **kw)


def test_kernel_adds_the_shared_component_to_every_eligible_key():
    counts = np.array([0, 1, 50, 60, 70])
    kw = dict(scale=2.0, pre_threshold=1, threshold=-10**6)
    _, plain = noisy_threshold(counts, noise="gaussian", rng=np.random.default_rng(3), **kw)
    keep, shifted = noisy_threshold(counts, noise="correlated", shared=17,
                                    rng=np.random.default_rng(3), **kw)
    assert keep.tolist() == [False, True, True, True, True]     # count 0: below tau
    assert (shifted[1:] - plain[1:] == 17).all() and shifted[0] == 0


def test_keep_probability_is_the_convolution_of_both_parts():
    """Per-trial shared draws (one per row of 4 keys): the keep rate of a key at count c
    over 100,000 trials is within 5 binomial standard errors of the exact
    sum_z P[Z = z] P[X >= tau* - c - z] (false failure ~ 6e-7 per count)."""
    rng = np.random.default_rng(38)
    trials, sigma, shared, threshold = 100_000, 2.0, 1.5, 8
    row = np.array([4, 6, 8, 10])
    z = samplers.discrete_gaussian(rng, shared, trials)
    keep, _ = noisy_threshold(np.tile(row, trials), noise="correlated", scale=sigma,
                              pre_threshold=1, threshold=threshold, rng=rng,
                              shared=np.repeat(z, row.size))
    keep = keep.reshape(trials, row.size)
    zs = np.arange(-40, 41)
    for j, c in enumerate(row):
        want = float(np.dot(dg.pmf(zs, shared), dg.sf(threshold - c - zs, sigma)))
        se = np.sqrt(want * (1 - want) / trials)
        assert abs(keep[:, j].mean() - want) <= 5 * se, (c, keep[:, j].mean(), want)
    # within a trial the keys' releases are positively correlated through z
    r = np.corrcoef(keep[:, 0], keep[:, 1])[0, 1]
    assert r > 0.01


def _write(table, folder):
    import uuid
    import pyarrow.parquet as pq
    pq.write_table(table, str(folder / f"{uuid.uuid4().hex}.parquet"))


def _run(source, splits, folder, label="Rel"):
    """Release 300 keys (counts 60..359) in the given batches; returns the input table,
    the released {word: value} and the released columns (read back from files: a
    matcher's closure would be a pickled copy)."""
    import pyarrow.parquet as pq
    table = pa.table({"word": [f"w{i}" for i in range(300)],
                      "count": pa.array(np.arange(300) + 60, type=pa.int64())})
    folder.mkdir()
    with TestPipeline() as p:
        side = p | "Params" >> beam.Create([PARAMS])
        batches = [table.slice(a, b - a) for a, b in zip(splits[:-1], splits[1:])]
        _ = (p | beam.Create(batches)
             | label >> NoisyThreshold(beam.pvalue.AsSingleton(side),
                                   rng_factory=source.child(label))
             | beam.Map(_write, folder=folder))
    out = pa.concat_tables([pq.read_table(f) for f in sorted(folder.iterdir())])
    return table, dict(zip(out.column("word").to_pylist(), out.column("count").to_pylist())), \
        out.schema.names


def test_one_shared_draw_per_release_identified_by_the_stage_alone(tmp_path):
    """Released value - count - the key's own draw (replayed from the key's stream) is the
    same z for every key of every bundle, and z is the draw of the stream (stage, b"")."""
    source = keyed_random.KeyedSource(b"correlated noise test secret....")
    table, values, names = _run(source, [0, 70, 71, 200, 300], tmp_path / "a")
    assert names == ["word", "count"]                     # z is never an output column
    ids = keyed_random.row_identities(table, ["word"])
    own = samplers.discrete_gaussian(source.rows("Rel", ids).view, SIGMA, table.num_rows)
    counts = dict(zip(table.column("word").to_pylist(), table.column("count").to_pylist()))
    own = dict(zip(table.column("word").to_pylist(), own.tolist()))
    shared = {values[w] - counts[w] - own[w] for w in values}
    assert len(values) > 100 and len(shared) == 1
    z = shared.pop()
    assert z == shared_component(PARAMS, source.stream("Rel", b""))


def test_the_shared_draw_depends_on_the_secret_not_on_the_bundles(tmp_path):
    source = keyed_random.KeyedSource(b"correlated noise test secret....")
    _, a, _ = _run(source, [0, 300], tmp_path / "a")
    _, b, _ = _run(source, [0, 1, 150, 299, 300], tmp_path / "b")
    assert a == b
    draws = {shared_component(PARAMS, keyed_random.KeyedSource(bytes([i]) * 32).stream("Rel", b""))
             for i in range(4)}
    assert len(draws) > 1      # sigma 40: four equal draws have probability < 1e-5

"""NoisyThreshold's kernel releases a key with exactly the probability the accounting
assumes: P[c + Z >= tau*] for Z discrete Gaussian / discrete Laplace, computed here by
brute-force sums over the pmf; and its Beam wrapper releases only noisy counts."""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from scipy import stats

from thresher.transforms.randomness import keyed_random
from thresher.transforms.selection.noisy_threshold import NoisyThreshold, noisy_threshold


def _pmf(noise, scale, support):
    x = np.arange(-support, support + 1)
    if noise == "gaussian":
        w = np.exp(-x.astype(float) ** 2 / (2 * scale * scale))
    else:
        w = np.exp(-np.abs(x) / scale)
    return x, w / w.sum()


def _keep_probability(noise, scale, count, threshold):
    x, p = _pmf(noise, scale, int(60 * scale) + 60)
    return p[count + x >= threshold].sum()


@pytest.mark.parametrize("noise,scale", [("gaussian", 3.0), ("gaussian", 0.7), ("laplace", 2.5)])
def test_keep_probability_matches_brute_force_sum(noise, scale):
    """For counts around tau*, the empirical keep rate over 200,000 draws is within 5
    binomial standard errors of the exact sum (two-sided false-failure probability
    about 6e-7 per count)."""
    rng = np.random.default_rng(2024)
    threshold = 10
    counts = np.repeat(np.arange(1, 19), 200_000)
    keep, values = noisy_threshold(counts, noise=noise, scale=scale, pre_threshold=2,
                                   threshold=threshold, rng=rng)
    for c in range(1, 19):
        sel = counts == c
        got = keep[sel].mean()
        want = 0.0 if c < 2 else _keep_probability(noise, scale, c, threshold)
        se = np.sqrt(max(want * (1 - want), 1e-12) / sel.sum())
        assert abs(got - want) <= 5 * se + 1e-12, (c, got, want)
    assert (values[keep] >= threshold).all()
    assert (values[~keep] == 0).all()


def test_noise_distribution_is_the_discrete_gaussian():
    """Chi-square of the noise added to a count far above the threshold against the
    discrete Gaussian pmf; false-failure probability 1e-4."""
    rng = np.random.default_rng(9)
    counts = np.full(300_000, 1000)
    keep, values = noisy_threshold(counts, noise="gaussian", scale=4.0, pre_threshold=1,
                                   threshold=0, rng=rng)
    assert keep.all()
    noise = values - 1000
    x, p = _pmf("gaussian", 4.0, 40)
    inner = np.abs(x) <= 12
    observed = np.array([(noise == v).sum() for v in x[inner]] + [(np.abs(noise) > 12).sum()])
    expected = np.append(p[inner], p[~inner].sum()) * len(noise)
    assert stats.chisquare(observed, expected).pvalue > 1e-4


def test_pre_threshold_keys_never_released_even_with_low_threshold():
    rng = np.random.default_rng(1)
    keep, _ = noisy_threshold(np.array([0, 1, 2, 3] * 1000), noise="laplace", scale=5.0,
                              pre_threshold=3, threshold=-100, rng=rng)
    assert not keep.reshape(-1, 4)[:, :3].any()
    assert keep.reshape(-1, 4)[:, 3].all()


def test_invalid_arguments():
    with pytest.raises(ValueError, match="noise"):
        noisy_threshold(np.array([1]), noise="cauchy", scale=1, pre_threshold=1, threshold=1,
                        rng=np.random.default_rng(0))
    with pytest.raises(ValueError, match="scale"):
        noisy_threshold(np.array([1]), noise="gaussian", scale=0, pre_threshold=1, threshold=1,
                        rng=np.random.default_rng(0))


def test_beam_wrapper_releases_noisy_counts_above_threshold():
    table = pa.table({"word": [f"w{i}" for i in range(200)],
                      "count": pa.array(np.arange(200), type=pa.int64())})
    params = {"noise": "discrete_gaussian", "sigma": 2.0, "pre_threshold": 1, "threshold": 100}

    def check(tables):
        out = pa.concat_tables(tables)
        assert out.schema.names == ["word", "count"]
        counts = out.column("count").to_numpy()
        true = np.array([int(w[1:]) for w in out.column("word").to_pylist()])
        assert (counts >= 100).all()
        assert np.abs(counts - true).max() <= 20  # 10 sigma
        assert (true != counts).any(), "noise was not added"
        assert set(range(110, 200)) <= set(true.tolist())  # 5 sigma above tau*

    with TestPipeline() as p:
        side = p | "Params" >> beam.Create([params])
        released = (p | beam.Create([table.slice(0, 120), table.slice(120)])
                    | NoisyThreshold(beam.pvalue.AsSingleton(side),
                                     rng_factory=keyed_random.seeded_for_tests(4)))
        assert_that(released, check)

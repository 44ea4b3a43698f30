"""transforms.selection.sample_and_threshold: the kernel (its binomial draws) and the Beam wrapper.

Statistical tests use fixed seeds and state their false-failure probability."""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from scipy import stats

from thresher.transforms.randomness import samplers
from thresher.transforms.selection import sample_and_threshold as sat
from thresher.transforms.selection.release_fn import ReleaseBatchFn
from thresher.transforms.randomness import keyed_random


def chi_square_pvalue(draws, n, p):
    """Pearson chi-square of draws against Bin(n, p), cells pooled to expected >= 5."""
    lo, hi = int(stats.binom.ppf(1e-7, n, p)), int(stats.binom.isf(1e-7, n, p))
    edges = np.arange(lo, hi + 2)
    observed = np.array([(draws < lo).sum()] + [((draws == v)).sum() for v in range(lo, hi + 1)]
                        + [(draws > hi).sum()], dtype=float)
    probs = np.concatenate(([stats.binom.cdf(lo - 1, n, p)], stats.binom.pmf(edges[:-1], n, p),
                            [stats.binom.sf(hi, n, p)]))
    expected = probs * len(draws)
    # pool cells left to right until each has expected >= 5
    obs_pooled, exp_pooled, o_acc, e_acc = [], [], 0.0, 0.0
    for o, e in zip(observed, expected):
        o_acc += o
        e_acc += e
        if e_acc >= 5:
            obs_pooled.append(o_acc)
            exp_pooled.append(e_acc)
            o_acc = e_acc = 0.0
    obs_pooled[-1] += o_acc
    exp_pooled[-1] += e_acc
    obs_pooled, exp_pooled = np.array(obs_pooled), np.array(exp_pooled)
    stat = ((obs_pooled - exp_pooled) ** 2 / exp_pooled).sum()
    return stats.chi2.sf(stat, len(obs_pooled) - 1)


@pytest.mark.parametrize("n,p", [(1, 0.5), (10, 0.3), (200, 0.105), (50, 0.97),
                                 (100_000, 0.01), (300_000, 0.002)])
def test_kernel_sampled_counts_follow_the_binomial_law(n, p):
    """With tau = 1 the kernel's value is exactly its Bin(n, p) draw (0 = not kept).
    Chi-square goodness of fit, 20k keys, seeded; fails only if p-value < 1e-4
    (false-failure probability 1e-4 per case for an exact sampler)."""
    rng = np.random.default_rng(n + int(p * 1000))
    keep, draws = sat.sample_and_threshold(np.full(20_000, n), sampling_rate=p, threshold=1,
                                           rng=rng)
    assert (keep == (draws > 0)).all()
    assert chi_square_pvalue(draws, n, p) > 1e-4


def test_kernel_draws_from_the_csprng_with_the_right_mean_and_variance():
    """Unseeded (os.urandom): 100k keys of Bin(40, 0.25); mean within 6 SE (false-failure
    probability ~2e-9) and variance within 5%."""
    keep, draws = sat.sample_and_threshold(np.full(100_000, 40), sampling_rate=0.25,
                                           threshold=1, rng=samplers.secure_random())
    assert abs(draws.mean() - 10) < 6 * math.sqrt(7.5 / 100_000)
    assert draws.var() == pytest.approx(7.5, rel=0.05)


class _NoRandomness:
    def random(self, size=None):
        raise AssertionError("no draw expected")


def test_keys_below_the_threshold_are_dropped_without_a_draw():
    keep, values = sat.sample_and_threshold(np.array([0, 3, 9]), sampling_rate=0.5,
                                            threshold=10, rng=_NoRandomness())
    assert not keep.any() and not values.any()


def test_kernel_releases_with_probability_of_reaching_the_threshold():
    """Each key kept with P[Bin(c, p) >= tau]; 100k keys per count, seeded; the kept
    fraction within 5 SE (false-failure probability < 1e-6 per count)."""
    rng = np.random.default_rng(11)
    p, tau, n = 0.2, 8, 100_000
    for c in (8, 30, 40, 80):
        keep, values = sat.sample_and_threshold(np.full(n, c), sampling_rate=p, threshold=tau,
                                                rng=rng)
        q = stats.binom.sf(tau - 1, c, p)
        assert abs(keep.mean() - q) <= 5 * math.sqrt(q * (1 - q) / n) + 1e-12
        assert (values[keep] >= tau).all() and (values[keep] <= c).all()
        assert (values[~keep] == 0).all()


def test_kernel_rejects_bad_input_by_name():
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="counts must be >= 0"):
        sat.sample_and_threshold(np.array([-1]), sampling_rate=0.5, threshold=2, rng=rng)
    with pytest.raises(ValueError, match="counts must be integers"):
        sat.sample_and_threshold(np.array([1.5]), sampling_rate=0.5, threshold=2, rng=rng)
    with pytest.raises(ValueError, match="sampling_rate"):
        sat.sample_and_threshold(np.array([1]), sampling_rate=0.0, threshold=2, rng=rng)
    with pytest.raises(ValueError, match="threshold"):
        sat.sample_and_threshold(np.array([1]), sampling_rate=0.5, threshold=0, rng=rng)


def _counts_table():
    return pa.table({"word": ["a", "b", "c", "d", "e"], "year": [2020, 2020, 2021, 2021, 2022],
                     "count": pa.array([1, 50, 500, 5000, 12], type=pa.int64())})


def test_release_table_replaces_count_by_sampled_count_and_adds_estimate():
    out = sat.release_table(_counts_table(), {"sampling_rate": 0.25, "threshold": 10},
                            np.random.default_rng(5))
    assert out.column_names == ["word", "year", "count", "estimate"]
    assert out.schema.field("count").type == pa.int64()
    assert out.schema.field("estimate").type == pa.float64()
    rows = out.to_pylist()
    assert {r["word"] for r in rows} <= {"b", "c", "d"}  # 1 and 12 * 0.25... c >= tau only
    assert "d" in {r["word"] for r in rows}
    for r in rows:
        assert r["count"] >= 10
        assert r["estimate"] == r["count"] / 0.25
    big = next(r for r in rows if r["word"] == "d")
    assert big["count"] != 5000  # the sampled, not the true, count


def _run(tables, params, check, rng_factory=None):
    """Run SampleAndThreshold on FnApiRunner; ``check`` gets the list of output tables
    (it runs inside the pipeline, so it asserts there). Without ``rng_factory`` a test
    secret (a transform given no secret refuses to run)."""
    rng_factory = rng_factory or keyed_random.KeyedSource(
        b"sample-and-threshold test secret").child("SampleAndThreshold")
    with TestPipeline(runner=FnApiRunner()) as p:
        side = p | "Params" >> beam.Create([params])
        out = (p | beam.Create(tables)
               | sat.SampleAndThreshold(beam.pvalue.AsSingleton(side), rng_factory=rng_factory))
        assert_that(out | beam.combiners.ToList(), lambda lists: check(lists[0]))


def test_beam_transform_with_rate_one_releases_exactly_the_keys_at_or_above_tau():
    tables = [_counts_table(), pa.table({"word": ["x"], "year": [1999],
                                         "count": pa.array([3], type=pa.int64())})]

    def check(out):
        rows = sorted((r["word"], r["count"], r["estimate"]) for t in out for r in t.to_pylist())
        assert rows == [("b", 50, 50.0), ("c", 500, 500.0), ("d", 5000, 5000.0), ("e", 12, 12.0)]
        assert all(t.num_rows > 0 for t in out)  # empty batches are not emitted
    _run(tables, {"sampling_rate": 1.0, "threshold": 12}, check)


def test_beam_transform_samples_from_the_csprng_by_default():
    """1000 keys of count 400 at p = 0.1, tau = 30: each kept with P[Bin(400, .1) >= 30]
    = 0.964; 900 or fewer kept has probability < 1e-12."""
    tables = [pa.table({"k": np.arange(1000), "count": pa.array(np.full(1000, 400), type=pa.int64())})]

    def check(out):
        released = pa.concat_tables(out)
        counts = released.column("count").to_numpy()
        assert 900 < released.num_rows <= 1000
        assert (counts >= 30).all() and (counts < 100).all()  # sampled, not the true 400
        assert released.column_names == ["k", "count", "estimate"]
    _run(tables, {"sampling_rate": 0.1, "threshold": 30}, check)


def test_beam_transform_sees_the_seeded_rng_factory_in_tests():
    tables = [pa.table({"k": np.arange(50), "count": pa.array(np.full(50, 100), type=pa.int64())})]
    expected = sat.release_table(tables[0], {"sampling_rate": 0.3, "threshold": 20},
                                 np.random.default_rng(9))

    def check(out):
        assert len(out) == 1 and out[0].equals(expected)
    _run(tables, {"sampling_rate": 0.3, "threshold": 20}, check,
         rng_factory=keyed_random.seeded_for_tests(9))


def test_dofn_without_a_secret_refuses_in_setup():
    """No silent per-worker OS randomness (transforms/randomness/keyed_random.py, "Fail closed")."""
    fn = ReleaseBatchFn(sat.release_table)
    with pytest.raises(keyed_random.NoSecretError, match="rng_factory"):
        fn.setup()

"""transforms.selection.sanitize_sample: the PWS kernel's empirical distributions and the Beam wrapper.

Statistical tests compare the kernel's draws (fixed numpy seeds) with the probabilities
of accounting.pws (which tests/accounting/test_pws.py checks against brute force). Each
chi-square test fails with probability ALPHA when the kernel is exact; a test function
runs at most ~30 of them, so a correct kernel fails a function with probability < 3e-3
for some seed -- the seeds are fixed, so the outcome is deterministic.
"""

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from scipy import stats

from thresher.accounting import pws
from thresher.transforms.randomness import samplers
from thresher.transforms.selection.sanitize_sample import SanitizeSample, sanitize, sanitize_table
from thresher.transforms.randomness import keyed_random

ALPHA = 1e-4


def chi_square_pvalue(observed_outcomes, probs, n, min_expected=10.0):
    """p-value of outcome counts (index = outcome) against probs, merging cells with small
    expected counts (in outcome order) into their neighbours."""
    observed = np.bincount(observed_outcomes, minlength=len(probs)).astype(float)
    assert len(observed) == len(probs), "an outcome with probability 0 was drawn"
    expected = n * np.asarray(probs, dtype=float)
    obs_bins, exp_bins = [], []
    o_acc = e_acc = 0.0
    for o, e in zip(observed, expected):
        o_acc += o
        e_acc += e
        if e_acc >= min_expected:
            obs_bins.append(o_acc)
            exp_bins.append(e_acc)
            o_acc = e_acc = 0.0
    if e_acc > 0 or o_acc > 0:
        if obs_bins:
            obs_bins[-1] += o_acc
            exp_bins[-1] += e_acc
        else:
            obs_bins.append(o_acc)
            exp_bins.append(e_acc)
    if len(obs_bins) < 2:
        return 1.0
    exp_bins = np.array(exp_bins) * (sum(obs_bins) / sum(exp_bins))
    return stats.chisquare(obs_bins, exp_bins).pvalue


def row_probs(table, i):
    """(1 - pi_i, pi_{i,1}, ..., pi_{i,i}) as a dense vector."""
    return table[[i], :i + 1].toarray().ravel()


@pytest.fixture(scope="module")
def release():
    params = pws.calibrate(0.5, 0.01, 1)          # saturation 16, shift beyond the table
    return params, pws.release_tables(params)


# ----------------------------------------------------------------------------- kernel

@pytest.mark.parametrize("sampling,t", [("none", None), ("ppswor", 0.1), ("priority", 0.05)])
def test_keys_only_keep_rates_match_keep_probabilities(sampling, t):
    eps, delta, m = 0.5, 0.01, 40
    keep_p = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    w = np.repeat(np.arange(1, m + 1), 20_000)
    keep, tokens = sanitize(w, keep_probabilities=keep_p, rng=np.random.default_rng(3))
    assert not tokens.any()
    for i in range(1, m + 1):
        kept = int(keep[w == i].sum())
        p = keep_p[i]
        if p in (0.0, 1.0):
            assert kept == 20_000 * p
            continue
        # two-sided exact binomial test
        assert stats.binomtest(kept, 20_000, p).pvalue > ALPHA, i


@pytest.mark.parametrize("sampling,t", [("none", None), ("ppswor", 0.1), ("priority", 0.05)])
def test_tokens_follow_the_frequency_table_rows(sampling, t):
    eps, delta, m = 0.5, 0.01, 30
    table = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    keep_p = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    n = 30_000
    w = np.repeat(np.arange(1, m + 1), n)
    keep, tokens = sanitize(w, keep_probabilities=keep_p, frequency_table=table,
                            rng=np.random.default_rng(4))
    assert np.all(tokens[~keep] == 0) and np.all(tokens[keep] >= 1) and np.all(tokens <= w)
    for i in range(1, m + 1):
        sel = w == i
        assert chi_square_pvalue(tokens[sel], row_probs(table, i), n) > ALPHA, i


@pytest.mark.parametrize("sampling,t", [("ppswor", 0.1), ("priority", 0.05), ("none", None)])
def test_post_processing_path_has_the_one_step_distribution(sampling, t):
    """Sample with q (the non-private scheme), sanitize the sample with pi/q: per frequency,
    the end-to-end outcome distribution equals the one-step path's (chi-square against the
    table, and a two-sample contingency test against one-step draws)."""
    eps, delta, m = 0.5, 0.01, 25
    table = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    keep_p = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    n = 30_000
    w = np.repeat(np.arange(1, m + 1), n)
    rng = np.random.default_rng(8)
    q = pws.sampling_probabilities_at(w, sampling=sampling, sampling_threshold=t)
    sampled = samplers.bernoulli(rng, q)
    keep_s, tok_s = sanitize(w[sampled], keep_probabilities=keep_p, frequency_table=table, rng=rng,
                             sampling_probabilities=q[sampled])
    post = np.zeros(len(w), dtype=np.int64)
    post[np.flatnonzero(sampled)[keep_s]] = tok_s[keep_s]
    _, one_step = sanitize(w, keep_probabilities=keep_p, frequency_table=table,
                           rng=np.random.default_rng(9))
    for i in range(1, m + 1):
        sel = w == i
        assert chi_square_pvalue(post[sel], row_probs(table, i), n) > ALPHA, i
        a = np.bincount(post[sel], minlength=i + 1)
        b = np.bincount(one_step[sel], minlength=i + 1)
        cols = (a + b) > 0
        if cols.sum() >= 2:
            assert stats.chi2_contingency(np.vstack([a[cols], b[cols]]))[1] > ALPHA, i


def test_post_processing_keys_only_matches_keep_probabilities():
    eps, delta, m, t = 0.5, 0.01, 30, 0.05
    keep_p = pws.keep_probabilities(eps, delta, m, sampling="priority", sampling_threshold=t)
    n = 40_000
    w = np.repeat(np.arange(1, m + 1), n)
    rng = np.random.default_rng(12)
    q = pws.sampling_probabilities_at(w, sampling="priority", sampling_threshold=t)
    sampled = samplers.bernoulli(rng, q)
    keep_s, _ = sanitize(w[sampled], keep_probabilities=keep_p, rng=rng,
                         sampling_probabilities=q[sampled])
    reported = np.zeros(len(w), dtype=bool)
    reported[np.flatnonzero(sampled)[keep_s]] = True
    for i in range(1, m + 1):
        assert stats.binomtest(int(reported[w == i].sum()), n, keep_p[i]).pvalue > ALPHA, i


def test_counts_above_the_table_shift_tokens(release):
    params, tables = release
    m = params.max_frequency
    assert params.beyond_table == "shift" and tables.keep[m] == 1.0
    n = 40_000
    for w in (m + 1, m + 7, 10 * m):
        keep, tokens = sanitize(np.full(n, w), keep_probabilities=tables.keep,
                                frequency_table=tables.table, rng=np.random.default_rng(w),
                                beyond_table="shift")
        assert keep.all()                       # pi = 1 beyond saturation, exactly
        shifted_back = tokens - (w - m)
        assert chi_square_pvalue(shifted_back, row_probs(tables.table, m), n) > ALPHA


def test_counts_above_the_table_clip_to_the_last_row():
    eps, delta, m = 0.5, 0.01, 10             # pi_10 < 1: a clipped table
    table = pws.frequency_table(eps, delta, m)
    keep_p = pws.keep_probabilities(eps, delta, m)
    assert keep_p[m] < 1
    n = 40_000
    keep, tokens = sanitize(np.full(n, 500), keep_probabilities=keep_p, frequency_table=table,
                            rng=np.random.default_rng(2))
    assert tokens.max() <= m
    assert chi_square_pvalue(tokens, row_probs(table, m), n) > ALPHA


def test_kernel_rejects_bad_frequencies():
    keep_p = pws.keep_probabilities(1.0, 1e-3, 10)
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="frequency must be >= 1, got 0 at row 2"):
        sanitize(np.array([3, 1, 0]), keep_probabilities=keep_p, rng=rng)
    with pytest.raises(ValueError, match="whole number.*row 1"):
        sanitize(np.array([3.0, 1.5]), keep_probabilities=keep_p, rng=rng)
    with pytest.raises(ValueError, match="integers"):
        sanitize(np.array(["a"]), keep_probabilities=keep_p, rng=rng)
    with pytest.raises(ValueError, match="below the keep probability"):
        sanitize(np.array([10]), keep_probabilities=keep_p, rng=rng,
                 sampling_probabilities=np.array([0.5]))
    with pytest.raises(ValueError, match="one entry per frequency"):
        sanitize(np.array([10, 3]), keep_probabilities=keep_p, rng=rng,
                 sampling_probabilities=np.array([1.0]))


def test_kernel_accepts_whole_float_frequencies_and_empty_input():
    keep_p = pws.keep_probabilities(1.0, 1e-3, 50)
    keep, tokens = sanitize(np.array([50.0, 60.0]), keep_probabilities=keep_p,
                            rng=np.random.default_rng(0))
    assert keep.all()                          # pi = 1 exactly at 50 and beyond
    keep, tokens = sanitize(np.zeros(0, dtype=np.int64), keep_probabilities=keep_p,
                            rng=samplers.secure_random())
    assert len(keep) == 0 and len(tokens) == 0


def test_sanitize_table_outputs_keys_tokens_and_estimates(release):
    params, tables = release
    t = pa.table({"word": [f"w{i}" for i in range(200)], "lang": ["en"] * 200,
                  "count": np.r_[np.full(100, 1), np.arange(100, 200)].astype(np.int64)})
    out = sanitize_table(t, tables, np.random.default_rng(1), key_columns=("word", "lang"))
    assert out.column_names == ["word", "lang", "token", "estimate"]
    assert out.schema.field("token").type == pa.int64()
    assert out.schema.field("estimate").type == pa.float64()
    released = set(out.column("word").to_pylist())
    # every key with count >= 100 > saturation is released (pi = 1 exactly)
    assert {f"w{i}" for i in range(100, 200)} <= released
    tok = out.column("token").to_numpy()
    assert np.allclose(out.column("estimate").to_numpy(), tables.estimate(tok))


# ----------------------------------------------------------------------------- Beam

def _counts_tables():
    rng = np.random.default_rng(0)
    counts = np.r_[np.full(300, 1), rng.integers(1, 40, 300), np.arange(200, 260)].astype(np.int64)
    t = pa.table({"word": [f"k{i}" for i in range(len(counts))],
                  "shard": np.arange(len(counts)) % 3, "count": counts})
    return [t.slice(0, 250), t.slice(250, 250), t.slice(500)], t


@pytest.mark.parametrize("report", ["keys", "keys_and_frequencies"])
def test_beam_sanitize_sample_with_side_input_params(report):
    params = pws.calibrate(1.0, 1e-9, 2, report=report)
    parts, whole = _counts_tables()
    counts = dict(zip(whole.column("word").to_pylist(), whole.column("count").to_pylist()))
    params_dict = params.as_dict()

    def check(tables):
        out = pa.concat_tables(tables)
        assert out.column_names == ["word", "shard", "token", "estimate"]
        words = out.column("word").to_pylist()
        assert len(set(words)) == len(words)
        # keys of count >= 200 are always released (pi = 1 exactly beyond saturation)
        assert {w for w, c in counts.items() if c >= 200} <= set(words)
        # 300 keys of count 1 are each released with probability <= 1e-9 (false failure
        # probability <= 3e-7)
        assert not any(counts[w] == 1 for w in words)
        if report == "keys":
            assert out.column("token").null_count == out.num_rows
            assert out.column("estimate").null_count == out.num_rows
        else:
            tok = out.column("token").to_numpy()
            w = np.array([counts[x] for x in words])
            assert np.all((tok >= 1) & (tok <= w))   # also for w > max_frequency (shift)
            assert np.all(out.column("estimate").to_numpy() > 0)

    with TestPipeline() as p:
        side = p | "Params" >> beam.Create([params_dict])
        released = (p | "Counts" >> beam.Create(parts)
                    | SanitizeSample(beam.pvalue.AsSingleton(side), ["word", "shard"],
                                     rng_factory=keyed_random.KeyedSource(bytes(32))))
        assert_that(released, check)


def test_beam_post_processing_reports_the_end_to_end_rates():
    """A pre-sampled input (ppswor, t = 0.02) of 20k keys of frequency 60 and 20k of 120,
    sanitized in Beam with a seeded generator: the reported fractions of the ORIGINAL keys
    match pi_60 and pi_120 (binomial tests, false failure 2 * ALPHA)."""
    params = pws.calibrate(1.0, 1e-6, 1, sampling="ppswor", sampling_threshold=0.02,
                           presampled=True)
    tables = pws.release_tables(params)
    rng = np.random.default_rng(21)
    n = 20_000
    w = np.r_[np.full(n, 60), np.full(n, 120)]
    sampled = rng.random(2 * n) < pws.sampling_probabilities_at(w, sampling="ppswor",
                                                                 sampling_threshold=0.02)
    sample = pa.table({"item": np.flatnonzero(sampled), "freq": w[sampled]})

    def check(tables_out):
        out = pa.concat_tables(tables_out)
        got = w[out.column("item").to_numpy()]
        for f in (60, 120):
            k = int((got == f).sum())
            p = tables.keep[min(f, params.max_frequency)]
            assert stats.binomtest(k, n, p).pvalue > ALPHA, (f, k, p)

    with TestPipeline() as p:
        released = (p | beam.Create([sample.slice(0, 5000), sample.slice(5000)])
                    | SanitizeSample(params, ["item"], frequency_column="freq",
                                     rng_factory=keyed_random.seeded_for_tests(5)))
        assert_that(released, check)

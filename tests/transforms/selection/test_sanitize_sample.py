"""transforms.selection.sanitize_sample: the PWS kernel's empirical distributions and the Beam wrapper.

Statistical tests compare the kernel's draws (fixed numpy seeds) with the probabilities
of accounting.pws (which tests/accounting/pws/test_pws.py checks against brute force). Each
chi-square test fails with probability ALPHA when the kernel is exact; a test function
runs at most ~30 of them, so a correct kernel fails a function with probability < 3e-3
for some seed -- the seeds are fixed, so the outcome is deterministic.
"""

from fractions import Fraction

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
                                     rng_factory=keyed_random.KeyedSource(bytes(32)).child("SanitizeSample")))
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


# ----------------------------------------------------- the exact law of the tokens (issue 42)

class _ScriptedWords:
    """A generator of given 64-bit words, in order (``bits`` like a SecureRandom; also
    ``random`` as the 53-bit uniforms the kernel used before, so an old kernel runs)."""

    def __init__(self, words):
        self.words = [int(w) for w in words]
        self.used = 0

    def bits(self, n):
        out = np.array(self.words[self.used:self.used + n], dtype=np.uint64)
        assert len(out) == n, "the kernel read more words than scripted"
        self.used += n
        return out

    def random(self, n):
        return (self.bits(n) >> np.uint64(11)).astype(np.float64) * 2.0 ** -53


def _interval_of(words):
    """[lo, hi): the uniform reals U whose first 63-bit prefixes are those of ``words``."""
    lo = sum(Fraction(w >> 1, 2 ** (63 * (k + 1))) for k, w in enumerate(words))
    return lo, lo + Fraction(1, 2 ** (63 * len(words)))


def _check_exact(cum, index, words):
    """The returned index j is right for EVERY real U in the interval the words read fix:
    c_{j-1} <= U < c_j for all of them (c_{-1} = 0, c_L = infinity). The sampler is then a
    function of U alone with P[j] = c_j - c_{j-1} exactly (Lebesgue measure of U)."""
    lo, hi = _interval_of(words)
    c = [Fraction(min(max(float(x), 0.0), 1.0)) for x in cum]
    below = c[index - 1] if index > 0 else Fraction(0)
    above = c[index] if index < len(c) else Fraction(2)
    assert below <= lo and hi <= above, (index, lo, hi, below, above)


def _tie_words(rng, cum, j):
    """Words whose first prefix ties with floor(2^63 c_j) (the rare slow path), then fresh."""
    first = int(Fraction(min(float(cum[j]), 1.0)) * 2 ** 63) << 1 | int(rng.integers(2))
    return [first] + [int(w) for w in rng.integers(0, 2 ** 64, 24, dtype=np.uint64)]


def test_cdf_index_is_exact_for_every_uniform_the_words_fix():
    """samplers.cdf_index, checked with Python fractions: for rows with ordinary, tiny
    (2^-60 + 2^-70, 5e-324, far below the 2^-53 grid of a float uniform) and 2^-63-grid
    probabilities, random words and words built to tie (U's first 63 bits equal to
    floor(2^63 c_j)), the index returned is the first j with U < c_j for every U the words
    consumed allow: the law is exactly c_j - c_{j-1}. Deterministic (fixed seed)."""
    rng = np.random.default_rng(42)
    rows = [np.cumsum(rng.dirichlet(np.ones(7))) * 0.9,
            np.array([2.0 ** -60 + 2.0 ** -70, 0.25, 0.25 + 2.0 ** -80, 0.5, 1.0]),
            np.array([5e-324, 1e-300, 2.0 ** -63, 3 * 2.0 ** -63, 0.75]),
            np.array([0.0, 0.0, 0.3, 0.3, 1.0 - 2.0 ** -53, 1.0]),
            np.array([1e-20, 1e-20 + 1e-36, 2e-20])]
    for cum in rows:
        cases = [[int(w) for w in rng.integers(0, 2 ** 64, 25, dtype=np.uint64)]
                 for _ in range(300)]
        cases += [_tie_words(rng, cum, j) for j in range(len(cum)) for _ in range(20)]
        cases += [[0] * 25, [2 ** 64 - 1] * 25]
        for words in cases:
            source = _ScriptedWords(words)
            prefix = np.array([words[0] >> 1], dtype=np.uint64)
            source.used = 1                                  # the caller drew the first word
            index = int(samplers.cdf_index(source, cum, prefix)[0])
            _check_exact(cum, index, words[:source.used])


def test_the_decision_on_one_word_is_an_integer_comparison():
    """The rule the kernel implements, for a probability c (a float, exact as a fraction)
    and a key's first word w: R = w >> 1 (63 bits), F = floor(2^63 c); R < F keeps, R > F
    does not, R == F with 2^63 c not an integer reads the next word (and R == F otherwise
    does not keep). Checked against Python integers for many c and w, one element each and
    vectorised (a numpy generator supplies any tie words)."""
    rng = np.random.default_rng(7)
    cs = list(rng.random(200)) + [2.0 ** -60 + 2.0 ** -70, 1e-300, 0.5, 1.0, 0.0, 2.0 ** -63]
    for c in cs:
        f = int(Fraction(c) * 2 ** 63)
        exact = Fraction(c) * 2 ** 63 == f
        words = [int(w) for w in rng.integers(0, 2 ** 64, 50, dtype=np.uint64)]
        words += [f << 1, (f << 1) | 1, max(f - 1, 0) << 1, (f + 1) << 1]
        words = [w for w in words if w < 2 ** 64]
        prefixes = np.array([w >> 1 for w in words], dtype=np.uint64)
        got = samplers.cdf_index(np.random.default_rng(1), np.array([c]), prefixes)
        for w, j in zip(words, got):
            r = w >> 1
            if r < f:
                assert j == 0, (c, w)
            elif r > f or exact:
                assert j == 1, (c, w)
            # r == f and not exact: the next words decided (checked by the test above)


def test_a_token_below_the_float_grid_is_drawn_with_its_own_probability():
    """Through ``sanitize``: a row whose first token has probability 2^-60 + 2^-70. A key
    whose first word's prefix is floor(2^63 c_1) = 8 and whose next word is 2^63 (prefix
    2^62, not below the fractional part 2^-7 of 2^63 c_1 scaled: 2^56) gets the SECOND
    token: U >= 8 2^-63 + 2^62 2^-126 > c_1. A 53-bit float uniform read u = 0 from that
    word and returned the first token, which it drew with probability 2^-53 instead of
    2^-60 + 2^-70 (issue 42). And the first token for a next word below 2^57 (prefix
    < 2^56)."""
    import scipy.sparse
    tiny = 2.0 ** -60 + 2.0 ** -70
    dense = np.zeros((3, 3))
    dense[1] = [0.5, 0.5, 0.0]
    dense[2] = [0.5 - tiny, tiny, 0.5]
    table = scipy.sparse.csr_array(dense)
    keep_p = np.array([0.0, 0.5, 0.5])
    assert int(Fraction(tiny) * 2 ** 63) == 8
    for second, token in ((2 ** 63, 2), (2 ** 57 - 2, 1), (2 ** 57, 2)):
        keep, tokens = sanitize(np.array([2]), keep_probabilities=keep_p,
                                frequency_table=table, rng=_ScriptedWords([8 << 1, second]))
        assert keep[0] and int(tokens[0]) == token, (second, tokens)


def test_keyed_token_pmf_matches_the_exact_law():
    """Real keyed streams (a KeyedSource, one stream per key): 200,000 keys of one
    frequency; token counts against the exact law c_j - c_{j-1} (Fractions of the table's
    cumulative floats) by a chi-square test. A correct kernel fails with probability
    ALPHA = 1e-4 (fixed secret: deterministic)."""
    eps, delta, m = 0.5, 0.01, 12
    table = pws.frequency_table(eps, delta, m)
    keep_p = pws.keep_probabilities(eps, delta, m)
    cols, cum = pws.row_cdf(table, m)
    law = [Fraction(0)] + [Fraction(float(x)) for x in cum]
    probs = np.zeros(m + 1)
    for c, a, b in zip(cols, law[:-1], law[1:]):
        probs[int(c)] = float(b - a)
    probs[0] = float(1 - law[-1])
    n = 200_000
    source = keyed_random.KeyedSource(b"issue-42-pmf-test-secret-0123456")
    streams = source.rows("tokens", [i.to_bytes(4, "little") for i in range(n)])
    keep, tokens = sanitize(np.full(n, m), keep_probabilities=keep_p, frequency_table=table,
                            rng=streams.view)
    assert np.all(tokens[~keep] == 0)
    assert chi_square_pvalue(tokens, probs, n) > ALPHA

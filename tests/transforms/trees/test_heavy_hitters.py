"""transforms.trees.heavy_hitters: TrieHH++ (paper 003 Sec. 4.1) on data with a known answer."""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that
from scipy import stats

from thresher.accounting import sample_threshold as acc
from thresher.transforms.trees import heavy_hitters as hh
from thresher.transforms.randomness import keyed_random

PREFIXES = (1, 2, 4, None)


def zipf_words(seed, vocabulary=3000, exponent=1.1):
    """Distinct random words over a 6-letter alphabet, one word per user: the top 20
    words with Zipf counts from 60 000 down to ~22 000 users, the other 2 980 with Zipf
    counts from 8 000 down (about 670 000 users in all). The gap makes the true top-20 the
    answer a correct release must return. Returns Table(word, count) and the counts."""
    rng = np.random.default_rng(seed)
    words = set()
    while len(words) < vocabulary:
        words.add("".join(rng.choice(list("abcdef"), size=int(rng.integers(3, 8)))))
    words = np.array(sorted(words), dtype=object)
    rng.shuffle(words)
    ranks = np.arange(1, vocabulary + 1, dtype=np.float64)
    counts = np.where(ranks <= 20, 60_000 / ranks ** 0.33, 8_000 / (ranks - 20) ** exponent)
    counts = np.maximum(counts.astype(np.int64), 1)
    return pa.table({"word": words.astype(str), "count": pa.array(counts, pa.int64())}), counts


def separated(counts, params, k=20):
    """The k-th and (k+1)-th counts are more than 12 estimate SDs apart, so the released
    top-k by estimate is the true top-k except with probability < 1e-20 (Gaussian tail
    of the binomial, union over k * len(counts) pairs)."""
    c = np.sort(counts)[::-1]
    p = params.sampling_rate
    sd = np.sqrt(c[[k - 1, k]] * (1 - p) / p)
    return c[k - 1] - c[k] > 12 * sd.sum()


def miss_probability(count, params, levels):
    """P[a word of this user count is missing from the last level]: some level's prefix
    (count >= the word's) samples fewer than tau; union bound over levels."""
    return levels * stats.binom.cdf(params.threshold - 1, count, params.sampling_rate)


def test_prefix_counts_sum_keys_sharing_a_prefix():
    t = pa.table({"word": ["abc", "abd", "b", "abc2"], "count": pa.array([3, 4, 5, 1], pa.int64())})
    out = {r["word"]: r["count"] for r in hh.prefix_counts(t, "word", 2).to_pylist()}
    assert out == {"ab": 8, "b": 5}
    whole = {r["word"]: r["count"] for r in hh.prefix_counts(t, "word", None).to_pylist()}
    assert whole == {"abc": 3, "abd": 4, "b": 5, "abc2": 1}


def test_prune_trie_keeps_only_children_of_released_parents():
    released = pa.table({"level": pa.array([0, 0, 1, 1, 1, 2, 2], pa.int32()),
                         "word": ["a", "b", "ab", "ba", "cx", "abcd", "cxyz"],
                         "count": pa.array([9] * 7, pa.int64()), "estimate": [1.0] * 7})
    kept = hh.prune_trie(released, "word", (1, 2, None)).column("word").to_pylist()
    assert kept == ["a", "b", "ab", "ba", "abcd"]


def test_prefix_lengths_are_validated():
    with pytest.raises(ValueError, match="prefix_lengths"):
        hh.TrieHeavyHitters("w", (2, 1), {"sampling_rate": 0.1, "threshold": 5})
    with pytest.raises(ValueError, match="prefix_lengths"):
        hh.TrieHeavyHitters("w", (None, 3), {"sampling_rate": 0.1, "threshold": 5})
    with pytest.raises(ValueError, match="prefix_lengths"):
        hh.TrieHeavyHitters("w", (), {"sampling_rate": 0.1, "threshold": 5})


def test_kernel_recovers_the_true_top_20_with_estimates_in_bounds():
    """eps = 1, delta = 1e-8 over 4 levels. The true top-20 words all have counts where
    the miss probability is < 1e-9 and are separated from the rest (both asserted), so
    the top-20 by estimate must be the true top-20 (recall 1); estimates of the top words
    within 6 binomial SDs / p (failure < 1e-8 each)."""
    table, counts = zipf_words(seed=7)
    params = acc.calibrate_levels(1.0, 1e-8, len(PREFIXES), 1)
    order = np.argsort(-counts)
    top = set(table.column("word").take(pa.array(order[:20])).to_pylist())
    assert miss_probability(int(counts[order[19]]), params, len(PREFIXES)) < 1e-9
    assert separated(counts, params)
    released = hh.trie_heavy_hitters(table, "word", PREFIXES, params, np.random.default_rng(3))
    found = hh.heavy_hitters(released, "word", k=20)
    assert set(found.column("word").to_pylist()) == top
    truth = dict(zip(table.column("word").to_pylist(), counts.tolist()))
    p = params.sampling_rate
    for row in found.to_pylist():
        c = truth[row["word"]]
        assert abs(row["estimate"] - c) <= 6 * math.sqrt(c * (1 - p) / p)
    # nothing invented: every released full key is a real word, every count >= tau
    last = hh.heavy_hitters(released, "word")
    assert set(last.column("word").to_pylist()) <= set(truth)
    assert min(released.column("count").to_pylist()) >= params.threshold


def test_beam_trie_heavy_hitters_end_to_end_with_the_csprng():
    """Same kind of data in 4 batches through TrieHeavyHitters on FnApiRunner (CSPRNG
    draws); the top-20 recall is 1 except with probability < 2e-8 (union of the miss
    bound and the separation bound)."""
    table, counts = zipf_words(seed=11)
    params = acc.calibrate_levels(1.0, 1e-8, len(PREFIXES), 1)
    order = np.argsort(-counts)
    top = set(table.column("word").take(pa.array(order[:20])).to_pylist())
    assert 20 * miss_probability(int(counts[order[19]]), params, len(PREFIXES)) < 2e-8
    assert separated(counts, params)
    batches = [table.slice(i, 750) for i in range(0, table.num_rows, 750)]  # 4 batches

    def check(out):
        released = pa.concat_tables(out)
        assert released.column_names == ["level", "word", "count", "estimate"]
        assert set(released.column("level").to_pylist()) == {0, 1, 2, 3}
        found = hh.heavy_hitters(released, "word", k=20)
        assert set(found.column("word").to_pylist()) == top
        # the trie constraint holds in the output
        assert hh.prune_trie(released, "word", PREFIXES).num_rows == released.num_rows

    with TestPipeline(runner=FnApiRunner()) as p:
        side = p | "Params" >> beam.Create([params.as_report()])
        out = (p | beam.Create(batches)
               | hh.TrieHeavyHitters("word", PREFIXES, beam.pvalue.AsSingleton(side), num_shards=4,
                                     rng_factory=keyed_random.KeyedSource(bytes(32)).child("TrieHH")))
        assert_that(out | beam.combiners.ToList(), lambda lists: check(lists[0]))

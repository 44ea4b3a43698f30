"""The exact samplers fed by keyed per-row streams (transforms/randomness/keyed_random.py).

Two things are checked: (1) the laws stay exact -- the same chi-square tests as
test_pmf.py, now over words drawn from the keyed streams (AES-256 CBC-MAC,
``aes256-cbcmac-v1``), one stream per row,
including the 8-bit-prefix and short-table variants that force the exact slow paths
(ties, tails) through the per-row ``element`` views; (2) a row's values depend only on
its identity, the stage and the secret -- never on the other rows of the batch, their
order, or how many times the batch was drawn before.

False-failure probability: each chi-square/binomial test rejects an exact sampler with
probability gof.ALPHA = 1e-4 (if the keyed words are indistinguishable from uniform);
the secrets are fixed (test-only), so the outcome is deterministic.
"""
from fractions import Fraction

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from scipy import stats

from tests.transforms.randomness import gof
from thresher.transforms.randomness import keyed_random, samplers

N = 200_000
SECRET = b"test-only secret, never in production"


def _streams(stage, n=N, offset=0, secret=SECRET):
    ids = [b"key-%d" % i for i in range(offset, offset + n)]
    return keyed_random.KeyedSource(secret).rows(stage, ids).view


@pytest.mark.parametrize("sigma", [0.5, 3.7, 1000.0])
def test_discrete_gaussian_pmf_from_row_streams(sigma):
    draws = samplers.discrete_gaussian(_streams(f"g{sigma}"), sigma, N)
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_gaussian_pmf(sigma, x)) > gof.ALPHA


@pytest.mark.parametrize("scale", [0.5, 3.0, 1e5])
def test_discrete_laplace_pmf_from_row_streams(scale):
    draws = samplers.discrete_laplace(_streams(f"l{scale}"), scale, N)
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_laplace_pmf(scale, x)) > gof.ALPHA


def test_slow_paths_draw_from_each_rows_own_stream(monkeypatch, fresh_caches):
    """8-bit prefixes: thousands of ties settled by further words of the row's own
    stream; a short table: the rejection tail runs row by row. Both exact, and each
    row's draw is the same when drawn alone."""
    sigma = 2.5
    sampler = samplers._DiscreteGaussianSampler(Fraction(sigma) ** 2, bits=8)
    calls = {"resolve": 0}
    original = samplers._InversionTable._resolve

    def counting(self, rng, prefix, k):
        calls["resolve"] += 1
        return original(self, rng, prefix, k)
    monkeypatch.setattr(samplers._InversionTable, "_resolve", counting)
    draws = sampler.sample(_streams("ties"), N)
    assert calls["resolve"] > 1000
    assert gof.chi_square_pvalue(draws, lambda x: gof.discrete_gaussian_pmf(sigma, x)) > gof.ALPHA
    alone = [int(sampler.sample(_streams("ties", 1, i), 1)[0]) for i in range(0, N, N // 50)]
    assert alone == [int(v) for v in draws[::N // 50]]

    monkeypatch.setattr(samplers, "_GAUSSIAN_TAIL_BITS", 2)
    short = samplers._DiscreteGaussianSampler(Fraction(3) ** 2, samplers.PREFIX_BITS)
    tail = short.sample(_streams("tail"), N)
    assert (np.abs(tail) >= short.tail_start).sum() > 1000
    assert gof.chi_square_pvalue(tail, lambda x: gof.discrete_gaussian_pmf(3.0, x)) > gof.ALPHA


@pytest.mark.parametrize("p", [0.3, 0.8])
def test_binomial_from_row_streams_matches_scipy_and_each_row_alone(p):
    n = np.full(N // 4, 40, dtype=np.int64)
    draws = samplers.binomial(_streams(f"b{p}", len(n)), n, p)
    observed = np.bincount(draws, minlength=41)
    expected = stats.binom.pmf(np.arange(41), 40, p) * len(n)
    keep = expected >= 20
    observed = np.r_[observed[keep], observed[~keep].sum()]
    expected = np.r_[expected[keep], expected[~keep].sum()]
    assert stats.chisquare(observed, expected * observed.sum() / expected.sum()).pvalue > gof.ALPHA
    # a different batch composition (a slice, tiny chunks) gives every row the same count
    part = samplers.binomial(_streams(f"b{p}", 500, 1000), n[1000:1500], p, chunk=64)
    assert (part == draws[1000:1500]).all()


def test_bernoulli_array_p_from_row_streams_is_per_row():
    p = np.linspace(0.0, 1.0, 1000)
    n = np.arange(1000) % 7
    whole = samplers.binomial(_streams("bp", 1000), n, p)
    reversed_rows = samplers.binomial(
        keyed_random.KeyedSource(SECRET).rows("bp", [b"key-%d" % i for i in range(999, -1, -1)]).view,
        n[::-1], p[::-1])
    assert (whole == reversed_rows[::-1]).all()
    assert whole[0] == 0 and whole[-1] == n[-1]


def test_a_row_stream_is_the_scalar_stream_of_its_identity():
    source = keyed_random.KeyedSource(SECRET)
    view = source.rows("stage", [b"a", b"b"]).view
    rows = np.stack([view.element_words(2) for _ in range(40)])      # 80 words per row
    assert (rows[:, 0] == source.stream("stage", b"a").bits(40)).all()
    assert (rows[:, 1] == source.stream("stage", b"b").bits(40)).all()


def test_streams_differ_by_secret_stage_and_identity():
    a = keyed_random.KeyedSource(SECRET).stream("s", b"k").bits(4)
    assert not (a == keyed_random.KeyedSource(SECRET + b"!").stream("s", b"k").bits(4)).any()
    assert not (a == keyed_random.KeyedSource(SECRET).stream("t", b"k").bits(4)).any()
    assert not (a == keyed_random.KeyedSource(SECRET).stream("s", b"k2").bits(4)).any()


def test_row_identities_are_canonical_and_injective():
    table = pa.table({"a": ["ab", "a", None, "N"], "b": ["c", "bc", "x", "x"]})
    ids = keyed_random.row_identities(table, ["a", "b"])
    assert len(set(ids)) == 4
    # -0.0 and 0.0 are one key (hashing.canonical_text); chunking does not matter
    floats = pa.table({"f": pa.chunked_array([[0.0], [-0.0, 1.5]])})
    ids = keyed_random.row_identities(floats, ["f"])
    assert ids[0] == ids[1] != ids[2]
    assert keyed_random.row_identities(pa.table({"i": [7]}), ["i"]) == \
        keyed_random.row_identities(pa.table({"i": pa.array([7], pa.int32())}), ["i"])


def test_the_secret_is_never_shown():
    source = keyed_random.KeyedSource(SECRET)
    assert SECRET.decode() not in repr(source) and SECRET.decode() not in str(source)
    assert len(keyed_random.new_secret()) == keyed_random.SECRET_BYTES
    assert keyed_random.new_secret() != keyed_random.new_secret()
    with pytest.raises(ValueError):
        keyed_random.KeyedSource(b"short")


def test_table_streams_from_the_callers_codes_are_the_same_streams():
    """``TableStreams.rows(index, group, text_codes)`` (the caller's exact codes of the
    group's text columns: one row per code MACed) gives every row the very stream it
    gets without them (issue 43: BoundKeyValues passes its dictionary codes)."""
    rng = np.random.default_rng(4)
    n = 3000
    words = rng.integers(0, 2**63, n, dtype=np.uint64)
    table = pa.table({"__user": pa.array(words), "__user_lo": pa.array(words ^ np.uint64(5)),
                      "k": pa.array(np.char.add("k", rng.integers(0, 40, n).astype(str))
                                    .astype(object)),
                      "x": pa.array(rng.integers(0, 7, n) / 8.0)})
    key = pc.dictionary_encode(table.column("k").combine_chunks()).indices
    codes = key.to_numpy().astype(np.int64) * 8 + (table.column("x").to_numpy() * 8).astype(np.int64)
    stage = keyed_random.StageSource(keyed_random.KeyedSource(b"test-only secret: coded"), "s")
    index = rng.choice(n, 1200, replace=False)
    for group in ("pair", "text"):
        columns = ["__user", "__user_lo", "k", "x"] if group == "pair" else ["k", "x"]
        plain = stage.bind(table, **{group: columns}).rows(index, group).bits(len(index))
        coded = stage.bind(table, **{group: columns}).rows(index, group, codes).bits(len(index))
        assert np.array_equal(plain, coded)
        assert len(np.unique(plain)) > 1

"""Tests of transforms.randomness.samplers._InversionTable's bucket lookup: every draw is
the one the plain table search gives, with the same ties resolved by further random bits
in the same order (so the same words are read), on every kind of table the samplers
build, with 63-bit prefixes and with 8-bit prefixes (which put many draws between
certified bounds). Deterministic: fixed seeds."""
from fractions import Fraction

import numpy as np
import pytest

from thresher.transforms.randomness import samplers


def _searched(table, rng, prefixes):
    """The inversion as it was written before the bucket lookup (f1aefc6): a search of
    every prefix in the table, ties resolved in increasing position."""
    x = np.searchsorted(table.hi, prefixes, side="right")
    in_body = x < table.size
    sure = in_body & (prefixes < table.lo[np.minimum(x, table.size - 1)])
    values = x.astype(np.int64)
    for i in np.flatnonzero(in_body & ~sure):
        values[i] = table._resolve(samplers._element(rng, i), int(prefixes[i]), int(x[i]))
    return values, values >= table.size


class _Rows:
    """Per-row streams (the ``element`` protocol of the keyed streams), logging which
    rows are read in which order."""

    def __init__(self, seed, log):
        self.seed, self.log = seed, log

    def element(self, i):
        self.log.append(int(i))
        return np.random.default_rng([self.seed, int(i)])


def _tables():
    """Discrete Gaussian and geometric tables, short and long, and one split geometric (a
    finite table), with the samplers' 63-bit prefixes and with 20-bit prefixes: there a
    bucket holds 2**4 to 2**10 prefixes and nearly every bound is open (lo < hi), so the
    buckets must leave exactly the prefixes between bounds to be resolved."""
    for bits in (samplers.PREFIX_BITS, 20):
        for sigma2 in (Fraction(1, 4), Fraction(137, 10), Fraction(10**4)):
            yield f"gaussian sigma^2={sigma2}, {bits} bits", samplers._cached_gaussian(
                sigma2, bits).table
        for ratio in (samplers._RationalRatio(1, 2), samplers._ExpRatio(Fraction(1, 3)),
                      samplers._RationalRatio(999, 1000),
                      samplers._RationalRatio(99999, 100000)):
            yield f"geometric {ratio.key()}, {bits} bits", samplers._geometric_sampler(
                ratio, bits).table


def _prefixes(table, seed):
    """Uniform prefixes, then (up to 20,000 of) every table bound and bucket edge with its
    neighbours."""
    rng = np.random.default_rng(seed)
    top = 1 << table.bits
    uniform = rng.integers(0, top, size=20_000, dtype=np.uint64)
    edges = np.arange(0, top, 1 << int(table._bucket_shift), dtype=object)
    marks = np.concatenate([table.lo.astype(object), table.hi.astype(object), edges])
    near = np.unique(np.clip(np.concatenate([marks - 1, marks, marks + 1]), 0, top - 1))
    near = near.astype(np.uint64)
    return np.concatenate([uniform, rng.permutation(near)[:20_000]])


@pytest.mark.parametrize("name,table", list(_tables()), ids=[n for n, _ in _tables()])
def test_bucket_lookup_draws_what_the_table_search_draws(name, table):
    prefixes = _prefixes(table, 5)
    old_rng, new_rng = np.random.default_rng(11), np.random.default_rng(11)
    want = _searched(table, old_rng, prefixes)
    got = table.invert(new_rng, prefixes)
    np.testing.assert_array_equal(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert old_rng.integers(1 << 62) == new_rng.integers(1 << 62)   # the same words read
    old_log, new_log = [], []
    want = _searched(table, _Rows(3, old_log), prefixes)
    got = table.invert(_Rows(3, new_log), prefixes)
    np.testing.assert_array_equal(got[0], want[0])
    assert new_log == old_log                                        # the same rows, in order
    if table.bits == 20 and (table.lo != table.hi).any():     # (exact bounds for q = 1/2)
        assert old_log, "20-bit prefixes must reach the resolution by further bits"
    assert table._bucket_settled.any() and not table._bucket_settled.all()

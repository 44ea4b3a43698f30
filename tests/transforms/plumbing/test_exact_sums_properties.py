"""Properties of exact_sums (transforms/plumbing/exact_sums.py) on many random tables,
against Python's exact ``Fraction`` arithmetic: the per-group digit windows
(``_windows``), the blocks of one window width (``BLOCK_CELLS``, forced down to one group
a block) and the ragged terms (``terms=True``) must not depend on which other groups share
the table, on the group numbers or on the row order.

Each table mixes groups of every shape that stresses a window: values over the whole
exponent range, subnormals only, +-2^1023 and the largest float64 (sums past the range),
pairs cancelling exactly above a tiny residual, ties at any scale, values on the digit
boundaries 2^(16k), -0.0 and all-zero groups, one value, two values, groups with no row.
Checked for every group: the rounded sum is the exact sum rounded once (ties to even,
+-inf past the range); the terms are nonzero, of the sum's sign, in ascending magnitude,
and add up exactly to the sum (``finite`` False exactly where a term is +-inf); the same
group summed alone gives the same sum and the same terms; the terms of two partial tables
sum back to the whole table's sum. Fixed seeds, no statistics: deterministic (a false
failure has probability 0)."""
from fractions import Fraction

import numpy as np
import pytest

from thresher.transforms.plumbing import exact_sums as es

_MAX = float(np.finfo(np.float64).max)
_TINY = 5e-324


def _exact(total):
    try:
        return float(total)             # Fraction -> float: correctly rounded, ties to even
    except OverflowError:
        return float("inf") if total > 0 else float("-inf")


def _group(rng):
    n = int(rng.choice([1, 2, 3, int(rng.integers(1, 25))]))
    kind = int(rng.integers(0, 12))
    if kind == 0:
        v = np.round(rng.normal(3, 2.5, size=n), 2)
    elif kind == 1:
        v = rng.normal(size=n) * 2.0 ** rng.integers(-1074, 1023, size=n)
    elif kind == 2:
        v = rng.integers(-2 ** 52, 2 ** 52, size=n) * _TINY
    elif kind == 3:
        v = rng.choice([_MAX, -_MAX, 2.0 ** 1023, -2.0 ** 1023, 2.0 ** 971, _TINY], size=n)
    elif kind == 4:
        a = rng.normal(size=n) * 2.0 ** rng.integers(-1074, 1023, size=n)
        v = np.concatenate([a, -a, rng.choice([_TINY, -_TINY, 0.0], size=1)])
    elif kind == 5:
        v = rng.choice([0.0, -0.0], size=n)
    elif kind == 6:
        big = 2.0 ** int(rng.integers(-1000, 1023))
        v = np.concatenate([[big, -big], rng.choice([_TINY, -_TINY, 1.0, 2.0 ** -1022], size=n)])
    elif kind == 7:
        scale = 2.0 ** int(rng.integers(-1000, 960))
        v = scale * np.concatenate([[1.0], rng.choice([2.0 ** -53, -2.0 ** -53, 2.0 ** -54,
                                                       2.0 ** -106], size=n)])
    elif kind == 8:
        v = np.full(n, float(rng.choice([0.1, 1 / 3, -0.7, 1e308, -1e-310])))
    elif kind == 9:
        k = int(rng.integers(-60, 60))
        v = rng.choice([1.0, -1.0, 1 - 2.0 ** -53, 1 + 2.0 ** -52], size=n) * 2.0 ** (16 * k)
    elif kind == 10:
        v = np.concatenate([[1.7e308, -_TINY], np.round(rng.normal(size=n), 3)])
    else:
        v = rng.integers(-10 ** 6, 10 ** 6, size=n).astype(np.float64)
    v = np.asarray(v, dtype=np.float64)
    rng.shuffle(v)
    return v


def _table(seed):
    """(values of each group, values, group numbers, number of groups: a few beyond the
    last group have no row), rows shuffled."""
    rng = np.random.default_rng(seed)
    cases = [_group(rng) for _ in range(int(rng.choice([1, 2, 7, 40])))]
    values = np.concatenate(cases)
    group = np.repeat(np.arange(len(cases)), [len(c) for c in cases])
    order = rng.permutation(len(values))
    return cases, values[order], group[order], len(cases) + int(rng.integers(0, 3))


def _ragged(terms, count):
    start = np.cumsum(count) - count
    return [terms[s:s + c] for s, c in zip(start, count)]


def _same(a, b):
    return np.array_equal(np.asarray(a, dtype=np.float64).view(np.int64),
                          np.asarray(b, dtype=np.float64).view(np.int64))


@pytest.mark.parametrize("block_cells", [1 << 23, 40, 1])
def test_random_tables_sum_and_expand_exactly_whatever_shares_the_table(monkeypatch,
                                                                       block_cells):
    monkeypatch.setattr(es, "BLOCK_CELLS", block_cells)    # 1: one group a block
    for seed in range(24):
        cases, values, group, num_groups = _table(seed)
        totals = [sum(map(Fraction, c.tolist()), Fraction(0)) for c in cases]
        totals += [Fraction(0)] * (num_groups - len(cases))
        got = es.exact_sums(values, group, num_groups)
        assert _same(got, [_exact(t) for t in totals]), seed
        terms, count, finite = es.exact_sums(values, group, num_groups, terms=True)
        assert terms.dtype == np.float64 and terms.shape == (int(count.sum()),), seed
        for g, (mine, total) in enumerate(zip(_ragged(terms, count), totals)):
            assert (len(mine) == 0) == (total == 0), (seed, g)
            assert finite[g] == bool(np.isfinite(mine).all()), (seed, g)
            assert np.all(np.sign(mine) == np.sign(float(total) if finite[g] else got[g]))
            assert np.all(np.diff(np.abs(mine)) > 0), (seed, g)   # ascending positions
            if finite[g]:
                assert sum(map(Fraction, mine.tolist()), Fraction(0)) == total, (seed, g)
        # the same groups alone in a table, renumbered 0: the same sum and terms
        for g in range(len(cases)):
            alone = es.exact_sums(cases[g], np.zeros(len(cases[g]), dtype=np.int64), 1,
                                  terms=True)
            assert _same(es.exact_sums(cases[g], np.zeros(len(cases[g]), dtype=np.int64),
                                       1), got[g:g + 1]), (seed, g)
            if alone[1][0] and finite[g]:
                assert (sum(map(Fraction, alone[0].tolist()), Fraction(0))
                        == totals[g]), (seed, g)
        # the group numbers reversed and the rows in another order: the same per group
        flipped = num_groups - 1 - group
        order = np.random.default_rng(seed + 1000).permutation(len(values))
        back = es.exact_sums(values[order], flipped[order], num_groups, terms=True)
        again = _ragged(*back[:2])[::-1]
        assert all(_same(a, b) for a, b in zip(again, _ragged(terms, count))), seed
        assert _same(back[2][::-1], finite)
        # two partial tables' terms sum back to the whole table's sum
        half = len(values) // 2
        parts = [es.exact_sums(values[s], group[s], num_groups, terms=True)
                 for s in (slice(None, half), slice(half, None))]
        both = parts[0][2] & parts[1][2]
        keep = [np.repeat(both, p[1]) for p in parts]         # finite terms only
        joined = np.concatenate([p[0][k] for p, k in zip(parts, keep)])
        owner = np.concatenate([np.repeat(np.arange(num_groups), p[1])[k]
                                for p, k in zip(parts, keep)])
        assert _same(es.exact_sums(joined, owner, num_groups)[both], got[both]), seed


def test_empty_tables_and_integer_values():
    """No rows (any number of groups): zero sums, no terms. int64 values are the float64
    values they convert to (what the callers pass: value columns are float64)."""
    for num_groups in (0, 1, 3):
        got = es.exact_sums(np.zeros(0), np.zeros(0, dtype=np.int64), num_groups)
        assert got.tolist() == [0.0] * num_groups
        terms, count, finite = es.exact_sums(np.zeros(0), np.zeros(0, dtype=np.int64),
                                             num_groups, terms=True)
        assert len(terms) == 0 and count.tolist() == [0] * num_groups and finite.all()
    rng = np.random.default_rng(4)
    ints = rng.integers(-2 ** 62, 2 ** 62, size=300)
    group = rng.integers(0, 20, size=300)
    floats = ints.astype(np.float64)
    assert _same(es.exact_sums(ints, group, 20), es.exact_sums(floats, group, 20))
    a, b = (es.exact_sums(x, group, 20, terms=True) for x in (ints, floats))
    assert _same(a[0], b[0]) and np.array_equal(a[1], b[1])

"""Exact per-group sums (transforms/plumbing/exact_sums.py): the correctly rounded exact sum
of each group's values, whatever their order or split, checked against Python's exact
``Fraction`` arithmetic on fixed-seed inputs (wide exponents, subnormals, cancellation,
overflow). Deterministic."""
from fractions import Fraction

import numpy as np
import pytest

from thresher.transforms.plumbing import exact_sums as es


def _exact(values):
    total = sum(Fraction(float(v)) for v in values)
    try:
        return float(total)             # correctly rounded
    except OverflowError:
        return float("inf") if total > 0 else float("-inf")


def _cases(seed=5, number=240):
    rng = np.random.default_rng(seed)
    cases = []
    for trial in range(number):
        n = int(rng.integers(1, 30))
        kind = trial % 6
        if kind == 0:
            v = rng.normal(size=n)
        elif kind == 1:
            v = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, size=n)
        elif kind == 2:
            v = np.full(n, 1e308)
        elif kind == 3:
            v = rng.integers(-5, 5, size=n) * 2.0 ** rng.integers(-1074, -1000, size=n)
        elif kind == 4:
            v = np.concatenate([[1.0, 2.0 ** -53, 2.0 ** -53 * (1 + 2.0 ** -52)],
                                rng.normal(size=n) * 1e-30])
        else:
            v = np.concatenate([[1e16, 1.0, -1e16],
                                rng.integers(0, 3, size=n) * 0.5 ** rng.integers(0, 60, size=n)])
        cases.append(v)
    return cases


@pytest.mark.parametrize("block_cells", [1 << 23, 50])
def test_sums_are_the_correctly_rounded_exact_sums_in_any_order(monkeypatch, block_cells):
    monkeypatch.setattr(es, "BLOCK_CELLS", block_cells)     # 50: many blocks of groups
    cases = _cases()
    values = np.concatenate(cases)
    group = np.repeat(np.arange(len(cases)), [len(c) for c in cases])
    expected = np.array([_exact(c) for c in cases])
    for seed in (1, 2):
        order = np.random.default_rng(seed).permutation(len(values))
        got = es.exact_sums(values[order], group[order], len(cases))
        assert np.array_equal(got, expected)


def _expansion(terms, count, g):
    """Group g's terms of the ragged expansion (terms, count)."""
    start = int(count[:g].sum())
    return terms[start:start + int(count[g])]


def _owners(count):
    """The group of every term of a ragged expansion."""
    return np.repeat(np.arange(len(count)), count)


def test_terms_are_exact_expansions_that_sum_back_to_the_same_total():
    cases = _cases(seed=6)
    values = np.concatenate(cases)
    group = np.repeat(np.arange(len(cases)), [len(c) for c in cases])
    terms, count, finite = es.exact_sums(values, group, len(cases), terms=True)
    assert (~finite).sum() > 0                       # the 1e308 groups pass the range
    assert terms.shape == (count.sum(),) and np.all(terms != 0)    # ragged: no padding
    assert es.term_slots([2, 0, 3, 1]).tolist() == [0, 1, 0, 1, 2, 0]
    for i, case in enumerate(cases):
        if not finite[i]:
            continue
        assert (sum(Fraction(float(t)) for t in _expansion(terms, count, i))
                == sum(Fraction(float(v)) for v in case))
    # split a group's values between two "tables": the expansions' exact sum is its sum
    half = len(values) // 2
    first = es.exact_sums(values[:half], group[:half], len(cases), terms=True)
    second = es.exact_sums(values[half:], group[half:], len(cases), terms=True)
    joined = np.concatenate([first[0], second[0]])
    owner = np.concatenate([_owners(first[1]), _owners(second[1])])
    both = first[2] & second[2]
    got = es.exact_sums(joined, owner, len(cases))
    expected = np.array([_exact(c) for c in cases])
    assert np.array_equal(got[both], expected[both])


def test_one_group_spanning_the_range_does_not_widen_the_others_expansions():
    """20,000 ordinary groups (three decimals each: at most three terms) beside one group
    whose exact sum spans the whole float64 range (1.7e308 - 2^-1074: every digit set, 45
    terms). The expansion holds the terms needed (about 3 a group), not groups x the
    widest: the dense layout held 20,001 x 45 = 900,045 values. Each expansion is exact.
    Counts elements and window widths, never time."""
    rng = np.random.default_rng(8)
    n = 20000
    values = np.append(np.round(rng.normal(3.0, 2.5, size=3 * n), 2), [1.7e308, -_TINY])
    group = np.append(np.repeat(np.arange(n), 3), [n, n])
    order = rng.permutation(len(values))
    terms, count, finite = es.exact_sums(values[order], group[order], n + 1, terms=True)
    assert finite.all() and count[n] >= 40 and count[:n].max() <= 3
    assert terms.size == count.sum() <= 3 * n + count[n]
    # and the ordinary groups' digits are summed in their own narrow windows (the table's
    # window was 140 digits wide for every group: 2.5 times the CPU time at 1e6 pairs)
    _, width = es._windows(values, group, n + 1)
    assert width[:n].max() <= 16 and width[n] >= 130
    for g in (*range(0, n, 997), n):
        assert (sum(map(Fraction, _expansion(terms, count, g).tolist()), Fraction(0))
                == sum(map(Fraction, values[group == g].tolist()), Fraction(0))), g


def test_the_exact_sum_differs_from_the_ascending_float_sum_where_that_rounds():
    """Why published bytes can change (CHANGELOG, issue 43): ten copies of 0.1 add up
    to 0.9999999999999999 in float64, their exact sum rounds to 1.0."""
    values = np.full(10, 0.1)
    running = 0.0
    for v in np.sort(values):
        running += v
    assert running != 1.0
    assert es.exact_sums(values, np.zeros(10, dtype=np.int64), 1)[0] == 1.0


def test_integer_values_take_the_plain_sum():
    rng = np.random.default_rng(3)
    values = rng.integers(-20, 20, size=5000).astype(np.float64)
    group = rng.integers(0, 300, size=5000)
    assert es._dyadic_exact(values)
    assert np.array_equal(es.exact_sums(values, group, 300),
                          np.bincount(group, weights=values, minlength=300))


_MAX = float(np.finfo(np.float64).max)
_TINY = 5e-324


def _hostile(rng):
    """One group's values, built to catch rounding and range mistakes: exact ties (1 +
    2^-53 patterns at any scale, ulp(max)/2 beside the largest float64), overflow by a
    tie or by many values, subnormal inputs and results, cancellation to exactly zero,
    -0.0 among the values, a huge pair cancelling above a tiny residual, long runs of one
    value (carries across digits)."""
    n = int(rng.integers(1, 12))
    kind = int(rng.integers(0, 10))
    if kind == 0:
        base = float(rng.choice([1.0, -1.0, 3.0, 2.0 ** int(rng.integers(-1000, 1000))]))
        v = [base, *(base * 2.0 ** -53 * rng.choice([1, -1, 0.5, 1 + 2.0 ** -52], size=n))]
    elif kind == 1:
        v = rng.choice([_MAX, -_MAX, _MAX / 2, 2.0 ** 970, -2.0 ** 970, 2.0 ** 969,
                        2.0 ** 1023], size=n)
    elif kind == 2:
        v = rng.integers(-2 ** 52, 2 ** 52, size=n) * _TINY
    elif kind == 3:
        a = rng.normal(size=n) * 10.0 ** rng.integers(-300, 300, size=n)
        v = [*a, *(-a)]
    elif kind == 4:
        v = rng.choice([-0.0, 0.0, 1e-310, -1e-310, 1.0], size=n)
    elif kind == 5:
        big = 2.0 ** int(rng.integers(0, 1020))
        v = [big, -big, *rng.choice([_TINY, -_TINY, 2.0 ** -1022, 1.0], size=n)]
    elif kind == 6:
        v = rng.normal(size=n) * 2.0 ** rng.integers(-1074, 1023, size=n)
    elif kind == 7:
        v = [_MAX, 2.0 ** 970, *rng.choice([0.0, _TINY, -_TINY], size=n)]
    elif kind == 8:
        v = [float(rng.choice([0.1, 1 / 3, -0.7, 1e308]))] * int(rng.integers(1, 40))
    else:
        v = rng.choice([1.0, 2.0 ** -53, 2.0 ** -54, 2.0 ** -106, -2.0 ** -53, 2.0 ** 53,
                        1.5], size=n)
    v = np.array(v, dtype=np.float64)
    rng.shuffle(v)
    return v


@pytest.mark.parametrize("block_cells", [1 << 23, 30])
def test_hostile_values_sum_and_expand_exactly_in_any_order_and_split(monkeypatch,
                                                                      block_cells):
    """Against ``Fraction`` (exact, then rounded once by Python's correctly rounded
    int division): the sums of 600 hostile groups in a random order, and, for every
    group whose partials are finite, the sum of the terms of three random partial tables
    (as the pre-reduction recombines them after the user shuffle). Groups of one or two
    values take the fast path, the others the superaccumulator. Deterministic."""
    monkeypatch.setattr(es, "BLOCK_CELLS", block_cells)
    rng = np.random.default_rng(43)
    cases = [_hostile(rng) for _ in range(600)]
    values = np.concatenate(cases)
    group = np.repeat(np.arange(len(cases)), [len(c) for c in cases])
    expected = np.array([_exact(c) for c in cases])
    order = rng.permutation(len(values))
    got = es.exact_sums(values[order], group[order], len(cases))
    assert np.array_equal(got, expected)
    assert np.isinf(expected).any() and (expected == 0).any()
    table = rng.integers(0, 3, size=len(values))
    joined, owner, finite = [], [], np.ones(len(cases), dtype=bool)
    for t in range(3):
        mine = table == t
        terms, count, ok = es.exact_sums(values[mine], group[mine], len(cases), terms=True)
        finite &= ok
        assert terms.shape == (count.sum(),) and np.all(terms != 0)   # ragged: no padding
        for g in np.flatnonzero(ok):
            assert (sum(map(Fraction, _expansion(terms, count, g).tolist()), Fraction(0))
                    == sum(map(Fraction, values[mine][group[mine] == g].tolist()), Fraction(0)))
        keep = np.repeat(ok, count)
        joined.append(terms[keep])
        owner.append(_owners(count)[keep])
    assert (~finite).any() and finite.sum() > 500
    again = es.exact_sums(np.concatenate(joined), np.concatenate(owner), len(cases))
    assert np.array_equal(again[finite], expected[finite])


def test_many_rows_in_one_digit_carry_exactly():
    """400,000 rows in seven groups (one value repeated just below 2^1001, 0.1 repeated,
    a 1 +- 2^-53 mix, values over the whole exponent range) against ``math.fsum``
    (correctly rounded)."""
    import math
    rng = np.random.default_rng(1)
    n = 400_000
    group = rng.integers(0, 7, size=n)
    values = rng.normal(size=n) * 2.0 ** rng.integers(-1074, 1000, size=n)
    values[group == 3] = 2.0 ** 1000 * (1 - 2.0 ** -53)
    values[group == 4] = 0.1
    values[group == 5] = rng.choice([1.0, 2.0 ** -53, -2.0 ** -53], size=(group == 5).sum())
    got = es.exact_sums(values, group, 7)
    assert [float(x) for x in got] == [math.fsum(values[group == k]) for k in range(7)]


@pytest.mark.parametrize("values", [[_MAX] * 3, [_MAX, -_MAX, _MAX], [1e308] * 3,
                                    [2.0 ** 1023] * 4, [1.7e308, 9e307, -1e308]])
def test_groups_of_values_beyond_2_to_the_1023_do_not_raise(values):
    """Values of magnitude >= 2^1023 (ulp 2^971) in the superaccumulator's groups: the
    dyadic fast path's bound 2^(53 + 971) is beyond float64; it raised OverflowError
    (a traceback for a valid input) instead of returning the sum (+inf here or finite)."""
    values = np.array(values)
    got = es.exact_sums(values, np.zeros(len(values), dtype=np.int64), 1)
    assert got[0] == _exact(values)
    terms, count, finite = es.exact_sums(values, np.zeros(len(values), dtype=np.int64), 1,
                                         terms=True)
    assert terms.shape == (count[0],)
    if finite[0]:
        assert sum(map(Fraction, terms.tolist()), Fraction(0)) == sum(map(Fraction, values.tolist()))

"""Exact per-group sums (transforms/values/exact_sums.py): the correctly rounded exact sum
of each group's values, whatever their order or split, checked against Python's exact
``Fraction`` arithmetic on fixed-seed inputs (wide exponents, subnormals, cancellation,
overflow). Deterministic."""
from fractions import Fraction

import numpy as np
import pytest

from thresher.transforms.values import exact_sums as es


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


def test_terms_are_exact_expansions_that_sum_back_to_the_same_total():
    cases = _cases(seed=6)
    values = np.concatenate(cases)
    group = np.repeat(np.arange(len(cases)), [len(c) for c in cases])
    terms, count, finite = es.exact_sums(values, group, len(cases), terms=True)
    assert (~finite).sum() > 0                       # the 1e308 groups pass the range
    for i, case in enumerate(cases):
        if not finite[i]:
            continue
        assert np.all(terms[i, count[i]:] == 0)
        assert (sum(Fraction(float(t)) for t in terms[i])
                == sum(Fraction(float(v)) for v in case))
    # split a group's values between two "tables": the expansions' exact sum is its sum
    half = len(values) // 2
    first = es.exact_sums(values[:half], group[:half], len(cases), terms=True)
    second = es.exact_sums(values[half:], group[half:], len(cases), terms=True)
    joined = np.concatenate([first[0].ravel(), second[0].ravel()])
    owner = np.concatenate([np.repeat(np.arange(len(cases)), first[0].shape[1]),
                            np.repeat(np.arange(len(cases)), second[0].shape[1])])
    both = first[2] & second[2]
    got = es.exact_sums(joined, owner, len(cases))
    expected = np.array([_exact(c) for c in cases])
    assert np.array_equal(got[both], expected[both])


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

"""The shared monotone searches return the smallest qualifying value, and None only when
none qualifies (including the top of the range)."""
import math

from hypothesis import given, strategies as st

from thresher.accounting.search import smallest_integer, smallest_real


@given(st.integers(0, 10**6), st.integers(0, 10**6), st.integers(1, 10**6))
def test_smallest_integer_is_exact(low, target, span):
    max_high = low + span
    got = smallest_integer(lambda n: n >= target, low, max_high=max_high)
    want = max(low, target) if max(low, target) <= max_high else None
    assert got == want


def test_smallest_integer_checks_max_high_itself():
    # the qualifying value sits exactly at max_high, between doubling steps
    assert smallest_integer(lambda n: n >= 1000, 0, max_high=1000) == 1000
    assert smallest_integer(lambda n: n >= 1001, 0, max_high=1000) is None


@given(st.floats(0.001, 1e6))
def test_smallest_real_qualifies_and_is_tight(target):
    got = smallest_real(lambda x: x >= target, 0.0, math.inf, rel_tol=1e-9)
    assert got >= target and got <= target * (1 + 1e-8) + 1e-12

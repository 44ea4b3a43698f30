"""fixed_order.convolve loops over the side with fewer non-zero entries and keeps the bits
of the loop over ``b`` (each output's terms in increasing j). The aggregates' accounting
convolves a short pmf with a ~4,000-entry one (accounting/aggregates.py): looping over
the long side made a cold plan of ``auto`` with a sum and a mean take ~30 s."""
import numpy as np
import pytest

from thresher.accounting import fixed_order


def _loop_over_b(a, b):
    """The convolution as fixed_order computed it before (frozen copy): one vector
    operation per non-zero entry of ``b``, in increasing j."""
    a = np.asarray(a, dtype=np.float64).ravel()
    b = np.asarray(b, dtype=np.float64).ravel()
    n = len(a)
    out = np.zeros(n + len(b) - 1)
    scratch = np.empty(n)
    for j in np.flatnonzero(b):
        np.multiply(a, b[j], out=scratch)
        window = out[j:j + n]
        np.add(window, scratch, out=window)
    return out


def _values(rng, n, zeros, signed):
    """Magnitudes over 600 binary orders (subnormals included), some exact zeros."""
    v = np.ldexp(rng.random(n), rng.integers(-1074, -474, n) + 500)
    if signed:
        v *= rng.choice([-1.0, 1.0], n)
    v[rng.random(n) < zeros] = 0.0
    return v


@pytest.mark.parametrize("seed", range(60))
def test_both_loops_give_the_bits_of_the_loop_over_b(seed):
    rng = np.random.default_rng(seed)
    la, lb = (int(x) for x in rng.integers(1, 400, 2))
    if seed % 3 == 0:
        la, lb = min(la, lb) // 8 + 1, max(la, lb) * 4      # the aggregates' shape
    a = _values(rng, la, zeros=rng.random() * 0.5, signed=seed % 2 == 0)
    b = _values(rng, lb, zeros=rng.random() * 0.5, signed=seed % 4 == 1)
    for x, y in ((a, b), (b, a)):
        want = _loop_over_b(x, y)
        got = fixed_order.convolve(x, y)
        assert got.tobytes() == want.tobytes()


def test_the_shorter_side_is_the_loop(monkeypatch):
    """A 50-entry ``a`` against a 4,000-entry ``b``: 50 vector operations, not 4,000."""
    calls = []
    real = fixed_order._add_shifted
    monkeypatch.setattr(fixed_order, "_add_shifted",
                        lambda out, long, short, positions: (calls.append(len(positions)),
                                                             real(out, long, short, positions)))
    rng = np.random.default_rng(7)
    a, b = rng.random(50), rng.random(4000)
    assert fixed_order.convolve(a, b).tobytes() == _loop_over_b(a, b).tobytes()
    assert calls == [50]


def test_a_non_finite_entry_keeps_the_loop_over_b():
    """inf times a zero of ``b`` is NaN: with a non-finite entry the loop over ``b``
    (which skips b's zeros) is the only one that gives its bits."""
    a = np.array([1.0, np.inf, 2.0])
    b = np.array([0.5, 0.0, 0.0, 0.0, 3.0, 0.0, 1.0, 0.0])
    want = _loop_over_b(a, b)
    got = fixed_order.convolve(a, b)
    assert got.tobytes() == want.tobytes()
    assert not np.isnan(got).any()


def test_it_is_the_convolution():
    rng = np.random.default_rng(3)
    a, b = rng.integers(0, 9, 17).astype(float), rng.integers(0, 9, 300).astype(float)
    assert np.array_equal(fixed_order.convolve(a, b), np.convolve(a, b))   # integers: exact

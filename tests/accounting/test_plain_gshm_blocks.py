"""accounting.plain_gshm evaluates its tail sums a block at a time (issue 43 item 1); this
checks that it decides exactly as the term-by-term loop it replaced, kept verbatim in
``plain_gshm_scalar_oracle.py`` next to this file: the same bits for every value (so the
same accept/refuse of a cached calibration against any budget), the same give-up (None /
TooLarge) and the same budget left, on a grid and at the edges: tiny sigma, huge sigma
(where the cost cap gives up), huge gaps and epsilon sigma^2 (far-out sums), and the
budgets where the cap flips."""
import importlib.util
import itertools
import math
import pathlib

import pytest

from thresher.accounting import plain_gshm

_spec = importlib.util.spec_from_file_location(
    "plain_gshm_scalar_oracle", pathlib.Path(__file__).with_name("plain_gshm_scalar_oracle.py"))
oracle = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(oracle)


def _same(a, b):
    """Bitwise equality of floats (and of None / tuples of floats)."""
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if a is None or b is None or isinstance(a, str) or isinstance(b, str):
        return a == b
    return math.copysign(1.0, a) == math.copysign(1.0, b) and (a == b or a != a and b != b)


def _outcome(fn, *args):
    try:
        return ("value", fn(*args))
    except Exception as e:                      # the same exception type counts as the same
        return ("raised", type(e).__name__)


GRID = list(itertools.product(
    [0.0, 1.0, 4.0],                                           # epsilon
    [0.05, 0.4, 1.5, 3.3, 16.0, 90.0],                         # sigma
    [-30, -1, 0, 0.5, 3, 25, 400, 1e7],                        # threshold gap
    [1, 2, 8, 14])) + [                                        # max_keys_per_user
    # huge sigma: near and past the cost cap (None), where the scalar loop walked 1e5 terms
    (eps, sigma, gap, c) for eps, sigma, gap, c in itertools.product(
        [0.01, 1.0], [700.0, 2500.0], [0, 30], [1, 14, 40])]


def test_delta_upper_is_the_scalar_loops_bit_for_bit():
    differ = [p for p in GRID
              if not _same(plain_gshm.delta_upper(*p), oracle.delta_upper(*p))]
    assert differ == []
    # the grid reaches both give-ups and ordinary values
    values = [plain_gshm.delta_upper(*p) for p in GRID[::7]]
    assert None in values and any(v is not None and 0 < v < 1e-3 for v in values)


@pytest.mark.parametrize("sigma, c", [(0.3, 1), (1.7, 4), (12.0, 14), (333.0, 3), (1e4, 1)])
def test_shift_bound_and_fits_flip_at_the_same_delta(sigma, c):
    """gaussian_fits is bound <= delta: at the oracle's bound it accepts, one float below it
    refuses, in both; over epsilons from 0 to far out (epsilon sigma^2 ~ 1e13)."""
    for eps in (0.0, 1e-9, 0.3, 2.0, 1e13 / (sigma * sigma)):
        old = oracle.shift_delta_upper(eps, sigma, c)
        assert _same(plain_gshm.shift_delta_upper(eps, sigma, c), old)
        for delta in (old, math.nextafter(old, 0.0), math.nextafter(old, 2.0), 1e-300):
            assert plain_gshm.gaussian_fits(eps, delta, c, sigma) == \
                oracle.gaussian_fits(eps, delta, c, sigma)


@pytest.mark.parametrize("sigma", [0.05, 0.7, 2.0, 41.0, 5000.0])
def test_log_beta_lower_far_and_near(sigma):
    for gap in (-1e6, -40, -1, 0, 0.2, 1, 9, 300, 1e9, 3e12, 1e200):
        assert _same(_outcome(plain_gshm.log_beta_lower, sigma, gap),
                     _outcome(oracle.log_beta_lower, sigma, gap))


@pytest.mark.parametrize("t, s", [(-10**9, 900.0), (-7, 900.0), (0, 2345.6), (1, 3.0e3),
                                  (500, 700.0)])
def test_the_cost_cap_flips_at_the_same_budget(t, s):
    """_tail against the oracle's with budgets just around what the sum costs, including the
    scalar loop's quirk that a whole multiple of 4096 terms is charged one block less: the
    same give-up and the same budget left (shared by the later sums of one check)."""
    full = oracle._Budget(10**7)
    oracle._tail(t, s, None, full)
    cost = 10**7 - full.left
    assert cost > 4096
    for left in sorted({cost - 4097, cost - 4096, cost - 4095, cost - 1, cost, cost + 1,
                        4096 * (cost // 4096), 4096 * (cost // 4096) - 1, cost + 5000}):
        for weight in (None, lambda u: 0.5):
            old_b, new_b = oracle._Budget(left), plain_gshm._Budget(left)
            old = _outcome(oracle._tail, t, s, weight, old_b)
            new = _outcome(plain_gshm._tail, t, s,
                           None if weight is None else (lambda u: 0.5 + 0.0 * u), new_b)
            assert _same(old, new) or (old[0] == new[0] == "raised" and old[1] == new[1])
            if old[0] == "value":
                assert new_b.left == old_b.left


def test_calibrations_of_the_kind_verify_as_before():
    """Real calibrations (the cached values' source) over epsilons, tiny to ordinary deltas
    and bounds: the bound on each, and on it with sigma one float lower (just unsound), is
    the same bits as the oracle's."""
    from thresher.pipelines.kinds import gaussian
    for eps, delta, c in itertools.product([0.1, 1.0], [1e-14, 1e-8, 1e-4], [1, 8, 14]):
        p = gaussian.calibrate({"kind": "gaussian", "pre_threshold": 1}, epsilon=eps,
                               delta=delta, max_keys_per_user=c, model="l0")
        gap = p["threshold"] - p["pre_threshold"]
        for sigma in (p["sigma"], math.nextafter(p["sigma"], 0.0)):
            for g in (gap, gap - 1):
                new = plain_gshm.delta_upper(eps, sigma, g, c)
                assert _same(new, oracle.delta_upper(eps, sigma, g, c))
        assert new is not None and plain_gshm.delta_upper(eps, p["sigma"], gap, c) <= delta


def test_a_whole_number_of_blocks_is_charged_as_before():
    """The scalar loop never charged the last of a whole number of 4096-term blocks: a sum
    of 12,288 terms (t = -9430, s = 300, found with the oracle) cost 8,192. The block form
    charges the same, so the cap flips at the same budget."""
    full = oracle._Budget(10**7)
    oracle._tail(-9430, 300.0, None, full)
    assert 10**7 - full.left == 8192
    for left in (8191, 8192, 8193):
        old_b, new_b = oracle._Budget(left), plain_gshm._Budget(left)
        old = _outcome(oracle._tail, -9430, 300.0, None, old_b)
        new = _outcome(plain_gshm._tail, -9430, 300.0, None, new_b)
        assert _same(old, new)
        if old[0] == "value":              # after a give-up the budget is never read again
            assert new_b.left == old_b.left
    assert old[0] == "value" and _outcome(plain_gshm._tail, -9430, 300.0, None,
                                          plain_gshm._Budget(8191)) == ("raised", "_TooLarge")


def test_each_term_is_math_exp():
    """The terms are the C library's exp, bit for bit (not NumPy's nor a long double one,
    which differ in the last bit on about 1 argument in 1,000: a different term can move
    a stopping point or a rounded sum). 200,000 arguments from a fixed seed over the range
    the sums use."""
    import numpy as np
    x = -np.random.default_rng(43).uniform(0.0, 745.0, 200_000)
    got = plain_gshm._exp_each(x)
    assert [float(v) for v in got] == [math.exp(v) for v in x.tolist()]

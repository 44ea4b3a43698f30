"""The mean's interval, pinned exactly (issue 36 M1; pipelines/dataio/intervals.py).

A mean's ``_low`` / ``_high`` are the range of S / n over the box of the count interval
at error alpha/2 and the sum interval at alpha/2 (union bound), widened by half a grid
step and clamped to the clip (docs/intervals.md). Coverage tests cannot see a box built
at alpha instead of alpha/2, or a missing widening (measured coverage stays >= 0.994), so
here every endpoint the launcher publishes (``intervals.add_columns`` on a plan's real
report) is compared with an independent computation: the count's Neyman set by direct
sums over the noise pmf, the sum's symmetric quantile by a direct pmf sum, the ratio's
range by its four corners, then the widening. Each of the three mutations of issue 36
(count box at alpha, the mean-only sum box at alpha, no widening) fails these tests.
"""
import math

import numpy as np
import pyarrow as pa
import pytest

from thresher.accounting import intervals as iv
from thresher.pipelines.dataio import intervals
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod
from tests.accounting.test_intervals import _brute_interval

CLIP = [0.0, 100.0]
CONFIDENCE = 0.95


_PLANS = {}


def _plan(write_spec, statistics, confidence=CONFIDENCE):
    """The plan of the base spec with these aggregates (calibrated once per module)."""
    key = (tuple(statistics), confidence)
    if key not in _PLANS:
        aggregates = [{"column": "amount", "statistic": s, "clip": CLIP} for s in statistics]
        _PLANS[key] = make_plan(spec_mod.load(write_spec({"aggregates": aggregates,
                                                          "output.confidence": confidence})))
    return _PLANS[key]


def _brute_symmetric_quantile(sigma, alpha):
    """The least k with P(|Z| <= k) >= 1 - alpha for the discrete Gaussian of scale
    ``sigma``, by direct sums of its pmf over +-12 sigma (the rest is < 1e-31)."""
    radius = int(math.ceil(12 * sigma))
    z = np.arange(-radius, radius + 1, dtype=np.float64)
    p = np.exp(-z * z / (2.0 * sigma * sigma))
    p /= p.sum()
    inside = np.cumsum(p[radius:])            # P(Z = 0), ... : mass of |Z| <= k is
    mass = 2.0 * inside - p[radius]          # 2 P(0 <= Z <= k) - P(Z = 0)
    return int(np.argmax(mass >= 1.0 - alpha))


def _oracle_mean(counts, means, mechanism, entry, alpha, noisy_sums=None):
    """The mean interval from its definition, computed independently (module docstring)."""
    half = alpha / 2.0
    step = 0.5 / entry["grid_scale"]
    k = _brute_symmetric_quantile(entry["sigma_grid_units"], half)
    width = k / entry["grid_scale"]
    lows, highs = [], []
    for i, (n, mean) in enumerate(zip(counts, means)):
        accepted = _brute_interval(int(n), iv.GAUSSIAN, mechanism["sigma"],
                                   int(mechanism["pre_threshold"]), mechanism["threshold"],
                                   half, int(n) + 120)
        n_lo, n_hi = accepted[0], accepted[-1]
        if noisy_sums is None:       # a mean alone: its noisy sum is mean * count
            noisy = mean * n
            s_lo = noisy - width - 1e-12 * abs(noisy)
            s_hi = noisy + width + 1e-12 * abs(noisy)
        else:
            s_lo, s_hi = noisy_sums[i] - width, noisy_sums[i] + width
        corners = [s / m for s in (s_lo, s_hi) for m in (n_lo, n_hi)]
        lows.append(min(max(min(corners) - step, CLIP[0]), CLIP[1]))
        highs.append(min(max(max(corners) + step, CLIP[0]), CLIP[1]))
    return np.array(lows), np.array(highs)


def _released(mechanism, means, sums=None):
    tau = int(math.ceil(mechanism["threshold"]))
    counts = np.array(COUNTS) + tau
    columns = {"key": [f"k{i}" for i in range(len(counts))],
               "count": pa.array(counts, pa.int64())}
    if sums is not None:
        columns["amount_sum"] = pa.array(sums, pa.float64())
    columns["amount_mean"] = pa.array(means, pa.float64())
    return counts, pa.table(columns)


MEANS = np.array([37.25, 50.0, 12.5, 81.0, 3.75, 64.125])
COUNTS = [0, 3, 17, 60, 150, 400]      # above tau*: at it, near it, far beyond


def test_a_mean_alone_is_the_box_of_two_half_alpha_intervals_widened(write_spec):
    plan = _plan(write_spec, ["mean"])
    mechanism = plan.report()["mechanism"]
    entry, = mechanism["aggregates"]
    counts, table = _released(mechanism, MEANS)
    out = intervals.add_columns(table, mechanism, plan.spec).to_pydict()
    low, high = _oracle_mean(counts, MEANS, mechanism, entry, 1.0 - CONFIDENCE)
    np.testing.assert_allclose(out["amount_mean_low"], low, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["amount_mean_high"], high, rtol=1e-12, atol=1e-12)


def test_a_mean_beside_its_sum_uses_the_published_sum_at_half_alpha(write_spec):
    plan = _plan(write_spec, ["sum", "mean"])
    mechanism = plan.report()["mechanism"]
    entry = next(e for e in mechanism["aggregates"] if e["statistic"] == "mean")
    tau = int(math.ceil(mechanism["threshold"]))
    sums = MEANS * (np.array(COUNTS) + tau) + 7.5
    counts, table = _released(mechanism, MEANS, sums)
    out = intervals.add_columns(table, mechanism, plan.spec).to_pydict()
    low, high = _oracle_mean(counts, MEANS, mechanism, entry, 1.0 - CONFIDENCE, sums)
    np.testing.assert_allclose(out["amount_mean_low"], low, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["amount_mean_high"], high, rtol=1e-12, atol=1e-12)


def test_each_box_is_built_at_half_alpha_and_widened_by_half_a_grid_step(write_spec,
                                                                         monkeypatch):
    """The levels the two boxes ask the accounting for, and the widening, one by one."""
    plan = _plan(write_spec, ["mean"])
    mechanism = plan.report()["mechanism"]
    entry, = mechanism["aggregates"]
    counts, table = _released(mechanism, MEANS)
    asked = {"count": [], "sum": []}
    real_bounds, real_quantile = iv.count_bounds, iv.symmetric_quantile

    def count_bounds(y, tail, alpha, *args, **kwargs):
        asked["count"].append(alpha)
        return real_bounds(y, tail, alpha, *args, **kwargs)

    def symmetric_quantile(noise, scale, alpha):
        asked["sum"].append(alpha)
        return real_quantile(noise, scale, alpha)
    monkeypatch.setattr(iv, "count_bounds", count_bounds)
    monkeypatch.setattr(iv, "symmetric_quantile", symmetric_quantile)
    alpha = 1.0 - CONFIDENCE
    low, high = intervals.mean_interval(counts, *intervals._sum_box(
        table, entry, counts, MEANS, {}, alpha), entry, mechanism, alpha)
    assert asked == {"count": [alpha / 2.0], "sum": [alpha / 2.0]}
    # the box's range, without the widening, sits exactly half a grid step inside
    n_lo, n_hi = real_bounds(counts, intervals.count_tail_and_rule(mechanism)[0], alpha / 2.0,
                             int(mechanism["pre_threshold"]),
                             threshold=mechanism["threshold"])
    s_lo, s_hi = intervals._sum_box(table, entry, counts, MEANS, {}, alpha)
    box_lo, box_hi = iv.ratio_range(s_lo, s_hi, n_lo, n_hi)
    step = 0.5 / entry["grid_scale"]
    assert step > 1e-3
    np.testing.assert_array_equal(low, np.clip(box_lo - step, *CLIP))
    np.testing.assert_array_equal(high, np.clip(box_hi + step, *CLIP))


@pytest.mark.parametrize("confidence", [0.9, 0.99])
def test_other_levels_split_alike(write_spec, confidence):
    plan = _plan(write_spec, ["mean"], confidence)
    mechanism = plan.report()["mechanism"]
    entry, = mechanism["aggregates"]
    counts, table = _released(mechanism, MEANS)
    out = intervals.add_columns(table, mechanism, plan.spec).to_pydict()
    low, high = _oracle_mean(counts, MEANS, mechanism, entry, 1.0 - confidence)
    np.testing.assert_allclose(out["amount_mean_low"], low, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(out["amount_mean_high"], high, rtol=1e-12, atol=1e-12)

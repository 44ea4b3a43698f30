"""The Alg. 4 row build of accounting.pws against its plain statement (issue 18).

``accounting.pws_core._next_row`` is called once per row of a frequency table, so it was
rewritten to make fewer numpy calls (plan time of ppswor/priority specs with small
sampling thresholds). The published tables must not change: this file keeps the previous,
plain implementation of PWS Alg. 4 (Appendix B, proof of Thm 5.1) as the reference and
requires the package's band to be *bit-for-bit* the same (keep probabilities, first
columns, row lengths, every stored value, stationarity) on many parameter sets, for the
three sampling schemes, with and without ``stop_when_stationary`` and ``max_entries``.
"""
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thresher.accounting import pws
from thresher.accounting.pws import core as pws_core


def reference_next_row(prev, lo, pi_prev, pi_i, up_factor, down_factor, delta):
    """Row i of Alg. 4 from row i-1, stated plainly (the package's code before issue 18)."""
    n = len(prev)
    slack = max(0.0, down_factor * (1.0 - pi_prev) - (1.0 - pi_i))
    row = np.zeros(n + 1)
    if n:
        cum_lower = np.cumsum(prev)
        cum_lower -= delta
        cum_lower *= down_factor
        cum_lower += slack
        np.maximum(cum_lower, 0.0, out=cum_lower)
        row[0] = cum_lower[0]
        np.subtract(cum_lower[1:], cum_lower[:-1], out=row[1:n])
        remaining = pi_i - cum_lower[-1]
    else:
        remaining = pi_i
    upper = np.empty(n + 1)
    np.multiply(prev, up_factor, out=upper[:n])
    upper[n] = delta
    raise_by = upper - row
    np.maximum(raise_by, 0.0, out=raise_by)
    suffix = np.cumsum(raise_by[::-1])
    n_top = int(np.searchsorted(suffix, remaining, side="right"))
    k0 = n + 1 - n_top
    if n_top:
        row[k0:] = upper[k0:]
    if k0 > 0:
        spent_above = suffix[n_top - 1] if n_top else 0.0
        row[k0 - 1] += remaining - spent_above
    first = int(np.argmax(row != 0.0))
    return lo + first, row[first:]


def reference_band(q, epsilon, delta, *, stop_when_stationary=False, max_entries=None):
    """(keep, lo, lengths, values, stationary) of Alg. 4, one row at a time, numpy scalars."""
    pi = pws_core._alg3(q, epsilon, delta)
    up_factor, down_factor = math.exp(epsilon), math.exp(-epsilon)
    m = len(q) - 1
    los, lengths, rows = [0], [0], []
    lo, prev, total, stationary = 1, np.zeros(0), 0, False
    for i in range(1, m + 1):
        lo, row = reference_next_row(prev, lo, pi[i - 1], pi[i], up_factor, down_factor, delta)
        if max_entries is not None and total + len(row) > max_entries:
            m = i - 1
            break
        los.append(lo)
        rows.append(row)
        lengths.append(len(row))
        total += len(row)
        if stop_when_stationary and pws_core._rows_stationary(prev, los[i - 1], row, lo,
                                                         pi[i - 1], pi[i]):
            m, stationary = i, True
            break
        prev = row
    values = np.concatenate(rows) if rows else np.zeros(0)
    return pi[:m + 1], np.array(los), np.array(lengths), values, stationary


def assert_same_band(q, epsilon, delta, **kw):
    keep, lo, lengths, values, stationary = reference_band(q, epsilon, delta, **kw)
    band = pws_core._build_band(q, epsilon, delta, **kw)
    assert band.keep.tobytes() == keep.tobytes()
    assert np.array_equal(band.lo, lo)
    assert np.array_equal(np.diff(band.indptr), lengths)
    # bit-for-bit (a zero's sign aside: -0.0 and 0.0 are the same probability)
    assert np.array_equal(band.values, values)
    assert (band.values + 0.0).tobytes() == (values + 0.0).tobytes()
    assert band.stationary == stationary
    return band


CASES = [
    # (sampling, threshold, epsilon, delta, max_frequency)
    ("none", None, 1.0, 1e-8, 60), ("none", None, 0.1, 1e-6, 400), ("none", None, 3.0, 0.01, 30),
    ("none", None, 0.05, 1e-10, 900), ("ppswor", 1e-3, 1.0, 1e-8, 3000),
    ("ppswor", 0.05, 0.5, 1e-7, 700), ("ppswor", 2.0, 0.3, 1e-5, 300),
    ("priority", 1e-3, 1.0, 1e-8, 1500), ("priority", 0.02, 2.0, 1e-9, 300),
    ("priority", 0.3, 0.2, 1e-4, 300), ("priority", 1e-4, 8.0, 1e-12, 3000),
    ("ppswor", 1e-4, 5.0, 1e-14, 2000),
]


@pytest.mark.parametrize("sampling,t,epsilon,delta,m", CASES)
def test_band_build_is_bit_identical_to_the_plain_algorithm(sampling, t, epsilon, delta, m):
    q = pws.sampling_probabilities(m, sampling=sampling, sampling_threshold=t)
    band = assert_same_band(q, epsilon, delta)
    assert band.max_frequency == m
    assert_same_band(q, epsilon, delta, stop_when_stationary=True)
    total = len(band.values)
    assert_same_band(q, epsilon, delta, max_entries=max(1, total // 3))
    assert_same_band(q, epsilon, delta, stop_when_stationary=True, max_entries=total)


@settings(max_examples=40, deadline=None)
@given(sampling=st.sampled_from(["none", "ppswor", "priority"]),
       log_t=st.floats(-4.0, 0.5), epsilon=st.floats(0.01, 10.0),
       log_delta=st.floats(-14.0, -1.0), m=st.integers(1, 400),
       stop=st.booleans())
def test_band_build_matches_the_plain_algorithm_on_random_parameters(
        sampling, log_t, epsilon, log_delta, m, stop):
    t = None if sampling == "none" else 10.0 ** log_t
    q = pws.sampling_probabilities(m, sampling=sampling, sampling_threshold=t)
    assert_same_band(q, epsilon, 10.0 ** log_delta, stop_when_stationary=stop)


def test_calibrated_parameters_and_estimates_unchanged_by_the_build():
    """End to end: calibrate + release_tables on the new build equal what the reference
    rows give (the estimators read the band; the verification reads the band)."""
    p = pws.calibrate(1.0, 1e-8, 3, sampling="priority", sampling_threshold=0.01)
    tables = pws.release_tables(p)
    q = pws.sampling_probabilities(p.max_frequency, sampling="priority", sampling_threshold=0.01)
    keep, lo, lengths, values, _ = reference_band(q, p.key_epsilon, p.table_delta)
    indptr = np.concatenate([[0], np.cumsum(lengths)])
    ref = pws_core._Band(keep=keep, lo=lo, indptr=indptr, values=values, stationary=False)
    assert pws_core._realized_delta_band(p.key_epsilon, ref, None, p.beyond_table) \
        == p.key_delta_realized
    if p.beyond_table == "shift":
        width = int(lengths[-1])
        estimates = pws_core._band_estimates(p.estimator, ref, extra=4 * width,
                                        columns=p.max_frequency + 3 * width + 1)
    else:
        estimates = pws_core._band_estimates(p.estimator, ref)
    assert np.array_equal(estimates, tables.estimates)

"""Private weighted sampling (PWS): optimal end-to-end reporting probabilities.

Cohen, Geri, Sarlos & Stemmer, "Differentially Private Weighted Sampling", AISTATS 2021
(``/work/shared/papers/001_57785b851e794451.txt``; "PWS" below). A key of frequency i is
sampled with a non-decreasing probability q_i (§3.1) and then sanitized; PWS chooses the
*end-to-end* probabilities so that neighbouring frequencies i, i-1 give (epsilon, delta)-
indistinguishable outputs:

- sanitized keys (Alg. 3, Lemma 4.1): pi_0 = 0,
  pi_i = min(q_i, e^eps pi_{i-1} + delta, 1 + e^-eps (pi_{i-1} + delta - 1)),
  the largest possible reporting probability of a key of frequency i;
- sanitized frequencies (Alg. 4, proof of Thm 5.1 in Appendix B): a row pi_{i,.} per
  frequency, token j = 1..i reported with probability pi_{i,j}, sum_j pi_{i,j} = pi_i;
- estimators of a linear statistic g(w) from the tokens: MLE (eq. 11) and the
  biased-down estimator (Appendix E, eq. 41);
- the stability-based histogram baseline (SbH, Appendix G: Laplace noise, threshold
  T = 1 + ln(1/delta)/eps, then sampling).

thresher additions, each documented in docs/weighted_sampling.md and docs/accounting.md:

- the per-key budget of a user touching <= C keys (:func:`per_key_budget`): basic
  composition (eps/C, delta/C) or the exact optimal composition of C (eps0, delta0)-DP
  mechanisms (Kairouz, Oh & Viswanath 2015, Thm 3.3), evaluated as the hockey-stick
  divergence of the C-fold product of the dominating pair (:func:`composed_delta`);
- counts above the table size M are treated as M (a 1-Lipschitz map of the count, so the
  release stays DP); M defaults to the *saturation* frequency where pi reaches 1, so keys
  lose nothing. With frequencies, once the rows have become shift-stationary the token of a
  count c > M is the token of row M plus c - M (``beyond_table="shift"``);
- the privacy of the distribution actually sampled (exact Bernoulli coins for keys; for
  tokens an exact uniform real compared with the float cumulative sums, so token j has
  probability exactly c_j - c_{j-1}: ``transforms.randomness.samplers.cdf_index``) is
  verified by :func:`realized_delta`.

Pure numpy/scipy; no Beam, no I/O.
"""
import dataclasses
import functools
import math

import numpy as np

from thresher.accounting import search
from thresher.accounting._lazy import sparse, stats
from thresher.accounting.pws import estimators as pws_estimators

SAMPLING_SCHEMES = ("none", "ppswor", "priority")
REPORTS = ("keys", "keys_and_frequencies")
ESTIMATORS = ("mle", "biased_down")
COMPOSITIONS = ("pld", "optimal", "basic")

# Largest tables calibrate builds (issue 18: bounded plan cost): keep probabilities (one
# float per frequency; keys only), banded frequency tables (stored entries, and rows: the
# Alg. 4 recursion costs ~10 us of Python per row however narrow). The automatic choice of
# max_frequency clips at them; an explicit max_frequency beyond them is refused. Measured
# costs at these caps are in docs/weighted_sampling.md ("Planning limits").
MAX_KEEP_LENGTH = 1 << 21
MAX_TABLE_ENTRIES = 1 << 23
MAX_BAND_ROWS = 50_000

# Bound on the float64 rounding of a keys-only divergence (realized_delta): the product
# q * fl(pi / q) (2^-53), e^eps as a float (2^-53 e^eps), each product and difference
# (2^-53 each, on terms at most 1 + e^eps), two outcomes: below 2^-50 (1 + e^eps).
_KEYS_ONLY_SLACK = 2.0 ** -50


# Bound on the float64 rounding of a table's divergence (realized_delta), u = 2^-53.
# Per outcome: fl(c_j - c_{j-1}) (times q_w) is within 3u relative of the exact law
# drawn, fl(e^eps) within 2u, so each term max(0, P - e^eps Q) is off by at most
# 4u P + 7u e^eps Q; the "no key" outcome (1 - q c, 2u absolute) by 3u + 6u e^eps.
# Summed over outcomes: below 16u (1 + e^eps). The sums themselves (np.sum is pairwise:
# log2 of the terms, <= 64, plus two additions; a row's dropped prefix summed in
# sequence: its length <= width) add at most (80 + width) u relative to the result.
def _table_slack(e_eps, worst, width):
    """What float rounding can take from a table's computed divergence ``worst`` (a row
    of at most ``width`` stored entries): add it and the result is never below the exact
    divergence of the law drawn."""
    u = 2.0 ** -53
    return 16 * u * (1.0 + e_eps) + (80 + int(width)) * u * worst


# --------------------------------------------------------------------------- validation

def _check_privacy(epsilon, delta):
    if not (isinstance(epsilon, (int, float)) and math.isfinite(epsilon) and epsilon > 0):
        raise ValueError(f"epsilon must be a finite number > 0, got {epsilon!r}")
    if not (isinstance(delta, (int, float)) and 0 < delta < 1):
        raise ValueError(f"delta must be in (0, 1), got {delta!r}")


def _check_sampling(sampling, sampling_threshold):
    if sampling not in SAMPLING_SCHEMES:
        raise ValueError(f"sampling must be one of {', '.join(SAMPLING_SCHEMES)}, got {sampling!r}")
    if sampling == "none":
        if sampling_threshold is not None:
            raise ValueError("sampling_threshold must be omitted when sampling is 'none', "
                             f"got {sampling_threshold!r}")
    elif not (isinstance(sampling_threshold, (int, float)) and math.isfinite(sampling_threshold)
              and sampling_threshold > 0):
        raise ValueError(f"sampling_threshold must be a finite number > 0 for {sampling} sampling, "
                         f"got {sampling_threshold!r}")


def _check_max_frequency(max_frequency):
    if isinstance(max_frequency, bool) or not isinstance(max_frequency, (int, np.integer)) \
            or max_frequency < 1:
        raise ValueError(f"max_frequency must be an integer >= 1, got {max_frequency!r}")


# --------------------------------------------------------------------------- sampling q_i

def sampling_probabilities_at(frequencies, *, sampling="none", sampling_threshold=None, weight=None):
    """q at the given frequencies (PWS §3.1, eq. 2): the probability that the non-private
    threshold sampling scheme includes a key of that frequency.

    ``none``: q = 1 (no sampling: a private histogram); ``ppswor``: q = 1 - exp(-f(w) t);
    ``priority`` (Poisson PPS): q = min(1, f(w) t); with f = ``weight`` (default f(w) = w,
    a vectorised non-decreasing callable) and t = ``sampling_threshold``. q = 0 at w = 0.
    """
    _check_sampling(sampling, sampling_threshold)
    w = np.asarray(frequencies)
    if sampling == "none":
        q = np.ones(w.shape, dtype=np.float64)
    else:
        f = np.asarray(weight(w) if weight is not None else w, dtype=np.float64)
        if np.any(~np.isfinite(f)) or np.any(f < 0):
            raise ValueError("weight(frequency) must be finite and >= 0")
        if sampling == "ppswor":
            q = -np.expm1(-f * float(sampling_threshold))
        else:
            q = np.minimum(1.0, f * float(sampling_threshold))
    return np.where(w <= 0, 0.0, q)


def sampling_probabilities(max_frequency, *, sampling="none", sampling_threshold=None, weight=None):
    """q_0 .. q_max (q_0 = 0) of the sampling scheme; see :func:`sampling_probabilities_at`.
    Raises ValueError if the resulting q is not non-decreasing (PWS requires it, §3.1)."""
    _check_max_frequency(max_frequency)
    q = sampling_probabilities_at(np.arange(int(max_frequency) + 1), sampling=sampling,
                                  sampling_threshold=sampling_threshold, weight=weight)
    if np.any(np.diff(q) < 0):
        raise ValueError("weight must be non-decreasing: the sampling probabilities q_i must not "
                         "decrease with the frequency i (PWS §3.1)")
    return q


# --------------------------------------------------------------------------- Alg. 3

def _alg3(q, epsilon, delta):
    """PWS Alg. 3 on a given q_0..q_M (q_0 = 0): pi_i = min(q_i, (16), (17)).

    Positions where pi_i = q_i and the next q stays within both DP constraints are filled
    in vectorised chunks; the floating-point expressions are the same as in the scalar
    step, so the result is identical to the plain recursion."""
    n = len(q)
    pi = np.zeros(n)
    up_factor, down_factor = math.exp(epsilon), math.exp(-epsilon)
    i, chunk = 1, 256
    while i < n:
        p = pi[i - 1]
        value = min(q[i], up_factor * p + delta, 1.0 + down_factor * (p + delta - 1.0))
        pi[i] = value
        i += 1
        if value == q[i - 1] and i < n:
            end = min(n, i + chunk)
            qa, qb = q[i - 1:end - 1], q[i:end]
            ok = (qb <= up_factor * qa + delta) & (qb <= 1.0 + down_factor * (qa + delta - 1.0))
            k = int(np.argmin(ok)) if not ok.all() else len(ok)
            pi[i:i + k] = qb[:k]
            i += k
            chunk = min(chunk * 2, 1 << 20) if k == len(ok) else 256
    return pi


def keep_probabilities(epsilon, delta, max_frequency, *, sampling="none", sampling_threshold=None,
                       weight=None):
    """End-to-end reporting probabilities pi_0 .. pi_max of sanitized keys (PWS Alg. 3).

    pi_i is the probability that a key of frequency i is sampled *and* reported; it is the
    largest value allowed by element-level (epsilon, delta)-DP between frequencies i and
    i - 1 (Lemma 4.1), and pi_i <= q_i. A sampled key of frequency i is kept with
    probability pi_i / q_i. With ``sampling="none"`` this is the optimal ("truncated
    geometric") partition selection, closed form in Lemma 4.2.

    Returns a float array of length max_frequency + 1 with pi_0 = 0.
    """
    _check_privacy(epsilon, delta)
    q = sampling_probabilities(max_frequency, sampling=sampling,
                               sampling_threshold=sampling_threshold, weight=weight)
    return _alg3(q, float(epsilon), float(delta))


def saturation_frequency(epsilon, delta, *, sampling="none", sampling_threshold=None, weight=None,
                         limit=MAX_KEEP_LENGTH):
    """Smallest frequency i with pi_i = 1 (in floating point), or None if it exceeds ``limit``.

    From there on every key is reported: pi stays 1 because q stays 1 and both DP
    constraints of Alg. 3 allow 1. For ``none`` it is 2L + 1 (Lemma 4.2); for ppswor it is
    where q_i rounds to 1.0 (f(i) t > ~37) or later."""
    _check_privacy(epsilon, delta)
    m = 1024
    while True:
        m = min(m, limit)
        pi = keep_probabilities(epsilon, delta, m, sampling=sampling,
                                sampling_threshold=sampling_threshold, weight=weight)
        hit = np.flatnonzero(pi == 1.0)
        if len(hit):
            return int(hit[0])
        if m >= limit:
            return None
        m *= 4


def pws_L(epsilon, delta):
    """L(eps, delta) of PWS eq. (4): with no sampling pi* grows geometrically up to L + 1
    and reaches 1 at 2L + 1 (Lemma 4.2 and its symmetry 1 - pi*_{2L+1-i} = pi*_i; the
    printed eq. (5) says 2L + 2, an off-by-one). ~ (1/eps) ln(eps / (2 delta))."""
    return math.log((math.expm1(epsilon) + 2 * delta) / (delta * (math.exp(epsilon) + 1))) / epsilon


# --------------------------------------------------------------------------- Alg. 4

@dataclasses.dataclass(frozen=True)
class _Band:
    """Rows pi_{i,lo_i..i} of the frequency table, concatenated (token columns only)."""

    keep: np.ndarray     # pi_0 .. pi_M
    lo: np.ndarray       # first stored token column of each row (row 0 has none)
    indptr: np.ndarray   # row i is values[indptr[i]:indptr[i+1]]
    values: np.ndarray
    stationary: bool     # last row is the previous one shifted by one (rel. 1e-12), pi = 1

    @property
    def max_frequency(self):
        return len(self.keep) - 1

    @property
    def shape(self):
        """That of the table T (rows and columns 0 .. M)."""
        return (len(self.keep), len(self.keep))

    def row(self, i):
        return self.values[self.indptr[i]:self.indptr[i + 1]]


def _next_row(prev, lo, pi_prev, pi_i, up_factor, down_factor, delta):
    """Row i of Alg. 4 from row i-1 (``prev`` = pi_{i-1, lo..i-1}); Appendix B.

    Upward pass: the least prefix masses that satisfy the lower DP constraint (30) for the
    prefixes {0..j} and {1..j}; their running maximum is the cumulative lower bound since
    the bound is non-decreasing in j. Downward pass: from j = i down, raise each entry to
    the upper constraint (28) on the suffix {j..i} (e^eps pi_{i-1,j}; delta at j = i) until
    the remaining mass R = pi_i - sum(D) is spent. Returns (new_lo, row pi_{i, new_lo..i}).

    The build calls this once per row (up to MAX_BAND_ROWS times), so it makes as few numpy
    calls as it can: ufunc methods with ``out=`` on two fresh buffers. The floating-point
    operations and their order are those of the plain statement of the two passes (a
    sequential prefix sum, then e^-eps (sum - delta) + slack clipped at 0, differences; the
    suffix sums from j = i down), so the rows are bit-for-bit the same
    (tests/accounting/pws/test_pws_band_build.py keeps that plain version as the reference)."""
    n = len(prev)
    row = np.empty(n + 1)                       # starts as the lower bounds D_{i,.}
    upper = np.empty(n + 1)
    if n:
        cum_lower = _accumulate(prev)
        cum_lower -= delta
        cum_lower *= down_factor
        slack = down_factor * (1.0 - pi_prev) - (1.0 - pi_i)
        if slack > 0.0:                         # adding max(0, slack) = 0.0 changes nothing
            cum_lower += slack
        np.maximum(cum_lower, 0.0, out=cum_lower)
        row[0] = cum_lower[0]
        np.subtract(cum_lower[1:], cum_lower[:-1], out=row[1:n])
        remaining = pi_i - cum_lower[-1]
        np.multiply(prev, up_factor, out=upper[:n])
    else:
        remaining = pi_i
    row[n] = 0.0
    upper[n] = delta
    raise_by = upper - row
    np.maximum(raise_by, 0.0, out=raise_by)
    suffix = _accumulate(raise_by[::-1])        # suffix sums, from j = i downwards
    n_top = int(suffix.searchsorted(remaining, "right"))
    k0 = n + 1 - n_top                          # entries k0..n are raised to their upper bound
    if n_top:
        row[k0:] = upper[k0:]
    if k0 > 0:
        row[k0 - 1] += remaining - (suffix[n_top - 1] if n_top else 0.0)
    first = int((row != 0.0).argmax())
    return lo + first, row[first:]


_accumulate = np.add.accumulate     # sequential prefix sums (what np.cumsum computes)


def _rows_stationary(prev, lo_prev, row, lo, pi_prev, pi_i):
    """Row i is row i-1 shifted by one column (relative 1e-12) and pi_{i-1} = pi_i = 1."""
    return (pi_i == 1.0 and pi_prev == 1.0 and len(row) == len(prev) and lo == lo_prev + 1
            and bool(np.all(np.abs(row - prev) <= 1e-12 * np.abs(prev))))


def _is_stationary(band):
    m = band.max_frequency
    if m < 2:
        return False
    return _rows_stationary(band.row(m - 1), band.lo[m - 1], band.row(m), band.lo[m],
                            band.keep[m - 1], band.keep[m])


def _build_band(q, epsilon, delta, *, stop_when_stationary=False, max_entries=None):
    """Alg. 4 rows for the given q_0..q_M. With ``stop_when_stationary`` the build stops
    at the first row i with pi_{i-1} = pi_i = 1 whose row equals row i-1 shifted by one
    to a relative 1e-12. With ``max_entries`` it stops before the stored entries would
    exceed it (the band then ends at the last row that fits); the rows are then written
    into one buffer of that size as they are built (its untouched tail is never paged
    in), so the build holds one copy of the band, not the rows and their concatenation."""
    pi = _alg3(q, epsilon, delta)
    up_factor, down_factor = math.exp(epsilon), math.exp(-epsilon)
    m = len(q) - 1
    los = np.zeros(m + 1, dtype=np.int64)
    lengths = [0]
    buffer = None if max_entries is None else np.empty(int(max_entries))
    rows = []
    lo, prev, total, stationary = 1, np.zeros(0), 0, False
    keep = pi.tolist()      # Python floats: cheaper scalar arithmetic in _next_row, same values
    for i in range(1, m + 1):
        lo, row = _next_row(prev, lo, keep[i - 1], keep[i], up_factor, down_factor, delta)
        if max_entries is not None and total + len(row) > max_entries:
            m = i - 1
            break
        los[i] = lo
        if buffer is None:
            rows.append(row)
        else:
            buffer[total:total + len(row)] = row
        lengths.append(len(row))
        total += len(row)
        if stop_when_stationary and _rows_stationary(prev, los[i - 1], row, lo, keep[i - 1], keep[i]):
            m = i
            stationary = True
            break
        prev = row
    indptr = np.zeros(m + 2, dtype=np.int64)
    indptr[1:] = np.cumsum(lengths)
    if buffer is None:
        values = np.concatenate(rows) if rows else np.zeros(0)
    else:
        values = buffer[:total]
        if total < len(buffer) // 4:      # release the buffer when the band is small
            values = values.copy()
    return _Band(keep=pi[:m + 1], lo=los[:m + 1], indptr=indptr, values=values,
                 stationary=stationary)


def _band_to_csr(band):
    """CSR (M+1) x (M+1): column 0 holds 1 - pi_i, then the row's token band."""
    m = band.max_frequency
    lengths = np.diff(band.indptr)
    indptr = np.zeros(m + 2, dtype=np.int64)
    indptr[1:] = np.cumsum(lengths + 1)
    nnz = int(indptr[-1])
    is_token = np.ones(nnz, dtype=bool)
    is_token[indptr[:-1]] = False
    data = np.empty(nnz)
    data[indptr[:-1]] = 1.0 - band.keep
    data[is_token] = band.values
    indices = np.zeros(nnz, dtype=np.int64)
    indices[is_token] = (np.arange(len(band.values), dtype=np.int64)
                         - np.repeat(band.indptr[:-1] - band.lo, lengths))
    return sparse.csr_array((data, indices, indptr), shape=(m + 1, m + 1))


def frequency_table(epsilon, delta, max_frequency, *, sampling="none", sampling_threshold=None,
                    weight=None):
    """Sanitized frequencies of PWS Alg. 4 as a sparse (M+1) x (M+1) array T.

    T[i, j] = pi_{i,j}: the end-to-end probability that a key of frequency i is sampled and
    reported with token j (1 <= j <= i); T[i, 0] = 1 - pi_i (not reported); row 0 is
    (1, 0, ...). Every row is (epsilon, delta)-indistinguishable from the previous one on
    every set of outcomes, rows sum to 1, and the token distribution of frequency i
    stochastically dominates that of i - 1 (§5). Rows are banded (at most ~2L + 1 non-zero
    tokens below the diagonal), so the table is a ``scipy.sparse.csr_array``; ``.toarray()``
    gives the dense matrix.
    """
    _check_privacy(epsilon, delta)
    q = sampling_probabilities(max_frequency, sampling=sampling,
                               sampling_threshold=sampling_threshold, weight=weight)
    return _band_to_csr(_build_band(q, float(epsilon), float(delta)))


def _token_part(table):
    """CSR of the token columns 1..M (rows 0..M) of a frequency table (sparse or dense)."""
    t = sparse.csr_array(table)
    return t[:, 1:].tocsr()


def _statistic_values(statistic, n):
    i = np.arange(n)
    g = np.asarray(statistic(i) if statistic is not None else i, dtype=np.float64)
    g[0] = 0.0
    return g


def _table_keep(tokens):
    return np.asarray(tokens.sum(axis=1)).ravel()


def mle_estimates(frequency_table, keep_probabilities=None, *, statistic=None):
    """Maximum-likelihood estimator of g(w) from a token (PWS §7.1, eq. 11).

    a_j = g(i*) / pi_{i*} with i* = argmax_i pi_{i,j} (the smallest such i on ties);
    a_0 = 0 (key not reported). ``statistic`` is g (vectorised, default g(w) = w).
    ``keep_probabilities`` defaults to the row sums of the table.
    Returns a_0 .. a_M. Banded tables (every table this module builds) are read along
    their diagonals (``accounting.pws.estimators``); others column by column.
    """
    table = sparse.csr_array(frequency_table)
    g = _statistic_values(statistic, table.shape[0])
    band = pws_estimators.from_csr(table)
    # the token columns' copy is made only where it is read (no keep given, or no band)
    tokens = None if band is not None and keep_probabilities is not None else _token_part(table)
    keep = _table_keep(tokens) if keep_probabilities is None else np.asarray(keep_probabilities)
    if band is not None:
        return pws_estimators.mle(band, keep, g)
    return _mle_by_columns(tokens, keep, g)


def _mle_by_columns(tokens, keep, g):
    """eq. (11) from a compressed-column copy of the token columns (any sparsity)."""
    n = tokens.shape[0]
    csc = tokens.tocsc()
    csc.sort_indices()
    a = np.zeros(n)
    counts = np.diff(csc.indptr)
    cols = np.flatnonzero(counts)
    if len(cols) == 0:
        return a
    starts = csc.indptr[cols]
    col_max = np.maximum.reduceat(csc.data, starts)
    is_max = csc.data == np.repeat(col_max, counts[cols])
    # Row indices as int64 whatever the table's index dtype (scipy uses int32 for small
    # tables, e.g. a dense table converted here): the sentinel must not wrap.
    rows = csc.indices.astype(np.int64)
    best_row = np.minimum.reduceat(np.where(is_max, rows, np.iinfo(np.int64).max), starts)
    a[cols + 1] = g[best_row] / keep[best_row]
    return a


def biased_down_estimates(frequency_table, keep_probabilities=None, *, statistic=None):
    """The biased-down estimator of PWS Appendix E (eq. 41), for tokens j = 1 .. M.

    a_j = min over i with pi_{i,j} > 0 of
          (g(i) - sum_{h<j} a_h pi_{i,h}) / (pi_i - sum_{h<j} pi_{i,h}),
    non-decreasing in j and never biased up (Lemma E.1). The denominator is the suffix sum
    sum_{h>=j} pi_{i,h}, computed directly to avoid cancellation. Returns a_0 .. a_M (a_0 = 0).
    Banded tables are read along their diagonals (``accounting.pws.estimators``).
    """
    del keep_probabilities  # the suffix sums of the rows carry pi_i
    table = sparse.csr_array(frequency_table)
    g = _statistic_values(statistic, table.shape[0])
    band = pws_estimators.from_csr(table)
    if band is not None:
        return pws_estimators.biased_down(band, g)
    return _biased_down_by_columns(_token_part(table), g)


def _biased_down_by_columns(tokens, g):
    """eq. (41) from compressed-column copies of the token columns (any sparsity)."""
    tokens.sort_indices()
    n = tokens.shape[0]
    lengths = np.diff(tokens.indptr)
    # per stored entry (i, j): the suffix sum of row i from column j, row by row
    suffix_data = np.empty_like(tokens.data)
    for i in np.flatnonzero(lengths):
        s, e = tokens.indptr[i], tokens.indptr[i + 1]
        suffix_data[s:e] = np.cumsum(tokens.data[s:e][::-1])[::-1]
    csc_prob = tokens.tocsc()
    csc_prob.sort_indices()
    csc_suffix = sparse.csr_array((suffix_data, tokens.indices, tokens.indptr),
                                        shape=tokens.shape).tocsc()
    csc_suffix.sort_indices()
    numer = g.copy()  # g(i) - sum_{h<j} a_h pi_{i,h}, per row i
    a = np.zeros(n)
    for col in range(tokens.shape[1]):
        s, e = csc_prob.indptr[col], csc_prob.indptr[col + 1]
        if s == e:
            continue
        rows = csc_prob.indices[s:e]
        probs = csc_prob.data[s:e]
        positive = probs > 0
        if not positive.any():
            continue
        ratios = numer[rows[positive]] / csc_suffix.data[s:e][positive]
        a_j = float(np.min(ratios))
        a[col + 1] = a_j
        numer[rows] -= a_j * probs
    return a


def estimator_moments(frequency_table, estimates, *, statistic=None):
    """Per-frequency expectation, bias, variance and MSE of a token estimator (PWS §7.1).

    E_i = sum_j pi_{i,j} a_j; Bias_i = E_i - g(i);
    MSE_i = (1 - pi_i) g(i)^2 + sum_j pi_{i,j} (a_j - g(i))^2; Var_i = MSE_i - Bias_i^2.
    ``estimates`` is a_0 .. a_M. Returns a dict of arrays indexed by frequency 0 .. M.
    """
    tokens = _token_part(frequency_table)
    n = tokens.shape[0]
    a = np.asarray(estimates, dtype=np.float64)[1:n]
    g = _statistic_values(statistic, n)
    keep = _table_keep(tokens)
    first = tokens @ a
    second = tokens @ (a * a)
    mse = (1.0 - keep) * g * g + second - 2.0 * g * first + g * g * keep
    bias = first - g
    return {"expected": first, "bias": bias, "mse": mse, "variance": mse - bias * bias,
            "keep": keep}


# --------------------------------------------------------------------------- SbH baseline

def sbh_threshold(epsilon, delta):
    """Threshold T = 1 + ln(1/delta)/eps of the stability-based histogram (PWS §8.1,
    Appendix G): Laplace(1/eps) noise, report if the noisy count is >= T."""
    _check_privacy(epsilon, delta)
    return 1.0 + math.log(1.0 / delta) / epsilon


def sbh_keep_probabilities(epsilon, delta, frequencies, *, sampling="none", sampling_threshold=None):
    """Reporting probability phi_i of sampled-SbH (PWS Appendix G), f(w) = w.

    SbH adds Laplace(1/eps) noise to each count, keeps noisy counts j >= T and then samples
    with q_j at the *noisy* count: phi_i = int_T^inf q_j (eps/2) e^{-eps |j - i|} dj.
    Closed forms: no sampling (G.2, eq. 49), ppswor (G.3, eq. 51), priority (G.3, three
    cases). ``frequencies`` is an array of i >= 0; phi_0 is that of a key of count 0.
    """
    _check_sampling(sampling, sampling_threshold)
    e = float(epsilon)
    T = sbh_threshold(epsilon, delta)
    i = np.asarray(frequencies, dtype=np.float64)
    below = i <= T
    if sampling == "none":
        return np.where(below, 0.5 * np.exp(-e * (T - np.minimum(i, T))),
                        1.0 - 0.5 * np.exp(-e * (np.maximum(i, T) - T)))
    t = float(sampling_threshold)
    if sampling == "ppswor":
        lo = 0.5 * np.exp(-e * (T - np.minimum(i, T))) * (1.0 - e / (e + t) * math.exp(-T * t))
        ih = np.maximum(i, T)
        hi = 1.0 - 0.5 * np.exp(-e * (ih - T)) - e / (2 * (e + t)) * np.exp(-ih * t)
        if abs(e - t) > 1e-12 * e:
            hi = hi + e / (2 * (e - t)) * (np.exp(-e * (ih - T) - t * T) - np.exp(-t * ih))
        else:
            hi = hi - 0.5 * e * (ih - T) * np.exp(-e * ih)
        return np.where(below, lo, hi)
    # priority: q_j = min(1, t j)
    u = 1.0 / t
    if T >= u:
        return sbh_keep_probabilities(epsilon, delta, frequencies)
    c1 = 0.5 * t * ((T + 1 / e) * np.exp((i - T) * e) - (1 / e) * np.exp((i - u) * e))
    c2 = t * (i - 0.5 / e * np.exp(e * (i - u)) - 0.5 * (T - 1 / e) * np.exp(e * (T - i)))
    c3 = 1.0 - 0.5 * t / e * np.exp(e * (u - i)) - 0.5 * t * (T - 1 / e) * np.exp(e * (T - i))
    with np.errstate(over="ignore"):
        return np.where(i < T, c1, np.where(i < u, c2, c3))


# --------------------------------------------------------------------------- composition

def composed_delta(key_epsilon, key_delta, max_keys_per_user, epsilon):
    """Exact delta(epsilon) of the C-fold composition of (eps0, delta0)-DP mechanisms.

    Every (eps0, delta0)-DP mechanism is dominated by the pair P = (delta0,
    (1-delta0) e^eps0/(1+e^eps0), (1-delta0)/(1+e^eps0), 0), Q = P reversed (Kairouz, Oh &
    Viswanath 2015, Thm 3.3); the hockey-stick divergence of the C-fold product is
    1 - (1-delta0)^C + (1-delta0)^C sum_l Binom(C, l; p) max(0, 1 - e^{eps - (C-2l) eps0}),
    p = 1/(1+e^eps0). A user with <= C keys changes <= C independent per-key mechanisms.
    """
    c = int(max_keys_per_user)
    l = np.arange(c + 1)
    p_flip = 1.0 / (1.0 + math.exp(key_epsilon))
    # binom._pmf: the distribution's own pmf (what binom.pmf returns for these valid
    # arguments, l = 0..C, 0 < p <= 1/2) without its per-call argument handling, which
    # costs 4x the pmf itself; the searches of per_key_budget make ~35 calls per grid
    # point (tests/accounting/pws/test_pws_keep_table.py checks the two are equal)
    weights = stats.binom._pmf(l, c, p_flip)
    loss = (c - 2 * l) * key_epsilon
    with np.errstate(over="ignore"):   # expm1 -> inf where the term is clipped to 0 anyway
        rr = float(np.sum(weights * np.maximum(0.0, -np.expm1(epsilon - loss))))
    log_none_lost = c * math.log1p(-key_delta)   # (1 - delta0)^C without cancellation
    return -math.expm1(log_none_lost) + math.exp(log_none_lost) * rr


@dataclasses.dataclass(frozen=True)
class PerKeyBudget:
    """(epsilon, delta) each key's sanitizer runs at, and how it composes to the release's."""

    key_epsilon: float
    key_delta: float
    composition: str
    max_keys_per_user: int


def per_key_budget(epsilon, delta, max_keys_per_user, *, composition="optimal"):
    """Per-key (eps0, delta0) for a release at (epsilon, delta) where a user touches <= C keys.

    ``basic``: (eps/C, delta/C) (Dwork & Roth Thm 3.16). ``optimal``: for
    delta0 = f (1 - (1 - delta)^(1/C)) over a grid of f in (0, 1], the largest eps0 whose
    exact C-fold composition (:func:`composed_delta`) is <= delta at epsilon; the pair with
    the smallest PWS saturation length L(eps0, delta0) (eq. 4) wins. f = 1 allows at least
    eps/C (the composition of C (eps/C, delta0) mechanisms is (eps, 1 - (1-delta0)^C)-DP,
    KOV15 Thm 3.3 at i = 0; Google's partition selection uses this split), so ``optimal``
    is never worse than ``basic``. C = 1 gives (epsilon, delta).
    """
    _check_privacy(epsilon, delta)
    if isinstance(max_keys_per_user, bool) or not isinstance(max_keys_per_user, (int, np.integer)) \
            or max_keys_per_user < 1:
        raise ValueError(f"max_keys_per_user must be an integer >= 1, got {max_keys_per_user!r}")
    if composition not in COMPOSITIONS:
        raise ValueError(f"composition must be one of {', '.join(COMPOSITIONS)}, got {composition!r}")
    c = int(max_keys_per_user)
    if c == 1:
        return PerKeyBudget(float(epsilon), float(delta), "single key", 1)
    if composition == "pld":   # the (eps0, delta0) tables pld falls back to (accounting.pws.pld)
        composition = "optimal"
    basic = PerKeyBudget(epsilon / c, delta / c, "basic", c)
    if composition == "basic":
        return basic
    best, best_len = basic, pws_L(basic.key_epsilon, basic.key_delta)
    delta_max = -math.expm1(math.log1p(-delta) / c) * (1 - 1e-12)
    for f in (1.0, 0.7, 0.5, 0.3, 0.2, 0.1, 0.05, 0.02, 0.01):
        d0 = f * delta_max
        if composed_delta(0.0, d0, c, epsilon) > delta:
            continue
        # largest eps0 with composed delta <= delta: search the monotone 1/eps0
        inv = search.smallest_real(
            lambda x: composed_delta(1.0 / x, d0, c, epsilon) <= delta,
            1.0 / epsilon, c / epsilon, rel_tol=1e-10)
        if inv is None:
            continue
        e0 = 1.0 / inv
        length = pws_L(e0, d0)
        if length < best_len:
            best, best_len = PerKeyBudget(e0, d0, "optimal", c), length
    return best


# --------------------------------------------------------------------------- realized privacy

def _drawn(p):
    """P[U < p] for the exact uniform real U the sanitizer compares (samplers.cdf_index):
    p itself, clipped to [0, 1]."""
    return np.clip(p, 0.0, 1.0)


def is_band(table):
    """True for the banded rows ``ReleaseTables.band`` (what the sanitizer reads)."""
    return isinstance(table, _Band)


def row_cdf(frequency_table, i):
    """(token columns, cumulative probabilities) of row i, exactly as the sanitizer uses
    them; the table is a CSR with sorted indices or a band (:func:`is_band`), which give
    the same numbers (the same row entries summed in the same order)."""
    if isinstance(frequency_table, _Band):
        values = frequency_table.row(i)
        return frequency_table.lo[i] + np.arange(len(values), dtype=np.int64), np.cumsum(values)
    t = frequency_table
    s, e = t.indptr[i], t.indptr[i + 1]
    cols, vals = t.indices[s:e], t.data[s:e]
    tok = cols > 0
    return cols[tok], np.cumsum(vals[tok])


def _realized_row(frequency_table, i, q_i=None):
    cols, cum = row_cdf(frequency_table, i)
    if q_i is None:
        grid = _drawn(cum)
        scale = 1.0
    else:
        grid = _drawn(cum / q_i)
        scale = q_i
    probs = scale * np.diff(grid, prepend=0.0)
    reported = scale * (grid[-1] if len(grid) else 0.0)
    return cols, probs, 1.0 - reported


def _pair_delta(cols_a, probs_a, none_a, cols_b, probs_b, none_b, e_eps):
    """max over both directions of sum_outcomes max(0, P - e^eps Q) for two rows."""
    lo = min(cols_a[0] if len(cols_a) else 1, cols_b[0] if len(cols_b) else 1)
    hi = max(cols_a[-1] if len(cols_a) else 1, cols_b[-1] if len(cols_b) else 1)
    pa = np.zeros(hi - lo + 2)
    pb = np.zeros(hi - lo + 2)
    pa[0], pb[0] = none_a, none_b
    np.add.at(pa, cols_a - lo + 1, probs_a)
    np.add.at(pb, cols_b - lo + 1, probs_b)
    return max(float(np.sum(np.maximum(0.0, pa - e_eps * pb))),
               float(np.sum(np.maximum(0.0, pb - e_eps * pa))))


def realized_delta(epsilon, keep_probabilities, frequency_table=None, *, sampling_probabilities=None,
                   beyond_table="clip"):
    """Exact delta at ``epsilon`` of the per-key distributions the sanitizer actually samples.

    Keys only (no ``frequency_table``): each key is kept by an exact Bernoulli(pi_i) coin
    (Bernoulli(fl(pi_i / q_i)) for a pre-sampled key), so its probability is exactly that
    float; the result adds a bound on float rounding and is never below the exact value.
    With frequencies, the sanitizer compares an exact uniform real U with the float
    cumulative sums c (the token is the first column whose cumulative sum exceeds U;
    ``samplers.cdf_index``), so outcome probabilities are exactly the differences of the
    clipped c (times q_w when pre-sampled); they are computed in float64 and
    :func:`_table_slack` added for the rounding, so the result is never below the exact
    delta of the law drawn. This returns the largest hockey-stick
    divergence, in both directions, between frequencies i and i - 1 for i = 1 .. M (all sets
    of outcomes at once: sum of positive parts), plus, with ``beyond_table="shift"``, the
    pair (row M shifted by one, row M) that every larger count reuses. Frequencies above M
    under ``"clip"`` have identical distributions (divergence 0).

    ``sampling_probabilities`` (q_0..q_M) gives the post-processing path's end-to-end
    distributions q_i x realized(pi_{i,.} / q_i).
    """
    e_eps = math.exp(epsilon)
    keep = np.asarray(keep_probabilities, dtype=np.float64)
    q = None if sampling_probabilities is None else np.asarray(sampling_probabilities, np.float64)
    if frequency_table is None:
        # Keys only: the sanitizer flips exact Bernoulli(p) coins (samplers.bernoulli) for
        # the float p = pi_w (or fl(pi_w / q_w)), so a key is reported with probability
        # exactly p (times q_w). The two-outcome divergences are evaluated in float64 and
        # _KEYS_ONLY_SLACK (1 + e^eps) bounds every rounding involved, so the result is
        # never below the exact delta of the coins drawn.
        if q is None:
            rep = keep.copy()
        else:
            rep = np.zeros_like(keep)
            pos = q > 0
            rep[pos] = q[pos] * (keep[pos] / q[pos])
        a, b = rep[1:], rep[:-1]
        up = np.maximum(0.0, a - e_eps * b) + np.maximum(0.0, (1 - a) - e_eps * (1 - b))
        down = np.maximum(0.0, b - e_eps * a) + np.maximum(0.0, (1 - b) - e_eps * (1 - a))
        worst = float(max(up.max(initial=0.0), down.max(initial=0.0)))
        worst += _KEYS_ONLY_SLACK * (1.0 + e_eps)
        if q is not None and beyond_table == "clip":
            worst = max(worst, _beyond_clip_bound(2))
        return worst
    t = sparse.csr_array(frequency_table)
    t.sort_indices()
    m = t.shape[0] - 1
    layout = _band_layout(t)
    if layout is not None:
        lo, lengths = layout
        worst = _realized_band_delta(t.data, t.indptr[:-1] + 1, lengths, lo, q, e_eps)
        prev = _realized_row(t, m, None if q is None else q[m])
    else:
        worst = 0.0
        prev = (np.zeros(0, dtype=np.int64), np.zeros(0), 1.0)
        for i in range(1, m + 1):
            cur = _realized_row(t, i, None if q is None else q[i])
            worst = max(worst, _pair_delta(*cur, *prev, e_eps))
            prev = cur
    if beyond_table == "shift":
        cols, probs, none = prev
        worst = max(worst, _pair_delta(cols + 1, probs, none, cols, probs, none, e_eps))
    elif q is not None:
        worst = max(worst, _beyond_clip_bound(len(prev[0]) + 1))
    return worst + _table_slack(e_eps, worst, int(np.diff(t.indptr).max(initial=0)))


def _band_layout(t):
    """(lo, lengths) when every row i >= 1 stores column 0 first and then one contiguous
    run of token columns lo_i .. lo_i + length_i - 1 with lo non-decreasing (the tables
    this module builds); None otherwise."""
    starts = t.indptr[:-1]
    lengths = np.diff(t.indptr) - 1
    if np.any(lengths < 0) or np.any(t.indices[starts] != 0):
        return None
    rows = np.repeat(np.arange(len(lengths)), lengths)
    token_pos = np.repeat(starts + 1, lengths) + (
        np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths))
    lo = np.zeros(len(lengths), dtype=np.int64)
    has = lengths > 0
    lo[has] = t.indices[starts[has] + 1]
    if not np.array_equal(t.indices[token_pos] - lo[rows],
                          token_pos - np.repeat(starts + 1, lengths)):
        return None
    lo[~has] = np.maximum.accumulate(np.where(has, lo, 0))[~has]
    if np.any(np.diff(lo[1:]) < 0):
        return None
    return lo, lengths


def _realized_band_delta(data, starts, lengths, lo, q, e_eps, chunk_entries=1 << 19):
    """Vectorised :func:`realized_delta` over a banded table (row i's tokens are
    data[starts[i]:starts[i] + lengths[i]], columns lo[i]..), in chunks of rows. Row-wise
    cumulative sums along axis 1 of a zero-padded block are the same sequential sums as the
    sanitizer's per-row np.cumsum (trailing zeros leave them unchanged).

    Planning runs this for every candidate bound of an automatic bound (issue 19), so the
    block arithmetic is done in place and the previous row is read by slicing where rows
    move by at most one column (the band's rows do): the same floating-point operations on
    the same operands, in the same order, as the plain statement -- gathered, cumsum'd,
    quantised, differenced, compared -- so the result is bit for bit the same
    (tests/accounting/pws/test_pws_keep_table.py keeps the plain statement as the reference)."""
    m = len(lengths) - 1
    worst = 0.0
    prev_p = np.zeros((1, 1))
    prev_none = np.array([1.0])
    prev_lo = np.array([lo[1] if m >= 1 else 0])
    # rows stored back to back (a band; not a CSR whose column-0 entries sit between them)
    contiguous = bool(np.array_equal(starts[1:], starts[:-1] + lengths[:-1]))
    r = 1
    while r <= m:
        width = int(max(1, lengths[r - 1], lengths[r]))
        r_end = r
        while r_end <= m and (r_end - r + 1) * max(width, lengths[r_end]) <= chunk_entries:
            width = max(width, int(lengths[r_end]))
            r_end += 1
        r_end = max(r_end, r + 1)
        rows = np.arange(r, r_end)
        n = len(rows)
        k = np.arange(width)
        mask = k[None, :] < lengths[rows][:, None]
        if contiguous:
            cum = np.zeros((n, width))
            cum[mask] = data[starts[r]:starts[r_end - 1] + lengths[r_end - 1]]
        else:
            pos = np.where(mask, starts[rows][:, None] + k[None, :], 0)
            cum = np.where(mask, data[pos], 0.0)
        np.cumsum(cum, axis=1, out=cum)
        if q is None:
            scale = None
        else:
            scale = q[rows]
            cum /= scale[:, None]
        grid = cum                      # clip(cum, 0, 1): the law drawn, in place
        np.clip(grid, 0.0, 1.0, out=grid)
        probs = np.empty((n, width))    # np.diff(grid, axis=1, prepend=0.0) (* scale)
        probs[:, 0] = grid[:, 0] - 0.0
        np.subtract(grid[:, 1:], grid[:, :-1], out=probs[:, 1:])
        if scale is None:               # a scale of 1.0 changes no product
            none = 1.0 - grid[:, -1]
        else:
            probs *= scale[:, None]
            none = 1.0 - scale * grid[:, -1]
        # previous rows, padded to this width (+1 zero column for out-of-range gathers)
        before = np.zeros((n, width + 1))
        w_prev = min(prev_p.shape[1], width)
        before[0, :w_prev] = prev_p[-1, :w_prev]
        before[1:, :width] = probs[:-1]
        before_none = np.concatenate([prev_none[-1:], none[:-1]])
        before_lo = np.concatenate([prev_lo[-1:], lo[rows[:-1]]])
        shift = np.clip(lo[rows] - before_lo, 0, width)
        if r == 1:
            shift[0] = 0
        # gathered[i, j] = before[i, min(j + shift_i, width)]; dropped_sum[i] = the
        # sequential sum of before[i, :shift_i] (np.cumsum's element shift_i - 1)
        dropped_sum = np.zeros(n)
        if shift.max(initial=0) <= 1:
            moved = shift == 1
            gathered = np.where(moved[:, None], before[:, 1:], before[:, :width])
            dropped_sum[moved] = before[moved, 0]
        else:
            gathered = np.take_along_axis(before, np.minimum(k[None, :] + shift[:, None], width),
                                          axis=1)
            dropped = np.cumsum(before[:, :width], axis=1)
            moved = shift > 0
            dropped_sum[moved] = dropped[moved, shift[moved] - 1]
        work = np.empty((n, width))
        np.multiply(e_eps, gathered, out=work)           # max(0, probs - e^eps gathered)
        np.subtract(probs, work, out=work)
        np.maximum(0.0, work, out=work)
        forward = work.sum(axis=1) + np.maximum(0.0, none - e_eps * before_none)
        np.multiply(e_eps, probs, out=work)              # max(0, gathered - e^eps probs)
        np.subtract(gathered, work, out=work)
        np.maximum(0.0, work, out=work)
        backward = (work.sum(axis=1) + dropped_sum
                    + np.maximum(0.0, before_none - e_eps * none))
        worst = max(worst, float(forward.max()), float(backward.max()))
        prev_p, prev_none, prev_lo = probs[-1:], none[-1:], lo[rows[-1:]]
        r = r_end
    return worst


def _realized_delta_band(epsilon, band, q=None, beyond_table="clip"):
    """:func:`realized_delta` of a band (same numbers as on its CSR form, without building it)."""
    e_eps = math.exp(epsilon)
    lengths = np.diff(band.indptr)
    worst = _realized_band_delta(band.values, band.indptr[:-1], lengths, band.lo, q, e_eps)
    m = band.max_frequency
    last = band.row(m)
    cols = band.lo[m] + np.arange(len(last))
    cum = np.cumsum(last)
    grid = _drawn(cum if q is None else cum / q[m])
    scale = 1.0 if q is None else q[m]
    probs = scale * np.diff(grid, prepend=0.0)
    none = 1.0 - scale * (grid[-1] if len(grid) else 0.0)
    if beyond_table == "shift":
        worst = max(worst, _pair_delta(cols + 1, probs, none, cols, probs, none, e_eps))
    elif q is not None:
        worst = max(worst, _beyond_clip_bound(len(last) + 1))
    return worst + _table_slack(e_eps, worst, int(lengths.max(initial=0)) + 1)


def _beyond_clip_bound(outcomes):
    """Pre-sampled counts w > M under "clip" all use row M, divided by their own q_w: each
    outcome's realized probability q_w (fl(c_j / q_w) - fl(c_{j-1} / q_w)) is within
    2^-53 of the exact one, so two such counts differ by < 2^-52 per outcome, and the hockey-stick
    divergence is < outcomes * 2^-52 for any epsilon >= 0."""
    return outcomes * 2.0 ** -52


# --------------------------------------------------------------------------- calibration

def rounding_excess(key_epsilon, key_delta, report="keys_and_frequencies"):
    """Planning estimate of what float rounding adds to :func:`realized_delta` (the
    verification itself is exact; this only predicts whether it can pass). Keys only: the
    slack 2^-50 (1 + e^eps0) it adds. With frequencies: the slack :func:`_table_slack`
    adds for a row of ~2L + 4 tokens (the law drawn is the table's own, so nothing else
    is rounded; before issue 42 each token was rounded to a 2^-53 grid, measured at
    0.07 - 0.16 x (2L + 4) 2^-53 (1 + e^eps0)). Calibration cannot pass when it exceeds
    key_delta."""
    if key_epsilon > 700:
        return math.inf
    if report == "keys":
        return _KEYS_ONLY_SLACK * (1.0 + math.exp(key_epsilon))
    # rows span ~2L + 4 tokens, at most ~sqrt(2 MAX_TABLE_ENTRIES) in a clipped table
    width = min(2 * max(pws_L(key_epsilon, key_delta), 0.0) + 4, math.sqrt(2 * MAX_TABLE_ENTRIES))
    return _table_slack(math.exp(key_epsilon), key_delta, width + 1)


@dataclasses.dataclass(frozen=True)
class PWSParameters:
    """Calibrated parameters of one PWS release (hashable: tables are rebuilt from it).

    ``key_epsilon``/``key_delta`` are what each key's sanitizer is built for;
    ``key_delta_realized`` is :func:`realized_delta` of the sampled distributions (<=
    ``key_delta``); ``table_delta`` is the delta the tables were built with (a hair below
    ``key_delta`` so that sampling granularity stays within it). Counts above
    ``max_frequency`` are handled per ``beyond_table``: "clip" (treated as max_frequency)
    or "shift" (row max_frequency, token + (count - max_frequency))."""

    epsilon: float
    delta: float
    max_keys_per_user: int
    sampling: str
    sampling_threshold: float | None
    report: str
    estimator: str
    composition: str
    key_epsilon: float
    key_delta: float
    table_delta: float
    key_delta_realized: float
    delta_realized: float
    max_frequency: int
    saturation_frequency: int | None
    beyond_table: str
    presampled: bool = False
    # composition "pld" with the Gaussian-tradeoff table (accounting.pws.pld): its mu; the
    # keep table is then accounting.pws.pld.keep_probabilities(q, key_mu, table_delta).
    key_mu: float | None = None
    key_mu_verified: float | None = None   # the mu the table is verified against (>= key_mu)
    # composition "pld": the delta0 of the Gaussian tradeoff max(0, G_mu - delta0) the table
    # is verified against (accounting.pws.pld.verify) and composed with; key_delta_realized
    # is then realized_delta of the coins drawn, at key_epsilon (one key: (eps0, 2 delta0)-DP)
    key_delta0: float | None = None

    def as_dict(self):
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d):
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})


def _saturation(q_fn, epsilon, delta):
    """(pi up to the saturation frequency, saturation) or (pi up to MAX_KEEP_LENGTH, None)."""
    m = 1024
    while True:
        pi = _alg3(q_fn(m), epsilon, delta)
        hit = np.flatnonzero(pi == 1.0)
        if len(hit):
            return pi[:int(hit[0]) + 1], int(hit[0])
        if m >= MAX_KEEP_LENGTH:
            return pi, None
        m = min(4 * m, MAX_KEEP_LENGTH)


class TableTooLarge(ValueError):
    """An explicit max_frequency whose table exceeds the caps (MAX_KEEP_LENGTH,
    MAX_BAND_ROWS, MAX_TABLE_ENTRIES); the message says what fits."""


def _check_table_size(max_frequency, report):
    """An explicit max_frequency within the table caps (before anything is allocated)."""
    cap, what = ((MAX_KEEP_LENGTH, "keep-probability table") if report == "keys"
                 else (MAX_BAND_ROWS, "frequency table"))
    if max_frequency > cap:
        raise TableTooLarge(f"max_frequency {max_frequency} exceeds the largest {what} "
                         f"({cap} counts; report {report})")


def _choose_table(q_fn, key_epsilon, table_delta, report, max_frequency, scheme):
    """(keep, band or None, saturation, max_frequency, beyond) for the given q builder.

    Automatic size: keys only, the saturation frequency (pi = 1 from there on, so nothing
    is lost by treating larger counts as it) if it is <= MAX_KEEP_LENGTH; with frequencies,
    the first row past saturation that is a shift of the previous one (usually within ~1.5
    band widths), or, if that does not fit MAX_TABLE_ENTRIES / MAX_BAND_ROWS, the largest
    table that does ("clip"). An explicit max_frequency beyond the caps raises ValueError."""
    if max_frequency is not None:
        _check_table_size(max_frequency, report)
        if report == "keys":
            pi = _alg3(q_fn(max_frequency), key_epsilon, table_delta)
            hit = np.flatnonzero(pi == 1.0)
            return pi, None, (int(hit[0]) if len(hit) else None), max_frequency, "clip"
        band = _build_band(q_fn(max_frequency), key_epsilon, table_delta,
                           max_entries=MAX_TABLE_ENTRIES)
        if band.max_frequency < max_frequency:
            raise TableTooLarge(f"max_frequency {max_frequency} needs a frequency table of more than "
                             f"{MAX_TABLE_ENTRIES} entries; at most {band.max_frequency} fits "
                             f"(or leave max_frequency to auto, or report keys only)")
        band = dataclasses.replace(band, stationary=_is_stationary(band))
    else:
        pi, sat = _saturation(q_fn, key_epsilon, table_delta)
        if report == "keys":
            return pi, None, sat, len(pi) - 1, "clip"
        if sat is None:
            band = _build_band(q_fn(min(len(pi) - 1, MAX_BAND_ROWS)), key_epsilon, table_delta,
                               max_entries=MAX_TABLE_ENTRIES)
        else:
            extra = 4 * (2 * math.ceil(pws_L(key_epsilon, table_delta)) + 4)
            while True:
                rows = min(sat + extra, MAX_BAND_ROWS)
                band = _build_band(q_fn(rows), key_epsilon, table_delta,
                                   stop_when_stationary=True, max_entries=MAX_TABLE_ENTRIES)
                if band.stationary or band.max_frequency < rows or rows == MAX_BAND_ROWS:
                    break
                extra *= 4
    hit = np.flatnonzero(band.keep == 1.0)
    sat = int(hit[0]) if len(hit) else None
    beyond = "shift" if band.stationary else "clip"
    _BANDS[(*scheme, key_epsilon, table_delta, band.max_frequency)] = band
    while len(_BANDS) > 4:
        _BANDS.pop(next(iter(_BANDS)))
    return band.keep, band, sat, band.max_frequency, beyond


# Bands built by calibrate, reused by release_tables in the same process.
_BANDS = {}


def check_calibrate_arguments(epsilon, delta, sampling, sampling_threshold, report, estimator,
                              max_frequency):
    """The checks :func:`calibrate` (and composition pld's, accounting.pws.release) runs
    first, in this order; ValueError naming the argument."""
    _check_privacy(epsilon, delta)
    _check_sampling(sampling, sampling_threshold)
    if report not in REPORTS:
        raise ValueError(f"report must be one of {', '.join(REPORTS)}, got {report!r}")
    if estimator not in ESTIMATORS:
        raise ValueError(f"estimator must be one of {', '.join(ESTIMATORS)}, got {estimator!r}")
    if max_frequency is not None:
        _check_max_frequency(max_frequency)


def calibrate(epsilon, delta, max_keys_per_user, *, sampling="none", sampling_threshold=None,
              report="keys_and_frequencies", estimator="mle", composition="optimal",
              max_frequency=None, presampled=False):
    """Parameters of a PWS release at (epsilon, delta) with <= C keys per user, for the
    compositions of a per-key (eps0, delta0) budget (``optimal``, ``basic``). Composition
    ``pld`` is accounting.pws.release.calibrate's (its table is accounting.pws.pld's,
    which builds on this module): here it is refused.

    1. Per-key budget (:func:`per_key_budget`). 2. Tables: ``max_frequency=None`` picks the
    saturation frequency (keys: pi = 1 from there on) or, with frequencies, the first row
    that is pi = 1 and shift-stationary, within MAX_KEEP_LENGTH / MAX_TABLE_ENTRIES /
    MAX_BAND_ROWS (else the largest table that fits, counts above it clipped). 3. The tables are built with
    table_delta = key_delta (1 - margin) and :func:`realized_delta` must be <= key_delta;
    the margin doubles until it is (floating-point granularity costs ~1e-16 per token).
    ``presampled`` is the post-processing path (the input is a sample drawn with q).
    Raises ValueError on invalid arguments or if the verification cannot pass.
    """
    check_calibrate_arguments(epsilon, delta, sampling, sampling_threshold, report, estimator,
                              max_frequency)
    if composition == "pld":
        raise ValueError("composition pld is calibrated by accounting.pws.calibrate "
                         "(accounting.pws.release), not accounting.pws.core")
    budget = per_key_budget(epsilon, delta, max_keys_per_user, composition=composition)

    def q_fn(m):
        return sampling_probabilities(m, sampling=sampling, sampling_threshold=sampling_threshold)

    # Start the margin at the sampling granularity: ~2^-53 per token of a band row.
    width = 2 * pws_L(budget.key_epsilon, budget.key_delta) + 4
    margin = min(0.5, max(1e-9, 4 * width * 2.0 ** -53 / budget.key_delta))
    for _ in range(12):
        table_delta = budget.key_delta * (1.0 - margin)
        keep, band, sat, m, beyond = _choose_table(q_fn, budget.key_epsilon, table_delta, report,
                                                   max_frequency, (sampling, sampling_threshold))
        q = q_fn(m) if presampled else None
        if band is None:
            realized = realized_delta(budget.key_epsilon, keep, sampling_probabilities=q,
                                      beyond_table=beyond)
        else:
            realized = _realized_delta_band(budget.key_epsilon, band, q, beyond)
        if realized <= budget.key_delta:
            break
        # the rounding excess (relative): the table's own delta plus it must fit, so a
        # margin of at least it; doubled, but kept below 1 while the excess alone fits
        needed = max(0.0, realized - table_delta) / budget.key_delta
        margin = min(max(2 * margin, 4 * needed), (1.0 + needed) / 2)
        if needed >= 1.0:   # float rounding alone exceeds key_delta: no table can pass
            raise ValueError(
                f"the per-key delta {budget.key_delta:g} at per-key epsilon "
                f"{budget.key_epsilon:g} is below what floating-point sampling can verify "
                f"(realized {realized:g}); use a larger delta or a smaller epsilon")
    else:
        raise ValueError("PWS tables could not be verified within the per-key delta "
                           f"{budget.key_delta:g} (realized {realized:g})")
    total_delta = composed_delta(budget.key_epsilon, realized, budget.max_keys_per_user, epsilon) \
        if budget.composition == "optimal" else realized * budget.max_keys_per_user
    return PWSParameters(
        epsilon=float(epsilon), delta=float(delta), max_keys_per_user=int(max_keys_per_user),
        sampling=sampling,
        sampling_threshold=None if sampling_threshold is None else float(sampling_threshold),
        report=report, estimator=estimator, composition=budget.composition,
        key_epsilon=budget.key_epsilon, key_delta=budget.key_delta, table_delta=table_delta,
        key_delta_realized=realized, delta_realized=min(total_delta, 1.0), max_frequency=int(m),
        saturation_frequency=sat, beyond_table=beyond, presampled=bool(presampled))


# --------------------------------------------------------------------------- release tables

def _shift_extend(band, extra):
    """The band with ``extra`` more rows, each row max_frequency shifted by one more column
    (the ``beyond_table="shift"`` rule for counts above the table)."""
    m = band.max_frequency
    last = band.row(m)
    rows = [band.values, np.tile(last, extra)]
    los = np.concatenate([band.lo, band.lo[m] + np.arange(1, extra + 1)])
    lengths = np.concatenate([np.diff(band.indptr), np.full(extra, len(last))])
    indptr = np.zeros(m + extra + 2, dtype=np.int64)
    indptr[1:] = np.cumsum(lengths)
    keep = np.concatenate([band.keep, np.full(extra, band.keep[m])])
    return _Band(keep=keep, lo=los, indptr=indptr, values=np.concatenate(rows), stationary=True)


def _periodic_tail(a, window):
    """Smallest period P <= window with a[j + P] - a[j] constant (to a relative 1e-3: the
    biased-down staircase converges slowly) over the last 2 window entries; returns
    (P, increment) or None. Estimates are post-processing: this affects accuracy only."""
    tail = a[-2 * window - 1:]
    for period in range(1, window + 1):
        d = tail[period:] - tail[:-period]
        if np.allclose(d, d[-1], rtol=1e-3, atol=0.0):
            return period, float(d[-1])
    return None


@dataclasses.dataclass(frozen=True, eq=False)
class ReleaseTables:
    """Everything a sanitizer needs, rebuilt deterministically from :class:`PWSParameters`.

    ``keep`` = pi_0..pi_M; ``band`` = the Alg. 4 rows (None when only keys are reported),
    which the sanitizer reads (:func:`row_cdf`); ``table`` = the same as a sparse matrix
    (:func:`frequency_table`'s form), built on first use only; ``estimates`` = a_0..a_K of the chosen estimator. With beyond_table "clip", K = M. With
    "shift" the estimators are computed on the table extended by shifted copies of row M
    (the rows larger counts really use), K = M + 3W (W = width of row M), and larger tokens
    are extrapolated by the period found in the tail: a_{j+P} = a_j + increment (P = 1 for
    the MLE; the biased-down estimator is a staircase with P ~ its step width)."""

    params: PWSParameters
    keep: np.ndarray
    band: object
    estimates: object
    period: int = 1
    increment: float = 0.0

    @functools.cached_property
    def table(self):
        return None if self.band is None else _band_to_csr(self.band)

    def sampling_probabilities(self, frequencies):
        """q at each frequency (post-processing path)."""
        return sampling_probabilities_at(frequencies, sampling=self.params.sampling,
                                         sampling_threshold=self.params.sampling_threshold)

    def estimate(self, tokens):
        """Estimates of g(w) = w for released tokens (token 0 = not reported gives 0)."""
        tokens = np.asarray(tokens, dtype=np.int64)
        k = len(self.estimates) - 1
        over = np.maximum(tokens - k, 0)
        steps = -(-over // self.period)  # ceil
        return self.estimates[tokens - steps * self.period] + steps * self.increment


def _band_estimates(estimator, band, extra=0, columns=None):
    """a_0 .. a_{columns-1} of the estimator (g(w) = w) on the band extended by ``extra``
    shifted copies of its last row (:func:`_shift_extend`, without materialising them),
    read along the diagonals (``accounting.pws.estimators``): the same numbers as
    :func:`mle_estimates` / :func:`biased_down_estimates` of the extended table's CSR."""
    rows = pws_estimators.from_rows(band.lo, band.indptr, band.values, extra)
    g = _statistic_values(None, rows.n_rows)
    if estimator == "mle":
        keep = np.concatenate([band.keep, np.full(extra, band.keep[-1])])
        return pws_estimators.mle(rows, keep, g, columns)
    return pws_estimators.biased_down(rows, g, columns)


def _band_key(params):
    return (params.sampling, params.sampling_threshold, params.key_epsilon,
            params.table_delta, params.max_frequency)


def _release_band(params):
    """The Alg. 4 band of calibrated ``params`` (report keys_and_frequencies): the one
    :func:`calibrate` built if it is still in ``_BANDS``, else rebuilt (deterministic: the
    same rows)."""
    band = _BANDS.get(_band_key(params))
    if band is None:
        q = sampling_probabilities(params.max_frequency, sampling=params.sampling,
                                   sampling_threshold=params.sampling_threshold)
        band = _build_band(q, params.key_epsilon, params.table_delta,
                           max_entries=MAX_TABLE_ENTRIES)
        if band.max_frequency < params.max_frequency:
            raise ValueError(f"max_frequency {params.max_frequency} needs a frequency table of "
                             f"more than {MAX_TABLE_ENTRIES} entries")
    return band


def release_tables_can_fail(params):
    """Whether accounting.pws.release.release_tables can refuse ``params`` that :func:`calibrate`
    returned. Only the biased-down estimates extrapolated beyond a shift table can: their
    tail must be periodic (:func:`_periodic_tail`). Keys only: no estimates; ``"clip"``:
    no extrapolation; the band: the rows :func:`calibrate` built within the caps. The MLE
    beyond a shift table (eq. 11) is exactly periodic: every column j >= M is stored in
    rows >= M only, which are row M shifted (pi = 1 there, as stationarity requires), so
    each such column holds the same entries at the same diagonals d and the estimate is
    a_j = g(j + d*) / 1 = j + d*, an exact integer: period 1, increment 1.0, and the tail
    release_tables reads (columns M + W .. M + 3W) lies there
    (tests/accounting/pws/test_pws_keep_table.py checks it)."""
    return (params.report != "keys" and params.beyond_table == "shift"
            and params.estimator != "mle")

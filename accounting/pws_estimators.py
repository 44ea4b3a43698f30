"""PWS token estimators on a banded frequency table, without building a sparse matrix.

Cohen, Geri, Sarlos & Stemmer, "Differentially Private Weighted Sampling", AISTATS 2021
(``/work/shared/papers/001_57785b851e794451.txt``; "PWS"): the maximum-likelihood
estimator (§7.1, eq. 11) and the biased-down estimator (Appendix E, eq. 41) of g(w) from
a sanitized token j. Both read the table column by column: column j of an Alg. 4 table
holds pi_{i,j} for the rows i = j .. j + W - 1 only (the band; token j <= i and rows
are at most W wide). Indexing the entries by their diagonal d = i - j, column j is the
run (j + d, d), d = 0 .. W - 1, gathered straight from the row storage in blocks of
columns. The cost is O(rows x W) time and O(block) extra memory (plus one float per
stored entry for the biased-down suffix sums) instead of a compressed-column copy of
the whole table (~2e7 entries, ~1.5 GB at the planning limits; issue 18).

The functions return the same floats as the compressed-column definitions in
``accounting.pws`` (same comparisons, same sums in the same order), which tests check.
"""
import dataclasses

import numpy as np

# Entries gathered per block (column chunk x band width): ~50 bytes each in temporaries.
BLOCK_ENTRIES = 1 << 18


@dataclasses.dataclass(frozen=True)
class TokenBand:
    """Token entries of a banded table: row r holds columns lo[r] .. lo[r] + lengths[r] - 1
    (all <= r) at values[starts[r]:starts[r] + lengths[r]]. Rows >= ``owned`` reuse the
    storage of earlier rows (the shift extension: row M shifted one column per row)."""

    values: np.ndarray
    starts: np.ndarray
    lengths: np.ndarray
    lo: np.ndarray
    owned: int

    @property
    def n_rows(self):
        return len(self.lengths)

    @property
    def width(self):
        """W: one more than the largest diagonal offset r - j of a stored entry."""
        rows = np.flatnonzero(self.lengths)
        return int(np.max(rows - self.lo[rows])) + 1 if len(rows) else 1


def from_rows(lo, indptr, values, extra=0):
    """TokenBand of Alg. 4 rows stored as in ``accounting.pws._Band`` (row i: columns
    lo[i].., values[indptr[i]:indptr[i+1]]), with ``extra`` more rows, each the last row
    shifted by one more column (``beyond_table="shift"``), sharing its storage."""
    m = len(lo) - 1
    lengths = np.diff(indptr)
    rows_lo = np.asarray(lo, dtype=np.int64)
    starts = np.asarray(indptr[:-1], dtype=np.int64)
    if extra:
        rows_lo = np.concatenate([rows_lo, rows_lo[m] + np.arange(1, extra + 1)])
        starts = np.concatenate([starts, np.full(extra, starts[m])])
        lengths = np.concatenate([lengths, np.full(extra, lengths[m])])
    lo_used = np.where(lengths > 0, rows_lo, 0)
    return TokenBand(values=values, starts=starts, lengths=lengths.astype(np.int64),
                     lo=lo_used, owned=m + 1)


def from_csr(table):
    """TokenBand of a CSR frequency table (canonical: sorted, no duplicates; column 0 =
    not reported, token columns 1..), or None when some row's token entries are not one
    contiguous run at or left of the diagonal, or the band would be much larger than the
    stored entries (then the compressed-column definitions apply)."""
    if not table.has_canonical_format:
        return None
    n = table.shape[0]
    indptr = table.indptr.astype(np.int64)
    indices = table.indices.astype(np.int64)
    row_start, row_end = indptr[:-1], indptr[1:]
    has_zero = np.zeros(n, dtype=bool)
    nonempty = row_end > row_start
    has_zero[nonempty] = indices[row_start[nonempty]] == 0
    starts = row_start + has_zero
    lengths = row_end - starts
    rows = np.flatnonzero(lengths)
    lo = np.zeros(n, dtype=np.int64)
    lo[rows] = indices[starts[rows]]
    last = indices[starts[rows] + lengths[rows] - 1]
    if np.any(last - lo[rows] != lengths[rows] - 1) or np.any(last > rows):
        return None
    band = TokenBand(values=table.data, starts=starts, lengths=lengths, lo=lo, owned=n)
    if n * band.width > 4 * len(table.data) + (1 << 16):
        return None
    return band


def _blocks(first, stop, width):
    step = max(1, BLOCK_ENTRIES // width)
    for j0 in range(first, stop, step):
        yield j0, min(stop, j0 + step)


def _gather(band, width, j0, j1):
    """For columns j0..j1-1 (block rows) and diagonals d = 0..W-1: (valid, positions) of
    the entries (j + d, j) in the storage."""
    j = np.arange(j0, j1, dtype=np.int64)[:, None]
    r = j + np.arange(width, dtype=np.int64)[None, :]
    inside = r < band.n_rows
    r = np.minimum(r, band.n_rows - 1)
    k = j - band.lo[r]
    valid = inside & (k >= 0) & (k < band.lengths[r])
    return valid, np.where(valid, band.starts[r] + k, 0)


def mle(band, keep, g, columns=None):
    """PWS eq. (11) on a TokenBand: a_j = g(i*) / pi_{i*}, i* the smallest row with the
    largest stored pi_{i,j}; a_0 = 0 and a_j = 0 for columns with nothing stored.
    Returns a_0 .. a_{columns - 1} (default: one per row)."""
    n = band.n_rows if columns is None else columns
    a = np.zeros(n)
    width = band.width
    for j0, j1 in _blocks(1, n, width):
        valid, pos = _gather(band, width, j0, j1)
        v = np.where(valid, band.values[pos], -np.inf)
        best = np.argmax(v, axis=1)                # first maximum: the smallest row
        has = valid.any(axis=1)
        cols = np.arange(j0, j1)[has]
        rows = cols + best[has]
        a[cols] = g[rows] / keep[rows]
    return a


def _suffix_sums(band):
    """Per stored entry (i, j): sum_{h >= j} pi_{i,h} over row i's stored entries, summed
    from the row's last entry down (the order of ``np.cumsum(row[::-1])[::-1]``)."""
    suffix = np.zeros(len(band.values))
    owned = np.arange(band.owned)
    lengths = band.lengths[:band.owned]
    widest = int(lengths.max(initial=0))
    if widest == 0:
        return suffix
    step = max(1, BLOCK_ENTRIES // widest)
    for r0 in range(0, band.owned, step):
        rows = owned[r0:r0 + step]
        ln = lengths[rows]
        w = int(ln.max(initial=0))
        if w == 0:
            continue
        k = np.arange(w)[None, :]
        mask = k < ln[:, None]
        idx = np.where(mask, band.starts[rows][:, None] + ln[:, None] - 1 - k, 0)
        cum = np.cumsum(np.where(mask, band.values[idx], 0.0), axis=1)
        suffix[idx[mask]] = cum[mask]
    return suffix


def biased_down(band, g, columns=None):
    """PWS Appendix E, eq. (41) on a TokenBand: for j = 1, 2, ..,
    a_j = min over rows i with pi_{i,j} > 0 of (g(i) - sum_{h<j} a_h pi_{i,h}) / S_{i,j},
    S_{i,j} = sum_{h>=j} pi_{i,h} (the suffix sum; pi_i - sum_{h<j} pi_{i,h} without the
    cancellation). Columns with no positive entry keep a_j = 0. Sequential in j; each
    step touches the W rows of column j. Returns a_0 .. a_{columns - 1}."""
    n = band.n_rows if columns is None else columns
    a = np.zeros(n)
    numer = np.array(g, dtype=np.float64, copy=True)
    suffix = _suffix_sums(band)
    width = band.width
    for j0, j1 in _blocks(1, n, width):
        valid, pos = _gather(band, width, j0, j1)
        probs = np.where(valid, band.values[pos], 0.0)
        sums = np.where(valid, suffix[pos], 1.0)
        for c in range(j1 - j0):
            j = j0 + c
            seg = numer[j:j + width]
            span = len(seg)
            p = probs[c, :span]
            positive = p > 0
            if not positive.any():
                continue
            a_j = float(np.min(seg[positive] / sums[c, :span][positive]))
            a[j] = a_j
            stored = valid[c, :span]
            seg[stored] -= a_j * p[stored]
    return a

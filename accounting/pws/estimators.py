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
    """TokenBand of Alg. 4 rows stored as in ``accounting.pws.core._Band`` (row i: columns
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


def _row_suffix(band, r):
    """S_{r, .} of one row: its stored entries' sums from the row's last entry down."""
    s, n = band.starts[r], band.lengths[r]
    return np.cumsum(band.values[s:s + n][::-1])[::-1]


def _boundary_suffixes(band, step):
    """S_{i, B} at the block boundaries B = 1 + step, 1 + 2 step, .. inside each owned row
    (the sums from the row's end down to column B, in the order of a full reversed cumsum:
    each block then continues them exactly). Returns (pointer per row, values): row i's
    boundaries are its columns B in lo_i < B <= last_i, in increasing order."""
    owned = band.owned
    lo, lengths = band.lo[:owned], band.lengths[:owned]
    first_b = np.where(lengths > 0, (lo - 1) // step + 1, 0)           # first B index > lo - 1
    last_col = lo + lengths - 1
    count = np.where(lengths > 0, np.maximum(0, (last_col - 1) // step - first_b + 1), 0)
    ptr = np.zeros(owned + 1, dtype=np.int64)
    ptr[1:] = np.cumsum(count)
    out = np.zeros(int(ptr[-1]))
    widest = int(lengths.max(initial=0))
    if widest == 0:
        return ptr, out
    chunk = max(1, BLOCK_ENTRIES // widest)
    for r0 in range(0, owned, chunk):
        rows = np.arange(r0, min(owned, r0 + chunk))
        ln = lengths[rows]
        w = int(ln.max(initial=0))
        if w == 0 or not count[rows].any():
            continue
        k = np.arange(w)[None, :]
        mask = k < ln[:, None]
        idx = np.where(mask, band.starts[rows][:, None] + ln[:, None] - 1 - k, 0)
        cum = np.cumsum(np.where(mask, band.values[idx], 0.0), axis=1)    # cum[., t]: column last - t
        rr = np.repeat(rows, count[rows])
        m = np.arange(len(rr)) - np.repeat(ptr[rows] - ptr[rows[0]], count[rows])
        cols = 1 + step * (first_b[rr] + m)
        out[ptr[rows[0]]:ptr[rows[-1] + 1]] = cum[rr - r0, last_col[rr] - cols]
    return ptr, out


def biased_down(band, g, columns=None):
    """PWS Appendix E, eq. (41) on a TokenBand: for j = 1, 2, ..,
    a_j = min over rows i with pi_{i,j} > 0 of (g(i) - sum_{h<j} a_h pi_{i,h}) / S_{i,j},
    S_{i,j} = sum_{h>=j} pi_{i,h} (the suffix sum; pi_i - sum_{h<j} pi_{i,h} without the
    cancellation). Columns with no positive entry keep a_j = 0. Sequential in j; each
    step touches the W rows of column j. The suffix sums are formed block by block from
    the sums at the block's right boundary (:func:`_boundary_suffixes`), so no per-entry
    copy of the table is held. Returns a_0 .. a_{columns - 1}."""
    n = band.n_rows if columns is None else columns
    a = np.zeros(n)
    numer = np.array(g, dtype=np.float64, copy=True)
    width = band.width
    step = max(1, min(BLOCK_ENTRIES // width, int(np.sqrt(BLOCK_ENTRIES))))
    ptr, carries = _boundary_suffixes(band, step)
    shared = {}                                   # full suffix rows of shared storage
    for j0 in range(1, n, step):
        j1 = min(n, j0 + step)
        valid, pos = _gather(band, width, j0, j1)
        probs = np.where(valid, band.values[pos], 0.0)
        sums = _block_suffixes(band, width, j0, j1, step, ptr, carries, shared, valid)
        positives = probs > 0
        # columns whose entries are all positive / all stored (most of them): the same
        # divisions and subtractions on whole slices, without the masks' fancy indexing
        all_positive = positives.all(axis=1).tolist()
        all_stored = valid.all(axis=1).tolist()
        for c in range(j1 - j0):
            j = j0 + c
            seg = numer[j:j + width]
            span = len(seg)
            p = probs[c, :span]
            if span == width and all_positive[c]:
                a_j = float((seg / sums[c]).min())
            else:
                positive = positives[c, :span]
                if not positive.any():
                    continue
                a_j = float((seg[positive] / sums[c, :span][positive]).min())
            a[j] = a_j
            if span == width and all_stored[c]:
                seg -= a_j * p
            else:
                stored = valid[c, :span]
                seg[stored] -= a_j * p[stored]
    return a


def _block_suffixes(band, width, j0, j1, step, ptr, carries, shared, valid):
    """S_{j+d, j} for the block's columns j0..j1-1 and diagonals d (1.0 where not stored):
    rows j0 .. j1+W-2 as a (rows x columns) block, columns reversed, each row's cumulative
    sum starting from its sum at column j1 (0 when the row ends before j1)."""
    nb = j1 - j0
    rows = np.arange(j0, min(band.n_rows, j1 + width - 1))
    lo, lengths, starts = band.lo[rows], band.lengths[rows], band.starts[rows]
    last = lo + lengths - 1
    carry = np.zeros(len(rows))
    # rows with entries at columns < j1 and >= j1: their sums at j1 continue into the block
    reach = (lengths > 0) & (lo < j1) & (j1 <= last)
    own = reach & (rows < band.owned) & ((j1 - 1) % step == 0)   # j1 on the boundary grid
    if own.any():
        r = rows[own]
        b_first = (lo[own] - 1) // step + 1
        carry[own] = carries[ptr[r] + ((j1 - 1) // step - b_first)]
    for i in np.flatnonzero(reach & ~own):     # shared storage (the shift rows), last block
        key = int(starts[i])
        if key not in shared:
            shared.clear()
            shared[key] = _row_suffix(band, int(rows[i]))
        carry[i] = shared[key][j1 - lo[i]]
    k = j1 - 1 - np.arange(nb)[None, :]                   # columns j1-1 .. j0
    off = k - lo[:, None]
    inside = (off >= 0) & (off < lengths[:, None])
    block = np.zeros((len(rows), nb + 1))
    block[:, 0] = carry
    block[:, 1:] = np.where(inside, band.values[np.where(inside, starts[:, None] + off, 0)], 0.0)
    cum = np.cumsum(block, axis=1)
    c = np.arange(nb)[:, None]
    d = np.arange(width)[None, :]
    row_idx = np.minimum(c + d, len(rows) - 1)
    return np.where(valid, cum[row_idx, nb - c], 1.0)

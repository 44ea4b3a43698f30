"""Exact, order-independent per-group sums of float64 values (issue 43, item 2), and the
hash group-by that numbers the groups (:func:`pair_groups`). Plumbing, below the bounding
and the value aggregates that both sum with it.

A (user, key)'s total (``aggregate_values.user_key_totals``) is the exact real sum of its
finite values, rounded once to the nearest float64 (ties to even; beyond the float64
range: +-inf, which the clamp then bounds). It is a function of the multiset of the values
alone, never of their order or of how they were split between tables, so a user's rows
can be summed per table before the user shuffle (``transforms.bounding.prereduce``,
``aggregate_partials``) and the partial totals combined after it, to the same total.

The superaccumulator. A finite float64 v = M 2^(s - 1126) with M an integer, |M| < 2^53,
and 0 <= s <= 2097 (the smallest subnormal is 2^-1074 = 2^52 2^-1126). Its magnitude |M|
2^(s mod 16) is cut into five 16-bit pieces, each at an absolute digit position (base
2^16, from 2^-1126); the pieces of a group's rows are added per position by
``np.bincount``: float64 sums of integers below 2^17, exact while fewer than 2^36 rows
meet in one position and group (any order gives the same integer). The signed digit sums
are then normalised by carries (digits in [0, 2^16), a sign per group) and the total is
rounded from its top 64 bits and a sticky bit (:func:`_round_to_float64`).

Memory: the digit sums are a (groups, positions) matrix over the positions the table's
values reach (about 8 for values within a few binary orders of magnitude); groups are
taken in blocks of at most ``BLOCK_CELLS`` cells, so a table whose values span the whole
float64 range costs time, not memory.

Why this changes published bytes for some inputs: before, a total was the float64 sum of
the values in ascending order (rounded at every step); it is now the correctly rounded
exact sum. The two differ in the last bits for some multisets (not for integers below
2^53, nor any sum that float64 represents exactly), and the grid conversion
(``accounting.aggregates.FixedPointGrid.to_units``) can carry the difference into one grid
unit of a published sum. The privacy argument is unchanged: the total is still clamped to
[low, high] after summing, so one user moves each grid sum by at most D_g
(docs/aggregates.md; paper 002 Sec. 3's contribution bounding with the clamped-sum
sensitivity of ``accounting.aggregates``).
"""
import math

import numpy as np
import pyarrow as pa

DIGIT_BITS = 16
PIECES = 5                 # 53 bits shifted by up to 15: 68 bits = five 16-bit pieces
OFFSET = 1126              # s = e - 53 + OFFSET >= 0 for every finite float64
HEADROOM = 3               # digits above the top piece for carries (2^48 rows)
LOW_PAD = 5                # zero digits below, so the rounding window never leaves the matrix
BLOCK_CELLS = 1 << 23      # (groups x positions) cells of float64 sums per block
CHUNK_DIGITS = 3           # a term of an expansion holds three digits (48 bits)
_MASK = np.uint64(0xFFFF)


def _pieces(values):
    """(nonzero row mask, digit position of the lowest piece, sign, five pieces (5, n)
    float64 each below 2^17) of finite float64 ``values``."""
    values = np.asarray(values, dtype=np.float64)
    nonzero = values != 0
    mantissa, exponent = np.frexp(values[nonzero])
    whole = np.ldexp(mantissa, 53)                       # exact integer, |M| < 2^53
    sign = np.sign(whole)
    magnitude = np.abs(whole).astype(np.uint64)
    shift = exponent.astype(np.int64) - 53 + OFFSET       # >= 0
    position = shift >> 4
    offset = (shift & 15).astype(np.uint64)
    low = (magnitude & np.uint64(0xFFFFFFFF)) << offset   # < 2^47
    high = (magnitude >> np.uint64(32)) << offset         # < 2^36
    pieces = np.empty((PIECES, len(magnitude)), dtype=np.float64)
    pieces[0] = low & _MASK
    pieces[1] = (low >> np.uint64(16)) & _MASK
    pieces[2] = (low >> np.uint64(32)) + (high & _MASK)
    pieces[3] = (high >> np.uint64(16)) & _MASK
    pieces[4] = high >> np.uint64(32)
    return nonzero, position, sign, pieces


def _normalised(sums):
    """Signed digit sums (groups, D) int64 -> (sign (groups,) int8, digits in [0, 2^16))."""
    digits = sums.copy()
    for j in range(digits.shape[1] - 1):
        carry = digits[:, j] >> DIGIT_BITS
        digits[:, j] -= carry << DIGIT_BITS
        digits[:, j + 1] += carry
    sign = np.sign(digits[:, -1]).astype(np.int8)
    negative = sign < 0
    if negative.any():
        flipped = -digits[negative]
        for j in range(flipped.shape[1] - 1):
            carry = flipped[:, j] >> DIGIT_BITS
            flipped[:, j] -= carry << DIGIT_BITS
            flipped[:, j + 1] += carry
        digits[negative] = flipped
    zero = ~digits.any(axis=1)
    sign[zero] = 0
    sign[~zero & ~negative] = 1
    return sign, digits


def _round_to_float64(sign, digits, base):
    """The float64 nearest (ties to even) to sign * sum_j digits[:, j] 2^(16 (base + j)
    - OFFSET); +-inf beyond the float64 range."""
    groups, width = digits.shape
    out = np.zeros(groups, dtype=np.float64)
    live = np.flatnonzero(sign != 0)
    if not len(live):
        return out
    d = digits[live].astype(np.uint64)
    top = width - 1 - np.argmax(d[:, ::-1] != 0, axis=1)           # highest nonzero digit
    rows = np.arange(len(live))
    lead = d[rows, top]
    bits = np.frexp(lead.astype(np.float64))[1].astype(np.int64)   # bit length, 1..16
    word = np.zeros(len(live), dtype=np.uint64)
    for k in range(5):                 # digits top .. top-4 into the top 64 bits
        digit = d[rows, top - k]
        left = 64 - 16 * k - bits      # >= 0 for k <= 3; k = 4: shift right
        if k < 4:
            word |= digit << left.astype(np.uint64)
        else:
            word |= digit >> bits.astype(np.uint64)
    lost = d[rows, top - 4] & ((np.uint64(1) << bits.astype(np.uint64)) - np.uint64(1))
    below = np.cumsum(d != 0, axis=1)                              # nonzero digits so far
    sticky = (lost != 0) | (below[rows, top - 5] > 0)
    mantissa = word >> np.uint64(11)
    rest = word & np.uint64(0x7FF)
    half = np.uint64(0x400)
    up = (rest > half) | ((rest == half) & (sticky | ((mantissa & np.uint64(1)) == 1)))
    mantissa = mantissa + up.astype(np.uint64)
    exponent = DIGIT_BITS * (base + top) + bits - 1 - 52 - OFFSET
    with np.errstate(over="ignore"):
        out[live] = sign[live] * np.ldexp(mantissa.astype(np.float64), exponent)
    return out


def _terms(sign, digits, base):
    """An exact float64 expansion of each group's total: (terms (groups, T) float64, each
    row's terms summing exactly to its total, zeros where unused; finite (groups,) bool,
    False where a term would pass the float64 range). Terms hold three digits each (below
    2^48, so each is exact in float64: an exact sum of float64 values is a multiple of
    2^-1074, and so is every block of its digits)."""
    groups, width = digits.shape
    chunks = -(-width // CHUNK_DIGITS)
    padded = np.zeros((groups, chunks * CHUNK_DIGITS), dtype=np.int64)
    padded[:, :width] = digits
    padded = padded.reshape(groups, chunks, CHUNK_DIGITS)
    words = padded[:, :, 0] + (padded[:, :, 1] << 16) + (padded[:, :, 2] << 32)
    exponents = DIGIT_BITS * (base + CHUNK_DIGITS * np.arange(chunks)) - OFFSET
    with np.errstate(over="ignore"):
        values = np.ldexp(words.astype(np.float64), exponents[None, :]) * sign[:, None]
    finite = np.isfinite(values).all(axis=1)
    used = words != 0
    count = used.sum(axis=1)
    terms = np.zeros((groups, max(1, int(count.max()) if groups else 1)), dtype=np.float64)
    if groups:
        # the used chunks of each row, left-aligned (ascending order of position)
        order = np.argsort(~used, axis=1, kind="stable")
        packed = np.take_along_axis(values, order, axis=1)[:, :terms.shape[1]]
        keep = np.arange(terms.shape[1])[None, :] < count[:, None]
        terms = np.where(keep, packed, 0.0)
    return terms, count, finite


def _block_sums(values, group, num_groups, lowest, width):
    """Signed digit sums (num_groups, width) int64 of one block (positions from ``lowest``)."""
    nonzero, position, sign, pieces = _pieces(values)
    cells = np.zeros(num_groups * width, dtype=np.float64)
    base_index = group[nonzero] * width + (position - lowest)
    for k in range(PIECES):
        cells += np.bincount(base_index + k, weights=sign * pieces[k],
                             minlength=num_groups * width)
    return cells.reshape(num_groups, width).astype(np.int64)


def _range(values):
    """(lowest digit position, matrix width) for ``values``: the positions their pieces
    reach, with LOW_PAD zero digits below (the rounding window) and HEADROOM above."""
    values = np.asarray(values, dtype=np.float64)
    nonzero = values[values != 0]
    if not len(nonzero):
        return 0, 1
    _, e = np.frexp(nonzero)
    lo = (int(e.min()) - 53 + OFFSET) >> 4
    hi = ((int(e.max()) - 53 + OFFSET) >> 4) + PIECES - 1
    return lo - LOW_PAD, hi + HEADROOM + 1 - (lo - LOW_PAD)


def _dyadic_exact(values):
    """Whether every float64 sum of ``values``, in any order, is exact: all of them are
    multiples of 2^u for one u and the sum of their magnitudes is below 2^(53 + u)
    (every partial sum is then an integer multiple of 2^u below 2^53 of them). True
    for integer-valued data of moderate size, the usual counts and amounts.

    Where 2^(53 + u) passes the float64 range (u >= 971: every value is at least 2^1023
    in magnitude, or a multiple of 2^971), the bound is +inf, and a finite (slackened)
    sum of magnitudes suffices: every partial sum is then a multiple of 2^u below 2^1024,
    53 bits at most, so exact (``math.ldexp`` raised OverflowError there)."""
    x = values[values != 0]
    if not len(x):
        return True
    mantissa, exponent = np.frexp(x)
    whole = np.abs(np.ldexp(mantissa, 53)).astype(np.int64)
    lowest_bit = np.frexp((whole & -whole).astype(np.float64))[1] - 1     # trailing zeros
    unit = int((exponent.astype(np.int64) - 53 + lowest_bit).min())
    with np.errstate(over="ignore"):
        total = float(np.abs(x).sum()) * (1 + 1e-6)
        limit = float(np.ldexp(1.0, 53 + unit))          # +inf from u = 971 on
    return total < limit if math.isfinite(limit) else math.isfinite(total)


def _superaccumulated(values, group, num_groups, terms):
    values = np.asarray(values, dtype=np.float64)
    lowest, width = _range(values)
    per_block = max(1, BLOCK_CELLS // width)
    if num_groups <= per_block:
        blocks = [(0, num_groups, slice(None))]
    else:
        order = np.argsort(group, kind="stable")
        starts = np.searchsorted(group[order], np.arange(0, num_groups, per_block))
        ends = np.append(starts[1:], len(order))
        blocks = [(a, min(a + per_block, num_groups), order[s:e])
                  for a, s, e in zip(range(0, num_groups, per_block), starts, ends)]
    results = []
    for first, last, rows in blocks:
        sums = _block_sums(values[rows], group[rows] - first, last - first, lowest, width)
        sign, digits = _normalised(sums)
        results.append(_terms(sign, digits, lowest) if terms
                       else _round_to_float64(sign, digits, lowest))
    if not terms:
        return np.concatenate(results)
    width_t = max(r[0].shape[1] for r in results)
    return (np.concatenate([np.pad(r[0], ((0, 0), (0, width_t - r[0].shape[1])))
                            for r in results]),
            np.concatenate([r[1] for r in results]), np.concatenate([r[2] for r in results]))


def exact_sums(values, group, num_groups, terms=False):
    """Per group, the exact sum of the finite float64 ``values`` (rows of ``group``, ints
    in [0, num_groups)), rounded once to float64 (module docstring). With ``terms``:
    instead (terms (num_groups, T) float64, term count per group, finite mask), an exact
    expansion of each sum (:func:`_terms`; one term where the float sum is exact).

    Fast paths, same results: a group with at most two nonzero values is summed by
    ``np.bincount`` (0 + a + b: one IEEE addition, correctly rounded), and so is every
    group when :func:`_dyadic_exact` holds for the values; the superaccumulator reads
    only the other groups' rows."""
    values = np.asarray(values, dtype=np.float64)
    group = np.asarray(group, dtype=np.int64)
    plain = np.bincount(group, weights=values, minlength=num_groups)
    nonzero = values != 0
    counts = np.bincount(group[nonzero], minlength=num_groups)
    hard = counts >= (2 if terms else 3)
    if hard.any():
        rows = nonzero & hard[group]
        if _dyadic_exact(values[rows]):
            hard[:] = False
    if terms:
        out = plain[:, None].copy()
        count = (plain != 0).astype(np.int64)
        finite = np.ones(num_groups, dtype=bool)
    else:
        out = plain
    if not hard.any():
        return (out, count, finite) if terms else out
    renumber = np.cumsum(hard) - 1
    which = np.flatnonzero(hard)
    found = _superaccumulated(values[rows], renumber[group[rows]], len(which), terms)
    if not terms:
        out[which] = found
        return out
    width = max(1, found[0].shape[1])
    out = np.pad(out, ((0, 0), (0, width - 1)))
    out[which] = 0.0
    out[which, :found[0].shape[1]] = found[0]
    count[which] = found[1]
    finite[which] = found[2]
    return out, count, finite


_ROW = "__row"


def pair_groups(table, group):
    """(group number of every row (int64), one row per distinct ``group`` tuple: the
    group columns in order of first appearance), by pyarrow's hash group-by."""
    n = table.num_rows
    keyed = table.select(group).append_column(_ROW, pa.array(np.arange(n, dtype=np.int64)))
    grouped = keyed.group_by(group, use_threads=False).aggregate([(_ROW, "list")])
    lists = grouped.column(f"{_ROW}_list")
    lists = lists.combine_chunks() if lists.num_chunks != 1 else lists.chunk(0)
    offsets = lists.offsets.to_numpy()
    flat = lists.values.to_numpy()
    rows = np.empty(n, dtype=np.int64)
    rows[flat[offsets[0]:offsets[-1]]] = np.repeat(
        np.arange(len(offsets) - 1, dtype=np.int64), np.diff(offsets))
    return rows, grouped.drop_columns([f"{_ROW}_list"])

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

Memory and time: the digit sums are a (groups, positions) matrix over the positions each
group's own values reach (:func:`_windows`: about 15 with the padding, for values within
a few binary orders of magnitude); groups are taken by window width, in blocks of one
width and at most ``BLOCK_CELLS`` cells. The expansions (``terms``) are ragged, a count
per group. So one (user, key) whose values span the whole float64 range (140 positions,
45 terms) costs its own block, not a wider matrix and a wider expansion for every group
of its table (on 1e6 pairs of three decimals: 2.5 times the CPU time, and 26 million
values of expansion instead of 2 million).

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
    exponent = DIGIT_BITS * (base[live] + top) + bits - 1 - 52 - OFFSET
    with np.errstate(over="ignore"):
        out[live] = sign[live] * np.ldexp(mantissa.astype(np.float64), exponent)
    return out


def _terms(sign, digits, base):
    """An exact float64 expansion of each group's total, ragged: (terms, flat float64:
    each group's nonzero terms in ascending order of position, group after group, summing
    exactly to its total; count (groups,) int64, how many terms each group has; finite
    (groups,) bool, False where a term would pass the float64 range). Terms hold three
    digits each (below 2^48, so each is exact in float64: an exact sum of float64 values
    is a multiple of 2^-1074, and so is every block of its digits). Only the terms are
    stored: a group whose digits span the whole float64 range (about 45 terms) costs the
    others nothing."""
    groups, width = digits.shape
    chunks = -(-width // CHUNK_DIGITS)
    padded = np.zeros((groups, chunks * CHUNK_DIGITS), dtype=np.int64)
    padded[:, :width] = digits
    padded = padded.reshape(groups, chunks, CHUNK_DIGITS)
    words = padded[:, :, 0] + (padded[:, :, 1] << 16) + (padded[:, :, 2] << 32)
    used = words != 0
    row, chunk = np.nonzero(used)               # group after group, ascending position
    exponents = DIGIT_BITS * (base[row] + CHUNK_DIGITS * chunk) - OFFSET
    with np.errstate(over="ignore"):
        terms = np.ldexp(words[row, chunk].astype(np.float64), exponents) * sign[row]
    finite = np.ones(groups, dtype=bool)
    finite[row[~np.isfinite(terms)]] = False
    return terms, used.sum(axis=1).astype(np.int64), finite


def term_slots(count):
    """Each term's slot in its group (0 .. count - 1 for each group in turn), for the
    ragged terms of :func:`exact_sums`: group g's terms are ``terms[start[g] + slot]``
    with ``start = np.cumsum(count) - count``."""
    count = np.asarray(count, dtype=np.int64)
    return np.arange(int(count.sum()), dtype=np.int64) - np.repeat(np.cumsum(count) - count,
                                                                    count)


def _block_sums(values, group, num_groups, lowest, width):
    """Signed digit sums (num_groups, width) int64 of one block (each group's positions
    from its own ``lowest``)."""
    nonzero, position, sign, pieces = _pieces(values)
    cells = np.zeros(num_groups * width, dtype=np.float64)
    base_index = group[nonzero] * width + (position - lowest[group[nonzero]])
    for k in range(PIECES):
        cells += np.bincount(base_index + k, weights=sign * pieces[k],
                             minlength=num_groups * width)
    return cells.reshape(num_groups, width).astype(np.int64)


def _windows(values, group, num_groups):
    """Per group, (lowest digit position, width) of the digits its sums need: the
    positions its values' pieces reach, with LOW_PAD zero digits below (the rounding
    window) and HEADROOM above. The lowest positions are aligned to the table's lowest in
    steps of CHUNK_DIGITS, so a group's terms are those of one window over the whole table.
    A group whose values lie within a few binary orders of magnitude needs about 15
    digits, whatever the other groups' values span."""
    values = np.asarray(values, dtype=np.float64)
    nonzero = values != 0
    _, e = np.frexp(values[nonzero])
    position = (e.astype(np.int64) - 53 + OFFSET) >> 4
    lo = np.full(num_groups, np.iinfo(np.int64).max)
    hi = np.full(num_groups, -1)
    np.minimum.at(lo, group[nonzero], position)
    np.maximum.at(hi, group[nonzero], position)
    empty = hi < 0                      # no nonzero value: any window (a zero sum)
    lo[empty] = hi[empty] = lo.min() if (~empty).any() else 0
    table = int(lo.min()) - LOW_PAD
    lowest = table + CHUNK_DIGITS * ((lo - LOW_PAD - table) // CHUNK_DIGITS)
    return lowest, hi + PIECES + HEADROOM - lowest


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
    """:func:`exact_sums` of every group by the superaccumulator (rounded, or ragged terms
    with their counts and finite masks). Each group's digits are summed in its own window
    (:func:`_windows`); the groups are taken in order of window width, in blocks of one
    width and at most ``BLOCK_CELLS`` cells, so a group whose values span the float64
    range widens only its own block."""
    values = np.asarray(values, dtype=np.float64)
    lowest, width = _windows(values, group, num_groups)
    # groups, narrowest first (widths < 2^16, about 150 at most: numpy's radix sort)
    by_width = np.argsort(width.astype(np.uint16), kind="stable")
    sorted_width = width[by_width]
    first_of = np.flatnonzero(np.diff(sorted_width, prepend=-1))   # each width's first group
    widths = sorted_width[first_of]
    last_of = np.append(first_of[1:], num_groups)
    blocks = [(a, min(a + max(1, BLOCK_CELLS // int(w)), b), int(w))
              for w, start, b in zip(widths, first_of, last_of)
              for a in range(start, b, max(1, BLOCK_CELLS // int(w)))]
    rank = np.empty(num_groups, dtype=np.int64)
    rank[by_width] = np.arange(num_groups)
    if len(blocks) == 1:                                  # one width: by_width is the identity
        row_of = [slice(None)]
    else:
        # each row's block (a radix sort of small ints, not a sort by rank: the digit sums
        # of a block are exact, so the order of its rows does not matter)
        block = np.searchsorted([a for a, _, _ in blocks], rank, side="right") - 1
        row_block = block.astype(np.uint16 if len(blocks) < 1 << 16 else np.int64)[group]
        order = np.argsort(row_block, kind="stable")
        edges = np.cumsum(np.bincount(row_block, minlength=len(blocks)))
        row_of = [order[s:e] for s, e in zip(np.append(0, edges[:-1]), edges)]
    results = []
    for (first, last, w), rows in zip(blocks, row_of):
        base = lowest[by_width[first:last]]
        sums = _block_sums(values[rows], rank[group[rows]] - first, last - first, base, w)
        sign, digits = _normalised(sums)
        results.append(_terms(sign, digits, base) if terms
                       else _round_to_float64(sign, digits, base))
    if not terms:
        out = np.empty(num_groups, dtype=np.float64)
        out[by_width] = np.concatenate(results)
        return out
    found, found_count, found_finite = (np.concatenate([r[k] for r in results])
                                        for k in range(3))
    count = np.empty(num_groups, dtype=np.int64)
    count[by_width] = found_count
    finite = np.empty(num_groups, dtype=bool)
    finite[by_width] = found_finite
    start = np.cumsum(count) - count                      # back to group order
    out = np.empty(len(found), dtype=np.float64)
    out[np.repeat(start[by_width], found_count) + term_slots(found_count)] = found
    return out, count, finite


def exact_sums(values, group, num_groups, terms=False):
    """Per group, the exact sum of the finite float64 ``values`` (rows of ``group``, ints
    in [0, num_groups)), rounded once to float64 (module docstring). With ``terms``:
    instead (terms, count, finite), an exact expansion of each sum, ragged
    (:func:`_terms`): group g's terms are ``terms[start[g]:start[g] + count[g]]`` with
    ``start = np.cumsum(count) - count`` (:func:`term_slots`), one term where the float
    sum is exact and none where the sum is 0; ``finite`` is False where a term would pass
    the float64 range. Memory is that of the terms needed, whatever the widest group
    needs.

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
    if not hard.any():
        if not terms:
            return plain
        return (plain[plain != 0], (plain != 0).astype(np.int64),
                np.ones(num_groups, dtype=bool))
    renumber = np.cumsum(hard) - 1
    which = np.flatnonzero(hard)
    found = _superaccumulated(values[rows], renumber[group[rows]], len(which), terms)
    if not terms:
        plain[which] = found
        return plain
    found_terms, found_count, found_finite = found
    easy = ~hard & (plain != 0)
    count = easy.astype(np.int64)
    count[which] = found_count
    finite = np.ones(num_groups, dtype=bool)
    finite[which] = found_finite
    start = np.cumsum(count) - count
    out = np.empty(int(count.sum()), dtype=np.float64)
    out[start[easy]] = plain[easy]
    out[np.repeat(start[which], found_count) + term_slots(found_count)] = found_terms
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

"""Per-key quantiles over a public cell domain: once the keys are public (``input.public_keys``
or released by a ``select_keys`` stage), every (key, level, bucket) cell of the
branching-ary hierarchy over the public value range is public too, so each cell is
released with discrete Gaussian noise and no threshold (paper 002 Sec. 4, Algorithm 1,
applied to the cells; the hierarchy is paper 003 Sec. 4.2's).

Privacy (``accounting.known_domain.gaussian_delta``): a user holds one value in at most C
keys (``transforms.bounding.key_value_bound``), so adding them moves exactly one bucket per kept
key at each of the L levels by 1: C L unit shifts of independent N_Z(0, sigma^2)
coordinates, whose exact delta(eps) is ``composed_shift_delta(eps, sigma, C L)``. Keys
compose in parallel (a user touches at most C of them): epsilon is never divided by the
number of keys.

Post-processing per key (no privacy cost):

1. consistency -- the least-squares tree estimate (Hay, Rastogi, Miklau, Suciu, VLDB 2010,
   Sec. 4 "constrained inference"), done as an inverse-variance bottom-up pass and a
   top-down pass that spreads each parent's residual over its children in proportion
   to their variances; the total is the sum of the level-1 estimates (no root cell);
2. the cumulative counts F over the leaves made non-decreasing (isotonic regression,
   ``scipy.optimize.isotonic_regression``) and clipped to [0, total];
3. the phi-quantile interpolated linearly inside the leaf where F crosses phi * total;
   values are then non-decreasing in phi by construction (and sorted to make sure).

A key's values are null only when its estimated total is below ``support_floor`` (Z
standard deviations of the total's noise, a public number): too few users to rank.
"""
import functools
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa

from thresher.transforms.randomness import hashing, keyed_random
from thresher.transforms.selection.public_domain import (
    noisy_domain_counts, release_domain_table)
from thresher.transforms.selection.release_fn import identity_columns
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.trees.heavy_hitters import LEVEL_COLUMN
from thresher.transforms.trees.quantiles import BUCKET_COLUMN, level_cells
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN

SUPPORT_Z = 3.0
NULL_REASON = ("null: the key's noisy number of users is below {floor:.4g} ({z:g} standard "
               "deviations of its noise): too few users to rank")


# ---- kernels ----------------------------------------------------------------------------

def consistent_tree(noisy_levels, branching):
    """Least-squares consistent estimates (Hay et al. 2010) of a hierarchy whose levels
    1..L (arrays of length b**l) carry independent noise of equal variance; returns
    (leaf estimates, variance of the total's estimate in units of the noise variance)."""
    b = int(branching)
    levels = [np.asarray(h, dtype=np.float64) for h in noisy_levels]
    # bottom-up: z = inverse-variance mix of the node's own count and its children's sum
    z = [None] * len(levels)
    var = [None] * len(levels)
    z[-1], var[-1] = levels[-1].copy(), np.ones_like(levels[-1])
    for i in range(len(levels) - 2, -1, -1):
        child_sum = z[i + 1].reshape(-1, b).sum(axis=1)
        child_var = var[i + 1].reshape(-1, b).sum(axis=1)
        w = child_var / (1.0 + child_var)          # weight of the node's own count
        z[i] = w * levels[i] + (1.0 - w) * child_sum
        var[i] = child_var / (1.0 + child_var)
    total_var = float(var[0].sum())
    # top-down: each parent's residual spread over its children by their variances
    est = z[0]
    for i in range(1, len(levels)):
        kids = z[i].reshape(-1, b)
        kv = var[i].reshape(-1, b)
        residual = est - kids.sum(axis=1)
        est = (kids + residual[:, None] * kv / kv.sum(axis=1, keepdims=True)).ravel()
    return est, total_var


def support_floor(sigma, branching, levels, z=SUPPORT_Z):
    """The smallest estimated total a key must reach to be answered: z times the standard
    deviation of its consistent total (public: sigma and the tree shape only)."""
    shape = [np.zeros(branching ** l) for l in range(1, levels + 1)]
    _, total_var = consistent_tree(shape, branching)
    return z * sigma * math.sqrt(total_var)


def _isotonic(values):
    try:
        from scipy.optimize import isotonic_regression
        return np.asarray(isotonic_regression(values).x, dtype=np.float64)
    except ImportError:     # scipy < 1.12: running maximum (still monotone)
        return np.maximum.accumulate(values)


def consistent_leaves(dense, offsets, branching):
    """:func:`consistent_tree`'s leaf estimates of many keys at once: ``dense`` holds one
    key per row, its levels 1..L side by side (level l at ``offsets[l-1]:offsets[l]``,
    as :func:`dense_levels` places them). The same floating-point operations, in the same
    order, as :func:`consistent_tree` on each row alone (every sum is over one node's
    ``branching`` children, the last axis), so row i equals ``consistent_tree`` of key i
    bit for bit; returns a (keys, b**L) float64 array."""
    b = int(branching)
    k = dense.shape[0]
    levels = [np.ascontiguousarray(dense[:, offsets[l]:offsets[l + 1]], dtype=np.float64)
              for l in range(len(offsets) - 1)]
    z = [None] * len(levels)
    var = [None] * len(levels)
    z[-1], var[-1] = levels[-1].copy(), np.ones(levels[-1].shape[1])
    for i in range(len(levels) - 2, -1, -1):
        child_sum = z[i + 1].reshape(k, -1, b).sum(axis=2)
        child_var = var[i + 1].reshape(-1, b).sum(axis=1)
        w = child_var / (1.0 + child_var)
        z[i] = w * levels[i] + (1.0 - w) * child_sum
        var[i] = child_var / (1.0 + child_var)
    est = z[0]
    for i in range(1, len(levels)):
        kids = z[i].reshape(k, -1, b)
        kv = var[i].reshape(-1, b)
        residual = est - kids.sum(axis=2)
        est = (kids + residual[:, :, None] * kv / kv.sum(axis=1, keepdims=True)).reshape(k, -1)
    return est


def key_quantiles(noisy_levels, ranks, *, lo, hi, branching, floor):
    """The quantiles of one key from its noisy levels: (values list, None) or
    ([None]*, the estimated total) when the total is below ``floor``."""
    leaves, _ = consistent_tree(noisy_levels, branching)
    return leaf_quantiles(leaves, ranks, lo=lo, hi=hi, floor=floor)


def leaf_quantiles(leaves, ranks, *, lo, hi, floor):
    """:func:`key_quantiles` from one key's consistent leaf estimates (steps 2 and 3 of the
    module docstring)."""
    total = float(leaves.sum())
    if not total >= floor:
        return [None] * len(ranks), total
    cum = np.concatenate([[0.0], np.cumsum(leaves)])
    cum = np.clip(_isotonic(cum), 0.0, total)
    cum[-1] = total
    n = len(leaves)
    width = (hi - lo) / n
    out = []
    for phi in ranks:
        target = float(phi) * total
        r = int(np.searchsorted(cum, target, side="left"))      # first F[r] >= target
        r = min(max(r, 1), n)
        below, above = cum[r - 1], cum[r]
        frac = 0.5 if above <= below else (target - below) / (above - below)
        out.append(lo + width * (r - 1 + min(max(frac, 0.0), 1.0)))
    order = np.argsort(ranks, kind="stable")
    mono = np.maximum.accumulate(np.asarray(out)[order])
    values = np.empty(len(out))
    values[order] = mono
    return [float(v) for v in values], total


# ---- Beam -------------------------------------------------------------------------------

def _cells(table, keys, value_column, lo, hi, branching, levels):
    parts = []
    for level in range(1, levels + 1):
        cells = level_cells(table, keys, value_column, lo=lo, hi=hi, branching=branching, level=level)
        parts.append(cells.add_column(0, LEVEL_COLUMN, pa.array(np.full(cells.num_rows, level, np.int32))))
    out = pa.concat_tables(parts)
    cols = [LEVEL_COLUMN, *keys, BUCKET_COLUMN]
    return out.append_column(KEY_HASH_COLUMN, pa.array(hashing.hash_columns(out, cols), pa.uint64()))


def _keys_per_grid(per_key, max_rows=1 << 16):
    """Keys per table of :func:`zero_cells` (at most ``max_rows`` cells, one key at least)."""
    return max(1, max_rows // per_key)


def zero_cells(key_table, keys, branching, levels, max_rows=1 << 16, hashed=True):
    """Every (level, key, bucket) cell of the keys in ``key_table`` (distinct key tuples,
    the released key types) with count 0, in tables of at most ``max_rows`` rows (so each
    cell comes out of the sum once, with or without users; ``None``: one table); with the
    key hash ``__key`` of (level, keys..., bucket) unless not ``hashed``."""
    per_key = sum(branching ** l for l in range(1, levels + 1))
    level = np.concatenate([np.full(branching ** l, l, np.int32) for l in range(1, levels + 1)])
    bucket = np.concatenate([np.arange(branching ** l, dtype=np.int64) for l in range(1, levels + 1)])
    step = max(1, key_table.num_rows) if max_rows is None else _keys_per_grid(per_key, max_rows)
    for start in range(0, key_table.num_rows, step):
        chunk = key_table.slice(start, step)
        rep = chunk.take(pa.array(np.repeat(np.arange(chunk.num_rows), per_key)))
        cols = {LEVEL_COLUMN: pa.array(np.tile(level, chunk.num_rows))}
        cols.update({k: rep.column(k).combine_chunks() for k in keys})
        cols[BUCKET_COLUMN] = pa.array(np.tile(bucket, chunk.num_rows))
        cols["count"] = pa.array(np.zeros(per_key * chunk.num_rows, np.int64))
        table = pa.table(cols)
        if not hashed:
            yield table
            continue
        yield table.append_column(KEY_HASH_COLUMN, pa.array(
            hashing.hash_columns(table, [LEVEL_COLUMN, *keys, BUCKET_COLUMN]), pa.uint64()))


def _cell_texts(branching, levels):
    """(prefix, suffix): large_binary arrays with one entry per cell of one key, in
    :func:`zero_cells`' order (level 1's buckets, then level 2's, ...): the level's field
    of ``keyed_random.row_identity_array`` and its ``|`` (``<len>:<level>|``), and the
    bucket's field after its ``|`` (``|<len>:<bucket>``)."""
    prefix, suffix = [], []
    for level in range(1, levels + 1):
        text = str(level).encode()
        head = b"%d:%s|" % (len(text), text)
        for bucket in range(branching ** level):
            text = str(bucket).encode()
            prefix.append(head)
            suffix.append(b"|%d:%s" % (len(text), text))
    return pa.array(prefix, pa.large_binary()), pa.array(suffix, pa.large_binary())


def grid_identities(key_chunk, keys, branching, levels):
    """``keyed_random.row_identity_array(grid, [level, *keys, bucket])`` of the grid
    :func:`zero_cells` makes for the keys of ``key_chunk``, without making that grid:
    each cell's identity is its level's field, its key's fields (one
    ``row_identity_array`` per key, not per cell) and its bucket's field, joined by
    ``|`` -- the same bytes, from one take per part and one join."""
    import pyarrow.compute as pc  # heavy: pyarrow.compute
    prefix, suffix = _cell_texts(branching, levels)
    per_key = len(prefix)
    n = key_chunk.num_rows
    key_field = keyed_random.row_identity_array(key_chunk, list(keys))
    cell = pa.array(np.tile(np.arange(per_key, dtype=np.int64), n))
    return pc.binary_join_element_wise(
        prefix.take(cell), key_field.take(pa.array(np.repeat(np.arange(n, dtype=np.int64), per_key))),
        suffix.take(cell), pa.scalar(b"", pa.large_binary()))


_GRID_KEY_BYTES = 256    # grid_macs: longer key fields go through grid_identities


@functools.lru_cache(maxsize=8)
def _grid_layout(branching, levels):
    """(prefix bytes, prefix length, suffix bytes (cells, longest), suffix lengths) of
    :func:`_cell_texts`, as numpy arrays, or None when the prefixes differ in length
    (levels of two digits): what :func:`grid_macs` lays out."""
    from thresher.transforms.randomness import block_prf
    prefix, suffix = _cell_texts(branching, levels)
    pre_at, pre_data = block_prf.offsets_and_data(prefix)
    suf_at, suf_data = block_prf.offsets_and_data(suffix)
    pre_length, suf_length = np.diff(pre_at), np.diff(suf_at)
    if len(np.unique(pre_length)) != 1:
        return None
    length = int(pre_length[0])
    heads = pre_data[pre_at[:-1, None] + np.arange(length)]
    longest = int(suf_length.max())
    position = np.arange(longest)
    inside = position < suf_length[:, None]
    tails = np.zeros((len(suf_length), longest), dtype=np.uint8)
    tails[inside] = suf_data[(suf_at[:-1, None] + position)[inside]]
    return heads, length, tails, suf_length


def grid_macs(key_chunk, keys, branching, levels, mac_key, tag):
    """``block_prf.mac_bytes(grid_identities(key_chunk, ...), mac_key, tag)`` without
    making the identities (issue 43 round 8). A cell's message is its level's field, its
    key's fields and its bucket's field (:func:`grid_identities`); here each message is
    one zero-padded row of 64-bit words, the OR of three parts laid out once -- the
    level part (the same for every key), the key part (the same for every cell of a
    key) and the bucket part shifted past the key (the same for every key of one field
    length) -- and the prefix-free CBC-MAC runs over the rows a block position at a time
    (the header ``tag || length``, then the blocks), each cell's MAC being the state
    after its own last block. The same words as ``mac_bytes``: the same message bytes,
    zero-padded as it pads them. Key fields over ``_GRID_KEY_BYTES`` bytes, and levels
    whose fields differ in length, take the identities' route."""
    from thresher.transforms.randomness import block_prf
    layout = _grid_layout(branching, levels)
    key_field = keyed_random.row_identity_array(key_chunk, list(keys))
    key_at, key_data = block_prf.offsets_and_data(key_field)
    key_length = np.diff(key_at)
    if layout is None or key_chunk.num_rows == 0 or int(key_length.max()) > _GRID_KEY_BYTES:
        return block_prf.mac_bytes(grid_identities(key_chunk, keys, branching, levels),
                                   mac_key, tag)
    heads, head, tails, tail_length = layout
    n, per_key, block = key_chunk.num_rows, len(tails), block_prf.BLOCK
    # every cell runs through as many blocks as the chunk's longest message: keys whose
    # messages need fewer blocks go by themselves (one long key would make every key of
    # the chunk pay for it)
    blocks_of_key = -(-(head + key_length + tails.shape[1]) // block)
    if blocks_of_key.min() != blocks_of_key.max():
        out = np.empty((n, per_key, 2), dtype=block_prf.WORD)
        for count in np.unique(blocks_of_key):
            rows = np.flatnonzero(blocks_of_key == count)
            out[rows] = grid_macs(key_chunk.take(pa.array(rows)), keys, branching, levels,
                                  mac_key, tag).reshape(len(rows), per_key, 2)
        return out.reshape(n * per_key, 2)
    width = int(blocks_of_key[0]) * block
    level_part = np.zeros((per_key, width), dtype=np.uint8)
    level_part[:, :head] = heads
    level_words = level_part.view(block_prf.WORD)
    words = np.empty((n, per_key, width // 8), dtype=block_prf.WORD)
    for m in np.unique(key_length):              # the keys whose fields have m bytes
        m = int(m)
        of_length = np.flatnonzero(key_length == m)
        key_part = np.zeros((len(of_length), width), dtype=np.uint8)
        key_part[:, head:head + m] = key_data[key_at[of_length][:, None] + np.arange(m)]
        bucket_part = np.zeros((per_key, width), dtype=np.uint8)
        bucket_part[:, head + m:head + m + tails.shape[1]] = tails
        words[of_length] = (level_words | bucket_part.view(block_prf.WORD))[None] \
            | key_part.view(block_prf.WORD)[:, None, :]
    words = words.reshape(n * per_key, width // 8)
    total = (head + key_length[:, None] + tail_length[None, :]).reshape(-1)
    enc = block_prf.encryptor(mac_key)
    header = np.empty((int(total.max()) + 1, 2), dtype=np.uint64)
    header[:, 0] = block_prf.tag_word(tag)
    header[:, 1] = np.arange(len(header), dtype=np.uint64)
    state = np.take(block_prf.encrypt(enc, header), total, axis=0)
    blocks = (total + (block - 1)) // block
    out = np.empty_like(state)
    for j in range(width // block):
        state = block_prf.encrypt(enc, state ^ words[:, 2 * j:2 * j + 2])
        np.copyto(out, state, where=(blocks == j + 1)[:, None])
    return out


def key_tuples(key_table, keys):
    """The key tuples of a key table, in its row order."""
    return list(zip(*[key_table.column(k).to_pylist() for k in keys]))


def _codes(values, value_set):
    """Position of each of ``values`` in ``value_set`` (an arrow array of distinct values;
    nulls match nulls), -1 where absent."""
    import pyarrow.compute as pc
    idx = pc.index_in(values, value_set=value_set, skip_nulls=False)
    return idx.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def key_positions(table, keys, key_list):
    """For every row of ``table``, the position of its key tuple in ``key_list`` (distinct
    tuples), -1 when it is not there: per-column codes into each column's distinct listed
    values, combined column by column and densified (``np.unique``) so no code overflows."""
    n = table.num_rows
    if not keys:
        return np.zeros(n, np.int64) if len(key_list) else np.full(n, -1, np.int64)
    m = len(key_list)
    if len(keys) == 1:
        return _one_column_positions(table.column(keys[0]).combine_chunks(), key_list)
    row_code = np.zeros(n, np.int64)
    list_code = np.zeros(m, np.int64)
    missing = np.zeros(n, bool)
    for j, k in enumerate(keys):
        column = table.column(k).combine_chunks()
        listed = pa.array([kt[j] for kt in key_list], type=column.type)
        distinct = listed.unique()
        rc, lc = _codes(column, distinct), _codes(listed, distinct)
        missing |= rc < 0
        width = len(distinct)
        _, inverse = np.unique(np.concatenate([list_code * width + lc, row_code * width + rc]),
                               return_inverse=True)
        list_code, row_code = inverse[:m].astype(np.int64), inverse[m:].astype(np.int64)
    order = np.argsort(list_code, kind="stable")
    sorted_codes = list_code[order]
    at = np.clip(np.searchsorted(sorted_codes, row_code), 0, max(m - 1, 0))
    found = ~missing & (m > 0)
    if m:
        found &= sorted_codes[at] == row_code
    return np.where(found, order[at] if m else -1, -1).astype(np.int64)


def _one_column_positions(column, key_list):
    """:func:`key_positions` of one key column without the combining sort: a row's code
    into the listed values' distinct values gives the first listed position of its value
    (the position the combined codes' stable search finds), -1 where absent."""
    m = len(key_list)
    if m == 0:
        return np.full(len(column), -1, np.int64)
    listed = pa.array([kt[0] for kt in key_list], type=column.type)
    distinct = listed.unique()
    rc, lc = _codes(column, distinct), _codes(listed, distinct)
    first = np.full(len(distinct), m, np.int64)
    np.minimum.at(first, lc, np.arange(m, dtype=np.int64))
    return np.where(rc >= 0, first[np.maximum(rc, 0)], -1).astype(np.int64)


def dense_levels(released, keys, key_list, *, branching, levels):
    """The released cells as one (len(key_list), sum_l b**l) float64 matrix: row i holds
    key_list[i]'s levels 1..L side by side (level l's bucket j at sum_{m<l} b**m + j);
    cells not released (or of keys not listed) stay 0."""
    offsets = np.cumsum([0] + [branching ** l for l in range(1, levels + 1)])
    dense = np.zeros((len(key_list), int(offsets[-1])), dtype=np.float64)
    tables = [t for t in released if t.num_rows]
    if tables:
        table = pa.concat_tables(tables)
        lv = table.column(LEVEL_COLUMN).to_numpy().astype(np.int64)
        bk = table.column(BUCKET_COLUMN).to_numpy().astype(np.int64)
        ct = table.column("count").to_numpy()
        row = key_positions(table, keys, key_list)
        ok = (row >= 0) & (lv >= 1) & (lv <= levels)
        ok &= (bk >= 0) & (bk < np.diff(offsets)[np.clip(lv, 1, levels) - 1])
        dense[row[ok], offsets[lv[ok] - 1] + bk[ok]] = ct[ok]
    return dense, offsets


def answer(released, keys, key_list, ranks, *, lo, hi, branching, levels, floor):
    """Post-processing of every released cell: columns (keys..., rank, value) with one row
    per (key in ``key_list``, rank). The cells are placed with array operations
    (:func:`dense_levels`); each key's quantiles come from its row (:func:`answer_dense`)."""
    key_list = [tuple(kt) for kt in key_list]
    dense, offsets = dense_levels(released, keys, key_list, branching=branching, levels=levels)
    return answer_dense(dense, keys, key_list, ranks, lo=lo, hi=hi, branching=branching,
                        levels=levels, floor=floor)


def answer_dense(dense, keys, key_list, ranks, *, lo, hi, branching, levels, floor):
    """:func:`answer` from the released cells placed already (``dense``, one row per key
    of ``key_list``, :func:`dense_levels`' layout): the consistent leaves of every key at
    once (:func:`consistent_leaves`), then each key's quantiles from its row
    (:func:`leaf_quantiles`: one iteration per key, not per cell)."""
    offsets = np.cumsum([0] + [branching ** l for l in range(1, levels + 1)])
    leaf_width = (hi - lo) / branching ** levels   # every cell is released: the leaves inform
    values = []
    if len(key_list):
        leaves = consistent_leaves(dense, offsets, branching)
        for i in range(len(key_list)):      # one iteration per key, not per cell
            values.extend(leaf_quantiles(leaves[i], ranks, lo=lo, hi=hi, floor=floor)[0])
    n = len(ranks)
    out = {k: [kt[j] for kt in key_list for _ in range(n)] for j, k in enumerate(keys)}
    out["rank"] = [float(phi) for _ in key_list for phi in ranks]
    out["value"] = values
    out["resolution"] = [None if v is None else leaf_width for v in values]
    return out


class PublicCellLevels(beam.PTransform):
    """Per-(key, value) counts of the selected keys -> PCollection of Table(level, keys...,
    bucket, __key, count): every cell of every selected key exactly once, true counts
    (zeros included). ``key_table``: a one-element PCollection holding the table of the
    selected keys."""

    def __init__(self, keys, value_column, key_table, *, lo, hi, branching, levels,
                 num_shards, label=None):
        super().__init__(label)
        self._keys, self._column, self._key_table = list(keys), value_column, key_table
        self._lo, self._hi, self._b, self._levels = float(lo), float(hi), int(branching), int(levels)
        self._num_shards = int(num_shards)

    def expand(self, counts):
        from thresher.transforms.plumbing.aggregate import SumCountsPerKey
        cells = counts | "Cells" >> beam.Map(_cells, self._keys, self._column, self._lo, self._hi,
                                             self._b, self._levels).with_output_types(TABLE)
        zeros = self._key_table | "ZeroCells" >> beam.FlatMap(
            zero_cells, self._keys, self._b, self._levels).with_output_types(TABLE)
        return ((cells, zeros) | "FlattenCells" >> beam.Flatten()
                | "SumPerCell" >> SumCountsPerKey([LEVEL_COLUMN, *self._keys, BUCKET_COLUMN],
                                                  self._num_shards))


def _answer_table(columns, keys):
    return pa.table({**{k: columns[k] for k in keys},
                     "rank": pa.array(columns["rank"], pa.float64()),
                     "value": pa.array(columns["value"], pa.float64()),
                     "resolution": pa.array(columns["resolution"], pa.float64())})


def _data_cells(data_sums, keys, key_list, branching, levels):
    """(cell index, count) of the summed data cells, sorted by cell index: the index of
    (key_list[i], level l, bucket j) is i * sum_m b**m + sum_{m<l} b**m + j, the row of
    that cell in :func:`zero_cells`' tables taken end to end. (Before issue 43 round 7
    the release summed its data cells as Table(level, keys..., bucket, count) and placed
    them here; ``transforms.trees.bounded_cells`` now gives the indices themselves, and
    this stays as the tests' oracle of that layout.)"""
    offsets = np.cumsum([0] + [branching ** l for l in range(1, levels + 1)])
    tables = [t for t in data_sums if t.num_rows]
    if not tables:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    table = pa.concat_tables(tables)
    lv = table.column(LEVEL_COLUMN).to_numpy().astype(np.int64)
    bk = table.column(BUCKET_COLUMN).to_numpy().astype(np.int64)
    ct = table.column("count").to_numpy().astype(np.int64)
    row = key_positions(table, keys, key_list)
    ok = (row >= 0) & (lv >= 1) & (lv <= levels)
    ok &= (bk >= 0) & (bk < np.diff(offsets)[np.clip(lv, 1, levels) - 1])
    cell = row[ok] * int(offsets[-1]) + offsets[lv[ok] - 1] + bk[ok]
    order = np.argsort(cell, kind="stable")
    return cell[order], ct[ok][order]


CELL_COLUMN = "cell"    # Table(cell, count): a cell's index in _data_cells' layout


def indexed_cells(tables):
    """(cell indices, counts) of Table(cell, count) pieces (:func:`_data_cells`' index;
    ``transforms.trees.bounded_cells.shard_cells``), sorted by cell; a cell may come once
    per piece: the noise adds the pieces up per cell (``np.add.at``, exact int64)."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    cells = np.concatenate([t.column(CELL_COLUMN).to_numpy() for t in tables]).astype(np.int64)
    counts = np.concatenate([t.column("count").to_numpy() for t in tables]).astype(np.int64)
    order = np.argsort(cells, kind="stable")
    return cells[order], counts[order]


class _CellQuantilesFn(beam.DoFn):
    """The key table -> one Table(keys..., rank, value, resolution): for each chunk of
    keys, every cell of theirs (:func:`zero_cells`) with its true count (the data cells,
    Table(cell, count) pieces of :func:`indexed_cells`, a side input), the discrete
    Gaussian noise of ``NoisyDomainCounts`` (the same
    keyed stream per cell: it is identified by the cell's level, key and bucket, not by
    the batch it travels in), then :func:`answer`. The noisy cells of all the keys are
    never gathered in one place (issue 43 item 4: that was 4,368 cells per key through a
    shuffle and a ToList)."""

    def __init__(self, keys, params, ranks, bounds, shape, floor, rng_factory=None, stage=""):
        self._keys, self._params, self._ranks = list(keys), params, list(ranks)
        self._lo, self._hi = bounds
        self._b, self._levels = shape
        self._floor = floor
        self._rng_factory = rng_factory
        self._stage = stage

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, key_table, data_cells):
        keys = self._keys
        key_list = key_tuples(key_table, keys) if keys else [()] * key_table.num_rows
        per_key = sum(self._b ** l for l in range(1, self._levels + 1))
        cells, counts = indexed_cells(data_cells)
        direct = _direct_cells(key_table, keys, key_list)
        parts, start = [], 0
        step = _keys_per_grid(per_key)
        for begin in range(0, key_table.num_rows, step):
            chunk = key_table.slice(begin, step)
            n_keys = chunk.num_rows
            first = start * per_key
            a, z = np.searchsorted(cells, [first, first + n_keys * per_key])
            true = np.zeros(n_keys * per_key, np.int64)
            np.add.at(true, cells[a:z] - first, counts[a:z])
            chunk_keys = key_list[start:start + n_keys]
            if direct:
                columns = self._direct(chunk, chunk_keys, true)
            else:
                columns = self._gathered(chunk, chunk_keys, true)
            parts.append(_answer_table(columns, keys))
            start += n_keys
        if not parts:       # no key: the empty answer, as before
            parts.append(_answer_table(answer(
                [], keys, [], self._ranks, lo=self._lo, hi=self._hi, branching=self._b,
                levels=self._levels, floor=self._floor), keys))
        yield pa.concat_tables(parts)

    def _direct(self, chunk, chunk_keys, true):
        """One chunk of keys, the cells never made into a table: the MACs of the grid's
        rows' identities (:func:`grid_macs`), the noise of ``release_domain_table`` on
        the true counts in grid order, and the noisy counts placed by that order (row i
        of the chunk's dense levels is key i: the keys are distinct, :func:`_direct_cells`)."""
        rng = keyed_random.text_streams_of(
            self._rng_factory, self._rng, self._stage,
            lambda key, tag: grid_macs(chunk, self._keys, self._b, self._levels, key, tag))
        noisy, _ = noisy_domain_counts(true, self._params, rng)
        dense = noisy.reshape(len(chunk_keys), -1).astype(np.float64)
        return answer_dense(dense, self._keys, chunk_keys, self._ranks, lo=self._lo,
                            hi=self._hi, branching=self._b, levels=self._levels,
                            floor=self._floor)

    def _gathered(self, chunk, chunk_keys, true):
        """One chunk of keys through the grid table of :func:`zero_cells` (its rows'
        identity columns, ``release_domain_table``, :func:`answer`): any key types."""
        grid = next(zero_cells(chunk, self._keys, self._b, self._levels, max_rows=None,
                               hashed=False))
        grid = grid.set_column(grid.schema.get_field_index("count"), "count", pa.array(true))
        rng = keyed_random.table_streams(self._rng_factory, self._rng, self._stage, grid,
                                         identity_columns(grid))
        released = release_domain_table(grid, self._params, rng)
        return answer([released], self._keys, chunk_keys, self._ranks, lo=self._lo,
                      hi=self._hi, branching=self._b, levels=self._levels, floor=self._floor)


_DIRECT_TYPES = (pa.types.is_string, pa.types.is_large_string, pa.types.is_binary,
                 pa.types.is_large_binary, pa.types.is_integer, pa.types.is_boolean)


def _direct_cells(key_table, keys, key_list):
    """Whether :meth:`_CellQuantilesFn._direct` gives what the grid table gives: key
    columns whose values are equal exactly when Arrow's ``index_in`` matches them (strings,
    binaries, integers, booleans: no float's 0.0 == -0.0 or NaN), distinct key tuples (so
    ``key_positions`` places key i's cells in row i), and identity columns that are the
    grid's (level, keys..., bucket) -- no key column named like a value column."""
    if not keys or len(set(key_list)) != len(key_list):
        return False
    names = [LEVEL_COLUMN, *keys, BUCKET_COLUMN, "count"]
    if len(set(names)) != len(names) or \
            identity_columns(pa.schema([(n, pa.int64()) for n in names]).empty_table()) != names[:-1]:
        return False
    return all(any(is_type(key_table.schema.field(k).type) for is_type in _DIRECT_TYPES)
               for k in keys)


class PublicCellQuantiles(beam.PTransform):
    """Table(cell, count) pieces -> one Table(keys..., rank, value, resolution): the data
    cells of the keys of ``key_table`` (a one-element PCollection of the key table; each
    piece's cell indices are into that table's key order, :func:`_data_cells`' layout:
    ``transforms.trees.bounded_cells``), every cell noised as ``NoisyDomainCounts`` does
    (``rng_factory``: its stage), answered per key (:func:`answer`). Nothing is shuffled:
    the pieces reach the noise as one side input, and the zero cells are made where they
    are noised."""

    def __init__(self, keys, key_table, *, lo, hi, branching, levels, ranks, sigma, floor,
                 rng_factory=None, label=None):
        super().__init__(label)
        self._keys, self._key_table = list(keys), key_table
        self._lo, self._hi, self._b, self._levels = float(lo), float(hi), int(branching), int(levels)
        self._ranks, self._sigma, self._floor = list(ranks), sigma, floor
        self._rng_factory = rng_factory

    def expand(self, cells):
        fn = _CellQuantilesFn(self._keys, {"noise": "discrete_gaussian", "sigma": self._sigma},
                              self._ranks, (self._lo, self._hi), (self._b, self._levels),
                              self._floor, *keyed_random.stage_of(self._rng_factory))
        return self._key_table | "NoisyCellsAnswered" >> keyed_random.par_do(
            fn, beam.pvalue.AsList(cells)).with_output_types(TABLE)

"""public_cells.answer (array placement of the released cells, issue 43 item 4) against the
per-cell Python loop it replaced, kept here as the oracle: same output, exactly, on random
inputs and edge cases (keys not listed, listed keys with no cell, nulls in key columns,
several key columns of other types, no keys, nothing released)."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.transforms.trees import public_cells
from thresher.transforms.trees.heavy_hitters import LEVEL_COLUMN
from thresher.transforms.trees.quantiles import BUCKET_COLUMN


def _answer_oracle(released, keys, key_list, ranks, *, lo, hi, branching, levels, floor):
    """The implementation before issue 43 item 4 (a dict.setdefault per released cell)."""
    tables = [t for t in released if t.num_rows]
    by_key = {}
    if tables:
        table = pa.concat_tables(tables)
        lv = table.column(LEVEL_COLUMN).to_numpy()
        bk = table.column(BUCKET_COLUMN).to_numpy()
        ct = table.column("count").to_numpy()
        kts = list(zip(*[table.column(k).to_pylist() for k in keys])) if keys else [()] * table.num_rows
        for i, kt in enumerate(kts):
            by_key.setdefault(kt, []).append(i)
    out = {k: [] for k in keys}
    out["rank"], out["value"], out["resolution"] = [], [], []
    leaf_width = (hi - lo) / branching ** levels
    for kt in key_list:
        kt = tuple(kt)
        hist = [np.zeros(branching ** l) for l in range(1, levels + 1)]
        if kt in by_key:
            idx = np.asarray(by_key[kt])
            for l in range(1, levels + 1):
                sel = idx[lv[idx] == l]
                hist[l - 1][bk[sel]] = ct[sel]
        values, _ = public_cells.key_quantiles(hist, ranks, lo=lo, hi=hi, branching=branching,
                                               floor=floor)
        for phi, v in zip(ranks, values):
            for k, x in zip(keys, kt):
                out[k].append(x)
            out["rank"].append(float(phi))
            out["value"].append(v)
            out["resolution"].append(None if v is None else leaf_width)
    return out


def _released(rng, cell_keys, keys, types, branching, levels, *, chunks=3, sigma=4.0, keep=0.9):
    """Every cell of ``cell_keys`` (tuples) with noisy counts, a random ``keep`` share of
    them, shuffled, split into ``chunks`` tables."""
    rows = []
    for kt in cell_keys:
        centre = rng.uniform(0, 1)
        for l in range(1, levels + 1):
            n = branching ** l
            mass = rng.poisson(40 * np.exp(-((np.arange(n) / n - centre) ** 2) * 30) / n * 8)
            for b in range(n):
                if rng.uniform() < keep:
                    rows.append((l, kt, b, int(mass[b] + np.round(rng.normal(0, sigma)))))
    order = rng.permutation(len(rows))
    rows = [rows[i] for i in order]
    cols = {LEVEL_COLUMN: pa.array([r[0] for r in rows], pa.int32())}
    for j, k in enumerate(keys):
        cols[k] = pa.array([r[1][j] for r in rows], types[j])
    cols[BUCKET_COLUMN] = pa.array([r[2] for r in rows], pa.int64())
    cols["count"] = pa.array([r[3] for r in rows], pa.int64())
    table = pa.table(cols)
    cuts = sorted(rng.choice(np.arange(table.num_rows + 1), chunks - 1)) if table.num_rows else []
    bounds = [0, *cuts, table.num_rows]
    return [table.slice(a, b - a) for a, b in zip(bounds[:-1], bounds[1:])]


def _same(got, want):
    assert got.keys() == want.keys()
    for name in want:
        assert got[name] == want[name], name   # exact: floats compared bit for bit via ==


@pytest.mark.parametrize("seed", range(6))
def test_answer_matches_the_per_cell_loop(seed):
    rng = np.random.default_rng(seed)
    branching, levels = [(2, 3), (4, 2), (16, 2), (3, 4), (4, 3), (2, 1)][seed]
    keys = ["word"] if seed % 2 else ["word", "n"]
    types = [pa.string()] if seed % 2 else [pa.large_string(), pa.int32()]
    pool = [("a",), ("b",), (None,), ("é",), ("",), ("zz",), ("c",)]
    if len(keys) == 2:
        pool = [(w, n) for (w,) in pool for n in (1, 2, None)]
    idx = rng.permutation(len(pool))
    listed = [pool[i] for i in idx[: len(pool) // 2 + 1]]
    with_cells = [pool[i] for i in idx[2:]]          # some listed keys have none, some unlisted do
    released = _released(rng, with_cells, keys, types, branching, levels)
    ranks = [0.9, 0.1, 0.5, 0.25]
    for floor in (0.0, 12.0, 1e9):
        kwargs = dict(lo=-5.0, hi=1000.0, branching=branching, levels=levels, floor=floor)
        _same(public_cells.answer(released, keys, listed, ranks, **kwargs),
              _answer_oracle(released, keys, listed, ranks, **kwargs))


def test_answer_without_keys_and_empty_inputs():
    rng = np.random.default_rng(11)
    kwargs = dict(lo=0.0, hi=1.0, branching=4, levels=3, floor=1.0)
    released = _released(rng, [()], [], [], 4, 3)
    for rel in (released, [], [t.slice(0, 0) for t in released]):
        _same(public_cells.answer(rel, [], [()], [0.5, 0.75], **kwargs),
              _answer_oracle(rel, [], [()], [0.5, 0.75], **kwargs))
    keyed = _released(rng, [("a",)], ["w"], [pa.string()], 4, 3)
    for key_list in ([], [("b",)], [("a",), ("b",)]):
        _same(public_cells.answer(keyed, ["w"], key_list, [0.5], **kwargs),
              _answer_oracle(keyed, ["w"], key_list, [0.5], **kwargs))


def test_key_positions_match_a_dict():
    rng = np.random.default_rng(5)
    a = rng.integers(0, 30, 500)
    b = rng.integers(0, 4, 500)
    table = pa.table({"a": pa.array(a, pa.int64()), "b": pa.array([str(x) for x in b])})
    key_list = sorted({(int(x), str(y)) for x, y in zip(rng.integers(0, 40, 80), rng.integers(0, 5, 80))})
    where = {kt: i for i, kt in enumerate(key_list)}
    want = [where.get((int(x), str(y)), -1) for x, y in zip(a, b)]
    assert public_cells.key_positions(table, ["a", "b"], key_list).tolist() == want

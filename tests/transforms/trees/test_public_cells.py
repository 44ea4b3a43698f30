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


_OUT = {}     # the pipelines' outputs, by name (Beam's in-process runner: this process)


def _keep(table, name):
    _OUT.setdefault(name, []).append(table)


def _old_release(counts, key_table, kw, sigma, floor, ranks, draws):
    """The wiring before issue 43 item 4: every cell (zeros included) shuffled and summed,
    NoisyDomainCounts, all the noisy cells gathered, then answer."""
    import apache_beam as beam  # heavy: apache_beam
    from thresher.transforms.selection.public_domain import NoisyDomainCounts  # heavy: apache_beam
    key_list = beam.pvalue.AsSingleton(
        key_table | "KeyList" >> beam.Map(public_cells.key_tuples, ["word"]))

    def finish(released, key_list):
        yield public_cells._answer_table(public_cells.answer(
            released, ["word"], key_list, ranks, lo=kw["lo"], hi=kw["hi"],
            branching=kw["branching"], levels=kw["levels"], floor=floor), ["word"])
    return (counts
            | "CellLevels" >> public_cells.PublicCellLevels(["word"], "x", key_table, num_shards=3, **kw)
            | "NoisyCells" >> NoisyDomainCounts({"noise": "discrete_gaussian", "sigma": sigma},
                                                draws.child("NoisyCells"))
            | "GatherCells" >> beam.combiners.ToList()
            | "Quantiles" >> beam.FlatMap(finish, key_list))


def test_fused_release_draws_and_answers_as_the_gathered_cells():
    """PublicCellQuantiles (zero cells made, noised and answered per chunk of keys) publishes
    exactly what the old wiring did under one secret: same keyed draw per cell, same answer.
    Keys: more than one chunk of zero cells (max_rows // cells per key keys each), a key
    with no data, data of a key not selected."""
    import apache_beam as beam  # heavy: apache_beam
    from thresher.transforms.randomness import keyed_random
    rng = np.random.default_rng(3)
    words = [f"w{i:03d}" for i in range(40)]
    n = 6000
    counts = pa.table({"word": pa.array(rng.choice(words + ["other"], n)),
                       "x": pa.array(rng.lognormal(3, 1.5, n)),
                       "count": pa.array(rng.integers(1, 4, n), pa.int64())})
    keys = pa.table({"word": pa.array(words + ["zzz"])})      # zzz: no data
    kw = dict(lo=0.0, hi=500.0, branching=8, levels=4)        # 4,680 cells per key: 14 keys a chunk
    sigma, floor, ranks = 3.5, 10.0, [0.5, 0.1, 0.9]
    _OUT.clear()
    for name in ("old", "new"):
        draws = keyed_random.KeyedDraws(keyed_random.KeyedSource(b"public cells test secret"))
        with beam.Pipeline() as p:
            rows = p | "Counts" >> beam.Create([counts.slice(0, 2500), counts.slice(2500)])
            key_table = p | "Keys" >> beam.Create([keys])
            if name == "old":
                out = _old_release(rows, key_table, kw, sigma, floor, ranks, draws)
            else:      # the cells of each piece of counts (bounded_cells), then the noise
                from thresher.transforms.trees.bounded_cells import shard_cells
                key_list = beam.pvalue.AsSingleton(
                    key_table | "KeyList" >> beam.Map(public_cells.key_tuples, ["word"]))
                out = (rows
                       | "Cells" >> beam.Map(lambda t, kl: shard_cells(
                           t, ["word"], "x", kl, count_column="count", **kw), key_list)
                       | public_cells.PublicCellQuantiles(
                           ["word"], key_table, ranks=ranks, sigma=sigma, floor=floor,
                           rng_factory=draws.child("NoisyCells"), **kw))
            _ = out | beam.Map(_keep, name)
    old, new = (pa.concat_tables(_OUT[k]) for k in ("old", "new"))
    assert new.num_rows == len(ranks) * keys.num_rows
    assert new.equals(old)
    assert new.column("value").null_count < new.num_rows      # some keys answered


# ---- the direct path of _CellQuantilesFn (issue 43, quant5) ------------------------------
# The cells of a chunk of keys are no longer made into a grid table: their identities are
# built from per-key and per-cell parts (grid_identities), the noise is drawn on the counts
# in grid order and placed by that order, and every key's consistent tree is computed at
# once (consistent_leaves). Each piece against what it replaced, exactly.

_KEY_TABLES = {
    "string": (["w"], pa.table({"w": pa.array(["a", "héllo", "x" * 40, "", "k1", "k22"])})),
    "null key": (["w"], pa.table({"w": pa.array(["a", None, "b"])})),
    "int and string": (["n", "w"], pa.table({"n": pa.array([-3, 0, 7, 12345678901], pa.int64()),
                                             "w": pa.array(["a", "a", None, "zz"])})),
    "int32": (["n"], pa.table({"n": pa.array([5, -1, 0], pa.int32())})),
}


@pytest.mark.parametrize("name", sorted(_KEY_TABLES))
@pytest.mark.parametrize("branching,levels", [(16, 3), (2, 5), (10, 2), (3, 1)])
def test_grid_identities_are_the_grid_tables_row_identities(name, branching, levels):
    from thresher.transforms.randomness import keyed_random
    from thresher.transforms.selection.release_fn import identity_columns
    keys, table = _KEY_TABLES[name]
    grid = next(public_cells.zero_cells(table, keys, branching, levels, max_rows=None,
                                        hashed=False))
    want = keyed_random.row_identity_array(grid, identity_columns(grid))
    assert public_cells.grid_identities(table, keys, branching, levels).equals(want)


@pytest.mark.parametrize("name", sorted(_KEY_TABLES) + ["long key", "many lengths"])
@pytest.mark.parametrize("branching,levels", [(16, 3), (2, 5), (10, 2), (3, 1), (2, 11)])
def test_grid_macs_are_the_macs_of_the_grid_identities(name, branching, levels):
    """grid_macs (issue 43 round 8: the messages laid out as words, never made into
    identities) gives the words mac_bytes gives on grid_identities, for every key type,
    keys of many lengths in one chunk, a key over _GRID_KEY_BYTES (the identities'
    route) and levels of two digits (prefixes of two lengths: that route too)."""
    from thresher.transforms.randomness import block_prf
    if name == "long key":
        keys, table = ["w"], pa.table({"w": ["a", "é" * 200, "b"]})
    elif name == "many lengths":
        keys, table = ["w"], pa.table({"w": ["x" * i for i in range(0, 60, 3)]})
    else:
        keys, table = _KEY_TABLES[name]
    key, tag = bytes(range(32)), b"thr:txt\x00"
    want = block_prf.mac_bytes(public_cells.grid_identities(table, keys, branching, levels),
                               key, tag)
    got = public_cells.grid_macs(table, keys, branching, levels, key, tag)
    assert got.dtype == np.uint64 and got.tobytes() == want.tobytes()


def test_grid_macs_of_a_long_key_cost_the_short_keys_nothing(monkeypatch):
    """One long key in a chunk of short ones (review of round 8: every cell ran through
    as many blocks as the longest message, 7x the time): the blocks encrypted for the
    mixed chunk are those for its short keys alone plus those for the long key alone,
    and the MACs are the same."""
    from thresher.transforms.randomness import block_prf
    encrypted = []
    encrypt = block_prf.encrypt

    def counting(enc, words):
        encrypted.append(len(words))
        return encrypt(enc, words)

    monkeypatch.setattr(block_prf, "encrypt", counting)
    key, tag = bytes(range(32)), b"thr:txt\x00"
    short = [f"k{i}" for i in range(20)]
    mixed = pa.table({"w": short[:10] + ["L" * 200] + short[10:]})

    def blocks(table):
        encrypted.clear()
        macs = public_cells.grid_macs(table, ["w"], 4, 2, key, tag)
        return sum(encrypted), macs

    alone = blocks(pa.table({"w": short}))[0] + blocks(pa.table({"w": ["L" * 200]}))[0]
    together, macs = blocks(mixed)
    assert together <= alone, (together, alone)
    monkeypatch.setattr(block_prf, "encrypt", encrypt)
    want = block_prf.mac_bytes(public_cells.grid_identities(mixed, ["w"], 4, 2), key, tag)
    assert macs.tobytes() == want.tobytes()


def test_direct_cells_never_make_the_grid_identities(monkeypatch):
    """The noise of the direct path MACs the cells without making their identities
    (issue 43 round 8: ~7.9 million joined strings at 1e7 rows); fails on the code
    before, which joined them (grid_identities) for every chunk of keys."""
    keys, table = _KEY_TABLES["string"]
    made = []
    identities = public_cells.grid_identities
    monkeypatch.setattr(public_cells, "grid_identities",
                        lambda *a, **k: made.append(1) or identities(*a, **k))
    fn = _cell_fn(keys, [0.5], (4, 3))
    out = list(fn.process(table, []))
    assert out and out[0].num_rows == table.num_rows and made == []


@pytest.mark.parametrize("branching,levels", [(16, 3), (2, 6), (5, 2), (4, 1)])
def test_consistent_leaves_are_each_keys_consistent_tree_bit_for_bit(branching, levels):
    rng = np.random.default_rng(branching * 10 + levels)
    offsets = np.cumsum([0] + [branching ** l for l in range(1, levels + 1)])
    for scale in (1.0, 49.5, 1e6):
        dense = np.round(rng.normal(0, scale, (23, int(offsets[-1]))))
        dense[3] = 0.0
        dense[4] = rng.normal(0, scale, int(offsets[-1]))        # not integers
        got = public_cells.consistent_leaves(dense, offsets, branching)
        for i in range(len(dense)):
            want, _ = public_cells.consistent_tree(
                [dense[i, offsets[l]:offsets[l + 1]] for l in range(levels)], branching)
            assert got[i].tobytes() == want.tobytes()


def _as_cells(sums, keys, key_list, branching, levels):
    """Summed data cells Table(level, keys..., bucket, count) as the Table(cell, count)
    pieces _CellQuantilesFn reads (the layout of public_cells._data_cells)."""
    cells, counts = public_cells._data_cells(sums, keys, key_list, branching, levels)
    return [pa.table({public_cells.CELL_COLUMN: pa.array(cells, pa.int64()),
                      "count": pa.array(counts, pa.int64())})]


def _cell_fn(keys, ranks, shape, secret=b"quant5 direct cells secret"):
    from thresher.transforms.randomness import keyed_random
    fn = public_cells._CellQuantilesFn(
        keys, {"noise": "discrete_gaussian", "sigma": 3.5}, ranks, (0.0, 100.0), shape, 8.0,
        keyed_random.KeyedSource(secret), "Release/NoisyCells")
    fn.setup()
    return fn


@pytest.mark.parametrize("name", sorted(_KEY_TABLES))
def test_direct_cells_publish_what_the_grid_table_did(name, monkeypatch):
    """_CellQuantilesFn on random data sums: the direct path (forced on by the key types)
    against the grid-table path it replaced (forced by _direct_cells returning False),
    under one secret: the same table, value for value; one key with no data."""
    keys, table = _KEY_TABLES[name]
    rng = np.random.default_rng(len(name))
    branching, levels = 4, 4                   # 340 cells a key: 192 keys a chunk
    big = table
    key_list = public_cells.key_tuples(big, keys)
    assert public_cells._direct_cells(big, keys, key_list)
    rows = []
    for kt in key_list[:-1]:                   # the last key: no data
        for level in range(1, levels + 1):
            for bucket in rng.choice(branching ** level, min(6, branching ** level), replace=False):
                rows.append((level, kt, int(bucket), int(rng.integers(1, 60))))
    data = {LEVEL_COLUMN: pa.array([r[0] for r in rows], pa.int32())}
    for j, k in enumerate(keys):
        data[k] = pa.array([r[1][j] for r in rows], table.schema.field(k).type)
    data[BUCKET_COLUMN] = pa.array([r[2] for r in rows], pa.int64())
    data["count"] = pa.array([r[3] for r in rows], pa.int64())
    sums = _as_cells([pa.table(data)], keys, key_list, branching, levels)
    ranks = [0.5, 0.1, 0.9]
    direct = next(_cell_fn(keys, ranks, (branching, levels)).process(big, sums))
    monkeypatch.setattr(public_cells, "_direct_cells", lambda *a: False)
    gathered = next(_cell_fn(keys, ranks, (branching, levels)).process(big, sums))
    assert direct.equals(gathered)
    assert direct.column("value").null_count < direct.num_rows


def test_direct_cells_over_many_chunks_and_the_refused_cases(monkeypatch):
    """More keys than one chunk holds (4,368 cells a key: 15 keys a chunk), the same table
    both ways; and the cases the direct path leaves to the grid table: float keys, a
    key listed twice, a key column named like a value column."""
    rng = np.random.default_rng(7)
    words = [f"w{i:03d}" for i in range(40)]
    table = pa.table({"w": pa.array(words)})
    sums = [pa.table({LEVEL_COLUMN: pa.array(np.full(300, 3), pa.int32()),
                      "w": pa.array(rng.choice(words, 300)),
                      BUCKET_COLUMN: pa.array(rng.integers(0, 4096, 300), pa.int64()),
                      "count": pa.array(rng.integers(1, 50, 300), pa.int64())})]
    sums = _as_cells(sums, ["w"], public_cells.key_tuples(table, ["w"]), 16, 3)
    direct = next(_cell_fn(["w"], [0.25, 0.5], (16, 3)).process(table, sums))
    with monkeypatch.context() as m:
        m.setattr(public_cells, "_direct_cells", lambda *a: False)
        gathered = next(_cell_fn(["w"], [0.25, 0.5], (16, 3)).process(table, sums))
    assert direct.equals(gathered)
    refused = [(["x"], pa.table({"x": pa.array([0.0, -0.0])})),
               (["w"], pa.table({"w": pa.array(["a", "a"])})),
               (["count"], pa.table({"count": pa.array(["a", "b"])})),
               (["__w"], pa.table({"__w": pa.array(["a", "b"])}))]
    for keys, t in refused:
        assert not public_cells._direct_cells(t, keys, public_cells.key_tuples(t, keys))


@pytest.mark.parametrize("arrow_type", [pa.string(), pa.int64(), pa.float64()])
def test_one_key_column_positions_are_the_combined_codes_positions(arrow_type):
    """key_positions of one key column (no combining sort) against the combining path it
    skips (the same column listed twice: a two-column key of equal halves), on keys with
    nulls, values not listed, a value listed twice (the first position) and -0.0."""
    rng = np.random.default_rng(17)
    for trial in range(20):
        pool = [None, 0, 1, 2, 3, 5, 8, 13, 21, 34]
        values = [pool[i] for i in rng.integers(0, len(pool), 300)]
        listed = [pool[i] for i in rng.integers(0, len(pool), int(rng.integers(0, 8)))]
        cast = (lambda v: None if v is None else str(v)) if arrow_type == pa.string() else (
            (lambda v: None if v is None else float(v)) if arrow_type == pa.float64() else
            (lambda v: v))
        values, listed = [cast(v) for v in values], [cast(v) for v in listed]
        if arrow_type == pa.float64() and trial % 2:
            values = [-0.0 if v == 0.0 else v for v in values]
        table = pa.table({"a": pa.array(values, arrow_type), "b": pa.array(values, arrow_type)})
        one = public_cells.key_positions(table, ["a"], [(v,) for v in listed])
        two = public_cells.key_positions(table, ["a", "b"], [(v, v) for v in listed])
        assert one.tolist() == two.tolist()

"""``transforms.trees.bounded_cells``: the true counts of per-key quantiles' public cells
made in each user shard from its bounded rows (issue 43 round 7) are the counts the old
wiring made -- ``BoundKeyValues``, the kind's numeric check, the restriction to the
selected keys, the users per (key, value) summed by a shuffle, their (level, key,
bucket) cells summed by a second shuffle, placed by ``public_cells._data_cells`` --
exactly, cell for cell, under one secret. The noise reads nothing else of the data, so
equal counts are equal published bytes. Deterministic: fixed secret, fixed numpy seeds.

Cases: one string key, two keys (string, int), a float key with -0.0 beside a selected
0.0 (Python's equality keeps both rows, Arrow's bitwise placement one), values outside
the domain and +-inf, selected keys without data, data of keys not selected, a key
selected by several user shards."""
import numpy as np
import pyarrow as pa
import pytest

from thresher.transforms.randomness import hashing, keyed_random
from thresher.transforms.trees import bounded_cells, public_cells
from thresher.transforms.trees.heavy_hitters import LEVEL_COLUMN
from thresher.transforms.trees.quantiles import BUCKET_COLUMN
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, exact_users

SECRET = b"test-only secret: bounded cells against the value-level counts"
LO, HI = -10.0, 250.0
_OUT = {}     # the pipelines' outputs (Beam's in-process runner: this process)


def _keep(element, name):
    _OUT.setdefault(name, []).append(element)


def _key_column(kind, rng, n):
    if kind == "string":
        return pa.array(np.char.add("k", rng.integers(0, 30, n).astype(str)).astype(object))
    if kind == "int":
        return pa.array(rng.integers(-2, 3, n), pa.int64())
    values = rng.integers(-3, 4, n).astype(np.float64) / 2.0
    values[rng.uniform(size=n) < 0.2] = -0.0
    return pa.array(values)


def _shards(seed, kinds, shards=3):
    """User-shard tables as ShardByUser hands them on (``__user`` words, ``__key`` the
    hash of the keys and the value), each user in one shard."""
    rng = np.random.default_rng(seed)
    out = []
    for s in range(shards):
        n = int(rng.integers(200, 1500))
        u = rng.integers(0, 80, n) * shards + s
        cols = {"__user": pa.array(u.astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)),
                "__user_lo": pa.array((u % 7).astype(np.uint64))}
        for j, kind in enumerate(kinds):
            cols[f"k{j}"] = _key_column(kind, rng, n)
        x = np.round(rng.lognormal(3.5, 1.2, n), 1) - 5.0
        x[rng.uniform(size=n) < 0.02] = np.inf
        x[rng.uniform(size=n) < 0.02] = -np.inf
        cols["x"] = pa.array(x)
        table = pa.table(cols)
        names = [f"k{j}" for j in range(len(kinds))] + ["x"]
        table = table.append_column(KEY_HASH_COLUMN, pa.array(
            hashing.hash_columns(table, names), pa.uint64()))
        out.append(exact_users(table))
    return out


def _key_table(kinds, shards, seed):
    """Some keys of the data (not all), and one key without data."""
    rng = np.random.default_rng(seed + 1000)
    keys = [f"k{j}" for j in range(len(kinds))]
    seen = pa.concat_tables([t.select(keys) for t in shards])
    distinct = seen.group_by(keys, use_threads=False).aggregate([])
    pick = np.sort(rng.choice(distinct.num_rows, max(1, distinct.num_rows // 2), replace=False))
    table = distinct.select(keys).take(pa.array(pick))
    extra = {k: pa.array([{"string": "no-data", "int": 99, "float": 7.25}[kind]],
                         table.schema.field(k).type) for k, kind in zip(keys, kinds)}
    table = pa.concat_tables([table, pa.table(extra)])
    if "float" in kinds:       # a selected 0.0: the data's -0.0 rows are not its cells
        j = kinds.index("float")
        zero = {k: table.column(k).slice(0, 1) for k in keys}
        zero[keys[j]] = pa.array([0.0])
        table = pa.concat_tables([table, pa.table(zero)])
        table = table.group_by(keys, use_threads=False).aggregate([]).select(keys)
    return table


def _cells_of(tables):
    """{cell: count} of Table(cell, count) pieces, a cell's pieces added up."""
    cells, counts = public_cells.indexed_cells(tables)
    out = {}
    for c, n in zip(cells.tolist(), counts.tolist()):
        out[c] = out.get(c, 0) + n
    return out


def _run(shards, keys, key_table, bound, branching, levels, old):
    import apache_beam as beam  # heavy: apache_beam
    from thresher.pipelines.kinds.quantiles import _numeric, _restrict_to
    from thresher.transforms.bounding.key_value_bound import BoundKeyValues
    from thresher.transforms.plumbing.aggregate import SumCountsPerKey
    draws = keyed_random.KeyedDraws(keyed_random.KeyedSource(SECRET)).child("Release")
    name = "old" if old else "new"
    _OUT.pop(name, None)
    with beam.Pipeline() as p:
        users = p | "Shards" >> beam.Create(shards)
        table = p | "Keys" >> beam.Create([key_table])
        key_list = beam.pvalue.AsSingleton(
            table | "KeyList" >> beam.Map(public_cells.key_tuples, keys))
        if old:     # the wiring before issue 43 round 7
            sums = (users
                    | BoundKeyValues(keys, "x", bound,
                                     rng_factory=draws.child("BoundKeyValues"))
                    | "Numeric" >> beam.Map(_numeric, "x")
                    | "Only" >> beam.FlatMap(_restrict_to, keys, key_list)
                    | "PerValue" >> SumCountsPerKey(keys + ["x"], 3)
                    | "Cells" >> beam.Map(public_cells._cells, keys, "x", LO, HI, branching,
                                          levels)
                    | "PerCell" >> SumCountsPerKey([LEVEL_COLUMN, *keys, BUCKET_COLUMN], 3))
            out = (sums
                   | "All" >> beam.combiners.ToList()
                   | "Place" >> beam.Map(lambda t, kl: _as_pieces(
                       public_cells._data_cells(t, keys, kl, branching, levels)), key_list))
        else:
            out = (users
                   | bounded_cells.BoundedCells(
                       keys, "x", bound, key_list, lo=LO, hi=HI, branching=branching,
                       levels=levels, numeric=_numeric, rng_factory=draws.child("BoundKeyValues"))
                   | "All" >> beam.combiners.ToList())
        _ = out | beam.Map(_keep, name)
    return _cells_of(_OUT[name][0])


def _as_pieces(cells_counts):
    cells, counts = cells_counts
    return [pa.table({public_cells.CELL_COLUMN: pa.array(cells, pa.int64()),
                      "count": pa.array(counts, pa.int64())})]


@pytest.mark.parametrize("kinds,branching,levels,bound", [
    (("string",), 4, 3, 2),
    (("string", "int"), 16, 2, 3),
    (("float",), 3, 4, 1),
    (("int", "float"), 2, 5, 4),
])
def test_bounded_cells_are_the_value_level_counts_cells(kinds, branching, levels, bound):
    keys = [f"k{j}" for j in range(len(kinds))]
    seed = len(kinds) * 10 + branching
    shards = _shards(seed, list(kinds))
    key_table = _key_table(list(kinds), shards, seed)
    new = _run(shards, keys, key_table, bound, branching, levels, old=False)
    old = _run(shards, keys, key_table, bound, branching, levels, old=True)
    assert new == old
    assert sum(new.values()) > 0
    per_key = int(bounded_cells.level_offsets(branching, levels)[-1])
    assert max(new) < key_table.num_rows * per_key


def test_shard_cells_weights_are_the_repeated_rows():
    """``count_column``: a row of count n is n rows of count 1 (counts per (key, value)
    given as rows); rows of keys not listed hit no cell; an empty table gives none."""
    rng = np.random.default_rng(4)
    n = 400
    table = pa.table({"w": pa.array(rng.choice(["a", "b", "c", "d"], n)),
                      "x": pa.array(rng.uniform(-5, 60, n)),
                      "count": pa.array(rng.integers(1, 5, n), pa.int64())})
    key_list = [("c",), ("a",), ("zz",)]
    kw = dict(lo=0.0, hi=50.0, branching=3, levels=3)
    weighted = bounded_cells.shard_cells(table, ["w"], "x", key_list, count_column="count", **kw)
    repeated = table.take(pa.array(np.repeat(np.arange(n), table.column("count").to_numpy())))
    plain = bounded_cells.shard_cells(repeated, ["w"], "x", key_list, **kw)
    assert weighted.equals(plain)
    assert weighted.column("count").to_numpy().sum() == 3 * sum(
        c for w, c in zip(table.column("w").to_pylist(), table.column("count").to_pylist())
        if w in ("a", "c"))
    empty = bounded_cells.shard_cells(table.slice(0, 0), ["w"], "x", key_list, **kw)
    assert empty.num_rows == 0 and empty.schema == plain.schema

"""prereduce.distinct_pair_rows' grouping (the automatic bound's pre-reduction, issue 43):
the value-sort kernel ``first_rows_of_triples`` against the stable lexsort it replaced
(``first_rows_by_lexsort``, kept as its oracle and fallback)."""
import numpy as np
import pytest

from thresher.transforms.bounding import prereduce


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("hash_bits", [None, 3])
def test_first_rows_of_triples_are_the_lexsort_rows(seed, hash_bits):
    """The value-sort grouping of distinct_pair_rows (issue 43) against the stable lexsort
    it replaced (kept as first_rows_by_lexsort): the same rows, on duplicated pairs, users
    sharing their hash word (told apart by the low word), uint64 key hashes and int64
    exact key codes; with hash_bits = 3 nearly every group holds different triples, so the
    exact fallback is the path taken."""
    rng = np.random.default_rng(seed)
    n = 20000
    user = rng.integers(0, 3000, n)
    words = (user // 2).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)   # pairs share a word
    low = (user % 2).astype(np.uint64)
    for keys in (rng.integers(0, 400, n).astype(np.uint64) * np.uint64(0xD1B54A32D192ED03),
                 rng.integers(0, 400, n).astype(np.int64)):
        want = prereduce.first_rows_by_lexsort(words, low, keys)
        got = prereduce.first_rows_of_triples(words, low, keys, hash_bits=hash_bits)
        assert got.dtype == np.int64 and np.array_equal(got, want)
        assert len(want) < n    # duplicates were dropped
    for m in (0, 1):
        assert np.array_equal(prereduce.first_rows_of_triples(words[:m], low[:m], keys[:m]),
                              prereduce.first_rows_by_lexsort(words[:m], low[:m], keys[:m]))


def _table_wide_distinct_pair_rows(table, key_columns):
    """distinct_pair_rows as it chose before (issue 43, round 6): the table-wide
    key_hash_is_exact, else exact key codes (the oracle of the check read off the
    grouping)."""
    from thresher.transforms.bounding.per_user_bound import exact_key_codes, key_hash_is_exact
    words = table.column("__user").to_numpy()
    low = table.column("__user_lo").to_numpy()
    if key_hash_is_exact(table, key_columns):
        keys = table.column("__key").to_numpy()
    else:
        keys = exact_key_codes(table, key_columns)
    return prereduce.first_rows_by_lexsort(words, low, keys)


@pytest.mark.parametrize("seed", range(30))
def test_distinct_pair_rows_with_the_check_on_its_repeats_keeps_the_same_rows(seed):
    """The collision check read off the grouping's repeated rows gives the rows of the
    table-wide check: on string, integer, two-column, null-holding and float keys, with a
    hash collision planted between two keys of one user, of two users, or none, users
    sharing their word 0, and ``hash_bits`` forcing the lexsort fallback. Deterministic."""
    import pyarrow as pa
    rng = np.random.default_rng(2000 + seed)
    n = int(rng.integers(2, 3000))
    user = rng.integers(0, int(rng.integers(1, 200)), n)
    values = rng.integers(0, int(rng.integers(1, 60)), n)
    kind = seed % 5
    if kind == 0:
        keys = {"word": pa.array([f"w{v}" for v in values], pa.string())}
    elif kind == 1:
        keys = {"n": pa.array(values, pa.int64())}
    elif kind == 2:
        keys = {"word": pa.array([f"w{v}" for v in values], pa.string()),
                "n": pa.array(rng.integers(0, 3, n), pa.int64())}
    elif kind == 3:
        keys = {"word": pa.array([None if v == 0 else f"w{v}" for v in values], pa.string())}
    else:
        keys = {"x": pa.array(np.where(values == 0, -0.0, values - 1.0))}
    table = pa.table(keys)
    tuples = list(zip(*[table.column(c).to_pylist() for c in keys]))
    codes = {t: i for i, t in enumerate(dict.fromkeys(tuples))}
    hashes = np.array([codes[t] for t in tuples], dtype=np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    how = seed % 3
    if how:   # a key takes another key's hash: of the same user (1) or of anyone (2)
        a = int(rng.integers(0, n))
        pool = (user == user[a]) if how == 1 else np.ones(n, dtype=bool)
        other = np.flatnonzero(pool & (hashes != hashes[a]))
        if len(other):
            hashes[hashes == hashes[int(rng.choice(other))]] = hashes[a]
    words = (user // 2).astype(np.uint64) * np.uint64(0xD1B54A32D192ED03)   # shared word 0
    table = pa.table({"__user": pa.array(words, pa.uint64()),
                      "__user_lo": pa.array((user % 2).astype(np.uint64), pa.uint64()),
                      "__key": pa.array(hashes, pa.uint64()), **keys})
    want = _table_wide_distinct_pair_rows(table, list(keys))
    got = prereduce.distinct_pair_rows(table, list(keys))
    assert got.dtype == np.int64 and np.array_equal(got, want)
    # the repeats the grouping reports, on both paths, are rows of the same triple
    for bits in (None, 2):
        first, later, earlier = prereduce.first_rows_of_triples(
            words, (user % 2).astype(np.uint64), hashes, hash_bits=bits, repeats=True)
        assert np.array_equal(first, prereduce.first_rows_by_lexsort(
            words, (user % 2).astype(np.uint64), hashes))
        assert len(first) + len(later) == n
        assert np.array_equal(user[later], user[earlier])
        assert np.array_equal(hashes[later], hashes[earlier])
        assert np.all(later != earlier) and not np.isin(later, first).any()

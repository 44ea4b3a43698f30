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

"""bound_l0's fast paths (packed value sorts) keep exactly the set a brute-force reference
keeps: per user, the C distinct keys with the smallest rank mix64(key_hash XOR salt_u),
with one salt word per user drawn in increasing user-hash order. Every path is exercised:
the packed user sort and its argsort fallback (users sharing their top bits), and the
packed (user, rank) sort and its lexsort fallback (two keys' truncated ranks tie)."""
import collections

import numpy as np
import pytest

from thresher.transforms.bounding import per_user_bound
from thresher.transforms.randomness.hashing import mix64


def _reference(users, keys, bound, seed, mixer):
    """Brute force in Python: the kept (user, key) pairs for the salts a seeded Generator
    draws (samplers.uniform_priorities on a numpy Generator = integers(0, 2**64))."""
    distinct_users = sorted(set(int(u) for u in users))
    salts = np.random.default_rng(seed).integers(0, 1 << 64, size=len(distinct_users), dtype=np.uint64)
    salt_of = dict(zip(distinct_users, (int(s) for s in salts)))
    keys_of = collections.defaultdict(set)
    for u, k in zip(users.tolist(), keys.tolist()):
        keys_of[u].add(k)
    kept = set()
    for u, ks in keys_of.items():
        ks = sorted(ks)
        ranks = mixer(np.array(ks, dtype=np.uint64) ^ np.uint64(salt_of[u]))
        by_rank = sorted(zip(ranks.tolist(), ks))
        assert len({r for r, _ in by_rank}) == len(by_rank), "reference needs distinct ranks"
        kept.update((u, k) for _, k in by_rank[:bound])
    return kept


def _kept_pairs(users, keys, bound, seed):
    idx = per_user_bound.bound_l0(users, keys, bound, np.random.default_rng(seed))
    pairs = list(zip(users[idx].tolist(), keys[idx].tolist()))
    assert len(pairs) == len(set(pairs)), "a (user, key) pair was kept twice"
    return set(pairs)


def _spread(x):
    """Small integers -> well-spread 64-bit hashes (distinct top bits)."""
    return mix64(np.asarray(x, dtype=np.uint64) + np.uint64(12345))


@pytest.mark.parametrize("seed", range(6))
def test_fast_paths_match_reference(seed):
    rng = np.random.default_rng(100 + seed)
    n = int(rng.integers(1, 6000))
    users = _spread(rng.integers(0, rng.integers(1, 400), n))      # fast packed user sort
    keys = _spread(rng.integers(0, rng.integers(1, 200), n))
    bound = int(rng.integers(1, 12))
    assert _kept_pairs(users, keys, bound, seed) == _reference(users, keys, bound, seed, mix64)


@pytest.mark.parametrize("seed", range(4))
def test_user_sort_fallback_matches_reference(seed):
    # users 0..49 share their top bits: the packed user sort cannot separate them
    rng = np.random.default_rng(200 + seed)
    users = rng.integers(0, 50, 4000).astype(np.uint64)
    keys = _spread(rng.integers(0, 80, 4000))
    assert _kept_pairs(users, keys, 4, seed) == _reference(users, keys, 4, seed, mix64)


def test_rank_tie_fallback_matches_reference(monkeypatch):
    # With the identity as mixer, ranks are key XOR salt: keys 0..255 of one user share
    # all but their low 8 bits, so truncated ranks tie and the exact lexsort is needed.
    identity = lambda x: np.asarray(x, dtype=np.uint64).copy()  # noqa: E731
    monkeypatch.setattr(per_user_bound, "mix64", identity)
    calls = []
    real_lexsort = np.lexsort
    monkeypatch.setattr(per_user_bound.np, "lexsort", lambda *a, **k: calls.append(1) or real_lexsort(*a, **k))
    rng = np.random.default_rng(9)
    users = _spread(rng.integers(0, 300, 5000))
    keys = rng.integers(0, 256, 5000).astype(np.uint64)
    kept = _kept_pairs(users, keys, 5, 3)
    assert calls, "the tie fallback was not exercised"
    assert kept == _reference(users, keys, 5, 3, identity)


def test_single_row_and_single_user():
    one = np.array([7], dtype=np.uint64)
    assert per_user_bound.bound_l0(one, one, 1, np.random.default_rng(0)).tolist() == [0]
    users = np.full(1000, 3, dtype=np.uint64)
    keys = np.arange(1000, dtype=np.uint64) % 37
    assert _kept_pairs(users, keys, 10, 1) == _reference(users, keys, 10, 1, mix64)

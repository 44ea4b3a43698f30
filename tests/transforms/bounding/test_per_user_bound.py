"""PerUserBound keeps at most C distinct keys per user, once each, chosen uniformly at
random; with the shuffle and aggregation around it, counts equal a brute-force count."""
import collections

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that, equal_to
from scipy import stats

from thresher.pipelines.dataio.io import prepare_batch
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.bounding.per_user_bound import PerUserBound, bound_l0
from thresher.transforms.bounding.user_shards import ShardByUser
from thresher.transforms.randomness.user_identity import TEST_KEY
from thresher.transforms.randomness import keyed_random


def _random_records(rng, n, users, keys):
    return (rng.integers(0, users, n).astype(np.uint64), rng.integers(0, keys, n).astype(np.uint64))


@pytest.mark.parametrize("bound", [1, 2, 5, 50])
def test_kernel_keeps_at_most_bound_distinct_keys_per_user(bound):
    rng = np.random.default_rng(7)
    users, keys = _random_records(rng, 20_000, 500, 40)
    kept = bound_l0(users, keys, bound, rng)
    pairs = list(zip(users[kept].tolist(), keys[kept].tolist()))
    assert len(pairs) == len(set(pairs)), "a (user, key) pair survived twice"
    per_user = collections.Counter(u for u, _ in pairs)
    distinct = collections.defaultdict(set)
    for u, k in zip(users.tolist(), keys.tolist()):
        distinct[u].add(k)
    for u, ks in distinct.items():
        assert per_user[u] == min(len(ks), bound)
    assert set(pairs) <= {(u, k) for u, ks in distinct.items() for k in ks}


def test_kernel_choice_is_uniform():
    """One user with 6 distinct keys (some duplicated), C = 2: each key must be kept with
    probability 1/3. Chi-square over 6,000 draws; false-failure probability 1e-4."""
    rng = np.random.default_rng(11)
    users = np.zeros(10, dtype=np.uint64)
    keys = np.array([0, 0, 0, 1, 2, 3, 3, 4, 5, 5], dtype=np.uint64)
    counts = np.zeros(6)
    trials = 6000
    for _ in range(trials):
        kept = bound_l0(users, keys, 2, rng)
        counts[keys[kept].astype(int)] += 1
    expected = np.full(6, trials * 2 / 6)
    assert stats.chisquare(counts, expected).pvalue > 1e-4


def test_kernel_empty_input():
    assert len(bound_l0(np.zeros(0, np.uint64), np.zeros(0, np.uint64), 3, np.random.default_rng(0))) == 0


def _table(users, words):
    raw = pa.table({"user": pa.array(users), "word": pa.array(words)})
    prepared, _ = prepare_batch(raw, "user", ["word"], identity_key=TEST_KEY)
    return prepared


def test_pipeline_counts_equal_brute_force_when_bound_is_not_binding():
    rng = np.random.default_rng(5)
    users = [f"u{i}" for i in rng.integers(0, 300, 3000)]
    words = [f"w{j}" for j in rng.integers(0, 30, 3000)]
    expected = collections.Counter(w for (u, w) in set(zip(users, words)))
    batches = [_table(users[i:i + 700], words[i:i + 700]) for i in range(0, 3000, 700)]
    with TestPipeline() as p:
        counts = (p
                  | beam.Create(batches)
                  | ShardByUser(5)
                  | PerUserBound(["word"], 30, rng_factory=keyed_random.seeded_for_tests(1))
                  | SumCountsPerKey(["word"], 3)
                  | beam.FlatMap(lambda t: zip(t.column("word").to_pylist(), t.column("count").to_pylist())))
        assert_that(counts, equal_to(list(expected.items())))


def test_pipeline_bound_as_side_input_limits_each_user():
    # 40 users, each with the same 10 keys: with C = 3 from a side input every key count
    # is at most 40 and the counts add up to exactly 40 * 3.
    users = [f"u{i}" for i in range(40) for _ in range(10)]
    words = [f"w{j}" for _ in range(40) for j in range(10)]
    with TestPipeline() as p:
        bound = p | "Bound" >> beam.Create([3])
        totals = (p
                  | beam.Create([_table(users, words)])
                  | ShardByUser(4)
                  | PerUserBound(["word"], beam.pvalue.AsSingleton(bound),
                                 rng_factory=keyed_random.KeyedSource(bytes(32)).child("PerUserBound"))
                  | SumCountsPerKey(["word"], 2)
                  | beam.Map(lambda t: int(np.sum(t.column("count").to_numpy())))
                  | beam.CombineGlobally(sum))
        assert_that(totals, equal_to([120]))


def _exact_by_counting(table, key_columns):
    """The reference of key_hash_is_exact: distinct hashes == distinct key tuples."""
    import pyarrow.compute as pc
    hashes = pc.count_distinct(table.column("__key")).as_py()
    tuples = table.select(list(key_columns)).group_by(
        list(key_columns), use_threads=False).aggregate([]).num_rows
    return hashes == tuples


@pytest.mark.parametrize("seed", range(40))
def test_key_hash_is_exact_agrees_with_counting_distinct_keys(seed):
    """The gather-and-compare check (issue 43) says what counting distinct key tuples
    says, on text, integer and two-column keys, chunked or not, with a hash collision
    planted between two different keys (in one user or across users) or none; every
    seed is drawn so that about half the tables hold a collision."""
    from thresher.transforms.bounding.per_user_bound import key_hash_is_exact
    from thresher.transforms.randomness.hashing import hash_columns
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 400))
    words = np.array([f"w{i}" for i in rng.integers(0, int(rng.integers(1, 60)), n)], dtype=object)
    numbers = rng.integers(-5, 5, n)
    kind = seed % 3
    keys = {"word": pa.array(words, pa.string())} if kind == 0 else (
        {"n": pa.array(numbers, pa.int64())} if kind == 1 else
        {"word": pa.array(words, pa.string()), "n": pa.array(numbers, pa.int64())})
    table = pa.table(keys)
    hashes = hash_columns(table, list(keys)).astype(np.uint64)
    if rng.random() < 0.5:   # plant a collision: a row's key takes another key's hash
        a = int(rng.integers(0, n))
        other = np.flatnonzero(hashes != hashes[a])
        if len(other):
            hashes[hashes == hashes[int(rng.choice(other))]] = hashes[a]
    table = table.append_column("__key", pa.array(hashes, pa.uint64()))
    if n > 3 and rng.random() < 0.5:   # chunked columns, as concatenated batches give
        cut = int(rng.integers(1, n - 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    assert key_hash_is_exact(table, list(keys)) == _exact_by_counting(table, list(keys))


def test_key_hash_is_exact_finds_a_collision_of_the_first_and_last_rows():
    from thresher.transforms.bounding.per_user_bound import key_hash_is_exact
    table = pa.table({"word": ["a", "b", "c", "d"],
                      "__key": pa.array([7, 8, 9, 7], pa.uint64())})
    assert not key_hash_is_exact(table, ["word"])
    table = pa.table({"word": ["a", "b", "a", "d"],
                      "__key": pa.array([7, 8, 7, 9], pa.uint64())})
    assert key_hash_is_exact(table, ["word"])


@pytest.mark.parametrize("seed", range(24))
def test_key_hash_is_exact_agrees_on_other_key_types(seed):
    """large_string, binary, null-holding (the counting path) and float (the counting
    path: 0.0 == -0.0) keys, one or two columns, chunked or not, with or without a
    planted collision: the same answer as counting. (Dictionary-typed keys are decoded
    by ``prepare_batch``; the counting path itself refuses them.)"""
    from thresher.transforms.bounding.per_user_bound import key_hash_is_exact
    rng = np.random.default_rng(seed)
    n = int(rng.integers(2, 60))
    values = rng.integers(0, 5, n)
    makers = [lambda v: pa.array([f"k{x}" for x in v], pa.large_string()),
              lambda v: pa.array([b"k%d" % x for x in v], pa.binary()),
              lambda v: pa.array([None if x == 0 else f"k{x}" for x in v]),
              lambda v: pa.array(np.where(v == 0, -0.0, v - 2.0))]
    columns = {f"c{j}": makers[(seed + 2 * j) % len(makers)](rng.integers(0, 5, n) if j else values)
               for j in range(1 + seed % 2)}
    table = pa.table(columns)
    tuples = list(zip(*[table.column(c).to_pylist() for c in columns]))
    codes = {t: i for i, t in enumerate(dict.fromkeys(tuples))}
    modulus = int(rng.integers(1, 8))           # 1..7: collisions planted or not
    table = table.append_column("__key", pa.array([codes[t] % modulus for t in tuples],
                                                  pa.uint64()))
    if n > 3 and rng.random() < 0.5:
        cut = int(rng.integers(1, n - 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    import pyarrow.compute as pc     # the counting code before issue 43, as it was
    if len(columns) == 1:
        counted = (pc.count_distinct(table.column("__key")).as_py()
                   == pc.count_distinct(table.column("c0")).as_py())
    else:
        counted = _exact_by_counting(table, list(columns))
    assert key_hash_is_exact(table, list(columns)) == counted


def _reference_bound_table_l0(table, key_columns, bound, rng):
    """bound_table_l0 as it chose before the per-user check (issue 43): the table-wide
    key_hash_is_exact, else the per-user ranking."""
    from thresher.transforms.bounding import per_user_bound as pub
    if pub.key_hash_is_exact(table, key_columns):
        users = table.column("__user").to_numpy()
        bound_rng = keyed_random.bind_users(rng, table, key_columns)
        return pub.bound_l0(users, table.column("__key").to_numpy(), bound, bound_rng)
    pair_rows, rank_in_user = pub.l0_pair_ranks_per_user(table, key_columns, rng)
    return np.sort(pair_rows[rank_in_user < bound])


@pytest.mark.parametrize("seed", range(30))
def test_hash_exact_per_user_and_the_kept_rows(seed):
    """hash_exact_per_user (issue 43: the collision check read off the ranking, instead
    of the table-wide key_hash_is_exact) says whether some user holds two different keys
    of equal __key, and bound_table_l0 keeps exactly the rows it kept with the
    table-wide check: a hash collision planted between keys of one user, of two
    different users only, or none (a third of the seeds each)."""
    from thresher.transforms.bounding import per_user_bound as pub
    rng = np.random.default_rng(seed)
    n = int(rng.integers(20, 600))
    users = [f"u{i}" for i in rng.integers(0, int(rng.integers(2, 40)), n)]
    words = [f"w{i}" for i in rng.integers(0, int(rng.integers(2, 80)), n)]
    case = seed % 3
    if case:   # "x" and "y" get one hash; held by one user (1) or by two users (2)
        users += ["a", "a", "a"] + (["a", "a"] if case == 1 else ["b", "b"])
        words += ["x", "x", "z"] + ["y", "y"]
    table = _table(users, words)
    if case:
        hashes = table.column("__key").to_numpy().copy()
        word = np.array(table.column("word").to_pylist(), dtype=object)
        hashes[word == "y"] = hashes[np.flatnonzero(word == "x")[0]]
        table = table.set_column(table.column_names.index("__key"), "__key",
                                 pa.array(hashes, pa.uint64()))
    source = keyed_random.StageSource(keyed_random.KeyedSource(bytes(range(32))), "S/Bound")
    ranks = pub.l0_ranks(table.column("__user").to_numpy(), table.column("__key").to_numpy(),
                         keyed_random.bind_users(source, table, ["word"]))
    colliding_user = bool(pub.users_with_colliding_keys(table, ["word"]).any())
    assert colliding_user == (case == 1)
    assert pub.hash_exact_per_user(table, ["word"], ranks) == (not colliding_user)
    if case == 2:   # a collision between users: the table-wide check says no
        assert not pub.key_hash_is_exact(table, ["word"])
    for bound in (1, 2, 5):
        kept = pub.bound_table_l0(table, ["word"], bound, source)
        np.testing.assert_array_equal(
            np.sort(kept), np.sort(_reference_bound_table_l0(table, ["word"], bound, source)))


def test_hash_exact_per_user_defers_on_nulls_and_other_types():
    """A key type whose equality is not equality of values (floats) or a null key: the
    per-user check does not decide (False), and the table-wide check is asked."""
    from thresher.transforms.bounding import per_user_bound as pub
    source = keyed_random.StageSource(keyed_random.KeyedSource(bytes(range(32))), "S/Bound")
    for keys in (pa.array([0.5, 0.5, 1.5]), pa.array(["a", None, "a"])):
        table = pa.table({"__user": pa.array([1, 1, 2], pa.uint64()),
                          "__user_lo": pa.array([3, 3, 4], pa.uint64()),
                          "__key": pa.array([7, 7, 8], pa.uint64()), "k": keys})
        ranks = pub.l0_ranks(table.column("__user").to_numpy(),
                             table.column("__key").to_numpy(),
                             keyed_random.bind_users(source, table, ["k"]))
        assert not pub.hash_exact_per_user(table, ["k"], ranks)


def _first_row_of_each_hash(table):
    hashes = table.column("__key").to_numpy()
    _, first, inverse = np.unique(hashes, return_index=True, return_inverse=True)
    return first[inverse.reshape(-1)]


@pytest.mark.parametrize("seed", range(40))
def test_key_hash_is_exact_at_agrees_with_key_hash_is_exact(seed):
    """key_hash_is_exact_at (issue 43: the caller's first row of each hash instead of a
    hash pass over __key) answers as key_hash_is_exact on text, integer, two-column,
    large_string, binary, null-holding and float keys, chunked or not, with a collision
    planted between two different keys or none (about half the seeds)."""
    from thresher.transforms.bounding.per_user_bound import key_hash_is_exact, key_hash_is_exact_at
    rng = np.random.default_rng(500 + seed)
    n = int(rng.integers(2, 300))
    values = rng.integers(0, int(rng.integers(1, 40)), n)
    makers = [lambda v: pa.array([f"w{x}" for x in v], pa.string()),
              lambda v: pa.array(v - 3, pa.int64()),
              lambda v: pa.array([f"k{x}" for x in v], pa.large_string()),
              lambda v: pa.array([b"k%d" % x for x in v], pa.binary()),
              lambda v: pa.array([None if x == 0 else f"k{x}" for x in v], pa.string()),
              lambda v: pa.array(np.where(v == 0, -0.0, v - 2.0))]
    columns = {f"c{j}": makers[(seed + 3 * j) % len(makers)](
        rng.integers(0, 4, n) if j else values) for j in range(1 + seed % 2)}
    table = pa.table(columns)
    tuples = list(zip(*[table.column(c).to_pylist() for c in columns]))
    codes = {t: i for i, t in enumerate(dict.fromkeys(tuples))}
    hashes = np.array([codes[t] for t in tuples], dtype=np.uint64) * np.uint64(7919)
    if rng.random() < 0.5:   # plant a collision: a key takes another key's hash
        a = int(rng.integers(0, n))
        other = np.flatnonzero(hashes != hashes[a])
        if len(other):
            hashes[hashes == hashes[int(rng.choice(other))]] = hashes[a]
    table = table.append_column("__key", pa.array(hashes, pa.uint64()))
    if n > 3 and rng.random() < 0.5:
        cut = int(rng.integers(1, n - 1))
        table = pa.concat_tables([table.slice(0, cut), table.slice(cut)])
    want = key_hash_is_exact(table, list(columns))
    assert key_hash_is_exact_at(table, list(columns), _first_row_of_each_hash(table)) == want
    # any row of the same hash serves as its representative
    shuffled = table.take(pa.array(rng.permutation(table.num_rows)))
    assert key_hash_is_exact_at(shuffled, list(columns),
                                _first_row_of_each_hash(shuffled)) == want

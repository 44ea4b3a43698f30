"""One-pass automatic bound (transforms/bounding/scored_bound.py) against the two passes it replaces.

For every candidate C the bucket tables select exactly the per-key counts of
``per_user_bound.bound_table_l0`` at C under the same keyed stage (including a shard
whose key hashes collide, bounded on exact key codes), the statistics are bit-identical
to ``choose_contribution_bound.table_statistics``, and a whole release with
``max_keys_per_user: auto`` publishes the same bytes as the two-pass pipeline under one
secret. Deterministic (fixed secret and seeds): no false failures.
"""
import os

import numpy as np
import pyarrow as pa
import pytest

from thresher.accounting import contribution_bound
from thresher.pipelines.running import release
from tests.pipelines.running.test_keyed_recomputation import SECRET, _release
from thresher.transforms.randomness import keyed_random
from thresher.transforms.bounding.choose_contribution_bound import table_statistics
from thresher.transforms.randomness.hashing import hash_array, mix64
from thresher.transforms.bounding.per_user_bound import bound_table_l0, count_per_key
from thresher.transforms.bounding.scored_bound import candidate_buckets, scored_table, select_bucket_counts
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN, USER_LOW_COLUMN

CANDIDATES = (1, 2, 3, 4, 6, 8, 11, 16)
STAGE = "PerUserBound"


def _score(kind="gaussian"):
    thresholds = [10.0 + 3 * c for c in CANDIDATES]
    params = {"laplace_l0": {"epsilon": 1.0, "delta": 1e-6},
              "gaussian": {"thresholds": thresholds},
              "sample_and_threshold": {"thresholds": thresholds,
                                       "sampling_rates": [0.5] * len(CANDIDATES)}}[kind]
    return contribution_bound.make_score(kind, CANDIDATES, 16, params)


def _table(seed, rows=4000, users=300, collide=False):
    rng = np.random.default_rng(seed)
    user = rng.integers(0, users, rows).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)
    words = pa.array([f"w{k}" for k in np.minimum(rng.zipf(1.4, rows), 200)])
    key_hash = hash_array(words)
    if collide:   # w1 and w2 share a key hash: the shard is bounded on exact key codes
        w = np.array(words.to_pylist())
        key_hash = np.where(w == "w2", key_hash[np.flatnonzero(w == "w1")[0]], key_hash)
    return pa.table({USER_COLUMN: pa.array(user, pa.uint64()),
                     USER_LOW_COLUMN: pa.array(mix64(user), pa.uint64()),   # identity word 1
                     "word": words,
                     KEY_HASH_COLUMN: pa.array(np.asarray(key_hash, np.uint64), pa.uint64())})


def _source():
    return keyed_random.StageSource(keyed_random.KeyedSource(SECRET), STAGE)


def _per_key(table):
    if table is None or table.num_rows == 0:
        return {}
    out = {}
    for word, count in zip(table.column("word").to_pylist(), table.column("count").to_pylist()):
        out[word] = out.get(word, 0) + count
    return out


def test_candidate_buckets_keep_a_rank_exactly_at_the_candidates_above_it():
    ranks = np.arange(20)
    buckets = candidate_buckets(ranks, CANDIDATES)
    for i, c in enumerate(CANDIDATES):
        assert np.array_equal(buckets <= i, ranks < c), c


@pytest.mark.parametrize("seed,collide", [(0, False), (1, False), (2, True)])
def test_selected_buckets_are_the_bound_counts_for_every_candidate(seed, collide):
    table = _table(seed, collide=collide)
    counts, _, _ = scored_table(table, ["word"], _score(), _source())
    assert counts is not None
    changed = 0
    previous = None
    for c in CANDIDATES:
        kept = bound_table_l0(table, ["word"], c, _source())
        expected = _per_key(count_per_key(table.take(pa.array(kept)), ["word"]))
        got = _per_key(select_bucket_counts(counts, c, CANDIDATES))
        assert got == expected, c
        changed += previous is not None and got != previous
        previous = got
    assert changed >= 3   # the candidates select different counts (the test can fail)


@pytest.mark.parametrize("seed,collide", [(0, False), (2, True)])
def test_selected_counts_have_one_row_per_key_like_the_fixed_bound(seed, collide):
    """SumCountsPerKey gets from the chosen C exactly the rows a fixed bound at C sends
    (one per key with a user at C), not one per key and candidate bucket (issue 19)."""
    table = _table(seed, collide=collide)
    counts, _, _ = scored_table(table, ["word"], _score(), _source())
    assert counts.num_rows == len(set(counts.column("word").to_pylist()))
    for c in CANDIDATES:
        kept = bound_table_l0(table, ["word"], c, _source())
        fixed = count_per_key(table.take(pa.array(kept)), ["word"])
        selected = select_bucket_counts(counts, c, CANDIDATES)
        assert selected.num_rows == fixed.num_rows, c
        assert selected.schema == fixed.schema, c
        assert min(selected.column("count").to_pylist()) >= 1, c


@pytest.mark.parametrize("score_name", ["gaussian", "laplace_l0", "sample_and_threshold"])
@pytest.mark.parametrize("seed,collide", [(3, False), (4, True)])
def test_statistics_are_bit_identical_to_table_statistics(score_name, seed, collide):
    table = _table(seed, collide=collide)
    score = _score(score_name)
    _, dropped, partials = scored_table(table, ["word"], score, _source(), num_key_shards=4)
    ref_dropped, ref_partials = table_statistics(table, ["word"], score, num_key_shards=4)
    assert np.array_equal(dropped, ref_dropped)
    assert [s for s, _ in partials] == [s for s, _ in ref_partials]
    for (_, got), (_, want) in zip(partials, ref_partials):
        assert got.equals(want)   # exact float equality, column by column


def test_empty_shard_has_no_counts_and_zero_statistics():
    table = _table(5).slice(0, 0)
    counts, dropped, partials = scored_table(table, ["word"], _score(), _source())
    assert counts is None and not dropped.any() and partials == []


@pytest.mark.parametrize("kind", ["gaussian", "sample_and_threshold"])
def test_auto_release_is_byte_identical_to_the_two_pass_pipeline(kind, tmp_path, monkeypatch):
    changes = {"bounding.max_keys_per_user": "auto", "mechanism": {"kind": kind}}
    (tmp_path / "one").mkdir()
    one, report = _release(str(tmp_path / "one"), SECRET, changes=changes)
    assert release._one_pass_auto(_spec_of(tmp_path / "one"))
    monkeypatch.setattr(release, "_one_pass_auto", lambda spec: False)
    (tmp_path / "two").mkdir()
    two, report_two = _release(str(tmp_path / "two"), SECRET, changes=changes)
    assert report["released_keys"] > 0
    assert report["bounding"] == report_two["bounding"]
    assert one == two


def _spec_of(folder):
    from thresher.pipelines.specs import spec as spec_mod
    return spec_mod.load(str(folder / "spec.yaml"))


@pytest.mark.parametrize("kind, model, aggregates, one_pass", [
    ("gaussian", "l0", False, True),
    ("laplace", "l0", False, True),
    ("sample_and_threshold", "l0", False, True),
    ("weighted_sampling", "l0", False, True),
    ("laplace", "l1", False, False),             # RandClip
    ("gaussian", "l0", True, False),             # aggregates bound values too
    ("weighted_gaussian", "l0", False, False),   # its own weighted bound and options
    ("adaptive", "l0", False, False),            # its own rounds
])
def test_which_releases_take_the_one_pass_route(kind, model, aggregates, one_pass):
    """Only plain l0 PerUserBound releases may be bounded in the scoring pass: a kind
    with its own bounding, options, rounds or value columns would lose them there."""
    from thresher.pipelines.specs.spec import parse
    document = {
        "name": "route", "input": {"path": "in.parquet", "format": "parquet",
                                   "user": "user", "keys": ["word"]},
        "privacy": {"epsilon": 1.0, "delta": 1e-6},
        "bounding": {"max_keys_per_user": "auto", "model": model},
        "mechanism": {"kind": kind}, "output": {"path": "out"},
    }
    if aggregates:
        document["aggregates"] = [{"column": "value", "statistic": "sum", "clip": [0, 1]}]
    try:
        spec = parse(document)
    except Exception as exc:   # the document must be valid: the test is about routing
        pytest.fail(f"spec for {kind}/{model}/{aggregates} refused: {exc}")
    assert release._one_pass_auto(spec) is one_pass


def _old_kernels(monkeypatch):
    """The pass as it was before issue 43's value-sort kernels: l0_ranks' distinct rows,
    key numbers by dictionary encoding, the per-candidate loop over every pair."""
    from thresher.transforms.bounding import choose_contribution_bound as ccb
    from thresher.transforms.bounding import scored_bound
    from thresher.transforms.bounding.per_user_bound import l0_ranks

    def ranked_pairs(users, keys, rng, by_user=None):   # the old kernel sorted by itself
        ranks = l0_ranks(users, keys, rng)
        d = ranks.distinct
        return ranks.order[d], ranks.rank_in_user[d], ranks.user_numbers()[d]

    def loop_units(pair_users, user_weight, candidates, pair_key, num_keys, key_order=None):
        score = contribution_bound.make_score("gaussian", candidates, max(candidates),
                                              {"thresholds": [1.0] * len(candidates)})
        return ccb.key_units(pair_users, None, user_weight, score, pair_key, num_keys)

    monkeypatch.setattr(scored_bound, "l0_distinct_pairs", ranked_pairs)
    monkeypatch.setattr(scored_bound, "key_numbers", ccb._key_numbers_by_dictionary)
    monkeypatch.setattr(ccb, "l0_key_units", loop_units)


def _heavy_table(seed):
    """Light users and three heavy ones (thousands of keys, duplicate rows)."""
    table = _table(seed, rows=3000, users=400)
    rng = np.random.default_rng(seed)
    n = 9000
    user = np.repeat(np.array([11, 12, 13], np.uint64), n // 3) * np.uint64(0x9E3779B97F4A7C15)
    words = pa.array([f"h{k}" for k in rng.integers(0, 4000, n)])
    heavy = pa.table({USER_COLUMN: pa.array(user, pa.uint64()),
                      USER_LOW_COLUMN: pa.array(mix64(user), pa.uint64()), "word": words,
                      KEY_HASH_COLUMN: pa.array(np.asarray(hash_array(words), np.uint64),
                                                pa.uint64())})
    return pa.concat_tables([table, heavy]).take(pa.array(rng.permutation(3000 + n)))


@pytest.mark.parametrize("case", ["plain", "collide", "heavy", "empty", "one_row"])
@pytest.mark.parametrize("score_name", ["gaussian", "laplace_l0", "sample_and_threshold"])
def test_pass_is_identical_to_the_pre_value_sort_kernels(case, score_name, monkeypatch):
    """Everything scored_table returns (running counts, dropped, key-shard partials) is
    bit-identical to the pass with the kernels it had before (kept here as the oracle)."""
    table = {"plain": lambda: _table(6), "collide": lambda: _table(7, collide=True),
             "heavy": lambda: _heavy_table(8), "empty": lambda: _table(5).slice(0, 0),
             "one_row": lambda: _table(9).slice(0, 1)}[case]()
    score = _score(score_name)
    got = scored_table(table, ["word"], score, _source(), num_key_shards=4)
    _old_kernels(monkeypatch)
    want = scored_table(table, ["word"], score, _source(), num_key_shards=4)
    if want[0] is None:
        assert got[0] is None
    else:
        assert got[0].equals(want[0])
    assert np.array_equal(got[1], want[1])
    assert [s for s, _ in got[2]] == [s for s, _ in want[2]]
    for (_, g), (_, w) in zip(got[2], want[2]):
        assert g.equals(w)


@pytest.mark.parametrize("spill", [False, True])
def test_the_pass_concatenates_grouped_shards_with_one_sort_by_user(spill, tmp_path,
                                                                   monkeypatch):
    """ScoredPerUserBound's step given ShardByUser.grouped's (shard, [pieces]) (issue 43:
    the release's automatic bound) emits what it emits given the concatenated shard, and
    sorts the shard by user once (the concatenation's check), not twice."""
    from thresher.transforms.bounding import l0_pairs, scored_bound, user_shards
    table = _heavy_table(10)
    tables = [table.slice(0, 5000), table.slice(5000, 7000)]
    pieces = tables
    if spill:     # spilled pieces travel as file names (transforms/plumbing/spill.py)
        from thresher.transforms.plumbing import spill as spill_mod
        pieces = [spill_mod.write_piece(t, str(tmp_path)) for t in tables]
    concat = {"key_columns": ("word",)}
    whole = next(user_shards._concat_shard((0, tables), **concat))
    sorts = []
    for module in (l0_pairs, user_shards):
        original = module.order_by_user if module is user_shards else module._order_by_user
        counted = (lambda f: lambda *a: sorts.append(1) or f(*a))(original)
        monkeypatch.setattr(module, "order_by_user" if module is user_shards
                            else "_order_by_user", counted)

    def run(fn, element):
        fn._rng = None
        out = {"buckets": [], "dropped": [], "partials": []}
        for item in fn.process(element):
            if hasattr(item, "tag"):
                out[item.tag].append(item.value)
            else:
                out["buckets"].append(item)
        return out

    score = _score()
    factory = keyed_random.KeyedSource(SECRET)
    grouped_fn = scored_bound._ScoredBoundFn(("word",), score, 4, factory, STAGE, None,
                                             concat=concat)
    got = run(grouped_fn, (0, pieces))
    assert len(sorts) == 1
    sorts.clear()
    want = run(scored_bound._ScoredBoundFn(("word",), score, 4, factory, STAGE, None), whole)
    assert len(sorts) == 1          # l0_distinct_pairs' own sort (the table came concatenated)
    assert got["buckets"][0].equals(want["buckets"][0])
    assert np.array_equal(got["dropped"][0], want["dropped"][0])
    assert [s for s, _ in got["partials"]] == [s for s, _ in want["partials"]]
    for (_, g), (_, w) in zip(got["partials"], want["partials"]):
        assert g.equals(w)


def _planted(seed):
    """A shard with a hash collision planted (or not) between two different words: held
    by one user, by two users, or none (the branches of scored_table's hash check)."""
    rng = np.random.default_rng(seed)
    table = _table(seed, rows=int(rng.integers(50, 3000)), users=int(rng.integers(5, 300)))
    how = seed % 3
    if how == 0:
        return table
    words = np.array(table.column("word").to_pylist())
    user = table.column(USER_COLUMN).to_numpy()
    hashes = table.column(KEY_HASH_COLUMN).to_numpy().copy()
    a = int(rng.integers(0, len(words)))
    if how == 1:   # another word of a's user takes a's hash
        other = np.flatnonzero((user == user[a]) & (words != words[a]))
    else:          # a word a's user does not hold takes a's hash
        other = np.flatnonzero(~np.isin(words, words[user == user[a]]))
    if len(other):
        hashes[words == words[int(rng.choice(other))]] = hashes[a]
    return table.set_column(table.schema.get_field_index(KEY_HASH_COLUMN), KEY_HASH_COLUMN,
                            pa.array(hashes, pa.uint64()))


@pytest.mark.parametrize("seed", range(24))
def test_pass_with_the_sorted_hash_check_is_that_of_the_table_wide_check(seed, monkeypatch):
    """scored_table's hash check read off its sort of the rows by key hash
    (``key_hash_is_exact_at``, issue 43) and the key rows taken from that sort give
    everything the pass gave with the table-wide ``key_hash_is_exact`` and the key rows
    of its pairs (kept here as the oracle), bit for bit, collisions planted or not."""
    from thresher.transforms.bounding import per_user_bound, scored_bound
    table = _planted(seed)
    score = _score(("gaussian", "laplace_l0", "sample_and_threshold")[seed % 3])
    got = scored_table(table, ["word"], score, _source(), num_key_shards=4)

    def old_check(table, key_columns, representative):
        return per_user_bound.key_hash_is_exact(table, key_columns)

    monkeypatch.setattr(scored_bound, "key_hash_is_exact_at", old_check)
    original = scored_bound.running_counts

    def pair_key_rows(table, key_columns, key_rows, pair_key, buckets, num_buckets):
        if per_user_bound.key_hash_is_exact(table, key_columns):
            # the key rows as the pass took them before: the row of each key's first
            # pair, in the pairs' (user, rank) order
            from thresher.transforms.bounding.choose_contribution_bound import key_numbers
            from thresher.transforms.bounding.l0_pairs import l0_distinct_pairs
            key_hash = table.column(KEY_HASH_COLUMN).to_numpy()
            pair_rows, _, _ = l0_distinct_pairs(
                table.column(USER_COLUMN).to_numpy(), key_hash,
                keyed_random.bind_users(_source(), table, key_columns))
            old_rows = pair_rows[key_numbers(key_hash[pair_rows]).first]
            assert len(old_rows) == len(key_rows)
            key_rows = old_rows
        return original(table, key_columns, key_rows, pair_key, buckets, num_buckets)

    monkeypatch.setattr(scored_bound, "running_counts", pair_key_rows)
    want = scored_table(table, ["word"], score, _source(), num_key_shards=4)
    assert got[0].equals(want[0])
    assert np.array_equal(got[1], want[1])
    assert [s for s, _ in got[2]] == [s for s, _ in want[2]]
    for (_, g), (_, w) in zip(got[2], want[2]):
        assert g.equals(w)


def test_the_pass_spills_a_shards_partials_as_one_file(tmp_path):
    """With a spill folder the pass writes all of a shard's key-shard partials into one
    file (``spill.write_pieces``: one record batch per key shard) beside its running
    counts, instead of one file per key shard: two files per user shard, and each
    (key shard, reference) it emits reads back as the partial the pass computes without
    a spill folder (issue 43: 160 partial files per 1e7-row release became 10)."""
    from thresher.transforms.bounding import scored_bound
    from thresher.transforms.plumbing import spill as spill_mod
    table = _table(4, rows=6000, users=400)
    factory = keyed_random.KeyedSource(SECRET)
    folder = str(tmp_path / "spill")

    def run(spill_dir):
        fn = scored_bound._ScoredBoundFn(("word",), _score(), 16, factory, STAGE, spill_dir)
        fn._rng = None
        return [item.value for item in fn.process(table)
                if getattr(item, "tag", None) == scored_bound._ScoredBoundFn.PARTIALS]

    in_memory, spilled = run(None), run(folder)
    assert len(in_memory) > 4
    assert len(os.listdir(folder)) == 2          # the partials' file and the counts' file
    assert [s for s, _ in spilled] == [s for s, _ in in_memory]
    paths = {ref[0] for _, ref in spilled}
    assert len(paths) == 1 and all(isinstance(ref, tuple) for _, ref in spilled)
    for (_, ref), (_, partial) in zip(spilled, in_memory):
        assert spill_mod.read_piece(ref).equals(partial)


@pytest.mark.parametrize("pre_threshold", [None, 1])
def test_auto_release_with_spilled_partials_is_that_of_the_in_memory_shuffle(
        pre_threshold, tmp_path, monkeypatch):
    """Under one secret, ``max_keys_per_user: auto`` on the in-process runner (its
    partials spilled one file per user shard, the references grouped by key shard)
    publishes the bytes of the same release through the runner's in-memory shuffles,
    in both spec shapes."""
    from thresher.transforms.plumbing import spill as spill_mod
    mechanism = {"kind": "gaussian"}
    if pre_threshold:
        mechanism["pre_threshold"] = pre_threshold
    changes = {"bounding.max_keys_per_user": "auto", "mechanism": mechanism}
    calls = []
    original = spill_mod.write_pieces
    monkeypatch.setattr(spill_mod, "write_pieces",
                        lambda pieces, folder: calls.append(1) or original(pieces, folder))
    (tmp_path / "spilled").mkdir()
    spilled, report = _release(str(tmp_path / "spilled"), SECRET, changes=changes)
    assert calls                                   # the partials went through one file
    monkeypatch.setattr(release, "_spill_dir", lambda pipeline, staging: None)
    (tmp_path / "in_memory").mkdir()
    in_memory, report_two = _release(str(tmp_path / "in_memory"), SECRET, changes=changes)
    assert report["released_keys"] > 0
    assert report["bounding"] == report_two["bounding"]
    assert spilled == in_memory


@pytest.mark.parametrize("spill_on", [False, True])
def test_counts_at_the_chosen_bound_are_the_fixed_bounds_summed_counts(spill_on, tmp_path):
    """``ScoredPerUserBound(count_shards=S).counts`` (the running counts split by key
    shard in the pass, each piece selected to the chosen C, summed per key shard) gives,
    for every candidate C, each key once per key shard with the count the fixed bound at
    C gives summed over the user shards (``bound_table_l0`` + ``count_per_key``): what
    ``SumCountsPerKey`` made of ``select``'s tables (issue 43: one split and spill of the
    counts fewer). With a spill folder the pieces of one user shard share one file."""
    import apache_beam as beam
    from apache_beam.testing import test_pipeline
    from apache_beam.testing.util import assert_that
    from thresher.transforms.bounding.scored_bound import ScoredPerUserBound
    shards = [_table(seed, rows=3000, users=150) for seed in (5, 6, 7)]
    draws = keyed_random.child(keyed_random.KeyedDraws(keyed_random.KeyedSource(SECRET)),
                               STAGE)
    folder = str(tmp_path / "spill") if spill_on else None
    shard_count = 3

    def expected(c):
        total = {}
        for table in shards:
            kept = bound_table_l0(table, ["word"], c, _source())
            for word, n in _per_key(count_per_key(table.take(pa.array(kept)), ["word"])).items():
                total[word] = total.get(word, 0) + n
        return total

    def matches(want):
        def check(tables):
            got = {}
            for table in tables:
                assert table.column_names == ["word", "count"]
                for word, n in _per_key(table).items():
                    assert word not in got          # each key once, in one key shard
                    got[word] = n
            assert got == want and len(want) > 20
        return check

    with test_pipeline.TestPipeline() as p:
        users = p | beam.Create(shards)
        for c in CANDIDATES:
            bounder = ScoredPerUserBound(["word"], _score(), rng_factory=draws,
                                         spill_dir=folder, count_shards=shard_count)
            scored = users | f"Pass{c}" >> bounder
            chosen = p | f"C{c}" >> beam.Create([c])
            assert_that(bounder.counts(scored["buckets"], chosen, 1, label=f"Sum{c}"),
                        matches(expected(c)),
                        label=f"Counts{c}")
    if spill_on:     # per pass and user shard: its partials' file and its counts' file
        assert len(os.listdir(folder)) == 2 * len(shards) * len(CANDIDATES)


def test_auto_splits_each_pre_reduced_table_as_it_comes(tmp_path, monkeypatch):
    """The automatic bound's user split takes the pre-reduced tables (combined, one chunk
    each) one at a time, as the fixed bound's split does: every table it gathers from is
    one chunk per column (waiting for COALESCE_ROWS rows, it gathered from several
    chunks, and Arrow's take combines a chunked column on every gather: auto's split cost
    2.4x the fixed bound's at 1e7 rows, issue 43). The published bytes are those of the
    pre-reduction's default tables (one per bundle here): the split changes no byte."""
    from thresher.transforms.bounding import prereduce, user_shards
    from thresher.transforms.plumbing import spill as spill_mod
    changes = {"bounding.max_keys_per_user": "auto", "mechanism": {"kind": "gaussian"}}
    (tmp_path / "default").mkdir()
    default, _ = _release(str(tmp_path / "default"), SECRET, changes=changes)
    seen = []
    original = user_shards.split_by_shard

    def recording(table, shard_ids, num_shards, **options):
        seen.append([table.column(c).num_chunks for c in table.column_names])
        return original(table, shard_ids, num_shards, **options)

    class RecordingSlices(user_shards.ShardSlices):   # the spilled split's tables
        def add(self, table, shard_ids):
            seen.append([table.column(c).num_chunks for c in table.column_names])
            return super().add(table, shard_ids)

    monkeypatch.setattr(user_shards, "split_by_shard", recording)
    monkeypatch.setattr(user_shards, "ShardSlices", RecordingSlices)
    monkeypatch.setattr(prereduce, "COALESCE_ROWS", 20_000)     # several tables a bundle
    monkeypatch.setattr(spill_mod, "PIECE_ROWS", 1 << 10)
    (tmp_path / "tables").mkdir()
    split, report = _release(str(tmp_path / "tables"), SECRET, changes=changes)
    assert len(seen) >= 2 and all(chunks == [1] * len(chunks) for chunks in seen), seen
    assert report["released_keys"] > 0 and split == default

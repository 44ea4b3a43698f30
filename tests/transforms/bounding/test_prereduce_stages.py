"""Pre-reduction for the kinds that release from records (issue 43, item 2;
transforms/bounding/prereduce_stages.py).

``heavy_hitters`` (trie) and ``quantiles`` bound users with fixed-bound l0 stages after
the user shuffle; a heavy user used to be refused above ``MAX_USER_ROWS`` rows. Checked
here, under one fixed secret (every comparison exact, no statistics):

- the kernel: the union of every stage's per-table reduction, bounded by each stage,
  keeps exactly what each stage keeps on all the rows (quantiles' two stages: (key,
  value) pairs and keys alone);
- through ``release.run``: the published file and report are byte-identical with the
  step forced on every row, decided per table, and removed; with it, the heavy user hands
  the shuffle a few rows per table instead of thousands;
- through the CLI with the whole-user limit lowered below the heavy user's rows: the
  release runs (exit 0), where it was refused before.
"""
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.dataio import io as pio
from thresher.pipelines.running import release
from thresher.transforms.bounding import prereduce, prereduce_stages, user_shards
from thresher.transforms.bounding.per_user_bound import bound_table_l0
from thresher.transforms.bounding.prereduce_stages import Bound, kept_rows, with_key_hash_of
from thresher.transforms.bounding.user_shards import exact_users
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.user_identity import TEST_KEY
from tests.transforms.release_runs import (
    HEAVY_ROWS, RELEASED_AND_REPORT, cli_runs_then_refused, heavy_user_input, release_files,
    with_and_without, without_step)
from tests.transforms.release_runs import heavy_and_colliding_users as _records

SECRET = b"test-only secret: prereduce kinds"
BOUND = 4
QUANTILES = {"kind": "quantiles", "column": "amount", "ranks": [0.5], "domain": [0, 10]}
BINARY_SEARCH = {**QUANTILES, "method": "binary_search"}
HEAVY_HITTERS = {"kind": "heavy_hitters", "top_k": 5, "method": "trie"}
HH_ADAPTIVE = {"kind": "heavy_hitters", "top_k": 5, "method": "adaptive"}
ADAPTIVE = {"kind": "adaptive"}
WEIGHTED = {"kind": "weighted_gaussian"}
MECHANISMS = {"quantiles": QUANTILES, "binary_search": {**QUANTILES, "method": "binary_search"},
              "trie": HEAVY_HITTERS, "hh_adaptive": HH_ADAPTIVE, "adaptive": ADAPTIVE,
              "weighted_gaussian": WEIGHTED}
# what each case's step keeps of h per split: C per bounding stage (quantiles: two), or
# one row per distinct key (the rounds: h's 1,500 + 20 words)
MOST_ROWS = {"quantiles": 2 * 4, "binary_search": 2 * 4, "trie": 4, "weighted_gaussian": 4,
             "hh_adaptive": 1520, "adaptive": 1520}


def _without_steps(monkeypatch):
    """Every issue-43 pre-reduction removed (the records reach the shuffle as read)."""
    monkeypatch.setattr(prereduce_stages, "prereduced_for_bounds",
                        lambda records, bounds, rng_factory, **_: (records, False))
    monkeypatch.setattr(prereduce_stages, "distinct_pairs_for_rounds",
                        lambda records, keys, rng_factory: (records, False))
    without_step(monkeypatch, "_prereduced_heavy", says_if_ran=True)


def _kept(table, bound, secret):
    """{(user word 0, user word 1, exact key..., value)} that ``bound`` keeps of ``table``:
    the stage's own kernel on the whole table, under the stage's keyed draws."""
    from thresher.transforms.bounding.key_value_bound import bound_key_values
    shard = exact_users(with_key_hash_of(table, bound.key_columns) if bound.rehash else table)
    if bound.value_column is None:
        source = keyed_random.StageSource(secret, bound.stage)
        rows = bound_table_l0(shard, bound.key_columns, BOUND, source)
        columns = bound.key_columns
    else:
        rows = bound_key_values(shard, list(bound.key_columns), bound.value_column, BOUND,
                                keyed_random.StageSource(secret, bound.stage + "/value"),
                                keyed_random.StageSource(secret, bound.stage + "/keys"))
        columns = (*bound.key_columns, bound.value_column)
    kept = shard.take(pa.array(rows))
    user = "__user_hi" if "__user_hi" in kept.column_names else "__user"
    return set(zip(kept.column(user).to_pylist(), kept.column("__user_lo").to_pylist(),
                   *[kept.column(k).to_pylist() for k in columns]))


# quantiles' stages: (key, value) pairs by PerUserBound (binary search) or one value per
# key by BoundKeyValues (hierarchical, public cells), each beside BoundKeys (keys alone)
STAGES = {
    "pairs": [Bound(["word", "amount"], BOUND, "S/PerUserBound"),
              Bound(["word"], BOUND, "S/BoundKeys", rehash=True)],
    "key_values": [Bound(["word"], BOUND, "S/BoundKeyValues", value_column="amount"),
                   Bound(["word"], BOUND, "S/BoundKeys", rehash=True)],
}


@pytest.mark.parametrize("stages", sorted(STAGES))
@pytest.mark.parametrize("batch_rows", [211, 1500, 20000])
def test_the_union_of_the_stages_reductions_keeps_every_stages_choice(batch_rows, stages):
    """Any split of the records into tables, each reduced to the union of the stages'
    rows: every stage chooses what it chooses on all the records (users holding keys
    whose public hashes collide included: v)."""
    prepared, _ = pio.prepare_batch(_records(), "user_id", ["word", "amount"],
                                    identity_key=TEST_KEY)
    bounds = STAGES[stages]
    secret = keyed_random.KeyedSource(SECRET)
    pieces = []
    for start in range(0, prepared.num_rows, batch_rows):
        batch = prepared.slice(start, batch_rows)
        keep, _ = kept_rows(batch, bounds, secret, "always")
        pieces.append(batch.filter(pa.array(keep)))
    reduced = pa.concat_tables(pieces)
    assert reduced.num_rows < prepared.num_rows - HEAVY_ROWS / 2
    for bound in bounds:
        assert _kept(reduced, bound, secret) == _kept(prepared, bound, secret)


def _release_records(seed=7):
    """3,000 users of 4 rows over 20 words (enough users per word for the key selection
    to publish), a heavy user h with 3,000 rows over 1,500 words of its own and the 20
    common ones, at many values; rows shuffled."""
    rng = np.random.default_rng(seed)
    users = [f"o{u}" for u in range(3000) for _ in range(4)]
    words = [f"w{w}" for w in rng.integers(0, 20, size=len(users))]
    users += ["h"] * HEAVY_ROWS
    words += [f"w{i % 20}" if i % 3 == 0 else f"h{i % 1500}" for i in range(HEAVY_ROWS)]
    order = rng.permutation(len(users))
    amounts = rng.integers(0, 40, size=len(users)) / 4.0
    return pa.table({"user_id": pa.array(users).take(order),
                     "word": pa.array(words).take(order), "amount": pa.array(amounts)})


def _run(folder, table, mechanism):
    return release_files(folder, table, SECRET, "prereduce_stages", {"max_keys_per_user": BOUND},
                         mechanism, files=RELEASED_AND_REPORT)


@pytest.mark.parametrize("mode", ["always", "auto"])
@pytest.mark.parametrize("case", sorted(MECHANISMS))
def test_release_bytes_are_the_same_with_the_step_and_without(tmp_path, monkeypatch, mode,
                                                              case):
    monkeypatch.setattr(prereduce, "MODE", mode)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)    # small tables here
    table = _release_records()
    reduced, with_step, whole, seen = with_and_without(
        monkeypatch, lambda: _run(str(tmp_path), table, MECHANISMS[case]),
        lambda: _without_steps(monkeypatch))
    assert pq.read_table(tmp_path / "out" / "released.parquet").num_rows > 0
    assert reduced == whole
    assert max(seen) == HEAVY_ROWS          # without the step h's rows all travel
    assert with_step and max(with_step) <= MOST_ROWS[case]


@pytest.mark.parametrize("case", sorted(MECHANISMS))
def test_a_heavy_user_is_bounded_not_refused(tmp_path, monkeypatch, capsys, case):
    """Whole users limited to 300 rows, one user with 2,000 rows on one word: the CLI
    release runs (exit 0, a released file). Without the steps the same run is refused
    (exit 2) naming ``mechanism.kind``."""
    monkeypatch.setattr(release, "MAX_USER_ROWS", 300)
    monkeypatch.setattr(user_shards, "MAX_USER_ROWS", 300)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)
    err = cli_runs_then_refused(str(tmp_path), capsys, heavy_user_input(str(tmp_path), amounts=True),
                                {"max_keys_per_user": BOUND}, MECHANISMS[case],
                                lambda: _without_steps(monkeypatch))
    assert "mechanism.kind: a user has more than 300 rows" in err


# ---- issue 43 round 8: the reader's hash of the keys alone is not hashed again -----------

def _prepared(seed, hashed_keys):
    rng = np.random.default_rng(seed)
    n = 3000
    raw = pa.table({"user": pa.array(rng.integers(0, 50, n).astype(str)),
                    "k": pa.array(np.char.add("k", rng.integers(0, 30, n).astype(str))),
                    "x": pa.array(np.round(rng.lognormal(3, 1, n), 2))})
    return pio.prepare_batch(raw, "user", ["k", "x"], identity_key=TEST_KEY,
                             hashed_keys=hashed_keys)[0]


def _pre_reduced(tables, monkeypatch):
    """What _PreReduceForBoundsFn hands on for ``tables`` (quantiles' two stages, every
    table reduced), and how many times it hashed __key again."""
    rehashed = []
    real = prereduce_stages.with_key_hash_of
    monkeypatch.setattr(prereduce_stages, "with_key_hash_of",
                        lambda *a: rehashed.append(1) or real(*a))
    source = keyed_random.KeyedSource(SECRET)
    bounds = [Bound(["k"], 2, "Q/BoundKeyValues", False, "x"), Bound(["k"], 2, "Q/BoundKeys", True)]
    fn = prereduce_stages._PreReduceForBoundsFn(bounds, source, "always", 1 << 20, ["k"])
    fn.start_bundle()
    out = [t for table in tables for t in fn.process(table)]
    out += [w.value for w in fn.finish_bundle()]
    return pa.concat_tables(out), len(rehashed)


def test_a_key_hash_the_reader_states_is_not_hashed_again(monkeypatch):
    """The CLI's reader of per-key quantiles hashes the keys alone (``hashed_keys``) and
    says so on the ``__key`` field (``tables.key_hash_field``); the pre-reduction then
    hands that hash on without hashing every row again (issue 43 round 8; the code before
    rehashed every table: fails there). A reader that does not say so (the Python API's,
    hashing keys and value) is rehashed, as is a bundle mixing the two. The rows and
    ``__key`` handed on are the same either way."""
    from thresher.transforms.plumbing.tables import key_hash_is_of
    from thresher.transforms.randomness.hashing import hash_columns
    stated = [_prepared(seed, ("k",)) for seed in range(3)]
    unstated = [_prepared(seed, None) for seed in range(3)]
    assert all(key_hash_is_of(t, ["k"]) for t in stated)
    assert not any(key_hash_is_of(t, ["k"]) for t in unstated)
    assert not key_hash_is_of(stated[0], ["k", "x"])
    for t in stated:     # the stated hash is the one the pre-reduction computes
        assert np.array_equal(t.column("__key").to_numpy(), hash_columns(t, ["k"]))
    got, rehashed = _pre_reduced(stated, monkeypatch)
    assert rehashed == 0
    want, rehashed = _pre_reduced(unstated, monkeypatch)
    assert rehashed == 1
    assert got.drop_columns(["__key"]).equals(want.drop_columns(["__key"]))
    assert got.column("__key").equals(want.column("__key"))
    assert key_hash_is_of(want, ["k"])
    _, rehashed = _pre_reduced([stated[0], unstated[1]], monkeypatch)
    assert rehashed == 1


def test_quantiles_two_stages_choose_and_group_the_heavy_rows_once(monkeypatch):
    """Per-key quantiles' two stages (BoundKeyValues, BoundKeys) share one choice of the
    heavy users' rows and one grouping of them by user per table (issue 43 round 8: each
    stage made both, the same rows twice); the union kept is the one of each stage on
    its own (``stage_rows`` with no memo). Fails on the code before (two of each)."""
    from thresher.transforms.bounding import user_shards as shards
    calls = {"heavy": 0, "grouped": 0}
    heavy, grouped = prereduce.heavy_user_rows, shards.exact_users_with_order

    def counting_heavy(*a):
        calls["heavy"] += 1
        return heavy(*a)

    def counting_grouped(*a):
        calls["grouped"] += 1
        return grouped(*a)
    rng = np.random.default_rng(3)
    n = 20000
    table = _prepared(3, ("k",)).take(pa.array(rng.integers(0, 3000, n)))
    table = table.set_column(0, "__user", pa.array(
        rng.integers(0, 40, n).astype(np.uint64) * np.uint64(0x9E3779B97F4A7C15)))
    table = table.set_column(1, "__user_lo", pa.array(np.zeros(n, np.uint64)))
    source = keyed_random.KeyedSource(SECRET)
    bounds = [Bound(["k"], 2, "Q/BoundKeyValues", False, "x"), Bound(["k"], 2, "Q/BoundKeys", True)]
    alone = [prereduce_stages.stage_rows(table, b, source, "auto", ("k",))[0] for b in bounds]
    monkeypatch.setattr(prereduce, "heavy_user_rows", counting_heavy)
    monkeypatch.setattr(prereduce_stages, "exact_users_with_order", counting_grouped)
    monkeypatch.setattr(prereduce, "exact_users_with_order", counting_grouped)
    keep, _ = kept_rows(table, bounds, source, "auto", ("k",))
    assert calls == {"heavy": 1, "grouped": 1}
    assert keep is not None and not keep.all()
    assert np.array_equal(keep, alone[0] | alone[1])

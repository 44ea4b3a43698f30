"""The adaptive rounds read the user shuffle's pieces per consumer (issue 43, item 4;
``transforms.selection.adaptive_rounds.ShardedUsers``).

Each round and the count stage concatenate the shuffled (spilled) pieces themselves
instead of one concatenation materialised for all of them (1.8 GB at 1e7 rows). Checked
under one fixed secret, through ``release.run`` on an input large enough for several user
shards and the spilled shuffle, for ``kind: adaptive`` and heavy_hitters' ``method:
adaptive``: the published file and report are byte-identical with the per-consumer
concatenation, with one concatenation for every consumer (the code before), and with the
shuffle in memory (no spill: heavy_hitters did not spill before); and with it every
consumer (two rounds and the count stage) really reads the pieces again, while the key
hash of a spilled shard is checked by its first consumer only (``concat_shard``
remembers the shard's facts; a shard whose hash collides is never stamped exact).
"""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.running import release
from thresher.transforms.bounding import per_user_bound, user_shards
from thresher.transforms.plumbing import spill
from thresher.transforms.selection import adaptive_rounds
from thresher.transforms.selection.adaptive_rounds import ShardedUsers
from tests.transforms.release_runs import RELEASED_AND_REPORT, release_files

SECRET = b"test-only secret: adaptive rounds per consumer"
MECHANISMS = {"adaptive": {"kind": "adaptive"},
              "hh_adaptive": {"kind": "heavy_hitters", "top_k": 8, "method": "adaptive"}}


def _records(seed=11):
    """6,000 users of 4 rows (24,000 rows: more than one shard, spilled) over 40 common
    words of zipf-like weights and 2,000 rare ones; rows shuffled."""
    rng = np.random.default_rng(seed)
    n = 24000
    users = np.repeat(np.arange(6000), 4)
    common = np.minimum(rng.zipf(1.3, size=n) - 1, 39)
    rare = rng.integers(0, 2000, size=n)
    words = np.where(rng.random(n) < 0.8, [f"w{w}" for w in common], [f"r{w}" for w in rare])
    order = rng.permutation(n)
    return pa.table({"user_id": pa.array([f"u{u}" for u in users[order]]),
                     "word": pa.array(words[order])})


def _run(folder, table, mechanism):
    return release_files(folder, table, SECRET, "adaptive_rounds_sharded",
                         {"max_keys_per_user": 3}, mechanism, files=RELEASED_AND_REPORT,
                         row_group_size=2000)


# module level: the runner unpickles the counting steps by reference
_COUNT = [0, 0, 0]     # shards concatenated, spilled pieces they read, key-hash checks
_CONCAT = user_shards._concat_shard
_CONCAT_ONCE_CHECKED = adaptive_rounds.concat_shard
_KEY_HASH_IS_EXACT = per_user_bound.key_hash_is_exact
_HASH_EXACT_PER_USER = per_user_bound.hash_exact_per_user


def _counted(shard_and_tables):
    _, tables = shard_and_tables
    tables = list(tables)
    _COUNT[0] += 1
    _COUNT[1] += sum(isinstance(t, str) for t in tables)
    return shard_and_tables[0], tables


def _counting_concat(shard_and_tables, *args, **kwargs):
    yield from _CONCAT(_counted(shard_and_tables), *args, **kwargs)


def _counting_concat_once_checked(shard_and_tables, *args, **kwargs):
    yield from _CONCAT_ONCE_CHECKED(_counted(shard_and_tables), *args, **kwargs)


def _counting_check(table, key_columns):
    _COUNT[2] += 1
    return _KEY_HASH_IS_EXACT(table, key_columns)


def _counting_check_per_user(table, key_columns, ranks, rows=None):
    """The bound's first check (on its ranking): one check of the shard where it decides;
    where it does not, the table-wide check it falls back to is the one counted."""
    exact = _HASH_EXACT_PER_USER(table, key_columns, ranks, rows=rows)
    _COUNT[2] += bool(exact)
    return exact


@pytest.fixture
def shards_read(monkeypatch):
    """[user shards concatenated, spilled pieces they read, key-hash checks (the bound's
    per-user check where it decides, else the table-wide one)] (the in-process runner
    runs them in this process)."""
    _COUNT[:] = [0, 0, 0]
    monkeypatch.setattr(user_shards, "_concat_shard", _counting_concat)
    monkeypatch.setattr(adaptive_rounds, "concat_shard", _counting_concat_once_checked)
    monkeypatch.setattr(per_user_bound, "key_hash_is_exact", _counting_check)
    monkeypatch.setattr(per_user_bound, "hash_exact_per_user", _counting_check_per_user)
    monkeypatch.setattr(adaptive_rounds, "key_hash_is_exact", _counting_check)
    return _COUNT


@pytest.mark.parametrize("case", sorted(MECHANISMS))
def test_per_consumer_concatenation_publishes_the_same_bytes(tmp_path, monkeypatch,
                                                            shards_read, case):
    table = _records()
    per_consumer = _run(str(tmp_path), table, MECHANISMS[case])
    shards, pieces, checks = shards_read
    assert pq.read_table(tmp_path / "out" / "released.parquet").num_rows > 0

    monkeypatch.setattr(ShardedUsers, "PER_CONSUMER", False)      # the code before
    shards_read[:] = [0, 0, 0]
    once = _run(str(tmp_path), table, MECHANISMS[case])
    shards_once, pieces_once, checks_once = shards_read
    assert per_consumer == once
    # several shards, spilled; each of the two rounds and the count stage read them again
    assert shards_once > 1 and pieces_once > 0
    assert (shards, pieces) == (3 * shards_once, 3 * pieces_once)
    # before: every consumer checked the key hash of its shard; now the first one only
    assert checks_once == 3 * shards_once and checks == shards_once

    monkeypatch.setattr(ShardedUsers, "PER_CONSUMER", True)       # in memory, per consumer
    monkeypatch.setattr(release, "_spill_dir", lambda pipeline, staging: None)
    shards_read[:] = [0, 0, 0]
    in_memory = _run(str(tmp_path), table, MECHANISMS[case])
    assert shards_read[0] == 3 * shards_once and shards_read[1] == 0
    assert shards_read[2] == 3 * shards_once      # nothing to remember a shard by
    assert per_consumer == in_memory


def test_the_first_consumers_facts_are_the_shards_own(monkeypatch):
    """A shard whose key hash collides (two words forced onto one ``__key``) is not
    stamped, for the first consumer or the next (the facts remembered are the shard's),
    and every consumer gets the table ``_concat_shard`` gives."""
    import tempfile
    monkeypatch.setattr(adaptive_rounds, "_SHARD_FACTS", {})
    rng = np.random.default_rng(3)
    n = 500
    table = pa.table({"__user": pa.array(rng.integers(0, 50, n).astype(np.uint64) << 40),
                      "__user_lo": pa.array(rng.integers(0, 50, n).astype(np.uint64)),
                      "__key": pa.array(rng.integers(0, 30, n).astype(np.uint64)),
                      "word": pa.array([f"w{i}" for i in rng.integers(0, 30, n)])})
    exact = table.set_column(2, "__key", pa.array(
        per_user_bound.exact_key_codes(table, ["word"]).astype(np.uint64)))
    colliding = exact.set_column(2, "__key", pa.array(
        np.minimum(exact.column("__key").to_numpy(), 5)))    # words 0..5+ share a hash
    with tempfile.TemporaryDirectory() as folder:
        for case, shard_table, stamped in (("exact", exact, True),
                                           ("colliding", colliding, False)):
            paths = [spill.write_piece(shard_table.slice(i, 100), folder)
                     for i in range(0, n, 100)]
            want = list(user_shards._concat_shard((0, paths), key_columns=["word"]))
            for consumer in range(3):
                got = list(adaptive_rounds.concat_shard((0, paths), key_columns=["word"]))
                assert len(got) == len(want) == 1
                assert got[0].equals(want[0]), (case, consumer)
                assert per_user_bound.key_hash_known_exact(got[0], ["word"]) is stamped
                assert not per_user_bound.key_hash_known_exact(got[0], ["other"])


def test_a_piece_rewritten_after_the_first_consumer_is_checked_again(monkeypatch):
    """The remembered facts are re-verified: a piece file rewritten in place after the
    first consumer (here with a colliding ``__key``) is checked again by the next one,
    which then does not stamp the table (with the facts keyed by names alone it would)."""
    import tempfile
    monkeypatch.setattr(adaptive_rounds, "_SHARD_FACTS", {})
    rng = np.random.default_rng(5)
    n = 300
    table = pa.table({"__user": pa.array(rng.integers(0, 40, n).astype(np.uint64) << 40),
                      "__user_lo": pa.array(rng.integers(0, 40, n).astype(np.uint64)),
                      "__key": pa.array(np.zeros(n, dtype=np.uint64)),
                      "word": pa.array([f"w{i}" for i in rng.integers(0, 20, n)])})
    exact = table.set_column(2, "__key", pa.array(
        per_user_bound.exact_key_codes(table, ["word"]).astype(np.uint64)))
    colliding = exact.set_column(2, "__key", pa.array(
        np.minimum(exact.column("__key").to_numpy(), 3)))
    with tempfile.TemporaryDirectory() as folder:
        paths = [spill.write_piece(exact.slice(i, 100), folder) for i in range(0, n, 100)]
        first = list(adaptive_rounds.concat_shard((0, paths), key_columns=["word"]))
        assert per_user_bound.key_hash_known_exact(first[0], ["word"])
        rewritten = spill.write_piece(colliding.slice(0, 100), folder)
        os.replace(rewritten, paths[0])                # same name, other content
        want = list(user_shards._concat_shard((0, paths), key_columns=["word"]))
        got = list(adaptive_rounds.concat_shard((0, paths), key_columns=["word"]))
        assert got[0].equals(want[0])
        assert not per_user_bound.key_hash_known_exact(got[0], ["word"])


def test_the_rounds_read_two_rounds_and_a_count_stage():
    """The factor 3 above: the default adaptive release has two rounds."""
    from thresher.accounting import adaptive as ad
    assert ad.DEFAULT_ROUNDS == 2
    assert adaptive_rounds.ShardedUsers.PER_CONSUMER is True

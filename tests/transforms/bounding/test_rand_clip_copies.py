"""l1 rand-clip on (record, copies) rows (issue 43, item 2;
transforms/bounding/rand_clip_copies.py).

A user's repeated records travel through the user shuffle as one row per table with
their count, and the kernel numbers the copies as the row kernel does. Checked here
under one fixed secret (exact comparisons, no statistics):

- the kernel: collapsing any split of the records into tables, then rand-clipping the
  concatenated (record, count) rows, keeps the same records per key as rand-clipping
  the rows themselves, with the copies enumerated in small blocks;
- through ``release.run``: an l1 release publishes byte-identical files with the step
  (forced on every row, decided per table, or adding only the counts) and without it,
  and with it the heavy user hands the shuffle one row per distinct record and table;
- through the CLI with the whole-user limit lowered below the heavy user's rows: the
  release runs (exit 0) where it was refused, naming ``bounding.model``.
"""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines import cli
from thresher.pipelines.dataio import io as pio
from thresher.pipelines.running import release
from thresher.transforms.bounding import prereduce, rand_clip_copies, user_shards
from thresher.transforms.bounding.rand_clip_copies import rand_clip_copies_counts
from thresher.transforms.bounding.rand_clip_copies import collapse_copies
from thresher.transforms.bounding.user_shards import exact_users
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.user_identity import TEST_KEY
from tests.transforms.release_runs import (
    RELEASED_AND_REPORT, cli_runs_then_refused, cli_spec, heavy_user_input, release_files,
    with_and_without, without_step)

SECRET = b"test-only secret: rand-clip copies"
BOUND = 5
HEAVY_ROWS = 3000
USERS = 3000
L1 = {"max_keys_per_user": BOUND, "model": "l1"}


def _records(seed=11):
    """3,000 users with 1-8 rows over 20 words (repeats included), a heavy user h with
    3,000 rows over 12 words (many copies of each) and a user m with 200 rows over 150
    words; rows shuffled."""
    rng = np.random.default_rng(seed)
    users, words = [], []
    for u in range(USERS):
        for w in rng.integers(0, 20, size=1 + u % 8):
            users.append(f"o{u}")
            words.append(f"w{w}")
    users += ["h"] * HEAVY_ROWS
    words += [f"w{i % 12}" for i in rng.permutation(HEAVY_ROWS)]
    users += ["m"] * 200
    words += [f"m{i % 150}" for i in range(200)]
    order = rng.permutation(len(users))
    return pa.table({"user_id": pa.array(users).take(order),
                     "word": pa.array(words).take(order)})


def _counts(shard):
    """{word: kept records} of rand-clip on ``shard`` under the stage's keyed draws (the
    row kernel, or the copies kernel when the rows carry ``__copies``)."""
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "S/RandClip")
    counts = rand_clip_copies_counts(exact_users(shard), ["word"], BOUND, source)
    return dict(zip(counts.column("word").to_pylist(), counts.column("count").to_pylist()))


@pytest.mark.parametrize("block", [7, 1 << 20])
@pytest.mark.parametrize("batch_rows", [150, 2000, 50000])
def test_collapsed_copies_keep_the_records_the_rows_keep(monkeypatch, batch_rows, block):
    monkeypatch.setattr(rand_clip_copies, "BLOCK", block)
    prepared, _ = pio.prepare_batch(_records(), "user_id", ["word"], identity_key=TEST_KEY)
    # every other table collapsed: the others travel without __copies (nulls once
    # concatenated, as in a user shard: one copy a row)
    pieces = [collapse_copies(prepared.slice(start, batch_rows),
                              "always" if i % 2 == 0 else "never")
              for i, start in enumerate(range(0, prepared.num_rows, batch_rows))]
    collapsed = pa.concat_tables(pieces, promote_options="permissive")
    assert collapsed.num_rows < prepared.num_rows - HEAVY_ROWS / 4
    expected = _counts(prepared)
    assert sum(expected.values()) == (USERS + 2) * BOUND - sum(   # min(m_i, C) per user
        max(0, BOUND - (1 + u % 8)) for u in range(USERS))
    assert _counts(collapsed) == expected


def _run(folder, table):
    return release_files(folder, table, SECRET, "copies", L1, {"kind": "laplace"},
                         files=RELEASED_AND_REPORT)


@pytest.mark.parametrize("mode", ["always", "auto", "never"])
def test_l1_release_bytes_are_the_same_with_the_copies_step_and_without(tmp_path,
                                                                         monkeypatch, mode):
    monkeypatch.setattr(prereduce, "MODE", mode)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)    # small tables here
    monkeypatch.setattr(rand_clip_copies, "HEAVY_ROWS", 32)
    monkeypatch.setattr(rand_clip_copies, "BLOCK", 512)
    table = _records()
    reduced, with_step, whole, seen = with_and_without(
        monkeypatch, lambda: _run(str(tmp_path), table),
        lambda: without_step(monkeypatch, "_prereduced_heavy", says_if_ran=True))
    assert pq.read_table(tmp_path / "out" / "released.parquet").num_rows > 0
    assert reduced == whole
    assert max(seen) == HEAVY_ROWS            # without the step h's rows all travel
    if mode == "never":
        assert max(with_step) == HEAVY_ROWS
    else:   # one row per distinct record (h: 12 words; m: 150) per split
        assert max(with_step) <= 150


def test_a_heavy_user_under_l1_is_bounded_not_refused(tmp_path, monkeypatch, capsys):
    """Whole users limited to 300 rows, one user with 2,000 rows of one record: the CLI
    l1 release runs (exit 0). Without the step the same run is refused (exit 2) naming
    ``bounding.model``, and a user with more than 300 *distinct* records still is."""
    monkeypatch.setattr(release, "MAX_USER_ROWS", 300)
    monkeypatch.setattr(user_shards, "MAX_USER_ROWS", 300)
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 64)
    monkeypatch.setattr(rand_clip_copies, "HEAVY_ROWS", 32)
    err = cli_runs_then_refused(
        str(tmp_path), capsys, heavy_user_input(str(tmp_path)), L1, {"kind": "laplace"},
        lambda: without_step(monkeypatch, "_prereduced_heavy", says_if_ran=True))
    assert "bounding.model: a user has more than 300 rows" in err and "distinct" in err


def test_a_user_with_more_distinct_records_than_the_limit_is_still_refused(tmp_path,
                                                                           monkeypatch, capsys):
    """2,000 distinct records of one user, whole users limited to 300 rows: exit 2 naming
    ``bounding.model`` and saying that distinct records are what counts (no exact bounded
    algorithm is built for them: rand_clip_copies' docstring), never the user's count."""
    monkeypatch.setattr(release, "MAX_USER_ROWS", 300)
    monkeypatch.setattr(user_shards, "MAX_USER_ROWS", 300)
    spec = cli_spec(str(tmp_path), heavy_user_input(str(tmp_path), distinct=True), L1,
                    {"kind": "laplace"})
    assert cli.main(["run", spec, "--quiet"]) == 2
    err = capsys.readouterr().err
    assert "bounding.model: a user has more than 300 rows" in err and "distinct" in err
    assert "2,000" not in err and "2000" not in err
    assert not os.path.exists(tmp_path / "out")

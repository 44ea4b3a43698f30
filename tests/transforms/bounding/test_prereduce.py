"""Pre-reduction of a user's rows before the shuffle (transforms/bounding/prereduce.py; issue 30 D15).

Fixed-bound l0 bounding keeps each user's first C keys in one total order of the user's
exact keys, so rows outside a user's C smallest hashes in a batch can be dropped before
the shuffle. Checked here:

- the kernel: pre-reducing any split of the records into batches, then bounding, keeps
  exactly what bounding the whole records keeps (users holding colliding keys included,
  with the colliding keys in different batches);
- the per-table decision (``heavy_user_rows``): only users with more than 2C rows in a
  table are read by the kernel, and a table where that removes too little passes whole;
- the Beam step: every row passes it once (its counters), and what it emits bounds to
  the same keys;
- through ``pipelines.running.release.run`` under one fixed secret: the published bytes are the
  same with and without the step, with its decision forced either way (``MODE``), and a
  heavy user hands at most C rows per table to the user shuffle (about 3,000 without it).

No statistical assertions: every comparison is exact under a fixed secret.
"""
import numpy as np
import pyarrow as pa
import pytest

from thresher.pipelines.dataio import io as pio
from thresher.transforms.randomness import keyed_random
from thresher.transforms.bounding.per_user_bound import bound_table_l0
from thresher.transforms.bounding import prereduce
from thresher.transforms.bounding.prereduce import PreReduceL0, heavy_user_rows, prereduce_l0
from thresher.transforms.bounding.user_shards import exact_users
from thresher.transforms.randomness.user_identity import TEST_KEY
from tests.privacy.collisions import colliding_pair
from tests.transforms.release_runs import (
    HEAVY_ROWS, RELEASED_AND_REPORT, bounded_not_refused, release_files, released,
    with_and_without, without_step)
from tests.transforms.release_runs import heavy_and_colliding_users as _records

SECRET = b"test-only secret: prereduce D15."
BOUND = 4


def _bound_rows(table):
    """{(user word 0, user word 1, word)} that bounding keeps."""
    shard = exact_users(table)
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "S/PerUserBound")
    kept = shard.take(pa.array(bound_table_l0(shard, ["word"], BOUND, source)))
    return set(zip(kept.column("__user_hi" if "__user_hi" in kept.column_names else "__user")
                   .to_pylist(), kept.column("__user_lo").to_pylist(),
                   kept.column("word").to_pylist()))


@pytest.mark.parametrize("batch_rows", [97, 700, 5000])
def test_bounding_after_prereduction_keeps_the_same_keys(batch_rows):
    prepared, _ = pio.prepare_batch(_records(), "user_id", ["word"], identity_key=TEST_KEY)
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "S/PerUserBound")
    pieces = []
    for start in range(0, prepared.num_rows, batch_rows):
        batch = prepared.slice(start, batch_rows)
        pieces.append(batch.take(pa.array(prereduce_l0(batch, ["word"], BOUND, source))))
    reduced = pa.concat_tables(pieces)
    assert reduced.num_rows < prepared.num_rows - HEAVY_ROWS / 2   # h: <= C rows a batch
    assert _bound_rows(reduced) == _bound_rows(prepared)
    # bounding the reduced rows keeps C keys for h and v (the colliding keys count as keys)
    kept = _bound_rows(reduced)
    assert len(kept) == BOUND * 402


def _run(folder, table, aggregates=None):
    return released(folder, table, SECRET, "prereduce", {"max_keys_per_user": BOUND},
                    {"kind": "gaussian", "pre_threshold": 1}, aggregates=aggregates)


def _with_and_without(tmp_path, monkeypatch, aggregates=None):
    """(released bytes, most rows of one user per split) with and without the step."""
    table = _records()
    return with_and_without(monkeypatch, lambda: _run(str(tmp_path), table, aggregates),
                            lambda: without_step(monkeypatch))


def test_the_decision_reads_only_heavy_users_and_skips_tables_that_do_not_pay(monkeypatch):
    prepared, _ = pio.prepare_batch(_records(), "user_id", ["word"], identity_key=TEST_KEY)
    users = prepared.column("__user").to_numpy()
    counts = dict(zip(*np.unique(users, return_counts=True)))
    rows = heavy_user_rows(prepared, BOUND)
    # h (3,000 rows) and v (12 rows > 2C = 8); no ordinary user has more than 12 rows...
    heavy = {u for u, c in counts.items() if c > 2 * BOUND}   # h, v, the odd users (12 rows)
    read = set(users[rows])
    assert heavy <= read and np.all(np.diff(rows) > 0)
    # a light user is read only when it shares its bucket (top bits of the word) with others
    bits = (prepared.num_rows - 1).bit_length()
    bucket_rows = dict(zip(*np.unique(users >> np.uint64(64 - bits), return_counts=True)))
    assert all(bucket_rows[u >> np.uint64(64 - bits)] > 2 * BOUND for u in read - heavy)
    assert np.array_equal(rows, np.flatnonzero(np.isin(users, list(read))))
    # the table passes whole when too few rows could go
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", prepared.num_rows)
    assert heavy_user_rows(prepared, BOUND) is None
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", sum(counts[u] - BOUND for u in heavy))
    assert np.array_equal(heavy_user_rows(prepared, BOUND), rows)


def test_every_row_passes_the_step_once_and_bounds_to_the_same_keys(tmp_path, monkeypatch):
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    from thresher.transforms.plumbing import spill
    prepared, _ = pio.prepare_batch(_records(), "user_id", ["word"], identity_key=TEST_KEY)
    batches = [prepared.slice(start, 500) for start in range(0, prepared.num_rows, 500)]
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 100)   # tables of ~2,000 rows here
    pipeline = beam.Pipeline(runner=FnApiRunner())
    (pipeline
     | beam.Create(batches)
     | PreReduceL0(["word"], BOUND, keyed_random.KeyedSource(SECRET), "S/PerUserBound",
                   coalesce_rows=2000)
     | beam.Map(spill.write_piece, str(tmp_path)))
    result = pipeline.run()
    result.wait_until_finish()
    counters = {c.key.metric.name: c.committed for c in result.metrics().query(
        beam.metrics.MetricsFilter().with_namespace("thresher_not_private"))["counters"]}
    reduced = pa.concat_tables([spill.read_piece(str(path)) for path in tmp_path.iterdir()])
    assert counters["rows_prereduced_in"] == prepared.num_rows        # once per row
    # h (3,000 rows) leaves each table with at most C rows
    assert counters["rows_prereduced_out"] == reduced.num_rows < prepared.num_rows - 0.9 * HEAVY_ROWS
    assert 0 < counters["rows_prereduce_examined"] < prepared.num_rows
    assert _bound_rows(reduced) == _bound_rows(prepared)


@pytest.mark.parametrize("mode", ["auto", "always", "never"])
def test_release_bytes_are_the_same_and_a_heavy_user_shuffles_c_rows(tmp_path, monkeypatch,
                                                                      mode):
    monkeypatch.setattr(prereduce, "MODE", mode)
    reduced, with_step, whole, seen = _with_and_without(tmp_path, monkeypatch)
    assert len(reduced) > 500 and reduced == whole
    assert max(seen) >= HEAVY_ROWS / 2   # without the step h's rows travel (1,500 distinct)
    if mode == "never":
        assert max(with_step) == max(seen)
        return
    # v keeps at most C + 2 rows (its two colliding pairs may both rank in its first C
    # hashes); h at most C per split: at most C + 2 in all
    assert with_step and max(with_step) <= BOUND + 2


def test_aggregates_with_fixed_clips_release_the_same_bytes(tmp_path, monkeypatch):
    """Every row of a user's kept keys travels (the bounding sums their values): h's
    rows beyond its C smallest hashes in a batch do not."""
    aggregates = [{"column": "amount", "statistic": "sum", "clip": [0.0, 100.0]}]
    reduced, with_step, whole, seen = _with_and_without(tmp_path, monkeypatch, aggregates)
    assert len(reduced) > 500 and reduced == whole
    assert max(with_step) * 5 < max(seen)


# ---- the automatic bound (issue 43): one row per distinct (user, exact key) ----------------

AUTO_CANDIDATES = (1, 2, 3, 4, 6, 8, 11, 16)


def _auto_score():
    from thresher.accounting import contribution_bound
    thresholds = [10.0 + 3 * c for c in AUTO_CANDIDATES]
    return contribution_bound.make_score("gaussian", AUTO_CANDIDATES, 16,
                                         {"thresholds": thresholds})


def _kept_at(shard, bound):
    """{(identity word 0, word 1, word)} that bounding at ``bound`` keeps of a shard."""
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "S/PerUserBound")
    kept = shard.take(pa.array(bound_table_l0(shard, ["word"], bound, source)))
    word0 = "__user_hi" if "__user_hi" in kept.column_names else "__user"
    return set(zip(kept.column(word0).to_pylist(), kept.column("__user_lo").to_pylist(),
                   kept.column("word").to_pylist()))


def _pair_reduced(prepared, batch_rows, mode, cap=1 << 16):
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "S/PerUserBound")
    pieces = []
    for start in range(0, prepared.num_rows, batch_rows):
        batch = prepared.slice(start, batch_rows)
        keep, _ = prereduce.prereduce_pairs_table(batch, ["word"], cap, source, mode)
        pieces.append(batch if keep is None else batch.filter(pa.array(keep)))
    return pa.concat_tables(pieces)


@pytest.mark.parametrize("batch_rows,mode,cap", [
    (97, "always", None), (700, "always", None), (5000, "always", None),
    (5000, "auto", None), (700, "always", 20), (5000, "auto", 20)])
def test_auto_prereduction_keeps_every_score_and_every_kept_set(monkeypatch, batch_rows,
                                                                  mode, cap):
    """The one pass of ``auto`` (scored_table) on the pair-reduced records gives the same
    dropped term, the same key-cost partials (so the same V(C) at every candidate), the
    same running counts (per-key counts at every candidate), and bounding keeps the same
    (user, key) set at every candidate: prereduce.py's docstring, "The automatic bound".
    The colliding user v has its two pairs of equal-hash keys split across batches."""
    from thresher.transforms.bounding import scored_bound
    from thresher.transforms.bounding.scored_bound import scored_table, user_key_cap
    monkeypatch.setattr(prereduce, "MIN_REMOVED_ROWS", 10)     # small tables here
    if cap is not None:   # h (1,530 keys) is scored on its first 20: cut per batch
        monkeypatch.setattr(scored_bound, "USER_KEY_CAP", cap)
    prepared, _ = pio.prepare_batch(_records(), "user_id", ["word"], identity_key=TEST_KEY)
    reduced = _pair_reduced(prepared, batch_rows, mode, user_key_cap(AUTO_CANDIDATES))
    # rows repeating a (user, word) of their batch go: in one batch more than half of h's
    # 3,000 rows (it holds 1,530 words) and half of the odd users' rows
    assert reduced.num_rows < prepared.num_rows - (
        HEAVY_ROWS / 2 if (batch_rows, mode) == (5000, "always") else 10)
    if cap is not None and batch_rows == 5000:   # h: about 2 x 20 rows in all
        users = reduced.column("__user").to_numpy()
        assert np.unique(users, return_counts=True)[1].max() <= 2 * cap + 2
    whole, part = exact_users(prepared), exact_users(reduced)
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), "S/PerUserBound")
    counts_w, dropped_w, partials_w = scored_table(whole, ["word"], _auto_score(), source)
    counts_r, dropped_r, partials_r = scored_table(part, ["word"], _auto_score(), source)
    assert np.array_equal(dropped_w, dropped_r)
    assert [s for s, _ in partials_w] == [s for s, _ in partials_r]
    assert all(a.equals(b) for (_, a), (_, b) in zip(partials_w, partials_r))
    # one row per key; their order follows the keys' exact codes (first appearance in the
    # shard) where hashes collide: compared as a set of rows
    assert counts_w.sort_by("word").equals(counts_r.sort_by("word"))
    for bound in AUTO_CANDIDATES:
        assert _kept_at(part, bound) == _kept_at(whole, bound), bound


def test_distinct_pair_rows_keeps_one_row_per_user_and_exact_key():
    """Two users; u1 holds two keys with equal public hashes (kept as two keys)."""
    a, b = colliding_pair("dp")
    table = pa.table({"user_id": ["u1", "u1", "u1", "u2", "u1", "u2", "u1"],
                      "word": [a, b, a, "x", "x", "x", b]})
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY)
    rows = prereduce.distinct_pair_rows(prepared, ["word"])
    assert rows.tolist() == [0, 1, 3, 4]


def _auto_run(folder, table, pre_threshold):
    mechanism = {"kind": "gaussian"}
    if pre_threshold:
        mechanism["pre_threshold"] = 1
    return release_files(folder, table, SECRET, "prereduce_auto",
                         {"max_keys_per_user": "auto", "auto": {"max_bound": 16}}, mechanism,
                         files=RELEASED_AND_REPORT)


@pytest.mark.parametrize("pre_threshold", [True, False])
def test_auto_release_bytes_are_the_same_with_the_pair_step_on_and_off(tmp_path, monkeypatch,
                                                                       pre_threshold):
    """``max_keys_per_user: auto`` under one secret: the released file and the report are
    byte-identical with the pair step forced on (every row through the kernel) and with it
    removed, in both spec shapes; with it on, the heavy user h hands the user shuffle its
    distinct words only (about 1,500 + 30 of its 3,000 rows)."""
    monkeypatch.setattr(prereduce, "MODE", "always")
    table = _records()
    reduced, with_step, whole, seen = with_and_without(
        monkeypatch, lambda: _auto_run(str(tmp_path), table, pre_threshold),
        lambda: without_step(monkeypatch, "_prereduced_pairs"))
    assert len(reduced["released.parquet"]) > 500 and reduced == whole
    assert max(seen) == HEAVY_ROWS and max(with_step) <= 1530


def test_a_heavy_user_under_auto_is_bounded_not_refused(tmp_path, monkeypatch):
    """With the user key cap at 20 and whole users limited to 500 rows, h (3,000 rows on
    1,530 keys) is cut before the shuffle to its 20 smallest hash ranks per table and
    the release runs; it publishes the bytes of the in-memory path (no step, no row
    limit: h's 3,000 rows scored on its first 20 keys). Without the step the same limit
    refuses the run, naming the setting."""
    from thresher.transforms.bounding import scored_bound
    monkeypatch.setattr(scored_bound, "USER_KEY_CAP", 20)
    table = _records()
    bounded, unlimited = bounded_not_refused(
        monkeypatch, lambda: _auto_run(str(tmp_path), table, True),
        lambda: without_step(monkeypatch, "_prereduced_pairs"), 500,
        "bounding.max_keys_per_user")
    assert max(bounded) <= 2 * 20 + 2          # h (and v's colliding keys) at most 2 x cap
    assert max(unlimited) == HEAVY_ROWS


@pytest.mark.parametrize("spilled", [False, True])
def test_auto_pre_reduction_marks_its_rows_and_the_split_gathers_them(tmp_path, monkeypatch,
                                                                       spilled):
    """The automatic bound's pre-reduction hands the split its table whole with the kept
    rows marked (``user_shards.KEPT_COLUMN``), not a filtered copy (issue 43: the filter
    copied ~93 % of every table; here it keeps more than ``prereduce.MARK_MIN_KEPT`` of
    the rows: test_held_tables.py has a table that keeps fewer); the split's pieces hold
    the kept rows only (h: its distinct words, about 1,500 + 30 of its 3,000 rows), and
    the release is byte-identical to the one of the filtered tables, in both spec shapes,
    with the shuffle in memory and spilled (``tables.ShardSlices``' split)."""
    from thresher.pipelines.dataio import io as io_mod
    from thresher.pipelines.running import release
    from thresher.transforms.bounding import user_shards
    from thresher.transforms.plumbing import tables as tables_mod
    monkeypatch.setattr(prereduce, "MODE", "always")
    from thresher.transforms.plumbing import spill
    written, write_piece = [], spill.write_piece
    monkeypatch.setattr(spill, "write_piece",
                        lambda piece, folder: written.append(1) or write_piece(piece, folder))
    if spilled:   # the spill folder is for inputs that are not small
        monkeypatch.setattr(io_mod, "is_small_input", lambda rows, exact: False)
    table = _records()
    marked = []
    split = tables_mod.split_by_shard

    def recording(table, shard_ids, num_shards, **options):
        if user_shards.USER_COLUMN not in table.column_names:   # the key shuffle's
            return split(table, shard_ids, num_shards, **options)
        dropped = int(np.count_nonzero(np.asarray(shard_ids) >= num_shards))
        pieces = list(split(table, shard_ids, num_shards, **options))
        users = np.concatenate([p.column(user_shards.USER_COLUMN).to_numpy() for _, p in pieces])
        marked.append((dropped, sum(p.num_rows for _, p in pieces), table.num_rows,
                       int(np.unique(users, return_counts=True)[1].max())))
        return iter(pieces)

    monkeypatch.setattr(user_shards, "split_by_shard", recording)
    monkeypatch.setattr(tables_mod, "split_by_shard", recording)   # ShardSlices' splits
    for pre_threshold in (False, True):
        marked.clear()
        with_marks = _auto_run(str(tmp_path), table, pre_threshold)
        assert marked and all(d > 0 and kept + d == rows for d, kept, rows, _ in marked), marked
        assert max(most for *_, most in marked) <= 1530
        original = release.PreReducePairs
        with monkeypatch.context() as m:
            m.setattr(release, "PreReducePairs",
                      lambda *a, **k: original(*a, **{**k, "mark_kept": False}))
            marked.clear()
            filtered = _auto_run(str(tmp_path), table, pre_threshold)   # same folder, spec
            assert marked and all(d == 0 for d, *_ in marked), marked
        assert len(with_marks["released.parquet"]) > 500 and with_marks == filtered
    assert bool(written) == spilled


def test_the_gate_counts_only_the_rows_a_pre_reduction_kept():
    """``heavy_user_counts(kept=)``: a marked table's counts are those of its kept rows
    (the whole-user limit reads what the shuffle receives, never the dropped rows)."""
    from thresher.transforms.bounding.user_shards import heavy_user_counts
    table = _records()
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY)
    kept = np.random.default_rng(5).random(prepared.num_rows) < 0.4
    got = heavy_user_counts(prepared, 64, kept=kept)
    want = heavy_user_counts(prepared.filter(pa.array(kept)), 64)
    whole = heavy_user_counts(prepared, 64)
    assert got is not None and whole is not None
    assert np.array_equal(got[0], want[0]) and np.array_equal(got[1], want[1])
    assert int(got[1].max()) < int(whole[1].max())
    assert heavy_user_counts(prepared, 64, kept=np.zeros(prepared.num_rows, bool)) is None

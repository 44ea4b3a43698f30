"""What the steps before and after the user shuffle hold while they work (issue 43 round 9:
the peak-memory regressions of round 8).

- A DoFn's input element outlives its processing: Beam keeps each DoFn's last element
  (its ``DoFnContext`` and its invoker's arguments) until the next one arrives. So the
  automatic bound's pre-reduction hands the split a table marked whole
  (``user_shards.KEPT_COLUMN``) only where it keeps most of its rows
  (``prereduce.MARK_MIN_KEPT``); a table kept for a few of its rows (one heavy user's)
  leaves as a filtered copy, which is what the split's input then pins.
- A step that gathers tables and combines them into one copy (the pre-reductions' ``_flush``,
  the in-memory user split, a shard's concatenation of its spilled pieces) drops the
  gathered tables before its kernel runs, so a table's rows are held once, not twice.

Measured with pyarrow's allocated bytes (``pa.total_allocated_bytes``: Arrow's own
buffers, which ``tracemalloc`` does not see), never with a clock. Deterministic: fixed
data, fixed secret.
"""
import gc

import numpy as np
import pyarrow as pa
import pytest

from thresher.pipelines.dataio import io as pio
from thresher.transforms.bounding import prereduce, prereduce_stages, rand_clip_copies
from thresher.transforms.bounding import user_shards
from thresher.transforms.plumbing import spill
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.user_identity import TEST_KEY
from tests.transforms.release_runs import heavy_and_colliding_users

SECRET = b"test-only secret: held tables."
STAGE = "S/PerUserBound"


def _prepared(seed=5):
    prepared, _ = pio.prepare_batch(heavy_and_colliding_users(seed), "user_id", ["word"],
                                    identity_key=TEST_KEY)
    return prepared


def _pre_reduced_pairs(prepared, cap, tmp_path):
    """The tables ``PreReducePairs(mark_kept=True)`` hands on for ``prepared`` (one table),
    as written to files by the step after it."""
    import apache_beam as beam
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    pipeline = beam.Pipeline(runner=FnApiRunner())
    (pipeline
     | beam.Create([prepared])
     | prereduce.PreReducePairs(["word"], cap, keyed_random.KeyedSource(SECRET), STAGE,
                                mode="always", coalesce_rows=1, mark_kept=True)
     | beam.Map(spill.write_piece, str(tmp_path)))
    pipeline.run().wait_until_finish()
    return [spill.read_piece(str(path)) for path in tmp_path.iterdir()]


@pytest.mark.parametrize("cap,marked", [(20, False), (1 << 16, True)])
def test_a_table_kept_for_a_few_of_its_rows_leaves_filtered(tmp_path, cap, marked):
    """h (3,000 rows over 1,530 words) keeps about 2 x 20 rows at a cap of 20: of the
    table's 6,600 rows about 2,400 are kept (< MARK_MIN_KEPT), and the step hands on
    those rows alone, without the mark column. At a cap beyond h's words it keeps one row
    per (user, word), about 3,900 rows (> MARK_MIN_KEPT), and hands the table on whole,
    the kept rows marked. The rows the split takes are the same either way: those of
    ``prereduce_pairs_table``'s mask."""
    prepared = _prepared()
    source = keyed_random.StageSource(keyed_random.KeyedSource(SECRET), STAGE)
    keep, _ = prereduce.prereduce_pairs_table(prepared, ["word"], cap, source, "always")
    share = np.count_nonzero(keep) / prepared.num_rows
    assert (share >= prereduce.MARK_MIN_KEPT) == marked and 0.2 < share < 0.8, share
    (table,) = _pre_reduced_pairs(prepared, cap, tmp_path / str(cap))
    if marked:
        assert table.num_rows == prepared.num_rows
        kept = table.column(user_shards.KEPT_COLUMN).to_numpy(zero_copy_only=False)
        assert np.array_equal(kept, keep)
        table = table.filter(pa.array(kept)).drop_columns([user_shards.KEPT_COLUMN])
    else:
        assert user_shards.KEPT_COLUMN not in table.column_names
    assert table.equals(prepared.filter(pa.array(keep)))


def _fresh_batch(rng, rows=4000):
    """A prepared batch whose buffers are its own (a copy: nothing else holds them), so
    that dropping it frees its bytes."""
    users = [f"u{u}" for u in rng.integers(0, 300, size=rows)]
    words = [f"w{w}" for w in rng.integers(0, 5000, size=rows)]
    table = pa.table({"user_id": users, "word": words, "amount": pa.array(rng.random(rows))})
    prepared, _ = pio.prepare_batch(table, "user_id", ["word"], identity_key=TEST_KEY,
                                    value_columns=[("amount", "amount")])
    return prepared.take(pa.array(np.arange(rows)))


def _held_at_kernel(monkeypatch, fn, module, kernel, batches=8):
    """(bytes Arrow holds when ``module.kernel`` starts, bytes of the table it reads),
    feeding ``fn`` ``batches`` fresh batches, one at a time (the caller holds none)."""
    seen = []
    original = getattr(module, kernel)

    def recording(table, *args, **kwargs):
        gc.collect()
        seen.append((pa.total_allocated_bytes() - base, table.nbytes))
        return original(table, *args, **kwargs)

    monkeypatch.setattr(module, kernel, recording)
    gc.collect()
    base = pa.total_allocated_bytes()
    fn.start_bundle()
    rng = np.random.default_rng(7)
    for _ in range(batches):
        batch = _fresh_batch(rng)
        for _ in fn.process(batch):
            pass
    del batch
    (held, table_bytes), = seen
    return held, table_bytes


def _pairs_fn():
    return prereduce._PreReduceFn(["word"], None, keyed_random.KeyedSource(SECRET), STAGE,
                                  False, "always", 8 * 4000, auto_cap=4, mark_kept=True)


def _fixed_fn():
    return prereduce._PreReduceFn(["word"], 4, keyed_random.KeyedSource(SECRET), STAGE,
                                  False, "always", 8 * 4000)


def _bounds_fn():
    bounds = [prereduce_stages.Bound(["word"], 4, "S/BoundKeyValues", False, "amount")]
    return prereduce_stages._PreReduceForBoundsFn(bounds, keyed_random.KeyedSource(SECRET),
                                                  "always", 8 * 4000)


@pytest.mark.parametrize("make,module,kernel", [
    (_pairs_fn, prereduce, "prereduce_pairs_table"),
    (_fixed_fn, prereduce, "prereduce_table"),
    (_bounds_fn, prereduce_stages, "kept_rows"),
    (lambda: prereduce_stages._DistinctPairsFn(["word"], "always", 8 * 4000),
     prereduce_stages, "distinct_key_rows"),
    (lambda: rand_clip_copies._PreReduceCopiesFn("always", 8 * 4000),
     rand_clip_copies, "collapse_copies")])
def test_a_pre_reduction_drops_its_gathered_batches_before_its_kernel(monkeypatch, make,
                                                                      module, kernel):
    """Eight batches are combined into one table (a copy); when the kernel starts, Arrow
    holds that table and the last batch (Beam's, here the loop's, until the next
    element), not the eight batches beside their copy (about twice the table)."""
    held, table_bytes = _held_at_kernel(monkeypatch, make(), module, kernel)
    assert table_bytes > 0 and held < 1.3 * table_bytes, (held, table_bytes)


def test_the_in_memory_user_split_drops_its_gathered_tables_before_it_splits(monkeypatch):
    """The in-memory user split combines a bundle's tables up to ``coalesce_rows`` rows
    (one copy) and splits the copy: the tables it gathered are gone when it splits."""
    split = user_shards._SplitByUser(3, coalesce_rows=8 * 4000)
    held, table_bytes = _held_at_kernel(
        monkeypatch, _WindowedSplit(split), user_shards, "split_by_shard")
    assert table_bytes > 0 and held < 1.3 * table_bytes, (held, table_bytes)


class _WindowedSplit:
    """``_SplitByUser`` fed as Beam feeds it (one window), for :func:`_held_at_kernel`."""

    def __init__(self, fn):
        from apache_beam.transforms.window import GlobalWindow
        self._fn, self._window = fn, GlobalWindow()

    def start_bundle(self):
        self._fn.start_bundle()

    def process(self, table):
        return self._fn.process(table, self._window)


def test_a_shard_drops_its_spilled_pieces_once_it_has_combined_them(tmp_path, monkeypatch):
    """``concat_shard_with_order`` reads a shard's spilled pieces and combines them (one
    copy): when it sorts the shard by user, Arrow holds the combined table only."""
    rng = np.random.default_rng(7)
    paths = [spill.write_piece(_fresh_batch(rng), str(tmp_path)) for _ in range(8)]
    seen = []
    original = user_shards.exact_users_with_order

    def recording(table):
        gc.collect()
        seen.append((pa.total_allocated_bytes() - base, table.nbytes))
        return original(table)

    monkeypatch.setattr(user_shards, "exact_users_with_order", recording)
    gc.collect()
    base = pa.total_allocated_bytes()
    table, _ = user_shards.concat_shard_with_order((0, paths))
    (held, table_bytes), = seen
    assert table.num_rows == 8 * 4000
    assert table_bytes > 0 and held < 1.1 * table_bytes, (held, table_bytes)

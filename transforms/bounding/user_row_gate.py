"""Refuse a user over the whole-user limit before the user shuffle groups its rows.

Where no bounded algorithm cuts a user's rows before the shuffle (``bounding.model: l1``,
``kind: adaptive``, ``aggregates``, ``quantiles``, ``heavy_hitters``, a public key
domain: ``pipelines.running.release._whole_user_setting``), every row of a user meets in
one element, and a user with more than ``user_shards.MAX_USER_ROWS`` rows is refused
(``user_shards.check_user_rows``). That check reads the grouped shard, so it runs after
the runner has gathered the shard: on a runner that holds a group's values in memory
(Flink) a 1e8-row user ends the job with out-of-memory inside the group, before the check
(docs/scale.md, "Where it breaks", item 3).

This gate counts rows per user where the shuffle's tables are split (every row passes
``ShardByUser``'s split once) and holds the split pieces back, by a side input, until the
counts are summed over the whole input: a user known to pass the limit fails the run
there, before any piece reaches the group.

Cheap statistics only. Per split table (about ``COALESCE_ROWS`` rows), users are counted
in ``2**BUCKET_BITS`` buckets of the top bits of ``__user`` (one ``bincount``); only the
rows of buckets holding at least ``min_rows`` rows are counted exactly per identity
(``__user``, ``__user_lo``), so a table of light users costs one bincount and sends
nothing. The per-user counts so collected are lower bounds of the users' totals (the
rows of a user in tables where it had fewer than ``min_rows`` rows are not counted), so
the gate never refuses a user within the limit; a user spread thinly over very many
tables (fewer than ``min_rows`` rows in each) passes the gate and is still refused by
the check after the group. The refusal says only that the limit was passed (review F3),
like the check after the group.

Why the release is unchanged when nothing is refused: the gate passes every piece
through as it is; it only orders the group after the counts.

Why these settings are refused rather than pre-reduced like the fixed l0 bound
(:mod:`transforms.bounding.prereduce`; issue 43, item 2). A per-table cut must leave
every kernel's result, hence the published bytes, unchanged.

* l1 rand-clip (:mod:`transforms.bounding.rand_clip`): the j-th copy of record r of user
  u has priority mix64(mix64(h(r) XOR s_u) + j), copies numbered over all of u's rows,
  and the kernel keeps u's C smallest. Dropping rows of r removes the highest copy
  numbers, whatever row is dropped. A table holding one copy of r sees only j = 0: if r
  is once in table A and once in table B, and P(r, 0) is above both tables' C-th
  smallest, dropping it in both removes (r, 0) and (r, 1), though P(r, 1) may be among
  u's C smallest overall; the kept counts change. Per-table bottom-C is exact only when
  no record of u repeats in any table, which a table cannot know. An exact cut needs each
  record's count over all tables (a shuffle by (user, record): the heavy user's rows
  again) or a kernel that reads an explicit copy number (new priorities for repeated
  records: the published bytes of l1 releases would change).
* aggregates (:func:`transforms.values.aggregate_values.user_key_totals`): a kept (user,
  key)'s total is a float64 sum of its values in one canonical order (ascending); a
  per-table partial total adds them in another order, its rounding can differ in the
  last bit, and the grid conversion carries that into the published sums. Fixed clips
  already drop the keys a user cannot keep (``PreReduceL0`` with ``every_row``); the
  rows of the kept keys all travel.
* adaptive rounds re-bound each user's remaining keys in every round, and ``clip: auto``
  scores every user's totals (``prereduce``'s docstring); quantiles and heavy hitters
  read every record of a user in their own kernels.
"""
import apache_beam as beam
import numpy as np

from thresher.transforms.plumbing.tables import USER_COLUMN, USER_LOW_COLUMN

# A user is counted in a split table when its bucket holds at least this many rows there
# (never more than the limit itself: a lowered limit counts smaller users).
GATE_MIN_ROWS = 4096
BUCKET_BITS = 20
STATS = "user_row_stats"


def gate_min_rows(max_user_rows):
    return max(1, min(GATE_MIN_ROWS, int(max_user_rows)))


def heavy_user_counts(table, min_rows):
    """(identity pairs (k, 2) uint64, row counts (k,) int64) of the users of ``table``
    whose bucket (top ``BUCKET_BITS`` bits of ``__user``) holds at least ``min_rows``
    rows; None when no bucket does (the usual table)."""
    n = table.num_rows
    if n < min_rows:
        return None
    words = table.column(USER_COLUMN)
    words = (words.combine_chunks() if words.num_chunks != 1 else words.chunk(0)).to_numpy(
        zero_copy_only=False)
    bits = min(BUCKET_BITS, max(1, (n - 1).bit_length()))
    bucket = (words >> np.uint64(64 - bits)).astype(np.intp)
    counts = np.bincount(bucket, minlength=1 << bits)
    heavy = counts >= min_rows
    if not heavy.any():
        return None
    rows = np.flatnonzero(heavy[bucket])
    low = table.column(USER_LOW_COLUMN)
    low = (low.combine_chunks() if low.num_chunks != 1 else low.chunk(0)).to_numpy(
        zero_copy_only=False)
    pairs = np.stack([words[rows], low[rows].astype(np.uint64)], axis=1)
    unique, count = np.unique(pairs, axis=0, return_counts=True)
    return unique, count.astype(np.int64)


def _compact(pairs, counts):
    unique, inverse = np.unique(pairs, axis=0, return_inverse=True)
    total = np.bincount(inverse.ravel(), weights=counts, minlength=len(unique))
    return unique, total.astype(np.int64)


class MostRowsOfOneUser(beam.CombineFn):
    """Per-user partial counts -> the largest counted total of one user (0 if none).
    The accumulator holds the users counted so far (a few: users with at least
    ``min_rows`` rows in some table), compacted when it grows."""

    def create_accumulator(self):
        return (np.zeros((0, 2), dtype=np.uint64), np.zeros(0, dtype=np.int64))

    def add_input(self, acc, element):
        pairs, counts = element
        pairs = np.concatenate([acc[0], pairs])
        counts = np.concatenate([acc[1], counts])
        if len(counts) > 2 * len(acc[1]) + 1024:
            return _compact(pairs, counts)
        return pairs, counts

    def merge_accumulators(self, accs):
        accs = list(accs)
        return _compact(np.concatenate([a[0] for a in accs]),
                        np.concatenate([a[1] for a in accs]))

    def extract_output(self, acc):
        if not len(acc[1]):
            return 0
        return int(_compact(*acc)[1].max())


def _verdict(most_rows, max_user_rows, setting):
    if most_rows > max_user_rows:
        from thresher.transforms.bounding.user_shards import refusal
        raise refusal(max_user_rows, setting)
    return True


def _pass(piece, ready):
    return piece


def gated(pieces, stats, max_user_rows, setting):
    """``pieces`` (the split's output) held back until ``stats`` (per-user partial
    counts, :func:`heavy_user_counts`) are summed; the run fails (``InputError`` naming
    ``setting``) when one user's counted rows pass ``max_user_rows``."""
    verdict = (stats
               | "MostRowsOfOneUser" >> beam.CombineGlobally(MostRowsOfOneUser())
               | "RefuseUserOverLimit" >> beam.Map(_verdict, max_user_rows, setting))
    return pieces | "AfterUserRowCheck" >> beam.Map(
        _pass, beam.pvalue.AsSingleton(verdict)).with_output_types(
            pieces.element_type)

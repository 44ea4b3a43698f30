"""RandClip: keep a uniform random subset of min(m_i, C) of each user's records (l1 model).

Paper 002 (Liu et al., ICML 2023), Section 5, "rand-clip(N, C)": the histogram obtained
by sampling min(||N||_1, C) of the user's items without replacement. After it a user
adds at most C to any key and touches at most C keys (l1, l_inf and l0 norms <= C),
which is what Algorithm 3 (Laplace + threshold) needs.

Kernel :func:`rand_clip` is sort-based and vectorised: each record gets an independent
uniform 64-bit priority (``transforms.samplers.uniform_priorities``), records are sorted
by (user, priority) and a record is kept when its rank within its user is below C. The
kept set of a user is then a uniform random C-subset of its records (the C smallest of
i.i.d. uniform priorities), and depends only on that user's records and fresh
randomness (mechanisms.md, privacy model). Priorities tie with probability below
n^2 / 2^64 (ties are broken by input position).

:class:`RandClip` applies the kernel to user-sharded ``pyarrow.Table`` elements (every
record of a user in one element, the user id in ``__user``); C is an int or a
``beam.pvalue.AsSingleton`` side input (e.g. from ``ChooseContributionBound``).
"""
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from transforms import samplers

USER_COLUMN = "__user"


def rank_within_user(user_codes, priorities):
    """Rank (0-based) of each record among its user's records in increasing priority."""
    user_codes = np.asarray(user_codes)
    n = len(user_codes)
    order = np.lexsort((priorities, user_codes))
    sorted_users = user_codes[order]
    starts = np.flatnonzero(np.concatenate(
        [[True], sorted_users[1:] != sorted_users[:-1]]))
    group_start = np.repeat(starts, np.diff(np.append(starts, n)))
    ranks = np.empty(n, dtype=np.int64)
    ranks[order] = np.arange(n, dtype=np.int64) - group_start
    return ranks


def rand_clip(user_codes, rng, max_records_per_user):
    """Keep mask of rand-clip (paper 002 Sec. 5): min(m_i, C) uniform records per user.

    Args:
      user_codes: integer array, one entry per record (any integer ids; equal ids are
        the same user).
      rng: ``transforms.samplers.SecureRandom`` (pipelines) or a seeded
        ``numpy.random.Generator`` (tests).
      max_records_per_user: C, an integer >= 1.

    Returns:
      boolean array, True for kept records; exactly min(m_i, C) per user.
    """
    c = _bound(max_records_per_user)
    user_codes = np.asarray(user_codes)
    if user_codes.ndim != 1 or not np.issubdtype(user_codes.dtype, np.integer):
        if user_codes.size:
            raise ValueError("user_codes must be a 1-d integer array")
        user_codes = user_codes.reshape(-1).astype(np.int64)
    priorities = samplers.uniform_priorities(rng, len(user_codes))
    return rank_within_user(user_codes, priorities) < c


def user_codes_of(table, user_column=USER_COLUMN):
    """Integer user codes of a table's rows: the column itself when it is a null-free
    integer column, else its dictionary-encoding indices (nulls are one user)."""
    if user_column not in table.column_names:
        raise ValueError(f"table has no user column {user_column!r}; columns: "
                         f"{table.column_names}")
    column = table.column(user_column).combine_chunks()
    if pa.types.is_dictionary(column.type):
        column = column.dictionary_decode()
    if pa.types.is_integer(column.type) and column.null_count == 0:
        return column.to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
    encoded = pc.dictionary_encode(column, null_encoding="encode")
    return encoded.indices.to_numpy(zero_copy_only=False).astype(np.int64)


def rand_clip_table(table, max_records_per_user, rng, user_column=USER_COLUMN):
    """The rows of ``table`` that rand-clip keeps (all columns kept)."""
    if table.num_rows == 0:
        return table
    keep = rand_clip(user_codes_of(table, user_column), rng, max_records_per_user)
    return table.filter(pa.array(keep))


def _bound(value):
    if isinstance(value, (bool, np.bool_)) or int(value) != value or value < 1:
        raise ValueError(f"max_records_per_user must be an integer >= 1, got {value!r}")
    return int(value)


class _RandClipFn(beam.DoFn):
    def __init__(self, user_column, rng_factory=None):
        self._user_column = user_column
        self._rng_factory = rng_factory
        self._dropped = beam.metrics.Metrics.counter(
            "thresher", "rand_clip_dropped_records_NOT_PRIVATE")

    def setup(self):
        # A fresh CSPRNG per worker: never pickled, never replayed.
        self._rng = self._rng_factory() if self._rng_factory else samplers.secure_random()

    def process(self, table, max_records_per_user):
        kept = rand_clip_table(table, max_records_per_user, self._rng, self._user_column)
        self._dropped.inc(table.num_rows - kept.num_rows)
        if kept.num_rows:
            yield kept


class RandClip(beam.PTransform):
    """Rand-clip every user to at most C records (paper 002 Sec. 5).

    Input: PCollection[pyarrow.Table], user-sharded (all records of a user in one
    element), user id in ``user_column``. Output: the same tables restricted to the kept
    records. ``max_records_per_user`` is an int >= 1 or a side input
    (``beam.pvalue.AsSingleton``) carrying one. ``rng_factory`` is for tests only.
    """

    def __init__(self, max_records_per_user, *, user_column=USER_COLUMN, rng_factory=None,
                 label=None):
        super().__init__(label)
        if isinstance(max_records_per_user, (int, np.integer)):
            _bound(max_records_per_user)
        self._max_records_per_user = max_records_per_user
        self._user_column = user_column
        self._rng_factory = rng_factory

    def expand(self, tables):
        # pa.Table (all records of a set of users) -> pa.Table (kept records)
        return tables | "RandClipRecords" >> beam.ParDo(
            _RandClipFn(self._user_column, self._rng_factory), self._max_records_per_user)

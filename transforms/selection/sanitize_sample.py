"""SanitizeSample: private weighted sampling of per-key counts (PWS).

Cohen, Geri, Sarlos & Stemmer, "Differentially Private Weighted Sampling", AISTATS 2021
(``/work/shared/papers/001_57785b851e794451.txt``), Algorithm 2 with the probabilities of
Alg. 3 (keys) and Alg. 4 (keys and sanitized frequencies) from ``accounting.pws``.

Two uses of the same kernel:

- one step (``presampled=False`` in the parameters): the input holds every key with its
  count w >= 1; key x is reported with the end-to-end probability pi_w (sampling and
  sanitizing at once), with token j drawn from the row pi_{w,.};
- post-processing (``presampled=True``, PWS §1.1 "Practicality"): the input is an existing
  non-private sample, each key included independently with probability q_w of the declared
  scheme; a sampled key is reported with pi_w / q_w and token j with pi_{w,j} / q_w, which
  gives the same end-to-end distribution without the original data.

Output rows: the key columns, ``token`` (int64, the sanitized frequency j, 1 <= j <= w
before the shift rule for counts above the table; null when only keys are reported) and
``estimate`` (float64, the chosen estimator's a_j of w; null when only keys are reported).
True counts never leave the transform.
"""
import numpy as np
import pyarrow as pa
import scipy.sparse

import apache_beam as beam

from thresher.accounting import pws
from thresher.transforms.randomness import keyed_random, samplers

OUTPUT_COLUMNS = {"token": pa.int64(), "estimate": pa.float64()}


def _frequencies(frequencies):
    w = np.asarray(frequencies)
    if w.dtype.kind == "f":
        bad = ~np.isfinite(w) | (w != np.floor(w))
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            raise ValueError(f"frequency must be a whole number, got {w[row]!r} at row {row}")
        w = w.astype(np.int64)
    elif w.dtype.kind not in "iu":
        raise ValueError(f"frequencies must be integers, got dtype {w.dtype}")
    w = w.astype(np.int64, copy=False)
    if len(w) and w.min() < 1:
        row = int(np.argmin(w))
        raise ValueError(f"frequency must be >= 1, got {int(w[row])} at row {row}")
    return w


def sanitize(frequencies, *, keep_probabilities, frequency_table=None, rng,
             sampling_probabilities=None, beyond_table="clip"):
    """Sanitize keys with the given frequencies (PWS Algorithm 2); vectorised kernel.

    frequencies: int array (w >= 1) of the input keys.
    keep_probabilities: pi_0..pi_M (``accounting.pws.keep_probabilities``).
    frequency_table: the (M+1) x (M+1) table T[i, j] = pi_{i,j} (sparse or dense, or the
        banded rows ``ReleaseTables.band``) to also release tokens; None releases keys only.
    rng: per-key keyed streams (``transforms.randomness.keyed_random``) or a seeded numpy Generator (tests).
    sampling_probabilities: None for the one-step path; for the post-processing path, the
        probability q_w with which each input key was sampled (array like ``frequencies``).
    beyond_table: how counts w > M are treated: "clip" (as M) or "shift" (row M, token
        shifted by w - M; valid when the table is shift-stationary, see accounting.pws).

    Keys only: each key is kept by an exact Bernoulli(p) coin, p = pi_w (or pi_w / q_w).
    With frequencies: the token is the first column whose cumulative row sum c_j (the
    float ``accounting.pws.row_cdf`` gives; fl(c_j / q_w) when pre-sampled, clipped to 1)
    exceeds an exact uniform real U read from the key's words
    (``samplers.cdf_index``: the first word's 63-bit prefix against floor(2^63 c_j) as
    integers, later words only on a tie), and the key is kept iff there is one: token j
    with probability exactly c_j - c_{j-1}, no float uniform. ``accounting.pws.realized_delta``
    accounts for exactly these laws.

    Returns (keep: bool array, tokens: int64 array, 0 where not kept or keys only).
    """
    w = _frequencies(frequencies)
    n = len(w)
    keep_p = np.asarray(keep_probabilities, dtype=np.float64)
    m = len(keep_p) - 1
    if m < 1:
        raise ValueError("keep_probabilities must cover frequencies 0..M with M >= 1")
    if beyond_table not in ("clip", "shift"):
        raise ValueError(f"beyond_table must be 'clip' or 'shift', got {beyond_table!r}")
    row = np.minimum(w, m)
    q = None
    if sampling_probabilities is not None:
        q = np.asarray(sampling_probabilities, dtype=np.float64)
        if q.shape != w.shape:
            raise ValueError("sampling_probabilities must have one entry per frequency")
        bad = ~(q > 0) | (q > 1) | (keep_p[row] > q * (1 + 1e-12))
        if bad.any():
            r = int(np.flatnonzero(bad)[0])
            raise ValueError(f"sampling probability {q[r]!r} at row {r} is not in (0, 1] or is "
                             f"below the keep probability {keep_p[row[r]]!r}")
    tokens = np.zeros(n, dtype=np.int64)
    if frequency_table is None:
        p = keep_p[row] if q is None else keep_p[row] / q
        return samplers.bernoulli(rng, p), tokens
    table = frequency_table
    if not pws.is_band(table) and not (isinstance(table, scipy.sparse.csr_array)
                                       and table.has_sorted_indices):
        table = scipy.sparse.csr_array(table)
        table.sort_indices()
    if table.shape[0] != m + 1:
        raise ValueError(f"frequency_table has {table.shape[0]} rows, expected {m + 1}")
    prefixes = samplers.uniform_priorities(rng, n) >> np.uint64(1)   # one word per key
    keep = np.zeros(n, dtype=bool)
    # Keys that share a row (and, pre-sampled, the same q) share one cumulative row.
    if q is None:
        order = np.argsort(row, kind="stable")
        change = row[order][1:] != row[order][:-1]
    else:
        order = np.lexsort((q, row))
        change = (row[order][1:] != row[order][:-1]) | (q[order][1:] != q[order][:-1])
    starts = np.flatnonzero(np.r_[True, change]) if n else np.zeros(0, dtype=np.int64)
    ends = np.r_[starts[1:], n]
    for s, e in zip(starts, ends):
        idx = order[s:e]
        cols, cum = pws.row_cdf(table, int(row[idx[0]]))
        if len(cum) == 0:
            continue
        if q is not None:
            cum = cum / q[idx[0]]
        pos = samplers.cdf_index(rng, cum, prefixes[idx], elements=idx)
        hit = pos < len(cum)
        keep[idx[hit]] = True
        tokens[idx[hit]] = cols[pos[hit]]
    if beyond_table == "shift":
        over = keep & (w > m)
        tokens[over] += w[over] - m
    return keep, tokens


def _column_numpy(table, name):
    if name not in table.column_names:
        raise ValueError(f"input has no column {name!r} (columns: {', '.join(table.column_names)})")
    col = table.column(name)
    if col.null_count:
        raise ValueError(f"column {name!r} has {col.null_count} null values")
    return col.to_numpy()


def sanitize_table(table, tables, rng, *, key_columns, frequency_column="count"):
    """Sanitize one pyarrow Table of (key columns, frequency) with prebuilt
    ``accounting.pws.ReleaseTables``; returns the released rows (keys, token, estimate)."""
    params = tables.params
    w = _frequencies(_column_numpy(table, frequency_column)) if table.num_rows else \
        np.zeros(0, dtype=np.int64)
    q = tables.sampling_probabilities(w) if params.presampled else None
    keep, tokens = sanitize(w, keep_probabilities=tables.keep, frequency_table=tables.band,
                            rng=rng, sampling_probabilities=q, beyond_table=params.beyond_table)
    mask = pa.array(keep, type=pa.bool_())
    out = table.select(list(key_columns)).filter(mask)
    kept = int(keep.sum())
    if tables.band is None:
        token_col = pa.nulls(kept, type=pa.int64())
        estimate_col = pa.nulls(kept, type=pa.float64())
    else:
        token_col = pa.array(tokens[keep], type=pa.int64())
        estimate_col = pa.array(tables.estimate(tokens[keep]), type=pa.float64())
    return out.append_column("token", token_col).append_column("estimate", estimate_col)


def _as_parameters(params):
    if isinstance(params, pws.PWSParameters):
        return params
    return pws.PWSParameters.from_dict(params)


class _SanitizeFn(beam.DoFn):
    """pa.Table of per-key frequencies -> pa.Table of released rows."""

    def __init__(self, key_columns, frequency_column, rng_factory=None, stage=""):
        self._key_columns = tuple(key_columns)
        self._frequency_column = frequency_column
        self._rng_factory = rng_factory
        self._stage = stage
        self._rng = None

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table, params):
        tables = pws.release_tables(_as_parameters(params))  # cached per process
        rng = keyed_random.table_streams(self._rng_factory, self._rng, self._stage, table,
                                         self._key_columns)   # one stream per key
        released = sanitize_table(table, tables, rng, key_columns=self._key_columns,
                                  frequency_column=self._frequency_column)
        beam.metrics.Metrics.counter("thresher_not_private", "pws_input_keys").inc(table.num_rows)
        beam.metrics.Metrics.counter("thresher_not_private", "pws_released_keys").inc(released.num_rows)
        if released.num_rows:
            yield released


class SanitizeSample(beam.PTransform):
    """Private weighted sample of per-key frequencies (PWS Algorithm 2).

    Input: PCollection[pa.Table] with the key columns and an integer frequency column
    (``count`` for the pipeline's per-key user counts; a pre-sampled input's declared
    frequency column). Output: PCollection[pa.Table] of released rows: key columns,
    ``token`` and ``estimate`` (see the module docstring). ``params`` is a
    ``accounting.pws.PWSParameters``, its ``as_dict()``, or a side input
    (``beam.pvalue.AsSingleton``) carrying either; its ``presampled`` flag selects the
    post-processing path.
    """

    def __init__(self, params, key_columns, *, frequency_column="count", rng_factory=None):
        super().__init__()
        self._params = params
        self._key_columns = tuple(key_columns)
        self._frequency_column = frequency_column
        self._rng_factory = rng_factory  # keyed_random.KeyedDraws: source and stage label

    def expand(self, tables):
        # (key..., frequency) -> (key..., token, estimate)
        return tables | "SanitizeKeys" >> keyed_random.par_do(
            _SanitizeFn(self._key_columns, self._frequency_column,
                        *keyed_random.stage_of(self._rng_factory)),
            self._params)

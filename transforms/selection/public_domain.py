"""Releasing a histogram over a public key domain (paper 002 Section 4, Algorithm 1).

Stages (Arrow tables throughout, no per-row Python):

* :class:`RestrictToDomain` -- keep the records whose key is in the public domain (an
  exact left-semi join on the key columns); the others are dropped before bounding, so a
  user's bound C is spent only on keys that are released, and counted (Beam metric
  ``thresher_not_private/rows_dropped_not_in_public_keys``, not private).
* :class:`DomainZeroCounts` -- every domain key as a partial count 0 (key columns,
  ``__key`` hashed as ``pipelines.io.prepare_batch`` hashes keys, ``count`` 0), flattened
  with the bounded partial counts before ``SumCountsPerKey`` so each domain key comes out
  exactly once, including keys no user has.
* :class:`ChooseDomainBound` -- the bounded-domain rule for C (Lemma 4.2 / Thm 4.3 with the
  exponential mechanism, ``accounting.known_domain.DomainBoundRule``): per user shard a
  vector of per-candidate sums over its users, summed globally, one draw, materialised.
* :class:`NoisyDomainCounts` -- every key's count plus discrete Laplace / Gaussian noise,
  no threshold; optional clamping of negative counts and Poisson debiasing (Alg. 5), both
  post-processing.
"""
import logging
import weakref

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.accounting import known_domain
from thresher.transforms.randomness import keyed_random, samplers
from thresher.transforms.plumbing.arrow_coder import TABLE
from thresher.transforms.bounding.choose_contribution_bound import SumIntegers
from thresher.transforms.randomness.hashing import hash_columns
from thresher.transforms.randomness.user_identity import flat_array
from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN, USER_COLUMN

_LOG = logging.getLogger("thresher.public_domain")
NOT_PRIVATE = "thresher_not_private"
DOMAIN_ROWS_PER_ELEMENT = 1 << 16


# --------------------------------------------------------------------------------------
# kernels (pure given their arguments)
# --------------------------------------------------------------------------------------

def restrict_to_domain(table, domain, key_columns):
    """The rows of ``table`` whose key columns equal some row of ``domain`` (exact; keys
    of ``domain`` unique), in their order: :func:`domain_mask`."""
    if table.num_rows == 0:
        return table
    mask = domain_mask(table, domain, key_columns)
    return (table if mask.all() else table.filter(pa.array(mask))).combine_chunks()


# Membership, by the index and by the join alike: key values are compared exactly, in a
# type both sides hold (int32 and int64 as int64, an integer and a float as float64 when
# the integers are exact there, string and large_string as large_string, signed and
# unsigned integers as decimal128(20, 0)); -0.0 equals 0.0 (the reader folds it: one key,
# as its hash says); NaN and null equal nothing (the reader drops such keys). Types with
# no common type (text and numbers) are an error naming the column.
_ROW = "__domain_row"


def domain_mask(table, domain, key_columns):
    """Boolean mask of the rows of ``table`` whose key is in ``domain``: an exact
    left-semi join on the key columns, cast to common types (above)."""
    keys = list(key_columns)
    n = table.num_rows
    if n == 0 or domain.num_rows == 0:
        return np.zeros(n, dtype=bool)
    left, right = _comparable(table.select(keys), domain.select(keys), keys)
    right = right.filter(pa.array(~_has_nan(right, keys))) if _floats(right, keys) else right
    probe = left.append_column(_ROW, pa.array(np.arange(n, dtype=np.int64)))
    kept = probe.join(right, keys=keys, join_type="left semi", use_threads=False)
    mask = np.zeros(n, dtype=bool)
    mask[kept.column(_ROW).to_numpy()] = True
    return mask


def _floats(table, keys):
    return [k for k in keys if pa.types.is_floating(table.schema.field(k).type)]


def _has_nan(table, keys):
    nan = np.zeros(table.num_rows, dtype=bool)
    for name in _floats(table, keys):
        nan |= pc.fill_null(pc.is_nan(table.column(name)), False).to_numpy(zero_copy_only=False)
    return nan


def _comparable(left, right, keys):
    """``left`` and ``right`` (tables of the key columns) with each key column cast to a
    type both hold exactly, and -0.0 folded into 0.0."""
    for name in keys:
        a, b = left.schema.field(name).type, right.schema.field(name).type
        target = a if a == b else _common_type(name, a, b)
        left = left.set_column(keys.index(name), name, _exact_cast(left.column(name), target,
                                                                    name, b))
        right = right.set_column(keys.index(name), name, _exact_cast(right.column(name), target,
                                                                      name, a))
    return left, right


def _common_type(name, a, b):
    if (pa.types.is_integer(a) and pa.types.is_integer(b)
            and pa.types.is_signed_integer(a) != pa.types.is_signed_integer(b)):
        return pa.decimal128(20, 0)        # every int64 and uint64 value, exactly
    try:
        return pa.unify_schemas([pa.schema([(name, a)]), pa.schema([(name, b)])],
                                promote_options="permissive").field(name).type
    except (pa.ArrowTypeError, pa.ArrowInvalid):
        raise TypeError(f"key column {name!r}: the records hold {a} and the public domain "
                        f"{b}, which have no common type to compare keys in") from None


def _exact_cast(column, target, name, other):
    if column.type != target:
        try:
            column = column.cast(target, safe=True)
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            first = (str(exc).strip().splitlines() or [""])[0]
            raise TypeError(f"key column {name!r}: {column.type} keys cannot be compared "
                            f"exactly with {other} keys as {target}: {first}") from None
    if pa.types.is_floating(target):
        column = pc.add(column, pa.scalar(0.0, target))   # -0.0 + 0.0 = 0.0 (IEEE)
    return column


class DomainIndex:
    """Membership in a public key domain, built once per worker: the domain keys' public
    64-bit hashes (``transforms.randomness.hashing.hash_columns``), sorted. A batch's keys are
    looked up by one ``searchsorted`` over their hashes and each candidate is confirmed
    by comparing its values with the one domain key of that hash (the hash only finds
    the candidate; membership is exact). Keys whose hash several domain keys share (a
    collision inside the domain, rare and craftable), and a batch whose key types are not
    the domain's, fall back to the exact join (:func:`domain_mask`), which decides as the
    index does (-0.0 is 0.0, NaN and null are nothing; tests/transforms/
    test_public_domain_membership.py). So a batch costs O(rows), not a hash table of the
    whole domain per batch."""

    def __init__(self, domain, key_columns):
        self._keys = list(key_columns)
        self._domain = domain.select(self._keys).combine_chunks()
        hashes = hash_columns(self._domain, self._keys)
        self._order = np.argsort(hashes, kind="stable")
        self._sorted = hashes[self._order]

    def member(self, table):
        """Boolean mask of the rows of ``table`` whose key is in the domain."""
        n = table.num_rows
        if n == 0 or len(self._sorted) == 0:
            return np.zeros(n, dtype=bool)
        if any(table.schema.field(k).type != self._domain.schema.field(k).type
               for k in self._keys):
            return domain_mask(table, self._domain, self._keys)
        hashes = hash_columns(table, self._keys)
        left = np.searchsorted(self._sorted, hashes, side="left")
        right = np.searchsorted(self._sorted, hashes, side="right")
        single = np.flatnonzero(right - left == 1)
        mask = np.zeros(n, dtype=bool)
        if len(single):
            rows, at = pa.array(single), pa.array(self._order[left[single]])
            equal = np.ones(len(single), dtype=bool)
            for name in self._keys:
                # IEEE equality: -0.0 == 0.0 (one hash too), NaN != NaN, null -> False
                same = pc.equal(flat_array(table.column(name).take(rows)),
                                self._domain.column(name).take(at))
                equal &= pc.fill_null(same, False).to_numpy(zero_copy_only=False)
            mask[single[equal]] = True
        shared = np.flatnonzero(right - left > 1)
        if len(shared):   # several domain keys with this hash: the exact join decides
            part = table.select(self._keys).take(pa.array(shared))
            mask[shared[domain_mask(part, self._domain, self._keys)]] = True
        return mask


def pack(table):
    """A table as zstd-compressed Arrow IPC bytes: how a public domain travels in the
    pipeline graph. Beam pickles a DoFn's or a ``Create``'s arguments and compresses the
    pickle with bz2, which took ~50 s for a 3e5-key domain held as a table (issue 36
    D13); the packed bytes are a fraction of the size and cost milliseconds to pack."""
    sink = pa.BufferOutputStream()
    options = pa.ipc.IpcWriteOptions(compression="zstd")
    with pa.ipc.new_stream(sink, table.schema, options=options) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def unpack(data):
    """The table :func:`pack` packed."""
    return pa.ipc.open_stream(pa.BufferReader(data)).read_all().combine_chunks()


def zero_counts(domain, key_columns):
    """The domain as partial counts: key columns, ``__key`` (``transforms.randomness.hashing``, as
    ``pipelines.io.prepare_batch``), int64 ``count`` = 0."""
    keyed = domain.select(list(key_columns)).combine_chunks()
    return pa.table({**{k: keyed.column(k) for k in key_columns},
                     KEY_HASH_COLUMN: pa.array(hash_columns(keyed, key_columns), type=pa.uint64()),
                     "count": pa.array(np.zeros(keyed.num_rows, dtype=np.int64))})


def user_weights(table, model, user_column=USER_COLUMN):
    """w_i for each user of a user-sharded table: records (l1) or distinct keys (l0)."""
    if table.num_rows == 0:
        return np.zeros(0, dtype=np.int64)
    if model == "l0":
        table = table.group_by([user_column, KEY_HASH_COLUMN], use_threads=False).aggregate([])
    per_user = table.group_by([user_column], use_threads=False).aggregate([([], "count_all")])
    return per_user.column("count_all").to_numpy().astype(np.int64)


def noisy_domain_counts(counts, params, rng):
    """Released values for an int64 array of per-key counts under ``params`` (a kind's
    calibrate() dict with ``public_keys``): (count int64, debiased float64 or None).

    count = true count + discrete Gaussian(sigma) or discrete Laplace(scale) noise, every
    key, no threshold; negative values replaced by 0 if ``clamp_negative``. ``debiased``
    (Alg. 5, from the unclamped noisy count) when params carries ``debias``."""
    counts = np.asarray(counts, dtype=np.int64)
    if params["noise"] == "discrete_gaussian":
        draws = samplers.discrete_gaussian(rng, float(params["sigma"]), len(counts))
    elif params["noise"] == "discrete_laplace":
        draws = samplers.discrete_laplace(rng, float(params["scale"]), len(counts))
    else:
        raise ValueError(f"noise must be discrete_gaussian or discrete_laplace, got "
                         f"{params['noise']!r}")
    noisy = counts + np.asarray(draws, dtype=np.int64)
    debiased = None
    if params.get("debias"):
        d = params["debias"]
        debiased = known_domain.poisson_debias_counts(noisy, d["num_users"], d["per_user_bound"])
    if params.get("clamp_negative"):
        noisy = np.maximum(noisy, 0)
    return noisy, debiased


def release_domain_table(table, params, rng):
    """One batch of per-key counts -> released rows (key columns, noisy ``count``, and
    ``debiased`` when asked). The true counts never leave."""
    noisy, debiased = noisy_domain_counts(
        table.column("count").to_numpy(zero_copy_only=False), params, rng)
    idx = table.schema.get_field_index("count")
    out = table.set_column(idx, "count", pa.array(noisy, type=pa.int64()))
    if debiased is not None:
        out = out.append_column("debiased", pa.array(debiased, type=pa.float64()))
    return out


# --------------------------------------------------------------------------------------
# Beam stages
# --------------------------------------------------------------------------------------

class PackedDomain(beam.PTransform):
    """PBegin -> a PCollection of one element: the domain's key columns, packed
    (:func:`pack`). The graph holds the domain once, in this ``Create``; the stages that
    need it (:class:`RestrictToDomain`, :class:`DomainZeroCounts`, the writer's order)
    read it as a side input or an element."""

    def __init__(self, domain, key_columns, label=None):
        super().__init__(label)
        self._packed = pack(domain.select(list(key_columns)).combine_chunks())

    def expand(self, pbegin):
        # Impulse + Map, not Create: Create pickles its values twice more (its own
        # transform and a MaybeReshuffle), for one element that needs no reshuffle
        return (pbegin
                | "Impulse" >> beam.Impulse()
                | "Packed" >> beam.Map(_constant, self._packed))


def _constant(unused_impulse, value):
    return value


_SHARED = weakref.WeakKeyDictionary()    # pipeline -> [(domain, keys, PCollection)]


def packed_domain(pipeline, domain, key_columns):
    """``domain`` as a PCollection of its packed bytes: as it is when it already is one,
    else the pipeline's one :class:`PackedDomain` of that table and key columns (made on
    first use, then shared, so the graph holds each domain once)."""
    if isinstance(domain, beam.pvalue.PCollection):
        return domain
    keys = tuple(key_columns)
    made = _SHARED.setdefault(pipeline, [])
    for table, columns, pcoll in made:
        if table is domain and columns == keys:
            return pcoll
    pcoll = pipeline | f"PublicKeys{len(made) or ''}" >> PackedDomain(domain, keys)
    made.append((domain, keys, pcoll))
    return pcoll


class _RestrictFn(beam.DoFn):
    def __init__(self, key_columns):
        self._keys = tuple(key_columns)
        self._packed = None
        self._index = None

    def process(self, table, packed):
        if self._index is None or (packed is not self._packed and packed != self._packed):
            self._index = DomainIndex(unpack(packed), self._keys)   # once per worker
            self._packed = packed
        member = self._index.member(table)
        dropped = table.num_rows - int(member.sum())
        if dropped:
            beam.metrics.Metrics.counter(NOT_PRIVATE, "rows_dropped_not_in_public_keys").inc(dropped)
        if dropped < table.num_rows:
            yield table.filter(pa.array(member)) if dropped else table


class RestrictToDomain(beam.PTransform):
    """PCollection[pa.Table] of records -> the records whose key is in ``domain`` (a
    Table of the domain keys, or the PCollection of a :class:`PackedDomain`)."""

    def __init__(self, domain, key_columns, label=None):
        super().__init__(label)
        self._domain = domain
        self._keys = tuple(key_columns)

    def expand(self, records):
        packed = packed_domain(records.pipeline, self._domain, self._keys)
        return records | "SemiJoinDomain" >> beam.ParDo(
            _RestrictFn(self._keys), beam.pvalue.AsSingleton(packed)).with_output_types(TABLE)


def _zero_parts(packed_domain, key_columns, rows_per_element):
    zeros = zero_counts(unpack(packed_domain), key_columns)
    for start in range(0, zeros.num_rows, rows_per_element):   # one element per slice
        yield zeros.slice(start, rows_per_element).combine_chunks()


class DomainZeroCounts(beam.PTransform):
    """PBegin -> PCollection[pa.Table]: every domain key with count 0, in elements of at
    most ``rows_per_element`` keys, made on the worker from the packed domain
    (``domain``: a Table, or the PCollection of a :class:`PackedDomain`)."""

    def __init__(self, domain, key_columns, rows_per_element=DOMAIN_ROWS_PER_ELEMENT, label=None):
        super().__init__(label)
        self._domain = domain
        self._keys = tuple(key_columns)
        self._rows = int(rows_per_element)

    def expand(self, pbegin):
        packed = packed_domain(pbegin.pipeline, self._domain, self._keys)
        return packed | "ZeroCounts" >> beam.FlatMap(
            _zero_parts, self._keys, self._rows).with_output_types(TABLE)


class _StatisticFn(beam.DoFn):
    def __init__(self, rule, model, user_column):
        self._rule = rule
        self._model = model
        self._user_column = user_column

    def process(self, table):
        yield tuple(int(x) for x in self._rule.statistic(
            user_weights(table, self._model, self._user_column)))


class _DrawFn(beam.DoFn):
    def __init__(self, rule, epsilon, rng_factory=None, stage=""):
        self._rule = rule
        self._epsilon = epsilon
        self._rng_factory = rng_factory
        self._stage = stage
        self._draws = beam.metrics.Metrics.counter("thresher", "contribution_bound_draws")

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, statistic):
        rng = keyed_random.stage_stream(self._rng_factory, self._rng, self._stage)
        chosen, probabilities = self._rule.choose(statistic, self._epsilon, rng)
        self._draws.inc()
        _LOG.info("NOT PRIVATE (operator log only, never in outputs): bounded-domain rule %s, "
                  "candidates %s, statistic %s, scores %s, probabilities %s; chosen C = %d",
                  self._rule.kind, list(self._rule.candidates), list(statistic),
                  [round(float(x), 3) for x in self._rule.scores(statistic)],
                  np.round(probabilities, 6).tolist(), chosen)
        yield chosen


class ChooseDomainBound(beam.PTransform):
    """Choose C privately over a public domain (paper 002 Sec. 4.2): epsilon-DP.

    Input: user-sharded PCollection[pa.Table] (``transforms.bounding.user_shards.ShardByUser``) of
    records already restricted to the domain. Output: a PCollection of exactly one int,
    one of ``rule.candidates``, drawn once and materialised (a Reshuffle), as
    ``ChooseContributionBound`` does."""

    def __init__(self, rule, *, epsilon, model, rng_factory=None, user_column=USER_COLUMN,
                 label=None):
        super().__init__(label)
        if model not in ("l0", "l1"):
            raise ValueError(f"model must be l0 or l1, got {model!r}")
        if not (isinstance(epsilon, (int, float)) and 0 < epsilon < float("inf")):
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        self.rule = rule
        self.epsilon = float(epsilon)
        self._model = model
        self._rng_factory = rng_factory
        self._user_column = user_column

    def expand(self, users):
        return (users
                | "UserStatistic" >> beam.ParDo(_StatisticFn(self.rule, self._model,
                                                             self._user_column))
                | "SumStatistic" >> beam.CombineGlobally(SumIntegers(len(self.rule.candidates)))
                | "ExponentialMechanism" >> keyed_random.par_do(
                    _DrawFn(self.rule, self.epsilon, *keyed_random.stage_of(self._rng_factory)))
                | "Materialise" >> beam.Reshuffle())


class _NoisyDomainFn(beam.DoFn):
    def __init__(self, rng_factory=None, stage=""):
        self._rng_factory = rng_factory
        self._stage = stage

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, table, params):
        if table.num_rows:
            from thresher.transforms.selection.release_fn import identity_columns
            rng = keyed_random.table_streams(self._rng_factory, self._rng, self._stage, table,
                                             identity_columns(table))
            yield release_domain_table(table, params, rng)


class NoisyDomainCounts(beam.PTransform):
    """Per-key counts (key columns, ``count``; every domain key once) -> released rows.
    ``params``: a calibrate() dict or an ``AsSingleton`` side input carrying one."""

    def __init__(self, params, rng_factory=None, label=None):
        super().__init__(label)
        self._params = params
        self._rng_factory = rng_factory

    def expand(self, counts):
        return counts | "NoiseEveryKey" >> keyed_random.par_do(
            _NoisyDomainFn(*keyed_random.stage_of(self._rng_factory)),
            self._params).with_output_types(TABLE)

"""Randomness that survives recomputation: a keyed PRF over a per-release secret.

A runner may run a bundle twice (retries), recompute a stage, or materialise a side
input once per consumer (Beam's DaskRunner recomputes side inputs per partition). With
fresh OS randomness each recomputation would draw new noise, and a private choice
recomputed k times would spend its epsilon k times. thresher therefore derives every
random word of a release from

* a **release secret**: 32 bytes drawn from the OS CSPRNG (``os.urandom``) *inside the
  pipeline*, once per run, as a materialised singleton side input
  (:class:`PipelineSecret`: Impulse -> draw -> Reshuffle, the way the chosen bound is
  committed), never carried in the pipeline graph, so it is in no staged job, template
  or jar; never logged, never written to the report, the spec or any output
  (``docs/running.md``); and
* a **stable identity** of what is drawn: the stage (the full Beam label of the
  composite that draws, fixed when the pipeline is built, relative to the release's
  root composite when a user's pipeline applies the release: :func:`building`) and, for per-key draws, the
  canonical text of the key (:func:`row_identities`, the text form of
  ``transforms.hashing.canonical_text``); for per-user draws, the canonical text of the
  user's two identity words (:func:`bind_users`), a 128-bit PRF of the user id under a
  key derived from the same secret, computed when the record is read
  (``transforms.user_identity``; never a public hash, a rank in a shard or a grouping
  code, so a user's streams depend on nothing but its id and the secret),

through SHAKE256 keyed by prefix (FIPS 202; the construction of KMAC, a PRF under the
standard assumption on Keccak): the words of identity ``x`` in stage ``s`` are the
output of ``SHAKE256(K_s || b || x)`` for blocks ``b = 0, 1, ...`` (8 bytes each,
little-endian; block 0 has 8 words, later blocks 64), with the stage key
``K_s = SHAKE256("thresher-stage" || secret || s)`` (64 bytes). Every field before
``x`` has a fixed length, so distinct (stage, block, identity) give distinct inputs. The
stream of a key therefore depends on neither the bundle it arrives in nor the order of
rows, and a recomputation draws the very same words. The exact samplers of
``transforms.samplers`` consume these words unchanged (:class:`RowStreams` gives every
row its own stream, so vectorised sampling takes one word per row per round), so the
noise laws stay exact; the privacy guarantee becomes computational (an adversary who
cannot distinguish SHAKE256 from a random function sees exactly distributed noise).

How a stage that draws gets the secret (the pattern every draw site follows, e.g. a
per-user identity computed by the record reader):

1. its PTransform takes ``rng_factory=None`` and, at expansion, hands its DoFn
   ``keyed_random.resolve(self._rng_factory)`` (stored as the DoFn's ``_rng_factory``):
   in a release that is the release's :class:`PipelineSecret` (no secret in it);
2. it applies the DoFn with ``keyed_random.par_do(dofn, *side_inputs)`` instead of
   ``beam.ParDo``: for a :class:`PipelineSecret` this adds the secret's singleton side
   input and sets it on the DoFn's source before each ``process`` call;
3. ``process`` draws through :func:`stage_stream`, :func:`table_streams` or
   :func:`stage_source` (``setup`` calls :func:`worker_rng`).

Tests fix the randomness through the same argument: an explicit ``rng_factory`` (a
``KeyedSource`` with a known secret, or a seeded generator factory such as
:func:`seeded_for_tests`) is used as is (then, and only then, a secret is in the graph).

**Fail closed.** A transform given no ``rng_factory`` outside a release being built
raises :class:`NoSecretError` (a ``ThresherError`` naming what to pass) when it is
applied: there is no fallback to per-worker OS randomness, and user identities need a
``KeyedSource`` (or, in tests, :func:`seeded_for_tests` asked for by name:
``transforms.user_identity.identity_key``). Someone chaining the building blocks in their
own pipeline draws the secret with ``PipelineSecret.draw(pipeline)`` and passes that one
object to every transform (docs/running.md, "Secrets for the building blocks").
"""
import contextlib
import hashlib
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from thresher.errors import ThresherError
from thresher.transforms import samplers
from thresher.transforms.hashing import canonical_text

SECRET_BYTES = 32
_FIRST_WORDS = 8              # words of block 0 (one per row is the usual need)
_WORDS_PER_BLOCK = 64         # words of each later block
_STAGE_PREFIX = b"thresher-stage"
_WORD = np.dtype("<u8")       # words are read little-endian on every platform


def new_secret():
    """A fresh release secret from the OS CSPRNG (once per run, inside the pipeline:
    :class:`PipelineSecret`)."""
    return os.urandom(SECRET_BYTES)


def _block(key, identity, index):
    """Bytes of block ``index`` of the stream of ``identity`` under stage key ``key``."""
    words = _FIRST_WORDS if index == 0 else _WORDS_PER_BLOCK
    return hashlib.shake_256(key + int(index).to_bytes(8, "little") + identity).digest(8 * words)


def _locate(positions):
    """(block, offset) of word ``positions`` of a stream."""
    later = np.maximum(positions - _FIRST_WORDS, 0)
    block = np.where(positions < _FIRST_WORDS, 0, 1 + later // _WORDS_PER_BLOCK)
    offset = np.where(positions < _FIRST_WORDS, positions, later % _WORDS_PER_BLOCK)
    return block, offset


class KeyedSource:
    """The release secret, as a picklable argument of the transforms that draw.

    ``stream(stage, identity)`` is one sequential stream, ``rows(stage, identities)`` one
    stream per row. The secret never appears in ``repr`` or ``str``."""

    def __init__(self, secret):
        if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
            raise ValueError("a release secret must be at least 16 bytes")
        self._secret = bytes(secret)

    def __repr__(self):
        return "KeyedSource(<release secret, not shown>)"

    __str__ = __repr__

    def stage_key(self, stage):
        return hashlib.shake_256(
            _STAGE_PREFIX + len(self._secret).to_bytes(2, "little") + self._secret
            + stage.encode("utf-8")).digest(64)

    def stream(self, stage, identity=b""):
        """One sequential stream (a ``SecureRandom``-like generator) for (stage, identity)."""
        return KeyedStream(self.stage_key(stage), identity)

    def rows(self, stage, identities):
        """One stream per identity (a list of bytes): :class:`RowStreams`."""
        return RowStreams(self.stage_key(stage), identities)

    def __call__(self):  # pragma: no cover - every stage asks for its stream by name
        raise TypeError("a KeyedSource is not a generator factory: use stream() or rows()")


class KeyedStream(samplers.SecureRandom):
    """The uniform 64-bit words of SHAKE256(K_s || block || identity), in order."""

    def __init__(self, stage_key, identity):
        self._key = stage_key
        self._identity = bytes(identity)
        self._words = np.zeros(0, dtype=np.uint64)
        self._block = 0

    def bits(self, size):
        n = int(np.prod(size)) if size is not None else 1
        while len(self._words) < n:
            block = _block(self._key, self._identity, self._block)
            self._block += 1
            self._words = np.concatenate(
                (self._words, np.frombuffer(block, dtype=_WORD).astype(np.uint64)))
        words, self._words = self._words[:n], self._words[n:]
        return words.reshape(size) if size is not None else words[0]


class RowStreams:
    """Independent streams, one per row (row i's stream is ``KeyedStream(K_s, id_i)``).

    The samplers draw through :meth:`element_words` one word per element of a view; a
    view maps its elements to rows (``take`` a subset, ``repeat`` a row for several
    draws, ``element`` one row for a scalar slow path). Each row's words are consumed in
    the order its own draws ask for them, so a row's values depend only on its identity
    and its own parameters, never on the other rows of the batch."""

    def __init__(self, stage_key, identities):
        self._key = stage_key
        self._ids = list(identities)
        n = len(self._ids)
        digests = b"".join([_block(stage_key, i, 0) for i in self._ids])
        self._first = np.frombuffer(digests, dtype=_WORD).astype(np.uint64).reshape(
            n, _FIRST_WORDS)
        self._cursor = np.zeros(n, dtype=np.int64)
        self._more = {}
        self._stride = 1 << 32      # block numbers per row in the cache's combined index
        self.view = _RowView(self, np.arange(n), True)

    def __len__(self):
        return len(self._ids)

    def _gather(self, rows, positions):
        out = np.empty(len(rows), dtype=np.uint64)
        first = positions < _FIRST_WORDS
        out[first] = self._first[rows[first], positions[first]]
        later = np.flatnonzero(~first)
        if len(later):
            blocks, offsets = _locate(positions[later])
            wanted = rows[later] * self._stride + blocks
            unique, inverse = np.unique(wanted, return_inverse=True)
            words = np.frombuffer(b"".join([self._later_block(int(u)) for u in unique]),
                                  dtype=_WORD).astype(np.uint64).reshape(
                                      len(unique), _WORDS_PER_BLOCK)
            out[later] = words[inverse.ravel(), offsets]
        return out

    def _later_block(self, wanted):
        block = self._more.get(wanted)
        if block is None:
            row, index = divmod(wanted, self._stride)
            block = self._more[wanted] = _block(self._key, self._ids[row], index)
        return block


class _RowView:
    def __init__(self, root, owner, unique, runs=None):
        self._root = root
        self._owner = np.asarray(owner, dtype=np.int64)
        self._unique = unique
        self._runs = runs      # (distinct rows, run lengths) when owner is contiguous runs

    def __len__(self):
        return len(self._owner)

    def take(self, index):
        """The elements selected by a boolean mask or an index array."""
        index = np.asarray(index)
        return _RowView(self._root, self._owner[index], self._unique)

    def repeat(self, counts):
        """Element i repeated counts[i] times (several draws from one row's stream)."""
        counts = np.asarray(counts, dtype=np.int64)
        unique = self._unique and (len(counts) == 0 or int(counts.max()) <= 1)
        runs = (self._owner, counts) if self._unique else None
        return _RowView(self._root, np.repeat(self._owner, counts), unique, runs)

    def element(self, i):
        return _RowView(self._root, self._owner[[int(i)]], True)

    def element_words(self, n):
        owner = self._owner
        unique = self._unique
        if n != len(owner):
            if len(owner) != 1:
                raise ValueError(f"{n} words asked of {len(owner)} row streams")
            owner = np.repeat(owner, n)
            unique = n <= 1
        root = self._root
        if unique:
            positions = root._cursor[owner]
            root._cursor[owner] += 1
        elif self._runs is not None and n == len(owner):
            rows, counts = self._runs
            starts = np.cumsum(counts) - counts
            positions = np.arange(n) - np.repeat(starts - root._cursor[rows], counts)
            root._cursor[rows] += counts
        else:
            order = np.argsort(owner, kind="stable")
            ranked = owner[order]
            step = np.arange(len(ranked))
            starts = np.r_[True, ranked[1:] != ranked[:-1]] if len(ranked) else np.zeros(0, bool)
            rank_sorted = step - np.maximum.accumulate(np.where(starts, step, 0))
            rank = np.empty(len(ranked), dtype=np.int64)
            rank[order] = rank_sorted
            positions = root._cursor[owner] + rank
            np.add.at(root._cursor, owner, 1)
        return root._gather(owner, positions)

    def bits(self, size):
        n = int(np.prod(size)) if size is not None else 1
        words = self.element_words(n)
        return words.reshape(size) if size is not None else words[0]

    def random(self, size=None):
        """Uniform floats on [0, 1) with 53 bits (estimates only, as SecureRandom.random)."""
        words = self.bits(size if size is not None else 1)
        out = (words >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
        return out if size is not None else float(out[0])

    def __getstate__(self):
        raise TypeError("row streams are made on the worker, per batch, never pickled")


# --------------------------------------------------------------------------------------
# Identities and the DoFn helpers.

def _field_text(column):
    """Each value as bytes: strings/binaries as they are, integers and booleans in
    decimal, everything else in ``canonical_text`` form; nulls stay null."""
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else (
            column.chunk(0) if column.num_chunks else pa.array([], column.type))
    t = column.type
    if pa.types.is_dictionary(t):
        column = column.cast(t.value_type)
        t = column.type
    if pa.types.is_integer(t) or pa.types.is_boolean(t):
        column = pc.cast(column, pa.string())
    elif not (pa.types.is_string(t) or pa.types.is_large_string(t) or pa.types.is_binary(t)
              or pa.types.is_large_binary(t)):
        column = canonical_text(column)
    return column.cast(pa.large_binary())


def row_identities(table, columns):
    """The canonical identity (bytes) of each row's values in ``columns``: per value
    ``<length>:<bytes>`` (``N`` for null), joined by ``|``. Length prefixes make the
    encoding injective for a fixed column list."""
    fields = []
    for name in columns:
        text = _field_text(table.column(name))
        length = pc.cast(pc.cast(pc.binary_length(text), pa.string()), pa.large_binary())
        field = pc.binary_join_element_wise(length, text, pa.scalar(b":", pa.large_binary()))
        fields.append(pc.fill_null(field, pa.scalar(b"N", pa.large_binary())))
    if not fields:   # rows without identity would all share one stream
        raise ValueError("row_identities needs at least one identity column")
    joined = fields[0] if len(fields) == 1 else pc.binary_join_element_wise(
        *fields, pa.scalar(b"|", pa.large_binary()))
    return joined.to_pylist()


def worker_rng(factory):
    """For ``DoFn.setup``: the generator of a non-keyed factory (a seeded numpy
    Generator in tests), ``None`` for a :class:`KeyedSource` (streams are made per
    element, see below). No factory is an error (:func:`resolve`): a DoFn never falls
    back to OS randomness, which a retried bundle would draw afresh."""
    if isinstance(factory, KeyedSource):
        return None
    if factory is None:
        raise NoSecretError()
    return factory()


def stage_stream(factory, fallback, stage, identity=b""):
    """For ``process``: the keyed stream of (stage, identity), or the setup generator."""
    if isinstance(factory, KeyedSource):
        return factory.stream(stage, identity)
    return fallback


def table_streams(factory, fallback, stage, table, columns):
    """For ``process``: one keyed stream per row of ``table`` identified by its values
    in ``columns`` (a :class:`_RowView`), or the setup generator."""
    if isinstance(factory, KeyedSource):
        return factory.rows(stage, row_identities(table, columns)).view
    return fallback


class PipelineSecret(KeyedSource):
    """The release secret drawn inside the pipeline: a :class:`KeyedSource` that holds no
    secret in the graph. :meth:`draw` adds ``ReleaseSecret`` to the pipeline (Impulse ->
    ``new_secret()`` -> Reshuffle: the one drawn value is committed once, so retries and
    recomputations of consumers see the same secret); :func:`par_do` gives each drawing
    DoFn that singleton side input and sets it here before the DoFn processes an element.
    Pickling keeps neither the secret nor the side input."""

    def __init__(self):
        self._secret = None
        self._side = None

    @classmethod
    def draw(cls, pipeline):
        """The release's source, its secret drawn by a new ``ReleaseSecret`` stage."""
        source = cls()
        source._side = (pipeline
                        | "ReleaseSecret" >> beam.Impulse()
                        | "ReleaseSecret/Draw" >> beam.Map(_draw_secret)
                        | "ReleaseSecret/Materialise" >> beam.Reshuffle())
        return source

    def side_input(self):
        if self._side is None:
            raise RuntimeError("this PipelineSecret was not drawn in the pipeline being built")
        return beam.pvalue.AsSingleton(self._side)

    def set_secret(self, secret):
        if secret is not self._secret:
            if not isinstance(secret, (bytes, bytearray)) or len(secret) < 16:
                raise ValueError("a release secret must be at least 16 bytes")
            self._secret = bytes(secret)

    def stage_key(self, stage):
        if self._secret is None:
            raise RuntimeError("the release secret side input did not reach this DoFn: "
                               "apply it with keyed_random.par_do")
        return super().stage_key(stage)

    def __getstate__(self):
        return {"_secret": None, "_side": None}    # never the secret, never the graph

    def __setstate__(self, state):
        self.__dict__.update(state)


def _draw_secret(_):
    return new_secret()


def par_do(dofn, *args, **kwargs):
    """``beam.ParDo(dofn, *args, **kwargs)``, with the release secret's side input when
    the DoFn's ``_rng_factory`` is a :class:`PipelineSecret` (module docstring); then the
    stage also commits to the secret it read (``transforms.secret_commitment``: one secret
    per run, checked by the publisher)."""
    source = getattr(dofn, "_rng_factory", None)
    if isinstance(source, PipelineSecret):   # and its commitments, for the publisher's check
        from thresher.transforms.secret_commitment import CommittedParDo
        return CommittedParDo(dofn, source, args, kwargs)
    return beam.ParDo(dofn, *args, **kwargs)


class _WithSecret(beam.DoFn):
    """Runs ``inner`` with the secret side input set on its source first (the inner DoFn
    and this one share that source object: they are pickled together)."""

    def __init__(self, inner):
        super().__init__()
        self._inner = inner

    def setup(self):
        self._inner.setup()

    def start_bundle(self):
        self._inner.start_bundle()

    def process(self, element, *args, **kwargs):
        self._inner._rng_factory.set_secret(kwargs.pop("release_secret"))
        return self._inner.process(element, *args, **kwargs)

    def finish_bundle(self):
        return self._inner.finish_bundle()

    def teardown(self):
        self._inner.teardown()

    def default_label(self):
        return self._inner.default_label()


_BUILDING = []     # (KeyedSource, root label) of the release whose pipeline is being built


@contextlib.contextmanager
def building(source, root=""):
    """While a release's pipeline is built (``pipelines.release.build``), transforms
    given no ``rng_factory`` take the release's :class:`KeyedSource` (:func:`resolve`).

    ``root``: the full label of the composite the release's stages are built in (the
    Beam YAML transform's, ``pipelines.beam_yaml``; "" for ``thresher run``, whose stages
    are at the top of its pipeline). Stage identities (:func:`stage_name`) are taken
    relative to it, so one release's draws under one secret are the same wherever a
    user's pipeline applies it. Two releases never share a secret, so equal relative
    names in two releases of one pipeline name streams of different keys."""
    _BUILDING.append((source, root))
    try:
        yield
    finally:
        _BUILDING.pop()


class NoSecretError(ThresherError):
    """A transform that draws was applied with no secret to draw from (:func:`resolve`)."""

    def __init__(self):
        super().__init__(
            "this thresher transform draws random values and was given no secret: pass "
            "rng_factory=keyed_random.PipelineSecret.draw(pipeline) (a secret drawn once "
            "inside the pipeline; give the same object to every transform of one release) "
            "or rng_factory=keyed_random.KeyedSource(secret) (a secret of at least 16 "
            "bytes that you keep), or use thresher.Release(spec), which draws its own. "
            "Without one, user identities would be public and a retried bundle would draw "
            "different noise, so thresher refuses to run.")


def resolve(factory):
    """At expansion: an explicit factory, else the source of the release being built
    (:func:`building`), else :class:`NoSecretError`. There is no silent fallback: a
    transform used on its own (the public building blocks of ``thresher``) must be given
    its ``rng_factory``, so no production path draws per-worker OS randomness (a
    recomputed stage would spend its epsilon again) or uses a public identity key."""
    if factory is not None:
        return factory
    if _BUILDING and _BUILDING[-1][0] is not None:
        return _BUILDING[-1][0]
    raise NoSecretError()


class SeededForTests:
    """TESTS ONLY, asked for by name: a seeded numpy Generator per worker
    (``seeded_for_tests(seed)()``) and the PUBLIC test user-identity key
    (``transforms.user_identity.TEST_KEY``). Reproducible and fast for tests; it makes
    no privacy claim (anyone can compute the identities and the draws)."""

    public_test_identity = True

    def __init__(self, seed):
        self.seed = seed

    def __call__(self):
        return np.random.default_rng(self.seed)

    def __repr__(self):
        return f"seeded_for_tests({self.seed!r})"


def seeded_for_tests(seed):
    """TESTS ONLY: :class:`SeededForTests` (a seeded generator and the public test key)."""
    return SeededForTests(seed)


def stage_name(pvalue):
    """The full label of the composite being expanded (unique in the pipeline and the
    same every time the pipeline is built), relative to the root of the release being
    built (:func:`building`): the stage identity of its draws."""
    label = pvalue.pipeline._current_transform().full_label
    root = _BUILDING[-1][1] if _BUILDING else ""
    if root:
        if label == root:
            return ""
        if label.startswith(root + "/"):
            return label[len(root) + 1:]
    return label


class StageSource:
    """A release secret's stage: per-table row streams on demand (:meth:`bind`)."""

    def __init__(self, source, stage):
        self._key = source.stage_key(stage)

    def bind(self, table, **groups):
        return TableStreams(self._key, table, groups)

    def __getstate__(self):
        raise TypeError("stage sources are made on the worker, never pickled")


class TableStreams:
    """Row streams over one table, named column groups giving the rows' identities
    (``user=[...]``: one stream per user; ``pair=[...]``: per (user, key))."""

    def __init__(self, stage_key, table, groups):
        self._key = stage_key
        self._table = table
        self._groups = groups

    def rows(self, index, group):
        """A view with one stream per row ``index`` of the table, identified by the
        group's columns."""
        index = np.asarray(index, dtype=np.int64)
        ids = row_identities(self._table.take(pa.array(index)), self._groups[group])
        return RowStreams(self._key, ids).view


def stage_source(factory, fallback, stage):
    """For ``process`` of a per-user stage: a :class:`StageSource`, or the setup generator."""
    if isinstance(factory, KeyedSource):
        return StageSource(factory, stage)
    return fallback


def bind(rng, table, **groups):
    """``rng`` bound to ``table`` (a StageSource), or ``rng`` itself."""
    return rng.bind(table, **groups) if isinstance(rng, StageSource) else rng


def bind_users(rng, table, key_columns=(), user_column="__user"):
    """``rng`` bound to a table of whole users: group ``user`` gives one stream per user,
    ``pair`` one per (user, key), both identified by the user's 128-bit identity
    (``transforms.user_shards.user_identity_columns``: the secret-keyed PRF of the id,
    never a grouping code), or ``rng`` itself (tests' seeded generators)."""
    if not isinstance(rng, StageSource):
        return rng
    from thresher.transforms.user_shards import user_identity_columns
    users = user_identity_columns(table, user_column)
    return rng.bind(table, user=users, pair=[*users, *key_columns])


def rows_of(rng, index, group):
    """Streams for rows ``index`` of a bound table, or ``rng`` itself (tests' seeded
    generators, which are consumed in order)."""
    return rng.rows(index, group) if isinstance(rng, TableStreams) else rng

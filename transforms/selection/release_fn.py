"""The DoFn shared by the release transforms: one kernel call per batch of keys.

A release kernel module offers ``release_table(table, params, rng)`` (keys + ``count`` in,
released rows out); :class:`ReleaseBatchFn` applies it with one keyed stream per key
(``transforms.randomness.keyed_random``: the release secret, the stage's label and the key's
canonical text), so a retried bundle, a recomputed stage or a different bundle split
draws the same noise for every key, and drops batches with no released row. A kernel
with a ``shared_component(params, rng)`` (correlated noise) also gets one value per
release, drawn from the stream whose identity is the stage alone: every batch, worker
and retry draws the same one; it lives only in the DoFn's call and is never output.
"""
import re

import apache_beam as beam

from thresher.transforms.randomness import keyed_random

# Columns of a release batch that are values, not the key (counts, grid sums and
# weighted_gaussian's grid weights).
_VALUE_COLUMN = re.compile(r"^(count|__s\d+|__w)$")


def identity_columns(table):
    """The key columns of a release batch: what identifies a key's noise stream."""
    return [name for name in table.column_names if not _VALUE_COLUMN.match(name)]


class ReleaseBatchFn(beam.DoFn):
    def __init__(self, release_table, rng_factory=None, stage="", shared_component=None):
        self._release_table = release_table
        self._rng_factory = rng_factory  # a KeyedSource, or (tests) a seeded generator
        self._stage = stage
        self._shared_component = shared_component

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)
        # seeded test generators: one fresh generator per worker, the same first draw
        self._shared_rng = (self._rng_factory() if self._rng is not None
                            and self._shared_component is not None else None)
        self._shared = None

    def process(self, table, params):
        rng = keyed_random.table_streams(self._rng_factory, self._rng, self._stage, table,
                                         identity_columns(table))
        extra = {}
        if self._shared_component is not None:
            extra["shared"] = self._shared_draw(params)
        out = self._release_table(table, params, rng, **extra)
        if out.num_rows:
            yield out

    def _shared_draw(self, params):
        """The shared component: a fresh stream of (stage, b"") each call for a keyed
        source (the same value every time: identity = the stage alone; per-key draws use
        non-empty key identities), or the first draw of the worker's own seeded
        generator in tests."""
        if self._shared_rng is None:
            return self._shared_component(
                params, keyed_random.stage_stream(self._rng_factory, None, self._stage))
        if self._shared is None:
            self._shared = self._shared_component(params, self._shared_rng)
        return self._shared


class KernelRelease(beam.PTransform):
    """Apply a release kernel to every batch of per-key counts.

    Subclasses name the mechanism and its ``release_table``. Input: PCollection[pyarrow.Table]
    with the key columns and an int64 ``count`` (keys unique across the collection).
    Output: PCollection[pyarrow.Table] of released keys only. ``params`` is a dict, or a
    side input (``beam.pvalue.AsSingleton``) carrying one; ``rng_factory``: the draws'
    source and stage label (``keyed_random.KeyedDraws``, ``source.child(name)``).
    """

    stage_label = "Release"

    @staticmethod
    def release_table(table, params, rng):
        raise NotImplementedError

    shared_component = None     # (params, rng) -> one value per release, or None

    def __init__(self, params, rng_factory=None, label=None):
        super().__init__(label)
        self._params = params
        self._rng_factory = rng_factory   # keyed_random.KeyedDraws: source and stage label

    def expand(self, counts):
        source, stage = keyed_random.stage_of(self._rng_factory)
        shared = type(self).shared_component
        extra = {} if shared is None else {"shared_component": shared}
        return counts | self.stage_label >> keyed_random.par_do(
            ReleaseBatchFn(type(self).release_table, source, stage,
                           **extra), self._params)

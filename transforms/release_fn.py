"""The DoFn shared by the release transforms: one kernel call per batch of keys.

A release kernel module offers ``release_table(table, params, rng)`` (keys + ``count`` in,
released rows out); :class:`ReleaseBatchFn` applies it with a CSPRNG created on the
worker in ``setup()`` — never pickled with the transform, so no two workers or retries
replay the same randomness — and drops batches with no released row.
"""
import apache_beam as beam

from transforms import samplers


class ReleaseBatchFn(beam.DoFn):
    def __init__(self, release_table, rng_factory=None):
        self._release_table = release_table
        self._rng_factory = rng_factory  # tests only: a seeded generator

    def setup(self):
        self._rng = self._rng_factory() if self._rng_factory else samplers.secure_random()

    def process(self, table, params):
        out = self._release_table(table, params, self._rng)
        if out.num_rows:
            yield out


class KernelRelease(beam.PTransform):
    """Apply a release kernel to every batch of per-key counts.

    Subclasses name the mechanism and its ``release_table``. Input: PCollection[pyarrow.Table]
    with the key columns and an int64 ``count`` (keys unique across the collection).
    Output: PCollection[pyarrow.Table] of released keys only. ``params`` is a dict, or a
    side input (``beam.pvalue.AsSingleton``) carrying one; ``rng_factory`` is for tests only.
    """

    stage_label = "Release"

    @staticmethod
    def release_table(table, params, rng):
        raise NotImplementedError

    def __init__(self, params, rng_factory=None, label=None):
        super().__init__(label)
        self._params = params
        self._rng_factory = rng_factory

    def expand(self, counts):
        return counts | self.stage_label >> beam.ParDo(
            ReleaseBatchFn(type(self).release_table, self._rng_factory), self._params)

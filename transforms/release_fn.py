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

"""The Beam side of ``mechanism.kind: heavy_hitters`` (``pipelines.kinds.heavy_hitters``
holds the kind's fields, calibration and stages): the string-key check, the top-k of the
last level and the TrieHH++ release.

Kept apart so that importing the kind -- which ``thresher plan``, ``validate`` and
``schema`` do -- does not import Beam (tests/pipelines/test_cli_command_imports.py).
"""
import apache_beam as beam
import pyarrow as pa

from thresher.pipelines.errors import InputError
from thresher.transforms.randomness import keyed_random
from thresher.transforms.trees.heavy_hitters import TrieHeavyHitters, heavy_hitters


def _string_keys(table, key):
    column = table.column(key)
    if not (pa.types.is_string(column.type) or pa.types.is_large_string(column.type)):
        raise InputError(f"input.keys[0]: heavy_hitters needs a string key column; {key!r} "
                         f"is {column.type}")
    return table


def _top_k(tables, key, top_k, last_level):
    """The whole-key level (``last_level``) only: prefixes released at earlier levels
    are never keys, even when the last level released nothing."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return
    top = heavy_hitters(pa.concat_tables(tables), key, top_k, level=last_level)
    if not top.num_rows:
        return
    ranks = pa.array(range(1, top.num_rows + 1), type=pa.int64())
    yield pa.table({key: top.column(key), "count": top.column("estimate"), "rank": ranks})


class HeavyHittersRelease(beam.PTransform):
    """Table(key, count) of per-key distinct-user counts, or with ``user_column`` the kept
    (user, key) rows of whole users -> Table(key, count, rank) of the top_k TrieHH++ heavy
    hitters (paper 003 Sec. 4.1). ``params``: dict or side input with sampling_rate and
    threshold."""

    def __init__(self, key, prefix_lengths, top_k, params, num_shards=16, rng_factory=None,
                 label=None, user_column=None):
        super().__init__(label)
        self._user = user_column
        self._key, self._lengths, self._top_k = key, list(prefix_lengths), int(top_k)
        self._params, self._num_shards, self._rng_factory = params, num_shards, rng_factory

    def expand(self, counts):
        return (counts
                | "StringKeys" >> beam.Map(_string_keys, self._key)
                | "TrieHH" >> TrieHeavyHitters(self._key, self._lengths, self._params,
                                               num_shards=self._num_shards,
                                               rng_factory=keyed_random.child(
                                                   self._rng_factory, "TrieHH"),
                                               user_column=self._user)
                | "GatherTrie" >> beam.combiners.ToList()
                | "TopK" >> beam.FlatMap(_top_k, self._key, self._top_k, len(self._lengths) - 1))

"""ChooseClipBounds: ``clip: auto`` of ``aggregates`` -- a private upper clip bound per auto
sum column, chosen before the release (its own stage in privacy.stages).

Per user shard (whole users, ``transforms.bounding.user_shards.ShardByUser``): each user's total per
key (finite values summed, ``transforms.values.aggregate_values.user_key_totals``) and the
quantile statistic over power-of-two candidates (``accounting.aggregates.quantile_statistic``);
the integer vectors are summed exactly over shards (``SumIntegers``: any order gives the
same statistic, issue 25 F2); one exponential-mechanism draw per auto
column (``accounting.selection.exponential_mechanism``, sensitivity 1, epsilon split
equally between the auto columns); the result, {sum column index: upper bound}, is
materialised (a Reshuffle) and handed on as a side input, like the contribution bound.
"""
import logging

import apache_beam as beam
import numpy as np

from thresher.accounting import aggregates as acc
from thresher.accounting import selection
from thresher.transforms.randomness import keyed_random
from thresher.transforms.values.aggregate_values import user_key_totals
from thresher.transforms.bounding.choose_contribution_bound import SumIntegers
from thresher.transforms.bounding.user_shards import USER_COLUMN

_LOG = logging.getLogger("thresher.choose_clip")


def shard_statistic(table, key_columns, auto_columns, candidates):
    """Concatenated quantile statistics (one block of len(candidates) + 1 per auto column),
    a tuple of Python ints (``acc.quantile_statistic``)."""
    names = sorted({v for _, v in auto_columns})
    totals = user_key_totals(table, key_columns, names)
    users = totals.column(USER_COLUMN).to_numpy()
    _, user_index = np.unique(users, return_inverse=True)
    blocks = []
    for _, value_name in auto_columns:
        t = totals.column(value_name).to_numpy(zero_copy_only=False)
        blocks.append(acc.quantile_statistic(t, user_index, candidates))
    return tuple(int(x) for x in np.concatenate(blocks))


class _StatisticFn(beam.DoFn):
    def __init__(self, key_columns, auto_columns, candidates):
        self._keys = tuple(key_columns)
        self._auto = list(auto_columns)
        self._candidates = np.asarray(candidates)

    def process(self, table):
        yield shard_statistic(table, self._keys, self._auto, self._candidates)


class _DrawFn(beam.DoFn):
    def __init__(self, auto_columns, candidates, epsilon, quantile, rng_factory=None, stage=""):
        self._stage = stage
        self._auto = list(auto_columns)
        self._candidates = np.asarray(candidates)
        self._epsilon = float(epsilon)
        self._quantile = float(quantile)
        self._rng_factory = rng_factory

    def setup(self):
        self._rng = keyed_random.worker_rng(self._rng_factory)

    def process(self, statistic):
        rng = keyed_random.stage_stream(self._rng_factory, self._rng, self._stage)
        k = len(self._candidates) + 1
        share = self._epsilon / len(self._auto)
        chosen = {}
        for j, (sum_index, _) in enumerate(self._auto):
            scores = acc.quantile_scores(statistic[j * k:(j + 1) * k], self._quantile)
            index = selection.exponential_mechanism(scores, share, 1.0, rng)
            chosen[int(sum_index)] = float(self._candidates[index])
        _LOG.info("NOT PRIVATE (operator log only): clip statistics drawn; chosen upper "
                  "bounds %s", chosen)
        yield chosen


class ChooseClipBounds(beam.PTransform):
    """User shards -> a PCollection of one dict {sum column index: upper clip bound}.

    auto_columns: [(sum column index, prepared value column name)]; epsilon: the stage's
    total (split equally between the columns); quantile: q of the score."""

    def __init__(self, key_columns, auto_columns, candidates, *, epsilon, quantile,
                 rng_factory=None, label=None):
        super().__init__(label)
        if not (0 < epsilon < float("inf")):
            raise ValueError(f"epsilon must be > 0, got {epsilon!r}")
        self._keys = tuple(key_columns)
        self._auto = list(auto_columns)
        self._candidates = np.asarray(candidates, dtype=np.float64)
        self._epsilon = float(epsilon)
        self._quantile = float(quantile)
        self._rng_factory = rng_factory

    def expand(self, users):
        size = len(self._auto) * (len(self._candidates) + 1)
        return (users
                | "ClipStatistic" >> beam.ParDo(_StatisticFn(self._keys, self._auto, self._candidates))
                | "SumClipStatistic" >> beam.CombineGlobally(SumIntegers(size))
                | "ClipExponentialMechanism" >> keyed_random.par_do(_DrawFn(
                    self._auto, self._candidates, self._epsilon, self._quantile,
                    *keyed_random.stage_of(self._rng_factory)))
                | "MaterialiseClips" >> beam.Reshuffle())

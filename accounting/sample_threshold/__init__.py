"""Sample-and-threshold (papers 000/003): the accounting of the sample_and_threshold kind
and of the levels of heavy_hitters and quantiles.

One family, imported one way (tests/accounting/test_import_graph.py checks it):

- :mod:`.core` -- one key's output laws, the exact / kl / alpha deltas, the searches, basic
  composition over a user's keys and its calibration, the levels; imports nothing here;
- :mod:`.pld` -- the privacy-loss-distribution bound over a user's keys; imports ``core``;
- :mod:`.calibration` -- :func:`calibrate` for both compositions; imports ``core`` and ``pld``;
- :mod:`.trie` -- TrieHH++ (heavy_hitters, method trie): the composition over a user's
  C x L prefix cells and the plan's prefix schedule; imports ``core`` and ``calibration``.

The names below are the API the rest of thresher uses (``from thresher.accounting import
sample_threshold; sample_threshold.calibrate(...)``); private helpers are reached in their
own module.
"""
from thresher.accounting.sample_threshold.calibration import calibrate
from thresher.accounting.sample_threshold.core import (
    COMPOSITIONS, METHODS, CalibrationInfeasible, LevelParams, SampleThresholdParams,
    add_quantile, best_release_point, c_alpha, calibrate_levels, delta, divergences,
    exact_delta_search, group_privacy, kl_divergence, min_threshold, paper_parameters,
    per_key_budget, remove_quantile, sampling_rate_for)
from thresher.accounting.sample_threshold.trie import (SCHEDULES, TrieParams, calibrate_trie,
                                                       choose_schedule, fewest_levels)

__all__ = [
    "COMPOSITIONS", "METHODS", "CalibrationInfeasible", "LevelParams", "SampleThresholdParams",
    "add_quantile", "best_release_point", "c_alpha", "calibrate", "calibrate_levels", "delta",
    "divergences", "exact_delta_search", "group_privacy", "kl_divergence", "min_threshold",
    "paper_parameters", "per_key_budget", "remove_quantile", "sampling_rate_for", "SCHEDULES",
    "TrieParams", "calibrate_trie", "choose_schedule", "fewest_levels"]

"""Private weighted sampling (PWS, paper 001): the accounting of the weighted_sampling kind.

One family, imported one way (tests/accounting/test_import_graph.py checks it):

- :mod:`.estimators` -- the diagonal (band) estimators of Alg. 4 tokens; imports nothing here;
- :mod:`.core` -- Alg. 3/4 tables, estimators, SbH baseline, the per-key (eps0, delta0)
  compositions (``optimal``, ``basic``) and their calibration; imports ``estimators``;
- :mod:`.pld` -- the Gaussian-tradeoff keep table of composition ``pld``; imports nothing here;
- :mod:`.release` -- :func:`calibrate` for every composition and the tables a release
  samples with (:func:`release_tables`, :func:`keep_table`); imports ``core`` and ``pld``.

The names below are the API the rest of thresher uses (``from thresher.accounting import
pws; pws.calibrate(...)``); private helpers are reached in their own module.
"""
from thresher.accounting.pws.core import (
    COMPOSITIONS, ESTIMATORS, MAX_BAND_ROWS, MAX_KEEP_LENGTH, MAX_TABLE_ENTRIES, REPORTS,
    SAMPLING_SCHEMES, PerKeyBudget, PWSParameters, ReleaseTables, TableTooLarge,
    biased_down_estimates, composed_delta, estimator_moments, frequency_table, is_band,
    keep_probabilities, mle_estimates, per_key_budget, pws_L, realized_delta,
    release_tables_can_fail, rounding_excess, row_cdf, sampling_probabilities,
    sampling_probabilities_at, saturation_frequency, sbh_keep_probabilities, sbh_threshold)
from thresher.accounting.pws.release import calibrate, keep_table, release_tables

__all__ = [
    "COMPOSITIONS", "ESTIMATORS", "MAX_BAND_ROWS", "MAX_KEEP_LENGTH", "MAX_TABLE_ENTRIES",
    "REPORTS", "SAMPLING_SCHEMES", "PerKeyBudget", "PWSParameters", "ReleaseTables",
    "TableTooLarge", "biased_down_estimates", "calibrate", "composed_delta",
    "estimator_moments", "frequency_table", "is_band", "keep_probabilities", "keep_table",
    "mle_estimates", "per_key_budget", "pws_L", "realized_delta", "release_tables",
    "release_tables_can_fail", "rounding_excess", "row_cdf", "sampling_probabilities",
    "sampling_probabilities_at", "saturation_frequency", "sbh_keep_probabilities",
    "sbh_threshold"]

"""Work counters of ``accounting.pws`` for tests/robustness/test_pws_plan_cost.py, loaded
into the CLI driver's child (``cli_driver.run_batch(..., hooks="tests.robustness.pws_work")``).

Before each case the PWS caches (``pws_core._BANDS``, ``pws.release_tables``) are cleared, so
each plan builds its own tables. The table builders are wrapped (the real functions still
run; the wrappers only count) and after each case the counts are returned:

- ``keep_builds`` / ``keep_entries``: calls of ``pws._alg3`` (Alg. 3, keep probabilities
  pi_0..pi_M) and the largest and total M + 1 computed;
- ``band_builds``, ``band_rows``, ``band_entries``: calls of ``pws._build_band`` (Alg. 4)
  and the rows computed (``pws._next_row`` calls, the one that did not fit included) and
  entries stored, per build (lists) so the caps can be checked build by build;
- ``bands_cached`` / ``release_tables_cached``: what the caches hold after the case.
"""
from thresher.accounting import pws
from thresher.accounting.pws import core as pws_core

_counts = {}
_alg3, _build_band, _next_row = pws_core._alg3, pws_core._build_band, pws_core._next_row


def _reset():
    _counts.clear()
    _counts.update(keep_entries=[], band_rows=[], band_entries=[])


def _counting_alg3(q, *args, **kwargs):
    _counts["keep_entries"].append(len(q))
    return _alg3(q, *args, **kwargs)


def _counting_next_row(*args, **kwargs):
    _counts["band_rows"][-1] += 1
    return _next_row(*args, **kwargs)


def _counting_build_band(*args, **kwargs):
    _counts["band_rows"].append(0)
    band = _build_band(*args, **kwargs)
    _counts["band_entries"].append(int(len(band.values)))
    return band


pws_core._alg3, pws_core._build_band, pws_core._next_row = _counting_alg3, _counting_build_band, _counting_next_row
_reset()


def before_case(argv):
    pws_core._BANDS.clear()
    pws.release_tables.cache_clear()
    _reset()


def after_case(argv):
    return {**_counts, "bands_cached": len(pws_core._BANDS),
            "release_tables_cached": pws.release_tables.cache_info().currsize}

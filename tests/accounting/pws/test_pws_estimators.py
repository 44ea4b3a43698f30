"""The diagonal (band) estimators of ``accounting.pws.estimators`` against the
compressed-column definitions they replace and against the naive definitions (PWS §7.1
eq. 11, Appendix E eq. 41), and their memory bound (issue 18: ``thresher plan`` of
weighted_sampling built a ~2e7-entry CSC copy of the shift-extended band, ~1.5 GB)."""
import tracemalloc

import numpy as np
import pytest
import scipy.sparse

from thresher.accounting import pws
from thresher.accounting.pws import core as pws_core
from thresher.accounting.pws import estimators as pws_estimators
from tests.accounting.pws.test_pws import SCHEMES, naive_biased_down, naive_mle

TABLES = [(0.5, 0.1, 12, "none", None), (0.5, 1e-3, 40, "ppswor", 0.05),
          (0.3, 1e-4, 200, "priority", 0.02), (1.0, 1e-8, 300, "ppswor", 2.0),
          (0.05, 1e-9, 1500, "none", None)]


def _layouts(t):
    return {"int64_sparse": t, "dense": t.toarray(),
            "int32_sparse": scipy.sparse.csr_array(
                (t.data, t.indices.astype(np.int32), t.indptr.astype(np.int32)), shape=t.shape)}


def _by_columns(table, estimator, keep=None):
    tokens = pws_core._token_part(table)
    g = pws_core._statistic_values(None, tokens.shape[0])
    if estimator == "mle":
        return pws_core._mle_by_columns(tokens, pws_core._table_keep(tokens) if keep is None else keep, g)
    return pws_core._biased_down_by_columns(tokens, g)


@pytest.mark.parametrize("eps,delta,m,sampling,t", TABLES)
def test_band_estimators_equal_the_column_definitions_bit_for_bit(eps, delta, m, sampling, t):
    table = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    for layout, given in _layouts(table).items():
        assert pws_estimators.from_csr(scipy.sparse.csr_array(given)) is not None, layout
        assert np.array_equal(pws.mle_estimates(given), _by_columns(given, "mle")), layout
        assert np.array_equal(pws.biased_down_estimates(given),
                              _by_columns(given, "biased_down")), layout


@pytest.mark.parametrize("layout", ["int64_sparse", "dense", "int32_sparse"])
@pytest.mark.parametrize("sampling,t", SCHEMES[:3])
def test_band_estimators_match_the_naive_definitions(layout, sampling, t):
    eps, delta, m = 0.4, 1e-3, 30
    table = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t)
    pi = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=t)
    given = _layouts(table)[layout]
    assert np.allclose(pws.mle_estimates(given), naive_mle(table.toarray(), pi), rtol=1e-12)
    assert np.allclose(pws.biased_down_estimates(given), naive_biased_down(table.toarray(), pi),
                       rtol=1e-7)


def test_statistic_is_applied_on_the_band_path():
    table = pws.frequency_table(0.5, 1e-3, 40)
    square = lambda w: np.asarray(w, dtype=np.float64) ** 2  # noqa: E731
    tokens = pws_core._token_part(table)
    g = pws_core._statistic_values(square, tokens.shape[0])
    assert np.array_equal(pws.mle_estimates(table, statistic=square),
                          pws_core._mle_by_columns(tokens, pws_core._table_keep(tokens), g))
    assert np.array_equal(pws.biased_down_estimates(table, statistic=square),
                          pws_core._biased_down_by_columns(pws_core._token_part(table), g))


def test_tables_that_are_not_one_band_use_the_column_definitions():
    """A gap inside a row (a stored zero dropped from a dense table) or an entry right of
    the diagonal is not a band: those tables go the compressed-column way, still right."""
    table = pws.frequency_table(0.5, 1e-3, 25).toarray()
    gapped = table.copy()
    gapped[20, 17] = 0.0                   # hole inside row 20's run of tokens
    gapped[20, 0] += table[20, 17]
    assert pws_estimators.from_csr(scipy.sparse.csr_array(gapped)) is None
    pi = gapped[:, 1:].sum(axis=1)
    assert np.allclose(pws.mle_estimates(gapped), naive_mle(gapped, pi), rtol=1e-12)
    assert np.allclose(pws.biased_down_estimates(gapped), naive_biased_down(gapped, pi), rtol=1e-7)
    above = np.zeros((4, 4))
    above[1, 0], above[1, 2] = 0.5, 0.5    # token 2 for frequency 1
    assert pws_estimators.from_csr(scipy.sparse.csr_array(above)) is None


@pytest.mark.parametrize("estimator", ["mle", "biased_down"])
@pytest.mark.parametrize("c,sampling,t", [(1, "none", None), (10, "ppswor", 0.1),
                                          (30, "priority", 0.05)])
def test_shift_extension_without_materialising_it(estimator, c, sampling, t):
    """release_tables' estimates on the band extended by 4W virtual shifted rows equal the
    estimator on the materialised extended table (what it computed before)."""
    p = pws.calibrate(1.0, 1e-8, c, estimator=estimator, sampling=sampling, sampling_threshold=t)
    assert p.beyond_table == "shift"
    band = pws_core._build_band(pws.sampling_probabilities(p.max_frequency, sampling=sampling,
                                                      sampling_threshold=t),
                           p.key_epsilon, p.table_delta)
    width = len(band.row(p.max_frequency))
    columns = p.max_frequency + 3 * width + 1
    extended = pws_core._shift_extend(band, 4 * width)
    expected = _by_columns(pws_core._band_to_csr(extended), estimator, extended.keep)[:columns]
    got = pws_core._band_estimates(estimator, band, extra=4 * width, columns=columns)
    assert np.array_equal(got, expected)
    assert np.array_equal(pws.release_tables(p).estimates, expected)


@pytest.mark.parametrize("estimator", ["mle", "biased_down"])
def test_release_tables_memory_is_a_small_multiple_of_the_band(estimator):
    """At max_keys_per_user = 100 (the shift extension is 4 x 1946 rows of width ~1946:
    ~1.5e7 virtual entries) the estimates and tables cost a few band copies at most; the
    CSC build they replace peaked at ~1.1 GB here (tracemalloc)."""
    p = pws.calibrate(1.0, 1e-8, 100, estimator=estimator)
    band = pws_core._BANDS[(p.sampling, p.sampling_threshold, p.key_epsilon, p.table_delta,
                       p.max_frequency)]
    pws.release_tables.cache_clear()
    tracemalloc.start()
    try:
        tables = pws.release_tables(p)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert tables.band is band and p.beyond_table == "shift"
    assert peak < 2 * band.values.nbytes + (64 << 20), peak


@pytest.mark.parametrize("block", [7, 64, 1000])
def test_block_size_does_not_change_a_bit(monkeypatch, block):
    """The blocks (and, for the biased-down estimator, the sums carried across block
    boundaries and the shared shift rows) give the same floats for any block size,
    including a last block that ends off the boundary grid (``columns``)."""
    monkeypatch.setattr(pws_estimators, "BLOCK_ENTRIES", block)
    band = pws_core._build_band(pws.sampling_probabilities(200, sampling="priority",
                                                      sampling_threshold=0.02), 0.3, 1e-4)
    width = len(band.row(200))
    for extra, columns in ((0, None), (3 * width, 200 + 2 * width + 1), (5, 203)):
        extended = pws_core._shift_extend(band, extra) if extra else band
        table = pws_core._band_to_csr(extended)
        for estimator in ("mle", "biased_down"):
            expected = _by_columns(table, estimator, extended.keep)[:columns]
            got = pws_core._band_estimates(estimator, band, extra=extra, columns=columns)
            assert np.array_equal(got, expected), (estimator, extra, columns)

"""Planning a weighted_sampling release reads only the keep table (issue 19).

``pipelines/kinds/weighted_sampling.calibrate`` used to build the full release tables
(``pws.release_tables``: the Alg. 4 band *and* the estimators' tables, PWS eq. 11 /
Appendix E) for every candidate bound of ``max_keys_per_user: auto``, although the plan and
the automatic bound's score read only each candidate's threshold, the first count whose
reporting probability pi_w (Alg. 3) reaches 1/2. It now reads ``pws.keep_table`` and leaves
the estimators to the release of the chosen bound, except where building them could still
fail (``pws.release_tables_can_fail``). These tests check that nothing the plan or a
release reads changes:

- ``keep_table`` is the very array ``release_tables(...).keep`` (bit for bit, with the
  band built by ``calibrate`` and rebuilt from scratch), for every report, composition,
  sampling scheme and a pre-sampled input;
- the claim behind ``release_tables_can_fail``: for the MLE beyond a shift table the
  extrapolation's tail is exactly periodic (period 1, increment 1.0), so release_tables
  cannot refuse params that calibrate returned; the biased-down estimates are still built
  at plan time;
- ``composed_delta`` (which now calls ``binom._pmf``) equals the formula with
  ``scipy.stats.binom.pmf`` bit for bit, and ``_realized_band_delta`` (the verification of
  every candidate's tables, now in place) equals its plain statement, kept here;
- the plan: every candidate's threshold (the score's input) equals the one read off the
  full release tables, the score of the plan is the score of those thresholds, and the
  chosen C's parameters equal a fixed-bound plan's at that C.
"""
import math

import numpy as np
import pytest
import scipy.stats

from thresher.accounting import pws
from thresher.accounting.pws import core as pws_core
from thresher.pipelines.specs import spec as spec_module
from thresher.pipelines.kinds import weighted_sampling
from thresher.pipelines.planning.plan import make_plan

# (mechanism section, epsilon, delta, C): keys only and with frequencies, composition pld,
# optimal and basic, sampling none / ppswor / priority, both estimators.
CASES = [
    ({}, 1.0, 1e-8, 8),
    ({}, 0.5, 1e-6, 23),
    ({"composition": "basic"}, 1.0, 1e-8, 6),
    ({"estimator": "biased_down"}, 1.0, 1e-8, 4),
    ({"report": "keys"}, 1.0, 1e-8, 16),                                  # pld
    ({"report": "keys", "composition": "optimal"}, 0.7, 1e-7, 11),
    ({"report": "keys", "composition": "basic"}, 1.0, 1e-8, 3),
    ({"sampling": "ppswor", "sampling_threshold": 0.05}, 1.0, 1e-8, 8),
    ({"sampling": "priority", "sampling_threshold": 0.02}, 1.0, 1e-8, 3),
    ({"sampling": "priority", "sampling_threshold": 0.02, "report": "keys"}, 1.0, 1e-8, 8),
    ({"sampling": "ppswor", "sampling_threshold": 0.05, "report": "keys",
      "composition": "optimal"}, 1.0, 1e-8, 2),
    ({"max_frequency": 300}, 1.0, 1e-8, 2),                               # explicit size
    ({}, 1.0, 1e-8, 1),                                                   # single key
]


def _pws_params(mech, epsilon, delta, c, presampled=False):
    return pws.calibrate(
        epsilon, delta, c, sampling=mech.get("sampling", "none"),
        sampling_threshold=mech.get("sampling_threshold"),
        report=mech.get("report", "keys_and_frequencies"),
        estimator=mech.get("estimator", "mle"),
        composition=mech.get("composition")
        or ("pld" if mech.get("report") == "keys" else "optimal"),
        max_frequency=mech.get("max_frequency"), presampled=presampled)


def _fresh_caches():
    pws_core._BANDS.clear()
    pws.release_tables.cache_clear()


def _threshold(keep, max_frequency):
    half = np.flatnonzero(np.asarray(keep) >= 0.5)
    return int(half[0]) if len(half) else max_frequency


@pytest.mark.parametrize("mech,epsilon,delta,c", CASES)
@pytest.mark.parametrize("presampled", [False, True])
def test_keep_table_is_the_release_tables_keep(mech, epsilon, delta, c, presampled):
    _fresh_caches()
    params = _pws_params(mech, epsilon, delta, c, presampled)
    with_band = pws.keep_table(params)               # the band calibrate just built
    _fresh_caches()
    rebuilt = pws.keep_table(params)                 # built again from the parameters
    _fresh_caches()
    full = pws.release_tables(params).keep           # what the release reads
    assert with_band.dtype == full.dtype == np.float64
    assert with_band.tobytes() == full.tobytes()
    assert rebuilt.tobytes() == full.tobytes()


@pytest.mark.parametrize("mech,epsilon,delta,c", CASES)
def test_mle_beyond_a_shift_table_is_exactly_periodic(mech, epsilon, delta, c):
    params = _pws_params(mech, epsilon, delta, c)
    tables = pws.release_tables(params)
    if params.report == "keys" or params.beyond_table != "shift":
        assert not pws.release_tables_can_fail(params)
        return
    if params.estimator == "mle":
        assert not pws.release_tables_can_fail(params)
        assert (tables.period, tables.increment) == (1, 1.0)
        m = params.max_frequency
        tail = tables.estimates[m:]
        assert np.array_equal(np.diff(tail), np.ones(len(tail) - 1))
    else:
        assert pws.release_tables_can_fail(params)


def test_the_cases_cover_shift_tables_of_both_estimators():
    kinds = set()
    for mech, epsilon, delta, c in CASES:
        params = _pws_params(mech, epsilon, delta, c)
        kinds.add((params.report, params.beyond_table, params.estimator, params.composition))
    assert ("keys_and_frequencies", "shift", "mle", "optimal") in kinds
    assert ("keys_and_frequencies", "shift", "biased_down", "optimal") in kinds
    assert ("keys_and_frequencies", "shift", "mle", "basic") in kinds
    assert ("keys", "clip", "mle", "pld") in kinds


def _composed_delta_with_pmf(key_epsilon, key_delta, c, epsilon):
    """The formula of pws.composed_delta with the public scipy.stats.binom.pmf."""
    l = np.arange(c + 1)
    p_flip = 1.0 / (1.0 + math.exp(key_epsilon))
    weights = scipy.stats.binom.pmf(l, c, p_flip)
    loss = (c - 2 * l) * key_epsilon
    with np.errstate(over="ignore"):
        rr = float(np.sum(weights * np.maximum(0.0, -np.expm1(epsilon - loss))))
    log_none_lost = c * math.log1p(-key_delta)
    return -math.expm1(log_none_lost) + math.exp(log_none_lost) * rr


def test_composed_delta_equals_the_formula_with_binom_pmf():
    rng = np.random.default_rng(19)
    checked = 0
    for c in (2, 3, 8, 45, 128, 1024):
        for epsilon in (0.1, 0.9, 3.0):
            for key_epsilon in np.concatenate([[0.0, epsilon / c, epsilon],
                                               rng.uniform(0, epsilon, 5)]):
                for key_delta in (1e-12, 1e-9, 3e-6):
                    got = pws.composed_delta(float(key_epsilon), key_delta, c, epsilon)
                    want = _composed_delta_with_pmf(float(key_epsilon), key_delta, c, epsilon)
                    assert got == want, (c, epsilon, key_epsilon, key_delta)
                    checked += 1
    assert checked == 6 * 3 * 8 * 3


@pytest.mark.parametrize("mech,epsilon,delta,c", CASES)
def test_calibrate_threshold_is_read_off_the_full_tables(mech, epsilon, delta, c):
    _fresh_caches()
    out = weighted_sampling.calibrate(mech, epsilon=epsilon, delta=delta,
                                      max_keys_per_user=c, model="l0")
    _fresh_caches()
    full = pws.release_tables(pws.PWSParameters.from_dict(out))
    assert out["threshold"] == _threshold(full.keep, out["max_frequency"])


_SPEC = """
name: ws
input: {{path: data.parquet, format: parquet, user: user_id, keys: [word]}}
privacy: {{epsilon: {epsilon!r}, delta: 1.0e-08}}
bounding: {{max_keys_per_user: {bound}}}
mechanism: {mechanism}
output: {{path: out/ws}}
"""

PLAN_MECHANISMS = [
    "{kind: weighted_sampling}",
    "{kind: weighted_sampling, estimator: biased_down}",
    "{kind: weighted_sampling, report: keys}",
    "{kind: weighted_sampling, report: keys, composition: optimal}",
    "{kind: weighted_sampling, sampling: ppswor, sampling_threshold: 0.05}",
    "{kind: weighted_sampling, sampling: priority, sampling_threshold: 0.02, report: keys}",
]


def _plan(tmp_path, mechanism, bound, epsilon=1.0):
    path = tmp_path / f"ws_{bound}.yaml"
    path.write_text(_SPEC.format(bound=bound, mechanism=mechanism, epsilon=epsilon))
    return make_plan(spec_module.load(str(path)))


@pytest.mark.parametrize("mechanism", PLAN_MECHANISMS)
def test_auto_plan_score_and_chosen_params(tmp_path, mechanism):
    plan = _plan(tmp_path, mechanism, "auto")
    assert len(plan.candidates) >= 10
    # every candidate's threshold, read off its full release tables
    thresholds = {}
    for c, params in plan.params_by_bound.items():
        _fresh_caches()
        full = pws.release_tables(pws.PWSParameters.from_dict(params))
        thresholds[c] = _threshold(full.keep, params["max_frequency"])
        assert params["threshold"] == thresholds[c]
    score = plan.bound_score()
    assert score.thresholds == tuple(float(thresholds[c]) for c in plan.candidates)
    from thresher.accounting.contribution_bound import make_score
    params = plan.score_params()
    params["params_by_bound"] = {c: {"threshold": t} for c, t in thresholds.items()}
    assert make_score(plan.score_name, plan.candidates,
                      plan.spec.bounding.auto.max_bound, params) == score
    # the plan of a chosen C is a fixed-bound plan at that C (whose whole budget is the
    # automatic plan's release stage: epsilon 0.9 of 1, all of delta)
    release = plan.release_stage
    assert release.delta == 1e-8
    for c in (plan.candidates[0], 8, plan.candidates[-1]):
        fixed = _plan(tmp_path, mechanism, c, epsilon=release.epsilon)
        assert fixed.params_by_bound == {c: plan.params_by_bound[c]}
        assert fixed.report()["mechanism"] == plan.report(chosen_bound=c)["mechanism"]


def _reference_realized_band_delta(data, starts, lengths, lo, q, e_eps, chunk_entries=1 << 19):
    """The plain statement of pws_core._realized_band_delta (its version before issue 19's
    in-place rewrite; since issue 42 without the 2^-53 grid, as the sampler draws the
    exact law): gather, cumsum, clip, difference, compare with the previous row moved by
    its column shift."""
    m = len(lengths) - 1
    worst = 0.0
    prev_p = np.zeros((1, 1))
    prev_none = np.array([1.0])
    prev_lo = np.array([lo[1] if m >= 1 else 0])
    r = 1
    while r <= m:
        width = int(max(1, lengths[r - 1], lengths[r]))
        r_end = r
        while r_end <= m and (r_end - r + 1) * max(width, lengths[r_end]) <= chunk_entries:
            width = max(width, int(lengths[r_end]))
            r_end += 1
        r_end = max(r_end, r + 1)
        rows = np.arange(r, r_end)
        k = np.arange(width)
        mask = k[None, :] < lengths[rows][:, None]
        pos = np.where(mask, starts[rows][:, None] + k[None, :], 0)
        block = np.where(mask, data[pos], 0.0)
        cum = np.cumsum(block, axis=1)
        if q is None:
            scale = np.ones(len(rows))
        else:
            scale = q[rows]
            cum = cum / scale[:, None]
        grid = np.clip(cum, 0.0, 1.0)          # the law drawn (issue 42: no 2^-53 grid)
        probs = np.diff(grid, axis=1, prepend=0.0) * scale[:, None]
        none = 1.0 - scale * grid[:, -1]
        before = np.zeros((len(rows), width + 1))
        w_prev = min(prev_p.shape[1], width)
        before[0, :w_prev] = prev_p[-1, :w_prev]
        before[1:, :width] = probs[:-1]
        before_none = np.concatenate([prev_none[-1:], none[:-1]])
        before_lo = np.concatenate([prev_lo[-1:], lo[rows[:-1]]])
        shift = np.clip(lo[rows] - before_lo, 0, width)
        if r == 1:
            shift[0] = 0
        gathered = np.take_along_axis(before, np.minimum(k[None, :] + shift[:, None], width),
                                      axis=1)
        dropped = np.cumsum(before[:, :width], axis=1)
        dropped_sum = np.where(shift > 0,
                               dropped[np.arange(len(rows)), np.maximum(shift - 1, 0)], 0.0)
        forward = (np.maximum(0.0, probs - e_eps * gathered).sum(axis=1)
                   + np.maximum(0.0, none - e_eps * before_none))
        backward = (np.maximum(0.0, gathered - e_eps * probs).sum(axis=1) + dropped_sum
                    + np.maximum(0.0, before_none - e_eps * none))
        worst = max(worst, float(forward.max()), float(backward.max()))
        prev_p, prev_none, prev_lo = probs[-1:], none[-1:], lo[rows[-1:]]
        r = r_end
    return worst


@pytest.mark.parametrize("mech,epsilon,delta,c", [case for case in CASES
                                                  if case[0].get("report") != "keys"])
def test_realized_band_delta_is_the_plain_statement(mech, epsilon, delta, c):
    params = _pws_params(mech, epsilon, delta, c)
    band = pws_core._release_band(params)
    e_eps = math.exp(params.key_epsilon)
    lengths = np.diff(band.indptr)
    q = pws.sampling_probabilities(params.max_frequency, sampling=params.sampling,
                                   sampling_threshold=params.sampling_threshold)
    for probabilities in (None, q):
        for chunk in (1 << 19, 997, 41):
            args = (band.values, band.indptr[:-1], lengths, band.lo, probabilities, e_eps, chunk)
            assert pws_core._realized_band_delta(*args) == _reference_realized_band_delta(*args)
    # the CSR layout (column-0 entries between the rows: gathered, not sliced)
    table = pws_core._band_to_csr(band)
    table.sort_indices()
    lo, token_lengths = pws_core._band_layout(table)
    args = (table.data, table.indptr[:-1] + 1, token_lengths, lo, q, e_eps)
    assert pws_core._realized_band_delta(*args) == _reference_realized_band_delta(*args)


def test_realized_band_delta_rows_moving_by_several_columns():
    """Rows whose first column moves by more than one (the general gather path)."""
    rng = np.random.default_rng(1919)
    for trial in range(60):
        m = int(rng.integers(2, 60))
        lengths = rng.integers(0, 12, m + 1)
        lengths[0] = 0
        lo = np.concatenate([[0], np.cumsum(rng.integers(0, 4, m))]) + 1
        starts = np.concatenate([[0], np.cumsum(lengths)[:-1]])
        data = rng.random(int(lengths.sum())) * 0.2
        q = np.concatenate([[0.0], rng.uniform(0.5, 1.0, m)])
        for probabilities in (None, q):
            for chunk in (1 << 19, 50, 7):
                args = (data, starts, lengths, lo, probabilities, math.exp(0.3), chunk)
                assert pws_core._realized_band_delta(*args) == \
                    _reference_realized_band_delta(*args), trial

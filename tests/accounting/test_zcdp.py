"""accounting/zcdp.py and pipelines/ledgers/records.py: the CKS conversion against
dp_accounting's RdpAccountant, rho_B, and every kind's stored (rho, delta0) against an
independent computation (Renyi divergences and tails summed over the noise's pmf, exact
integer grid weights, exponential-mechanism output laws). Each per-kind test also checks
that HALF the stored rho is below the independent value: a record that undercharged by 2x
would fail. Deterministic (no sampling)."""
import copy
import math

import numpy as np
import pytest
from scipy.special import logsumexp

from thresher.accounting import zcdp
from thresher.pipelines import api, kinds
from thresher.pipelines.ledgers import records

dp_accounting = pytest.importorskip("dp_accounting")

QUICKSTART = "configs/examples/data/quickstart.parquet"


# ---- the conversion ------------------------------------------------------------------------

@pytest.mark.parametrize("sigma,count", [(4.2247, 10), (4.2247, 11), (1.0, 3), (20.0, 500)])
@pytest.mark.parametrize("delta", [1e-5, 1e-9])
def test_conversion_matches_rdp_accountant_at_its_orders_and_beats_it_over_all(sigma, count,
                                                                              delta):
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(sigma), count)
    theirs = accountant.get_epsilon(delta)
    rho = count / (2 * sigma ** 2)
    assert zcdp.epsilon_at_orders(rho, delta, accountant._orders) == pytest.approx(theirs,
                                                                                   abs=1e-6)
    ours = zcdp.epsilon_of_rho(rho, delta)
    assert ours <= theirs + 1e-12
    assert ours >= theirs - 1e-2


def test_the_issue_figures():
    """Ten Gaussian releases at sigma 4.2247 convert to epsilon 3.40 at delta 1e-5, eleven
    to 3.59 (the issue, from dp_accounting)."""
    rho = 1 / (2 * 4.2247 ** 2)
    assert zcdp.epsilon_of_rho(10 * rho, 1e-5) == pytest.approx(3.400, abs=2e-3)
    assert zcdp.epsilon_of_rho(11 * rho, 1e-5) == pytest.approx(3.588, abs=2e-3)
    # one Laplace release of epsilon 1 (rho 0.5): epsilon ~ 4.7 at delta 1e-5
    assert zcdp.epsilon_of_rho(0.5, 1e-5) == pytest.approx(4.7, abs=0.05)


@pytest.mark.parametrize("epsilon,delta", [(3.5, 1e-5), (1.0, 1e-8), (0.1, 1e-6), (20, 0.3)])
def test_rho_budget_is_the_largest_rho_converting_within_epsilon(epsilon, delta):
    rho_b = zcdp.rho_budget(epsilon, delta)
    assert zcdp.epsilon_of_rho(rho_b, delta) <= epsilon
    assert zcdp.epsilon_of_rho(rho_b * (1 + 1e-9), delta) > epsilon * (1 - 1e-12)
    digits = repr(rho_b).replace(".", "").lstrip("0").split("e")[0]
    assert len(digits) <= zcdp.DIGITS                       # a short decimal, rounded down


def test_rounding_directions():
    assert str(zcdp.decimal_up(1 / 3)) == "0.333333333334"
    assert str(zcdp.decimal_down(1 / 3)) == "0.333333333333"
    assert zcdp.decimal_up(0.5) == zcdp.decimal_down(0.5) == 0.5
    assert zcdp.decimal_up(0.0) == 0


# ---- independent computations --------------------------------------------------------------

def _dg_logpmf(sd, span=40):
    """x and log P[X = x] of N_Z(0, sd^2) over +-span sd (the rest is below e^-800)."""
    x = np.arange(-int(span * sd) - 50, int(span * sd) + 51, dtype=np.float64)
    lw = -x ** 2 / (2 * sd * sd)
    return x, lw - logsumexp(lw)


def _renyi_rho(lp, lq, alphas=(1.5, 2, 3, 4, 8, 16, 64)):
    """max over alpha of D_alpha(p || q) / alpha from log pmfs on one support, summed."""
    p = np.exp(lp)
    best = float(np.sum(p * (lp - lq)))             # alpha -> 1: KL
    for a in alphas:
        d = logsumexp(a * lp + (1 - a) * lq) / (a - 1)
        best = max(best, d / a)
    return best


def _dg_shift_rho(sd, shift):
    """N_Z(shift, sd^2) against N_Z(0, sd^2), both ways; the support padded by the shift."""
    x, lp0 = _dg_logpmf(sd)
    lp1 = -(x - shift) ** 2 / (2 * sd * sd) - logsumexp(-x ** 2 / (2 * sd * sd))
    keep = np.abs(x) <= x.max() - abs(shift)       # where both log pmfs are exact
    return max(_renyi_rho(lp1[keep], lp0[keep]), _renyi_rho(lp0[keep], lp1[keep]))


def _dl_logpmf(scale, span=60):
    x = np.arange(-int(span * scale) - 50, int(span * scale) + 51, dtype=np.float64)
    lw = -np.abs(x) / scale
    return x, lw - logsumexp(lw)


def _dl_shift_rho(scale, shift):
    x, lp0 = _dl_logpmf(scale)
    lp1 = -np.abs(x - shift) / scale - logsumexp(-np.abs(x) / scale)
    keep = np.abs(x) <= x.max() - abs(shift)
    return max(_renyi_rho(lp1[keep], lp0[keep]), _renyi_rho(lp0[keep], lp1[keep]))


def _dg_release_probability(sd, gap):
    """P[v >= gap] for v ~ N_Z(0, sd^2), gap an integer, by summing the pmf."""
    x, lp = _dg_logpmf(sd)
    return float(np.exp(lp[x >= gap]).sum())


def _plan(**changes):
    spec = {"name": "t", "input": {"path": QUICKSTART, "format": "parquet", "user": "user_id",
                                   "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "bounding": {"max_keys_per_user": 3},
            "mechanism": {"kind": "gaussian"}, "output": {"path": "/tmp/unused"}}
    for k, v in changes.items():
        spec[k] = copy.deepcopy(v)
    return api.plan(spec)


def _stored(plan):
    rho, delta0 = records.privacy_record(plan)
    return float(rho), float(delta0)


def _check(stored_rho, independent_rho, stored_delta0=None, independent_delta0=None):
    assert stored_rho >= independent_rho * (1 - 1e-9)
    assert stored_rho / 2 < independent_rho            # halving rho would undercharge
    if independent_delta0 is not None:
        assert stored_delta0 >= independent_delta0 * (1 - 1e-9)


# ---- one test per kind -----------------------------------------------------------------------

def test_gaussian_threshold():
    plan = _plan()
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    per_key = _dg_shift_rho(m["sigma"], 1)
    p = _dg_release_probability(m["sigma"], m["threshold"] - m["pre_threshold"])
    _check(rho, 3 * per_key, delta0, 1 - (1 - p) ** 3)


def test_gaussian_correlated_noise_is_charged_its_own_record():
    """noise: correlated (v = Z + X): the stored record is Theorem 3's, whose delta0
    includes the shared draw's tail and which is at least the independent row's; a record
    ignoring Z (the plain gaussian row at the independent sigma) is strictly smaller."""
    from thresher.accounting import correlated_gshm
    plan = _plan(mechanism={"kind": "gaussian", "noise": "correlated"})
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    want_rho, want_delta0 = correlated_gshm.correlated_privacy_record(
        m["sigma"], m["shared_sigma"], m["threshold"], m["pre_threshold"], 3)
    assert rho >= want_rho * (1 - 1e-12) and delta0 >= want_delta0 * (1 - 1e-12)
    p = _dg_release_probability(m["sigma"], m["threshold"] - m["pre_threshold"])
    assert delta0 > 1 - (1 - p) ** 3               # the shared part raises the new-key tail
    _check(rho, 3 * _dg_shift_rho(m["sigma"], 1))


def test_gaussian_public_keys(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq
    pq.write_table(pa.table({"word": ["a", "b"]}), tmp_path / "d.parquet")
    plan = _plan(input={"path": QUICKSTART, "user": "user_id", "keys": ["word"],
                        "public_keys": {"path": str(tmp_path / "d.parquet")}})
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    assert delta0 == 0
    _check(rho, 3 * _dg_shift_rho(m["sigma"], 1))


def test_gaussian_with_aggregate_sum_columns():
    """count + sum columns (a mean and a variance: sum, sum of squares) on their grids:
    each column shifted by its grid sensitivity D_j against sigma_j grid units."""
    from thresher.pipelines.specs.aggregates import sum_columns
    plan = _plan(aggregates=[{"column": "x", "statistic": "mean", "clip": [0, 10]},
                             {"column": "x", "statistic": "variance", "clip": [0, 10]}])
    m = plan.params_by_bound[3]
    sigma = m["sigma"]
    rho, delta0 = _stored(plan)
    per_key = _dg_shift_rho(sigma, 1)
    grids = [g for _, g in sum_columns(plan.spec.aggregates)]
    assert len(grids) == 2
    for g in grids:            # sigma_j = D_j sigma: D_j^2 / (2 sigma_j^2) = 1/(2 sigma^2)
        per_key += g.sensitivity ** 2 / (2 * (g.sensitivity * sigma) ** 2)
    p = _dg_release_probability(sigma, m["threshold"] - m["pre_threshold"])
    _check(rho, 3 * per_key, delta0, 1 - (1 - p) ** 3)


@pytest.mark.parametrize("model", ["l0", "l1"])
def test_laplace(model):
    plan = _plan(mechanism={"kind": "laplace"},
                 bounding={"max_keys_per_user": 3, "model": model})
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    x, lp0 = _dl_logpmf(m["scale"])
    p0 = np.exp(lp0)
    if model == "l0":       # three keys shifted by one
        tail = float(p0[x >= m["threshold"] - m["pre_threshold"]].sum())
        _check(rho, 3 * _dl_shift_rho(m["scale"], 1), delta0, 1 - (1 - tail) ** 3)
    else:                   # all three records on one key: one shift by 3
        _check(rho, _dl_shift_rho(m["scale"], 3))
        tail = float(p0[x >= m["threshold"] - m["pre_threshold"] + 1 - 3].sum())
        assert delta0 >= tail * (1 - 1e-9)     # one key lifted by all three records


def _weighted_independent(sigma, threshold_grid, scale, c):
    sd = sigma * scale
    rho, delta0 = 0.0, 0.0
    x, lp = _dg_logpmf(sd, span=12)
    p = np.exp(lp)
    for t in range(1, c + 1):
        q = math.isqrt(scale * scale // t)           # floor(S / sqrt(t)), exactly
        rho = max(rho, t * q * q / (2 * sd * sd))
        tail = float(p[x >= threshold_grid - q].sum())
        delta0 = max(delta0, 1 - (1 - tail) ** t)
    return rho, delta0


def test_weighted_gaussian():
    plan = _plan(mechanism={"kind": "weighted_gaussian"})
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    # one coordinate's Renyi divergence on the grid, summed over the pmf: = q^2/(2 sd^2)
    sd = m["sigma"] * m["scale"]
    assert _dg_shift_rho(sd / 64, m["scale"] // 64) == pytest.approx(
        (m["scale"] // 64) ** 2 / (2 * (sd / 64) ** 2), rel=1e-6)
    sel_rho, sel_delta0 = _weighted_independent(m["sigma"], m["threshold_grid"], m["scale"], 3)
    count_rho = m["count_stage"]["counts_per_user"] * _dg_shift_rho(m["count_sigma"], 1)
    _check(rho, sel_rho + count_rho, delta0, sel_delta0)


@pytest.mark.parametrize("kind", ["adaptive", "heavy_hitters"])
def test_adaptive_rounds_and_count(kind):
    mech = {"kind": "adaptive"} if kind == "adaptive" else {
        "kind": "heavy_hitters", "top_k": 5, "method": "adaptive"}
    plan = _plan(mechanism=mech)
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    ind_rho, ind_delta0 = 0.0, 0.0
    for r in m["rounds"]:
        a, b = _weighted_independent(r["sigma"], r["threshold_grid"], m["scale"], 3)
        ind_rho, ind_delta0 = ind_rho + a, ind_delta0 + b
    ind_rho += m["count_stage"]["counts_per_user"] * _dg_shift_rho(m["count_stage"]["sigma"], 1)
    _check(rho, ind_rho, delta0, ind_delta0)


def _rr_rho(epsilon):
    """Randomised response at epsilon: the worst pure-epsilon pair, summed."""
    p = math.exp(epsilon) / (1 + math.exp(epsilon))
    return _renyi_rho(np.log([p, 1 - p]), np.log([1 - p, p]))


@pytest.mark.slow          # the two calibrations take ~20 s each
@pytest.mark.parametrize("mech,stages", [
    ({"kind": "sample_and_threshold"}, 1),
    ({"kind": "heavy_hitters", "top_k": 5, "prefix_lengths": [2, None]}, 1),
])
def test_black_box_kinds_are_charged_from_their_stages(mech, stages):
    """sample_and_threshold, the heavy-hitters trie: delta-approximately epsilon^2/2-zCDP
    per stage; randomised response at the stage's epsilon (a pure-epsilon pair) comes
    close to epsilon^2/2, so half of it is an undercharge."""
    plan = _plan(mechanism=mech)
    rho, delta0 = _stored(plan)
    assert len(plan.budget.stages) == stages
    _check(rho, sum(_rr_rho(s.epsilon) for s in plan.budget.stages))
    assert delta0 >= sum(s.delta for s in plan.budget.stages) * (1 - 1e-12)


def _kind_added_later():
    """A kind that overrides no optional hook: the interface's default record."""
    from thresher.pipelines.kinds.base import CountsKind

    class Later(CountsKind):
        name = "a_kind_added_later"

        def parse(self, section):
            return section

        def calibrate(self, mech, *, epsilon, delta, max_keys_per_user, model):
            return {}

        def release(self, counts, params, key_columns):
            return counts
    return Later()


@pytest.mark.parametrize("kind", ["sample_and_threshold", "weighted_sampling",
                                  "a_kind_added_later"])
def test_a_kind_without_its_own_record_is_charged_from_its_stages(kind):
    stages = [("release", 0.7, 1e-7), ("count", 0.3, 2e-8)]
    found = _kind_added_later() if kind == "a_kind_added_later" else kinds.get(kind)
    got = found.privacy_record({}, stages, 4)
    _check(got.rho, _rr_rho(0.7) + _rr_rho(0.3))
    assert got.delta0 == pytest.approx(1.2e-7, rel=1e-12)


def test_quantiles_global_levels_and_per_key_public_cells():
    plan = _plan(input={"path": QUICKSTART, "user": "user_id"},
                 mechanism={"kind": "quantiles", "column": "x", "ranks": [0.5],
                            "domain": [0, 100]})
    rho, delta0 = _stored(plan)
    _check(rho, sum(_rr_rho(s.epsilon) for s in plan.budget.stages))
    assert len(plan.budget.stages) == 3

    plan = _plan(mechanism={"kind": "quantiles", "column": "x", "ranks": [0.5],
                            "domain": [0, 100]})
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    select = next(s for s in plan.budget.stages if s.name == "select_keys")
    independent = _rr_rho(select.epsilon) + m["unit_shifts"] * _dg_shift_rho(m["sigma"], 1)
    _check(rho, independent, delta0, select.delta)


def _em_probabilities(scores, epsilon, sensitivity, monotone):
    from thresher.accounting.selection import exponential_mechanism_probabilities
    return exponential_mechanism_probabilities(np.asarray(scores, dtype=np.float64), epsilon,
                                               sensitivity, monotone=monotone)


@pytest.mark.parametrize("monotone", [False, True])
def test_exponential_mechanism_stage_is_epsilon_squared_over_eight(monotone):
    """Both forms of accounting.selection: the worst two-outcome neighbours (general: two
    scores moving by -Delta and +Delta; monotone: one score by +Delta) give a Renyi
    divergence close to epsilon^2/8 alpha, never above."""
    eps = 0.2
    x = [0.0, 1.0] if not monotone else [0.0, 0.0]
    y = [1.0, 0.0] if not monotone else [1.0, 0.0]
    p, q = _em_probabilities(x, eps, 1.0, monotone), _em_probabilities(y, eps, 1.0, monotone)
    independent = max(_renyi_rho(np.log(p), np.log(q)), _renyi_rho(np.log(q), np.log(p)))
    stored = zcdp.bounded_range_record(eps).rho
    _check(stored, independent)


def test_auto_bound_charges_the_maximum_over_candidates_plus_the_selection():
    plan = _plan(bounding={"max_keys_per_user": "auto"})
    rho, delta0 = _stored(plan)
    select = plan.select_stage.epsilon
    per = [kinds.get("gaussian").privacy_record(m, [("release", plan.release_stage.epsilon,
                                                     plan.release_stage.delta)], c)
           for c, m in plan.params_by_bound.items()]
    assert rho >= max(r.rho for r in per) + select ** 2 / 8 - 1e-15
    assert delta0 >= max(r.delta0 for r in per)


def test_halving_one_kinds_rho_fails_its_test(monkeypatch):
    """The per-kind checks can fail: a gaussian record with half its rho is caught."""
    gaussian = kinds.get("gaussian")
    original = gaussian.privacy_record

    def halved(mechanism, stages, c):
        r = original(mechanism, stages, c)
        return zcdp.Record(r.rho / 2, r.delta0)
    monkeypatch.setattr(gaussian, "privacy_record", halved)
    with pytest.raises(AssertionError):
        test_gaussian_threshold()


# ---- issue 42: the Laplace rows' undercharges, pinned here -----------------------------------

def _dl_tail(scale, gap):
    """P[Z >= gap] of the discrete Laplace of ``scale`` (gap an integer), summed from its pmf."""
    x, lp = _dl_logpmf(scale)
    return float(np.exp(lp[x >= gap]).sum())


def _partitions(total, largest=None):
    """Every multiset of integers >= 1 summing to ``total`` (as non-increasing tuples)."""
    largest = total if largest is None else largest
    if total == 0:
        yield ()
        return
    for first in range(min(total, largest), 0, -1):
        for rest in _partitions(total - first, first):
            yield (first,) + rest


@pytest.mark.parametrize("c,epsilon", [(3, 1.0), (5, 0.3), (10, 0.3)])
def test_laplace_l1_delta0_is_the_worst_split_by_brute_force(c, epsilon):
    """l1 (paper 002 Alg. 3): a user's C records may land on any number of keys that sit
    at tau - 1 without them, h_j >= 1 records on key j, sum h_j <= C; the user's keys all
    stay hidden with probability prod_j P[Z < T - tau + 1 - h_j]. delta0 must be at least
    the largest 1 - prod over EVERY such split, here enumerated (all integer partitions of
    1..C) with the tails summed from the discrete Laplace pmf. The split with all C records
    on one key is as little as 0.13 of the worst at (10, 0.3): a record taken from it alone
    fails (issue 42). Deterministic."""
    plan = _plan(mechanism={"kind": "laplace"}, privacy={"epsilon": epsilon, "delta": 1e-6},
                 bounding={"max_keys_per_user": c, "model": "l1"})
    m = plan.params_by_bound[c]
    rho, delta0 = _stored(plan)
    b, gap = m["scale"], m["threshold"] - m["pre_threshold"]
    release = {h: _dl_tail(b, gap + 1 - h) for h in range(1, c + 1)}  # key lifted by h records
    worst, worst_split = 0.0, None
    for records in range(1, c + 1):
        for split in _partitions(records):
            leak = -math.expm1(math.fsum(math.log1p(-release[h]) for h in split))
            if leak > worst:
                worst, worst_split = leak, split
    assert delta0 >= worst * (1 - 1e-9), (delta0, worst, worst_split)
    assert delta0 <= worst * (1 + 1e-6)          # and it is that maximum, not more
    if c >= 5:                                   # the one-key split is far from the worst
        assert release[c] < 0.5 * worst and worst_split != (c,)
    _check(rho, _dl_shift_rho(b, c))             # all C records on one kept key: shift C


def test_laplace_with_aggregate_sum_columns():
    """laplace (l0) with a mean and a variance: the count and each grid sum column are
    discrete Laplace; a user shifts C keys' count by 1 and each column's sum by at most
    its grid sensitivity D_j against its own scale (the report's ``scale_grid_units``).
    rho is checked against the Renyi divergences of those shifts summed over the pmf, so a
    record with the sum columns' rho halved (or dropped) fails (issue 42)."""
    plan = _plan(mechanism={"kind": "laplace"},
                 aggregates=[{"column": "x", "statistic": "mean", "clip": [0, 10]},
                             {"column": "x", "statistic": "variance", "clip": [0, 10]}])
    m = plan.params_by_bound[3]
    rho, delta0 = _stored(plan)
    columns = {}
    for agg in m["aggregates"]:
        for col in (agg, agg.get("squares")):
            if col is not None:
                columns[col["sum_column"]] = (col["scale_grid_units"],
                                              col["sensitivity_grid_units"])
    assert len(columns) == 2                      # sum x and sum x^2
    per_key = _dl_shift_rho(m["scale"], 1) + math.fsum(
        _dl_shift_rho(scale, shift) for scale, shift in columns.values())
    count_only = 3 * _dl_shift_rho(m["scale"], 1)
    assert rho >= 3 * per_key * (1 - 1e-9)
    # the sum columns' part alone is checked against its own halving
    assert (rho - count_only * (1 + 1e-9)) / 2 < 3 * per_key - count_only
    tail = _dl_tail(m["scale"], m["threshold"] - m["pre_threshold"])
    _check(rho, 3 * per_key, delta0, 1 - (1 - tail) ** 3)

"""Tests of accounting.contribution_bound: V(C) scores, their sensitivity, bounded-domain
rules (paper 002 Lemma 4.2, Thm 4.3) and Poisson debiasing (Alg. 5).

Independent computations: the paper's V(C) formula evaluated literally with Python
loops over users and keys; sensitivity and monotonicity checked on random neighbouring
datasets (hypothesis); bounded-domain rules against brute-force minimisation of the
error they approximate; Alg. 5 against exact Poisson sums and Monte Carlo.
"""
import collections
import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from thresher.accounting import contribution_bound as cb
from tests.accounting.score_fixtures import CANDIDATES, MAX_BOUND, score_params


# ---------------------------------------------------------------------------- helpers

def _pairs(dataset):
    """dataset: list of {key: count} per user -> (users, keys, counts) arrays."""
    users, keys, counts = [], [], []
    for u, hist in enumerate(dataset):
        for key, count in hist.items():
            users.append(u)
            keys.append(key)
            counts.append(count)
    return (np.array(users, dtype=np.int64), np.array(keys, dtype=np.int64),
            np.array(counts, dtype=np.int64))


def _values(dataset, score):
    users, keys, counts = _pairs(dataset)
    return cb.score_values(users, keys, counts, score)[0]


def _paper_v_literal(dataset, c, epsilon, delta, c_max, weight=2.0, suppressed=1.0):
    """Paper 002, Sec. 5: V(C) = 2 sum_i max(m_i - C, 0)
    + sum_{j: N_j > 0} min(sum_i C N_ij / max(C, m_i), C + C/eps ln(C / (2 delta))),
    with m_i capped at C_m in the first sum (``weight`` replaces the paper's 2 and
    ``suppressed`` multiplies the expected count inside the min, 1 in the paper)."""
    t = c + c / epsilon * math.log(c / (2 * delta))
    dropped = sum(max(min(sum(h.values()), c_max) - c, 0) for h in dataset)
    per_key = collections.defaultdict(float)
    for h in dataset:
        m = sum(h.values())
        for key, n in h.items():
            per_key[key] += c * n / max(c, m)
    return weight * dropped + math.fsum(min(suppressed * v, t) for v in per_key.values())


_MAX_BOUND, _CANDIDATES = MAX_BOUND, CANDIDATES


def _score(kind, seed=0, dropped_weight="balanced"):
    params = score_params(kind, seed)
    params["dropped_weight"] = dropped_weight
    return cb.make_score(kind, _CANDIDATES, _MAX_BOUND, params)


_datasets = st.lists(
    st.dictionaries(st.integers(0, 12), st.integers(1, 30), min_size=1, max_size=8),
    min_size=1, max_size=12)


# --------------------------------------------------------------------------- grid, V(C)

def test_default_candidates_are_a_sqrt2_geometric_grid_ending_at_max_bound():
    assert cb.default_candidates(128) == (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128)
    assert cb.default_candidates(1) == (1,)
    assert cb.default_candidates(10) == (1, 2, 3, 4, 6, 8, 10)
    grid = np.array(cb.default_candidates(5000))
    assert grid[-1] == 5000 and np.all(np.diff(grid) > 0)
    assert np.all(grid[4:] / grid[3:-1] <= 1.5 + 1e-9)


def test_laplace_l1_score_equals_the_papers_formula_evaluated_literally():
    rng = np.random.default_rng(7)
    dataset = [{int(k): int(rng.integers(1, 12)) for k in rng.integers(0, 15, rng.integers(1, 9))}
               for _ in range(60)]
    dataset.append({1: 200, 2: 100})           # one user above C_m = 24: capped
    score = cb.make_score("laplace_l1", _CANDIDATES, _MAX_BOUND,
                          {"epsilon": 0.8, "delta": 1e-4, "dropped_weight": "paper"})
    assert score.dropped_weight == 2.0
    got = _values(dataset, score)
    want = [_paper_v_literal(dataset, c, 0.8, 1e-4, _MAX_BOUND) for c in _CANDIDATES]
    np.testing.assert_allclose(got, want, rtol=1e-12)
    # thresher's default weight: sqrt of the largest t(C) / (C / epsilon), i.e.
    # sqrt(epsilon + ln(C_m / (2 delta))) for the paper's t(C) = C + C/eps ln(C/(2 delta)).
    balanced = cb.make_score("laplace_l1", _CANDIDATES, _MAX_BOUND, {"epsilon": 0.8, "delta": 1e-4})
    w = math.sqrt(0.8 + math.log(_MAX_BOUND / 2e-4))
    assert math.isclose(balanced.dropped_weight, w, rel_tol=1e-12)
    assert balanced.suppressed_weight == balanced.dropped_weight
    want = [_paper_v_literal(dataset, c, 0.8, 1e-4, _MAX_BOUND, weight=w, suppressed=w)
            for c in _CANDIDATES]
    np.testing.assert_allclose(_values(dataset, balanced), want, rtol=1e-12)


def test_dropped_weight_rules_and_refusals():
    base = {"epsilon": 1.0, "delta": 1e-6}
    assert cb.make_score("laplace_l1", _CANDIDATES, _MAX_BOUND,
                         {**base, "dropped_weight": 7}).dropped_weight == 7.0
    # Kinds without a noise scale fall back to the paper's constant.
    assert _score("weighted_sampling").dropped_weight == 2.0
    assert _score("sample_and_threshold").dropped_weight == 2.0
    # Gaussian: sqrt(max_C max(tau*, sigma sqrt(2/pi)) / (sigma sqrt(2/pi))).
    g = _score("gaussian", seed=5)
    ratio = max(max(t, s) / s for t, s in zip(g.thresholds, g.noise_scales))
    assert math.isclose(g.dropped_weight, math.sqrt(ratio), rel_tol=1e-12)
    for bad in (0.5, 0, -1, float("nan"), float("inf"), "heavy", True, None):
        with pytest.raises(ValueError, match="dropped_weight"):
            cb.make_score("laplace_l1", _CANDIDATES, _MAX_BOUND, {**base, "dropped_weight": bad})
    with pytest.raises(ValueError, match="dropped_weight"):
        cb.score_sensitivity(_CANDIDATES, _MAX_BOUND, 0.9)
    for bad in (0.5, 3.5):        # s must be in [1, w]
        with pytest.raises(ValueError, match="suppressed_weight"):
            cb.BoundScore("laplace_l0", _CANDIDATES, _MAX_BOUND, (5.0,) * len(_CANDIDATES),
                          dropped_weight=3.0, suppressed_weight=bad)


def test_balanced_score_charges_a_contribution_on_a_suppressed_key_like_a_dropped_one():
    """A contribution that a larger C brings back costs the balanced V nothing more if it
    lands on a key below its cap (-w dropped, +w suppressed: the release loses it either
    way) and saves w if it lands on a released key; the paper's V saves 2 - 1 = 1 even in
    the first case. Here half the recovered contribution (in expectation) lands on each."""
    base = {"thresholds": [50.0] * len(_CANDIDATES), "noise_scales": [2.0] * len(_CANDIDATES)}
    balanced = cb.make_score("laplace_l0", _CANDIDATES, _MAX_BOUND, base)
    paper = cb.make_score("laplace_l0", _CANDIDATES, _MAX_BOUND, {**base, "dropped_weight": "paper"})
    w = balanced.dropped_weight
    assert math.isclose(w, 5.0, rel_tol=1e-12)          # sqrt(50 / 2)
    # One user with keys {0, 1}; key 1 is rare (suppressed), key 0 has 100 other users.
    rare = [{0: 1, 1: 1}] + [{0: 1} for _ in range(100)]
    v_bal, v_pap = _values(rare, balanced), _values(rare, paper)
    # C = 1 -> C = 2: the user's second key comes back; which one depends on nothing here
    # (expected counts): h_0 and h_1 each gain 1/2 in expectation.
    d_bal, d_pap = v_bal[1] - v_bal[0], v_pap[1] - v_pap[0]
    # key 0 is released (capped) at both C; key 1: cost w * h_1 from w/2 to w.
    assert math.isclose(d_bal, -w * 1 + w * 0.5, rel_tol=1e-12)
    assert math.isclose(d_pap, -2 * 1 + 0.5, rel_tol=1e-12)


def test_l0_scores_count_distinct_keys_and_ignore_record_counts():
    dataset = [{1: 5, 2: 1}, {1: 1}, {2: 9, 3: 2, 4: 1}]
    score = _score("gaussian")
    ones = [{k: 1 for k in h} for h in dataset]
    np.testing.assert_allclose(_values(dataset, score), _values(ones, score))
    # Literal: k_i = (2, 1, 3); dropped(C=1) = 1 + 0 + 2; h_j(1) per key.
    h = {1: 1 / 2 + 1, 2: 1 / 2 + 1 / 3, 3: 1 / 3, 4: 1 / 3}
    cap = max(score.thresholds[0], score.noise_scales[0])
    w = score.dropped_weight
    want = w * 3 + sum(min(w * v, cap) for v in h.values())
    assert math.isclose(_values(dataset, score)[0], want, rel_tol=1e-12)


def test_pairs_from_records_and_dropped_contributions_match_brute_force():
    rng = np.random.default_rng(3)
    users = rng.integers(0, 40, 500)
    keys = rng.integers(0, 25, 500)
    pu, pk, pc = cb.pairs_from_records(users, keys)
    assert collections.Counter(zip(users.tolist(), keys.tolist())) == {
        (u, k): c for u, k, c in zip(pu.tolist(), pk.tolist(), pc.tolist())}
    weights = cb.user_weights(pu, pc, "l1")
    assert weights.tolist() == np.bincount(users).tolist()
    assert cb.user_weights(pu, pc, "l0").tolist() == [
        len(set(keys[users == u].tolist())) for u in range(weights.size)]
    got = cb.dropped_contributions(weights, _CANDIDATES, _MAX_BOUND)
    want = [sum(max(min(w, _MAX_BOUND) - c, 0) for w in weights.tolist()) for c in _CANDIDATES]
    assert got.tolist() == want


def test_laplace_thresholds_follow_the_paper_and_the_l0_variant():
    c = np.array(_CANDIDATES, dtype=float)
    l1 = cb.make_score("laplace_l1", _CANDIDATES, _MAX_BOUND, {"epsilon": 2.0, "delta": 1e-6})
    np.testing.assert_allclose(l1.thresholds, c + c / 2.0 * np.log(c / 2e-6))
    l0 = cb.make_score("laplace_l0", _CANDIDATES, _MAX_BOUND, {"epsilon": 2.0, "delta": 1e-6})
    np.testing.assert_allclose(l0.thresholds, 1 + c / 2.0 * np.log(c / 2e-6))
    explicit = cb.make_score("laplace_l0", _CANDIDATES, _MAX_BOUND,
                             {"thresholds": {int(x): 10.0 * x for x in _CANDIDATES}})
    np.testing.assert_allclose(explicit.thresholds, 10.0 * c)


def test_params_by_bound_reads_each_kinds_calibrated_parameters():
    """The pipeline passes {C: calibrate() dict}; thresholds and noise come from there and
    win over the epsilon/delta formula."""
    by_bound = {c: {"kind": "gaussian", "threshold": 10 + c, "sigma": 2.0 * c,
                    "pre_threshold": 1} for c in _CANDIDATES}
    score = cb.make_score("gaussian", _CANDIDATES, _MAX_BOUND,
                          {"epsilon": 0.9, "delta": 1e-6, "params_by_bound": by_bound})
    assert score.thresholds == tuple(10.0 + c for c in _CANDIDATES)
    np.testing.assert_allclose(score.noise_scales,
                               [2.0 * c * math.sqrt(2 / math.pi) for c in _CANDIDATES])
    laplace = cb.make_score("laplace_l0", _CANDIDATES, _MAX_BOUND, {
        "epsilon": 0.9, "delta": 1e-6,
        "params_by_bound": {c: {"threshold": 7 * c, "scale": c / 0.9} for c in _CANDIDATES}})
    assert laplace.thresholds == tuple(7.0 * c for c in _CANDIDATES)
    st_score = cb.make_score("sample_and_threshold", _CANDIDATES, _MAX_BOUND, {
        "params_by_bound": {c: {"threshold": 4, "sampling_rate": 0.5 / c} for c in _CANDIDATES}})
    np.testing.assert_allclose(st_score.caps(), [4 * 2.0 * c for c in _CANDIDATES])


# ------------------------------------------------------------------ sensitivity proofs

_WEIGHTS = ("paper", "balanced", 1, 6.5)


@pytest.mark.parametrize("weight", _WEIGHTS)
@pytest.mark.parametrize("kind", sorted(cb.SCORE_MODELS))
@settings(max_examples=40, deadline=None)
@given(dataset=_datasets, removed=st.integers(0, 11))
def test_removing_a_user_changes_v_by_at_most_delta_and_never_increases_it(
        kind, weight, dataset, removed):
    """Prop. 1 of docs/contribution_bound.md on random neighbouring datasets:
    0 <= V(D)(C) - V(D - user)(C) <= w (C_m - C) + s C for every candidate (so the
    exponential mechanism's Delta = max_C w (C_m - C) + s C holds, and V is monotone)."""
    score = _score(kind, seed=len(dataset), dropped_weight=weight)
    removed %= len(dataset)
    smaller = dataset[:removed] + dataset[removed + 1:]
    diff = _values(dataset, score) - _values(smaller, score)
    c = np.array(_CANDIDATES, dtype=float)
    per_candidate = score.dropped_weight * (_MAX_BOUND - c) + score.suppressed_weight * c
    assert np.all(diff >= -1e-9)
    assert np.all(diff <= per_candidate + 1e-9)
    assert np.all(diff <= score.sensitivity + 1e-9)


@pytest.mark.parametrize("weight", _WEIGHTS)
@pytest.mark.parametrize("kind", sorted(cb.SCORE_MODELS))
def test_the_sensitivity_bound_is_attained(kind, weight):
    """A user with C_m contributions on C_m fresh keys moves V(min C) by exactly
    w (C_m - min C) + min C, so Delta cannot be lowered (for w = 2: 2 C_m - min C; the
    paper's 5 C_m / 2 is looser)."""
    score = _score(kind, dropped_weight=weight)
    base = [{0: 3, 1: 2}, {1: 1}]
    heavy = {100 + j: 1 for j in range(_MAX_BOUND)}
    diff = _values(base + [heavy], score) - _values(base, score)
    assert math.isclose(diff[0], score.sensitivity, rel_tol=1e-12)
    w, s = score.dropped_weight, score.suppressed_weight
    assert math.isclose(score.sensitivity, w * (_MAX_BOUND - _CANDIDATES[0]) + s * _CANDIDATES[0],
                        rel_tol=1e-15)
    if weight == "paper":
        assert (w, s) == (2.0, 1.0)
        assert score.sensitivity == 2 * _MAX_BOUND - _CANDIDATES[0]
    else:
        assert s == w and math.isclose(score.sensitivity, w * _MAX_BOUND, rel_tol=1e-15)


@pytest.mark.parametrize("weight", ("paper", "balanced"))
@pytest.mark.parametrize("kind", sorted(cb.SCORE_MODELS))
@settings(max_examples=100, deadline=None)
@given(a=st.floats(0, 1e5), b=st.floats(0, 1e5))
def test_key_cost_is_zero_at_zero_non_decreasing_and_s_lipschitz(kind, weight, a, b):
    """cost_C is 0 at 0, non-decreasing and s-Lipschitz (s = suppressed weight: 1 for the
    paper's V, w for thresher's): what Prop. 1's key-term bound s C uses."""
    score = _score(kind, seed=int(a) % 7, dropped_weight=weight)
    k = len(_CANDIDATES)
    ca, cb_ = score.key_cost(np.full((1, k), a)), score.key_cost(np.full((1, k), b))
    assert np.all(score.key_cost(np.zeros((1, k))) == 0)
    s = score.suppressed_weight
    assert np.all(np.abs(ca - cb_) <= s * abs(a - b) * (1 + 1e-12) + 1e-9)
    lo, hi = (ca, cb_) if a <= b else (cb_, ca)
    assert np.all(lo <= hi + 1e-9)


@pytest.mark.parametrize("kwargs, field", [
    (dict(kind="nope", score_params={}), "score"),
    (dict(kind="laplace_l1", score_params={"epsilon": 1.0, "delta": 1e-5, "x": 1}),
     "score_params.x"),
    (dict(kind="laplace_l1", score_params={"epsilon": 1.0}), "score_params.delta"),
    (dict(kind="laplace_l1", score_params={"epsilon": -1.0, "delta": 1e-5}), "score_params.epsilon"),
    (dict(kind="gaussian", score_params={}), "thresholds"),
    (dict(kind="laplace_l0", score_params={"sigmas": [1.0] * 7, "thresholds": [1.0] * 7}),
     "score_params.sigmas"),
    (dict(kind="gaussian", score_params={"params_by_bound": {1: {"threshold": 3}}}),
     "params_by_bound"),
    (dict(kind="sample_and_threshold",
          score_params={"params_by_bound": {c: {"threshold": 3} for c in _CANDIDATES}}),
     "sampling_rate"),
    (dict(kind="gaussian", score_params={"thresholds": [1.0] * 6}), "score_params.thresholds"),
    (dict(kind="gaussian", score_params={"thresholds": {1: 2.0}}), "score_params.thresholds"),
    (dict(kind="sample_and_threshold", score_params={"thresholds": [5.0] * 7}),
     "sampling_rates"),
    (dict(kind="sample_and_threshold",
          score_params={"thresholds": [5.0] * 7, "sampling_rates": [1.5] * 7}),
     "sampling_rates"),
    (dict(kind="gaussian", score_params={"thresholds": [5.0] * 7, "sampling_rates": [0.1] * 7}),
     "sampling_rates"),
])
def test_make_score_errors_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        cb.make_score(kwargs["kind"], _CANDIDATES, _MAX_BOUND, kwargs["score_params"])


@pytest.mark.parametrize("candidates, max_bound", [
    ((), 8), ((2, 1), 8), ((1, 1), 8), ((0, 2), 8), ((1, 9), 8), ((1.5, 2), 8), ((1, 2), 0)])
def test_bad_candidate_grids_are_refused(candidates, max_bound):
    with pytest.raises(ValueError, match="candidates|max_bound"):
        cb.make_score("laplace_l1", candidates, max_bound, {"epsilon": 1.0, "delta": 1e-5})


def test_choose_bound_picks_the_minimum_of_v_at_large_epsilon():
    values = np.array([50.0, 10.0, 30.0, 1e6])
    rng = np.random.default_rng(0)
    chosen, probabilities = cb.choose_bound(values, (1, 2, 4, 8), 1e3, 1.0, rng)
    assert chosen == 2 and probabilities[1] > 1 - 1e-12


# ----------------------------------------------------------------- bounded domains

def _laplace_clipping_loss(m, c, d, epsilon):
    """E||N_hat_L - N||_1 of Alg. 1 with l1 clipping: clipping removes max(m_i - C, 0)
    from each user and each of d keys gets Laplace(C/epsilon) noise (E|Z| = C/epsilon)."""
    return np.maximum(m - c, 0).sum() + d * c / epsilon


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 300), min_size=1, max_size=80), st.integers(1, 20),
       st.floats(0.1, 4.0))
def test_lemma_4_2_bound_is_a_two_approximation(m, d, epsilon):
    m = np.array(m)
    c_star = cb.laplace_best_bound(m, d, epsilon)
    losses = [_laplace_clipping_loss(m, c, d, epsilon) for c in range(1, 302)]
    assert _laplace_clipping_loss(m, c_star, d, epsilon) <= 2 * min(losses) + 1e-9
    k = math.ceil(d / epsilon)
    if k <= len(m):
        assert c_star == max(1, sorted(m, reverse=True)[k - 1])


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 50), min_size=2, max_size=40), st.integers(0, 39))
def test_lemma_4_2_rank_score_has_sensitivity_one(m, removed):
    removed %= len(m)
    candidates = np.arange(1, 52)
    a = cb.laplace_bound_scores(m, 5, 1.0, candidates)
    b = cb.laplace_bound_scores(m[:removed] + m[removed + 1:], 5, 1.0, candidates)
    assert np.max(np.abs(a - b)) <= 1


def test_private_lemma_4_2_bound_concentrates_on_the_quantile():
    rng = np.random.default_rng(11)
    m = rng.poisson(30, 20000)
    target = cb.laplace_best_bound(m, 100, 1.0)
    got = [cb.private_laplace_bound(m, 100, 1.0, 1.0, range(1, 101), rng) for _ in range(20)]
    # rank error of each draw: | #{m >= C} - 100 | (exceeds 60 with prob < 100 e^-30)
    ranks = [abs(int((m >= c).sum()) - 100) for c in got]
    assert max(ranks) <= 60 and abs(np.median(got) - target) <= 2


def _gaussian_loss_bound(l1, l2, c, m_target):
    """G(C) of paper 002 eq. (3): sum_i max(1 - C/||N_i||_2, 0) ||N_i||_1 + C M."""
    return np.sum(np.maximum(1 - c / l2, 0) * l1) + c * m_target


def test_theorem_4_3_bound_minimises_the_error_bound():
    rng = np.random.default_rng(5)
    hists = rng.poisson(rng.uniform(0.1, 4, (300, 1)), (300, 12)) + np.eye(12, dtype=int)[
        rng.integers(0, 12, 300)]
    l1 = hists.sum(1).astype(float)
    l2 = np.sqrt((hists ** 2).sum(1))
    for sigma in (0.5, 2.0, 8.0):
        c_star = cb.gaussian_best_bound(l1, l2, 12, sigma)
        m_target = 12 * sigma * math.sqrt(2 / math.pi)
        grid = np.concatenate([np.linspace(0, l2.max() * 1.1, 4001), l2])
        best = min(_gaussian_loss_bound(l1, l2, c, m_target) for c in grid)
        assert _gaussian_loss_bound(l1, l2, c_star, m_target) <= best * (1 + 1e-12) + 1e-9


@settings(max_examples=60, deadline=None)
@given(st.lists(st.lists(st.integers(0, 9), min_size=6, max_size=6).filter(any),
                min_size=2, max_size=30), st.integers(0, 29))
def test_theorem_4_3_tail_sum_with_sparsity_has_sensitivity_sqrt_s(hists, removed):
    hists = np.array(hists, dtype=float)
    removed %= len(hists)
    l1, l2 = hists.sum(1), np.sqrt((hists ** 2).sum(1))
    keep = np.arange(len(hists)) != removed
    grid = np.linspace(0, 25, 101)
    a = cb.gaussian_tail_sum(l1, l2, grid, sparsity=2)
    b = cb.gaussian_tail_sum(l1[keep], l2[keep], grid, sparsity=2)
    assert np.max(np.abs(a - b)) <= math.sqrt(2) + 1e-12


def test_private_gaussian_bound_returns_a_candidate_near_c_star_at_large_epsilon():
    rng = np.random.default_rng(9)
    l2 = rng.gamma(2.0, 10.0, 5000)
    l1 = l2 * rng.uniform(1.0, 3.0, 5000)
    c_star = cb.gaussian_best_bound(l1, l2, 50, 2.0)
    grid = np.arange(1.0, 200.0)
    got = cb.private_gaussian_bound(l1, l2, 50, 2.0, 9, 50.0, grid, rng)
    assert abs(got - c_star) <= 3


# ------------------------------------------------------------------ Algorithm 5

def test_poisson_clipped_mean_matches_an_exact_sum():
    for lam in (0.0, 0.3, 1.0, 4.5, 40.0):
        for c in (1, 2, 7):
            exact = math.fsum(min(x, c) * math.exp(-lam + x * math.log(lam) - math.lgamma(x + 1))
                              if lam > 0 else (0.0 if x else 0.0) for x in range(400))
            assert math.isclose(float(cb.poisson_clipped_mean(lam, c)), exact,
                                 rel_tol=1e-10, abs_tol=1e-12)


def test_poisson_debias_inverts_h_and_removes_clipping_bias():
    """n = 200000 users with N_i ~ Poisson(1.5), clipped at C = 2. The clipped sum is
    ~19% low; Alg. 5 recovers the total. Tolerance 1.5% of n * lambda is > 10 standard
    deviations of the estimate (fixed seed): false failure < 1e-20."""
    rng = np.random.default_rng(12)
    n, lam, c = 200000, 1.5, 2
    counts = rng.poisson(lam, n)
    clipped_sum = np.minimum(counts, c).sum()
    debiased = cb.poisson_debias(clipped_sum, n, c)
    assert abs(clipped_sum - n * lam) > 0.15 * n * lam
    assert abs(debiased - n * lam) < 0.015 * n * lam
    y = float(cb.poisson_clipped_mean(0.8, 3))
    assert math.isclose(cb.poisson_debias(y * 10, 10, 3) / 10, 0.8, rel_tol=1e-8)
    assert cb.poisson_debias(-5.0, 10, 3) == 0.0
    assert cb.poisson_debias(31.0, 10, 3, max_rate=50.0) == 500.0


def test_weighted_gaussian_score_reads_weight_threshold_times_sqrt_c_and_count_sigma():
    """The weighted_gaussian score: a key costs at most threshold * sqrt(C) users (the
    users of C keys each it needs) or the count column's mean absolute noise."""
    by_bound = {c: {"kind": "weighted_gaussian", "threshold": 20.0, "count_sigma": 3.0 * c}
                for c in _CANDIDATES}
    score = cb.make_score("weighted_gaussian", _CANDIDATES, _MAX_BOUND,
                          {"epsilon": 0.9, "delta": 1e-6, "params_by_bound": by_bound})
    c = np.asarray(_CANDIDATES, dtype=float)
    assert np.allclose(score.thresholds, 20.0 * np.sqrt(c))
    assert np.allclose(score.noise_scales, 3.0 * c * math.sqrt(2 / math.pi))
    assert score.model == "l0"

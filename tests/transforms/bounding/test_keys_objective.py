"""The key-count objective of the automatic bound (``bounding.auto.objective: keys``).

U(C) = sum_j u_C(h_j(C)), u_C(h) = Phi((h - T)/s) - Phi(-T/s)
(``accounting.contribution_bound.key_release_utility``; docs/contribution_bound.md
section 1b, Prop. 3). The sensitivity claim Delta = max_C C / (s(C) sqrt(2 pi)) is
checked on the pipeline's own kernel (``transforms.bounding.choose_contribution_bound``:
``table_statistics`` per user-sharded table, ``shard_key_costs`` per key shard,
``BoundScore.values``) for random add/remove-one-user neighbours (hypothesis) and for an
adversarial neighbour placed where u_C is steepest (which reaches 96% of the bound, so
the bound is not vacuous); the Beam stage's sums against the one-process reference.
"""
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from thresher.accounting import contribution_bound as cb
from thresher.accounting import exact_scores
from tests.accounting.score_fixtures import CANDIDATES, MAX_BOUND, score_params
from thresher.transforms.bounding.choose_contribution_bound import (
    ContributionBoundSums, shard_key_costs, table_statistics)

_CANDIDATES, _MAX_BOUND = CANDIDATES, MAX_BOUND
_SHARDS = 3


def _score(kind, seed=0, objective="keys"):
    params = score_params(kind, seed, sigma_low=0.2)
    params["objective"] = objective
    return cb.make_score(kind, _CANDIDATES, _MAX_BOUND, params)


def _table(dataset):
    """dataset: list of {key: records} per user -> one user-sharded table (every record
    of a user in it), string user ids, an int key column."""
    users, words = [], []
    for u, hist in enumerate(dataset):
        for key, n in hist.items():
            users += [f"u{u}"] * n
            words += [int(key)] * n
    return pa.table({"__user": pa.array(users, pa.string()),
                     "word": pa.array(words, pa.int64())})


def _kernel_values(dataset, score):
    """V(C) = -U(C) as the pipeline computes it: per-table statistics, key shards summed
    by ``shard_key_costs`` (exact integer units), ``BoundScore.exact_values`` (as floats:
    the exact Fractions rounded once)."""
    k = len(score.candidates)
    if not dataset:
        return np.zeros(k)
    dropped, partials = table_statistics(_table(dataset), ["word"], score,
                                         num_key_shards=_SHARDS)
    costs = [0] * k
    for shard in range(_SHARDS):
        units = shard_key_costs([t for s, t in partials if s == shard], ["word"], score)
        costs = [a + b for a, b in zip(costs, units)]
    return np.array([float(v) for v in score.exact_values(dropped, costs)])


def _reference_values(dataset, score):
    """V(C) = -U(C) unrounded, in one process (``accounting.contribution_bound.score_values``)."""
    if not dataset:
        return np.zeros(len(score.candidates))
    users, keys, counts = [], [], []
    for u, hist in enumerate(dataset):
        for key, count in hist.items():
            users.append(u)
            keys.append(key)
            counts.append(count)
    return cb.score_values(np.array(users), np.array(keys), np.array(counts), score)[0]


def _eta(score):
    """The rounding allowance of the exact scores (accounting.exact_scores), as a float."""
    return float(exact_scores.rounding_allowance(max(score.candidates), score.cost_bits,
                                                 score.cost_error))


def _per_candidate_bound(score):
    c = np.asarray(score.candidates, dtype=float)
    return c / (np.asarray(score.key_widths) * math.sqrt(2 * math.pi))


_datasets = st.lists(
    st.dictionaries(st.integers(0, 12), st.integers(1, 30), min_size=1, max_size=8),
    min_size=1, max_size=12)


@pytest.mark.parametrize("kind", sorted(cb.SCORE_MODELS))
@settings(max_examples=40, deadline=None)
@given(dataset=_datasets, removed=st.integers(0, 11), added=st.dictionaries(
    st.integers(0, 40), st.integers(1, 5), min_size=1, max_size=30))
def test_kernel_key_score_moves_by_at_most_its_sensitivity_in_one_direction(
        kind, dataset, removed, added):
    """Prop. 3 on random neighbours, both ways (remove one of the users; add one more
    user of up to 30 keys): 0 <= U(D + i)(C) - U(D)(C) <= C / (s(C) sqrt(2 pi)) for
    every candidate, so Delta holds and the score is monotone (the real-valued score);
    the pipeline's rounded score moves within [-eta, bound + eta], eta its rounding
    allowance (accounting.exact_scores), which the draw's sensitivity includes."""
    score = _score(kind, seed=len(dataset))
    bound = _per_candidate_bound(score)
    eta = _eta(score)
    removed %= len(dataset)
    smaller = dataset[:removed] + dataset[removed + 1:]
    for big, small in ((dataset, smaller), (dataset + [added], dataset)):
        gain = -_reference_values(big, score) + _reference_values(small, score)
        assert np.all(gain >= -1e-12)
        assert np.all(gain <= bound * (1 + 1e-9) + 1e-12)
        assert np.all(gain <= score.sensitivity * (1 + 1e-9) + 1e-12)
        gain = -_kernel_values(big, score) + _kernel_values(small, score)   # U(big) - U(small)
        assert np.all(gain >= -eta - 1e-12)
        assert np.all(gain <= bound * (1 + 1e-9) + eta + 1e-12)


@pytest.mark.parametrize("c_index", [3, 5, 6])
def test_adversarial_neighbour_at_the_steepest_point_nearly_attains_the_bound(c_index):
    """Users all holding the same C keys put every h_j(C) on an integer; with the cost cap
    T(C) half-way between two integers and width s = 1 (the floor), one more such user
    moves every key from T - 1/2 to T + 1/2: U(C) grows by C (Phi(1/2) - Phi(-1/2)) =
    0.9599 C / sqrt(2 pi). It must stay below, and come within 5% of, the bound."""
    c = _CANDIDATES[c_index]
    thresholds = [7.5] * len(_CANDIDATES)
    score = cb.make_score("gaussian", _CANDIDATES, _MAX_BOUND,
                          {"thresholds": thresholds, "sigmas": [0.5] * len(_CANDIDATES),
                           "objective": "keys"})
    assert score.key_widths == (1.0,) * len(_CANDIDATES)     # width floor
    same_keys = {j: 1 for j in range(c)}
    base = [dict(same_keys) for _ in range(7)] + [{100: 1}, {101: 2, 102: 1}]
    gain = -_reference_values(base + [dict(same_keys)], score) + _reference_values(base, score)
    want = c * (stats.norm.cdf(0.5) - stats.norm.cdf(-0.5))
    assert gain[c_index] == pytest.approx(want, rel=1e-9)
    assert gain[c_index] <= _per_candidate_bound(score)[c_index]
    # the pipeline's rounded score: the same gain to within its rounding allowance
    kernel = -_kernel_values(base + [dict(same_keys)], score) + _kernel_values(base, score)
    assert abs(kernel[c_index] - want) <= _eta(score) + 1e-9
    assert gain[c_index] >= 0.95 * _per_candidate_bound(score)[c_index]
    # the largest candidate attains the score's Delta (max over C)
    if c == _MAX_BOUND:
        assert gain[c_index] >= 0.95 * score.sensitivity


@pytest.mark.parametrize("kind", sorted(cb.SCORE_MODELS))
def test_key_utility_is_zero_at_zero_bounded_and_lipschitz(kind):
    score = _score(kind, seed=3)
    k = len(_CANDIDATES)
    h = np.linspace(0, 200, 4001)[:, None] * np.ones((1, k))
    u = score.key_cost(h)
    assert np.all(u[0] == 0)
    assert np.all(np.diff(u, axis=0) >= 0) and np.all(u <= 1)
    slope = np.max(np.diff(u, axis=0) / np.diff(h, axis=0), axis=0)
    assert np.all(slope <= 1 / (np.asarray(score.key_widths) * math.sqrt(2 * math.pi)) + 1e-9)


def test_gaussian_key_utility_is_the_probability_a_key_is_published():
    """With s = sigma and T the Gaussian threshold, u_C(h) + Phi(-T/s) is the probability
    that a key of exact count h clears the threshold under N(0, sigma^2) noise (checked
    by Monte Carlo: 2e5 draws, tolerance 5 standard errors, false-failure ~6e-7)."""
    score = cb.make_score("gaussian", (4,), 4, {"thresholds": [30.0], "sigmas": [6.0],
                                                 "objective": "keys"})
    assert score.key_widths == pytest.approx((6.0,), rel=1e-12)
    rng = np.random.default_rng(5)
    for h in (20.0, 30.0, 37.0):
        p = float(score.key_cost(np.array([[h]]))[0, 0]) + stats.norm.cdf(-30 / 6)
        mc = np.mean(h + rng.normal(0, 6.0, 200_000) >= 30.0)
        assert abs(mc - p) <= 5 * math.sqrt(p * (1 - p) / 200_000) + 1e-12


def test_keys_score_ignores_dropped_contributions_and_picks_the_most_keys():
    """At a large epsilon the exponential mechanism picks the C with the largest U(C):
    here one shared word held by 6 users of 2 words each clears T = 3 only when both of
    each user's words are kept (C >= 2); a larger C adds nothing but raises T."""
    score = cb.make_score("gaussian", (1, 2, 4), 4,
                          {"thresholds": [3.0, 3.0, 50.0], "sigmas": [0.3, 0.3, 0.3],
                           "objective": "keys"})
    dataset = [{0: 1, 10 + u: 1} for u in range(6)]
    values = _kernel_values(dataset, score)
    assert np.argmin(values) == 1
    chosen, probabilities = cb.choose_bound(values, score.candidates, 1e4, score.sensitivity,
                                            np.random.default_rng(0), monotone=True)
    assert chosen == 2 and probabilities[1] > 0.999


def test_objective_l1_is_unchanged_and_bad_objectives_are_refused():
    l1 = _score("gaussian", seed=1, objective="l1")
    default = cb.make_score("gaussian", _CANDIDATES, _MAX_BOUND,
                            {k: v for k, v in {"thresholds": list(l1.thresholds),
                                               "sigmas": [1.0] * 7}.items()})
    assert l1.objective == default.objective == "l1" and l1.key_widths is None
    with pytest.raises(ValueError, match="score_params.objective"):
        _score("gaussian", objective="count")


def test_beam_sums_of_the_keys_score_equal_the_one_process_reference():
    rng = np.random.default_rng(11)
    users = rng.integers(0, 200, 4000)
    keys = np.minimum(rng.zipf(1.5, 4000), 80)
    score = _score("gaussian", seed=2)
    pu, pk, pc = cb.pairs_from_records(users, keys)
    values, _, key_sums = cb.score_values(pu, pk, pc, score)
    want = cb.exact_score_sums(pu, pk, pc, score)
    tables = []
    for shard in range(4):
        mine = users % 4 == shard
        tables.append(pa.table({"__user": pa.array([f"u{u}" for u in users[mine]]),
                                "word": pa.array(keys[mine])}))

    def check(results):
        (sums,) = results
        assert sums == want    # exact integers
        # within the rounding (per key: < 2^-20 per pair on h, Lipschitz 1/sqrt(2 pi))
        got = np.array([float(v) for v in score.exact_values(*sums)])
        np.testing.assert_allclose(got, values, rtol=0, atol=len(pu) * 2.0 ** -20)

    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        sums = (pipeline | beam.Create(tables)
                | ContributionBoundSums(["word"], score, num_key_shards=3))
        assert_that(sums, check)


def test_weighted_gaussian_key_widths_are_its_selection_noise_in_users():
    """Whether a weighted_gaussian key is published depends on the selection noise:
    sigma user weights, i.e. sigma * sqrt(C) users of weight 1/sqrt(C) each (not the
    count column's noise); floored at 1 like every width."""
    params = score_params("weighted_gaussian", seed=3)
    score = cb.make_score("weighted_gaussian", _CANDIDATES, _MAX_BOUND, {**params, "objective": "keys"})
    rows = params["params_by_bound"]
    expected = [max(rows[c]["sigma"] * math.sqrt(c), 1.0) for c in _CANDIDATES]
    assert score.key_widths == pytest.approx(tuple(expected), rel=1e-12)


def _kernel_key_sums(dataset, score):
    """Each key's expected bounded counts h_j(C) as the kernel computes them (one key
    shard), rows sorted."""
    _, partials = table_statistics(_table(dataset), ["word"], score, num_key_shards=1)
    (_, table), = partials
    columns = [name for name in table.column_names if name != "__key"]
    # integer units of 2^-20 (accounting.exact_scores), as contributions
    return sorted(zip(*([v / 2.0 ** 20 for v in table.column(name).to_pylist()]
                        for name in columns)))


def test_weighted_gaussian_counts_users_by_their_weight_in_one_over_sqrt_c_units():
    """weighted_gaussian's key-count score models its release: a user holding w <= C keys
    puts 1/sqrt(w) on each, sqrt(C/w) users of weight 1/sqrt(C); w > C keys: each kept with
    probability C/w at 1/sqrt(C). Checked on the kernel (``table_statistics``) against the
    formula, for a user of 4 keys and one of 16; gaussian keeps min(1, C/w)."""
    dataset = [{k: 1 for k in range(4)}, {k: 1 for k in range(16)}]
    c = np.asarray(_CANDIDATES, dtype=float)

    def expected(per_key):
        small, large = per_key(c / 4), per_key(c / 16)
        return sorted([tuple(small + large)] * 4 + [tuple(large)] * 12)

    weighted = _kernel_key_sums(dataset, _score("weighted_gaussian"))
    # each term is rounded down to 2^-20 (two users on a key: < 2^-19 in all)
    assert np.allclose(weighted, expected(lambda x: np.minimum(x, np.sqrt(x))), rtol=0,
                       atol=2.0 ** -19)
    plain = _kernel_key_sums(dataset, _score("gaussian"))
    assert np.allclose(plain, expected(lambda x: np.minimum(1.0, x)), rtol=0, atol=2.0 ** -19)

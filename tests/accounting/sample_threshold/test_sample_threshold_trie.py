"""accounting.sample_threshold.trie: TrieHH++ accounted as C x L one-cell
sample-and-threshold mechanisms composed by the privacy-loss-distribution bound.

Independent checks:
- the kernel's own cells (transforms.trees.heavy_hitters.user_prefix_counts) on neighbouring
  inputs: the user moves at most C cells per level, each by one; the exact joint output
  law of every cell, enumerated from scipy's binomial pmf, has delta(eps) <= the reported
  delta at the calibrated (p, tau) -- and the old contribution-counting cells (a user's
  keys sharing a prefix add 2 to it) exceed that budget, so the distinct-user cells are
  what the accounting needs;
- dp_accounting's PLD (test-only peer library) of the one-cell pair (P_k, P_{k-1}),
  composed C x L times, for many k: below the reported delta, which is below the target;
- the earlier split (calibrate_levels: epsilon / L per level, group privacy over C) has a
  strictly higher release point at the same budget.
"""
import itertools
import math

import numpy as np
import pyarrow as pa
import pytest

from thresher.accounting import sample_threshold as acc
from thresher.accounting.sample_threshold import pld, trie
from thresher.transforms.trees.heavy_hitters import prefix_counts, user_prefix_counts
from tests.accounting.sample_threshold.test_sample_threshold import output_distribution as law
from tests.accounting.sample_threshold.test_sample_threshold_pld import _dp_accounting_delta


def _cells(pairs, lengths, distinct):
    """{(level, prefix): count} of the kernel's cells for (user, word) pairs."""
    table = pa.table({"u": [u for u, _ in pairs], "word": [w for _, w in pairs]})
    out = {}
    for level, n in enumerate(lengths):
        if distinct:
            t = user_prefix_counts(table, "word", n, user_column="u")
        else:
            per_key = table.group_by("word").aggregate([([], "count_all")]).rename_columns(
                ["word", "count"])
            t = prefix_counts(per_key, "word", n)
        out.update({(level, w): c for w, c in zip(t.column("word").to_pylist(),
                                                  t.column("count").to_pylist())})
    return out


def _joint_delta(eps, p, tau, pairs_of_counts):
    """Exact delta(eps) of the product of one-cell laws, (k_with) vs (k_without) per cell,
    both directions, from scipy's pmf (cells not moved cancel and are left out)."""
    size = max(k for ks in pairs_of_counts for k in ks) + 1
    a, b = np.array([1.0]), np.array([1.0])
    for k_with, k_without in pairs_of_counts:
        a = np.outer(a, law(k_with, p, tau, size)).ravel()
        b = np.outer(b, law(k_without, p, tau, size)).ravel()
    e = math.exp(eps)
    return max(np.maximum(a - e * b, 0).sum(), np.maximum(b - e * a, 0).sum())


EPS, DELTA, C, LENGTHS = 1.0, 1e-3, 2, (1, None)


def _moves(k1, k2, distinct):
    """The cells the user moves, (count with, count without), from the kernel's cells:
    other users hold k1 keys "ab" and k2 keys "ac" (so the level-0 cell "a" has k1 + k2 of
    them), the user holds both (C = 2, sharing the prefix "a")."""
    others = [(f"o{i}", "ab") for i in range(k1)] + [(f"q{i}", "ac") for i in range(k2)]
    with_user = _cells(others + [("u", "ab"), ("u", "ac")], LENGTHS, distinct)
    without = _cells(others, LENGTHS, distinct)
    return sorted((with_user[c], without.get(c, 0)) for c in with_user
                  if with_user[c] != without.get(c, 0))


def _worst_neighbours(params, distinct):
    """The largest exact delta over a grid of (k1, k2) (:func:`_moves`); the kernel's
    moves at three grid points fix the pattern (the user adds 1 or 2 to the shared cell),
    used for the rest of the grid. Returns (delta, the worst moves)."""
    p, tau = params.sampling_rate, params.threshold
    shared = 1 if distinct else 2
    for k1, k2 in [(1, 1), (tau, 3 * tau), (5 * tau, 2 * tau)]:
        assert _moves(k1, k2, distinct) == sorted(
            [(k1 + k2 + shared, k1 + k2), (k1 + 1, k1), (k2 + 1, k2)])
    worst, worst_moves = 0.0, None
    grid = np.unique(np.linspace(max(1, tau - 2), 2.5 * tau / p, 14).astype(int)).tolist()
    for k1, k2 in itertools.combinations_with_replacement(grid, 2):
        moves = [(k1 + k2 + shared, k1 + k2), (k1 + 1, k1), (k2 + 1, k2)]
        d = _joint_delta(EPS, p, tau, moves)
        if d > worst:
            worst, worst_moves = d, moves
    return worst, worst_moves


def test_kernel_cells_meet_the_trie_accounting_exactly_and_contribution_counts_do_not():
    params = acc.calibrate_trie(EPS, DELTA, len(LENGTHS), C)
    assert params.cells_per_user == 4 and params.delta_spent <= DELTA
    worst, moves = _worst_neighbours(params, distinct=True)
    # distinct users per prefix: 3 cells moved (a, ab, ac) <= C x L, each by exactly one
    assert len(moves) == 3 and all(kw - ko == 1 for kw, ko in moves)
    assert worst <= params.delta_spent
    # Summed contributions (the old cells): "a" moves by 2 -- the same (p, tau) break the
    # budget (a group of two in one cell is not two composed cells).
    over, moves = _worst_neighbours(params, distinct=False)
    assert sorted(kw - ko for kw, ko in moves) == [1, 1, 2]
    assert over > DELTA


@pytest.mark.parametrize("c,levels", [(2, 2), (3, 1)])
def test_reported_delta_is_above_dp_accounting_and_within_the_target(c, levels):
    """delta_spent (reported) <= 1e-6, and dp_accounting's PLD of C x L copies of the
    one-cell pair for k from tau up to ~3 tau / p (where the worst k sits) stays below it
    (dp_accounting's optimistic estimate: a lower bound on the exact delta of each
    vector)."""
    params = acc.calibrate_trie(1.0, 1e-6, levels, c)
    p, tau, n = params.sampling_rate, params.threshold, c * levels
    assert params.cells_per_user == n and params.delta_spent <= 1e-6
    ks = np.unique(np.linspace(tau, 3 * tau / p, 12).astype(int))
    peer = [_dp_accounting_delta(1.0, p, tau, (int(k),) * n) for k in ks]
    assert 0 < max(peer) <= params.delta_spent
    # and the reported value is the module's bound at exactly the drawn parameters
    assert params.delta_spent == pld.user_delta(1.0, p, tau, n)


@pytest.mark.parametrize("c,levels", [(2, 2), (4, 3)])
def test_the_group_privacy_split_needs_a_higher_release_point(c, levels):
    new = acc.calibrate_trie(1.0, 1e-6, levels, c)
    old = acc.calibrate_levels(1.0, 1e-6, levels, c)
    assert new.release_point < old.threshold / old.sampling_rate


def test_fixed_parameters_are_checked_or_completed():
    params = acc.calibrate_trie(1.0, 1e-6, 2, 2)
    same = acc.calibrate_trie(1.0, 1e-6, 2, 2, sampling_rate=params.sampling_rate,
                              threshold=params.threshold)
    assert same.delta_spent == params.delta_spent and same.cells.calibrated == ()
    with pytest.raises(acc.CalibrationInfeasible):
        acc.calibrate_trie(1.0, 1e-6, 2, 2, sampling_rate=min(1.0, 3 * params.sampling_rate),
                           threshold=params.threshold)


def test_schedule_is_the_fewest_levels_and_public():
    best, points = acc.choose_schedule(1.0, 1e-6, 2)
    assert best == (None,) == acc.fewest_levels() and list(points) == [(None,)]
    assert acc.fewest_levels([(2, None), (4, None), (1, 2, None)]) == (2, None)
    assert points[(None,)] == acc.calibrate_trie(1.0, 1e-6, 1, 2).release_point


def test_cells_grow_the_composed_delta():
    """The schedule rule's lemma at fixed (p, tau): user_delta is non-decreasing in the
    number of cells (more levels never allow a lower release point)."""
    values = [pld.user_delta(1.0, 0.1, 12, n) for n in (1, 2, 3, 4, 6, 8)]
    assert values == sorted(values) and values[-1] > values[0]


@pytest.mark.slow
def test_exhaustive_schedule_choice_agrees_with_the_rule_at_the_issue_setting():
    """epsilon 1, delta 1e-6, C = 16: every candidate calibrated; the lowest release
    point is the one-level schedule (measured 93 / 114 / 130 users for 1 / 2 / 3 levels
    against 700 / 1,352 / 2,005 with the group-privacy split)."""
    best, points = acc.choose_schedule(1.0, 1e-6, 16, exhaustive=True)
    assert best == (None,)
    assert points[(None,)] < points[(4, None)] < points[(2, 4, None)]
    for schedule, point in points.items():
        old = acc.calibrate_levels(1.0, 1e-6, len(schedule), 16)
        assert point < old.threshold / old.sampling_rate


def test_calibrate_trie_memo_normalises_its_arguments():
    """1 and 1.0, positional and keyword-default calls are one memo entry (one miss, then
    hits): the plan's different call sites must not calibrate the same trie twice. The
    result is the same object, and a different budget is a different entry."""
    trie.calibrate_trie.cache_clear()
    first = acc.calibrate_trie(1, 1e-6, 1, 2)
    again = [acc.calibrate_trie(1.0, 1e-6, 1.0, 2.0),
             acc.calibrate_trie(1, 1e-6, 1, 2, sampling_rate=None, threshold=None),
             acc.calibrate_trie(epsilon=1.0, delta_target=1e-6, levels=1, max_keys_per_user=2)]
    info = acc.calibrate_trie.cache_info()
    assert (info.misses, info.hits) == (1, 3)
    assert all(a is first for a in again)
    fixed = acc.calibrate_trie(1, 1e-6, 1, 2, threshold=float(first.threshold))
    assert fixed is acc.calibrate_trie(1, 1e-6, 1, 2, threshold=int(first.threshold))
    assert acc.calibrate_trie.cache_info().misses == 2
    assert fixed.threshold == first.threshold

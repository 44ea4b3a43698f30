"""Audits of the multi-level sample-and-threshold kinds (heavy_hitters: TrieHH++ prefix
levels; quantiles: hierarchical levels), with one mutation each that the auditor catches.

The trials run through the kinds' own kernels: the cells of each level come from
``transforms.trees.heavy_hitters.prefix_counts`` / ``transforms.trees.quantiles.level_cells``
on the neighbouring inputs D (with the user) and D' (without), and every trial's cells are
released by ``transforms.selection.sample_and_threshold.release_table`` (one call for all trials:
the trial index is a key column, so each (trial, cell) is an independent key) with the
parameters ``accounting.sample_threshold.calibrate_levels`` gives the kind. The outcome
code of a trial is the number and sum of its released sampled counts (ordered, for both
event families). Auditor: tests/audit/auditor.py (Clopper-Pearson at confidence 0.999,
so an honest mechanism is flagged with probability <= 1e-3; seeds fixed).

Mutation "levels ignored": every level calibrated as if it were the only one (the budget
of Lemma 4.1 not divided by L), the bug of a multi-round protocol that reuses a
single-histogram calibration.
"""
import numpy as np
import pyarrow as pa
import pytest

from thresher.accounting import sample_threshold as acc
from tests.audit import auditor
from tests.audit.scenarios import DELTA, EPSILON, Scenario
from thresher.transforms.trees.heavy_hitters import prefix_counts, user_prefix_counts
from thresher.transforms.trees.quantiles import level_cells
from thresher.transforms.selection.sample_and_threshold import release_table

pytestmark = pytest.mark.audit

TRIALS = 400_000
MUTATION_TRIALS = 10**6


def _worst_k(params):
    """The per-cell count where one contribution's exact divergence is largest."""
    p, tau = params.sampling_rate, params.threshold
    ks = np.arange(tau, int(4 * tau / p) + 2)
    add, remove = acc.divergences(params.unit.epsilon, p, tau, ks)
    return int(ks[int(np.argmax(np.maximum(add, remove)))])


def _runner(cell_counts, params):
    counts = np.asarray(cell_counts, dtype=np.int64)
    m = len(counts)

    def run(rng, n):
        table = pa.table({"trial": np.repeat(np.arange(n), m), "cell": np.tile(np.arange(m), n),
                          "count": np.tile(counts, n)})
        out = release_table(table, {"sampling_rate": params.sampling_rate,
                                    "threshold": params.threshold}, rng)
        keep = np.zeros((n, m), dtype=bool)
        values = np.zeros((n, m), dtype=np.int64)
        t, c = out.column("trial").to_numpy(), out.column("cell").to_numpy()
        keep[t, c] = True
        values[t, c] = out.column("count").to_numpy()
        return auditor.released_count_and_sum(keep, values)
    return run


def _trie_cells(words, lengths):
    """Every level's prefix counts of a word list, in (level, prefix) order."""
    table = pa.table({"word": words, "count": np.ones(len(words), dtype=np.int64)})
    out = []
    for n in lengths:
        cells = prefix_counts(table, "word", n).sort_by("word")
        out.extend(cells.column("count").to_pylist())
    return out


def heavy_hitters_scenario(*, mutation="", trials=TRIALS):
    """Honest: C = 2, the user's two keys "ab" and "ac" share the level-0 prefix "a" (two
    contributions in one cell: the group-privacy case). Mutated: C = 1, key "abcdef",
    prefix_lengths (1, 2, 3, 4, 5, None), each level calibrated with levels = 1."""
    if mutation == "levels ignored":
        lengths, user_words, c = (1, 2, 3, 4, 5, None), ["abcdef"], 1
        params = acc.calibrate_levels(EPSILON, DELTA, 1, c)
    elif mutation == "":
        lengths, user_words, c = (1, None), ["ab", "ac"], 2
        params = acc.calibrate_levels(EPSILON, DELTA, len(lengths), c)
    else:
        raise ValueError(mutation)
    k = _worst_k(params)
    base = [w for w in user_words for _ in range(k)]
    with_user = _trie_cells(base + user_words, lengths)
    without = _trie_cells(base, lengths)
    return Scenario(mechanism="TrieHH++ (heavy_hitters)", case=f"k={k} per key",
                    claimed_epsilon=EPSILON,
                    claimed_delta=DELTA if mutation else params.delta_spent,
                    run_d=_runner(with_user, params), run_d_prime=_runner(without, params),
                    trials=trials, mutation=mutation,
                    parameters=f"p={params.sampling_rate:.4g}, tau={params.threshold}, "
                               f"levels={len(lengths)}, C={c}")


def trie_scenario(*, mutation="", trials=TRIALS):
    """The heavy_hitters kind's trie (issue 28): cells count distinct users
    (``user_prefix_counts``) and (p, tau) come from ``calibrate_trie`` (C x L = 4 one-cell
    mechanisms composed by the PLD bound). C = 2, the user's keys "ab" and "ac" share the
    level-0 prefix "a" (which moves by one, not two)."""
    if mutation:
        raise ValueError(mutation)
    lengths, user_words, c = (1, None), ["ab", "ac"], 2
    params = acc.calibrate_trie(EPSILON, DELTA, len(lengths), c)
    p, tau = params.sampling_rate, params.threshold
    ks = np.arange(tau, int(4 * tau / p) + 2)
    add, remove = acc.divergences(EPSILON / 4, p, tau, ks)
    k = int(ks[int(np.argmax(np.maximum(add, remove)))])

    def cells(pairs):
        table = pa.table({"u": [u for u, _ in pairs], "word": [w for _, w in pairs]})
        out = []
        for n in lengths:
            out.extend(user_prefix_counts(table, "word", n, user_column="u").sort_by("word")
                       .column("count").to_pylist())
        return out

    base = [(f"{w}{i}", w) for w in user_words for i in range(k)]
    with_user = cells(base + [("u", w) for w in user_words])
    without = cells(base)
    return Scenario(mechanism="TrieHH++ distinct-user cells (heavy_hitters)",
                    case=f"k={k} per key", claimed_epsilon=EPSILON,
                    claimed_delta=params.delta_spent,
                    run_d=_runner(with_user, params), run_d_prime=_runner(without, params),
                    trials=trials, mutation=mutation,
                    parameters=f"p={p:.4g}, tau={tau}, levels={len(lengths)}, C={c}, "
                               f"cells={params.cells_per_user}")


def quantiles_scenario(*, mutation="", trials=TRIALS):
    """Hierarchy over [0, 1); k other users and the user all at value 0.3 (one cell per
    level gets every contribution). Honest: branching 4, 3 levels, C = 2 (the user's two
    values 0.3 and 0.301 share every bucket but maybe the leaf); mutated: branching 2, 6
    levels, C = 1 and each level calibrated with levels = 1."""
    levels, branching = 3, 4
    if mutation == "levels ignored":
        levels, branching = 6, 2
        c, user_values = 1, [0.3]
        params = acc.calibrate_levels(EPSILON, DELTA, 1, c)
    elif mutation == "":
        c, user_values = 2, [0.3, 0.301]
        params = acc.calibrate_levels(EPSILON, DELTA, levels, c)
    else:
        raise ValueError(mutation)
    k = _worst_k(params)

    def cells(values):
        table = pa.table({"v": np.asarray(values, dtype=np.float64),
                          "count": np.ones(len(values), dtype=np.int64)})
        out = []
        for level in range(1, levels + 1):
            lc = level_cells(table, [], "v", lo=0.0, hi=1.0, branching=branching, level=level).sort_by("bucket")
            out.extend(lc.column("count").to_pylist())
        return out

    base = [0.3] * k
    with_user, without = cells(base + user_values), cells(base)
    if len(with_user) != len(without):  # a cell only the user has: pad D' with a 0 count
        without = without + [0] * (len(with_user) - len(without))
    return Scenario(mechanism="KeyedHierarchy (quantiles)", case=f"k={k} at one value",
                    claimed_epsilon=EPSILON,
                    claimed_delta=DELTA if mutation else params.delta_spent,
                    run_d=_runner(with_user, params), run_d_prime=_runner(without, params),
                    trials=trials, mutation=mutation,
                    parameters=f"p={params.sampling_rate:.4g}, tau={params.threshold}, "
                               f"levels={levels}, C={c}")


@pytest.mark.parametrize("builder", [heavy_hitters_scenario, trie_scenario, quantiles_scenario],
                         ids=["heavy_hitters", "heavy_hitters_trie", "quantiles"])
def test_honest_levels_stay_within_the_claim(builder):
    scenario = builder()
    result = scenario.audit(seed=11)
    assert not result.violated, f"{scenario.name} ({scenario.parameters}): {result.summary()}"


@pytest.mark.slow       # 16-18 s each on the 2-core machine (MUTATION_TRIALS releases)
@pytest.mark.parametrize("builder", [heavy_hitters_scenario, quantiles_scenario],
                         ids=["heavy_hitters", "quantiles"])
def test_levels_ignored_is_flagged(builder):
    scenario = builder(mutation="levels ignored", trials=MUTATION_TRIALS)
    result = scenario.audit(seed=13)
    assert result.violated, f"{scenario.name} ({scenario.parameters}): {result.summary()}"

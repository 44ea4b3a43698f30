"""Accounting of TrieHH++ (``heavy_hitters``, method trie): every prefix cell of every level
is one sample-and-threshold mechanism, and a user moves at most C x L of them by one.

Paper 003 Sec. 4.1 (Lemma 4.1 and its proof) views TrieHH++ as L sample-and-threshold
histograms, one per prefix length, with the trie constraint ("a prefix is kept only if
its parent was released") as post-processing, and composes the L levels by basic
composition, each level (epsilon / L, delta / L). Its model gives each client one item, so
a client is one contribution to one cell per level. Here a user holds up to C keys, and
the argument is made tighter as follows.

1. The cells. Level i counts, per length-l_i prefix, the *distinct users* holding a key
   with that prefix (transforms/trees/heavy_hitters.py, ``user_prefix_counts``: a user whose
   keys share a prefix counts once there). Each cell's count k is released as
   v ~ Bin(k, p) when v >= tau, with fresh, independent sampling for every (level,
   cell). So the output of all levels before pruning is a product, over (level, cell),
   of independent one-cell laws P_k (accounting/sample_threshold/core.py).
2. The neighbours. Adding or removing one user, whose bounded key set has at most C keys,
   changes at level i only the cells of that user's distinct prefixes -- at most C of
   them -- and each by exactly one (k vs k - 1). Over L levels: at most n = C L factors
   of the product change, each from P_{k-1} to P_k (or back), whatever the k's.
3. Non-adaptive. Every level is computed on the whole input (the transform releases every
   level over all prefixes; the parent constraint is applied afterwards, ``prune_trie``),
   so no level's cells depend on another level's output: the composition is of n fixed
   one-cell mechanisms, the situation of a user holding n keys in the one-level
   ``sample_and_threshold`` kind.
4. The bound. accounting/sample_threshold/pld.py bounds exactly that situation: one pair
   of distributions whose privacy profile dominates every one-cell pair (P_k, P_{k-1}),
   k >= 1, composed n times (both neighbour orders; ``user_delta``). One (sampling_rate,
   threshold) serves every level, found by
   accounting.sample_threshold.calibration.calibrate(epsilon, delta, n, composition="pld").
5. Pruning, ranking, top_k: post-processing of the released levels.

Before (``core.calibrate_levels``, still used by the quantiles kind): each level
(epsilon / L, delta / L), and within a level group privacy over C contributions of one
unit at epsilon / (L C) -- needed there because a cell counted contributions, so one user
could add up to C to one cell. At epsilon = 1, delta = 1e-6, C = 16 the release point
tau / p is 700 / 1,352 / 2,005 users for 1 / 2 / 3 levels before and 93 / 114 / 130 with
this accounting (127 / 181 / 235 with the PLD bound before issue 38;
``python -m benchmarks.bench_heavy_hitters_recall --points``).

The prefix schedule (:func:`choose_schedule`): among the candidate schedules
(:data:`SCHEDULES`), the one with the lowest last-level release point. With one (p, tau)
for every level that is the one with the fewest levels: ``pld.user_delta`` is
non-decreasing in the number of cells n -- the composed pair over n cells is a marginal
of the one over n + 1 (data processing), the one-key delta (n = 1) is below both, and
basic composition (taken below 1e-15) n delta_1(eps / n) = eps delta_1(x) / x at
x = eps / n, where delta_1 is non-increasing in x -- so every (p, tau) that meets the
budget over C L' cells meets it over C L cells for L <= L', and the best release point of
fewer levels is never higher.
The plan therefore takes the fewest-levels candidate (:func:`fewest_levels`) and
calibrates only it (each calibration costs seconds); ``exhaustive=True`` calibrates them all (the benchmark prints them, a slow test
checks the rule against them). It depends on (epsilon, delta, C) and the spec's optional
sampling_rate / threshold only. In a central release prefix levels only prune (paper
003 Sec. 4.1, Remark: "the factor of L can be dropped" when only the heavy hitters are
wanted), so the one-level schedule [None] is chosen.
"""
import dataclasses
import functools
import math

from thresher.accounting.sample_threshold import calibration, core

# Candidate prefix schedules (None: the whole key), fewest levels first (the tie rule).
SCHEDULES = ((None,), (4, None), (2, 4, None))

# Above this many cells per user the PLD search is not run; basic composition over the
# C L cells is used instead (valid, and never worse than the per-level group-privacy
# split). 64 is also the sample_and_threshold kind's PLD limit. (Since issue 38 the
# search costs 0.4-0.5 s of CPU at 48 to 256 cells alike: the limit could be raised.)
PLD_MAX_CELLS = 64


@dataclasses.dataclass(frozen=True)
class TrieParams:
    """One (sampling_rate, threshold) for every level of a TrieHH++ release and the budget
    it meets: ``cells`` is the sample-and-threshold calibration over the user's at most
    ``max_keys_per_user * levels`` changed cells (see the module docstring)."""

    levels: int
    max_keys_per_user: int
    cells: core.SampleThresholdParams

    @property
    def cells_per_user(self):
        return self.levels * self.max_keys_per_user

    @property
    def sampling_rate(self):
        return self.cells.sampling_rate

    @property
    def threshold(self):
        return self.cells.threshold

    @property
    def release_point(self):
        return self.cells.release_point

    @property
    def epsilon(self):
        return self.cells.epsilon

    @property
    def delta(self):
        return self.cells.delta

    @property
    def delta_spent(self):
        return self.cells.delta_spent

    @property
    def composition(self):
        return self.cells.composition


def cells_per_user(levels, max_keys_per_user):
    """n = C L: the cells one user can move, by one each (module docstring, point 2)."""
    return core._positive_int(levels, "levels") * core._positive_int(
        max_keys_per_user, "max_keys_per_user")


def calibrate_trie(epsilon, delta_target, levels, max_keys_per_user, *, sampling_rate=None,
                   threshold=None):
    """:class:`TrieParams` for ``levels`` prefix levels of users bounded to
    ``max_keys_per_user`` keys at (epsilon, delta_target) for the whole release: the
    composition over n = C L cells (PLD up to :data:`PLD_MAX_CELLS` cells, basic beyond).
    sampling_rate / threshold: as accounting.sample_threshold.calibrate (given ones are
    checked, missing ones calibrated). Raises CalibrationInfeasible / ValueError.

    Memoised on the normalised arguments (floats; integral counts as int), so 1 and 1.0,
    or positional and keyword calls, share one entry (``calibrate_trie.cache_info()``)."""
    return _calibrate_trie_cached(_as_float(epsilon), _as_float(delta_target),
                                  _as_count(levels), _as_count(max_keys_per_user),
                                  None if sampling_rate is None else _as_float(sampling_rate),
                                  None if threshold is None else _as_count(threshold))


def _as_float(x):
    """float(x) for a real number; anything else unchanged (the calibration refuses it)."""
    try:
        return x if isinstance(x, bool) else float(x)
    except (TypeError, ValueError):
        return x


def _as_count(x):
    """int(x) for an integral real number (1.0 -> 1); anything else unchanged (refused by
    the calibration with its own message)."""
    try:
        return int(x) if not isinstance(x, bool) and int(x) == x else x
    except (TypeError, ValueError, OverflowError):
        return x


@functools.lru_cache(maxsize=64)
def _calibrate_trie_cached(epsilon, delta_target, levels, max_keys_per_user, sampling_rate,
                           threshold):
    n = cells_per_user(levels, max_keys_per_user)
    composition = "pld" if n <= PLD_MAX_CELLS else "basic"
    cells = calibration.calibrate(epsilon, delta_target, n, sampling_rate=sampling_rate,
                                  threshold=threshold, method="exact", composition=composition)
    return TrieParams(levels=int(levels), max_keys_per_user=int(max_keys_per_user), cells=cells)


calibrate_trie.cache_info = _calibrate_trie_cached.cache_info
calibrate_trie.cache_clear = _calibrate_trie_cached.cache_clear


def fewest_levels(schedules=SCHEDULES):
    """The schedule :func:`choose_schedule` returns, without calibrating anything: the
    first candidate with the fewest levels (the module docstring proves its release point
    is the lowest). The plan uses it; the calibration then follows in the release stage."""
    return min((tuple(s) for s in schedules), key=len)


def choose_schedule(epsilon, delta_target, max_keys_per_user, *, sampling_rate=None,
                    threshold=None, schedules=SCHEDULES, exhaustive=False):
    """(schedule, {schedule: release point}): the candidate with the lowest last-level
    release point tau / p, ties to fewer levels (then the earlier candidate). Public
    parameters only.

    Not ``exhaustive``: the candidate with the fewest levels, the only one calibrated
    (the module docstring proves the others' points are not lower); if it cannot be
    calibrated, no candidate can (CalibrationInfeasible). ``exhaustive``: every candidate
    calibrated (point inf where it cannot be), the lowest taken."""
    ordered = sorted((tuple(s) for s in schedules), key=len)
    if not exhaustive:
        best = fewest_levels(ordered)
        point = calibrate_trie(epsilon, delta_target, len(best), max_keys_per_user,
                               sampling_rate=sampling_rate, threshold=threshold).release_point
        return best, {best: point}
    points, first_error = {}, None
    for schedule in ordered:
        try:
            points[schedule] = calibrate_trie(
                epsilon, delta_target, len(schedule), max_keys_per_user,
                sampling_rate=sampling_rate, threshold=threshold).release_point
        except ValueError as exc:
            points[schedule] = math.inf
            first_error = first_error or exc
    best = min(points, key=lambda s: (points[s], len(s)))
    if math.isinf(points[best]):
        raise first_error
    return best, points

"""``mechanism.kind: heavy_hitters`` -- TrieHH++ top keys by distinct users (paper 003 Sec. 4.1).

One string key column. Each user is bounded to at most C = max_keys_per_user distinct
keys (``PerUserBound``), so a key's count is its number of distinct users. Level i of the
trie releases a sample-and-threshold histogram of the length-``prefix_lengths[i]``
prefixes (characters, i.e. Unicode code points, not bytes; ``null`` = the whole key) in
which a prefix's count is its number of distinct users, each level with fresh Poisson
sampling; a prefix survives only if its parent prefix survived one level up (the TrieHH
trie constraint, post-processing). The released keys are the last level's survivors, the
``top_k`` of them by estimate.

Output columns: ``count`` (float64): the sampled count at the whole-key level divided by
the sampling rate, v / p -- an unbiased estimate of the key's number of distinct users
after bounding, biased up near the release point tau / p because only v >= tau is
released; ``rank`` (int64): 1 for the largest ``count`` (ties by key).

Privacy (``accounting.sample_threshold.trie``, which has the argument): a user moves at
most C cells per level by one, so the L levels are C L one-cell sample-and-threshold
mechanisms composed non-adaptively; one (sampling_rate, threshold) for every level meets
the whole (epsilon, delta) by the privacy-loss-distribution bound over C L cells. One
plan stage (``release``). Without ``prefix_lengths`` the plan picks the schedule
(``accounting.sample_threshold.trie.choose_schedule``: the lowest last-level release
point, which is the fewest levels -- [null], paper 003 Sec. 4.1's remark); an explicit
``prefix_lengths`` is used as given.
"""
import dataclasses
import math

import pyarrow as pa

from thresher.accounting import sample_threshold
from thresher.accounting.sample_threshold import trie
from thresher.accounting.sample_threshold.calibration import recheck
from thresher.pipelines.common import limits
from thresher.pipelines.common.calibration_cache import same
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.kinds import _levels
from thresher.pipelines.kinds.base import StagesKind, whole_user_limit
from thresher.pipelines.common import calibration_cache, declare
from thresher.pipelines.common.fields import optional_float
from thresher.pipelines.kinds.sample_and_threshold import calibrated_fields

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "heavy_hitters"

DEFAULT_TOP_K = 20
METHODS = ("adaptive", "trie")

FIELDS = {
    "top_k": declare.integer(low=1, high=10**6, default=DEFAULT_TOP_K, description=(
        f"how many keys to release at most, by decreasing estimate (integer >= 1, default "
        f"{DEFAULT_TOP_K})")),
    "prefix_lengths": declare.array(
        declare.one_of(declare.integer(low=1, high=10**4), {"type": "null"}),
        min_items=1, max_items=64, description=(
            "increasing prefix lengths in characters, null (the whole key) last; [null] = "
            "one level. Default: chosen by the plan among [null], [4, null], [2, 4, null] "
            "as the one with the lowest release point of the last level, from epsilon, "
            "delta and max_keys_per_user only -- the fewest levels, [null], since every "
            "level adds max_keys_per_user cells to a user's composition "
            "(docs/heavy_hitters_and_quantiles.md)")),
    "sampling_rate": _levels.SAMPLING_RATE,
    "threshold": _levels.THRESHOLD,
    "method": declare.choice(METHODS, description=(
        "adaptive (release whole keys with the adaptive selection and its noisy counts, then "
        "keep the top_k by noisy count) or trie (TrieHH++ over prefix levels); default: "
        "adaptive wherever it can be calibrated (max_keys_per_user <= 2048), else trie: "
        "adaptive's recall@top_k was higher at every bound measured, also where the trie's "
        "release point is lower (docs/heavy_hitters_and_quantiles.md)")),
}
OUTPUT_COLUMNS = {"count": pa.float64(), "rank": pa.int64()}
METHOD_RULE = ("adaptive wherever it can be calibrated at (epsilon, delta, max_keys_per_user), "
               "else trie; both release points are recorded (adaptive's recall at top_k was "
               "the higher at every bound measured, also where the trie's point is lower)")


@dataclasses.dataclass(frozen=True)
class HeavyHittersParams:
    """The parsed section (:func:`parse`; ``prefix_lengths`` and ``method`` filled by
    :func:`check_spec` where the spec leaves them to the plan) as its readers outside this
    module see it. The plan's notes on its choices (``schedule_choice``, ``method_choice``,
    ``prefix_lengths_note``) stay in the dict, for the report."""
    top_k: int = DEFAULT_TOP_K
    prefix_lengths: tuple[int | None, ...] | None = None   # None last: the whole key
    sampling_rate: float | None = None      # p, every level: given, else calibrated
    threshold: int | None = None            # tau, every level: given, else calibrated
    method: str | None = None               # one of METHODS; None: chosen by check_spec


def parse(section):
    top_k = int(section.get("top_k", DEFAULT_TOP_K))
    lengths = section.get("prefix_lengths")
    if lengths is None:  # the plan chooses the schedule (check_spec)
        return {"top_k": top_k, "prefix_lengths": None,
                "sampling_rate": optional_float(section, "sampling_rate"),
                "threshold": _levels.optional_threshold(section),
                "method": _method(section)}
    parsed = [None if n is None else int(n) for n in lengths]
    finite = [n for n in parsed if n is not None]
    note = {}
    if parsed and parsed[-1] is not None:
        parsed.append(None)  # the released keys are whole keys: the last level is the key
        # said in the plan and the report (issue 36: [2, 4] ran [2, 4, None] silently)
        note = {"prefix_lengths_note": WHOLE_KEY_ADDED.format(
            given=finite, levels=len(parsed),
            run="[" + ", ".join([*map(str, finite), "null"]) + "]")}
    # the level count is checked after the whole-key level is added: 64 finite lengths
    # are 65 levels
    if finite != sorted(set(finite)) or parsed.count(None) > 1 \
            or (None in parsed and parsed[-1] is not None) or len(parsed) > 64:
        raise SpecError("mechanism.prefix_lengths", f"must increase strictly, with null (the "
                        f"whole key) only last, at most 64 levels including the whole-key "
                        f"level (so at most 63 finite lengths); got {lengths!r}")
    rate = optional_float(section, "sampling_rate")
    return {"top_k": top_k, "prefix_lengths": parsed, "sampling_rate": rate,
            "threshold": _levels.optional_threshold(section), "method": _method(section),
            **note}


WHOLE_KEY_ADDED = ("mechanism.prefix_lengths {given} does not end with null (the whole key): "
                   "a release publishes whole keys, so the whole-key level was added last and "
                   "the trie runs {levels} levels, {run} (each level adds max_keys_per_user "
                   "cells to a user's composition)")


def _method(section):
    method = section.get("method")
    trie_only = [f for f in ("prefix_lengths", "sampling_rate", "threshold") if f in section]
    if method == "adaptive" and trie_only:
        raise SpecError(f"mechanism.{trie_only[0]}", "is for method: trie")
    if method is None and trie_only:
        method = "trie"     # trie parameters given: the spec asks for the trie
    return method


SCHEDULE_RULE = ("the candidate prefix schedule with the lowest release point of its last "
                 "level, from epsilon, delta and max_keys_per_user only: the fewest levels, "
                 "because one (sampling_rate, threshold) serves every level and each level "
                 "adds max_keys_per_user cells to a user's composition (a schedule with more "
                 "levels cannot reach a lower release point)")


def choose_schedule(mechanism):
    """Fill ``prefix_lengths`` (and ``schedule_choice``) when the spec gave none: the
    candidate with the lowest last-level release point, which is the one with the fewest
    levels (accounting.sample_threshold.trie proves it), so nothing is calibrated here;
    the calibration (and the point, added to ``schedule_choice``) is the plan's."""
    if mechanism.get("prefix_lengths") is not None:
        return
    best = sample_threshold.fewest_levels(sample_threshold.SCHEDULES)
    mechanism["prefix_lengths"] = list(best)
    mechanism["schedule_choice"] = {
        "chosen": list(best), "candidates": [list(s) for s in sample_threshold.SCHEDULES],
        "rule": SCHEDULE_RULE}


def release_points(epsilon, delta, max_keys_per_user, prefix_levels):
    """The users a key needs to be released half of the time when each holds C keys,
    for each method, from public parameters only: trie, the last level's tau / p of one
    (sampling_rate, threshold) meeting (epsilon, delta) over the user's C x levels cells
    (accounting.sample_threshold.trie); adaptive, the smallest round threshold over the
    grid weight of a user with C keys (Gopi et al. 2020 weights floor(S / sqrt(C))), inf
    above the adaptive kind's planning limit (limits.WEIGHTED_GAUSSIAN_MAX_KEYS)."""
    from thresher.accounting import adaptive as ad  # heavy: start-up of thresher validate
    from thresher.accounting import weighted_gaussian as wg  # heavy: start-up of thresher validate
    out = {}
    # the CLI reads the trie's calibration back from its cache (checked forward first)
    trie_point = calibration_cache.cached("heavy_hitters.trie_release_point",
                                          _trie_release_point, _verify_trie_release_point)
    try:
        out["trie"] = trie_point(epsilon, delta, prefix_levels, max_keys_per_user)["release_point"]
    except ValueError:
        out["trie"] = float("inf")
    if max_keys_per_user > limits.WEIGHTED_GAUSSIAN_MAX_KEYS:
        # beyond the adaptive kind's planning limit its calibration runs for minutes (C =
        # 1e5 at epsilon 100: > 90 s); the method is then out of the running
        out["adaptive"] = float("inf")
        return out
    try:
        p = ad.calibrate(epsilon, delta, max_keys_per_user,
                         fractions=ad.DEFAULT_ROUND_FRACTIONS[ad.DEFAULT_ROUNDS],
                         count_fraction=ad.DEFAULT_COUNT_FRACTION,
                         count_keys_per_user=ad.DEFAULT_COUNT_KEYS_PER_USER)
        q = int(wg.grid_weight(int(max_keys_per_user), p.scale))
        out["adaptive"] = min(r.threshold_grid for r in p.rounds) / q
    except ValueError:
        out["adaptive"] = float("inf")
    return out


def _trie_release_point(epsilon, delta, levels, max_keys_per_user):
    """The trie's calibration at free (sampling_rate, threshold) over C x levels cells
    (accounting.sample_threshold.calibrate_trie), as plain values the cache can hold."""
    trie = sample_threshold.calibrate_trie(epsilon, delta, levels, max_keys_per_user)
    return {"sampling_rate": trie.sampling_rate, "threshold": trie.threshold,
            "composition": trie.composition, "release_point": trie.release_point}


def _verify_trie_release_point(value, epsilon, delta, levels, max_keys_per_user):
    """Forward check of a cached :func:`_trie_release_point`: its (sampling_rate,
    threshold) meets (epsilon, delta) over the C x levels cells by the delta recomputed
    here (:func:`_trie_cells`), and the point is its tau / p."""
    if type(value) is not dict or set(value) != {"sampling_rate", "threshold", "composition",
                                                 "release_point"}:
        return False
    cells = _trie_cells(epsilon, delta, levels, max_keys_per_user, value["sampling_rate"],
                        value["threshold"], value["composition"], None, None)
    return cells is not None and value["release_point"] == cells.release_point


def _trie_cells(epsilon, delta, levels, max_keys_per_user, p, tau, composition, rate,
                threshold):
    """The TrieParams of a (p, tau) found earlier, with the delta over the user's n = C L
    cells recomputed as accounting.sample_threshold.calibrate_trie computes it (PLD up to
    trie.PLD_MAX_CELLS cells, basic beyond), or None when it misses the budget or does
    not match the spec's fixed ``rate`` / ``threshold``."""
    n = trie.cells_per_user(levels, max_keys_per_user)
    if composition != ("pld" if n <= trie.PLD_MAX_CELLS else "basic") \
            or (rate is not None and p != float(rate)) \
            or (threshold is not None and tau != threshold):
        return None
    cells = recheck(epsilon, delta, n, p, tau, method="exact", composition=composition,
                    calibrated=calibrated_fields(rate, threshold))
    if cells is None:
        return None
    return sample_threshold.TrieParams(levels=int(levels),
                                       max_keys_per_user=int(max_keys_per_user), cells=cells)


def verify_calibration(params, mech, *, epsilon, delta, max_keys_per_user, model):
    """Forward check of a cached calibration (``pipelines.common.calibration_cache``), method trie:
    True only if the delta of its (sampling_rate, threshold) over the user's C x L cells,
    recomputed here (:func:`_trie_cells`: one pld.user_delta, ~20 ms at 48 cells), meets
    the budget, the spec's fixed sampling_rate / threshold are the cached ones, and the
    whole report recomputed from them (:func:`_trie_report`) is the cached one. Method
    adaptive has no check here: it is never cached (computed every time)."""
    if mech.get("method") == "adaptive" or type(params) is not dict \
            or params.get("method") != "trie" or mech.get("prefix_lengths") is None:
        return False
    levels = len(mech["prefix_lengths"])
    again = _trie_cells(epsilon, delta, levels, max_keys_per_user, params.get("sampling_rate"),
                        params.get("threshold"), params.get("composition"),
                        mech.get("sampling_rate"), mech.get("threshold"))
    if again is None:
        return False
    return same(_trie_report(mech, again, epsilon, delta, levels, max_keys_per_user), params)


def _adaptive_mechanism():
    from thresher.accounting import adaptive as ad  # heavy: start-up of thresher validate
    return {"kind": "adaptive", "rounds": ad.DEFAULT_ROUNDS,
            "round_fractions": list(ad.DEFAULT_ROUND_FRACTIONS[ad.DEFAULT_ROUNDS]),
            "count_fraction": ad.DEFAULT_COUNT_FRACTION,
            "count_keys_per_user": ad.DEFAULT_COUNT_KEYS_PER_USER}


def check_spec(mechanism, input_spec, bounding, privacy):
    _levels.refuse_auto_bound(bounding, NAME)
    if len(input_spec.keys) != 1:
        raise SpecError("input.keys", f"heavy_hitters needs exactly one (string) key column, "
                        f"got {list(input_spec.keys)}")
    if input_spec.keys[0] == "rank":
        raise SpecError("input.keys[0]", "'rank' is an output column of heavy_hitters; rename the column")
    if mechanism.get("method") != "adaptive":
        choose_schedule(mechanism)
    if mechanism.get("method") is None and not limits.release_fits(
            HeavyHitters.MAX_KEYS, level_structure(mechanism), privacy.epsilon, privacy.delta,
            bounding.max_keys_per_user):
        # beyond the planning limits no method is chosen (that would calibrate at the
        # refused bound / table length, for minutes): the plan's limits.check_release
        # refuses the spec naming the field
        return
    if mechanism.get("method") is None:
        # The default from public parameters only: adaptive wherever it calibrates. A lower
        # release point alone does not make the better top-k: the trie ranks by v/p, whose
        # spread near the k-th count exceeds adaptive's noise, and on the identifier corpus
        # adaptive's recall@20 was higher at C = 4, 16 and 64, where the trie's point is
        # the lower at 16 and 64 (docs/heavy_hitters_and_quantiles.md, "Default method").
        points = release_points(privacy.epsilon, privacy.delta, bounding.max_keys_per_user,
                                len(mechanism["prefix_lengths"]))
        mechanism["method"] = "adaptive" if math.isfinite(points["adaptive"]) else "trie"
        mechanism["method_choice"] = {
            "release_points": points, "chosen": mechanism["method"],
            "rule": METHOD_RULE}


def stage_names(mechanism):
    """One stage: adaptive's rounds and count compose by f-DP inside it, the trie's levels
    by the privacy-loss-distribution bound over a user's C x L cells."""
    return ["release"]


def level_structure(mechanism):
    """(levels, contributions per level per unit of max_keys_per_user): one histogram per
    prefix length, one contribution per kept key in each (pipelines.common.limits reads it)."""
    if mechanism.get("method") == "adaptive" or mechanism.get("prefix_lengths") is None:
        return 1, 1
    return len(mechanism["prefix_lengths"]), 1


FEWER_THAN_TOP_K = ("only keys that pass the selection are released and ranked: fewer than "
                    "top_k come back when fewer keys reach the release point (about "
                    "{point:,.0f} distinct users for a key whose users hold max_keys_per_user "
                    "keys each, fewer users when they hold fewer keys)")


def _calibrate_adaptive(mech, epsilon, delta, max_keys_per_user, model):
    from thresher.accounting import weighted_gaussian as wg  # heavy: start-up of thresher validate
    from thresher.pipelines.kinds import adaptive  # heavy: start-up of thresher validate
    params = adaptive.calibrate(_adaptive_mechanism(), epsilon=epsilon, delta=delta,
                                max_keys_per_user=max_keys_per_user, model=model)
    q = int(wg.grid_weight(int(max_keys_per_user), params["scale"]))
    point = min(r["threshold_grid"] for r in params["rounds"]) / q
    out = {**params, "kind": NAME, "method": "adaptive", "top_k": mech["top_k"],
           "release_point": point,
           "fewer_than_top_k": FEWER_THAN_TOP_K.format(point=point),
           "count": "the adaptive release's noisy distinct-user count (discrete Gaussian, "
                    "count_sigma); keys ranked by it, ties by key",
           "accounting": "heavy hitters by whole-key selection: " + params["accounting"]
                         + "; ranking the released keys by their noisy counts and keeping "
                           "top_k is post-processing"}
    if mech.get("method_choice"):
        out["method_choice"] = mech["method_choice"]
    return out


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if mech.get("method") == "adaptive":
        return _calibrate_adaptive(mech, epsilon, delta, max_keys_per_user, model)
    return _calibrate_trie(mech, epsilon=epsilon, delta=delta,
                           max_keys_per_user=max_keys_per_user, model=model)


def _calibrate_trie(mech, *, epsilon, delta, max_keys_per_user, model):
    levels = len(mech["prefix_lengths"])
    try:
        params = sample_threshold.calibrate_trie(
            epsilon, delta, levels, max_keys_per_user, sampling_rate=mech.get("sampling_rate"),
            threshold=mech.get("threshold"))
    except ValueError as exc:
        raise CalibrationError(f"{_levels.fixed_fields(mech)}heavy_hitters (TrieHH++) release at epsilon={epsilon:g}, "
                               f"delta={delta:g}, max_keys_per_user={max_keys_per_user} over "
                               f"{levels} level(s): {exc}") from None
    return _trie_report(mech, params, epsilon, delta, levels, max_keys_per_user)


def _trie_report(mech, params, epsilon, delta, levels, max_keys_per_user):
    """The plan's parameters dict of a TrieParams."""
    extra = {"method_choice": mech["method_choice"]} if mech.get("method_choice") else {}
    if mech.get("schedule_choice"):
        extra["schedule_choice"] = {**mech["schedule_choice"],
                                    "release_point": params.release_point}
    if mech.get("prefix_lengths_note"):
        extra["prefix_lengths_note"] = mech["prefix_lengths_note"]
    return {"kind": NAME, "method": "trie", "top_k": mech["top_k"],
            "prefix_lengths": list(mech["prefix_lengths"]), "levels": levels,
            "sampling_rate": params.sampling_rate, "threshold": params.threshold,
            "release_point": params.release_point,
            "cells_per_user": params.cells_per_user, "composition": params.composition,
            "delta_achieved": params.delta_spent,
            "calibrated": list(params.cells.calibrated),
            "group_privacy_split": _split_point(mech, epsilon, delta, levels, max_keys_per_user),
            **extra,
            "fewer_than_top_k": FEWER_THAN_TOP_K.format(point=params.release_point).replace(
                "pass the selection", "pass every prefix level"),
            "count": "sampled count / sampling_rate at the whole-key level: distinct users "
                     "after bounding, unbiased above the release point",
            "accounting": _TRIE_ACCOUNTING.format(n=params.cells_per_user, c=max_keys_per_user,
                                                  levels=levels,
                                                  how=_HOW[params.composition])}


_HOW = {"pld": "a privacy-loss distribution dominating every cell count (pessimistic grid, "
               "docs/sample_and_threshold.md)",
        "basic": "basic composition (the cells' exact deltas at epsilon / cells; the smaller "
                 "bound where it is lower, or above 64 cells where the PLD search is not run)"}
_TRIE_ACCOUNTING = (
    "TrieHH++ (paper 003 Sec. 4.1): every level released over all prefixes, a prefix cell "
    "counting distinct users, fresh Poisson sampling per (level, cell); a user moves at most "
    "{c} cells per level by one, so the {levels} level(s) are at most {n} one-cell "
    "sample-and-threshold mechanisms (exact laws of thresholded Bin(k, p) vs Bin(k-1, p)) "
    "composed non-adaptively by {how}; the trie constraint, ranking and top_k are "
    "post-processing (accounting/sample_threshold/trie.py)")


def _split_point(mech, epsilon, delta, levels, max_keys_per_user):
    """What the earlier accounting (each level epsilon / L, delta / L; group privacy over C
    within a level) would need, for comparison: its release point (None if infeasible)."""
    try:
        lp = sample_threshold.calibrate_levels(epsilon, delta, levels, max_keys_per_user,
                                               sampling_rate=mech.get("sampling_rate"),
                                               threshold=mech.get("threshold"))
    except ValueError:
        return None
    return {"sampling_rate": lp.sampling_rate, "threshold": lp.threshold,
            "release_point": lp.threshold / lp.sampling_rate}


def check_key_types(key_types):
    """Refuse, from the input's schema before any row is read (``validate``, ``plan`` and
    ``run``: ``pipelines.planning.plan.make_plan``), a key column that is not text (issue 36 D17:
    an int64 key passed validate and failed once the pipeline ran). ``key_types``: the
    key columns' types as the reader gives them (CSV and JSONL keys are text)."""
    for i, (key, t) in enumerate(key_types.items()):
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SpecError(f"input.keys[{i}]", f"heavy_hitters needs a string key column "
                            f"(its prefixes are characters); {key!r} is {t} in the input: "
                            f"store it as text")


def stage_budget(budget, mechanism):
    """One plan stage, ``release``, with the whole budget (:func:`stage_names`)."""
    return _levels.spend_levels(budget, stage_names(mechanism))


def _top_k_counted(tables, key, top_k):
    """The released keys with noisy counts -> the top_k by count (ties by key), ranked."""
    tables = [t for t in tables if t.num_rows]
    if not tables:
        return
    table = pa.concat_tables(tables, promote_options="permissive")
    order = sorted(zip(table.column("count").to_pylist(), table.column(key).to_pylist()),
                   key=lambda ck: (-ck[0], ck[1]))[:top_k]
    yield pa.table({key: pa.array([k for _, k in order], table.schema.field(key).type),
                    "count": pa.array([float(c) for c, _ in order], pa.float64()),
                    "rank": pa.array(range(1, len(order) + 1), pa.int64())})


def _adaptive_stages(records, plan, num_shards, rng_factory, spill_dir=None):
    import apache_beam as beam  # heavy: apache_beam
    from thresher.pipelines.kinds._trie_release import _string_keys  # heavy: apache_beam
    from thresher.pipelines.kinds import adaptive  # heavy: start-up of thresher validate
    from thresher.transforms.bounding.user_shards import ShardByUser  # heavy: apache_beam
    spec = plan.spec
    keys = list(spec.input.keys)
    bound = spec.bounding.max_keys_per_user
    from thresher.transforms.bounding.prereduce_stages import distinct_pairs_for_rounds  # heavy: apache_beam
    records = records | "StringKeys" >> beam.Map(_string_keys, keys[0])
    # issue 43: a user's repeated keys travel once per table (same bytes); its distinct
    # keys all meet in one place, so the whole-user limit stays
    records, reduced = distinct_pairs_for_rounds(records, keys, rng_factory)
    # issue 43: each round concatenates the shuffled pieces itself (spilled to disk
    # when spill_dir is given): the whole users are never held between the rounds
    from thresher.transforms.selection.adaptive_rounds import ShardedUsers  # heavy: apache_beam
    shard = ShardByUser(num_shards, key_columns=keys, spill_dir=spill_dir,
                        **({"coalesce_rows": 1} if reduced else {}), **whole_user_limit(plan))
    users = ShardedUsers(records | "ShardByUser" >> beam.ptransform_fn(shard.grouped)(), shard)
    released = adaptive.release_users(users, plan.params_by_bound[bound], bound, keys,
                                      num_shards, _adaptive_mechanism(), rng_factory=rng_factory,
                                      spill_dir=spill_dir)
    return (released
            | "GatherKeys" >> beam.combiners.ToList()
            | "TopK" >> beam.FlatMap(_top_k_counted, keys[0], spec.mechanism["top_k"]))


def release_stages(records, plan, num_shards, rng_factory=None, spill_dir=None):
    """Prepared records -> whole users -> at most C distinct keys per user (the kept
    (user, key) rows) -> per level, distinct users per prefix -> TrieHH++ -> top_k.
    Returns PCollection[Table(key, count, rank)]."""
    from thresher.pipelines.kinds._trie_release import HeavyHittersRelease  # heavy: apache_beam
    from thresher.transforms.bounding.per_user_bound import PerUserBound  # heavy: apache_beam
    # heavy: apache_beam
    from thresher.transforms.bounding.user_shards import USER_COLUMN, ShardByUser
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    spec = plan.spec
    keys = list(spec.input.keys)
    bound = spec.bounding.max_keys_per_user
    mech = spec.mechanism
    if mech.get("method") == "adaptive":
        return _adaptive_stages(records, plan, num_shards, rng_factory, spill_dir)
    # issue 43: a user's rows beyond what PerUserBound can keep go before the shuffle
    # (transforms/bounding/prereduce_stages.py: same bytes), so no user is refused
    from thresher.transforms.bounding.prereduce_stages import prereduced_for_bounds  # heavy: apache_beam
    records, reduced = prereduced_for_bounds(records, [(keys, bound, "PerUserBound", False)],
                                             rng_factory)
    shuffle = {"coalesce_rows": 1} if reduced else whole_user_limit(plan)
    return (records
            | "ShardByUser" >> ShardByUser(num_shards, **shuffle)
            | "PerUserBound" >> PerUserBound(
                keys, bound, rng_factory=child(rng_factory, "PerUserBound"), rows=True)                      # Table(__user, key)
            | "HeavyHitters" >> HeavyHittersRelease(
                keys[0], mech["prefix_lengths"], mech["top_k"], plan.params_by_bound[bound],
                num_shards=num_shards, rng_factory=child(rng_factory, "HeavyHitters"),
                user_column=USER_COLUMN))


class HeavyHitters(StagesKind):
    """TrieHH++ or adaptive top keys (module docstring)."""
    name = NAME
    NO_INTERVAL = ("no interval: the published keys are the top_k by their noisy count, a "
                   "selection on the released value itself, so a plain interval would "
                   "under-cover the winners; no selection-aware interval is derived yet")
    FIELDS, OUTPUT_COLUMNS = FIELDS, OUTPUT_COLUMNS
    parse = staticmethod(parse)
    check_spec = staticmethod(check_spec)
    check_key_types = staticmethod(check_key_types)
    level_structure = staticmethod(level_structure)
    calibrate = staticmethod(calibrate)
    verify_calibration = staticmethod(verify_calibration)

    PARAMS = HeavyHittersParams

    def check_limits(self, mechanism):
        limits.check_sampled_fields(self.name, self.params(mechanism))

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        if self.params(spec.mechanism).method == "adaptive":
            limits.check_adaptive_method(spec, max_keys_per_user, field, self.MAX_KEYS)
        limits.check_levels(spec, epsilon, delta, max_keys_per_user, field,
                            self.level_structure(spec.mechanism), self.MAX_KEYS)

    def stage_budget(self, budget, mechanism, *, public_domain=False):
        return stage_budget(budget, mechanism)

    TAKES_SPILL_DIR = True   # base.Kind.TAKES_SPILL_DIR

    def release_stages(self, records, plan, num_shards, rng_factory=None, notes_sink=None,
                       spill_dir=None):
        return release_stages(records, plan, num_shards, rng_factory, spill_dir)

    def privacy_record(self, mechanism, stages, max_keys_per_user):
        """``method: adaptive`` is the adaptive release (``accounting.zcdp.adaptive_record``);
        the trie's levels (sample-and-threshold, composed by a PLD inside one stage) are
        charged from the stage's (epsilon, delta)."""
        from thresher.accounting import zcdp  # heavy: start-up of thresher schema
        if mechanism.get("method") == "adaptive":
            return zcdp.adaptive_record(mechanism, stages, max_keys_per_user)
        return zcdp.stage_records(stages)

    def noise_words(self, report, key, unit):
        mech, c = report["mechanism"], report["bounding"]["max_keys_per_user"]
        how = ("whole keys selected by adaptive weighted Gaussian rounds, ranked by their "
               "noisy counts" if mech.get("method") == "adaptive" else
               f"TrieHH++ over prefix levels {mech.get('prefix_lengths')}")
        out = [f"heavy hitters: {how}; release point about {mech['release_point']:,.0f} "
               f"{unit} for a {key} whose users hold {c} keys each"]
        if mech.get("schedule_choice"):
            out.append(f"prefix levels chosen by the plan: {mech['schedule_choice']['rule']}")
        if mech.get("prefix_lengths_note"):
            out.append(mech["prefix_lengths_note"])
        got, top_k = report.get("released_keys"), mech.get("top_k")
        if got is not None and top_k is not None and got < top_k:
            out.append(f"{got:,} of top_k {top_k:,} came back: {mech['fewer_than_top_k']}")
        return out, unit


KIND = HeavyHitters()

"""``mechanism.kind: quantiles`` -- quantiles of a numeric column from sample-and-threshold
histograms (paper 003 Sec. 4.2), globally or per public key.

Bounding: each user contributes at most C = max_keys_per_user distinct (key, value)
pairs (``PerUserBound`` on the key columns plus ``column``; several records of one user
with the same key and value count once). The domain [low, high] is public and fixed
without looking at the data; values below ``low`` are clamped to the first bucket and
values >= ``high`` to the last, so they count as ``low`` / ``high`` (the released value
is then ``low`` or ``high``).

Methods (``method``, default ``hierarchical``):

- ``hierarchical``: a ``branching``-ary hierarchy of ``levels`` levels over [low, high)
  (branching**levels leaves, default 16**3 = 4096); level l is a sample-and-threshold
  histogram over (key, bucket) cells; every rank is answered from the same release by
  the greedy decomposition (``transforms.trees.quantiles.RangeAnswers``). One stage per level.
- ``binary_search``: ``rounds`` rounds; round r releases, for every (key, rank), the
  two-bucket histogram split at the midpoint of that search's interval and halves the
  interval towards the rank (paper 003 Lemma "single quantiles"); the answer is the
  final interval's midpoint (resolution (high - low) / 2**(rounds + 1)). Every value
  takes part in every rank's search, so a user has at most C * len(ranks) contributions
  per round. One stage per round.

Output: the key columns (if any), ``rank`` (the requested phi, float64), ``value``
(float64; null when nothing about that key was released -- every cell suppressed) and
``resolution`` (float64, null with the value): the resolution the value actually has
(issue 36 D9) -- hierarchical, the width of the bucket that locates it, coarser than the
leaf width when the deeper levels released nothing there; binary search, the half-width
of its final interval, wider when rounds released nothing; public cells, the leaf width.
The report's ``resolution`` is the finest the plan allows.
With keys, the keys are ``input.public_keys`` (every listed key gets one row per rank;
records with other keys are dropped before bounding), or, without public keys, the keys a
``select_keys`` stage releases: sample-and-threshold over the distinct users per key (each
user bounded to C keys for that stage), calibrated by ``accounting.sample_threshold.
calibrate`` with ``key_selection_share`` (default 0.5) of epsilon and delta; the levels
share the rest.

Privacy: the levels / rounds compose (paper 003 Lemma 4.1 / the quantile lemma); each
gets (epsilon / L, delta / L) and (sampling_rate, threshold) come from
``accounting.sample_threshold.calibrate_levels`` (exact per-contribution accounting,
group privacy over the user's contributions to one level).
"""
import dataclasses
import json
import math

import numpy as np
import pyarrow as pa

from thresher.accounting import sample_threshold
from thresher.pipelines.common import limits
from thresher.pipelines.kinds._words import number
from thresher.pipelines.errors import CalibrationError, InputError, SpecError
from thresher.pipelines.kinds import _levels
from thresher.pipelines.kinds.base import StagesKind, whole_user_limit
from thresher.pipelines.common import declare
from thresher.pipelines.common.fields import optional_float
from thresher.pipelines.kinds.sample_and_threshold import PLD_DEFAULT_MAX_KEYS
from thresher.pipelines.common.calibration_cache import same

# The kind's name (``mechanism.kind``): written once, here (its class and its calibrated
# parameters say it; a renamed copy of this module is another kind).
NAME = "quantiles"

METHODS = ("hierarchical", "binary_search")
SELECT_KEYS_STAGE = "select_keys"
DEFAULT_METHOD = "hierarchical"
DEFAULT_BRANCHING = 16
DEFAULT_LEVELS = 3
DEFAULT_ROUNDS = 12
MAX_RANKS = 1000
DEFAULT_KEY_SELECTION_SHARE = 0.5

FIELDS = {
    "column": declare.string(description="the numeric input column whose quantiles are "
                                         "released (required)"),
    "ranks": declare.array(declare.number(low=0, high=1, low_open=True, high_open=True),
                           min_items=1, max_items=MAX_RANKS, unique=True,
                           description="list of ranks phi in (0, 1), e.g. [0.1, 0.5, 0.9] "
                                       "(required)"),
    "domain": declare.array(declare.number(), min_items=2, max_items=2, description=(
        "[low, high]: the public value range; values outside are clamped (required)")),
    "method": declare.choice(METHODS, default=DEFAULT_METHOD,
                             description="hierarchical (default) or binary_search"),
    "branching": declare.integer(low=2, high=1024, default=DEFAULT_BRANCHING, description=(
        f"hierarchical: children per node, integer >= 2 (default {DEFAULT_BRANCHING})")),
    "levels": declare.integer(low=1, high=40, default=DEFAULT_LEVELS, description=(
        f"hierarchical: number of levels (default {DEFAULT_LEVELS})")),
    "rounds": declare.integer(low=1, high=60, default=DEFAULT_ROUNDS, description=(
        f"binary_search: number of bisection rounds (default {DEFAULT_ROUNDS})")),
    "key_selection_share": declare.number(
        low=0, high=1, low_open=True, high_open=True, description=(
            f"with input.keys and no input.public_keys: the share of epsilon and delta spent "
            f"finding the keys (default {DEFAULT_KEY_SELECTION_SHARE})")),
    "max_selected_keys": declare.integer(low=1, high=1 << 26, description=(
        "per-key hierarchical quantiles without input.public_keys: at most this many of the "
        "keys select_keys releases get quantiles, those with the largest released counts "
        "(default: 2**26 noisy cells / cells per key)")),
    "sampling_rate": declare.number(low=0, low_open=True, high=1, description=(
        "p in (0, 1], the same at every level/round (optional; calibrated if absent)")),
    "threshold": declare.integer(low=1, high=10**9, description=(
        "tau >= 1, the same at every level/round (optional; calibrated if absent)")),
}
REQUIRED = ("column", "ranks", "domain")
MAX_LEAVES = 2 ** 20
KEYS_OPTIONAL = True     # no input.keys: one global release
# resolution: the resolution each value actually has (issue 36 D9; the report's
# ``resolution`` is the finest the plan allows): transforms.trees.quantile_release.RESOLUTION_COLUMN
OUTPUT_COLUMNS = {"rank": pa.float64(), "value": pa.float64(), "resolution": pa.float64()}


@dataclasses.dataclass(frozen=True)
class QuantilesParams:
    """The parsed section (:func:`parse`, with ``public_cells`` set by :func:`check_spec`
    for per-key hierarchical quantiles) as its readers outside this module see it.
    ``branching`` and ``levels`` are set with method hierarchical only, ``rounds`` with
    binary_search only; the key selection's split (``key_selection``) stays in the dict."""
    column: str
    ranks: tuple[float, ...]
    domain: tuple[float, ...]               # (low, high)
    method: str = DEFAULT_METHOD            # one of METHODS
    sampling_rate: float | None = None      # p, every level/round: given, else calibrated
    threshold: int | None = None            # tau, every level/round: given, else calibrated
    # key_selection_share: check_spec moves it into the dict's key_selection (popping it),
    # so a section that went through check_spec reads None here
    key_selection_share: float | None = None
    max_selected_keys: int | None = None
    branching: int | None = None            # hierarchical
    levels: int | None = None               # hierarchical
    rounds: int | None = None               # binary_search
    public_cells: bool = False


def parse(section):
    column = section["column"]
    ranks = [float(r) for r in section["ranks"]]
    if len(set(ranks)) != len(ranks):      # 1 and 1.0: one rank
        raise SpecError("mechanism.ranks", f"lists a rank twice: {ranks}")
    low, high = (float(v) for v in section["domain"])
    if not low < high:
        raise SpecError("mechanism.domain", f"needs low < high, got [{low:g}, {high:g}]")
    method = section.get("method", DEFAULT_METHOD)
    out = {"column": column, "ranks": ranks, "domain": [low, high], "method": method,
           "sampling_rate": optional_float(section, "sampling_rate"),
           "threshold": _levels.optional_threshold(section)}
    if "key_selection_share" in section:
        out["key_selection_share"] = float(section["key_selection_share"])
    if "max_selected_keys" in section:
        out["max_selected_keys"] = int(section["max_selected_keys"])
    if method == "hierarchical":
        if "rounds" in section:
            raise SpecError("mechanism.rounds", "is for method: binary_search")
        branching = int(section.get("branching", DEFAULT_BRANCHING))
        levels = int(section.get("levels", DEFAULT_LEVELS))
        if branching ** levels > MAX_LEAVES:
            # the post-processing answers ranks over a dense array of the leaves, per
            # released key (transforms.trees.quantiles.RangeAnswers: ~0.2 s at 2**20, 3.4 s at 2**24)
            raise SpecError("mechanism.levels", f"branching**levels must be <= 2**20 leaves "
                            f"(the planning limit), got {branching}**{levels}")
        out.update(branching=branching, levels=levels)
    else:
        for name in ("branching", "levels"):
            if name in section:
                raise SpecError(f"mechanism.{name}", "is for method: hierarchical")
        out["rounds"] = int(section.get("rounds", DEFAULT_ROUNDS))
    _check_resolution(low, high, out)
    return out


# Per-key hierarchical quantiles over public keys release a noisy count for every (key,
# level, bucket) cell (transforms.trees.public_cells.zero_cells makes them all): the product is
# refused above this before anything is read.
MAX_PUBLIC_CELLS = 1 << 26


def cells_per_key(mechanism):
    """branching + branching^2 + ... + branching^levels: the noisy cells of one key."""
    branching, levels = int(mechanism["branching"]), int(mechanism["levels"])
    return sum(branching ** level for level in range(1, levels + 1))


def check_public_cells(mechanism, domain_size):
    """Refuse (SpecError naming the fields) a per-key hierarchical release whose public
    cells, keys x (branching + branching^2 + ... + branching^levels), exceed
    MAX_PUBLIC_CELLS."""
    if mechanism.get("method") != "hierarchical" or "levels" not in mechanism:
        return
    branching, levels = int(mechanism["branching"]), int(mechanism["levels"])
    per_key = cells_per_key(mechanism)
    if int(domain_size) * per_key > MAX_PUBLIC_CELLS:
        raise SpecError("mechanism.levels", f"{int(domain_size):,} public keys x {per_key:,} "
                        f"cells per key (branching {branching}, levels {levels}) is more than "
                        f"the planning limit of {MAX_PUBLIC_CELLS:,} noisy cells; use fewer "
                        f"levels, a smaller branching or fewer keys in input.public_keys")


def selected_keys_cap(mechanism, asked=None):
    """The public cap on the keys of a per-key hierarchical release over SELECTED keys.

    How many keys select_keys releases depends on the data, and every released key gets
    ``cells_per_key`` noisy cells (transforms.trees.public_cells.zero_cells makes them all), so
    without a cap the cells, memory and time of the levels stage have no bound fixed
    before reading. The cap is ``asked`` (``mechanism.max_selected_keys``) or
    MAX_PUBLIC_CELLS // cells per key; keys beyond it are dropped by post-processing of
    the private selection (the largest released counts are kept, ``_cap_selection``).
    SpecError (exit 2) when one key's cells alone exceed MAX_PUBLIC_CELLS, or when
    ``asked`` keys' cells would."""
    per_key = cells_per_key(mechanism)
    if per_key > MAX_PUBLIC_CELLS:
        raise SpecError("mechanism.levels", f"{per_key:,} cells per key (branching "
                        f"{mechanism['branching']}, levels {mechanism['levels']}) is more than "
                        f"the planning limit of {MAX_PUBLIC_CELLS:,} noisy cells; use fewer "
                        f"levels or a smaller branching")
    limit = MAX_PUBLIC_CELLS // per_key
    if asked is None:
        return limit
    if asked > limit:
        raise SpecError("mechanism.max_selected_keys", f"{asked:,} keys x {per_key:,} cells "
                        f"per key (branching {mechanism['branching']}, levels "
                        f"{mechanism['levels']}) is more than the planning limit of "
                        f"{MAX_PUBLIC_CELLS:,} noisy cells; at most {limit:,} keys at this "
                        f"branching and levels")
    return asked


def _check_resolution(low, high, out):
    """The domain's width and the released resolution must be finite positive floats: a
    domain such as [-1e308, 1e308] has width inf (it released inf and wrote a non-JSON
    "resolution": Infinity, issue 30 D5); one too narrow for its leaves rounds them to 0."""
    width = high - low
    if not (math.isfinite(low) and math.isfinite(high) and math.isfinite(width)):
        raise SpecError("mechanism.domain", f"[{low:g}, {high:g}] must be finite with a finite "
                        f"width high - low (at most ~1.8e308), got width {width:g}")
    cells = (out["branching"] ** out["levels"] if "levels" in out
             else 2 ** (out["rounds"] + 1))
    resolution = width / cells
    if not (resolution > 0 and math.isfinite(resolution)):
        raise SpecError("mechanism.domain", f"[{low:g}, {high:g}] split into {cells} cells "
                        f"gives a resolution of {resolution:g} (not a positive float64); use "
                        f"a wider domain or fewer levels/rounds")


def check_spec(mechanism, input_spec, bounding, privacy):
    _levels.refuse_auto_bound(bounding, NAME)
    column = mechanism["column"]
    share = mechanism.pop("key_selection_share", None)
    if input_spec.keys and input_spec.public_keys is None:
        # Keys found by a sample-and-threshold stage of their own (stage select_keys).
        share = DEFAULT_KEY_SELECTION_SHARE if share is None else share
        mechanism["key_selection"] = {"share": share, "epsilon": privacy.epsilon * share,
                                      "delta": privacy.delta * share}
    elif share is not None:
        raise SpecError("mechanism.key_selection_share", "is only for quantiles per key without "
                        "input.public_keys (the keys are then found by a thresholded stage)")
    if input_spec.keys and mechanism["method"] == "hierarchical":
        # The keys are public (listed, or released by select_keys), so every (key, bucket)
        # cell is public: noisy counts for all of them, no per-cell threshold
        # (transforms.trees.public_cells).
        mechanism["public_cells"] = True
        if mechanism.get("sampling_rate") is not None or mechanism.get("threshold") is not None:
            field = "sampling_rate" if mechanism.get("sampling_rate") is not None else "threshold"
            raise SpecError(f"mechanism.{field}", "does not apply to per-key hierarchical "
                            "quantiles: the cells of the public keys are released with "
                            "Gaussian noise and no threshold")
    cap = mechanism.pop("max_selected_keys", None)
    if mechanism.get("public_cells") and "key_selection" in mechanism:
        mechanism["key_selection"]["max_keys"] = selected_keys_cap(mechanism, cap)
    elif cap is not None:
        raise SpecError("mechanism.max_selected_keys", "is only for per-key hierarchical "
                        "quantiles without input.public_keys (the keys found by select_keys)")
    if column in input_spec.keys or column == input_spec.user:
        raise SpecError("mechanism.column", f"{column!r} must not be the user or a key column")
    if column.startswith("__"):
        raise SpecError("mechanism.column", f"{column!r}: names starting with __ are thresher's")
    for i, k in enumerate(input_spec.keys):
        if k in OUTPUT_COLUMNS:
            raise SpecError(f"input.keys[{i}]", f"{k!r} is an output column of quantiles; rename the column")
    if input_spec.sample is not None:
        raise SpecError("input.sample", "is for weighted_sampling, not quantiles")
    return dataclasses.replace(input_spec, quantile_column=column)


def read_spec(spec):
    """The input as read: the value column is read (and bounded) like a key column. Per-key
    quantiles over public cells never read the reader's hash of (keys, value) -- their
    stages hash the keys alone (``_public_cells_stages``) -- so the reader hashes the keys
    alone there (issue 43 round 7: the float value's text form was most of that hash)."""
    hashed = tuple(spec.input.keys) if spec.mechanism.get("public_cells") else None
    return dataclasses.replace(spec.input, keys=(*spec.input.keys, spec.mechanism["column"]),
                               quantile_column=None, hashed_keys=hashed)


def _steps(mechanism):
    return mechanism["levels"] if mechanism["method"] == "hierarchical" else mechanism["rounds"]


PUBLIC_CELLS_STAGE = "levels"


def level_structure(mechanism):
    """(levels, contributions of one user per level per key bound): the histograms the
    budget is split over and how many contributions each level takes per unit of
    max_keys_per_user (binary search: one per rank). Calibration and the planning limits
    (pipelines.common.limits) both read it."""
    if mechanism.get("public_cells"):
        return 1, 1      # one Gaussian stage; sample-and-threshold limits do not apply
    per_key = 1 if mechanism["method"] == "hierarchical" else len(mechanism["ranks"])
    return _steps(mechanism), per_key


def stage_names(mechanism):
    if mechanism.get("public_cells"):
        return [PUBLIC_CELLS_STAGE]
    what = "level" if mechanism["method"] == "hierarchical" else "round"
    return [f"{what}_{i}" for i in range(1, _steps(mechanism) + 1)]


def stage_budget(budget, mechanism):
    """One plan stage per level (hierarchical) or round (binary_search), after the
    ``select_keys`` stage when the keys are found from the data."""
    selection = mechanism.get("key_selection")
    if selection is not None:
        budget.spend(SELECT_KEYS_STAGE, selection["epsilon"], selection["delta"])
    return _levels.spend_levels(budget, stage_names(mechanism))


def _calibrate_public_cells(mech, epsilon, delta, max_keys_per_user, found=None):
    """Discrete Gaussian noise on every (key, level, bucket) cell of the public keys: one
    user shifts C L cells by 1 (one value in each of <= C keys, one bucket per level), so
    sigma is the smallest with exact composed_shift_delta(eps, sigma, C L) <= delta
    (``accounting.known_domain.gaussian_sigma``). Keys compose in parallel. ``found``: a
    sigma found earlier (a cached calibration, :func:`verify_calibration`), used instead
    of the search; its delta is recomputed and reported all the same."""
    from thresher.accounting import known_domain  # heavy: start-up of thresher schema
    # heavy: apache_beam
    from thresher.transforms.trees.public_cells import NULL_REASON, SUPPORT_Z, support_floor
    levels, branching = mech["levels"], mech["branching"]
    shifts = max_keys_per_user * levels
    try:
        sigma = found if found is not None else known_domain.gaussian_sigma(epsilon, delta, shifts)
    except ValueError as exc:
        raise CalibrationError(f"quantiles per key at epsilon={epsilon:g}, delta={delta:g}: "
                               f"{exc}") from None
    floor = support_floor(sigma, branching, levels)
    return {"noise": "discrete_gaussian", "sigma": sigma, "levels": levels,
            "unit_shifts": shifts, "stage": PUBLIC_CELLS_STAGE,
            "delta_achieved": known_domain.gaussian_delta(epsilon, sigma, shifts),
            "support_floor": floor,
            "null_values": NULL_REASON.format(floor=floor, z=SUPPORT_Z),
            "post_processing": "per key: least-squares consistent tree (Hay et al. 2010), "
                               "isotonic cumulative counts, linear interpolation inside the "
                               "leaf; values non-decreasing in rank",
            "bounding": "one value per (user, key), at most max_keys_per_user keys per user "
                        "(transforms.bounding.key_value_bound)"}


def _public_cells_plan(mech, epsilon, delta, max_keys_per_user, found=None):
    """The plan of a public-cells release; ``found``: (sigma, key selection's (sampling
    rate, threshold)) of a cached calibration, rechecked instead of searched for."""
    out = {"kind": NAME, "method": mech["method"], "column": mech["column"],
           "ranks": list(mech["ranks"]), "domain": list(mech["domain"]),
           "branching": mech["branching"], "leaves": mech["branching"] ** mech["levels"],
           "resolution": (mech["domain"][1] - mech["domain"][0]) / mech["branching"] ** mech["levels"]}
    out.update(_calibrate_public_cells(mech, epsilon, delta, max_keys_per_user,
                                       found and found[0]))
    _key_selection(out, mech, max_keys_per_user, found and found[1])
    out["accounting"] = ("per-key hierarchical histograms over the public cells of the "
                         "selected keys (paper 002 Alg. 1 on the cells, paper 003 Sec. 4.2 "
                         "hierarchy): discrete Gaussian noise, exact delta of C L composed "
                         "unit shifts (accounting.known_domain.gaussian_delta); keys in "
                         "parallel")
    return out


def calibrate(mech, *, epsilon, delta, max_keys_per_user, model):
    if mech.get("public_cells"):
        return _public_cells_plan(mech, epsilon, delta, max_keys_per_user)
    levels, per_key = level_structure(mech)
    per_step = max_keys_per_user * per_key
    params = _levels.calibrate(mech, epsilon=epsilon, delta=delta, levels=levels,
                               max_keys_per_user=per_step, what=f"quantiles ({mech['method']}) release")
    out = {"kind": NAME, "method": mech["method"], "column": mech["column"],
           "ranks": list(mech["ranks"]), "domain": list(mech["domain"])}
    if mech["method"] == "hierarchical":
        out.update(branching=mech["branching"], leaves=mech["branching"] ** mech["levels"],
                   resolution=(mech["domain"][1] - mech["domain"][0]) / mech["branching"] ** mech["levels"])
    else:
        out.update(rounds=mech["rounds"],
                   resolution=(mech["domain"][1] - mech["domain"][0]) / 2 ** (mech["rounds"] + 1))
    out.update(_levels.report_section(params))
    out["contributions_per_level"] = per_step
    _key_selection(out, mech, max_keys_per_user)
    out["accounting"] = (f"quantiles by {'a hierarchical histogram' if mech['method'] == 'hierarchical' else 'binary search'}"
                         f" (paper 003 Sec. 4.2); " + _levels.accounting("(user, value)"))
    return out


class _MissesBudget(Exception):
    """A cached calibration's parameters no longer meet the budget (recalibrate)."""


def verify_calibration(params, mech, *, epsilon, delta, max_keys_per_user, model):
    """Forward check of a cached calibration (``pipelines.common.calibration_cache``), public
    cells only: True only if the plan rebuilt from the cached sigma and key selection
    (sampling_rate, threshold) -- sigma's exact delta recomputed
    (``accounting.known_domain.gaussian_delta``) and within delta, the selection's
    rechecked (``accounting.sample_threshold.calibration.recheck``) -- is the cached plan,
    every field. Two delta evaluations instead of the searches (~5 s at 1e6 rows, issue 43)."""
    from thresher.accounting import known_domain  # heavy: start-up of thresher schema
    if not mech.get("public_cells") or type(params) is not dict or params.get("kind") != NAME:
        return False
    sigma = params.get("sigma")
    if type(sigma) is not float or not sigma > 0:
        return False
    shifts = max_keys_per_user * mech["levels"]
    if not known_domain.gaussian_delta(epsilon, sigma, shifts) <= delta:
        return False
    selection = None
    if mech.get("key_selection") is not None:
        cached = params.get("key_selection")
        if type(cached) is not dict:
            return False
        selection = (cached.get("sampling_rate"), cached.get("threshold"))
    try:
        again = _public_cells_plan(mech, epsilon, delta, max_keys_per_user, (sigma, selection))
    except (_MissesBudget, CalibrationError, ValueError, TypeError):
        return False
    return same(again, params)


def _key_selection(out, mech, max_keys_per_user, found=None):
    selection = mech.get("key_selection")
    if selection is not None:
        # as kind sample_and_threshold: a user's C keys composed by the PLD bound for
        # 2 <= C <= 64 (a lower release point at the same budget), basic otherwise
        composition = "pld" if 1 < max_keys_per_user <= PLD_DEFAULT_MAX_KEYS else "basic"
        try:
            if found is not None:     # a cached (p, tau): its delta recomputed, no search
                from thresher.accounting.sample_threshold.calibration import recheck  # heavy: scipy
                sel = recheck(selection["epsilon"], selection["delta"], max_keys_per_user,
                              *found, composition=composition,
                              calibrated=("sampling_rate", "threshold"))
                if sel is None:
                    raise _MissesBudget()
            else:
                sel = sample_threshold.calibrate(selection["epsilon"], selection["delta"],
                                                 max_keys_per_user, composition=composition)
        except ValueError as exc:
            raise CalibrationError(f"quantiles key selection at epsilon={selection['epsilon']:g}, "
                                   f"delta={selection['delta']:g}: {exc}") from None
        out["key_selection"] = {
            "stage": SELECT_KEYS_STAGE, "share": selection["share"],
            "sampling_rate": sel.sampling_rate, "threshold": sel.threshold,
            "release_point": sel.release_point, "composition": sel.composition,
            "per_key_epsilon": sel.per_key_epsilon, "per_key_delta": sel.per_key_delta_spent,
            "delta_achieved": sel.delta_spent,
            "what": "keys whose distinct users (each user in at most max_keys_per_user keys) "
                    "pass sample-and-threshold; the key set is published as the output's keys"}
        if "max_keys" in selection:
            out["key_selection"]["max_keys"] = selection["max_keys"]
            out["key_selection"]["max_keys_rule"] = (
                f"at most {selection['max_keys']:,} selected keys get quantiles (each has "
                f"{cells_per_key(mech):,} noisy cells; the planning limit is "
                f"{MAX_PUBLIC_CELLS:,}); beyond that, those with the largest released "
                f"sampled counts (ties: key order) -- post-processing of the selection")


def _numeric(table, column):
    # heavy: pyarrow.compute
    import pyarrow.compute as pc     # (here: importing the kind loads no compute module)
    col = table.column(column)
    if not (pa.types.is_integer(col.type) or pa.types.is_floating(col.type)):
        try:
            col = pc.cast(col, pa.float64())
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
            bad = next((v for v in col.to_pylist() if not _is_number(v)), None)
            raise InputError(f"mechanism.column: column {column!r} holds {bad!r}, not a number") from None
    values = col.cast(pa.float64())
    if not np.isfinite(values.to_numpy(zero_copy_only=False)).all():
        # +-inf: clamped like any out-of-domain value (NaN rows were dropped as null keys)
        values = pc.if_else(pc.is_finite(values), values,
                            pc.if_else(pc.greater(values, 0), pa.scalar(np.finfo(np.float64).max),
                                       pa.scalar(-np.finfo(np.float64).max)))
    return table.set_column(table.schema.get_field_index(column), column, values)


def _is_number(v):
    try:
        float(v)
        return True
    except (TypeError, ValueError):
        return False


def _key_list(plan):
    keys = list(plan.spec.input.keys)
    if not keys:
        return [()]
    domain = plan.domain.select(keys)
    return list(zip(*[domain.column(k).to_pylist() for k in keys]))


def _to_table(columns, keys):
    return pa.table({**{k: columns[k] for k in keys},
                     "rank": pa.array(columns["rank"], pa.float64()),
                     "value": pa.array(columns["value"], pa.float64()),
                     "resolution": pa.array(columns["resolution"], pa.float64())})


def _answer_hierarchy(released, keys, key_list, mech):
    from thresher.transforms.trees.quantile_release import hierarchy_quantiles  # heavy: apache_beam
    released = [t for t in released if t.num_rows]
    table = pa.concat_tables(released) if released else None
    lo, hi = mech["domain"]
    yield _to_table(hierarchy_quantiles(table, keys, key_list, mech["ranks"], lo=lo, hi=hi,
                                        branching=mech["branching"], levels=mech["levels"]), keys)


def _selected_keys(tables, keys):
    """The released key tuples of the select_keys stage, in a fixed order."""
    out = set()
    for table in tables:
        out.update(zip(*[table.column(k).to_pylist() for k in keys]))
    return sorted(out, key=repr)


def _rehash_keys(table, keys):
    from thresher.transforms.randomness.hashing import hash_columns  # heavy: pandas
    from thresher.transforms.bounding.user_shards import KEY_HASH_COLUMN  # heavy: apache_beam
    index = table.schema.get_field_index(KEY_HASH_COLUMN)
    return table.set_column(index, KEY_HASH_COLUMN,
                            pa.array(hash_columns(table, keys), type=pa.uint64()))


def _restrict_to(table, keys, selected):
    """The rows of ``table`` whose key tuple is one of ``selected`` (key tuples, as
    Python values), with array operations (``public_cells.key_positions``; before issue
    43 round 5 a Python loop over the rows: a count table holds one row per (key, value)).
    Keys compare as Python compares them: a float key -0.0 is 0.0 (``key_positions``
    compares floats bitwise, so both sides are normalised first)."""
    # heavy: apache_beam (public_cells builds Beam transforms)
    from thresher.transforms.trees.public_cells import key_positions
    if not keys:
        out = table
    else:
        floats = [j for j, k in enumerate(keys) if pa.types.is_floating(table.column(k).type)]
        if floats:
            table_for_match = table.select(list(keys))
            for j in floats:
                table_for_match = table_for_match.set_column(
                    j, keys[j], _positive_zero(table_for_match.column(j)))
            selected = [tuple(v + 0.0 if j in floats and v is not None else v
                              for j, v in enumerate(kt)) for kt in selected]
        else:
            table_for_match = table
        out = table.filter(pa.array(key_positions(table_for_match, list(keys), list(selected))
                                    >= 0))
    if out.num_rows:
        yield out


def _positive_zero(column):
    """A float column with -0.0 made 0.0 (x + 0.0), as Python's == sees them."""
    # heavy: pyarrow.compute (here: importing the kind loads no compute module)
    import pyarrow.compute as pc
    return pc.add(column, pa.scalar(0.0, column.type))


def release_stages(records, plan, num_shards, rng_factory=None, notes_sink=None, spill_dir=None):
    """Prepared records (key columns + value) -> [public keys only] -> whole users -> at
    most C distinct (key, value) pairs per user -> users per (key, value) -> the method's
    histograms -> Table(keys..., rank, value). Without public keys but with input.keys,
    the keys are those a sample-and-threshold stage (select_keys) releases from the
    distinct users per key, each user bounded to C keys separately for that stage."""
    import apache_beam as beam  # heavy: apache_beam
    from thresher.transforms.plumbing.aggregate import SumCountsPerKey  # heavy: apache_beam
    from thresher.transforms.bounding.per_user_bound import PerUserBound  # heavy: apache_beam
    # heavy: apache_beam
    from thresher.transforms.trees.quantile_release import BinarySearchQuantiles, KeyedHierarchy
    # heavy: apache_beam
    from thresher.transforms.selection.sample_and_threshold import SampleAndThreshold
    from thresher.transforms.bounding.user_shards import ShardByUser  # heavy: apache_beam
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    spec = plan.spec
    mech = spec.mechanism
    keys = list(spec.input.keys)
    column = mech["column"]
    bound = spec.bounding.max_keys_per_user
    params = plan.params_by_bound[bound]
    if plan.domain is not None:
        # heavy: apache_beam
        from thresher.transforms.selection.public_domain import RestrictToDomain
        records = records | "RestrictToDomain" >> RestrictToDomain(plan.domain, keys)
    # issue 43: a user's rows beyond what the bounding stages below can keep go before
    # the shuffle (transforms/bounding/prereduce_stages.py: same bytes), so no user is
    # refused for its number of rows
    from thresher.transforms.bounding.prereduce_stages import prereduced_for_bounds  # heavy: apache_beam
    public_cells = bool(params.get("public_cells") or mech.get("public_cells"))
    if public_cells:
        bounds = [(keys, bound, "BoundKeyValues", False, column)]
    else:
        bounds = [(keys + [column], bound, "PerUserBound", False)]
    if "key_selection" in params:
        bounds.append((keys, bound, "BoundKeys", True))
    # public cells: the pre-reduction hands on __key as the hash of the keys alone, which
    # its BoundKeys stage computes anyway and the select_keys branch reads (issue 43
    # round 7: no second hash of every row after the shuffle)
    rehashed = keys if public_cells and "key_selection" in params else None
    records, reduced = prereduced_for_bounds(records, bounds, rng_factory,
                                             key_hash_of=rehashed)
    shuffle = {"coalesce_rows": 1} if reduced else whole_user_limit(plan)
    # issue 43: with spill_dir the user shuffle's pieces travel as files, not in memory
    users = records | "ShardByUser" >> ShardByUser(num_shards, spill_dir=spill_dir, **shuffle)
    if public_cells:
        return _public_cells_stages(users, records, plan, params, num_shards, rng_factory,
                                    notes_sink, keys_hashed=reduced and rehashed is not None)
    counts = (users
              | "PerUserBound" >> PerUserBound(keys + [column], bound,
                                               rng_factory=child(rng_factory, "PerUserBound"))
              | "SumCountsPerValue" >> SumCountsPerKey(keys + [column], num_shards)  # Table(keys, value, count)
              | "Numeric" >> beam.Map(_numeric, column))
    if "key_selection" in params:
        selected = (users
                    | "HashKeysOnly" >> beam.Map(_rehash_keys, keys)  # __key was keys + value
                    | "BoundKeys" >> PerUserBound(keys, bound,
                                                  rng_factory=child(rng_factory, "BoundKeys"))
                    | "UsersPerKey" >> SumCountsPerKey(keys, num_shards)              # Table(keys, count)
                    | "SelectKeys" >> SampleAndThreshold(params["key_selection"],
                                                         child(rng_factory, "SelectKeys"))
                    | "GatherKeys" >> beam.combiners.ToList()
                    | "KeyList" >> beam.Map(_selected_keys, keys))                     # [key tuple]
        key_list = beam.pvalue.AsSingleton(selected)
        counts = counts | "OnlySelectedKeys" >> beam.FlatMap(_restrict_to, keys, key_list)
    else:
        selected = records.pipeline | "KeyList" >> beam.Create([_key_list(plan)])
        key_list = beam.pvalue.AsSingleton(selected)
    lo, hi = mech["domain"]
    if mech["method"] == "hierarchical":
        return (counts
                | "Hierarchy" >> KeyedHierarchy(keys, column, lo=lo, hi=hi, branching=mech["branching"],
                                                levels=mech["levels"], params=params,
                                                num_shards=num_shards,
                                                rng_factory=child(rng_factory, "Hierarchy"))
                | "GatherLevels" >> beam.combiners.ToList()
                | "Quantiles" >> beam.FlatMap(_answer_hierarchy, keys, key_list, mech))
    return (counts
            | "BinarySearch" >> BinarySearchQuantiles(keys, column, key_list=selected,
                                                      ranks=mech["ranks"], lo=lo, hi=hi,
                                                      rounds=mech["rounds"], params=params,
                                                      num_shards=num_shards,
                                                      rng_factory=child(rng_factory, "BinarySearch"))
            | "ToTable" >> beam.Map(_to_table, keys))


def _key_table(tables, keys):
    """The selected keys as one table (distinct, sorted): what the select_keys stage released."""
    tables = [t.select(list(keys)) for t in tables if t.num_rows]
    if not tables:
        return pa.table({k: pa.array([], pa.string()) for k in keys})
    table = pa.concat_tables(tables).group_by(list(keys), use_threads=False).aggregate([])
    return table.select(list(keys)).sort_by([(k, "ascending") for k in keys]).combine_chunks()


def _cap_selection(tables, keys, cap):
    """(key table, note): the keys select_keys released, at most ``cap`` of them -- those
    with the largest released sampled ``count``, ties broken by key order -- as one
    sorted table (:func:`_key_table`), and the note {selected_keys, kept_keys,
    dropped_keys} for the report. A function of the released rows only (post-processing
    of the private selection), computed exactly: integer counts and a total order."""
    released = [t.select([*keys, "count"]) for t in tables if t.num_rows]
    selected = sum(t.num_rows for t in released)     # select_keys releases a key once
    if selected > cap:
        table = pa.concat_tables(released).combine_chunks()
        order = table.sort_by([("count", "descending"), *[(k, "ascending") for k in keys]])
        tables = [order.slice(0, cap)]
    kept = _key_table(tables, keys)
    return kept, {"selected_keys": selected, "kept_keys": kept.num_rows,
                  "dropped_keys": selected - kept.num_rows}


def _table_of(selection):
    return selection[0]


def _note_of(selection):
    return json.dumps(selection[1], sort_keys=True)


NOTES_FILE = "quantiles_key_selection"
WRITES_NOTES = True      # release_stages(..., notes_sink=): the report goes through apply_notes


def apply_notes(report, note):
    """The report with the capped selection's figures (written by the pipeline to
    NOTES_FILE): how many keys select_keys released, how many got quantiles, how many
    were dropped by the public cap and why."""
    report = dict(report)
    mechanism = dict(report["mechanism"])
    selection = dict(mechanism.get("key_selection", {}))
    selection.update(note)
    if note.get("dropped_keys"):
        selection["dropped_why"] = (
            f"select_keys released {note['selected_keys']:,} keys, more than max_keys "
            f"({selection.get('max_keys', note['kept_keys']):,}): the {note['dropped_keys']:,} "
            f"with the smallest released counts got no quantiles (max_keys_rule)")
    mechanism["key_selection"] = selection
    report["mechanism"] = mechanism
    return report


def _public_cells_stages(users, records, plan, params, num_shards, rng_factory,
                         notes_sink=None, keys_hashed=False):
    """Per-key hierarchical quantiles over the public cells of public or selected keys
    (transforms.trees.public_cells): one value per (user, key), at most C keys per user; every
    (level, key, bucket) cell of every selected key gets discrete Gaussian noise, no
    threshold; per-key post-processing answers every rank. ``keys_hashed``: the users'
    ``__key`` is the hash of the key columns already (the pre-reduction's), so the
    select_keys branch does not hash them again."""
    import apache_beam as beam  # heavy: apache_beam
    from thresher.transforms.plumbing.aggregate import SumCountsPerKey  # heavy: apache_beam
    from thresher.transforms.bounding.per_user_bound import PerUserBound  # heavy: apache_beam
    # heavy: apache_beam
    from thresher.transforms.trees.public_cells import PublicCellQuantiles, key_tuples
    from thresher.transforms.trees.bounded_cells import BoundedCells  # heavy: apache_beam
    # heavy: apache_beam
    from thresher.transforms.selection.sample_and_threshold import SampleAndThreshold
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    spec = plan.spec
    mech = spec.mechanism
    keys = list(spec.input.keys)
    column = mech["column"]
    bound = spec.bounding.max_keys_per_user
    if "key_selection" in params:
        hashed = users if keys_hashed else users | "HashKeysOnly" >> beam.Map(_rehash_keys, keys)
        key_table = (hashed
                     | "BoundKeys" >> PerUserBound(keys, bound,
                                                   rng_factory=child(rng_factory, "BoundKeys"))
                     | "UsersPerKey" >> SumCountsPerKey(keys, num_shards)
                     | "SelectKeys" >> SampleAndThreshold(params["key_selection"],
                                                          child(rng_factory, "SelectKeys"))
                     | "GatherKeys" >> beam.combiners.ToList()
                     | "CapKeys" >> beam.Map(_cap_selection, keys,
                                             params["key_selection"]["max_keys"]))
        if notes_sink is not None:    # one JSON line for the report (apply_notes)
            notes_sink(key_table | "FormatNote" >> beam.Map(_note_of))
        key_table = key_table | "KeyTable" >> beam.Map(_table_of)
    else:
        key_table = records.pipeline | "KeyTable" >> beam.Create([plan.domain.select(keys)])
    key_list = beam.pvalue.AsSingleton(key_table | "KeyList" >> beam.Map(key_tuples, keys))
    lo, hi = mech["domain"]
    # issue 43 round 7: each user shard's bounded rows (the draws of BoundKeyValues, as
    # before) become the true counts of the selected keys' (level, key, bucket) cells
    # there, as cell indices into the key table (transforms.trees.bounded_cells); the
    # value-level counts, their shuffle and the cells' shuffle are gone, with the same
    # counts (every value still checked by _numeric, InputError as before)
    return (users
            | "BoundCells" >> BoundedCells(
                keys, column, bound, key_list, lo=lo, hi=hi, branching=mech["branching"],
                levels=mech["levels"], numeric=_numeric,
                rng_factory=child(rng_factory, "BoundKeyValues"))
            | "CellQuantiles" >> PublicCellQuantiles(
                keys, key_table, lo=lo, hi=hi, branching=mech["branching"],
                levels=mech["levels"], ranks=mech["ranks"], sigma=params["sigma"],
                floor=params["support_floor"],
                rng_factory=child(rng_factory, "NoisyCells")))


def value_lines(report, table, keys):
    """Words about a quantiles release's values, from its released rows (issue 36 D9: a
    release whose every value was null said "released 8 keys", and the report's
    ``resolution`` was taken for the values' own): how many values are null and why, and
    the resolution the values actually have (the ``resolution`` column) beside the finest
    the plan allows."""
    mech = report.get("mechanism", {})
    if "value" not in table.column_names:
        return []
    out = []
    rows, nulls = table.num_rows, table.column("value").null_count
    if nulls:
        if "null_values" in mech:
            why = mech["null_values"].partition("null: ")[2] or mech["null_values"]
        else:
            point = mech.get("release_point")
            where = ("every bucket of its first level" if mech.get("method") == "hierarchical"
                     else "both sides of every round of its search")
            why = (f"nothing about it was released: {where} fell below the threshold after "
                   f"sampling" + (f" (a bucket needs about {point:,.0f} users to be released "
                                  f"half the time)" if isinstance(point, (int, float)) else ""))
        empty = ""
        if keys:
            import pyarrow.compute as pc  # heavy: pyarrow.compute
            answered = table.group_by(keys, use_threads=False).aggregate([("value", "count")])
            total = answered.num_rows
            none = int(pc.sum(pc.equal(answered.column("value_count"), 0)).as_py() or 0)
            empty = f"; {none:,} of {total:,} keys have no value at all"
        out.append(f"null values: {nulls:,} of {rows:,}" + ("" if nulls < rows else " (every value)")
                   + f"{empty}: a value is null when {why}")
    if "resolution" in table.column_names:
        import pyarrow.compute as pc  # heavy: pyarrow.compute
        res = table.column("resolution")
        finest = mech.get("resolution")
        known = rows - res.null_count
        if known and isinstance(finest, (int, float)):
            low, high = pc.min(res).as_py(), pc.max(res).as_py()
            coarser = int(pc.sum(pc.greater(res, finest * (1 + 1e-9))).as_py() or 0)
            if coarser:
                out.append(f"resolution: {coarser:,} of {known:,} values are coarser than the "
                           f"plan's finest {number(finest)} (deeper levels or later rounds "
                           f"released nothing there): from {number(low)} to {number(high)}, "
                           f"each in the resolution column")
            else:
                out.append(f"resolution: every value to {number(finest)} (the plan's finest)")
    return out


class Quantiles(StagesKind):
    """Differentially private quantiles (module docstring)."""
    name = NAME
    VALUE_COLUMN = "value"
    OWN_PUBLIC_KEYS = True
    NULLABLE_COLUMNS = ("value", "resolution")   # null where every cell was suppressed
    FIGURES = ("quantile_curves",)               # the HTML report draws rank -> value
    NO_INTERVAL = ("no interval derived yet for quantile values (the noisy hierarchical "
                   "counts behind them are post-processed: consistency, isotonic, "
                   "interpolation)")
    FIELDS, OUTPUT_COLUMNS, REQUIRED, KEYS_OPTIONAL = FIELDS, OUTPUT_COLUMNS, REQUIRED, KEYS_OPTIONAL
    WRITES_NOTES, NOTES_FILE = WRITES_NOTES, NOTES_FILE
    TAKES_SPILL_DIR = True   # base.Kind.TAKES_SPILL_DIR: the user shuffle spills (issue 43)
    parse = staticmethod(parse)
    check_spec = staticmethod(check_spec)
    read_spec = staticmethod(read_spec)
    level_structure = staticmethod(level_structure)
    calibrate = staticmethod(calibrate)
    verify_calibration = staticmethod(verify_calibration)
    release_stages = staticmethod(release_stages)
    apply_notes = staticmethod(apply_notes)

    PARAMS = QuantilesParams

    def check_limits(self, mechanism):
        limits.check_sampled_fields(self.name, self.params(mechanism))

    def check_release_limits(self, spec, epsilon, delta, max_keys_per_user, field):
        limits.check_levels(spec, epsilon, delta, max_keys_per_user, field,
                            self.level_structure(spec.mechanism), self.MAX_KEYS)

    def stage_budget(self, budget, mechanism, *, public_domain=False):
        return stage_budget(budget, mechanism)

    def check_public_domain(self, mechanism, domain_size):
        return check_public_cells(mechanism, domain_size)

    def privacy_record(self, mechanism, stages, max_keys_per_user):
        """``accounting.zcdp.quantiles_record``: public cells by their Gaussian noise,
        every other stage from its (epsilon, delta)."""
        from thresher.accounting import zcdp  # heavy: start-up of thresher schema
        return zcdp.quantiles_record(mechanism, stages, max_keys_per_user)
    DESCRIBES_ROWS = True

    def bounded_data_words(self, held, key):
        return (f"quantiles are of the bounded data: {held}, so a {key}'s quantiles are of "
                f"the values of the users the bound kept for it, not of all its input values")

    def noise_words(self, report, key, unit):
        mech = report["mechanism"]
        if "support_floor" in mech:
            return [f"quantiles per {key}: every bucket of every selected {key} gets discrete "
                    f"Gaussian noise (sigma {number(mech['sigma'])}), no threshold; values are "
                    f"monotone in rank; a {key} gets null values only when "
                    f"{mech['null_values'].partition('null: ')[2]}"], unit
        ranks = ", ".join(number(r) for r in mech.get("ranks", []))
        domain = mech.get("domain") or ["?", "?"]
        return [f"quantiles: of {mech.get('column')} at ranks {ranks}, within "
                f"[{number(domain[0])}, {number(domain[1])}], by the {mech.get('method', '')} "
                f"method"], unit

    def value_lines(self, report, table, keys):
        return value_lines(report, table, keys)


KIND = Quantiles()

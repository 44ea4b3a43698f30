"""``aggregates``: clipped sums and means per released key, beside the count.

Spec (top level, optional)::

    aggregates:
      - {column: amount, statistic: sum,  clip: [0, 200]}
      - {column: amount, statistic: mean, clip: [0, 200]}

Each entry adds a float64 output column ``<column>_<statistic>``. What is computed, per
released key (docs/aggregates.md):

* a user's *total* for the key is the sum of their finite values of ``column`` in the
  key's records (NaN, +-inf and null values are dropped and counted; a user whose values
  are all dropped has total 0); the total is clamped to [low, high];
* ``sum`` = the sum over the key's (bounded) users of their clamped totals, plus noise;
* ``mean`` = clamp(noisy sum / noisy count, low, high), the mean per user of the clamped
  totals; null when the noisy count is <= 0 (possible only with input.public_keys).

Entries with the same column and clip share one noisy sum (a mean is that sum over the
noisy count), so they are paid for once. Kinds: gaussian and laplace (with and without
input.public_keys), l0 model; sample_and_threshold and weighted_sampling refuse them.
Calibration (``accounting.aggregates``): gaussian -- every sum column gets discrete
Gaussian noise sigma_j = D_j sigma grid units, calibrated jointly with (sigma, tau*) under
paper 004 Thm 5.4 (or the C-fold shift over public keys); laplace -- the release epsilon
is split equally between the count and each sum column (basic composition).
"""
import dataclasses
import math

import pyarrow as pa

from thresher.accounting import aggregates as acc, gshm, search
from thresher.pipelines.specs.aggregates_fields import AUTO, SPREAD
from thresher.pipelines.errors import CalibrationError, InputError, SpecError
from thresher.pipelines import kinds
from thresher.pipelines.kinds.base import LAPLACE_NOISE

FIELD = "aggregates"
AUTO_FIELD = "aggregates_auto"
AUTO_STAGE = "choose_aggregate_clip"
DEFAULT_AUTO_EPSILON_FRACTION = 0.1
VALUE_PREFIX = "__v"     # prepared per-record value columns (float64, null = dropped)
SUM_PREFIX = "__s"       # per-key int64 sums on the fixed-point grid
# Sum noise ratio: sigma_j = SUM_NOISE_RATIO * D_j * sigma (each column costs what the
# count costs per row, mu_j = 1/sigma).
SUM_NOISE_RATIO = 1.0
# The largest |clip| of a variance or stddev (issue 36 D10: clip [-1e300, 1e300] squared to
# inf, an internal error in run, plan and validate). Its squares lie on the grid of
# [0, 2**e] with e <= 2 * MAX_SPREAD_EXPONENT, and the float of a noisy sum of squares of
# up to MAX_USERS users, units / grid scale <= 2**(GRID_BITS + MAX_USER_BITS) *
# 2**(e - GRID_BITS), must stay below float64's largest power of two, 2**1023.
MAX_SPREAD_EXPONENT = (1022 - acc.MAX_USER_BITS) // 2
MAX_SPREAD_CLIP = math.ldexp(1.0, MAX_SPREAD_EXPONENT)


@dataclasses.dataclass(frozen=True)
class AggregateSpec:
    column: str
    statistic: str
    clip: tuple            # (low, high)
    output: str
    sum_index: int         # which noisy sum (unique (column, clip)) it reads
    value_index: int       # which prepared value column (unique column) it reads
    square_index: int = -1  # variance / stddev: the noisy sum of squares it reads


def value_name(k):
    return f"{VALUE_PREFIX}{k}"


def sum_name(i):
    return f"{SUM_PREFIX}{i}"


def parse(section, input_spec, kind, bounding, reserved=()):
    """The ``aggregates`` list (each entry's fields checked by the schema) with the rules
    across fields; returns a tuple of AggregateSpec (SpecError naming the field otherwise)."""
    if kinds.get(kind).AGGREGATE_NOISE is None:
        supported = " and ".join(k for k in kinds.KINDS if kinds.get(k).AGGREGATE_NOISE)
        raise SpecError(FIELD, f"aggregates are supported for {supported}, not {kind!r} "
                        f"(no sound construction for sampled releases yet); remove the field")
    if input_spec.sample is not None:
        raise SpecError(FIELD, "cannot be combined with input.sample (an existing sample has "
                        "no values)")
    if bounding.model != "l0":
        raise SpecError(FIELD, "need bounding.model: l0 (a clip bounds each user's total per "
                        "key; the l1 model bounds records)")
    out, seen, sums, values = [], set(), {}, {}
    taken = set(input_spec.keys) | set(reserved)
    for i, entry in enumerate(section):
        field = f"{FIELD}[{i}]"
        column = entry["column"]
        if column == input_spec.user or column in input_spec.keys:
            raise SpecError(f"{field}.column", f"{column!r} is the user or a key column; "
                            f"aggregate a value column")
        statistic = entry["statistic"]
        clip = entry["clip"]
        output = f"{column}_{statistic}"
        if output in seen:
            raise SpecError(field, f"asks for {output!r} twice; one entry per column and statistic")
        if output in taken or output.startswith("__"):
            raise SpecError(field, f"output column {output!r} clashes with a key or output column")
        if clip == "auto" and statistic in SPREAD:
            raise SpecError(f"{field}.clip", f"statistic {statistic} needs a fixed clip "
                            f"[low, high] (clip: auto is for sum and mean)")
        if clip == "auto":
            seen.add(output)
            value_index = values.setdefault(column, len(values))
            sum_index = sums.setdefault((column, "auto"), len(sums))
            out.append(AggregateSpec(column=column, statistic=statistic, clip=AUTO,
                                     output=output, sum_index=sum_index, value_index=value_index))
            continue
        low, high = float(clip[0]), float(clip[1])
        try:
            acc.fixed_point_grid(low, high)
        except ValueError as exc:
            raise SpecError(f"{field}.clip", str(exc)) from None
        if statistic in SPREAD and max(abs(low), abs(high)) > MAX_SPREAD_CLIP:
            raise SpecError(f"{field}.clip", f"a {statistic}'s clip must lie within "
                            f"[-2**{MAX_SPREAD_EXPONENT}, 2**{MAX_SPREAD_EXPONENT}] (about "
                            f"+-{MAX_SPREAD_CLIP:.3g}), the largest a {statistic} accepts: its "
                            f"squares, summed over up to 2**{acc.MAX_USER_BITS} users, must stay "
                            f"finite; got [{low:g}, {high:g}]")
        seen.add(output)
        value_index = values.setdefault(column, len(values))
        sum_index = sums.setdefault((column, low, high), len(sums))
        square_index = -1
        if statistic in SPREAD:   # also the sum of squares of the clamped totals
            square_index = sums.setdefault((column, low, high, "squares"), len(sums))
        out.append(AggregateSpec(column=column, statistic=statistic, clip=(low, high),
                                 output=output, sum_index=sum_index, value_index=value_index,
                                 square_index=square_index))
    return tuple(out)


def value_columns(aggregates):
    """[(input column, prepared name)] in value_index order."""
    cols = {}
    for a in aggregates:
        cols.setdefault(a.value_index, a.column)
    return [(cols[k], value_name(k)) for k in sorted(cols)]


def sum_columns(aggregates, clips=None):
    """[(prepared value name, FixedPointGrid)] in sum_index order. ``clip: auto`` columns
    take [0, clips[i]] when chosen, else the placeholder [0, 1] (every power-of-two clip
    has the same grid sensitivity 2**GRID_BITS, so calibration does not depend on it)."""
    cols = {}
    for a in aggregates:
        if a.clip == AUTO:
            high = (clips or {}).get(a.sum_index, 1.0)
            grid = acc.fixed_point_grid(0.0, high)
        else:
            grid = acc.fixed_point_grid(*a.clip)
        cols.setdefault(a.sum_index, (value_name(a.value_index), grid))
        if a.square_index >= 0:
            cols.setdefault(a.square_index, (value_name(a.value_index), acc.squared_grid(*a.clip)))
    return [cols[i] for i in sorted(cols)]


def auto_columns(aggregates):
    """[(sum index, prepared value name)] of the ``clip: auto`` sum columns."""
    cols = {}
    for a in aggregates:
        if a.clip == AUTO:
            cols.setdefault(a.sum_index, value_name(a.value_index))
    return sorted(cols.items())


def output_fields(aggregates):
    """The published value columns, then the staged noisy sums behind variance / stddev
    (``__ns<i>``: read by pipelines/dataio/intervals.py in the launcher and dropped before
    publishing)."""
    fields = [pa.field(a.output, pa.float64()) for a in aggregates]
    staged = sorted({i for a in aggregates if a.square_index >= 0
                     for i in (a.sum_index, a.square_index)})
    return fields + [pa.field(f"__ns{i}", pa.float64()) for i in staged]


# ---------------------------------------------------------------------------------------
# Calibration (the report's mechanism section gains "aggregates").


def calibrate(spec, module, mech, *, epsilon, delta, max_keys_per_user, model):
    """The kind's calibration with the sum columns calibrated jointly; returns the
    mechanism's report section (what the release kernel reads)."""
    aggs = spec.aggregates
    grids = [g for _, g in sum_columns(aggs)]
    c = int(max_keys_per_user)
    what = (f"{spec.kind} release with {len(grids)} aggregate sum column(s) at epsilon="
            f"{epsilon:g}, delta={delta:g}, max_keys_per_user={c}")
    if spec.kind_object.AGGREGATE_NOISE == LAPLACE_NOISE:
        share = epsilon / (1 + len(grids))
        params = module.calibrate(mech, epsilon=share, delta=delta, max_keys_per_user=c,
                                  model=model)
        sums = []
        for g in grids:
            scale = c * g.sensitivity / share
            sums.append({"noise": "discrete_laplace", "scale_grid_units": scale,
                         "epsilon": share})
        params["epsilon_count"] = share
        params["aggregates_accounting"] = (
            f"basic composition: the count's release at epsilon {share:.6g} and each of the "
            f"{len(grids)} sum column(s) at epsilon {share:.6g} (discrete Laplace of scale "
            f"C D_j / epsilon_j on every key's grid sum, l1 sensitivity C D_j; published sums "
            f"are a post-processing); epsilon split equally")
    else:
        ratios = tuple((g.sensitivity, SUM_NOISE_RATIO) for g in grids)
        params = module.calibrate(mech, epsilon=epsilon, delta=delta, max_keys_per_user=c,
                                  model=model)
        section = spec.kind_object.params(mech)     # the kind's typed parsed section
        if section.public_keys:
            sigma, achieved = _domain_sigma(epsilon, delta, c, ratios, section.sigma, what)
            params.update(sigma=sigma, delta_achieved=achieved)
            text = (f"public key domain, every key released with noise, no threshold: the "
                    f"{c}-fold shift of (count, sums) by (1, D_1, ..)")
        else:
            try:
                p = gshm.calibrate(epsilon, delta, c, pre_threshold=section.pre_threshold,
                                   sigma=section.sigma, threshold=section.threshold,
                                   noise="discrete_gaussian", aggregates=ratios)
            except ValueError as exc:
                raise CalibrationError(f"{what}: {exc}") from None
            threshold = float(p.threshold)
            params.update(sigma=float(p.sigma),
                          threshold=int(threshold) if threshold.is_integer() else threshold,
                          delta_achieved=float(p.delta))
            text = "paper 004 Thm 5.4 with the extra columns of Alg. 1"
        sigma = params["sigma"]
        sums = []
        for g in grids:
            s = SUM_NOISE_RATIO * g.sensitivity * sigma
            if s > 2.0 ** 20:
                raise CalibrationError(f"{what}: sum noise sigma {s:.4g} grid units exceeds the "
                                       f"sampler's limit 2^20 (count sigma {sigma:.4g} too large)")
            sums.append({"noise": "discrete_gaussian", "sigma_grid_units": s})
        params["mu_o"] = math.sqrt(sum((g.sensitivity / s["sigma_grid_units"]) ** 2
                                       for g, s in zip(grids, sums)))
        params["aggregates_accounting"] = (
            f"{text}; discrete Gaussian noise on fixed-point grids, sigma_j = D_j sigma grid "
            f"units (mu_o = sqrt(sum_j (D_j / sigma_j)^2)); exact-noise bound "
            f"accounting.aggregates.joint_shift_delta (an upper bound on the exact delta)")
    params["accounting"] = f"{params['accounting']}; with aggregates: {params['aggregates_accounting']}"
    params["aggregates"] = [_entry(a, grids[a.sum_index], sums[a.sum_index]) for a in aggs]
    for a, e in zip(aggs, params["aggregates"]):
        if a.square_index >= 0:
            e["squares"] = _squares_entry(a, grids[a.square_index], sums[a.square_index])
    return params


def _squares_entry(a, grid, noise):
    """The sum of squares behind a variance / stddev: its column, grid and noise."""
    out = {"sum_column": a.square_index, "clip_of_squares": [grid.low, grid.high],
           "grid_resolution": grid.resolution, "grid_scale": grid.scale,
           "sensitivity_grid_units": grid.sensitivity, **noise}
    if "sigma_grid_units" in noise:
        out["sigma"] = noise["sigma_grid_units"] / grid.scale
    else:
        out["scale"] = noise["scale_grid_units"] / grid.scale
    return out


def _entry(a, grid, noise):
    out = {"column": a.column, "statistic": a.statistic, "output": a.output,
           "clip": "auto" if a.clip == AUTO else [a.clip[0], a.clip[1]], "sum_column": a.sum_index,
           "grid_resolution": grid.resolution, "grid_scale": grid.scale,
           "sensitivity_grid_units": grid.sensitivity, **noise}
    if "sigma_grid_units" in noise:
        out["sigma"] = noise["sigma_grid_units"] / grid.scale
    else:
        out["scale"] = noise["scale_grid_units"] / grid.scale
    return out


def _domain_sigma(epsilon, delta, c, ratios, given, what):
    def fits(s):
        cols = tuple((d, r * d * s) for d, r in ratios)
        return acc.joint_shift_delta(epsilon, s, c, cols) <= delta

    if given is not None:
        if not fits(float(given)):
            raise CalibrationError(f"{what}: sigma {given:g} does not meet delta={delta:g} with "
                                   f"the aggregate columns")
        sigma = float(given)
    else:
        sigma = search.smallest_real(fits, 0.05 * math.sqrt(c), math.inf, rel_tol=1e-6)
        if sigma is None:
            raise CalibrationError(f"{what}: no sigma meets the budget")
    cols = tuple((d, r * d * sigma) for d, r in ratios)
    return sigma, float(acc.joint_shift_delta(epsilon, sigma, c, cols))


# ---------------------------------------------------------------------------------------
# ``thresher plan``: noise and expected error per aggregate (no data).


def plan_lines(params, users):
    """Readable lines: each aggregate's noise and the expected absolute error of its sum
    and mean at ``users`` users per key (noise only; clamping bias depends on the data)."""
    lines = []
    if "sigma" in params:
        count_sd = float(params["sigma"])
    else:
        b = float(params["scale"])
        q = math.exp(-1.0 / b)
        count_sd = math.sqrt(2.0 * q) / (1.0 - q)
    for e in params.get("aggregates", []):
        if e["statistic"] in SPREAD:
            sq = e["squares"]
            noise = (f"sigma {e['sigma']:.6g} / {sq['sigma']:.6g}" if "sigma" in e else
                     f"Laplace scale {e['scale']:.6g} / {sq['scale']:.6g}")
            lines.append(f"  {e['output']}: clip [{e['clip'][0]:g}, {e['clip'][1]:g}], noise of "
                         f"the sum / sum of squares {noise}; its error depends on the data "
                         f"(see the interval columns)")
            continue
        if e["clip"] == AUTO:
            # noise scales with the bound b chosen at run time: D_g = 2**GRID_BITS <-> b
            unit = float(e["sensitivity_grid_units"])
            if "sigma_grid_units" in e:
                per_b = e["sigma_grid_units"] / unit
                noise = f"discrete Gaussian sigma {per_b:.6g} b"
                abs_sum = acc.expected_abs_gaussian(per_b)
            else:
                per_b = e["scale_grid_units"] / unit
                noise = f"discrete Laplace scale {per_b:.6g} b"
                abs_sum = per_b
            err = (f"E|error| of the sum {abs_sum:.4g} b" if e["statistic"] == "sum" else
                   f"E|error| of the mean at {users} users <= "
                   f"{acc.mean_error(count_sd, per_b, users, 1.0) * math.sqrt(2 / math.pi):.4g} b")
            lines.append(f"  {e['output']}: clip auto ([0, b], b a power of two chosen privately), "
                         f"grid step b / {int(unit)}, {noise}; {err} (noise only)")
            continue
        if "sigma" in e:
            sd = e["sigma"]
            abs_sum = acc.expected_abs_gaussian(sd)
            noise = f"discrete Gaussian sigma {sd:.6g} ({e['sigma_grid_units']:.6g} grid units)"
        else:
            scale_units = e["scale_grid_units"]
            q = math.exp(-1.0 / scale_units)
            sd = math.sqrt(2.0 * q) / (1.0 - q) / e["grid_scale"]
            abs_sum = acc.expected_abs_laplace(scale_units) / e["grid_scale"]
            noise = f"discrete Laplace scale {e['scale']:.6g} ({scale_units:.6g} grid units)"
        bound = max(abs(e["clip"][0]), abs(e["clip"][1]))
        mean_sd = acc.mean_error(count_sd, sd, users, bound)
        err = (f"E|error| of the sum {abs_sum:.4g}" if e["statistic"] == "sum" else
               f"E|error| of the mean at {users} users <= {mean_sd * math.sqrt(2 / math.pi):.4g}")
        lines.append(f"  {e['output']}: clip [{e['clip'][0]:g}, {e['clip'][1]:g}], grid step "
                     f"{e['grid_resolution']:.4g}, {noise}; {err} (noise only)")
    return lines


def print_plan(plan, users):
    """``thresher plan``'s aggregates section (every candidate bound with an auto bound)."""
    print(f"aggregates (expected errors at {users} users per key; noise only):")
    for bound, params in plan.params_by_bound.items():
        if len(plan.params_by_bound) > 1:
            print(f" C={bound}:")
        for line in plan_lines(params, users):
            print(line)
        print(f"  accounting: {params['aggregates_accounting']}")


# ---------------------------------------------------------------------------------------
# clip: auto (its own stage; transforms/values/choose_clip.py).


@dataclasses.dataclass(frozen=True)
class AutoClipSpec:
    epsilon: float          # the stage's epsilon, taken from privacy.epsilon
    quantile: float         # q of the private quantile of per-(user, key) totals
    candidates: tuple       # powers of two


def parse_auto(section, privacy, aggregates):
    """``aggregates_auto: {epsilon, quantile, min_exponent, max_exponent}`` (all optional);
    None when no entry has ``clip: auto``."""
    has_auto = any(a.clip == AUTO for a in aggregates)
    if section is not None and not has_auto:
        raise SpecError(AUTO_FIELD, "only applies when some aggregates entry has clip: auto")
    if not has_auto:
        return None
    section = section or {}
    eps = float(section.get("epsilon", DEFAULT_AUTO_EPSILON_FRACTION * privacy.epsilon))
    q = float(section.get("quantile", acc.DEFAULT_AUTO_QUANTILE))
    lo = int(section.get("min_exponent", acc.DEFAULT_AUTO_MIN_EXPONENT))
    hi = int(section.get("max_exponent", acc.DEFAULT_AUTO_MAX_EXPONENT))
    if hi < lo:
        raise SpecError(f"{AUTO_FIELD}.max_exponent", f"must be an integer >= min_exponent "
                        f"({lo}), got {hi}")
    return AutoClipSpec(epsilon=eps, quantile=q,
                        candidates=tuple(float(c) for c in acc.clip_candidates(lo, hi)))


def choose_clips(users, plan, rng_factory=None, clip_sink=None):
    """The ``choose_aggregate_clip`` stage on user shards: a PCollection of one dict
    {sum index: upper bound}, or None when no aggregate has ``clip: auto``.
    ``rng_factory``: the release's draws (``keyed_random.KeyedDraws``)."""
    spec = plan.spec
    auto = auto_columns(spec.aggregates)
    if not auto:
        return None
    from thresher.transforms.randomness.keyed_random import child  # heavy: apache_beam
    from thresher.transforms.values.choose_clip import ChooseClipBounds  # heavy: apache_beam
    stage = next(s for s in plan.budget.stages if s.name == AUTO_STAGE)
    clips = users | "ChooseClipBounds" >> ChooseClipBounds(
        list(spec.input.keys), auto, spec.aggregates_auto.candidates, epsilon=stage.epsilon,
        quantile=spec.aggregates_auto.quantile,
        rng_factory=child(rng_factory, "ChooseClipBounds"))
    if clip_sink is not None:
        clip_sink(clips)
    return clips


def apply_clips(params, clips):
    """The mechanism section with the chosen clip bounds of ``clip: auto`` columns filled
    in (grid and value-unit noise); other entries unchanged."""
    clips = {int(k): float(v) for k, v in (clips or {}).items()}
    out = dict(params)
    entries = []
    for e in params.get("aggregates", []):
        e = dict(e)
        if e["clip"] == AUTO and e["sum_column"] in clips:
            grid = acc.fixed_point_grid(0.0, clips[e["sum_column"]])
            e.update(clip=[0.0, grid.high], clip_chosen_by="exponential_mechanism",
                     grid_resolution=grid.resolution, grid_scale=grid.scale,
                     sensitivity_grid_units=grid.sensitivity)
            if "sigma_grid_units" in e:
                e["sigma"] = e["sigma_grid_units"] / grid.scale
            else:
                e["scale"] = e["scale_grid_units"] / grid.scale
        entries.append(e)
    out["aggregates"] = entries
    return out


def check_rows(est_rows):
    """Refuse an input with more rows than MAX_USERS (2**50): a key then could have more
    users than the int64 grid sums are sized for (accounting.aggregates)."""
    if est_rows > acc.MAX_USERS:
        raise InputError(f"input.path: about {est_rows} rows; aggregates support at most "
                         f"2^{acc.MAX_USER_BITS} rows (users per key), so that no grid sum "
                         f"can overflow int64")

"""``<column>_low`` / ``<column>_high``: confidence intervals beside released values (issue 27).

Post-processing of the published values with the public calibrated parameters (the
report's ``mechanism`` section) and ``output.confidence``: no privacy cost. Constructions
(``accounting.intervals``; docs/intervals.md):

* ``count`` of gaussian / laplace with a threshold: the Neyman interval on the noise law
  truncated to {noisy >= tau*}, valid conditional on release for every true count
  >= pre_threshold;
* ``count`` over public keys, and the count-stage ``count`` of weighted_gaussian and
  adaptive (noise independent of the selection): the same inversion without truncation;
* ``<col>_sum``: released +- the noise's symmetric quantile (the sum noise is drawn after
  the count noise from the key's own stream, independent of the selection); the target is
  the sum of the grid-rounded clamped totals;
* ``<col>_mean``: union bound -- the count interval and the sum interval at error
  alpha/2 each, the range of sum / count over that box, widened by half a grid step
  and clamped to the clip.

Bit-identity: :func:`add_columns` runs once, in the launcher, after the pipeline, on the
gathered ``released.parquet``; endpoints are integers (counts) or released value +- an
integer number of grid steps (g a power of two), so the bytes depend only on the released
values, the parameters and the thresher version, never on the runner.
"""
import numpy as np
import pyarrow as pa

from thresher.accounting import intervals as iv

DEFAULT_CONFIDENCE = 0.95
NOISY_SUM = "__ns"     # staged noisy sums behind a variance (transforms/values/aggregate_values.py)
LOW, HIGH = "_low", "_high"
# The constructions a kind declares as its ``INTERVAL`` (``pipelines.kinds.base.Kind``;
# this module imports no kind: it reads the declaration from ``spec.kind_object``):
# the ``count`` by its noise law (truncated at the threshold, or over public keys:
# gaussian, laplace); the ``count`` of a count stage drawn independently of the selection
# (a discrete Gaussian of ``count_sigma``: weighted_gaussian, adaptive); the ``estimate``
# of a sampled count (binomial: sample_and_threshold).
NOISY_COUNT, COUNT_STAGE, SAMPLED_ESTIMATE = "noisy_count", "count_stage", "sampled_estimate"
CONSTRUCTIONS = (NOISY_COUNT, COUNT_STAGE, SAMPLED_ESTIMATE)


def kind_publishes(spec):
    """Whether a release of this spec publishes intervals (its kind declares an
    ``INTERVAL``: for its ``count``, or for a sampled estimate its ``estimate``)."""
    return spec.kind_object.INTERVAL is not None and spec.input.sample is None


def output_names(column):
    return column + LOW, column + HIGH


def report_section(spec):
    """The report's ``intervals``: confidence, the columns with an interval and what each
    covers, and the columns without one (a function of the spec and version only)."""
    conf = float(spec.output.confidence)
    section = {"confidence": conf,
               "note": "post-processing of the released values and the parameters above "
                       "(no privacy cost); docs/intervals.md"}
    columns, without = {}, {}
    kind = spec.kind_object
    if kind.INTERVAL == SAMPLED_ESTIMATE and kind_publishes(spec):
        columns["estimate"] = {
            "target": "the count after contribution bounding (each user in at most "
                      "max_keys_per_user keys), which estimate = count / sampling_rate estimates",
            "construction": "Neyman interval from Bin(n, sampling_rate) truncated to {sampled "
                            "count >= threshold}: the n for which neither one-sided tail of the "
                            "released sampled count, given release, is below (1 - confidence) / 2",
            "holds": "for every true count n >= 1, conditional on release"}
        without["count"] = ("the sampled count is what was sampled (no noise); the interval "
                            "for the count it samples is estimate_low / estimate_high")
    elif kind_publishes(spec):
        columns["count"] = _count_text(spec)
        for a in spec.aggregates:
            columns[a.output] = _aggregate_text(a)
    else:
        # named by the kind's released value column (issue 36: said "count" for the
        # quantiles' value and weighted_sampling's estimate, columns those kinds lack)
        without[kind.VALUE_COLUMN] = kind.NO_INTERVAL
    if spec.mechanism.get("debias"):
        without["debiased"] = "no interval derived for the Poisson-debiased estimate"
    section["columns"] = columns
    if without:
        section["without_interval"] = without
    return section


def _count_text(spec):
    bounded = ("the count after contribution bounding (each user in at most "
               "max_keys_per_user keys)")
    if spec.kind_object.INTERVAL == COUNT_STAGE:
        return {"target": "the count-stage count: distinct users of the key, each user "
                          "counted in at most count_keys_per_user of its kept keys",
                "construction": "test inversion of the discrete Gaussian count-stage noise; "
                                "that noise is drawn independently of the selection, so the "
                                "interval holds given release",
                "holds": "for every true count >= 0, conditional on release"}
    if spec.input.public_keys is not None:
        return {"target": bounded,
                "construction": "test inversion of the noise law (every key released, no "
                                "threshold)",
                "holds": "for every true count >= 0"}
    out = {"target": bounded,
           "construction": "Neyman interval from the noise law truncated to {noisy count >= "
                           "threshold}: the true counts n >= pre_threshold for which "
                           "neither one-sided tail of the released value, given release, is "
                           "below (1 - confidence) / 2",
           "holds": "for every true count >= pre_threshold, conditional on release"}
    return {**out, **spec.kind_object.interval_notes(spec.mechanism)}


def _aggregate_text(a):
    if a.statistic in ("variance", "stddev"):
        return {"target": f"the population {a.statistic} of the key's bounded users' totals "
                          "clamped to the clip",
                "construction": "union bound: count, sum and sum-of-squares intervals at error "
                                "(1 - confidence)/3 each; the range of Q/n - (S/n)^2 over them "
                                "(grid rounding included), within the Bhatia-Davis bound",
                "holds": "for every true (count, sum, sum of squares) with count >= 1, "
                         "conditional on release"}
    if a.statistic == "sum":
        return {"target": "the sum over the key's bounded users of their totals clamped to "
                          "the clip and rounded to the grid (differs from the unrounded "
                          "clamped sum by at most half a grid step per user)",
                "construction": "released sum +- the symmetric quantile of its noise, which is "
                                "independent of the selection",
                "holds": "for every true sum, conditional on release"}
    return {"target": "the mean per bounded user of the clamped totals",
            "construction": "union bound: count and sum intervals at error (1 - confidence)/2 "
                            "each, the range of sum / count over both, widened by half a grid "
                            "step and clamped to the clip",
            "holds": "for every true (count, mean) with count >= 1, conditional on release"}


# ---------------------------------------------------------------------------------------
# Computing the columns.


def count_tail_and_rule(mechanism, count_threshold=True):
    """(NoiseTail, floor, threshold, clamped_at_zero) of a kind's released count (read
    from its calibrated parameters: a count stage publishes its ``count_sigma``)."""
    if "count_sigma" in mechanism:
        sigma = float(mechanism["count_sigma"])
        return iv.NoiseTail(iv.GAUSSIAN, sigma), 0, None, False
    noise = mechanism["noise"]
    scale = float(mechanism["sigma"] if noise in (iv.GAUSSIAN, "correlated") else mechanism["scale"])
    if mechanism.get("public_keys"):
        return (iv.NoiseTail(noise, scale), 0, None, bool(mechanism.get("clamp_negative")))
    floor = int(mechanism["pre_threshold"])
    threshold = float(mechanism["threshold"])
    reach = max(0, int(np.ceil(threshold)) - floor)
    if noise == "correlated":     # shared + independent: the tail of their convolution
        return (iv.NoiseTail(iv.GAUSSIAN, scale, reach=reach,
                             shared=float(mechanism["shared_sigma"])), floor, threshold, False)
    return iv.NoiseTail(noise, scale, reach=reach), floor, threshold, False


def count_interval(values, mechanism, alpha):
    """(low, high) int64 arrays for the released counts ``values``."""
    tail, floor, threshold, clamped = count_tail_and_rule(mechanism)
    return iv.count_bounds(np.asarray(values, dtype=np.int64), tail, alpha, floor,
                           threshold=threshold, clamped_at_zero=clamped)


def sum_interval(values, entry, alpha):
    """(low, high) float64 arrays: released sum -+ k / g, k the noise's symmetric
    quantile in grid units (exact: g is a power of two)."""
    values = np.asarray(values, dtype=np.float64)
    if "sigma_grid_units" in entry:
        k = iv.symmetric_quantile(iv.GAUSSIAN, float(entry["sigma_grid_units"]), alpha)
    else:
        k = iv.symmetric_quantile(iv.LAPLACE, float(entry["scale_grid_units"]), alpha)
    half_width = float(k) / float(entry["grid_scale"])
    return values - half_width, values + half_width


def mean_interval(counts, sum_low, sum_high, entry, mechanism, alpha):
    """Joint interval of a mean: the count interval at alpha/2 and the sum interval
    [sum_low, sum_high] (built at alpha/2: union bound), the range of S / n over that
    box, widened by half a grid step (so it covers the unrounded clamped mean too) and
    clamped to the clip. Where the count interval reaches 0 (public keys) the whole clip."""
    n_lo, n_hi = count_interval(counts, mechanism, alpha / 2.0)
    low_clip, high_clip = (float(entry["clip"][0]), float(entry["clip"][1]))
    positive = n_lo >= 1
    safe_lo = np.where(positive, n_lo, 1)
    with np.errstate(invalid="ignore"):
        lo, hi = iv.ratio_range(sum_low, sum_high, safe_lo, np.maximum(n_hi, safe_lo))
    half_step = 0.5 / float(entry["grid_scale"])
    lo = np.where(positive, lo - half_step, low_clip)
    hi = np.where(positive, hi + half_step, high_clip)
    return np.clip(lo, low_clip, high_clip), np.clip(hi, low_clip, high_clip)


def interval_columns(table, mechanism, confidence, construction=None):
    """{name: pyarrow array} of every interval column for a released table.
    ``construction``: the kind's ``INTERVAL`` (one of CONSTRUCTIONS); None reads it from
    the calibrated parameters (a sampling rate and no noise: a sampled estimate)."""
    if construction is None:
        construction = (SAMPLED_ESTIMATE if "sampling_rate" in mechanism
                        and not {"sigma", "scale", "count_sigma"} & set(mechanism)
                        else NOISY_COUNT)
    alpha = 1.0 - float(confidence)
    out = {}
    counts = table.column("count").to_numpy(zero_copy_only=False).astype(np.int64)
    if construction == SAMPLED_ESTIMATE:
        low, high = iv.binomial_bounds(counts, float(mechanism["sampling_rate"]), alpha,
                                       float(mechanism["threshold"]))
        out["estimate" + LOW] = pa.array(low.astype(np.float64), type=pa.float64())
        out["estimate" + HIGH] = pa.array(high.astype(np.float64), type=pa.float64())
        return out
    low, high = count_interval(counts, mechanism, alpha)
    out["count" + LOW] = pa.array(low, type=pa.int64())
    out["count" + HIGH] = pa.array(high, type=pa.int64())
    sums = {e["sum_column"]: e["output"] for e in mechanism.get("aggregates", [])
            if e["statistic"] == "sum"}
    for e in mechanism.get("aggregates", []):
        col = table.column(e["output"])
        null = np.asarray(col.is_null().to_numpy(zero_copy_only=False), dtype=bool)
        values = np.nan_to_num(col.to_numpy(zero_copy_only=False).astype(np.float64))
        if e["statistic"] == "sum":
            lo, hi = sum_interval(values, e, alpha)
        elif e["statistic"] in ("variance", "stddev"):
            lo, hi = spread_interval(table, counts, e, mechanism, alpha)
        else:
            s_lo, s_hi = _sum_box(table, e, counts, values, sums, alpha)
            lo, hi = mean_interval(counts, s_lo, s_hi, e, mechanism, alpha)
        null |= np.isnan(lo) | np.isnan(hi)
        out[e["output"] + LOW] = pa.array(np.where(null, 0.0, lo), type=pa.float64(), mask=null)
        out[e["output"] + HIGH] = pa.array(np.where(null, 0.0, hi), type=pa.float64(), mask=null)
    return out


def spread_interval(table, counts, entry, mechanism, alpha):
    """Joint interval of a population variance (or its square root) of the clamped
    totals: count, sum and sum-of-squares intervals at alpha/3 each (union bound); the
    mean's range (as for a mean) and the mean square's range Q / n, each widened by half
    a grid step (so the unrounded totals are covered), give

        variance in [m2_lo - max(mean^2), m2_hi - min(mean^2)],

    intersected with [0, max over the mean range of (high - mean)(mean - low)] (the
    Bhatia-Davis bound: values in [low, high] have variance <= (high - mu)(mu - low)).
    The noisy sums are the staged ``__ns<i>`` columns (never published)."""
    third = alpha / 3.0
    low_clip, high_clip = (float(entry["clip"][0]), float(entry["clip"][1]))
    squares = entry["squares"]
    s = table.column(f"{NOISY_SUM}{entry['sum_column']}").to_numpy(zero_copy_only=False)
    q = table.column(f"{NOISY_SUM}{squares['sum_column']}").to_numpy(zero_copy_only=False)
    n_lo, n_hi = count_interval(counts, mechanism, third)
    s_lo, s_hi = sum_interval(np.nan_to_num(s), entry, third)
    q_lo, q_hi = sum_interval(np.nan_to_num(q), squares, third)
    positive = n_lo >= 1
    safe_lo = np.where(positive, n_lo, 1).astype(np.float64)
    safe_hi = np.maximum(n_hi, safe_lo).astype(np.float64)
    m_lo, m_hi = iv.ratio_range(s_lo, s_hi, safe_lo, safe_hi)
    step = 0.5 / float(entry["grid_scale"])
    m_lo = np.clip(m_lo - step, low_clip, high_clip)
    m_hi = np.clip(m_hi + step, low_clip, high_clip)
    sq_low, sq_high = (float(squares["clip_of_squares"][0]), float(squares["clip_of_squares"][1]))
    sq_step = 0.5 / float(squares["grid_scale"])
    m2_lo = np.clip(np.maximum(q_lo, 0.0) / safe_hi - sq_step, sq_low, sq_high)
    m2_hi = np.clip(np.maximum(q_hi, 0.0) / safe_lo + sq_step, sq_low, sq_high)
    most_sq = np.maximum(m_lo * m_lo, m_hi * m_hi)
    least_sq = np.where((m_lo <= 0.0) & (m_hi >= 0.0), 0.0, np.minimum(m_lo * m_lo, m_hi * m_hi))
    centre = np.clip((low_clip + high_clip) / 2.0, m_lo, m_hi)
    davis = (high_clip - centre) * (centre - low_clip)
    cap = ((high_clip - low_clip) / 2.0) ** 2
    var_lo = np.clip(m2_lo - most_sq, 0.0, cap)
    var_hi = np.clip(np.minimum(m2_hi - least_sq, davis), 0.0, cap)
    var_lo = np.minimum(var_lo, var_hi)
    var_lo = np.where(positive, var_lo, 0.0)
    var_hi = np.where(positive, var_hi, cap)
    if entry["statistic"] == "stddev":
        return np.sqrt(var_lo), np.sqrt(var_hi)
    return var_lo, var_hi


def _sum_box(table, entry, counts, means, sums, alpha):
    """The sum interval at alpha/2 behind a mean. With the sum of the same (column, clip)
    published, from it. A mean alone publishes clamp(sum / count, low, high): strictly
    inside the clip the noisy sum is mean * count (widened by a relative 1e-12 for the
    float product); at a clip end the sum is only known to lie beyond it, so that side
    of its interval is unbounded."""
    name = sums.get(entry["sum_column"])
    staged = f"{NOISY_SUM}{entry['sum_column']}"
    if name is None and staged in table.column_names:   # a variance's staged noisy sum
        name = staged
    if name is not None:
        noisy = table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)
        return sum_interval(noisy, entry, alpha / 2.0)
    noisy = means * counts.astype(np.float64)
    lo, hi = sum_interval(noisy, entry, alpha / 2.0)
    margin = 1e-12 * np.abs(noisy)
    low_clip, high_clip = (float(entry["clip"][0]), float(entry["clip"][1]))
    lo = np.where(means <= low_clip, -np.inf, lo - margin)
    hi = np.where(means >= high_clip, np.inf, hi + margin)
    return lo, hi


def add_columns(table, mechanism, spec):
    """The released table with ``<column>_low, <column>_high`` after each value column
    that has an interval (schema order: key columns, then each value and its interval)."""
    if not kind_publishes(spec):
        return table
    extra = interval_columns(table, mechanism, spec.output.confidence,
                             spec.kind_object.INTERVAL)
    names, arrays = [], []
    for name in table.column_names:
        if name.startswith(NOISY_SUM):     # staged for the intervals only: never published
            continue
        names.append(name)
        arrays.append(table.column(name))
        for suffix in (LOW, HIGH):
            if name + suffix in extra:
                names.append(name + suffix)
                arrays.append(extra[name + suffix])
    return pa.table(dict(zip(names, arrays)))

"""Planning limits: what a spec may ask for so that ``thresher plan`` finishes in seconds
and bounded memory, checked from the spec alone before any calibration allocates.

Every calibration's cost is driven by one scale, and each scale has a limit here:

* ``gaussian`` (paper 004; ``accounting.gshm``, ``accounting.discrete_gaussian``): the
  exact discrete-Gaussian tails are sums over ~10 sigma integers (arrays of O(sigma)
  floats) evaluated ~100 times per calibration, so sigma <= SIGMA_MAX (1e5: <= ~300 MB,
  ~3 s). A calibrated sigma is decreasing in epsilon: a spec whose smallest workable
  sigma (the Gaussian part delta_+(C, eps) <= delta alone) exceeds SIGMA_MAX is refused
  naming privacy.epsilon and the smallest epsilon that works. A fixed threshold tau*
  needs sigma ~ (tau* - tau) / 6, so tau* - tau <= 10 SIGMA_MAX. The Thm 5.4 maximum is
  vectorised over a_= = 0..C-1 (arrays of O(C) floats, ~100 evaluations): C <= 1e5.
  With ``mechanism.noise: correlated`` (``accounting.correlated_gshm``) Thm 5.4 is
  evaluated at ~16 s + 1 thresholds per split for 9 splits: C <= CORRELATED_MAX_KEYS =
  1024 (~2 s CPU there); ``noise: auto`` compares the two only up to it. Its work also
  grows as sigma (sigma + 2.6 C): the smallest workable sigma must be
  <= correlated_gshm.max_sigma(C) (~1000 at small C, ~330 at C = 1024; ~5 s), else
  privacy.epsilon is refused (auto then compares nothing: the calibration refuses too).
* ``laplace`` (paper 002; ``accounting.laplace_threshold``): the same O(C) maximum,
  C <= 1e5; tau* <= 1e12 (counts of users; larger values overflow the integer search).
* ``sample_and_threshold`` (papers 000/003) and ``weighted_sampling`` (paper 001): the
  per-key budget (eps0, delta0) is (epsilon/C, delta/C) (sample_and_threshold; for
  weighted_sampling that of ``accounting.pws.per_key_budget``) and the threshold, the
  binomial sums and the PWS tables all grow with L(eps0, delta0) ~ ln(eps0/delta0)/eps0
  (PWS eq. 4), so L <= L_MAX = 20,000 (seconds; the stored entries of a weighted_sampling
  table are capped at accounting.pws.MAX_TABLE_ENTRIES anyway, ~370 MB RSS at the cap). The exact optimal
  composition of weighted_sampling is O(C) per evaluation: C <= 1e4; its per-key delta
  must stay far above float granularity (delta / C >= 1e-15), and a ppswor/priority
  sampling threshold must be >= 1e-6 (q_i ~ i t: tables grow as 1/t); moreover the
  automatic table, which ends where pi reaches 1 (>= SATURATION_SCALE / t counts), must
  fit accounting.pws's caps (MAX_KEEP_LENGTH counts keys only, MAX_BAND_ROWS rows with
  frequencies; an explicit max_frequency too), so every accepted weighted_sampling plan
  takes <= ~2 s of CPU and <= ~130 MB beyond the imports (measured: docs/
  weighted_sampling.md "Limits", tests/robustness/test_pws_plan_cost.py). The float rounding
  of the sampled distributions (``accounting.pws.rounding_excess``, ~ 16 2^-53 (1 + e^eps0))
  must stay below the per-key delta, or no table can be verified: refused naming
  privacy.delta (the smallest delta that works) or privacy.epsilon (the largest).
  A GIVEN mechanism.threshold of any sample-and-threshold kind is <= THRESHOLD_MAX = 100:
  the sampling-rate search for it evaluates the delta over binomial tails of O(threshold)
  counts ~15 times, and ``thresher plan`` took ~9-15 s at 100, 15-22 s at 200-300 and
  > 180 s at 10,000 (C = 16 and 64, load ~4-5; benchmarks/bench_fixed_threshold.py,
  docs/performance.md). A calibrated threshold is bounded by L_MAX above.
* ``mechanism.sampling_rate`` (sample-and-threshold kinds) >= SAMPLING_RATE_MIN = 1e-12.
* ``input.public_keys`` (paper 002 Sec. 4): the domain file lists at most
  PUBLIC_KEYS_MAX keys (a CSV or JSONL file at most PUBLIC_KEYS_MAX_BYTES bytes, checked
  before it is read; Parquet by its row count, from the footer): the plan holds the
  domain as a table and every domain key is released, so the run's memory grows with it:
  ~470 bytes per domain key beyond the data's own (1e6 keys 825 MB, 3e6 keys 1.76 GB
  peak RSS in process; docs/performance.md, "Keyed randomness in bulk"). A text file of
  256 MiB holds ~3e6 keys of 80 bytes.
* every kind: privacy.epsilon <= 100 (e^epsilon overflows a float near 709; no release
  is meaningfully private beyond single digits) and privacy.delta >= 1e-100.

Errors are ``SpecError`` (exit code 2) naming the field and the limit, or the nearest
value that works. ``docs/limits.md`` ("Planning limits") lists them.
"""
import math

from thresher.accounting.search import smallest_integer
from thresher.pipelines.common.calibration_cache import cached
from thresher.pipelines.errors import SpecError

EPSILON_MAX = 100.0
DELTA_MIN = 1e-100
SIGMA_MAX = 1e5
SIGMA_MIN = 1e-3
GAP_MAX = 10 * SIGMA_MAX
LAPLACE_THRESHOLD_MAX = 1e12
L_MAX = 20_000.0
# a GIVEN sample-and-threshold threshold (module docstring; docs/performance.md)
THRESHOLD_MAX = 100
# gaussian with mechanism.noise: correlated (= accounting.correlated_gshm.MAX_KEYS: its
# calibration sums Thm 5.4 over the shared draw; minutes beyond it)
CORRELATED_MAX_KEYS = 1024
# The largest bound C a kind's calibration is planned for (its kind object's MAX_KEYS,
# ``pipelines.kinds.base.Kind``): O(C) calibrations (the default), the exact optimal
# composition of weighted_sampling, and the O(C^2) weighted-Gaussian / adaptive ones.
DEFAULT_MAX_KEYS = 100_000
WEIGHTED_SAMPLING_MAX_KEYS = 10_000
WEIGHTED_GAUSSIAN_MAX_KEYS = 2048
WS_KEY_DELTA_MIN = 1e-15
WS_SAMPLING_THRESHOLD_MIN = 1e-6
# sample-and-threshold kinds: below this rate a released key needs > 1e12 users, and at
# 1e-100 the accounting's binomial blocks overflow (issue 30 D4)
SAMPLING_RATE_MIN = 1e-12
# input.public_keys: keys listed, and bytes of a text (CSV/JSONL) domain file
PUBLIC_KEYS_MAX = 3_000_000
PUBLIC_KEYS_MAX_BYTES = 256 << 20


def check_public_keys(path, rows=None, size_bytes=None):
    """The public key domain fits the planning limits (module docstring): SpecError
    naming ``input.public_keys`` otherwise. ``rows``: the file's key count where known
    before reading (Parquet's footer) or after; ``size_bytes``: a text file's size."""
    if size_bytes is not None and size_bytes > PUBLIC_KEYS_MAX_BYTES:
        raise SpecError("input.public_keys", f"{path!r} is {size_bytes:,} bytes; a public key "
                        f"list in CSV or JSONL may be at most {PUBLIC_KEYS_MAX_BYTES:,} bytes "
                        f"(the planning limit: the domain is held in memory, every key "
                        f"released); store it as Parquet or release fewer keys")
    if rows is not None and rows > PUBLIC_KEYS_MAX:
        raise SpecError("input.public_keys", f"{path!r} lists {rows:,} keys; a public key "
                        f"domain may hold at most {PUBLIC_KEYS_MAX:,} (the planning limit: the "
                        f"domain is held in memory and every key is released with noise)")


def _bound_field(spec):
    """The spec field that sets the largest max_keys_per_user a plan calibrates."""
    if not spec.auto_bound:
        return "bounding.max_keys_per_user"
    auto = spec.bounding.auto
    return "bounding.auto.candidates" if auto.candidates != _default(auto.max_bound) \
        else "bounding.auto.max_bound"


def _default(max_bound):
    """The spec's default candidate grid (``specs.spec.default_candidates``), taken from
    accounting so that this module imports neither the spec nor the kinds."""
    from thresher.accounting.contribution_bound import default_candidates  # heavy: numpy
    return default_candidates(max_bound)


def check_spec(spec, kind):
    """Limits that depend on the spec's fields only (no budget split): raise SpecError.
    ``kind``: the spec's kind object (``pipelines.kinds.base.Kind``), whose
    ``check_limits`` checks its own fields (with the functions below; this module imports
    no kind)."""
    privacy = spec.privacy
    if privacy.epsilon > EPSILON_MAX:
        raise SpecError("privacy.epsilon", f"must be <= {EPSILON_MAX:g} (the planning limit: "
                        f"e^epsilon overflows beyond ~709), got {privacy.epsilon:g}")
    if privacy.delta < DELTA_MIN:
        raise SpecError("privacy.delta", f"must be >= {DELTA_MIN:g} (the planning limit), "
                        f"got {privacy.delta:g}")
    kind.check_limits(spec.mechanism)


def check_gaussian_fields(params):
    """gaussian's sigma and threshold within the exact tails' limits (module docstring).
    ``params``: its parsed section, typed (``pipelines.kinds.gaussian.GaussianParams``)."""
    if params.sigma is not None and params.sigma < SIGMA_MIN:
        raise SpecError("mechanism.sigma", f"must be >= {SIGMA_MIN:g} (smaller noise cannot "
                        f"meet any delta < 1), got {params.sigma:g}")
    if params.sigma is not None and params.sigma > SIGMA_MAX:
        raise SpecError("mechanism.sigma", f"must be <= {SIGMA_MAX:g} (the planning limit: "
                        f"exact discrete Gaussian tails cost O(sigma) memory), got {params.sigma:g}")
    if params.threshold is not None and params.threshold - params.pre_threshold > GAP_MAX:
        raise SpecError("mechanism.threshold", f"must be <= pre_threshold + {GAP_MAX:g} = "
                        f"{params.pre_threshold + GAP_MAX:g} (the planning limit: it would "
                        f"need sigma > {SIGMA_MAX:g}), got {params.threshold:g}")


def check_laplace_fields(params):
    """laplace's given threshold within the integer search's range. ``params``: its parsed
    section, typed (``pipelines.kinds.laplace.LaplaceParams``)."""
    if params.threshold is not None and params.threshold > LAPLACE_THRESHOLD_MAX:
        raise SpecError("mechanism.threshold", f"must be <= {LAPLACE_THRESHOLD_MAX:g} (the "
                        f"planning limit), got {params.threshold:g}")


def check_sampled_fields(kind, params):
    """A given sampling rate and threshold of a sample-and-threshold kind (named ``kind``
    in the message) within SAMPLING_RATE_MIN and THRESHOLD_MAX (module docstring).
    ``params``: its parsed section, typed (``SampleAndThresholdParams``,
    ``HeavyHittersParams`` or ``QuantilesParams`` of ``pipelines.kinds``)."""
    rate = params.sampling_rate
    if rate is not None and rate < SAMPLING_RATE_MIN:
        raise SpecError("mechanism.sampling_rate", f"must be >= {SAMPLING_RATE_MIN:g} (the "
                        f"planning limit: a key would need ~threshold / sampling_rate > "
                        f"{1 / SAMPLING_RATE_MIN:g} users to be released, and the binomial "
                        f"tails overflow), got {rate:g}")
    if params.threshold is not None and params.threshold > THRESHOLD_MAX:
        raise SpecError("mechanism.threshold", f"a given threshold must be an integer in "
                        f"[1, {THRESHOLD_MAX}] for {kind} (the planning limit: checking it "
                        f"searches the sampling rate over binomial tails whose cost grows "
                        f"with the threshold, ~10 s at {THRESHOLD_MAX}, docs/performance.md); "
                        f"leave it out to have it calibrated, got {params.threshold}")


def check_weighted_sampling_fields(params):
    """weighted_sampling's sampling threshold and tables within their limits. ``params``:
    its parsed section, typed (``pipelines.kinds.weighted_sampling.WeightedSamplingParams``)."""
    t = params.sampling_threshold
    if t is not None and t < WS_SAMPLING_THRESHOLD_MIN:
        field = "input.sample.threshold" if params.presampled else "mechanism.sampling_threshold"
        raise SpecError(field, f"must be >= {WS_SAMPLING_THRESHOLD_MIN:g} (the planning limit: "
                        f"the tables grow as 1/threshold), got {t:g}")
    _check_pws_table_size(params)


# ppswor's q = 1 - exp(-w t) is 1.0 in float64 only once w t >= 54 ln 2 (e^-wt < 2^-54);
# priority's q = min(1, w t) once w t >= 1. pi <= q, so the automatic table (which ends
# where pi reaches 1) has at least SATURATION_SCALE[scheme] / t rows.
SATURATION_SCALE = {"ppswor": 54 * math.log(2), "priority": 1.0}


def _check_pws_table_size(params):
    """weighted_sampling tables within accounting.pws's caps, before anything is built:
    an explicit max_frequency within the table of its report; an automatic one (where pi
    reaches 1, >= SATURATION_SCALE / t for ppswor / priority) too, or the plan is refused
    naming the threshold (clipping there would silently report large keys with pi < 1)."""
    from thresher.accounting import pws  # heavy: numpy
    report = params.report
    cap, what = ((pws.MAX_KEEP_LENGTH, "keep-probability table") if report == "keys"
                 else (pws.MAX_BAND_ROWS, "frequency table"))
    max_frequency = params.max_frequency
    if max_frequency != "auto":
        if max_frequency > cap:
            raise SpecError("mechanism.max_frequency", f"must be <= {cap} with report: {report} "
                            f"(the planning limit: the largest {what}), got {max_frequency}")
        return
    sampling, t = params.sampling, params.sampling_threshold
    if sampling not in SATURATION_SCALE or t is None:
        return
    scale = SATURATION_SCALE[sampling]
    if scale / t <= cap:
        return
    t_min = float(f"{scale / cap * 1.001:.3g}")
    q_cap = -math.expm1(-cap * t) if sampling == "ppswor" else min(1.0, cap * t)
    field = "input.sample.threshold" if params.presampled else "mechanism.sampling_threshold"
    raise SpecError(field, f"{t:g} with {sampling} sampling and report: {report} needs a "
                    f"{what} of >= {scale / t:.3g} counts before every key is reported (more "
                    f"than {cap}, the planning limit); use a threshold >= {t_min:g}, or set "
                    f"mechanism.max_frequency <= {cap} (larger counts are then treated as it: "
                    f"reported with probability ~{q_cap:.6g})")


def check_release(spec, epsilon, delta, candidates, kind):
    """Limits that depend on the release stage's (epsilon, delta) and the largest bound C
    the plan calibrates; raise SpecError naming the field and what would work.
    ``kind``: the spec's kind object, passed by the plan (this module imports no kind):
    its MAX_KEYS, then its ``check_release_limits``."""
    c = max(candidates)
    field = _bound_field(spec)
    if c > kind.MAX_KEYS:
        raise SpecError(field, f"must be <= {kind.MAX_KEYS} for {kind.name} (the planning "
                        f"limit: calibration is O(max_keys_per_user) per step), got {c}")
    kind.check_release_limits(spec, epsilon, delta, c, field)


def check_gaussian_release(spec, epsilon, delta, c, field, max_keys):
    """gaussian: correlated noise within its calibration's bound; a calibrated sigma
    within SIGMA_MAX (module docstring). ``max_keys``: the kind's MAX_KEYS (named in the
    message)."""
    if spec.mechanism.get("noise") == "correlated" and c > CORRELATED_MAX_KEYS:
        raise SpecError(field, f"must be <= {CORRELATED_MAX_KEYS} for {spec.kind} with noise: "
                        f"correlated (the planning limit of its calibration; noise: "
                        f"discrete_gaussian allows {max_keys}), got {c}")
    if spec.mechanism.get("noise") == "correlated":
        _check_correlated(spec, epsilon, delta, c)
    if spec.mechanism.get("sigma") is None:
        if not _gaussian_fits(epsilon, delta, c, SIGMA_MAX):
            need = _smallest(lambda e: _gaussian_fits(e, delta, c, SIGMA_MAX), epsilon)
            raise SpecError("privacy.epsilon", f"{spec.privacy.epsilon:g} (release stage "
                            f"{epsilon:g}) with delta={delta:g}, max_keys_per_user={c} needs "
                            f"sigma > {SIGMA_MAX:g}, the planning limit; "
                            + _epsilon_advice(need, spec.privacy.epsilon, epsilon,
                                              "a larger delta or a smaller bound"))


def check_adaptive_method(spec, c, field, max_keys):
    """A kind's method calibrated as the adaptive kind (accounting.adaptive; heavy_hitters'
    ``method: adaptive``, which calls this for it): minutes beyond
    WEIGHTED_GAUSSIAN_MAX_KEYS. ``max_keys``: the kind's other method's limit (named in
    the message)."""
    kind = spec.kind
    if c > WEIGHTED_GAUSSIAN_MAX_KEYS:
        raise SpecError(field, f"must be <= {WEIGHTED_GAUSSIAN_MAX_KEYS} for {kind} with "
                        f"method: adaptive (the planning limit of the adaptive calibration; "
                        f"method: trie allows {max_keys}), got {c}")


def check_weighted_sampling_release(spec, epsilon, delta, c):
    """weighted_sampling: the per-key delta above float granularity and the PWS tables of
    the per-key budget within L_MAX (module docstring)."""
    if delta / c < WS_KEY_DELTA_MIN:
        raise SpecError("privacy.delta", f"{delta:g} over max_keys_per_user={c} gives a per-key "
                        f"delta below {WS_KEY_DELTA_MIN:g}, the planning limit of "
                        f"{spec.kind} (float granularity); use delta >= "
                        f"{WS_KEY_DELTA_MIN * c:.3g}")
    # The per-key budget itself (exact optimal composition: O(C) per step, C <= 1e4).
    from thresher.accounting.pws import per_key_budget  # heavy: numpy
    budget = per_key_budget(epsilon, delta, c,
                            composition=spec.mechanism.get("composition") or "optimal")
    length = _length(budget.key_epsilon, budget.key_delta, 1)
    _check_rounding(spec, epsilon, delta, c, budget)
    if length > L_MAX:
        raise SpecError("privacy.epsilon", f"{spec.privacy.epsilon:g} (release stage "
                        f"{epsilon:g}) with delta={delta:g} and max_keys_per_user={c} gives "
                        f"per-key epsilon {budget.key_epsilon:.3g}, delta "
                        f"{budget.key_delta:.3g}, whose PWS tables span ~{length:.3g} counts "
                        f"(> {L_MAX:.0f}, the planning limit of {spec.kind}); use a "
                        f"release epsilon of about {epsilon * length / L_MAX:.3g} or more, "
                        f"or a smaller max_keys_per_user")


def check_levels(spec, epsilon, delta, c, field, level_structure, max_keys):
    """Sample-and-threshold kinds calibrate one contribution at epsilon / (levels * C'),
    C' = c * per_key (``accounting.sample_threshold.calibrate_levels``): the table length
    and the O(C') calibration are checked at what is actually calibrated.
    ``level_structure``: the kind's (levels, contributions per level per unit of C);
    ``max_keys``: its MAX_KEYS."""
    kind = spec.kind
    levels, per_key = level_structure

    def length(e, k):
        return _length(e / levels, delta / levels, k * per_key)

    if c * per_key > max_keys:
        raise SpecError(field, f"times the {per_key} contributions per level a user makes "
                        f"must be <= {max_keys} for {kind} (the planning limit: "
                        f"calibration is O(contributions) per step), got {c} x {per_key}")
    if length(epsilon, c) > L_MAX:
        need = _smallest(lambda e: length(e, c) <= L_MAX, epsilon)
        c_max = _largest_bound(lambda k: length(epsilon, k) <= L_MAX, c)
        split = f" over {levels} levels" if levels > 1 else ""
        raise SpecError("privacy.epsilon", f"{spec.privacy.epsilon:g} (release stage "
                        f"{epsilon:g}{split}) with delta={delta:g} and max_keys_per_user={c} "
                        f"needs thresholds/tables of ~{length(epsilon, c):.3g} counts "
                        f"(> {L_MAX:.0f}, the planning limit for {kind}); "
                        + _epsilon_advice(need, spec.privacy.epsilon, epsilon,
                                          f"max_keys_per_user <= {c_max}" if c_max
                                          else "a larger delta"))


def release_fits(max_keys, level_structure, epsilon, delta, c):
    """True when :func:`check_release`'s bound and table-length limits of a
    sample-and-threshold kind pass at (epsilon, delta, C = c): a kind that calibrates
    while the spec is parsed (heavy_hitters' default method, from release points) asks
    first and leaves the refusal, with its message, to the plan (issue: it calibrated a
    max_keys_per_user of 1e7 for minutes before the plan refused it). The spec's whole
    budget is an upper bound on the release stage's, so a False here is a refusal there."""
    if not (isinstance(c, int) and 1 <= c <= max_keys):
        return False
    levels, per_key = level_structure
    if c * per_key > max_keys:
        return False
    return _length(epsilon / levels, delta / levels, c * per_key) <= L_MAX


def _check_correlated(spec, epsilon, delta, c):
    """noise: correlated (accounting.correlated_gshm): its calibration's work grows as
    sigma (sigma + 2.6 C) at the smallest workable sigma; beyond correlated_gshm.max_sigma(C)
    (~1000 at small C) it runs for minutes (issue 42: 12 min 46 s at epsilon 0.001), so the
    spec is refused here, before any calibration, naming privacy.epsilon."""
    from thresher.accounting import correlated_gshm  # heavy: numpy
    top = correlated_gshm.max_sigma(c)
    if _gaussian_fits(epsilon, delta, c, top):
        return
    need = _smallest(lambda e: _gaussian_fits(e, delta, c, top), epsilon)
    raise SpecError("privacy.epsilon", f"{spec.privacy.epsilon:g} (release stage {epsilon:g}) "
                    f"with delta={delta:g}, max_keys_per_user={c} needs sigma > {top:.4g} for "
                    f"mechanism.noise: correlated, the planning limit of its calibration "
                    f"(noise: discrete_gaussian allows sigma up to {SIGMA_MAX:g}); "
                    + _epsilon_advice(need, spec.privacy.epsilon, epsilon,
                                      "noise: discrete_gaussian, a larger delta or a smaller "
                                      "bound"))


def check_weighted_gaussian(spec, params, epsilon, delta, c):
    """weighted_gaussian (accounting.weighted_gaussian): its calibration is O(C^2) per
    step (C <= 2048: ~2 s); the selection noise sigma * S must be drawable
    (transforms.randomness.samplers.SIGMA_MAX grid units) and the count's sigma within SIGMA_MAX.
    ``params``: its parsed section, typed
    (``pipelines.kinds.weighted_gaussian.WeightedGaussianParams``)."""
    from thresher.accounting import weighted_gaussian as wg  # heavy: numpy
    from thresher.transforms.randomness.samplers import SIGMA_MAX as DRAW_MAX  # heavy: numpy
    largest = DRAW_MAX / wg.WEIGHT_SCALE
    if params.sigma is None and wg.gaussian_part(epsilon, largest, c) > delta:
        raise SpecError("privacy.epsilon", f"{spec.privacy.epsilon:g} (selection stage "
                        f"{epsilon:g}) with delta={delta:g}, max_keys_per_user={c} needs "
                        f"selection noise sigma > {largest:g} user weights, the planning limit; "
                        f"use a larger epsilon or delta")
    count_eps, count_delta = wg.count_budget(epsilon, delta, params.count_fraction)
    counted = wg.count_bound(c, params.count_keys_per_user)
    if not _gaussian_fits(count_eps, count_delta, counted, SIGMA_MAX):
        raise SpecError("privacy.epsilon", f"{spec.privacy.epsilon:g} gives the count stage "
                        f"epsilon {count_eps:g}, delta {count_delta:g}, which needs count sigma "
                        f"> {SIGMA_MAX:g} at {counted} counts per user, the planning limit; use "
                        f"a larger epsilon, delta or mechanism.count_fraction")


def _check_rounding(spec, epsilon, delta, c, budget):
    """weighted_sampling verifies the sampled (float) distributions exactly; their rounding
    adds ~``accounting.pws.rounding_excess`` to the per-key delta, which grows as
    e^eps0: beyond the per-key delta no table can pass (it used to loop; issue 18)."""
    from thresher.accounting.pws import rounding_excess  # heavy: numpy
    report = spec.mechanism.get("report", "keys_and_frequencies")
    e0, d0 = budget.key_epsilon, budget.key_delta
    excess = rounding_excess(e0, d0, report)
    if excess <= d0:
        return
    where = (f"epsilon={spec.privacy.epsilon:g} (release stage {epsilon:g}), delta={delta:g} and "
             f"max_keys_per_user={c} give per-key epsilon {e0:.3g} and delta {d0:.3g}; "
             f"floating-point rounding of the sampled distributions adds ~{excess:.2g} at that "
             f"epsilon, more than the per-key delta (the planning limit of weighted_sampling)")
    # smallest delta (the per-key delta scales with it) and largest epsilon that fit, x2 safety
    factor = _smallest(lambda f: rounding_excess(e0, d0 * f, report) <= d0 * f / 2, 1.0)
    if factor == factor and delta * factor < 1.0:
        raise SpecError("privacy.delta", f"{where}; use delta >= "
                        f"{delta * factor:.2g} or a smaller epsilon")
    scale = 1.0
    while scale > 1e-6 and rounding_excess(e0 * scale, d0, report) > d0 / 2:
        scale /= 1.25
    raise SpecError("privacy.epsilon", f"{where}; use a release epsilon of about "
                    f"{epsilon * scale:.3g} or less")


def _length(epsilon, delta, c):
    """L(epsilon/C, delta/C) of PWS eq. (4), ~ (C/epsilon) ln(C/delta)."""
    e, d = epsilon / c, delta / c
    if e > 50:
        return 1.0
    # pws_L rewritten without cancellation: ln(1 + expm1(e) (1 - d) / (d (e^e + 1))) / e
    return math.log1p(math.expm1(e) * (1.0 - d) / (d * (math.exp(e) + 1.0))) / e


def _gaussian_fits(epsilon, delta, c, sigma):
    """delta_+(C, epsilon) <= delta at this sigma: some threshold then works (gshm). Kept
    in the thresher command's cache (pipelines/common/calibration_cache.py) like a calibration."""
    return cached("limits.gaussian_fits", _gaussian_fits_computed,
                  _gaussian_fits_verified)(epsilon, delta, c, sigma)


def _gaussian_fits_verified(value, epsilon, delta, c, sigma):
    """Forward check of a cached answer: only True is kept, and only when the plain-math
    upper bound (accounting.plain_gshm, no SciPy) shows it."""
    from thresher.accounting import plain_gshm  # heavy: start-up of thresher validate
    return value is True and plain_gshm.gaussian_fits(epsilon, delta, c, sigma)


def _gaussian_fits_computed(epsilon, delta, c, sigma):
    from thresher.accounting.discrete_gaussian import composed_shift_delta  # heavy: numpy
    return float(composed_shift_delta(epsilon, sigma, c, method="bound")) <= delta


# Iteration caps of _smallest, whatever ok and start are (issue 30 D1: a release epsilon of
# 0 doubled 0 forever): doubling from >= 2^-1074 passes EPSILON_MAX within 1,090 steps; the
# 1% bisection of a bracket [x, 2^k x] needs ~log2(k / 0.01) < 20 steps.
_DOUBLINGS_MAX = 1100
_BISECTIONS_MAX = 200


def _epsilon_advice(need, spec_epsilon, release_epsilon, others):
    """The refusal's advice: "use a release epsilon >= X or <others>" for the smallest
    release epsilon that fits (from :func:`_smallest`), or, when none up to what
    privacy.epsilon <= EPSILON_MAX gives the stage fits (_smallest's nan), "use <others>
    (no release epsilon up to Y fits)" -- never "nan". ``others``: the other remedies."""
    if math.isfinite(need):
        return f"use a release epsilon >= {need:.3g} or {others}"
    largest = EPSILON_MAX * release_epsilon / spec_epsilon if spec_epsilon > 0 else EPSILON_MAX
    return (f"use {others} (no release epsilon up to {largest:.3g}, what privacy.epsilon "
            f"<= {EPSILON_MAX:g} gives this stage, fits)")


def _smallest(ok, start):
    """Smallest epsilon >= start (to 1%) with ok(epsilon), ok monotone; nan if there is
    none <= EPSILON_MAX, or start is not a positive finite number. Bounded in iterations
    regardless of its input (at most _DOUBLINGS_MAX + _BISECTIONS_MAX calls of ok)."""
    if not (math.isfinite(start) and start > 0):
        return math.nan
    high = start
    for _ in range(_DOUBLINGS_MAX):
        if ok(high):
            break
        high *= 2
        if high > EPSILON_MAX:
            return math.nan
    else:
        return math.nan
    low = start
    for _ in range(_BISECTIONS_MAX):
        if high / low <= 1.01:
            break
        mid = math.sqrt(low * high)
        if ok(mid):
            high = mid
        else:
            low = mid
    return high


def _largest_bound(ok, c):
    """Largest integer k < c with ok(k) (ok monotone decreasing in k); 0 if none."""
    if not ok(1):
        return 0
    first_bad = smallest_integer(lambda k: not ok(k), 1, c)
    return (c if first_bad is None else first_bad) - 1


def check_adaptive(spec, params, epsilon, delta, c):
    """adaptive (accounting.adaptive): the rounds and the count share one base noise s,
    about the continuous Gaussian sigma for the release's (epsilon, delta); round r draws
    s / sqrt((1 - f_c) w_r) user weights, whose sigma * S must be drawable, and the count
    s sqrt(C_c / f_c), within SIGMA_MAX (the calibration checks its exact values again).
    ``params``: its parsed section, typed (``pipelines.kinds.adaptive.AdaptiveParams``)."""
    from thresher.accounting import adaptive as ad  # heavy: numpy
    from thresher.accounting import gaussian  # heavy: numpy
    from thresher.accounting import weighted_gaussian as wg  # heavy: numpy
    base = gaussian.sigma_for(epsilon, (1.0 - ad.THRESHOLD_DELTA_SHARE) * delta, rel_tol=1e-6)
    c_count = wg.count_bound(c, params.count_keys_per_user)
    rounds, count_sigma = ad.stage_sigmas(base, params.round_fractions, params.count_fraction,
                                          c_count)
    for i, s in enumerate(rounds, start=1):
        if s * wg.WEIGHT_SCALE > ad.GRID_SIGMA_MAX:
            raise SpecError("mechanism.round_fractions", f"round {i} gets the share "
                            f"{params.round_fractions[i - 1]:g} of the noise budget "
                            f"(privacy.epsilon {spec.privacy.epsilon:g}), which needs selection "
                            f"noise sigma > {ad.GRID_SIGMA_MAX / wg.WEIGHT_SCALE:g} user "
                            "weights, the sampler's range; give the round a larger share or "
                            "use a larger privacy.epsilon or delta")
    if count_sigma > ad.COUNT_SIGMA_MAX:
        raise SpecError("privacy.epsilon", f"{spec.privacy.epsilon:g} gives the count stage "
                        f"noise sigma > {ad.COUNT_SIGMA_MAX:g} at {c_count} counts per user, the "
                        "planning limit; use a larger epsilon, delta, "
                        "mechanism.count_fraction or a smaller mechanism.count_keys_per_user")

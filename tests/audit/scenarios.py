"""Audit scenarios: each mechanism's kernel, a worst-case neighbouring pair, and its claim.

A :class:`Scenario` bundles what :func:`tests.audit.auditor.audit` needs: two samplers of
outcome codes (the mechanism run on D and on D', vectorised over trials) and the claimed
(epsilon, delta). Honest scenarios take their parameters from the project's calibration
functions (``accounting.*.calibrate``) at inflated budgets (delta ~ 1e-3, where the
events that carry delta are measurable with 10**6 trials) and claim the delta those
functions report as achieved. Mutations change one thing the way a known bug does and
claim what the buggy library would claim (the budget it was asked for).

Neighbouring pairs (the worst cases of the analyses; mechanisms.md):
  pre_threshold  each of the user's keys at count tau (D) vs tau - 1 (D': never released)
  shift          each of the user's keys at a large count k vs k - 1 (always released)
  mixed          some keys of each kind (paper 004 Thm 5.4's a_= / a_+ split)
  user_at_bound  a user with more keys than the bound C, through the real bounding kernel

Kernels a scenario needs but that do not exist yet raise :class:`MissingKernel`; the
tests skip on it with the reason.
"""
import dataclasses
import importlib
import math

import numpy as np

from tests.audit import auditor

EPSILON = 1.0
DELTA = 1e-3
TRIALS = 10**6


class MissingKernel(Exception):
    """A module the scenario audits is not in the tree yet."""


def _module(name):
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as err:
        if err.name == name:
            raise MissingKernel(f"{name} does not exist yet") from err
        raise


@dataclasses.dataclass(frozen=True)
class Scenario:
    mechanism: str
    case: str
    claimed_epsilon: float
    claimed_delta: float
    run_d: object
    run_d_prime: object
    events: str = "both"
    trials: int = TRIALS
    mutation: str = ""           # empty for an honest scenario
    parameters: str = ""

    @property
    def name(self):
        return f"{self.mechanism} / {self.mutation or 'honest'} / {self.case}"

    def audit(self, seed=0, trials=None):
        return auditor.audit(self.run_d, self.run_d_prime, claimed_epsilon=self.claimed_epsilon,
                             claimed_delta=self.claimed_delta, trials=trials or self.trials,
                             seed=seed, events=self.events)


# ---------------------------------------------------------------------------------------
# NoisyThreshold (GSHM and Laplace thresholding): transforms.selection.noisy_threshold kernel.

def _pair_counts(pair, keys, pre_threshold, high):
    """(D counts, D' counts) for one trial's keys."""
    if pair == "pre_threshold":
        return [pre_threshold] * keys, [pre_threshold - 1] * keys
    if pair == "shift":
        return [high] * keys, [high - 1] * keys
    if pair == "mixed":
        at_pre = keys // 2
        return ([pre_threshold] * at_pre + [high] * (keys - at_pre),
                [pre_threshold - 1] * at_pre + [high - 1] * (keys - at_pre))
    raise ValueError(pair)


def _noisy_threshold_runner(counts, *, noise, scale, pre_threshold, threshold):
    kernel = _module("thresher.transforms.selection.noisy_threshold").noisy_threshold
    row = np.asarray(counts, dtype=np.int64)

    def run(rng, n):
        keep, values = kernel(np.tile(row, n), noise=noise, scale=scale,
                              pre_threshold=pre_threshold, threshold=threshold, rng=rng)
        return auditor.released_count_and_sum(keep.reshape(n, row.size), values.reshape(n, row.size))
    return run


def _noisy_threshold_scenario(mechanism, case, *, pair, keys, noise, scale, pre_threshold,
                              threshold, claimed_epsilon, claimed_delta, mutation="", params=""):
    high = int(math.ceil(threshold + 12 * scale + 12))
    d, d_prime = _pair_counts(pair, keys, pre_threshold, high)
    kw = dict(noise=noise, scale=scale, pre_threshold=pre_threshold, threshold=threshold)
    return Scenario(mechanism=mechanism, case=case, claimed_epsilon=claimed_epsilon,
                    claimed_delta=claimed_delta, run_d=_noisy_threshold_runner(d, **kw),
                    run_d_prime=_noisy_threshold_runner(d_prime, **kw), mutation=mutation,
                    parameters=params or f"{noise} scale={scale:.4g}, tau={pre_threshold}, "
                                         f"T={threshold:g}, {keys} key(s)")


GSHM = "GSHM (noisy_threshold, discrete Gaussian)"
LAPLACE = "Laplace thresholding l0 (noisy_threshold, discrete Laplace)"


def gshm(pair, *, keys=1, epsilon=EPSILON, delta=DELTA, mutation=""):
    """GSHM calibrated by accounting.gshm.calibrate (exact Thm 5.4, discrete noise).

    Mutations: "threshold - 1", "sigma / 2", "continuous formula" (sigma and threshold
    from the continuous-Gaussian accounting, discrete noise drawn: claimed at epsilon=2,
    delta=2e-3 where the rounding of the threshold bites), "composition ignored"
    (calibrated for 1 key per user, the user touches ``keys`` keys)."""
    acc = _module("thresher.accounting.gshm")
    calibrated_keys = 1 if mutation == "composition ignored" else keys
    if mutation == "continuous formula":
        epsilon, delta = 2.0, 2e-3
        p = acc.calibrate(epsilon, delta, calibrated_keys, noise="gaussian")
    else:
        p = acc.calibrate(epsilon, delta, calibrated_keys, noise="discrete_gaussian")
    sigma, threshold = p.sigma, p.threshold
    if mutation == "threshold - 1":
        threshold -= 1
    elif mutation == "sigma / 2":
        sigma /= 2
    elif mutation not in ("", "continuous formula", "composition ignored"):
        raise ValueError(mutation)
    claimed = p.delta if not mutation else delta
    return _noisy_threshold_scenario(
        GSHM, pair, pair=pair, keys=keys, noise="gaussian", scale=sigma,
        pre_threshold=p.pre_threshold, threshold=threshold, claimed_epsilon=epsilon,
        claimed_delta=claimed, mutation=mutation)


def laplace_threshold(pair, *, keys=1, epsilon=EPSILON, delta=DELTA, mutation=""):
    """Laplace thresholding, l0 model, calibrated by accounting.laplace_threshold.calibrate.

    Mutations: "threshold - 1", "scale / 2", "composition ignored" (scale and threshold
    for 1 key per user), and "continuous formula": the anchor bug of a continuous Laplace
    tail e^(-g/b)/2 used for integer noise, whose tail is q^g/(1+q), up to 2/(1+e^-1) =
    1.46 times larger at b = 1. The buggy library takes the smallest integer threshold
    meeting its (continuous) formula and reports the delta that formula gives there;
    the budget 1.3e-3 puts that threshold where the formula is nearly tight (gap 6)."""
    acc = _module("thresher.accounting.laplace_threshold")
    calibrated_keys = 1 if mutation == "composition ignored" else keys
    if mutation == "continuous formula":
        delta = 1.3e-3
        scale = acc.sensitivity_scale(keys, epsilon)
        threshold = math.ceil(acc.min_threshold(epsilon, delta, scale, keys, noise="laplace"))
        claimed = acc.delta(epsilon, scale, threshold, keys, noise="laplace")
        return _noisy_threshold_scenario(
            LAPLACE, pair, pair=pair, keys=keys, noise="laplace", scale=scale, pre_threshold=1,
            threshold=threshold, claimed_epsilon=epsilon, claimed_delta=claimed,
            mutation=mutation)
    p = acc.calibrate(epsilon, delta, calibrated_keys, model="l0", noise="discrete_laplace")
    scale, threshold = p.scale, p.threshold
    if mutation == "threshold - 1":
        threshold -= 1
    elif mutation == "scale / 2":
        scale /= 2
    elif mutation not in ("", "composition ignored"):
        raise ValueError(mutation)
    claimed = p.delta if not mutation else delta
    return _noisy_threshold_scenario(
        LAPLACE, pair, pair=pair, keys=keys, noise="laplace", scale=scale,
        pre_threshold=p.pre_threshold, threshold=threshold, claimed_epsilon=epsilon,
        claimed_delta=claimed, mutation=mutation)


# ---------------------------------------------------------------------------------------
# Correlated noise (noisy_threshold with a shared component, accounting.correlated_gshm).

CORRELATED = "correlated GSHM (noisy_threshold, shared + independent discrete Gaussian)"


def correlated_gshm(pair, *, keys=2, witnesses=0, shared_ratio=None, epsilon=EPSILON,
                    delta=DELTA, mutation="", trials=TRIALS):
    """Correlated noise at C = ``keys``: calibrated by accounting.correlated_gshm.calibrate,
    or, with ``shared_ratio``, a shared scale of shared_ratio * sigma at the calibrated sigma
    and the smallest threshold Theorem 1 allows there. Each trial draws one shared value
    for all its keys (the kernel's ``shared`` per key); ``witnesses`` keys of other users
    at a high count reveal it. Mutation "shared ignored": the threshold that paper 004's
    delta at sigma alone would allow, claimed at that delta (an accounting that forgot
    the shared draw)."""
    acc = _module("thresher.accounting.correlated_gshm")
    kernel = _module("thresher.transforms.selection.noisy_threshold").noisy_threshold
    samplers = _module("thresher.transforms.randomness.samplers")
    gshm_acc = _module("thresher.accounting.gshm")
    p = acc.calibrate(epsilon, delta, keys)
    sigma, shared, threshold, claimed = p.sigma, p.shared_sigma, p.threshold, p.delta
    if shared_ratio is not None:
        shared = shared_ratio * sigma
        gap = acc.min_threshold_gap(epsilon, delta, sigma, shared, keys)
        threshold = p.pre_threshold + gap
        claimed = acc.delta(epsilon, sigma, shared, gap, keys)
    if mutation == "shared ignored":
        gap = gshm_acc.min_threshold_gap(epsilon, delta, sigma, keys, noise="discrete_gaussian")
        threshold = p.pre_threshold + gap
        claimed = gshm_acc.delta(epsilon, sigma, gap, keys, noise="discrete_gaussian")
    elif mutation:
        raise ValueError(mutation)
    high = int(math.ceil(threshold + 12 * (sigma + shared) + 12))
    d, d_prime = _pair_counts(pair, keys, p.pre_threshold, high)
    d, d_prime = d + [high] * witnesses, d_prime + [high] * witnesses

    def runner(counts):
        row = np.asarray(counts, dtype=np.int64)

        def run(rng, n):
            z = samplers.discrete_gaussian(rng, shared, n)
            keep, values = kernel(np.tile(row, n), noise="correlated", scale=sigma,
                                  pre_threshold=p.pre_threshold, threshold=threshold, rng=rng,
                                  shared=np.repeat(z, row.size))
            keep, values = keep.reshape(n, row.size), values.reshape(n, row.size)
            if witnesses:    # the user's keys' values less the witnesses' mean (z's estimate)
                est = np.rint(values[:, keys:].mean(axis=1) - high).astype(np.int64)
                values = values.copy()
                values[:, :keys] -= np.where(keep[:, :keys], est[:, None], 0)
            return auditor.released_count_and_sum(keep[:, :keys], values[:, :keys])
        return run
    return Scenario(mechanism=CORRELATED, case=pair + (f"+{witnesses}w" if witnesses else ""),
                    claimed_epsilon=epsilon, claimed_delta=claimed, run_d=runner(d),
                    run_d_prime=runner(d_prime), mutation=mutation, trials=trials,
                    parameters=f"sigma={sigma:.4g}, shared={shared:.4g}, T={threshold}, "
                               f"{keys} key(s), {witnesses} witness key(s)")


# ---------------------------------------------------------------------------------------
# Contribution bounding (transforms.bounding.per_user_bound.bound_l0) feeding GSHM.

BOUNDING = "PerUserBound l0 + GSHM"


def bounded_gshm(*, user_keys=10, copies=3, bound=1, epsilon=2.0, delta=DELTA, mutation="",
                 trials=200_000):
    """A user at (and above) the bound: D' has every one of ``user_keys`` keys at count
    tau - 1 (never released); D adds a user holding all of them, each ``copies`` times.
    The real bounding kernel keeps ``bound`` distinct keys once each; mutation "bounding
    skipped" keeps every record. GSHM is calibrated for max_keys_per_user = bound."""
    bound_l0 = _module("thresher.transforms.bounding.per_user_bound").bound_l0
    hashing = _module("thresher.transforms.randomness.hashing")
    kernel = _module("thresher.transforms.selection.noisy_threshold").noisy_threshold
    p = _module("thresher.accounting.gshm").calibrate(epsilon, delta, bound, noise="discrete_gaussian")
    if mutation not in ("", "bounding skipped"):
        raise ValueError(mutation)
    key_hashes = hashing.mix64(np.arange(1, user_keys + 1, dtype=np.uint64))
    base = p.pre_threshold - 1

    def release(rng, added):
        n = added.shape[0]
        counts = (base + added).reshape(-1)
        keep, values = kernel(counts, noise="gaussian", scale=p.sigma,
                              pre_threshold=p.pre_threshold, threshold=p.threshold, rng=rng)
        return auditor.released_count_and_sum(keep.reshape(n, user_keys),
                                              values.reshape(n, user_keys))

    def run_d(rng, n):
        # one user per trial, with user_keys * copies records
        user = np.repeat(hashing.mix64(np.arange(n, dtype=np.uint64) + np.uint64(7)),
                         user_keys * copies)
        keys = np.tile(np.repeat(key_hashes, copies), n)
        if mutation == "bounding skipped":
            kept = np.arange(user.size)
        else:
            kept = bound_l0(user, keys, bound, rng)
        trial = kept // (user_keys * copies)
        key_index = (kept % (user_keys * copies)) // copies
        added = np.zeros((n, user_keys), dtype=np.int64)
        np.add.at(added, (trial, key_index), 1)
        return release(rng, added)

    def run_d_prime(rng, n):
        return release(rng, np.zeros((n, user_keys), dtype=np.int64))

    return Scenario(mechanism=BOUNDING, case="user_at_bound", claimed_epsilon=epsilon,
                    claimed_delta=p.delta if not mutation else delta, run_d=run_d,
                    run_d_prime=run_d_prime, trials=trials, mutation=mutation,
                    parameters=f"C={bound}, user with {user_keys} keys x {copies} records, "
                               f"sigma={p.sigma:.4g}, T={p.threshold}")


# ---------------------------------------------------------------------------------------
# Rand-clip (transforms.bounding.rand_clip) feeding Laplace thresholding in the l1 model.

RAND_CLIP = "RandClip l1 + Laplace thresholding"


def rand_clip_laplace(*, layout=(9,), bound=3, base="pre_threshold", epsilon=EPSILON,
                      delta=DELTA, mutation="", trials=500_000):
    """A user holding ``layout[j]`` records of key j (more than C in total). D' has every
    key at ``base``: tau - 1 (the user's keys appear with the user) or a count far above
    the threshold (the user's records shift them). The real rand-clip keeps min(m, C)
    uniformly random records; mutation "clipping skipped" keeps them all. Laplace
    thresholding is calibrated by accounting.laplace_threshold (model "l1", C = bound)."""
    rand_clip = _module("thresher.transforms.bounding.rand_clip").rand_clip
    kernel = _module("thresher.transforms.selection.noisy_threshold").noisy_threshold
    p = _module("thresher.accounting.laplace_threshold").calibrate(epsilon, delta, bound, model="l1")
    if mutation not in ("", "clipping skipped"):
        raise ValueError(mutation)
    layout = np.asarray(layout, dtype=np.int64)
    keys, records = layout.size, int(layout.sum())
    record_key = np.repeat(np.arange(keys), layout)
    start = p.pre_threshold - 1 if base == "pre_threshold" else int(p.threshold + 15 * p.scale)

    def release(rng, added):
        n = added.shape[0]
        keep, values = kernel((start + added).reshape(-1), noise="laplace", scale=p.scale,
                              pre_threshold=p.pre_threshold, threshold=p.threshold, rng=rng)
        return auditor.released_count_and_sum(keep.reshape(n, keys), values.reshape(n, keys))

    def run_d(rng, n):
        users = np.repeat(np.arange(n, dtype=np.int64), records)
        kept = (np.ones(users.size, dtype=bool) if mutation else rand_clip(users, rng, bound))
        added = np.zeros((n, keys), dtype=np.int64)
        np.add.at(added, (users[kept], np.tile(record_key, n)[kept]), 1)
        return release(rng, added)

    def run_d_prime(rng, n):
        return release(rng, np.zeros((n, keys), dtype=np.int64))

    return Scenario(mechanism=RAND_CLIP, case=f"user with records {tuple(layout.tolist())}, "
                                              f"keys at {base}",
                    claimed_epsilon=epsilon, claimed_delta=p.delta if not mutation else delta,
                    run_d=run_d, run_d_prime=run_d_prime, trials=trials, mutation=mutation,
                    parameters=f"C={bound}, scale={p.scale:.4g}, T={p.threshold}")


# ---------------------------------------------------------------------------------------
# SampleAndThreshold (transforms.selection.sample_and_threshold; accounting.sample_threshold).

SAMPLE_THRESHOLD = "SampleAndThreshold"


def sample_and_threshold(*, keys=1, epsilon=EPSILON, delta=DELTA, mutation="", k=None,
                         sampling_rate=None, trials=TRIALS, composition="basic"):
    """Poisson sampling at rate p, release sampled counts >= tau, calibrated by
    accounting.sample_threshold.calibrate. Pair: k vs k - 1 contributions on each of the
    user's keys; k defaults to where the exact per-key divergence
    (accounting.sample_threshold.divergences) is largest; k="threshold" puts every key at
    the (possibly mutated) threshold, where D' can never release it.

    ``composition``: "basic" or "pld" (accounting.sample_threshold.pld, the kind's default
    with a fixed bound). Mutations: "threshold - 1", "composition ignored" (per-key budget
    of 1 key)."""
    kernel = _module("thresher.transforms.selection.sample_and_threshold").sample_and_threshold
    acc = _module("thresher.accounting.sample_threshold")
    calibrated_keys = 1 if mutation == "composition ignored" else keys
    p = acc.calibrate(epsilon, delta, calibrated_keys, sampling_rate=sampling_rate,
                      composition=composition)
    rate, threshold = p.sampling_rate, p.threshold
    if mutation == "threshold - 1":
        threshold -= 1
    elif mutation not in ("", "composition ignored"):
        raise ValueError(mutation)
    if k == "threshold":
        k = threshold
    elif k is None:
        candidates = np.arange(max(1, threshold), int(4 * threshold / rate) + 2)
        per_key_eps = p.per_key_epsilon or epsilon / keys  # pld: no per-key budget
        add, remove = acc.divergences(per_key_eps, rate, threshold, candidates)
        k = int(candidates[int(np.argmax(np.maximum(add, remove)))])

    def runner(count):
        def run(rng, n):
            keep, values = kernel(np.full(n * keys, count, dtype=np.int64),
                                  sampling_rate=rate, threshold=threshold, rng=rng)
            return auditor.released_count_and_sum(np.asarray(keep).reshape(n, keys),
                                                  np.asarray(values).reshape(n, keys))
        return run

    return Scenario(mechanism=SAMPLE_THRESHOLD, case=f"k={k} vs k-1", claimed_epsilon=epsilon,
                    claimed_delta=p.delta_spent if not mutation else delta,
                    run_d=runner(k), run_d_prime=runner(k - 1), mutation=mutation,
                    trials=trials,
                    parameters=f"p={rate:.4g}, tau={threshold}, {keys} key(s), {composition}")


# ---------------------------------------------------------------------------------------
# SanitizeSample (transforms.selection.sanitize_sample.sanitize; accounting.pws).

PWS = "SanitizeSample (PWS)"


def _worst_frequency(keep, keys, epsilon):
    """The frequency i whose pair (pi_{i-1}, pi_i), on all ``keys`` keys at once, has the
    largest exact hockey-stick divergence at epsilon (the number of reported keys is a
    sufficient statistic: a binomial sum), in either direction."""
    from scipy import stats
    k = np.arange(keys + 1)
    e = math.exp(epsilon)
    best, best_i = -1.0, 1
    for i in range(1, len(keep)):
        pa, pb = stats.binom.pmf(k, keys, keep[i - 1]), stats.binom.pmf(k, keys, keep[i])
        d = max(np.maximum(0, pb - e * pa).sum(), np.maximum(0, pa - e * pb).sum())
        if d > best:
            best, best_i = d, i
    return best_i


def pws(*, keys=1, frequency=1, report="keys", epsilon=EPSILON, delta=DELTA, mutation="",
        composition="optimal"):
    """One key per user-key at frequency i (D) vs i - 1 (D'; i = 1 means the key is absent
    from D'). Mutation "composition ignored": tables built for 1 key per user while the
    user's ``keys`` keys all move. ``composition="pld"`` (accounting.pws.pld, keys only):
    the Gaussian-tradeoff table; its "composition ignored" mutation builds that table for
    the Gaussian budget of one key (mu from the whole epsilon) while ``keys`` keys move.
    ``frequency="worst"``: the frequency of :func:`_worst_frequency` at epsilon / 2."""
    sanitize = _module("thresher.transforms.selection.sanitize_sample").sanitize
    acc = _module("thresher.accounting.pws")
    calibrated_keys = 1 if mutation == "composition ignored" else keys
    if mutation not in ("", "composition ignored"):
        raise ValueError(mutation)
    if composition == "pld" and mutation:
        pld = _module("thresher.accounting.pws.pld")
        budget = pld.best_budget(epsilon, delta, 1)
        keep, mu, _ = pld.build(lambda m: acc.sampling_probabilities(m), budget, 100_000)
        table, described = None, f"pld table for 1 key (mu={mu:.3g})"
    else:
        params = acc.calibrate(epsilon, delta, calibrated_keys, report=report,
                               composition=composition)
        tables = acc.release_tables(params)
        keep, table = tables.keep, tables.table
        described = (f"key mu={params.key_mu:.3g}, delta0={params.key_delta0:.3g}"
                     if params.key_mu is not None else
                     f"key eps={params.key_epsilon:.3g}, key delta={params.key_delta:.3g}")
        if composition == "pld":
            assert params.key_mu is not None, "the pld scenario must audit the Gaussian table"
    if frequency == "worst":
        frequency = _worst_frequency(keep, keys, epsilon / 2)

    def runner(freq):
        def run(rng, n):
            if freq == 0:
                return auditor.released_count_and_sum(np.zeros((n, keys), bool),
                                                      np.zeros((n, keys), np.int64))
            keep_out, tokens = sanitize(np.full(n * keys, freq, dtype=np.int64),
                                        keep_probabilities=keep, frequency_table=table, rng=rng)
            tokens = np.where(keep_out, tokens, 0) if report == "keys" else tokens
            return auditor.released_count_and_sum(keep_out.reshape(n, keys),
                                                   tokens.reshape(n, keys))
        return run

    return Scenario(mechanism=PWS, case=f"frequency {frequency} vs {frequency - 1}"
                    + (f", {keys} keys" if keys > 1 else ""),
                    claimed_epsilon=epsilon,
                    claimed_delta=params.delta_realized if not mutation else delta,
                    run_d=runner(frequency), run_d_prime=runner(frequency - 1),
                    mutation=mutation, events="likelihood" if report != "keys" else "both",
                    parameters=f"report={report}, {keys} key(s), composition={composition}, "
                               + described)


# ---------------------------------------------------------------------------------------
# Exponential mechanism (accounting.selection.exponential_mechanism).

SELECTION = "Exponential mechanism (selection)"


def exponential_mechanism(*, candidates=10, epsilon=EPSILON, mutation="", trials=40_000):
    """Scores u(D) = (Delta, 0, ..., 0), u(D') = (0, Delta, ..., Delta): every score moves
    by the sensitivity, in opposite directions for the first candidate (the worst case of
    the factor 2). Mutations: "monotone factor on non-monotone scores" (exponent eps u /
    Delta), "sensitivity / 2", "composition ignored" (two selections, charged once)."""
    mechanism = _module("thresher.accounting.selection").ExponentialMechanism
    sensitivity = 3.0
    d = np.zeros(candidates + 1)
    d[0] = sensitivity
    d_prime = np.full(candidates + 1, sensitivity)
    d_prime[0] = 0.0
    monotone = mutation == "monotone factor on non-monotone scores"
    used_sensitivity = sensitivity / 2 if mutation == "sensitivity / 2" else sensitivity
    rounds = 2 if mutation == "composition ignored" else 1
    if mutation not in ("", "monotone factor on non-monotone scores", "sensitivity / 2",
                        "composition ignored"):
        raise ValueError(mutation)

    def runner(scores):
        # the mechanism's own sampler (exponential_mechanism draws through it): the exact
        # exponents once per side, each draw exactly one call of exponential_mechanism
        select = mechanism(scores, epsilon, used_sensitivity, monotone=monotone).draw

        def run(rng, n):
            out = np.zeros(n, dtype=np.int64)
            for i in range(n):
                code = 0
                for _ in range(rounds):
                    code = code * (candidates + 1) + select(rng)
                out[i] = code
            return out
        return run

    return Scenario(mechanism=SELECTION, case=f"{candidates + 1} candidates, opposite shifts",
                    claimed_epsilon=epsilon, claimed_delta=0.0, run_d=runner(d),
                    run_d_prime=runner(d_prime), events="likelihood", trials=trials,
                    mutation=mutation, parameters=f"sensitivity={sensitivity}")


# ---------------------------------------------------------------------------------------
# Count + clamped sum (issue 14): transforms.values.aggregate_values on top of noisy_threshold.

COUNT_AND_SUM = "GSHM count + grid sum (aggregate_values, discrete Gaussian)"


def count_and_sum(pair, *, sensitivity=4, epsilon=EPSILON, delta=DELTA, mutation=""):
    """One key per user (C = 1) released as (count, clamped grid sum), calibrated jointly
    by accounting.gshm.calibrate(aggregates=...) (accounting.aggregates). D: the user
    moves the count by 1 and the sum by ``sensitivity`` grid units (the worst case).

    Codes: D * count + w * sum, w = 1 (honest; the likelihood ratio of the shift is
    increasing in it when sigma_sum = D sigma) or 4 (mutation "sum noise / 2": sigma_sum
    = D sigma / 2, whose likelihood ratio is increasing in D count + 4 sum). Keys not
    released are coded below all others (released_count_and_sum)."""
    acc = _module("thresher.accounting.gshm")
    kernel = _module("thresher.transforms.values.aggregate_values")
    from thresher.transforms.selection.noisy_threshold import noisy_threshold
    d = int(sensitivity)
    p = acc.calibrate(epsilon, delta, 1, noise="discrete_gaussian", aggregates=((d, 1.0),))
    sum_sigma = d * p.sigma
    weight = 1
    if mutation == "sum noise / 2":
        sum_sigma /= 2
        weight = 4
    elif mutation:
        raise ValueError(mutation)
    params = {"aggregates": [{"column": "x", "statistic": "sum", "output": "x_sum",
                              "clip": [0.0, float(d)], "sum_column": 0, "grid_scale": 1.0,
                              "noise": "discrete_gaussian", "sigma_grid_units": sum_sigma}]}
    high = int(math.ceil(p.threshold + 12 * p.sigma + 12))
    base_sum = 10 * d
    if pair == "shift":
        d_rows, d_prime_rows = (high, base_sum + d), (high - 1, base_sum)
    elif pair == "pre_threshold":
        d_rows, d_prime_rows = (p.pre_threshold, d), (p.pre_threshold - 1, 0)
    else:
        raise ValueError(pair)

    def runner(row):
        count, grid_sum = row

        def run(rng, n):
            keep, noisy = noisy_threshold(np.full(n, count, dtype=np.int64), noise="gaussian",
                                          scale=p.sigma, pre_threshold=p.pre_threshold,
                                          threshold=p.threshold, rng=rng)
            sums = np.zeros(n, dtype=np.int64)
            out = kernel.noisy_outputs(noisy[keep], {0: np.full(int(keep.sum()), grid_sum)},
                                       params, rng)["x_sum"]
            sums[keep] = np.rint(out).astype(np.int64)
            values = d * noisy + weight * sums
            return auditor.released_count_and_sum(keep.reshape(n, 1), values.reshape(n, 1))
        return run

    claimed = p.delta if not mutation else delta
    return Scenario(mechanism=COUNT_AND_SUM, case=pair, claimed_epsilon=epsilon,
                    claimed_delta=claimed, run_d=runner(d_rows), run_d_prime=runner(d_prime_rows),
                    events="threshold", mutation=mutation,
                    parameters=f"sigma={p.sigma:.4g}, sum sigma={sum_sigma:.4g} grid units, "
                               f"D={d}, T={p.threshold}")


# ---------------------------------------------------------------------------------------
# ---------------------------------------------------------------------------------------
# Weighted Gaussian selection (transforms.selection.weighted_threshold) through the real l0 bound
# and grid-weight kernels.

WEIGHTED = "Weighted Gaussian selection (per_user_bound + weighted_threshold, grid weights)"


def weighted_gaussian(pair, *, keys=4, user_keys=None, epsilon=EPSILON, delta=DELTA,
                      mutation="", counts=False, trials=400_000, count_cap=None):
    """One user per trial holding ``user_keys`` (>= keys) keys; the real bound keeps
    ``keys`` = Delta0 of them and the real kernel gives each the weight q_t. D' has every
    key at total weight 0 (pair "pre_threshold": the keys are absent without the user)
    or at T - q_t / 2 ("near_threshold": the user's shift straddles the threshold).
    Outcome: the number of released keys (selection only; claimed: the selection's
    budget), or with ``counts`` the released keys' noisy counts of keys far above the
    threshold (the count stage; claimed: both stages).

    ``count_cap``: the user counts in a random ``count_cap`` of its kept keys (the l0
    kernel again on the kept rows, as ``weighted_counts`` does), the count calibrated for
    min(keys, count_cap) counts (``count_keys_per_user``).

    Mutations: "threshold - 1" (one user weight, S grid units, below the calibrated
    threshold), "sigma / 2", "sensitivity ignored" (every kept key gets weight 1 = S
    instead of 1/sqrt(t)), "count cap ignored" (count sigma for ``count_cap`` counts, the
    user counted in every kept key)."""
    acc = _module("thresher.accounting.weighted_gaussian")
    kernels = _module("thresher.transforms.selection.weighted_threshold")
    bound_l0 = _module("thresher.transforms.bounding.per_user_bound").bound_l0
    hashing = _module("thresher.transforms.randomness.hashing")
    p = acc.calibrate(epsilon, delta, keys, count_epsilon=epsilon / 2, count_delta=delta / 2,
                      count_keys_per_user=count_cap)
    sigma_grid, threshold = p.sigma_grid, p.threshold_grid
    if mutation == "threshold - 1":
        threshold -= p.scale
    elif mutation == "sigma / 2":
        sigma_grid /= 2
    elif mutation not in ("", "sensitivity ignored", "count cap ignored"):
        raise ValueError(mutation)
    user_keys = user_keys or keys
    q = acc.grid_weight(keys, p.scale)
    if counts:
        base = threshold + int(40 * sigma_grid)
    else:
        base = {"pre_threshold": 0, "near_threshold": threshold - q // 2}[pair]
    key_hashes = hashing.mix64(np.arange(1, user_keys + 1, dtype=np.uint64))

    def release(rng, added, users_added):
        weights = (base + added).reshape(-1)
        user_counts = (1000 + users_added).reshape(-1)
        keep, values = kernels.weighted_threshold(
            user_counts, weights, sigma_grid=sigma_grid, threshold_grid=threshold,
            count_sigma=p.count_sigma, rng=rng)
        keep &= weights > 0          # a key nobody holds is not in the pipeline
        keep = keep.reshape(added.shape)
        values = values.reshape(added.shape)
        if counts:
            return auditor.released_count_and_sum(keep, values)
        return auditor.released_count_and_sum(keep, np.zeros_like(values))

    def run_d(rng, n):
        users = np.repeat(np.arange(n, dtype=np.uint64), user_keys)
        kept = bound_l0(hashing.mix64(users + np.uint64(11)), np.tile(key_hashes, n), keys, rng)
        if mutation == "sensitivity ignored":
            w = np.full(kept.size, p.scale, dtype=np.int64)
        else:
            w = kernels.user_weights(users[kept], p.scale)
        added = np.zeros((n, user_keys), dtype=np.int64)
        users_added = np.zeros((n, user_keys), dtype=np.int64)
        np.add.at(added, (kept // user_keys, kept % user_keys), w)
        counted = kept
        if count_cap is not None and mutation != "count cap ignored":
            counted = kept[bound_l0(hashing.mix64(users[kept] + np.uint64(11)),
                                    np.tile(key_hashes, n)[kept], count_cap, rng)]
        np.add.at(users_added, (counted // user_keys, counted % user_keys), 1)
        return release(rng, added, users_added)

    def run_d_prime(rng, n):
        zeros = np.zeros((n, user_keys), dtype=np.int64)
        return release(rng, zeros, zeros)

    claimed_eps = epsilon + (epsilon / 2 if counts else 0.0)
    claimed_delta = p.delta + (p.count_delta if counts else 0.0)
    if mutation:
        claimed_delta = delta
    return Scenario(mechanism=WEIGHTED, case=pair + (" + counts" if counts else "")
                    + (f" (count cap {count_cap})" if count_cap is not None else ""),
                    claimed_epsilon=claimed_eps, claimed_delta=claimed_delta, run_d=run_d,
                    run_d_prime=run_d_prime, mutation=mutation, trials=trials,
                    parameters=f"Delta0={keys}, user with {user_keys} keys, sigma*S="
                               f"{sigma_grid:.6g}, T={threshold}, q_t={q}")


# Adaptive weighting over rounds (transforms.selection.adaptive_rounds) through the real l0 bound,
# grid-weight, removal and round-threshold kernels.

ADAPTIVE = "Adaptive rounds (weighted Gaussian on the keys not yet released)"


def adaptive(pair, *, keys=4, user_keys=None, epsilon=EPSILON, delta=DELTA, mutation="",
             trials=400_000, outcome="per_round"):
    """One user per trial holding ``user_keys`` (>= keys) keys; the real bound keeps
    Delta0 = ``keys`` of them for round 1 with weights q_t; round 2 runs on the user's
    keys minus those round 1 released (``rows_not_released`` on the real key values),
    bounded again, with weights q_t' (t' the keys left). D' has every key at total weight
    0 in both rounds ("pre_threshold": the keys are absent without the user) or at
    T_r - q_t / 2 in round r ("near_threshold"). Outcome: (keys released in round 1,
    keys released in round 2), or with ``outcome="total"`` their sum (an ordered code). Claimed: the release calibrated at (epsilon, delta) with
    round_fractions (0.5, 0.5); the two rounds' delta(epsilon) composed by f-DP
    (``accounting.adaptive.composed_delta`` without the count stage, <= delta).

    Mutations: "threshold - 1" (both rounds' thresholds one user weight lower),
    "sigma / 2" (both rounds), "sensitivity ignored" (round 2 gives every remaining key
    weight 1 = S instead of 1/sqrt(t'))."""
    acc = _module("thresher.accounting.adaptive")
    wg_acc = _module("thresher.accounting.weighted_gaussian")
    rounds_k = _module("thresher.transforms.selection.adaptive_rounds")
    kernels = _module("thresher.transforms.selection.weighted_threshold")
    bound_l0 = _module("thresher.transforms.bounding.per_user_bound").bound_l0
    hashing = _module("thresher.transforms.randomness.hashing")
    p = acc.calibrate(epsilon, delta, keys, fractions=(0.5, 0.5))
    scale = p.scale
    sigmas = [r.sigma * scale for r in p.rounds]
    thresholds = [r.threshold_grid for r in p.rounds]
    if mutation == "threshold - 1":
        thresholds = [t - scale for t in thresholds]
    elif mutation == "sigma / 2":
        sigmas = [s / 2 for s in sigmas]
    elif mutation not in ("", "sensitivity ignored"):
        raise ValueError(mutation)
    user_keys = user_keys or keys
    q = wg_acc.grid_weight(keys, scale)
    bases = [0, 0] if pair == "pre_threshold" else [t - q // 2 for t in thresholds]
    key_hashes = hashing.mix64(np.arange(1, user_keys + 1, dtype=np.uint64))

    def select(rng, r, added, alive):
        weights = (bases[r] + added).reshape(-1)
        keep = rounds_k.select_keys(weights, sigma_grid=sigmas[r],
                                    threshold_grid=thresholds[r], rng=rng)
        return keep.reshape(added.shape) & (bases[r] + added > 0) & alive

    def user_round(rng, n, alive, r):
        """The user's weights on their keys still alive (not released), via the kernels."""
        users = np.repeat(np.arange(n, dtype=np.uint64), user_keys)
        flat_alive = alive.reshape(-1)
        rows = np.flatnonzero(flat_alive)
        kept = rows[bound_l0(hashing.mix64(users[rows] + np.uint64(11 + r)),
                             np.tile(key_hashes, n)[rows], keys, rng)]
        if mutation == "sensitivity ignored" and r == 1:
            w = np.full(kept.size, scale, dtype=np.int64)
        else:
            w = kernels.user_weights(users[kept], scale)
        added = np.zeros((n, user_keys), dtype=np.int64)
        np.add.at(added, (kept // user_keys, kept % user_keys), w)
        return added

    def removal(released):
        """The real ``rows_not_released`` (exact left-anti join on the key values) over
        every trial's (trial, key) rows: each trial is its own release, so its keys get
        values of their own."""
        import pyarrow as pa
        n = released.shape[0]
        row_keys = hashing.mix64(np.arange(1, n * user_keys + 1, dtype=np.uint64))
        rows = pa.table({"key": row_keys, "row": np.arange(n * user_keys, dtype=np.int64)})
        done = rounds_k.released_keys([pa.table({"key": row_keys[released.reshape(-1)]})],
                                      ["key"])
        left = rounds_k.rows_not_released(rows, done, ["key"]).column("row").to_numpy()
        alive = np.zeros(n * user_keys, dtype=bool)
        alive[left] = True
        return alive.reshape(released.shape)

    def run(rng, n, with_user):
        alive = np.ones((n, user_keys), dtype=bool)
        zeros = np.zeros((n, user_keys), dtype=np.int64)
        added = user_round(rng, n, alive, 0) if with_user else zeros
        r1 = select(rng, 0, added, alive)
        alive = removal(r1)
        added = user_round(rng, n, alive, 1) if with_user else zeros
        r2 = select(rng, 1, added, alive)
        if outcome == "total":
            return (r1.sum(axis=1) + r2.sum(axis=1)).astype(np.int64)
        return r1.sum(axis=1).astype(np.int64) * (user_keys + 1) + r2.sum(axis=1)

    def run_d(rng, n):
        return run(rng, n, True)

    def run_d_prime(rng, n):
        return run(rng, n, False)

    claimed_eps = epsilon
    rounds_delta = acc.composed_delta([(r.sigma, r.threshold_grid) for r in p.rounds], None, 1,
                                      keys, epsilon, delta)
    # the honest scenarios and the mutations claim the same: the rounds' composed delta
    # (the scenario does not run the count stage, whose share of delta is not claimed)
    return Scenario(mechanism=ADAPTIVE, case=pair, claimed_epsilon=claimed_eps,
                    claimed_delta=rounds_delta, run_d=run_d, run_d_prime=run_d_prime,
                    mutation=mutation, trials=trials,
                    events="both" if outcome == "total" else "likelihood",
                    parameters=f"Delta0={keys}, user with {user_keys} keys, sigma*S="
                               f"{[round(s, 1) for s in sigmas]}, T={thresholds}, q_t={q}")


# Registries: (id, builder, power) for honest audits -- power is the smallest fraction
# of the claimed epsilon the audit must reach (None for pairs whose only privacy cost is
# a delta-sized event, which a correct mechanism keeps below the claimed delta, so the
# bound is -inf or ~0 there) -- and (id, builder) for mutations, all to be flagged.

HONEST = [
    ("gshm-pre_threshold", lambda: gshm("pre_threshold"), None),
    ("gshm-shift", lambda: gshm("shift"), 0.5),
    ("gshm-4keys-pre_threshold", lambda: gshm("pre_threshold", keys=4), None),
    ("gshm-4keys-shift", lambda: gshm("shift", keys=4), 0.5),
    ("gshm-4keys-mixed", lambda: gshm("mixed", keys=4), 0.3),
    ("laplace-pre_threshold", lambda: laplace_threshold("pre_threshold"), None),
    ("laplace-shift", lambda: laplace_threshold("shift"), 0.9),
    ("laplace-3keys-mixed", lambda: laplace_threshold("mixed", keys=3), 0.3),
    ("bound-user_at_bound", lambda: bounded_gshm(), None),
    ("randclip-l1-pre_threshold", lambda: rand_clip_laplace(), None),
    ("randclip-l1-shift", lambda: rand_clip_laplace(layout=(6,), base="high"), 0.8),
    ("randclip-l1-spread", lambda: rand_clip_laplace(layout=(2, 2, 2), base="high"), 0.4),
    ("sample_threshold", lambda: sample_and_threshold(), 0.5),
    ("sample_threshold-rate0.2", lambda: sample_and_threshold(sampling_rate=0.2), 0.3),
    ("sample_threshold-3keys", lambda: sample_and_threshold(keys=3, trials=400_000), 0.1),
    ("sample_threshold-3keys-pld",
     lambda: sample_and_threshold(keys=3, trials=400_000, composition="pld"), 0.2),
    ("pws-keys-frequency1", lambda: pws(), None),
    ("pws-frequencies-frequency3", lambda: pws(report="keys_and_frequencies", frequency=3), 0.5),
    ("pws-keys-3keys-pld", lambda: pws(keys=3, frequency="worst", composition="pld"), 0.4),
    ("exponential_mechanism", lambda: exponential_mechanism(), 0.5),
    ("count_and_sum-shift", lambda: count_and_sum("shift"), 0.5),
    ("count_and_sum-pre_threshold", lambda: count_and_sum("pre_threshold"), None),
    ("weighted_gaussian-pre_threshold", lambda: weighted_gaussian("pre_threshold"), None),
    ("weighted_gaussian-user_at_bound",
     lambda: weighted_gaussian("pre_threshold", keys=2, user_keys=6), None),
    ("weighted_gaussian-near_threshold", lambda: weighted_gaussian("near_threshold"), 0.2),
    ("weighted_gaussian-counts", lambda: weighted_gaussian("shift", counts=True), 0.15),
    ("weighted_gaussian-counts-capped",
     lambda: weighted_gaussian("shift", keys=4, counts=True, count_cap=1), 0.05),
    ("adaptive-pre_threshold", lambda: adaptive("pre_threshold"), None),
    ("adaptive-user_at_bound", lambda: adaptive("pre_threshold", keys=2, user_keys=6), None),
    ("adaptive-near_threshold", lambda: adaptive("near_threshold"), 0.1),
]

MUTATIONS = [
    ("gshm-threshold-1", lambda: gshm("pre_threshold", mutation="threshold - 1")),
    ("gshm-sigma/2", lambda: gshm("shift", mutation="sigma / 2")),
    ("gshm-continuous-formula", lambda: gshm("pre_threshold", mutation="continuous formula")),
    ("gshm-composition-ignored", lambda: gshm("shift", keys=4, mutation="composition ignored")),
    ("laplace-threshold-1", lambda: laplace_threshold("pre_threshold", mutation="threshold - 1")),
    ("laplace-scale/2", lambda: laplace_threshold("shift", mutation="scale / 2")),
    ("laplace-continuous-formula",
     lambda: laplace_threshold("pre_threshold", mutation="continuous formula")),
    ("laplace-composition-ignored",
     lambda: laplace_threshold("shift", keys=3, mutation="composition ignored")),
    ("bounding-skipped", lambda: bounded_gshm(mutation="bounding skipped")),
    ("clipping-skipped", lambda: rand_clip_laplace(mutation="clipping skipped")),
    ("clipping-skipped-shift",
     lambda: rand_clip_laplace(layout=(6,), base="high", mutation="clipping skipped")),
    ("sample_threshold-threshold-1",
     lambda: sample_and_threshold(sampling_rate=0.2, k="threshold", mutation="threshold - 1")),
    ("sample_threshold-composition-ignored",
     lambda: sample_and_threshold(keys=8, k="threshold", mutation="composition ignored",
                                  trials=400_000)),
    ("pws-composition-ignored", lambda: pws(keys=3, mutation="composition ignored")),
    ("pws-pld-composition-ignored",
     lambda: pws(keys=8, frequency="worst", composition="pld", mutation="composition ignored")),
    ("em-monotone-factor",
     lambda: exponential_mechanism(mutation="monotone factor on non-monotone scores")),
    ("em-sensitivity/2", lambda: exponential_mechanism(mutation="sensitivity / 2")),
    ("em-composition-ignored", lambda: exponential_mechanism(mutation="composition ignored")),
    ("count_and_sum-sum-noise/2", lambda: count_and_sum("shift", mutation="sum noise / 2")),
    ("weighted_gaussian-threshold-1",
     lambda: weighted_gaussian("pre_threshold", mutation="threshold - 1")),
    ("weighted_gaussian-sigma/2",
     lambda: weighted_gaussian("near_threshold", mutation="sigma / 2", trials=10**6)),
    ("weighted_gaussian-sensitivity-ignored",
     lambda: weighted_gaussian("pre_threshold", mutation="sensitivity ignored")),
    ("weighted_gaussian-count-cap-ignored",
     lambda: weighted_gaussian("shift", keys=16, counts=True, count_cap=1,
                               mutation="count cap ignored")),
    # The thresholds get THRESHOLD_DELTA_SHARE (0.2) of delta: at epsilon 1 (sigma 3.9 user
    # weights) one user weight lower multiplies their leak by ~2.9, still inside delta; at
    # epsilon 3 (sigma 1.6) by ~12.5, 2.5e-3 against delta 1e-3: a violation.
    ("adaptive-threshold-1",
     lambda: adaptive("pre_threshold", epsilon=3.0, mutation="threshold - 1")),
    ("adaptive-sigma/2",
     lambda: adaptive("near_threshold", keys=16, mutation="sigma / 2", trials=10**6)),
    ("adaptive-round2-sensitivity-ignored",
     lambda: adaptive("near_threshold", keys=16, mutation="sensitivity ignored")),
]

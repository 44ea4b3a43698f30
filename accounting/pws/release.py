"""A PWS release whichever the per-key composition: calibrate it and build its tables.

The (eps0, delta0) tables of PWS (paper 001 Alg. 3/4; compositions ``optimal`` and
``basic``) are accounting.pws.core's; the Gaussian-tradeoff keep table of composition
``pld`` is accounting.pws.pld's. This module joins the two: :func:`calibrate` picks the
better of pld's table and optimal's, and :func:`release_tables` rebuilds whichever
table calibrated parameters name (``key_mu`` set: pld's). It imports both; neither
imports it, nor each other back. It reads core's band cache (``_BANDS``, filled by
core.calibrate) and table builders directly: one family, one package.
"""
import dataclasses
import functools

from thresher.accounting.pws import core, pld


def calibrate(epsilon, delta, max_keys_per_user, *, sampling="none", sampling_threshold=None,
              report="keys_and_frequencies", estimator="mle", composition="optimal",
              max_frequency=None, presampled=False):
    """Parameters of a PWS release at (epsilon, delta) with <= C keys per user: the
    arguments are checked (core.check_calibrate_arguments), then composition ``pld`` is
    :func:`_calibrate_pld`, the others core.calibrate (its docstring has the steps).
    Raises ValueError on invalid arguments or if the verification cannot pass."""
    core.check_calibrate_arguments(epsilon, delta, sampling, sampling_threshold, report,
                                   estimator, max_frequency)
    if composition == "pld":
        return _calibrate_pld(epsilon, delta, max_keys_per_user, sampling=sampling,
                              sampling_threshold=sampling_threshold, report=report,
                              estimator=estimator, max_frequency=max_frequency,
                              presampled=presampled)
    return core.calibrate(epsilon, delta, max_keys_per_user, sampling=sampling,
                          sampling_threshold=sampling_threshold, report=report,
                          estimator=estimator, composition=composition,
                          max_frequency=max_frequency, presampled=presampled)


def _calibrate_pld(epsilon, delta, max_keys_per_user, *, sampling="none", sampling_threshold=None,
                   report="keys", estimator="mle", max_frequency=None, presampled=False):
    """``composition: pld`` of :func:`calibrate`: the better of the ``optimal``
    release and the table (2) of pld.best_budget (used when pld.no_worse: at every
    frequency at least optimal's probability minus delta, and never longer than the table
    the planning limits already admit). Keys only (frequencies: ValueError).
    Returns accounting.pws.PWSParameters (composition "pld"; ``key_mu`` set when the
    Gaussian table is used, else the optimal parameters)."""
    if report != "keys":
        raise ValueError("composition pld is available with report: keys only (the frequency "
                         "tokens of Alg. 4 are built for an (eps0, delta0) per-key budget); use "
                         "composition: optimal")
    c = int(max_keys_per_user)
    opt = core.calibrate(epsilon, delta, c, sampling=sampling, sampling_threshold=sampling_threshold,
                         report=report, estimator=estimator, composition="optimal",
                         max_frequency=max_frequency, presampled=presampled)
    fallback = dataclasses.replace(opt, composition="pld")
    if c == 1 or max_frequency is not None or opt.saturation_frequency is None \
            or opt.max_frequency > pld.MAX_LENGTH:
        return fallback
    budget = pld.best_budget(epsilon, delta, c)
    if budget is None:
        return fallback

    def q_fn(m):
        return core.sampling_probabilities(m, sampling=sampling, sampling_threshold=sampling_threshold)

    built = pld.build(q_fn, budget, opt.max_frequency, presampled=presampled)
    if built is None:
        return fallback
    keep, mu_build, d_build = built
    if not pld.no_worse(keep, release_tables(opt).keep, delta):
        return fallback
    spent = pld.composed_delta(epsilon, budget.mu, budget.delta0, c)
    if spent > delta:  # cannot happen: budgets() checked it
        raise ValueError(f"composed delta {spent:g} exceeds {delta:g}")
    e0 = pld.per_key_epsilon(budget.mu, budget.delta0)
    # the per-key delta of the coins actually drawn (q x fl(pi / q) when pre-sampled), at
    # e0: one key with tradeoff max(0, G_mu - delta0) is (e0, 2 delta0)-DP, not (e0, delta0)
    drawn_q = q_fn(len(keep) - 1) if presampled else None
    realized = core.realized_delta(e0, keep, sampling_probabilities=drawn_q)
    return core.PWSParameters(
        epsilon=float(epsilon), delta=float(delta), max_keys_per_user=c, sampling=sampling,
        sampling_threshold=None if sampling_threshold is None else float(sampling_threshold),
        report=report, estimator=estimator, composition="pld", key_epsilon=e0,
        key_delta=2 * budget.delta0, table_delta=d_build, key_delta_realized=realized,
        delta_realized=spent, max_frequency=len(keep) - 1, saturation_frequency=len(keep) - 1,
        beyond_table="clip", presampled=bool(presampled), key_mu=mu_build,
        key_mu_verified=budget.mu, key_delta0=budget.delta0)


def keep_table(params):
    """pi_0 .. pi_M of calibrated ``params`` (PWS Alg. 3): the same array as
    ``release_tables(params).keep``, without the estimators' tables, which only the
    release of the chosen bound reads. Planning reads this (the threshold of every
    candidate bound, ``pipelines/kinds/weighted_sampling.py``); it lets go of the band
    core.calibrate kept for it (up to ~25 MB each at the largest automatic
    candidates), which the release rebuilds for the one bound it uses."""
    if params.report == "keys":
        return release_tables(params).keep     # keys only: no estimators to build
    keep = core._release_band(params).keep
    core._BANDS.pop(core._band_key(params), None)
    return keep


@functools.lru_cache(maxsize=4)
def release_tables(params):
    """Build (and cache per process) the tables of a calibrated release. Deterministic."""
    if params.report == "keys":
        q = core.sampling_probabilities(params.max_frequency, sampling=params.sampling,
                                        sampling_threshold=params.sampling_threshold)
        if params.key_mu is not None:
            keep = pld.keep_probabilities(q, params.key_mu, params.table_delta)
        else:
            keep = core._alg3(q, params.key_epsilon, params.table_delta)
        return core.ReleaseTables(params=params, keep=keep, band=None, estimates=None)
    band = core._release_band(params)
    if params.beyond_table != "shift":
        return core.ReleaseTables(params=params, keep=band.keep, band=band,
                                  estimates=core._band_estimates(params.estimator, band))
    width = len(band.row(band.max_frequency))
    estimates = core._band_estimates(params.estimator, band, extra=4 * width,
                                     columns=params.max_frequency + 3 * width + 1)
    tail = core._periodic_tail(estimates, width)
    if tail is None:
        raise ValueError("PWS estimates are not periodic beyond the table; "
                         "set mechanism.max_frequency explicitly")
    return core.ReleaseTables(params=params, keep=band.keep, band=band, estimates=estimates,
                              period=tail[0], increment=tail[1])

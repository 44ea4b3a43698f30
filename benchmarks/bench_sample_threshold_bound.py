"""The sample-and-threshold composed bound (accounting/sample_threshold/pld.py, issue 38):
where the old bound's gap came from, the new one against exact computations, and the
release points before / after, side by side in one run.

``--gap`` (default part 1): at the heavy_hitters example (p = 0.0426, tau = 10, 48 cells,
epsilon 1): the old bound (the ``--before`` revision's pld.py, loaded from git), the
same with (c) its tail/block bounds replaced by the exact supremum over k <= 20,000 (not
a bound: a measurement), (b) a 10x finer grid, both; the new bound; and dp_accounting's
optimistic delta (a lower bound on the exact delta) of equal count vectors.

``--points`` (part 2): tau / p at (epsilon 1, delta 1e-6) for sample_and_threshold over
C keys and the heavy_hitters trie over C = 16 x 1..3 levels, the ``--before`` revision's
calibration and this one's, with the CPU seconds of each and the 1-minute load.

    python -m benchmarks.bench_sample_threshold_bound [--gap] [--points] [--before REV]

The "before" figures need git and the before revision's accounting/sample_threshold
(pld.py, calibration.py); they are skipped with a note when either is missing.
"""
import argparse
import importlib.util
import math
import os
import pathlib
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parent.parent
EXAMPLE = dict(epsilon=1.0, p=0.0426, tau=10, cells=48)


def _load_before(revision):
    """(pld, calibration) modules of ``revision`` (git show), bound to this checkout's
    core (whose one-key functions the old modules import), or None."""
    from thresher.accounting.sample_threshold import core
    folder = tempfile.mkdtemp(prefix="st_before_")
    modules = {}
    for name in ("pld", "calibration"):
        try:
            source = subprocess.run(
                ["git", "show", f"{revision}:accounting/sample_threshold/{name}.py"],
                cwd=ROOT, capture_output=True, text=True, check=True).stdout
        except (OSError, subprocess.CalledProcessError):
            return None
        source = source.replace("from thresher.accounting.sample_threshold import core, pld",
                                "from thresher.accounting.sample_threshold import core\n"
                                "import st_before_pld as pld")
        path = pathlib.Path(folder) / f"st_before_{name}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(f"st_before_{name}", path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[f"st_before_{name}"] = module
        spec.loader.exec_module(module)
        modules[name] = module
    assert modules["calibration"].core is core
    return modules["pld"], modules["calibration"]


def _load():
    return os.getloadavg()[0]


def gap(before):
    from thresher.accounting.sample_threshold import core, pld
    eps, p, tau, n = (EXAMPLE[k] for k in ("epsilon", "p", "tau", "cells"))
    print(f"== the gap at the heavy_hitters example: p={p}, tau={tau}, {n} cells, eps={eps}")
    if before is not None:
        old, _ = before
        print(f"old bound ({args_before}):                      {old.composed_delta(eps, p, tau, n):.3g}")
        real = old.survival_bound
        k_max = 20_000

        def exact_sup(p_, tau_, direction, xs):
            ks = np.arange(tau_, k_max + 1)
            out = np.zeros(len(xs))
            if direction == "remove":
                with np.errstate(divide="ignore", invalid="ignore"):
                    a_k = (np.log(core._cdf(tau_ - 1, ks - 1, p_))
                           - np.log(core._cdf(tau_ - 1, ks, p_)))
            for i, x in enumerate(xs):
                if direction == "add":
                    t = np.maximum(np.floor(ks * (1 - (1 - p_) * math.exp(-x))), tau_ - 1)
                    out[i] = core._sf(t, ks, p_).max()
                else:
                    m = np.ceil(ks * (1 - (1 - p_) * math.exp(x))) - 1
                    absent = np.where(a_k > x, core._cdf(tau_ - 1, ks - 1, p_), 0.0)
                    part = np.where(m >= tau_, core._cdf(m, ks - 1, p_)
                                    - core._cdf(tau_ - 1, ks - 1, p_), 0.0)
                    out[i] = (absent + part).max()
            return np.maximum.accumulate(out[::-1])[::-1]

        steps = old._STEPS_PER_EPSILON
        for label, sup, factor in (("(c) exact sup over k <= 20000 (not a bound)", exact_sup, 1),
                                   ("(b) grid 10x finer", real, 10),
                                   ("(b) + (c)", exact_sup, 10)):
            old.dominating_pmf.cache_clear()
            old.survival_bound, old._STEPS_PER_EPSILON = sup, steps * factor
            print(f"old, {label:43s} {old.composed_delta(eps, p, tau, n):.3g}", flush=True)
        old.survival_bound, old._STEPS_PER_EPSILON = real, steps
        old.dominating_pmf.cache_clear()
    start = time.process_time()
    new = pld.composed_delta(eps, p, tau, n)
    print(f"new bound (one dominating pair):                {new:.3g}  "
          f"({time.process_time() - start:.2f} s CPU, load {_load():.1f})")
    try:
        from tests.accounting.sample_threshold.test_sample_threshold_pld import _dp_accounting_delta
    except ImportError:
        print("dp_accounting (dev extra) not installed: no exact comparison")
        return
    for k in (12, 13, 14, 15, 16, 20, 40):
        exact = _dp_accounting_delta(eps, p, tau, (k,) * n)
        print(f"exact (dp_accounting optimistic), all {n} cells at k={k:3d}: {exact:.3g}",
              flush=True)


def _timed(function, *args, **kwargs):
    start = time.process_time()
    out = function(*args, **kwargs)
    return out, time.process_time() - start


def points(before, epsilon=1.0, delta=1e-6):
    from thresher.accounting.sample_threshold import calibration, pld
    print(f"\n== release points tau / p at epsilon={epsilon}, delta={delta:g}")
    print("| release | cells | before: p, tau, tau/p (CPU s) | after: p, tau, tau/p (CPU s) | load |")
    print("| --- | --- | --- | --- | --- |")
    rows = [(f"sample_and_threshold C={c}", c) for c in (2, 4, 8, 16, 32, 64)]
    rows += [(f"heavy_hitters trie C=16, {levels} level(s)", 16 * levels) for levels in (1, 2, 3)]
    for label, n in rows:
        cells = []
        for module in ((before[1],) if before else (None,)) + (calibration,):
            if module is None:
                cells.append("(no before revision)")
                continue
            pld.dominating_pair.cache_clear()          # every row from an empty memo
            if before:
                before[0].dominating_pmf.cache_clear()
            params, cpu = _timed(module.calibrate, epsilon, delta, n, composition="pld")
            cells.append(f"{params.sampling_rate:.4f}, {params.threshold}, "
                         f"{params.release_point:.1f} ({cpu:.2f})")
        print(f"| {label} | {n} | {cells[0]} | {cells[1]} | {_load():.1f} |", flush=True)


def main(argv=None):
    global args_before
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gap", action="store_true")
    parser.add_argument("--points", action="store_true")
    parser.add_argument("--before", default="aec4b08",
                        help="git revision of the old bound (default aec4b08, the last "
                             "with the survival-supremum bound)")
    args = parser.parse_args(argv)
    args_before = args.before
    before = _load_before(args.before)
    if before is None:
        print(f"(revision {args.before} not readable by git: 'before' figures skipped)")
    elif not hasattr(before[0], "survival_bound"):
        print(f"(revision {args.before} already has the new bound: 'before' figures skipped)")
        before = None
    everything = not (args.gap or args.points)
    if args.gap or everything:
        gap(before)
    if args.points or everything:
        points(before)


args_before = "aec4b08"

if __name__ == "__main__":
    main()

"""Correlated noise for the gaussian kind (issue 38 part 1): thresholds and keys released.

    python -m benchmarks.bench_correlated_noise --curve        # thresholds over C and delta
    python -m benchmarks.bench_correlated_noise --paper        # the paper's setting (k-sparse)
    python -m benchmarks.bench_correlated_noise --keys [--secrets 10] [--data-dir DIR]

--curve: at epsilon = 1, for max_keys_per_user C = 1 .. 1024 and delta = 1e-5 .. 1e-10,
  the noisy threshold tau* of noise: discrete_gaussian (today), of noise: correlated
  (Theorem 1 of accounting.correlated_gshm, calibrated), the least tau* any split of
  shared and independent noise can have in an open key space (Proposition 2), and what
  noise: auto plans. CPU seconds per correlated calibration are printed with the load.
--paper: the setting where correlated noise does help: a public bound k on the number of
  non-zero counts (continuous noise, two-sided add-the-deltas, comparison only).
--keys: keys released on the identifier corpus (benchmarks/identifier_corpus.py) through the
  real pipeline (FnApiRunner), C = 16 and max_keys_per_user: auto, noise discrete_gaussian
  (before) / auto / correlated (after), one fixed secret per run, --secrets runs each.
"""
import argparse
import os
import tempfile
import time

import numpy as np
import yaml

CS = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)
DELTAS = (1e-5, 1e-6, 1e-8, 1e-10)


def curve(epsilon=1.0, cs=CS, deltas=DELTAS):
    from thresher.accounting import correlated_gshm as cg, gshm
    from thresher.pipelines.kinds import gaussian
    print(f"epsilon={epsilon:g}: noisy threshold tau* (pre_threshold 1); 'bound' is the least "
          "tau* any shared/independent split can have (Proposition 2)")
    print(f"{'delta':>7} {'C':>5} {'today':>6} {'correlated':>10} {'bound':>6} {'auto':>5} "
          f"{'corr sigma':>10} {'shared':>7} {'corr cpu s':>10} {'load':>5}")
    for delta in deltas:
        for c in cs:
            today = gshm.calibrate(epsilon, delta, c).threshold
            t0 = time.process_time()
            corr = cg.calibrate(epsilon, delta, c)
            cpu = time.process_time() - t0
            bound, _ = cg.threshold_lower_bound(epsilon, delta, c)
            auto = gaussian.calibrate({"pre_threshold": 1, "sigma": None, "threshold": None,
                                       "noise": "auto"}, epsilon=epsilon, delta=delta,
                                      max_keys_per_user=c, model="l0")
            print(f"{delta:>7.0e} {c:>5} {today:>6} {corr.threshold:>10} {bound:>6} "
                  f"{auto['threshold']:>5} {corr.sigma:>10.3f} {corr.shared_sigma:>7.3f} "
                  f"{cpu:>10.2f} {os.getloadavg()[0]:>5.1f}", flush=True)


def paper(epsilon=1.0, delta=1e-6, ks=(1, 2, 4, 16, 64, 256, 1024)):
    from thresher.accounting import correlated_gshm as cg
    print(f"epsilon={epsilon:g}, delta={delta:g}, at most k non-zero counts, a user in at most k "
          "of them (continuous noise, add-the-deltas both ways; not thresher's setting)")
    print(f"{'k':>5} {'independent':>12} {'correlated':>11} {'ratio':>6}")
    for k in ks:
        a = cg.bounded_support_threshold(epsilon, delta, k, correlated=False)
        b = cg.bounded_support_threshold(epsilon, delta, k)
        print(f"{k:>5} {a:>12.2f} {b:>11.2f} {b / a:>6.3f}", flush=True)


def _release(data, out, noise, bound, secret):
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.transforms.randomness.keyed_random import KeyedSource
    import pyarrow.parquet as pq
    spec = {"name": "corr", "input": {"path": data, "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "gaussian", "noise": noise},
            "output": {"path": out}}
    path = out + ".yaml"
    with open(path, "w") as f:
        yaml.safe_dump(spec, f)
    report = run(make_plan(spec_mod.load(path)), overwrite=True, rng_factory=KeyedSource(secret))
    released = pq.read_table(os.path.join(out, "released.parquet")).num_rows
    mech = report["mechanism"]
    return released, report["bounding"]["max_keys_per_user"], mech["threshold"], mech["noise"]


def keys(data_dir, secrets=10):
    from benchmarks import identifier_corpus
    data = identifier_corpus.cached(data_dir)
    print(f"identifier corpus {data}; epsilon 1, delta 1e-6; {secrets} secrets per row")
    print(f"{'bound':>6} {'noise':>18} {'keys mean':>10} {'min':>5} {'max':>5} {'C chosen':>14} "
          f"{'tau*':>10} {'noise used':>18} {'wall s':>7} {'cpu s':>7} {'load':>5}")
    with tempfile.TemporaryDirectory() as tmp:
        for bound in (16, "auto"):
            for noise in ("discrete_gaussian", "auto", "correlated"):
                counts, chosen, taus, used = [], set(), set(), set()
                w0, c0 = time.time(), time.process_time()
                for i in range(secrets):
                    secret = f"bench correlated noise secret {i:03d}".encode()
                    n, c, tau, u = _release(data, os.path.join(tmp, f"{bound}-{noise}-{i}"),
                                            noise, bound, secret)
                    counts.append(n)
                    chosen.add(c)
                    taus.add(tau)
                    used.add(u)
                print(f"{bound!s:>6} {noise:>18} {np.mean(counts):>10.1f} {min(counts):>5} "
                      f"{max(counts):>5} {','.join(map(str, sorted(chosen))):>14} "
                      f"{','.join(map(str, sorted(taus))):>10} {','.join(sorted(used)):>18} "
                      f"{time.time() - w0:>7.1f} {time.process_time() - c0:>7.1f} "
                      f"{os.getloadavg()[0]:>5.1f}", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--curve", action="store_true")
    ap.add_argument("--paper", action="store_true")
    ap.add_argument("--keys", action="store_true")
    ap.add_argument("--secrets", type=int, default=10)
    ap.add_argument("--data-dir", default=None)
    a = ap.parse_args(argv)
    if a.curve:
        curve()
    if a.paper:
        paper()
    if a.keys:
        from benchmarks import identifier_corpus
        keys(a.data_dir or identifier_corpus.DEFAULT_DATA_DIR, a.secrets)


if __name__ == "__main__":
    main()

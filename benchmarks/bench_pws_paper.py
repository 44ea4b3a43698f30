"""Reproduce paper 001 (PWS) §8.2-8.4 with thresher's accounting.pws, and time the tables.

Cohen, Geri, Sarlos & Stemmer, "Differentially Private Weighted Sampling", AISTATS 2021.
Like the paper (§8: "we use precise expressions, not simulations") the tables are exact
expectations from the probabilities; section E adds Monte Carlo runs of the real kernel
(transforms.selection.sanitize_sample) and of a simulated SbH to check those expressions.

Data sets (as in the authors' experiment code): Zipf[alpha] with n keys, the key of rank r
having frequency floor((n / r)^alpha); and 200 000 keys with frequencies 1..200, 1000 each.

    python -m benchmarks.bench_pws_paper            # all sections, ~1-2 minutes
    python -m benchmarks.bench_pws_paper --quick    # smaller Zipf support, fewer points
"""
import argparse
import math
import time

import numpy as np

from thresher.accounting import pws
from benchmarks import sbh_baseline
from thresher.transforms.randomness import samplers
from thresher.transforms.selection.sanitize_sample import sanitize


def zipf_frequencies(size, alpha):
    r = np.arange(1, size + 1, dtype=np.float64)
    return np.floor((size / r) ** alpha).astype(np.int64)


def pws_fraction(freqs, counts, epsilon, delta, sampling="none", t=None):
    m = pws.saturation_frequency(epsilon, delta, sampling=sampling, sampling_threshold=t)
    pi = pws.keep_probabilities(epsilon, delta, m, sampling=sampling, sampling_threshold=t)
    return float((pi[np.minimum(freqs, m)] * counts).sum() / counts.sum())


def sbh_fraction(freqs, counts, epsilon, delta, sampling="none", t=None):
    phi = pws.sbh_keep_probabilities(epsilon, delta, freqs, sampling=sampling, sampling_threshold=t)
    return float((phi * counts).sum() / counts.sum())


def nonprivate_fraction(freqs, counts, sampling, t):
    q = pws.sampling_probabilities_at(freqs, sampling=sampling, sampling_threshold=t)
    return float((q * counts).sum() / counts.sum())


def section_ratio():
    print("\n== A. pi_i / phi_i at low frequencies, no sampling (paper §8.2: ~ 2i) ==")
    for eps, delta in ((0.1, 0.01), (0.01, 1e-6)):
        m = pws.saturation_frequency(eps, delta)
        pi = pws.keep_probabilities(eps, delta, m)
        sbh_full = math.ceil(pws.sbh_threshold(eps, delta) + math.log(1 / (2 * delta)) / eps)
        print(f"eps={eps:g} delta={delta:g}: L={pws.pws_L(eps, delta):.1f}, pi reaches 1 at i={m}; "
              f"SbH phi > 1-delta from i={sbh_full}")
        print(f"{'i':>5} {'pi_i':>11} {'phi_i':>11} {'pi/phi':>8} {'2i':>5}")
        for i in (1, 2, 3, 5, 10, 20, 50):
            if i <= m:
                phi = float(pws.sbh_keep_probabilities(eps, delta, [i])[0])
                print(f"{i:5d} {pi[i]:11.4g} {phi:11.4g} {pi[i] / phi:8.2f} {2 * i:5d}")


def section_delta_sweep(size, deltas, schemes):
    print(f"\n== B. Key reporting vs delta: Zipf[alpha], n={size:.0e}, eps=0.1 (paper §8.2 Fig. 2, "
          f"§8.3) ==")
    eps = 0.1
    data = {}
    for alpha in (0.5, 1.0, 2.0):
        f, c = np.unique(zipf_frequencies(size, alpha), return_counts=True)
        data[alpha] = (f, c)
    for sampling, t in schemes:
        label = "no sampling" if sampling == "none" else f"{sampling} tau={t:g}"
        print(f"-- {label}: fraction of keys reported PWS / SbH (gain = PWS/SbH - 1)")
        header = f"{'delta':>7}" + "".join(f" | a={a:<3g} {'PWS':>9} {'SbH':>9} {'gain':>6}"
                                          for a in data)
        if sampling != "none":
            header += "   non-private q: " + " ".join(
                f"{nonprivate_fraction(*data[a], sampling, t):.3g}" for a in data)
        print(header)
        for delta in deltas:
            row = f"{delta:7.0e}"
            for alpha, (f, c) in data.items():
                a = pws_fraction(f, c, eps, delta, sampling, t)
                b = sbh_fraction(f, c, eps, delta, sampling, t)
                row += f" |       {a:9.3g} {b:9.3g} {100 * (a / b - 1):5.0f}%"
            print(row)


def section_tau_sweep(size, taus):
    eps, delta = 0.1, 1e-3
    print(f"\n== C. Key reporting vs ppswor threshold tau: Zipf[alpha], n={size:.0e}, eps={eps}, "
          f"delta={delta:g} (paper §8.3 Fig. 5: gains >= 230%, 97%, 37%) ==")
    print(f"{'tau':>7}" + "".join(f" | a={a:<3g} {'q':>8} {'PWS':>8} {'SbH':>8} {'gain':>6}"
                                  for a in (0.5, 1, 2)))
    data = {a: np.unique(zipf_frequencies(size, a), return_counts=True) for a in (0.5, 1.0, 2.0)}
    for tau in taus:
        row = f"{tau:7.0e}"
        for alpha, (f, c) in data.items():
            q = nonprivate_fraction(f, c, "ppswor", tau)
            a = pws_fraction(f, c, eps, delta, "ppswor", tau)
            b = sbh_fraction(f, c, eps, delta, "ppswor", tau)
            row += f" |       {q:8.3g} {a:8.3g} {b:8.3g} {100 * (a / b - 1):5.0f}%"
        print(row)


def pws_nrmse(epsilon, delta, tau, freqs, copies, estimator):
    sampling, t = ("none", None) if tau >= 1 else ("priority", tau)
    width = 2 * math.ceil(pws.pws_L(epsilon, delta)) + 4
    m = int(freqs.max()) + 6 * width
    table = pws.frequency_table(epsilon, delta, m, sampling=sampling, sampling_threshold=t)
    lo_last = table.indices[table.indptr[m] + 1]
    assert lo_last > freqs.max(), "table too short for exact estimates"
    fn = pws.mle_estimates if estimator == "mle" else pws.biased_down_estimates
    mom = pws.estimator_moments(table, fn(table))
    bias = copies * mom["bias"][freqs].sum()
    var = copies * mom["variance"][freqs].sum()
    return math.sqrt(var + bias * bias) / (copies * freqs.sum())


def section_nrmse(epsilons, taus):
    delta = 2.0 ** -20
    freqs = np.arange(1, 201)
    copies = 1000
    total = copies * freqs.sum()
    print(f"\n== D. NRMSE of the sum of frequencies, 2e5 keys uniform in 1..200, priority sampling, "
          f"delta=2^-20 (paper §8.4 Fig. 8) ==")
    print(f"{'eps':>5} {'tau':>7} {'non-private':>12} {'SbH':>9} {'PWS mle':>9} {'PWS b-down':>10}")
    for eps in epsilons:
        for tau in taus:
            sampling, t = ("none", None) if tau >= 1 else ("priority", tau)
            q = pws.sampling_probabilities_at(freqs, sampling=sampling, sampling_threshold=t)
            nonpriv = math.sqrt(copies * (freqs ** 2 * (1 / q - 1)).sum()) / total
            expected, mse = sbh_baseline.estimate_moments(eps, delta, freqs, sampling=sampling,
                                                          sampling_threshold=t)
            sbh_bias = copies * (expected - freqs).sum()
            sbh_var = copies * (mse - (expected - freqs) ** 2).sum()
            sbh = math.sqrt(sbh_var + sbh_bias ** 2) / total
            mle = pws_nrmse(eps, delta, tau, freqs, copies, "mle")
            down = pws_nrmse(eps, delta, tau, freqs, copies, "biased_down")
            print(f"{eps:5g} {tau:7.0e} {nonpriv:12.4g} {sbh:9.4g} {mle:9.4g} {down:10.4g}")


def section_monte_carlo(size):
    print("\n== E. Monte Carlo: the kernel and a simulated SbH against the exact expressions ==")
    eps, delta, t = 0.1, 1e-4, 0.01
    freqs = zipf_frequencies(size, 1.0)
    f, c = np.unique(freqs, return_counts=True)
    rng = np.random.default_rng(2024)
    for sampling, tau in (("none", None), ("ppswor", t)):
        m = pws.saturation_frequency(eps, delta, sampling=sampling, sampling_threshold=tau)
        pi = pws.keep_probabilities(eps, delta, m, sampling=sampling, sampling_threshold=tau)
        runs = 20
        got_pws = np.mean([sanitize(freqs, keep_probabilities=pi, rng=rng)[0].mean()
                           for _ in range(runs)])
        got_sbh = np.mean([sbh_baseline.simulate(freqs, eps, delta, rng, sampling=sampling,
                                                 sampling_threshold=tau)[0].mean()
                           for _ in range(runs)])
        exact_pws = pws_fraction(f, c, eps, delta, sampling, tau)
        exact_sbh = sbh_fraction(f, c, eps, delta, sampling, tau)
        print(f"{sampling:>7}: PWS kernel {got_pws:.5f} vs exact {exact_pws:.5f}; "
              f"SbH simulated {got_sbh:.5f} vs exact {exact_sbh:.5f} (n={size:.0e} keys x {runs} runs)")


def _timed(fn, repeat=3):
    best = math.inf
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best


def section_speed():
    print("\n== F. Speed (best of 3, seconds) ==")
    print(f"{'eps':>6} {'delta':>7} {'sampling':>12} {'M':>6} {'frequency_table':>16} "
          f"{'nnz':>10} {'keep_probabilities':>19}")
    for eps, delta, sampling, t in ((0.1, 1e-8, "none", None), (1.0, 1e-6, "none", None),
                                    (0.1, 1e-8, "ppswor", 0.01), (0.01, 1e-10, "none", None)):
        m = 10_000
        sec = _timed(lambda: pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t),
                     repeat=1 if eps < 0.05 else 3)
        nnz = pws.frequency_table(eps, delta, m, sampling=sampling, sampling_threshold=t).nnz
        keep = _timed(lambda: pws.keep_probabilities(eps, delta, m, sampling=sampling,
                                                     sampling_threshold=t))
        label = sampling if t is None else f"{sampling} {t:g}"
        print(f"{eps:6g} {delta:7.0e} {label:>12} {m:6d} {sec:16.3f} {nnz:10d} {keep:19.4f}")
    print(f"{'calibrate + release_tables':>40}")
    for c, kwargs in ((1, {}), (10, {}), (100, {}), (10, dict(sampling="ppswor", sampling_threshold=0.001)),
                      (10, dict(report="keys", sampling="ppswor", sampling_threshold=1e-5))):
        start = time.perf_counter()
        p = pws.calibrate(1.0, 1e-6, c, **kwargs)
        pws.release_tables.cache_clear()
        pws.release_tables(p)
        sec = time.perf_counter() - start
        print(f"  eps=1 delta=1e-6 C={c:<4d} {str(kwargs):<58} M={p.max_frequency:<7d} "
              f"{p.beyond_table:<5} eps0={p.key_epsilon:.4g} {sec:.2f}s")
    p = pws.calibrate(1.0, 1e-6, 8)
    tables = pws.release_tables(p)
    n = 10 ** 6
    freqs = zipf_frequencies(n, 1.0)
    rng = samplers.secure_random()
    for label, table in (("keys", None), ("keys_and_frequencies", tables.table)):
        def run():
            keep, tokens = sanitize(freqs, keep_probabilities=tables.keep, frequency_table=table,
                                    rng=rng, beyond_table=p.beyond_table)
            tables.estimate(tokens[keep])
        sec = _timed(run)
        print(f"  sanitize kernel, {label:<20} 1e6 Zipf[1] keys, SecureRandom: "
              f"{sec:.3f}s ({n / sec / 1e6:.1f} M keys/s)")


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="smaller support, fewer points")
    args = parser.parse_args(argv)
    size = 10 ** 5 if args.quick else 10 ** 6
    deltas = [10.0 ** -k for k in range(8, 0, -1)]
    section_ratio()
    section_delta_sweep(size, deltas if not args.quick else deltas[::2],
                        [("none", None), ("ppswor", 0.01)])
    section_tau_sweep(size, [1.0, 0.1, 0.01, 1e-3, 1e-4])
    section_nrmse((0.5, 0.1) if args.quick else (0.5, 0.25, 0.1),
                  [1.0, 0.1, 0.01, 1e-3, 1e-4, 1e-5])
    section_monte_carlo(10 ** 5)
    section_speed()


if __name__ == "__main__":
    main()

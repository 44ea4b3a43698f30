"""Timing of the Gaussian/Laplace accounting: gshm.delta and every calibration.

Run from the repository root:  python -m benchmarks.bench_accounting [--repeat 5]

Prints one table: the median and best wall time and the best CPU time (process_time, which
a busy shared machine inflates less) of each call over --repeat runs, after one warm-up
run that fills caches such as the discrete Gaussian normalising constants.
Figures, not assertions: the targets (gshm.delta for C_u = 1e5 under 50 ms, any
calibration under 1 s) are read off the table.
"""
import argparse
import statistics
import time

from thresher.accounting import gaussian, gshm, laplace_threshold

C_URL, EPS_URL, DELTA_URL = 51914, 0.349, 1e-5


def cases():
    yield "gaussian.sigma_for eps=1 delta=1e-8", lambda: gaussian.sigma_for(1.0, 1e-8)
    for noise in gshm.NOISES:
        yield (f"gshm.delta C_u=1e5 sigma=2228 {noise}",
               lambda noise=noise: gshm.delta(EPS_URL, 2228.0, 16176, 100_000, noise=noise))
        yield (f"gshm.delta C_u=8 sigma=14.4 {noise}",
               lambda noise=noise: gshm.delta(1.0, 14.4, 87, 8, noise=noise))
    for method in gshm.METHODS:
        yield (f"gshm.min_threshold_gap paper C_u=51914 sigma=2396 {method}",
               lambda method=method: gshm.min_threshold_gap(EPS_URL, DELTA_URL, 2396.0, C_URL,
                                                            method=method))
    for noise in gshm.NOISES:
        for c_u in (1, 8, 100, 51914):
            yield (f"gshm.calibrate default C_u={c_u} eps=1 delta=1e-8 {noise}",
                   lambda c_u=c_u, noise=noise: gshm.calibrate(1.0, 1e-8, c_u, noise=noise))
        yield (f"gshm.calibrate sigma=20 C_u=8 {noise}",
               lambda noise=noise: gshm.calibrate(1.0, 1e-8, 8, sigma=20.0, noise=noise))
        yield (f"gshm.calibrate threshold=150 C_u=8 {noise}",
               lambda noise=noise: gshm.calibrate(1.0, 1e-8, 8, threshold=150, noise=noise))
        yield (f"gshm.calibrate threshold=40000 C_u=51914 {noise}",
               lambda noise=noise: gshm.calibrate(EPS_URL, DELTA_URL, C_URL, threshold=40000,
                                                  noise=noise))
    for model in laplace_threshold.MODELS:
        for noise in laplace_threshold.NOISES:
            for c in (8, 1000):
                yield (f"laplace.calibrate default {model} C={c} {noise}",
                       lambda model=model, noise=noise, c=c: laplace_threshold.calibrate(
                           1.0, 1e-8, c, model=model, noise=noise))
        yield (f"laplace.calibrate threshold given {model} C=100",
               lambda model=model: laplace_threshold.calibrate(
                   1.0, 1e-8, 100, model=model, threshold=2500))
    yield ("laplace.delta l1 C=300 scale=0.6C/eps (O(C^2) enumeration)",
           lambda: laplace_threshold.delta(2.0, 0.6 * 300 / 2.0, 3000, 300, model="l1"))
    yield ("laplace.calibrate scale=60 l0 C=100",
           lambda: laplace_threshold.calibrate(1.0, 1e-8, 100, scale=60.0))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    rows = []
    for name, call in cases():
        call()  # warm-up
        times, cpu = [], []
        for _ in range(args.repeat):
            start, start_cpu = time.perf_counter(), time.process_time()
            result = call()
            times.append(time.perf_counter() - start)
            cpu.append(time.process_time() - start_cpu)
        rows.append((name, statistics.median(times), min(times), min(cpu), _summary(result)))
    width = max(len(r[0]) for r in rows)
    print(f"{'call':<{width}}  {'median ms':>9}  {'best ms':>7}  {'best cpu ms':>11}  result")
    for name, median, best, best_cpu, summary in rows:
        print(f"{name:<{width}}  {1e3 * median:>9.1f}  {1e3 * best:>7.1f}  {1e3 * best_cpu:>11.1f}  {summary}")


def _summary(result):
    if hasattr(result, "threshold"):
        scale = getattr(result, "sigma", None) or getattr(result, "scale", None)
        return f"scale={scale:.6g} threshold={result.threshold:.6g} delta={result.delta:.3g}"
    if isinstance(result, float):
        return f"{result:.6g}"
    return str(result)


if __name__ == "__main__":
    main()

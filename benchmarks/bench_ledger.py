"""Time per ledger reservation as a dataset's history grows (issue 35): 10,000
reservations on one SQLite dataset, each a real ``reserve`` transaction (open, BEGIN
IMMEDIATE, read the dataset's row with its running sums, admit, insert, update the sums,
commit, close), in both composition modes.

Run from the repository root:  python -m benchmarks.bench_ledger [--count 10000]

Prints, per block of 1,000 reservations, the wall and CPU time per reservation and the
1-minute load average, then the peak RSS. Flat in the count: a reservation reads one
row (the running sums), never the history. Figures, not assertions.
"""
import argparse
import os
import resource
import tempfile
import time

from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import ledger


def bench(mode, count, block, folder):
    """Reserve ``count`` releases on one dataset; print a line per ``block``."""
    budget = ledger.BudgetSpec(ledger=os.path.join(folder, f"{mode}.sqlite"), dataset="d",
                               epsilon=1e6, delta=0.5, composition=mode)
    charge = comp.Charge(comp.dec(0.01), comp.dec(1e-9), comp.dec("0.0000125"),
                         comp.dec("1E-12"))
    print(f"{mode}: {'reservations':>12} {'wall ms/res':>12} {'cpu ms/res':>11}  load1",
          flush=True)
    for start in range(0, count, block):
        wall, cpu = time.perf_counter(), time.process_time()
        for _ in range(block):
            ledger.reserve_charge(budget, "r", "0" * 64, charge)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        print(f"{mode}: {start + block:>12} {1e3 * wall / block:>12.3f} "
              f"{1e3 * cpu / block:>11.3f}  {os.getloadavg()[0]:.2f}", flush=True)
    shown = ledger.summary(budget.ledger)[0]
    assert len(shown["releases"]) == count and "warning" not in shown


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--count", type=int, default=10_000)
    parser.add_argument("--block", type=int, default=1_000)
    parser.add_argument("--modes", default="zcdp,basic")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as folder:
        for mode in args.modes.split(","):
            bench(mode, args.count, args.block, folder)
    print(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()

"""Print the audit table of docs/privacy_testing.md: every scenario's empirical epsilon
lower bound next to its claim.

    python -m tests.audit.report                 # the default-run sizes (about 1 minute)
    python -m tests.audit.report --scale 10      # 10x the trials (the slow-marker sizes)
"""
import argparse
import math
import time

from tests.audit import scenarios


def _fmt(x):
    return "-inf" if x == -math.inf else f"{x:.3f}"


def rows(scale=1, seed=11, mutation_seed=13):
    for kind, registry, s in (("honest", scenarios.HONEST, seed),
                              ("mutation", scenarios.MUTATIONS, mutation_seed)):
        for entry in registry:
            name, builder = entry[0], entry[1]
            try:
                sc = builder()
            except scenarios.MissingKernel as err:
                yield kind, name, None, str(err), None
                continue
            start = time.time()
            result = sc.audit(seed=s, trials=sc.trials * scale)
            yield kind, name, sc, result, time.time() - start


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--scale", type=int, default=1, help="multiply every scenario's trials")
    args = parser.parse_args()
    print("| kind | scenario | mechanism / pair | parameters | claimed (eps, delta) "
          "| eps lower bound | verdict | trials/side |")
    print("|---|---|---|---|---|---|---|---|")
    for kind, name, sc, result, seconds in rows(args.scale):
        if sc is None:
            print(f"| {kind} | {name} | | | | | skipped: {result} | |")
            continue
        if kind == "honest":
            verdict = "VIOLATION" if result.violated else "within claim"
        else:
            verdict = "flagged" if result.violated else "NOT FLAGGED"
        print(f"| {kind} | {name} | {sc.mechanism} / {sc.case} | {sc.parameters} | "
              f"({sc.claimed_epsilon:g}, {sc.claimed_delta:.3g}) | "
              f"{_fmt(result.epsilon_lower_bound)} | {verdict} | {result.trials:,} |", flush=True)


if __name__ == "__main__":
    main()

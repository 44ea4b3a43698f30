"""Choosing C on the quickstart data: the paper's V(C) against thresher's balanced V.

The quickstart (200 000 rows, 18.6k users, 21.9k Zipf-distributed words) is the opposite
of paper 002's Table 1 data: most keys are rare and suppressed. For each release kind with
a noise scale in the score (gaussian, laplace; l0 model, epsilon = 1, delta = 1e-8, the
default auto settings: sqrt(2) grid to C_m = 128, epsilon_select = 0.1) this script

* calibrates every candidate with the kind's own ``calibrate`` (``pipelines.planning.plan``),
* bounds each user to C keys with one coupled uniform ranking (every C gets its exact
  PerUserBound distribution), releases with thresher's kernel
  ``transforms.selection.noisy_threshold.noisy_threshold`` (discrete noise, the calibrated
  thresholds) ``--draws`` times, and measures the l1 error against the true
  distinct-user counts of every word (a suppressed word costs its whole count),
* computes V(C) with ``accounting.contribution_bound`` for the paper's weights
  (``dropped_weight: paper``) and thresher's (``balanced``), and the expected l1 error
  of the exponential mechanism's choice (exact, over its distribution).

    python benchmarks/bench_auto_bound_quickstart.py     # a few seconds
"""
import argparse
import os
import sys

import numpy as np
import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)

from thresher.accounting import contribution_bound as cb  # noqa: E402
from thresher.accounting import selection  # noqa: E402
from thresher.pipelines.specs import spec as spec_mod  # noqa: E402
from thresher.pipelines.planning.plan import make_plan  # noqa: E402
from thresher.transforms.selection.noisy_threshold import noisy_threshold  # noqa: E402
from thresher.transforms.bounding.rand_clip import rank_within_user  # noqa: E402

DATA = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")
SPEC = """
name: quickstart-auto
input: {{path: {data}, user: user_id, keys: [word]}}
privacy: {{epsilon: 1.0, delta: 1.0e-8}}
bounding: {{max_keys_per_user: auto, auto: {{objective: l1, dropped_weight: {rule}}}}}
mechanism: {{kind: {kind}}}
output: {{path: {out}}}
"""


def plan_for(kind, rule, tmp):
    path = os.path.join(tmp, f"{kind}-{rule}.yaml")
    with open(path, "w") as f:
        f.write(SPEC.format(data=DATA, rule=rule, kind=kind, out=os.path.join(tmp, "out")))
    return make_plan(spec_mod.load(path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--draws", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = np.random.default_rng(args.seed)
    table = pq.read_table(DATA, columns=["user_id", "word"])
    _, users = np.unique(table.column("user_id").to_numpy(zero_copy_only=False),
                         return_inverse=True)
    _, keys = np.unique(table.column("word").to_numpy(zero_copy_only=False), return_inverse=True)
    pair_users, pair_keys, pair_counts = cb.pairs_from_records(users, keys)   # distinct pairs
    num_keys = int(keys.max()) + 1
    truth = np.bincount(pair_keys, minlength=num_keys)
    ranks = rank_within_user(pair_users, rng.random(len(pair_users)))
    print(f"quickstart: {len(users):,} rows, {int(users.max()) + 1:,} users, {num_keys:,} words, "
          f"{len(pair_users):,} (user, word) pairs; {args.draws} release draws per C")
    import tempfile
    with tempfile.TemporaryDirectory() as tmp:
        for kind in ("gaussian", "laplace"):
            plans = {rule: plan_for(kind, rule, tmp) for rule in ("paper", "balanced")}
            plan = plans["balanced"]
            grid = np.array(plan.candidates)
            losses, released = [], []
            for c in grid:
                p = plan.params_by_bound[int(c)]
                bounded = np.bincount(pair_keys[ranks < c], minlength=num_keys)
                scale = p["sigma"] if kind == "gaussian" else p["scale"]
                per_draw = []
                for _ in range(args.draws):
                    keep, values = noisy_threshold(bounded, noise=kind, scale=scale,
                                                   pre_threshold=p["pre_threshold"],
                                                   threshold=p["threshold"], rng=rng)
                    per_draw.append((np.abs(truth - np.where(keep, values, 0)).sum(), keep.sum()))
                losses.append(np.mean([x[0] for x in per_draw]))
                released.append(np.mean([x[1] for x in per_draw]))
            losses = np.array(losses)
            best = int(np.argmin(losses))
            print(f"\n{kind} (l0): l1 error by C (thousands; released keys in brackets)")
            print("| C | " + " | ".join(str(c) for c in grid) + " |")
            print("|" + "---|" * (len(grid) + 1))
            print("| l1 error | " + " | ".join(f"{x / 1e3:.1f} [{k:.0f}]"
                                             for x, k in zip(losses, released)) + " |")
            for rule, pl in plans.items():
                score = pl.bound_score()
                values = cb.score_values(pair_users, pair_keys, pair_counts, score)[0]
                prob = selection.exponential_mechanism_probabilities(
                    -values, pl.select_stage.epsilon, score.sensitivity, monotone=True)
                print(f"{rule:>8}: w = {score.dropped_weight:.2f}, s = {score.suppressed_weight:.2f}, "
                      f"Delta = {score.sensitivity:.0f}; argmin V: C = {grid[np.argmin(values)]}; "
                      f"E[l1 error of the private C] = {prob @ losses / 1e3:.1f}k = "
                      f"{prob @ losses / losses[best]:.2f} x best (C = {grid[best]}, "
                      f"{losses[best] / 1e3:.1f}k); Pr[C >= 64] = {prob[grid >= 64].sum():.2f}")


if __name__ == "__main__":
    main()

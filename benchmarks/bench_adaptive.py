"""Keys released by ``adaptive`` against ``weighted_gaussian`` at fixed bounds (issue 15).

Each figure is one real ``pipelines.running.release.run`` (the code of ``thresher run``, Beam's
default in-process runner) on the docstring corpus of ``benchmarks/bench_keys.py``
(cached under ``--data-dir``; built in about 80 s when absent) or ``--corpus``, at
delta = 1e-6, ``max_keys_per_user`` C (an integer or ``auto``) and the kinds' defaults
unless ``--fractions`` lists adaptive round_fractions to try (each "a,b" or "a,b,c").
Each line also gives the plan's CPU time (``make_plan``: every calibration).

    python benchmarks/bench_adaptive.py --bounds auto 256 --seeds 3
"""
import argparse
import os
import sys
import tempfile
import time

import pyarrow.parquet as pq

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

SPEC = """name: adaptive-bench
input: {{path: {data}, user: user, keys: [word]}}
privacy: {{epsilon: {epsilon!r}, delta: 1.0e-6}}
bounding: {{max_keys_per_user: {bound}}}
mechanism: {mechanism}
output: {{path: {out}}}
"""


def run(data, tmp, mechanism, epsilon, bound, tag):
    from thresher.pipelines.running import release
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    out = os.path.join(tmp, f"out-{tag}")
    path = os.path.join(tmp, f"{tag}.yaml")
    with open(path, "w") as f:
        f.write(SPEC.format(data=data, epsilon=float(epsilon), bound=bound, out=out,
                            mechanism=mechanism))
    t0, c0 = time.perf_counter(), time.process_time()
    plan = make_plan(spec_mod.load(path))
    plan_cpu = time.process_time() - c0
    release.run(plan, overwrite=True)
    return pq.read_metadata(os.path.join(out, "released.parquet")).num_rows, \
        time.perf_counter() - t0, plan_cpu


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data-dir", default=os.path.join(ROOT, "benchmarks", "data"))
    parser.add_argument("--corpus", help="a (user, word) Parquet instead of the docstring corpus")
    parser.add_argument("--epsilon", type=float, default=1.0)
    parser.add_argument("--bounds", nargs="+", default=["auto", "256"],
                        help="max_keys_per_user values (integers or auto)")
    parser.add_argument("--seeds", type=int, default=1, help="runs per configuration")
    parser.add_argument("--fractions", nargs="*", default=[],
                        help="adaptive round_fractions to try besides the default")
    args = parser.parse_args(argv)
    if args.corpus:
        data = args.corpus
    else:
        from benchmarks.bench_keys import corpus
        data = corpus(args.data_dir)
    mechanisms = [("weighted_gaussian", "{kind: weighted_gaussian}"),
                  ("adaptive", "{kind: adaptive}")]
    for f in args.fractions:
        rounds = len(f.split(","))
        mechanisms.append((f"adaptive {f}", f"{{kind: adaptive, rounds: {rounds}, "
                                            f"round_fractions: [{f}]}}"))
    with tempfile.TemporaryDirectory() as tmp:
        print(f"epsilon={args.epsilon:g}, delta=1e-6, keys released (mean of {args.seeds} runs)")
        for bound in args.bounds:
            for name, mech in mechanisms:
                keys, secs, plan_cpu = [], 0.0, 0.0
                for s in range(args.seeds):
                    k, t, c = run(data, tmp, mech, args.epsilon, bound,
                                  f"{name.replace(' ', '_').replace(',', '-')}-{bound}-{s}")
                    keys.append(k)
                    secs += t
                    plan_cpu += c
                print(f"C={bound:>5s}  {name:24s} keys={sum(keys) / len(keys):8.1f} "
                      f"({', '.join(map(str, keys))})  {secs / len(keys):6.1f} s/run, plan "
                      f"{plan_cpu / len(keys):5.2f} s CPU", flush=True)


if __name__ == "__main__":
    main()

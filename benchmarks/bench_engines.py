"""One release on each engine, side by side: wall time, CPU time, rows/s.

    python benchmarks/bench_engines.py [--rows 1000000 10000000] [--only NAME ...]

The quickstart spec (``max_keys_per_user: 8``, gaussian) on ``benchmarks/datagen.py``
data of each size, through ``python -m thresher run SPEC --overwrite -- <flags>``:

- ``in_process``: the default FnApiRunner, one process;
- ``fnapi_1w`` / ``fnapi_2w``: the FnApiRunner with 1 / 2 worker processes
  (``--direct_running_mode=multi_processing``);
- ``prism_ext_1`` / ``prism_ext_2``: Prism (``thresher engines fetch prism``) with Python
  work on Beam's EXTERNAL worker pool (``worker_pool_main``), ``--sdk_worker_parallelism``
  1 / 2: the pool's SDK worker processes do the work, not the launcher (LOOPBACK would run
  all Python in the launcher);
- Flink and Spark: printed as not run while their job-server jars are not served.

CPU time is the whole process tree of the run (launcher, Prism, the worker pool and its
SDK workers), read from /proc every 0.2 s (a process that lives less than that is
missed: the figure is a lower bound). Prism and the pool run inside a loopback-only network
namespace (tests/distributed/loopback_netns.py; needs root, as CI has). The machine's load average
is printed with the table: on a shared 2-core machine the wall times are upper bounds.
"""
import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NETNS = os.path.join(ROOT, "tests", "distributed", "loopback_netns.py")
TICK = os.sysconf("SC_CLK_TCK")

SPEC = """name: bench_engines
input: {{path: {input}, format: parquet, user: user_id, keys: [word]}}
privacy: {{epsilon: 1.0, delta: 1.0e-8}}
bounding: {{max_keys_per_user: 8}}
mechanism: {{kind: gaussian, pre_threshold: 1}}
output: {{path: {output}}}
"""


def _tree_cpu(root_pid):
    """CPU seconds (user + system) of ``root_pid``'s descendants now alive, per pid."""
    children = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as handle:
                fields = handle.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        children.setdefault(int(fields[1]), []).append((int(entry), fields))
    out, todo = {}, [root_pid]
    while todo:
        pid = todo.pop()
        for child, fields in children.get(pid, []):
            out[child] = (int(fields[11]) + int(fields[12])) / TICK
            todo.append(child)
    return out


def _configs(prism):
    yield "in_process", [], None
    yield "fnapi_1w", ["--direct_running_mode=multi_processing", "--direct_num_workers=1"], None
    yield "fnapi_2w", ["--direct_running_mode=multi_processing", "--direct_num_workers=2"], None
    if prism:
        for n in (1, 2):
            yield (f"prism_ext_{n}", ["--runner=PrismRunner", f"--prism_location={prism}",
                                      "--environment_type=EXTERNAL",
                                      f"--sdk_worker_parallelism={n}"], True)


def _run(spec, flags, pool, folder, timeout):
    """One release; (wall s, CPU s of the whole process tree, SDK workers, error)."""
    command = [sys.executable, "-m", "thresher.pipelines.cli", "run", spec, "--overwrite", "--quiet",
               "--"] + list(flags)
    if pool:     # Prism and the pool listen on all interfaces: run them in a loopback netns
        command = [sys.executable, NETNS, "--timeout", str(timeout), "--pool", sys.executable,
                   "--pool-log", os.path.join(folder, "pool.log"), "--"] + command + [
                   "--environment_config={pool}"]
    seen = {}
    started = time.monotonic()
    process = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE, text=True,
                               env=dict(os.environ, PYTHONPATH=ROOT))
    errors = []
    reader = threading.Thread(target=lambda: errors.extend(process.stderr), daemon=True)
    reader.start()
    while process.poll() is None:
        seen.update(_tree_cpu(os.getpid()))
        time.sleep(0.2)
        if time.monotonic() - started > timeout + 180:
            process.kill()
    wall = time.monotonic() - started
    reader.join(timeout=10)
    if process.returncode != 0:
        return None, None, None, (errors or ["no output"])[-1].strip()[:160]
    workers = None
    for line in errors:
        if "the worker pool started" in line:
            workers = int(line.split("started")[1].split()[0])
    return wall, sum(seen.values()), workers, None


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=float, nargs="+", default=[1e6, 1e7])
    parser.add_argument("--only", nargs="+", default=None)
    parser.add_argument("--timeout", type=int, default=1800)
    args = parser.parse_args()
    sys.path.insert(0, ROOT)
    from thresher.pipelines.running import engines
    prism = engines.cached(engines.engine("prism"))
    folder = tempfile.mkdtemp(prefix="bench_engines-")
    print(f"load average before: {os.getloadavg()[0]:.1f} {os.getloadavg()[1]:.1f} "
          f"{os.getloadavg()[2]:.1f} on {os.cpu_count()} cores", flush=True)
    print(f"{'rows':>9} {'engine':<12} {'wall s':>8} {'cpu s':>8} {'rows/s':>10} {'workers':>7}  "
          f"load1", flush=True)
    try:
        for rows in args.rows:
            rows = int(rows)
            data = os.path.join(folder, f"data-{rows}.parquet")
            subprocess.run([sys.executable, os.path.join(ROOT, "benchmarks", "datagen.py"), data,
                            "--rows", str(rows), "--users", str(max(20_000, rows // 10))],
                           check=True, cwd=ROOT, env=dict(os.environ, PYTHONPATH=ROOT))
            spec = os.path.join(folder, f"spec-{rows}.yaml")
            with open(spec, "w") as handle:
                handle.write(SPEC.format(input=data, output=os.path.join(folder, f"out-{rows}")))
            for name, flags, pool in _configs(prism):
                if args.only and name not in args.only:
                    continue
                wall, cpu, workers, error = _run(spec, flags, pool, folder, args.timeout)
                load = os.getloadavg()[0]
                if error:
                    print(f"{rows:>9} {name:<12} failed: {error}", flush=True)
                    continue
                print(f"{rows:>9} {name:<12} {wall:>8.1f} {cpu:>8.1f} {rows / wall:>10.0f} "
                      f"{'' if workers is None else workers:>7}  {load:.1f}", flush=True)
            for name in ("flink_p1", "flink_p2", "spark"):
                print(f"{rows:>9} {name:<12} not run: Beam's job-server jar is not served "
                      f"here (docs/running.md, Engines)", flush=True)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()

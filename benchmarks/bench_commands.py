"""Wall and CPU time of the ``thresher`` commands that run no pipeline (issue 34, item 6).

``schema``, ``validate``, ``plan`` (calibration cached), ``show``, ``report`` (text) and
refused specs answer without importing Beam, pandas or SciPy's statistics; the target is
<= 0.5 s wall each on an idle machine. ``report --html`` (matplotlib) and a ``plan`` whose
calibration is not cached yet (SciPy, the calibration itself) are measured on their own
rows. Two floors put the figures in context: the interpreter alone (``python -c pass``)
and the interpreter importing numpy, pyarrow and PyYAML (what the commands need at least).

Each command runs in a fresh process (``python -m thresher.pipelines.cli``, the checkout's
code), ``--repeats`` times in turns; the table prints the median wall time, the median CPU
time (user + system, of that process: ``os.wait4``), the peak RSS and the 1-minute load
average before the first and after the last run. The machine is shared: CPU time is the
figure that load distorts least.

The release that ``show`` and ``report`` read is made once, by ``thresher run`` of the
bundled quickstart spec (200,000 rows) into a temporary folder; the calibration cache is a
folder of this run (``THRESHER_CACHE_DIR``), warmed by one ``plan`` first.

    python -m benchmarks.bench_commands [--repeats 5]
"""
import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
QUICKSTART = os.path.join(ROOT, "configs", "examples", "quickstart.yaml")
DATA = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")


def run_once(cmd, env, cwd):
    """(wall s, cpu s, peak RSS MB, exit code) of one fresh process."""
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - t0
    proc.returncode = os.waitstatus_to_exitcode(status)
    return wall, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024, proc.returncode


def measure(cmd, env, cwd, repeats, prepare=None):
    load0 = os.getloadavg()[0]
    runs = []
    for _ in range(repeats):
        if prepare is not None:
            prepare()
        runs.append(run_once(cmd, env, cwd))
    load1 = os.getloadavg()[0]
    wall = statistics.median(r[0] for r in runs)
    cpu = statistics.median(r[1] for r in runs)
    rss = max(r[2] for r in runs)
    codes = sorted({r[3] for r in runs})
    return wall, cpu, rss, codes, (load0, load1)


def write_spec(path, **changes):
    """The quickstart spec with absolute paths (and ``changes`` as raw YAML lines)."""
    import yaml
    with open(QUICKSTART, encoding="utf-8") as handle:
        spec = yaml.safe_load(handle)
    spec["input"]["path"] = DATA
    spec["output"]["path"] = changes.pop("output")
    for dotted, value in changes.items():
        section, field = dotted.split("__")
        spec.setdefault(section, {})[field] = value
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle, sort_keys=False)
    return path


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    work = tempfile.mkdtemp(prefix="thresher-bench-commands-")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = os.path.join(work, "pycache")
    env["THRESHER_CACHE_DIR"] = os.path.join(work, "cache")
    thresher = [sys.executable, "-m", "thresher.pipelines.cli"]
    out = os.path.join(work, "out")
    spec = write_spec(os.path.join(work, "quickstart.yaml"), output=out)
    refused = write_spec(os.path.join(work, "refused.yaml"), output=out + "2",
                         privacy__epsilon=-1)
    unknown = write_spec(os.path.join(work, "unknown.yaml"), output=out + "3",
                         mechanism__sigmaa=3)
    missing = write_spec(os.path.join(work, "missing.yaml"), output=out + "4",
                         input__user="no_such_column")
    t0 = time.perf_counter()
    made = subprocess.run(thresher + ["run", spec, "-q"], env=env, cwd=work,
                          capture_output=True, text=True)
    if made.returncode != 0:
        sys.exit(f"thresher run of the quickstart failed: {made.stderr[-2000:]}")
    print(f"# release made in {time.perf_counter() - t0:.1f} s: {out}")
    html = os.path.join(work, "page.html")

    def fresh_cache():
        import shutil
        shutil.rmtree(env["THRESHER_CACHE_DIR"], ignore_errors=True)

    def no_page():
        if os.path.exists(html):
            os.remove(html)

    rows = [
        ("python -c pass (floor)", [sys.executable, "-c", "pass"], None),
        ("python: import numpy, pyarrow, yaml", [sys.executable, "-c",
                                                 "import numpy, pyarrow, yaml"], None),
        ("thresher --version", thresher + ["--version"], None),
        ("thresher schema", thresher + ["schema"], None),
        ("thresher validate", thresher + ["validate", spec], None),
        ("thresher plan (cached)", thresher + ["plan", spec], None),
        ("thresher plan --json (cached)", thresher + ["plan", spec, "--json"], None),
        ("thresher plan -v (cached)", thresher + ["plan", spec, "-v"], None),
        ("thresher show", thresher + ["show", out], None),
        ("thresher show --format json", thresher + ["show", out, "--format", "json"], None),
        ("thresher report", thresher + ["report", out], None),
        ("refused: privacy.epsilon -1 (plan)", thresher + ["plan", refused], None),
        ("refused: unknown field (validate)", thresher + ["validate", unknown], None),
        ("refused: missing column (validate)", thresher + ["validate", missing], None),
        ("separate: thresher plan (uncached)", thresher + ["plan", spec], fresh_cache),
        ("separate: thresher report --html", thresher + ["report", out, "--html", html],
         no_page),
    ]
    subprocess.run(thresher + ["plan", spec], env=env, cwd=work, capture_output=True)  # warm
    for _, cmd, prepare in rows:            # bytecode cache, not counted
        if prepare is not None:
            prepare()
        run_once(cmd, env, work)
    subprocess.run(thresher + ["plan", spec], env=env, cwd=work, capture_output=True)
    print(f"## thresher commands that run no pipeline: median of {args.repeats} fresh "
          f"processes (target <= 0.5 s wall idle)")
    print(f"{'command':<40} {'wall s':>7} {'cpu s':>7} {'RSS MB':>7} {'exit':>6} {'load':>11}")
    for label, cmd, prepare in rows:
        wall, cpu, rss, codes, load = measure(cmd, env, work, args.repeats, prepare)
        if prepare is fresh_cache:
            fresh_cache()
            subprocess.run(thresher + ["plan", spec], env=env, cwd=work, capture_output=True)
        print(f"{label:<40} {wall:>7.2f} {cpu:>7.2f} {rss:>7.0f} "
              f"{','.join(map(str, codes)):>6} {load[0]:>5.1f}->{load[1]:<4.1f}", flush=True)
    import shutil
    shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())

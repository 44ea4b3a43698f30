"""Plan cost of the worst weighted_sampling specs (issue 18: bounded resources from any spec).

``thresher plan`` of a ppswor / priority weighted_sampling spec builds the PWS tables
(paper 001 Alg. 3/4, ``accounting.pws``): the keep probabilities (keys only) and the Alg. 4
frequency table, whose rows are built one at a time. Before this file, sampling thresholds
near the old floor (1e-6) took 8-60 s and up to ~1 GB to plan. Now the tables are capped
(``pws.MAX_KEEP_LENGTH``, ``MAX_TABLE_ENTRIES``, ``MAX_BAND_ROWS``) and a spec whose
automatic table would exceed them is refused before anything is built
(``pipelines.limits``), naming the field and the value that works.

Each case here is the largest of its family that is still accepted (or the smallest that is
refused), run through the real CLI (``pipelines.cli.main``) in one fresh interpreter whose
address space is capped at 3 GB (``resource.setrlimit(RLIMIT_AS)``), with a 60 s alarm per
case. Asserted: the exit code (0 or 2) and the message, no traceback; peak resident memory
<= 420 MB (VmHWM; ~240 MB of it is the interpreter with Beam and numpy imported; measured peaks
are <= ~375 MB) and <= 6 s of CPU per plan (measured <= ~2.2 s; CPU time, not wall time,
so that a loaded machine does not fail the test; before the caps the worst cases took
20-60 s). The PWS caches are cleared between cases, so each plan builds its own tables.
"""
import json
import os
import subprocess
import sys

import pytest
import yaml

from accounting import pws
from tests.robustness.conftest import ROOT

MEMORY_CAP = 3 << 30
CASE_SECONDS = 60
PEAK_RSS_MB = 420
CPU_SECONDS = 6.0

_DRIVER = r"""
import contextlib, io, json, logging, resource, signal, sys, time
resource.setrlimit(resource.RLIMIT_AS, ({cap}, {cap}))
from pipelines.cli import main
from accounting import pws

class Timeout(BaseException):
    pass

def alarm(*_):
    raise Timeout()

def peak_mb():
    # VmHWM: this process's own peak RSS (ru_maxrss survives execve on Linux, so it would
    # report the parent's peak, e.g. pytest's after a long suite)
    with open("/proc/self/status", encoding="ascii") as handle:
        for line in handle:
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024

signal.signal(signal.SIGALRM, alarm)
results = []
for argv in json.load(sys.stdin):
    pws._BANDS.clear()
    pws.release_tables.cache_clear()
    try:   # reset VmHWM to the current RSS, so each case's peak is its own (Linux >= 4.0)
        with open("/proc/self/clear_refs", "w", encoding="ascii") as handle:
            handle.write("5")
    except OSError:
        pass   # then peak_mb is the running maximum: still an upper bound per case
    out, err = io.StringIO(), io.StringIO()
    logging.getLogger().handlers[:] = []
    started, cpu = time.time(), time.process_time()
    signal.alarm({seconds})
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code
    except Timeout:
        code = "timeout"
    except MemoryError:
        code = "MemoryError"
    finally:
        signal.alarm(0)
    results.append({{"code": code, "out": out.getvalue(), "err": err.getvalue(),
                    "seconds": time.time() - started, "cpu": time.process_time() - cpu,
                    "peak_mb": peak_mb()}})
json.dump(results, sys.stdout)
"""

ROWS, KEEP = pws.MAX_BAND_ROWS, pws.MAX_KEEP_LENGTH
# smallest thresholds whose automatic tables fit: priority 1/cap, ppswor 54 ln 2 / cap
PRIORITY_T = 1.001 / ROWS
PPSWOR_T = 37.43 * 1.001 / ROWS
PPSWOR_KEYS_T = 37.43 * 1.001 / KEEP

# (name, privacy, max_keys_per_user, mechanism, exit code, needles)
CASES = [
    # accepted: the largest tables of each kind
    ("priority_rows_cap_biased_down", (10.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": PRIORITY_T, "estimator": "biased_down"}, 0, ()),
    ("ppswor_rows_cap", (10.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_T}, 0, ()),
    ("priority_rows_cap_eps1", (1.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": PRIORITY_T}, 0, ()),
    ("ppswor_keys_cap", (1.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_KEYS_T, "report": "keys"}, 0, ()),
    ("priority_keys_threshold_floor", (10.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": 1e-6, "report": "keys"}, 0, ()),
    ("none_keys_max_frequency_cap", (10.0, 1e-8), 1,
     {"max_frequency": KEEP, "report": "keys"}, 0, ()),
    ("priority_max_frequency_rows_cap", (10.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": 1e-6, "max_frequency": ROWS}, 0, ()),
    ("entries_cap_small_epsilon", (0.003, 1e-8), 1, {}, 0, ()),
    ("ppswor_rows_cap_C_10000", (1.0, 1e-6), 10_000,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_T}, 0, ()),
    # refused before anything is built
    ("priority_threshold_1e-6", (1.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": 1e-6}, 2,
     ("mechanism.sampling_threshold", "use a threshold >= 2e-05", "max_frequency <= 50000")),
    ("ppswor_keys_threshold_1e-6", (1.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": 1e-6, "report": "keys"}, 2,
     ("mechanism.sampling_threshold", "use a threshold >= 1.79e-05",
      "max_frequency <= 2097152")),
    ("ppswor_threshold_just_too_small", (10.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_T * 0.99}, 2,
     ("mechanism.sampling_threshold", "use a threshold >=")),
    ("max_frequency_rows_cap_plus_one", (10.0, 1e-8), 1, {"max_frequency": ROWS + 1}, 2,
     ("mechanism.max_frequency", f"<= {ROWS}")),
    ("keys_max_frequency_cap_plus_one", (10.0, 1e-8), 1,
     {"max_frequency": KEEP + 1, "report": "keys"}, 2,
     ("mechanism.max_frequency", f"<= {KEEP}")),
]


def _spec(folder, privacy, bound, mechanism):
    return {"name": "pws-cost",
            "input": {"path": os.path.join(folder, "in.parquet"), "user": "user_id",
                      "keys": ["word"]},
            "privacy": {"epsilon": privacy[0], "delta": privacy[1]},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "weighted_sampling", **mechanism},
            "output": {"path": os.path.join(folder, "out")}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("pws_cost")
    argvs = []
    for name, privacy, bound, mechanism, _, _ in CASES:
        folder = root / name
        folder.mkdir()
        path = folder / "spec.yaml"
        path.write_text(yaml.safe_dump(_spec(str(folder), privacy, bound, mechanism)))
        argvs.append(["plan", str(path)])
    driver = _DRIVER.format(cap=MEMORY_CAP, seconds=CASE_SECONDS)
    proc = subprocess.run([sys.executable, "-c", driver], cwd=ROOT, input=json.dumps(argvs),
                          capture_output=True, text=True,
                          timeout=CASE_SECONDS * len(argvs) + 60)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return dict(zip([c[0] for c in CASES], json.loads(proc.stdout)))


@pytest.mark.parametrize("name,privacy,bound,mechanism,code,needles", CASES,
                         ids=[c[0] for c in CASES])
def test_worst_weighted_sampling_plans_are_bounded(results, name, privacy, bound, mechanism,
                                                   code, needles):
    result = results[name]
    where = (f"case {name}: exit {result['code']}, {result['seconds']:.1f} s wall, "
             f"{result['cpu']:.1f} s cpu, peak {result['peak_mb']:.0f} MB, "
             f"stderr:\n{result['err'][-2000:]}")
    assert result["code"] == code, where
    assert "Traceback" not in result["err"] and "internal error" not in result["err"], where
    for needle in needles:
        assert needle in result["err"], where
    if code == 0:
        plan = result["out"]
        assert "weighted_sampling" in plan and "max_frequency" in plan, where
    assert result["cpu"] <= CPU_SECONDS, where
    assert result["peak_mb"] <= PEAK_RSS_MB, where


def test_refused_specs_are_refused_before_building_tables(results):
    """A refusal costs what parsing the spec costs (no table is built)."""
    for name, _, _, _, code, _ in CASES:
        if code == 2:
            assert results[name]["cpu"] < 0.5, (name, results[name])

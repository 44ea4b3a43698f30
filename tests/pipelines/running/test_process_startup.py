"""Process settings of the thresher command (pipelines/running/process.py): Beam's DoFn state and
timer specs looked up once per DoFn object give Beam's own answers, and a stateful DoFn
still runs as one on the in-process runner."""
import platform
import subprocess
import sys

import apache_beam as beam
import pytest
from apache_beam.coders import VarIntCoder
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from apache_beam.transforms import userstate

from thresher.pipelines.running import process


class _Counting(beam.DoFn):
    SEEN = userstate.BagStateSpec("seen", VarIntCoder())
    FLUSH = userstate.TimerSpec("flush", userstate.TimeDomain.WATERMARK)

    def process(self, element, seen=beam.DoFn.StateParam(SEEN),
                flush=beam.DoFn.TimerParam(FLUSH)):
        seen.add(element[1])
        flush.set(0)

    @userstate.on_timer(FLUSH)
    def emit(self, key=beam.DoFn.KeyParam, seen=beam.DoFn.StateParam(SEEN)):
        yield key, sum(seen.read())


class _Plain(beam.DoFn):
    def process(self, element):
        yield element


@pytest.fixture
def memoized(monkeypatch):
    real, calls = userstate.get_dofn_specs, []

    def counting(dofn):
        calls.append(dofn)
        return real(dofn)
    monkeypatch.setattr(userstate, "get_dofn_specs", counting)   # restored after the test
    process.memoize_dofn_specs()
    process.memoize_dofn_specs()                                  # installs once
    return real, calls


def test_the_memo_answers_as_beam_once_per_object(memoized):
    real, calls = memoized
    dofns = [_Counting(), _Plain(), beam.Map(lambda x, y=1: x + y).fn, _Counting()]
    for _ in range(3):
        for dofn in dofns:
            assert userstate.get_dofn_specs(dofn) == real(dofn)
    assert len(calls) == len(dofns)
    states, timers = userstate.get_dofn_specs(dofns[0])
    assert {s.name for s in states} == {"seen"} and {t.name for t in timers} == {"ts-flush"}  # Beam prefixes timer names
    states.clear()                                 # callers get copies
    assert userstate.get_dofn_specs(dofns[0]) == real(dofns[0])
    assert userstate.is_stateful_dofn(dofns[0]) and not userstate.is_stateful_dofn(dofns[1])


def test_a_stateful_dofn_runs_with_the_memo(memoized):
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        out = (pipeline
               | beam.Create([("a", 1), ("a", 2), ("b", 5)])
               | beam.ParDo(_Counting()))
        assert_that(out, equal_to([("a", 3), ("b", 5)]))


def test_thresher_run_leaves_beam_out_of_full_collections(tmp_path):
    """After ``thresher run``'s process settings, Beam's import objects are in the
    collector's permanent generation (gc.freeze), so a full collection does not scan them;
    objects made later are still collected."""
    probe = """import gc, json, sys
from thresher.pipelines.running import process
process.prepare("run")
process.prepare_pipeline()
frozen = gc.get_freeze_count()
import apache_beam
class Cycle:
    pass
a = Cycle(); a.self = a
ref = __import__("weakref").ref(a)
del a
gc.collect()
print(json.dumps([frozen, "apache_beam.pipeline" in sys.modules, ref() is None]))
"""
    import json
    import subprocess
    import sys

    from tests.pipelines.conftest import ROOT
    proc = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    frozen, beam_imported, collected = json.loads(proc.stdout.strip().splitlines()[-1])
    assert beam_imported and frozen > 50_000 and collected


_FAULTS = r"""
import resource, sys
import numpy as np
from thresher.pipelines.running import process
if sys.argv[1] == "kept":
    assert process.keep_freed_heap()


def touched(n):
    a = np.empty(n, dtype=np.uint8)
    a[::4096] = 1
    return a


faults = 0
for size in (16 << 20, 12 << 20, 20 << 20):
    a = touched(size)                 # a batch's buffer, freed
    del a
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    b = touched(size)                 # the next batch's buffer of the same size
    del b
    faults += resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before
print(faults)
"""


@pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="glibc's malloc")
def test_freed_buffers_are_reused_without_new_page_faults():
    """keep_freed_heap: a freed buffer of 12-20 MB is reused by the next one of its size
    instead of faulting fresh pages in (fresh processes; glibc 2.36 here: 1,012 faults
    by default, 0 kept, the same in every run). In a release at 1e7 rows: 227,000 ->
    61,000-75,000 faults, 1.1-1.4 -> 0.5-1.0 s of system time."""
    faults = {mode: int(subprocess.run([sys.executable, "-c", _FAULTS, mode], check=True,
                                       capture_output=True, text=True).stdout)
              for mode in ("default", "kept")}
    assert faults["kept"] * 4 < faults["default"], faults

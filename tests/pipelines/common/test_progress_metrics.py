"""Progress lines from Beam metrics: real runs on thresher's default runner (Beam's
FnApiRunner, as pipelines.live_metrics.LiveMetricsRunner) print the stage running and the
rows read as Beam's own MetricResults report them while the pipeline runs."""
import io
import re

from thresher.pipelines.common import progress
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.running.live_metrics import LiveMetricsRunner
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run

_METRICS_LINE = re.compile(r"stage ([A-Za-z, ]+); ([\d,]+) rows read \(Beam metrics: "
                           r"(Read/[A-Za-z]+) ([\d,]+)\)")


def test_lines_take_rows_and_stages_from_beam_metrics(write_spec, small_parquet, monkeypatch):
    """With the process-local row counter switched off, the rows in the lines can only
    come from the runner's Beam metrics (the ``rows_read`` counter of the Read step)."""
    monkeypatch.setattr(progress, "count_rows", lambda n: None)
    plan = make_plan(spec_mod.load(write_spec({"input.path": small_parquet})))
    stream = io.StringIO()
    with progress.Reporter(True, stream=stream, interval=0.05):
        run(plan)
    text = stream.getvalue()
    found = [m.groups() for m in _METRICS_LINE.finditer(text)]
    assert found, text
    for stages, rows, step, step_rows in found:
        assert stages and stages != "starting"
        assert int(rows.replace(",", "")) == int(step_rows.replace(",", "")) == 20_000
    assert text.strip().splitlines()[-1].startswith("thresher: progress ")
    assert "finished; 20,000 rows read" in text


_LIVE = {}     # the runner and what the later stage saw (in-process runner: same process)


def _count(x):
    from apache_beam.metrics.metric import Metrics
    Metrics.counter("t", "n").inc(x)
    return x


def _peek(x):
    from apache_beam.metrics.metric import MetricsFilter
    _LIVE["seen"].append([r.committed for r in _LIVE["runner"].metrics().query(
        MetricsFilter().with_name("n"))["counters"]])
    return x


def test_live_runner_metrics_match_the_results():
    """LiveMetricsRunner's metrics() during and after a run are Beam's MetricResults: the
    same counter totals the PipelineResult reports."""
    import apache_beam as beam
    from apache_beam.metrics.metric import MetricsFilter

    runner = LiveMetricsRunner()
    _LIVE.update(runner=runner, seen=[])
    seen = _LIVE["seen"]
    p = beam.Pipeline(runner=runner)
    done = (p | beam.Create([1, 2, 3, 4]) | "Count" >> beam.Map(_count)
            | beam.combiners.ToList())
    _ = done | "Peek" >> beam.Map(_peek)         # a later stage: Count's bundle has finished
    result = p.run()
    result.wait_until_finish()
    final = result.metrics().query(MetricsFilter().with_name("n"))["counters"]
    assert [r.committed for r in final] == [10]
    assert seen == [[10]]                       # read live, while the pipeline ran
    assert [r.committed for r in runner.metrics().query(
        MetricsFilter().with_name("n"))["counters"]] == [10]


def test_runs_without_progress_keep_no_runner_alive():
    """watch() outside a Reporter (progress off: tests, schedulers) keeps no reference to
    the run's runner or result; inside one it does, until the Reporter ends."""
    class Source:
        def metrics(self):
            raise RuntimeError("not queried here")

    progress.watch(Source())
    assert progress._sources == []
    with progress.Reporter(True, stream=io.StringIO(), interval=60):
        progress.watch(Source())
        assert len(progress._sources) == 1
    assert progress._sources == []


def test_a_tick_before_the_first_step_repeats_starting(monkeypatch):
    """A periodic line printed before the command names its first step (a slow start on a
    busy machine) says what the opening line said, ``starting``: no Beam stage and no row
    count yet (it said "stage starting; 0 rows read", which the CLI's step list then read
    as a step of its own)."""
    import time
    monkeypatch.setattr(progress, "_phase", [None])
    monkeypatch.setattr(progress, "FIRST_TICK_S", 0.05)
    stream = io.StringIO()
    with progress.Reporter(True, stream=stream, interval=0.05):
        deadline = time.time() + 10
        while stream.getvalue().count("\n") < 3 and time.time() < deadline:
            time.sleep(0.02)
    lines = [re.sub(r"^thresher: progress \d\d:\d\d: ", "", line)
             for line in stream.getvalue().splitlines()]
    assert lines[0] == "starting"
    assert lines[1] == "starting", lines
    assert not any("stage starting" in line or "rows read" in line for line in lines[1:-1]), lines

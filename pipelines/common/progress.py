"""Progress lines for long runs (``thresher run --progress``; on by default when stderr is
a terminal): every few seconds, the elapsed time, the stages Beam is running and the rows
read so far, then one closing line.

Where the numbers come from -- Beam metrics, where the runner has them live:

- the release registers what it runs (:func:`watch`): the in-process runner
  (``pipelines.live_metrics.LiveMetricsRunner``, Beam's FnApiRunner keeping each finished
  bundle's metrics) and, once ``Pipeline.run()`` returns, its ``PipelineResult``
  (distributed runners return at once and report metrics while they run);
- every line queries ``metrics().query()`` for the reading stage's Beam counter
  ``rows_read`` and prints the rows with the step that counted them (``Beam metrics:
  Read/PrepareBatches 20,000``), and the stage running (the fused stage of the bundle in
  progress, as its top-level labels: Read, ShardByUser, PerUserBound, ...).

Before Beam runs (reading the spec, calibrating, checking the input, building the pipeline:
seconds on a large input), the command names each step with :func:`phase`; a Reporter prints
a line at once when it starts, at each new phase, after its first second and then every
interval, so a run is never silent for its first seconds.

Fallback, for a runner without live metrics (or before its first bundle finishes): the
stage names the in-process runner logs on its ``run_bundle`` logger, and the rows the
reading stage counts in this process. On a distributed runner without live metrics the
lines show the elapsed time only; its own UI shows its stages. Row counts are operator
diagnostics, not differentially private, like every count in the log.
"""
import contextlib
import logging
import os
import re
import sys
import threading
import time

BUNDLE_LOGGER = "apache_beam.runners.portability.fn_api_runner.fn_runner.run_bundle"
# a stage inside the one Release transform (Read -> Release -> Write) is named by its own
# label (ShardByUser, PerUserBound, ...), not by "Release"
_LABEL = re.compile(r"ref_AppliedPTransform_(?:Release-)?([A-Za-z0-9]+)")
DEFAULT_INTERVAL_S = float(os.environ.get("THRESHER_PROGRESS_SECONDS", "5"))

_lock = threading.Lock()
_rows = [0]
_sources = []          # what the release runs: objects with metrics() (and current_stage)
_active = [False]      # a Reporter is running: only then are sources kept (else they leak)
ROWS_METRIC = "rows_read"
_phase = [None]        # what the command is doing before Beam's stages (phase())
_reporters = []        # the running Reporter, told of each new phase
FIRST_TICK_S = 1.0
SLOW_NOTICE_S = 1.0    # when_slow: a wait shorter than this says nothing


def phase(text):
    """Name the step the command is in (before Beam runs); a running Reporter prints it."""
    with _lock:
        _phase[0] = text
        reporters = list(_reporters)
    for reporter in reporters:
        reporter._phase_line(text)


@contextlib.contextmanager
def when_slow(message, after=None):
    """``with when_slow("waiting for ..."):`` -- log ``message`` (a warning, on stderr as
    ``thresher: ...``) if the block is still running ``after`` seconds later (default
    SLOW_NOTICE_S): a step that may wait a long time (a locked ledger) is never silent."""
    timer = threading.Timer(SLOW_NOTICE_S if after is None else after,
                            logging.getLogger("thresher").warning, args=(message,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def watch(source):
    """Register a runner or PipelineResult whose ``metrics()`` the lines query."""
    if hasattr(source, "metrics"):
        with _lock:
            if _active[0]:
                _sources.append(source)


def _labels(text):
    labels = []
    for label in _LABEL.findall(str(text or "")):
        if label not in labels:
            labels.append(label)
    return labels


def metrics_snapshot():
    """(rows read by step {step: rows}, stage labels running) from the newest watched
    source with live metrics; (None, []) when there is none. Beam is imported here only
    once a source is watched (the release registers one after Beam is imported): the
    progress thread must never import Beam while the command's thread is importing it."""
    with _lock:
        sources = list(_sources)
    if not sources:
        return None, []
    from apache_beam.metrics.metric import MetricsFilter  # heavy: apache_beam
    for source in reversed(sources):
        try:
            counters = source.metrics().query(
                MetricsFilter().with_name(ROWS_METRIC))["counters"]
        except Exception:  # noqa: BLE001 - a runner without live metrics: fall back
            continue
        by_step = {}
        for result in counters:
            value = result.committed if result.committed is not None else result.attempted
            if value:
                by_step[result.key.step] = by_step.get(result.key.step, 0) + int(value)
        return by_step, _labels(getattr(source, "current_stage", None))
    return None, []


def count_rows(n):
    """Called by the reading stage for every prepared batch (cheap: one locked add)."""
    with _lock:
        _rows[0] += int(n)


def _rows_read():
    with _lock:
        return _rows[0]


class _StageListener(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.current = []
        self.seen = []

    def emit(self, record):
        try:
            text = str(record.args[0]) if record.args else record.getMessage()
        except Exception:  # noqa: BLE001 - progress must never break a run
            return
        labels = _labels(text)
        if labels:
            self.current = labels
            for label in labels:
                if label not in self.seen:
                    self.seen.append(label)


class Reporter:
    """``with Reporter(enabled):`` around a run prints progress lines to ``stream``."""

    def __init__(self, enabled, stream=None, interval=None):
        self.enabled = enabled
        self.stream = stream or sys.stderr
        self.interval = DEFAULT_INTERVAL_S if interval is None else interval
        self._stop = threading.Event()
        self._listener = _StageListener()
        self._thread = None
        self._logger_state = None

    def _line(self, text):
        print(f"thresher: progress {text}", file=self.stream, flush=True)

    def _elapsed(self):
        seconds = int(time.time() - self._started)
        return f"{seconds // 60:02d}:{seconds % 60:02d}"

    def __enter__(self):
        if not self.enabled:
            return self
        self._started = time.time()
        with _lock:
            _rows[0] = 0
            _sources.clear()
            _active[0] = True
            _reporters.append(self)
            current = _phase[0]
        logger = logging.getLogger(BUNDLE_LOGGER)
        self._logger_state = (logger.level, logger.propagate)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(self._listener)
        self._line(f"{self._elapsed()}: {current or 'starting'}")
        self._thread = threading.Thread(target=self._loop, name="thresher-progress", daemon=True)
        self._thread.start()
        return self

    def _phase_line(self, text):
        try:
            self._line(f"{self._elapsed()}: {text}")
        except Exception:  # noqa: BLE001 - progress must never break a run
            pass

    def _now(self):
        """(stage labels, rows read, where the rows come from) at this moment."""
        by_step, running = metrics_snapshot()
        beam = ", ".join(running or self._listener.current)
        stages = f"stage {beam}" if beam else (_phase[0] or "starting")
        if by_step:
            steps = "; ".join(f"{step} {n:,}" for step, n in sorted(by_step.items()))
            return stages, sum(by_step.values()), f" (Beam metrics: {steps})"
        return stages, _rows_read(), ""

    def _loop(self):
        last = None
        wait = min(self.interval, FIRST_TICK_S)
        while not self._stop.wait(wait):
            wait = self.interval
            try:
                stages, rows, source = self._now()
            except Exception:  # noqa: BLE001 - progress must never break a run
                continue
            if (stages, rows) != last:
                read = (f"; {rows:,} rows read{source}"
                        if rows or stages.startswith("stage ") else "")   # none before Beam
                self._line(f"{self._elapsed()}: {stages}{read}")
                last = (stages, rows)
            else:
                self._line(f"{self._elapsed()}: still in {stages}")

    def __exit__(self, exc_type, exc, tb):
        if not self.enabled:
            return False
        self._stop.set()
        self._thread.join(timeout=5)
        logger = logging.getLogger(BUNDLE_LOGGER)
        logger.removeHandler(self._listener)
        logger.setLevel(self._logger_state[0])
        logger.propagate = self._logger_state[1]
        outcome = "finished" if exc_type is None else "stopped"
        stages = ", ".join(self._listener.seen) or "(run on the runner's workers)"
        try:
            by_step = metrics_snapshot()[0]
        except Exception:  # noqa: BLE001
            by_step = None
        rows = sum(by_step.values()) if by_step else _rows_read()
        with _lock:
            _sources.clear()
            _active[0] = False
            if self in _reporters:
                _reporters.remove(self)
            _phase[0] = None
        self._line(f"{self._elapsed()}: {outcome}; {rows:,} rows read; stages: {stages}")
        return False

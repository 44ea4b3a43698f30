"""Progress lines for long runs (``thresher run --progress``; on by default when stderr is
a terminal): every few seconds, the elapsed time, the stages Beam is running and the rows
read so far, then one closing line.

Where the numbers come from:

- stage names: the in-process runner (Beam's FnApiRunner, thresher's default) logs each
  bundle it runs, with its fused stage's transform labels, on its ``run_bundle`` logger;
  the reporter listens to that logger and keeps the top-level labels (Read, ShardByUser,
  PerUserBound, ...);
- rows read: the reading stage counts every batch it prepares (besides its Beam counter
  ``rows_read``), so the count is live for in-process runs.

On a distributed runner (Dataflow, Flink, Spark) the workers are elsewhere: the lines
then show the elapsed time only, and the runner's own UI shows its stages. Row counts
are operator diagnostics, not differentially private, like every count in the log.
"""
import logging
import os
import re
import sys
import threading
import time

BUNDLE_LOGGER = "apache_beam.runners.portability.fn_api_runner.fn_runner.run_bundle"
_LABEL = re.compile(r"ref_AppliedPTransform_([A-Za-z0-9]+)")
DEFAULT_INTERVAL_S = float(os.environ.get("THRESHER_PROGRESS_SECONDS", "5"))

_lock = threading.Lock()
_rows = [0]


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
        labels = []
        for label in _LABEL.findall(text):
            if label not in labels:
                labels.append(label)
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
        logger = logging.getLogger(BUNDLE_LOGGER)
        self._logger_state = (logger.level, logger.propagate)
        logger.setLevel(logging.DEBUG)
        logger.propagate = False
        logger.addHandler(self._listener)
        self._thread = threading.Thread(target=self._loop, name="thresher-progress", daemon=True)
        self._thread.start()
        return self

    def _loop(self):
        last = None
        while not self._stop.wait(self.interval):
            stages = ", ".join(self._listener.current) or "starting"
            state = (stages, _rows_read())
            if state != last:
                self._line(f"{self._elapsed()}: stage {stages}; {state[1]:,} rows read")
                last = state
            else:
                self._line(f"{self._elapsed()}: still in stage {stages}")

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
        self._line(f"{self._elapsed()}: {outcome}; {_rows_read():,} rows read; stages: {stages}")
        return False

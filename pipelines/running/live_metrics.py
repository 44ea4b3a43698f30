"""Beam metrics while a pipeline runs, for ``thresher run --progress``.

Beam's in-process runner (``FnApiRunner``, thresher's default) returns from
``Pipeline.run()`` only when the pipeline is done, and builds its ``PipelineResult``'s
metrics from every bundle's monitoring infos at the end. :class:`LiveMetricsRunner` is
that runner, keeping the same monitoring infos as each bundle finishes, so another thread
can call ``runner.metrics().query(...)`` during the run and get Beam's own
``MetricResults`` (``FnApiMetrics``, what ``result.metrics()`` returns afterwards) --
counters such as ``rows_read`` with the step that counted them -- and
``runner.current_stage``, the fused stage whose bundle is running. Numbers move when a
bundle finishes (a stage run as one bundle reports at its end).

Runners that return from ``run()`` at once (Dataflow, Flink, Spark, Beam's bundle-based
direct runner) are polled through their ``PipelineResult.metrics()`` instead
(``pipelines.progress.watch``).
"""
import itertools
import threading

from apache_beam.metrics.monitoring_infos import consolidate
from apache_beam.runners.portability.fn_api_runner import fn_runner


class LiveMetricsRunner(fn_runner.FnApiRunner):
    """FnApiRunner whose metrics can be queried while it runs."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._live_lock = threading.Lock()
        self._live = {}
        self.current_stage = None

    def _execute_bundle(self, runner_execution_context, bundle_context_manager, bundle_input):
        name = bundle_context_manager.stage.name
        self.current_stage = name
        result = super()._execute_bundle(runner_execution_context, bundle_context_manager,
                                         bundle_input)
        infos = list(result.process_bundle.monitoring_infos)
        with self._live_lock:
            if name in self._live:
                infos = list(consolidate(itertools.chain(infos, self._live[name])))
            self._live[name] = infos
        return result

    def metrics(self):
        """Beam's MetricResults of the bundles finished so far (user metrics)."""
        with self._live_lock:
            snapshot = dict(self._live)
        return fn_runner.FnApiMetrics(snapshot, user_metrics_only=True)

"""The quickstart release runs unchanged on Beam's distributed execution paths.

- the FnApiRunner with ``--direct_running_mode=multi_processing --direct_num_workers=2``:
  every DoFn, side input and coder crosses a process boundary, so this fails on anything
  that does not pickle or that relies on module state set at pipeline construction;
- ``PortableRunner`` against Beam's Python local job service with
  ``--environment_type=LOOPBACK``: the pipeline is submitted as a Runner API proto
  through the Job API, as it is to a Flink or Spark job server;
- ``--direct_runner_bundle_repeat=2``: every bundle is replayed twice more (dry runs)
  and only one run is committed, as when a runner retries a bundle.

Each run is checked by :func:`tests.distributed.release_check.check_release`: the report
equals the plan computed from the spec alone (outside the run fields), the output folder
holds exactly the report and the released Parquet, and keys and counts agree with the
raw data within tail bounds (false-failure probability < 5e-6 per run, stated there).
"""
import glob
import os
import shutil
import tarfile

import pytest

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.planning.plan import make_plan

from .conftest import QUICKSTART, ROOT, copy_source
from .release_check import check_release, expected_counts

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def expected():
    """E_k, V_k of the l0-bounded counts of the quickstart data, computed once."""
    spec = spec_mod.load(QUICKSTART)
    return expected_counts(os.path.join(ROOT, spec.input.path), spec.input.user,
                           spec.input.keys[0], spec.bounding.max_keys_per_user)


def _run(spec_path, beam_args, capsys):
    rc = main(["run", spec_path, "--"] + beam_args)
    captured = capsys.readouterr()
    assert rc == 0, captured.err[-3000:]
    return captured


def _check(spec_path, out, input_path, expected):
    plan_report = make_plan(spec_mod.load(spec_path)).report()
    return check_release(out, plan_report, input_path, expected=expected)


def test_multi_processing_two_workers(quickstart, worker_env, expected, capsys, monkeypatch):
    from apache_beam.runners.portability.fn_api_runner import worker_handlers
    started = []
    original = worker_handlers.SubprocessSdkWorkerHandler.start_worker

    def spy(self):  # records the subprocess workers Beam starts, then starts them
        started.append(self.worker_id)
        return original(self)

    monkeypatch.setattr(worker_handlers.SubprocessSdkWorkerHandler, "start_worker", spy)
    spec_path, out, input_path = quickstart
    _run(spec_path, ["--direct_running_mode=multi_processing", "--direct_num_workers=2"], capsys)
    assert len(set(started)) >= 2, f"expected two subprocess SDK workers, saw {started}"
    _check(spec_path, out, input_path, expected)


def test_portable_runner_on_local_job_service(quickstart, job_service, expected, capsys, tmp_path):
    """Submitted through the Job API with ``--setup_file``: the job service receives the
    sdist Beam builds from setup.py (as a Flink or Spark job server would, to install on
    its workers) and runs the pipeline."""
    endpoint, log_path, staging = job_service
    source = tmp_path / "checkout"  # Beam builds the sdist in place; keep the checkout clean
    copy_source(source)
    before = open(log_path, encoding="utf-8", errors="replace").read().count("with state DONE")
    spec_path, out, input_path = quickstart
    _run(spec_path, ["--runner=PortableRunner", f"--job_endpoint={endpoint}",
                     "--environment_type=LOOPBACK", f"--setup_file={source / 'setup.py'}"], capsys)
    after = open(log_path, encoding="utf-8", errors="replace").read().count("with state DONE")
    assert after == before + 1, "the job service did not run the job"
    _check(spec_path, out, input_path, expected)
    staged = glob.glob(os.path.join(staging, "*", "*-workflow.tar.gz"))
    assert len(staged) == 1, staged
    with tarfile.open(staged[0]) as tar:
        names = {m.name.split("/", 1)[-1] for m in tar.getmembers()}
    assert {"setup.py", "src/thresher/__init__.py", "pipelines/kinds/gaussian.py",
            "transforms/selection/noisy_threshold.py", "accounting/gshm.py"} <= names


def test_bundle_repeat_publishes_one_release(quickstart, expected, capsys):
    spec_path, out, input_path = quickstart
    _run(spec_path, ["--direct_runner_bundle_repeat=2"], capsys)
    _check(spec_path, out, input_path, expected)


def test_default_runner_baseline(quickstart, expected, capsys):
    """The same check passes on the default in-process runner (the reference path)."""
    spec_path, out, input_path = quickstart
    _run(spec_path, [], capsys)
    _check(spec_path, out, input_path, expected)

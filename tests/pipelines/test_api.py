"""The Python API's release (``pipelines/api.py``) over rows: its spec is parsed in the
rows mode (``spec.parse(..., rows_input=True)``), so no input or output path is invented
to get past the schema; the fields docs/api.md says are ignored stay ignored, and the
report hashes the caller's spec as before."""
import hashlib
import json
import os

import apache_beam as beam
import pyarrow.parquet as pq
import yaml

import thresher
from thresher.pipelines import api

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")
SPEC = {
    "name": "rows",
    "input": {"user": "user_id", "keys": ["word"]},
    "privacy": {"epsilon": 1.0, "delta": 1e-8},
    "bounding": {"max_keys_per_user": 4},
    "mechanism": {"kind": "gaussian", "pre_threshold": 1},
}
# what the API filled in before the spec knew a rows input (pipelines/api.py, issue 44)
INVENTED = ("<the rows of the pipeline>", "<the pipeline's sinks>")
_REPORTS = []


def _keep_report(row):
    """Module-level, so the in-process runner appends to this module's list (a closure
    would be pickled with a copy of it)."""
    _REPORTS.append(row.report)


def _plan(transform):
    assert isinstance(transform, api.RowsRelease)
    return transform._plan


def test_the_plan_of_an_api_release_names_no_file():
    plan = _plan(thresher.Release(SPEC))
    assert plan.spec.input.path is None and plan.spec.input.format is None
    assert plan.spec.output.path is None
    text = json.dumps(plan.report()) + repr(plan.spec)
    assert not any(word in text for word in INVENTED), text


def test_ignored_file_fields_stay_ignored():
    """docs/api.md: input.path (and format, delimiter) and output.path are ignored; the
    output's confidence is read."""
    spec = dict(SPEC, input=dict(SPEC["input"], path="data.csv", format="csv", delimiter=";"),
                output={"path": "out", "confidence": 0.9})
    plan = _plan(thresher.Release(spec))
    assert (plan.spec.input.path, plan.spec.input.format, plan.spec.output.path) == \
        (None, None, None)
    assert plan.spec.output.confidence == 0.9


def test_the_release_report_hashes_the_callers_spec_and_names_no_file():
    spec = dict(SPEC, output={"path": "ignored"})
    rows = pq.read_table(QUICKSTART, columns=["user_id", "word"]).slice(0, 300).to_pylist()
    with beam.Pipeline() as pipeline:
        out = (pipeline | beam.Create([beam.Row(**r) for r in rows])
               | thresher.Release(spec))
        del _REPORTS[:]
        _ = out["report"] | beam.Map(_keep_report)
    # the DirectRunner (FnApiRunner in process) runs the Map in this process
    (text,) = _REPORTS
    assert not any(word in text for word in INVENTED), text
    report = json.loads(text)
    assert report["config_sha256"] == hashlib.sha256(
        yaml.safe_dump(spec, sort_keys=True).encode("utf-8")).hexdigest()

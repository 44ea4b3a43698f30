"""The spec of a release over rows (``spec.parse(..., rows_input=True)``; the Python API
and Beam YAML): no file input or output, so ``input.path``/``format``/``delimiter`` and
``output.path`` are neither required nor invented, and refused by name when given; a
``thresher run`` spec still requires them (exit 2 naming the field)."""
import copy
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.errors import SpecError
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod

ROWS_SPEC = {
    "name": "rows",
    "input": {"user": "user_id", "keys": ["word"]},
    "privacy": {"epsilon": 1.0, "delta": 1e-8},
    "bounding": {"max_keys_per_user": 8},
    "mechanism": {"kind": "gaussian", "pre_threshold": 1},
}


def _with(section, **fields):
    doc = copy.deepcopy(ROWS_SPEC)
    doc.setdefault(section, {}).update(fields)
    return doc


def test_a_rows_spec_has_no_file_fields():
    spec = spec_mod.parse(copy.deepcopy(ROWS_SPEC), rows_input=True)
    assert (spec.input.path, spec.input.format, spec.output.path) == (None, None, None)
    assert spec.output.confidence == 0.95
    assert spec.input.user == "user_id" and spec.input.keys == ("word",)
    assert spec_mod.parse(_with("output", confidence=0.9), rows_input=True).output.confidence == 0.9


@pytest.mark.parametrize("section,fields", [
    ("input", {"path": "data.parquet"}),
    ("input", {"format": "parquet"}),
    ("input", {"delimiter": ";"}),
    ("output", {"path": "out"}),
])
def test_a_rows_spec_refuses_file_fields_by_name(section, fields):
    (name,) = fields
    with pytest.raises(SpecError) as caught:
        spec_mod.parse(_with(section, **fields), rows_input=True)
    assert caught.value.field == f"{section}.{name}"
    assert "does not apply to a release over rows" in caught.value.message


def test_a_rows_spec_refuses_continual_by_name():
    doc = dict(copy.deepcopy(ROWS_SPEC), continual={"periods": 3})
    with pytest.raises(SpecError) as caught:
        spec_mod.parse(doc, rows_input=True)
    assert caught.value.field == "continual"


def test_a_file_spec_still_requires_input_path_and_output_path():
    with pytest.raises(SpecError) as caught:
        spec_mod.parse(_with("output", path="out"))
    assert caught.value.field == "input.path"
    with pytest.raises(SpecError) as caught:
        spec_mod.parse(_with("input", path="data.parquet"))
    assert caught.value.field == "output"


def test_a_rows_plan_with_public_keys_reads_no_input_file(tmp_path, monkeypatch):
    """Planning asks the input's key types only of a file input: a rows plan over a public
    key domain keeps the domain's types (pipelines.api casts them to the rows' fields)."""
    domain = tmp_path / "domain.parquet"
    pq.write_table(pa.table({"word": ["a", "b", "c"]}), str(domain))
    monkeypatch.chdir(tmp_path)
    plan = make_plan(spec_mod.parse(_with("input", public_keys={"path": str(domain)}),
                                    rows_input=True))
    assert plan.domain.num_rows == 3 and plan.spec.input.path is None


@pytest.mark.parametrize("command", ["validate", "run"])
def test_thresher_refuses_a_spec_file_without_input_path(tmp_path, command):
    """A spec file is a ``thresher run`` spec: the rows mode is the API's alone."""
    import yaml
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_with("output", path=str(tmp_path / "out"))))
    done = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", command, str(path)],
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("thresher: error: input.path") or \
        "input.path" in done.stderr.splitlines()[0], done.stderr
    assert "Traceback" not in done.stderr and not (tmp_path / "out").exists()

import copy
import os

import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
QUICKSTART_DATA = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")

BASE_SPEC = {
    "name": "test",
    "input": {"path": QUICKSTART_DATA, "format": "parquet", "user": "user_id", "keys": ["word"]},
    "privacy": {"epsilon": 1.0, "delta": 1e-8},
    "bounding": {"max_keys_per_user": 8},
    "mechanism": {"kind": "gaussian", "pre_threshold": 1},
    "output": {"path": "out"},
}


@pytest.fixture
def write_spec(tmp_path):
    """Write a spec (BASE_SPEC with changes) into tmp_path; returns its path."""
    def _write(changes=None, text=None, name="spec.yaml"):
        path = tmp_path / name
        if text is None:
            spec = copy.deepcopy(BASE_SPEC)
            spec["output"]["path"] = str(tmp_path / "out")
            for dotted, value in (changes or {}).items():
                node = spec
                parts = dotted.split(".")
                for part in parts[:-1]:
                    node = node[part]
                if value is _DELETE:
                    del node[parts[-1]]
                else:
                    node[parts[-1]] = value
            text = yaml.safe_dump(spec)
        path.write_text(text)
        return str(path)
    return _write


class _Delete:
    pass


_DELETE = _Delete()


@pytest.fixture
def delete():
    return _DELETE


@pytest.fixture
def small_parquet(tmp_path):
    """A 20,000-row slice of the quickstart data in tmp_path."""
    import pyarrow.parquet as pq
    table = pq.read_table(QUICKSTART_DATA).slice(0, 20_000)
    path = tmp_path / "small.parquet"
    pq.write_table(table, path, row_group_size=5000)
    return str(path)

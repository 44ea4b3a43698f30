"""After a release, ``sys.modules`` holds no top-level ``accounting``, ``pipelines`` or
``transforms``: everything is imported as ``thresher.<part>``. From the repository root
``import accounting`` would still find the source folder and give a second copy of every
module (``except``/``isinstance`` across the copies fail, pickles name a module workers
cannot import), so one stray old-style import anywhere on a release's path fails here."""
import sys

from thresher.pipelines.cli import main

TOP_LEVEL = ("accounting", "pipelines", "transforms")


def test_a_release_imports_no_generic_top_level_package(write_spec, small_parquet):
    assert main(["run", write_spec({"input.path": small_parquet})]) == 0
    stray = sorted(m for m in sys.modules if m.split(".")[0] in TOP_LEVEL)
    assert not stray, stray


def test_the_guard_sees_a_stray_import(tmp_path, monkeypatch):
    """The check above can fail: an old-style import from the root is caught by it."""
    monkeypatch.syspath_prepend(str(tmp_path))
    (tmp_path / "transforms").mkdir()
    (tmp_path / "transforms" / "__init__.py").write_text("")
    monkeypatch.delitem(sys.modules, "transforms", raising=False)
    __import__("transforms")
    try:
        assert [m for m in sys.modules if m.split(".")[0] in TOP_LEVEL] == ["transforms"]
    finally:
        del sys.modules["transforms"]

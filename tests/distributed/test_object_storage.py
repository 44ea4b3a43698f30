"""Input and output on object storage through Beam's FileSystems (pipelines/dataio/publish.py).

gs:// and s3:// are not reachable here, so a FileSystem with their semantics (no
folders, listing by prefix, rename = copy + delete; fake_object_store.py) stands in:
the quickstart is read from it and published to it by ``thresher run`` on the default
runner, through the same FileSystems calls a gs:// or s3:// path takes.
"""
import json
import os
import posixpath

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.dataio import publish
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.planning.plan import make_plan

from .conftest import QUICKSTART, ROOT
from .fake_object_store import SCHEME, ObjectStoreFileSystem
from .release_check import check_counts, comparable

BUCKET = f"{SCHEME}://bucket"


@pytest.fixture
def store(tmp_path, monkeypatch):
    root = tmp_path / "objects"
    root.mkdir()
    monkeypatch.setattr(ObjectStoreFileSystem, "root", str(root))
    with open(QUICKSTART, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    data = os.path.join(ROOT, doc["input"]["path"])
    (root / "bucket" / "in").mkdir(parents=True)
    pq.write_table(pq.read_table(data), root / "bucket" / "in" / "words.parquet")
    doc["input"]["path"] = f"{BUCKET}/in/*.parquet"
    doc["output"]["path"] = f"{BUCKET}/releases/quickstart"
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return str(spec_path), data, root


def _objects(root):
    return sorted(os.path.relpath(os.path.join(d, f), root).replace(os.sep, "/")
                  for d, _, files in os.walk(root) for f in files)


def _read_report(final):
    return json.loads(publish.read_text(publish.join(final, "release_report.json")))


@pytest.mark.slow
def test_release_read_from_and_published_to_object_storage(store, capsys):
    spec_path, data, root = store
    assert main(["run", spec_path]) == 0, capsys.readouterr().err
    final = f"{BUCKET}/releases/quickstart"
    assert _objects(root) == ["bucket/in/words.parquet",
                              "bucket/releases/quickstart/release_report.json",
                              "bucket/releases/quickstart/released.parquet"]
    report = _read_report(final)
    assert comparable(report) == json.loads(json.dumps(
        comparable(make_plan(spec_mod.load(spec_path)).report())))
    assert report["outputs"] == ["released.parquet"]   # relative to output.path
    released = pq.read_table(os.path.join(root, "bucket/releases/quickstart/released.parquet"))
    assert released.schema == pa.schema([("word", pa.string()), ("count", pa.int64()),
                                         ("count_low", pa.int64()), ("count_high", pa.int64())])
    # issue 27: the launcher read the staged object, added the intervals and wrote it back
    from thresher.pipelines.dataio.intervals import count_interval
    low, high = count_interval(released.column("count").to_numpy(), report["mechanism"], 0.05)
    assert (released.column("count_low").to_numpy() == low).all()
    assert (released.column("count_high").to_numpy() == high).all()
    assert report["released_keys"] == released.num_rows
    check_counts(released, report, data)

    # A second run refuses to replace it; with --overwrite it does, leaving one release.
    assert main(["run", spec_path]) == 2
    assert "already holds a release" in capsys.readouterr().err
    first = released.to_pydict()
    assert main(["run", spec_path, "--overwrite"]) == 0
    assert _objects(root) == ["bucket/in/words.parquet",
                              "bucket/releases/quickstart/release_report.json",
                              "bucket/releases/quickstart/released.parquet"]
    again = pq.read_table(os.path.join(root, "bucket/releases/quickstart/released.parquet"))
    # Fresh noise, a new draw: two runs agree on ~100 keys' noisy counts with probability
    # below 0.03**100 (a discrete Gaussian with sigma ~14 repeats a value w.p. < 0.03).
    assert again.to_pydict() != first


def test_publish_replaces_report_last_and_removes_staging(store, monkeypatch):
    _, _, root = store
    final, staging = f"{BUCKET}/out", publish.staging_path(f"{BUCKET}/out")
    fs = ObjectStoreFileSystem(None)
    for name, text in (("released.parquet", b"old"), ("release_report.json", b"{}"),
                       ("released-extra.parquet", b"old")):
        with fs.create(publish.join(final, name)) as handle:
            handle.write(text)
    with fs.create(publish.join(staging, "released.parquet")) as handle:
        handle.write(b"new")
    with fs.create(publish.join(staging, "beam-temp-released-1/x")) as handle:
        handle.write(b"scratch")
    publish.remove_sink_scratch(staging)
    assert publish.released_files(staging) == [publish.join(staging, "released.parquet")]
    publish.write_json(publish.join(staging, "release_report.json"), {"released_keys": 1})

    order = []
    delete, rename = ObjectStoreFileSystem.delete, ObjectStoreFileSystem.rename

    def spy_delete(self, paths):
        order.append(("delete", list(paths)))
        return delete(self, paths)

    def spy_rename(self, sources, destinations):
        order.append(("rename", list(destinations)))
        return rename(self, sources, destinations)

    monkeypatch.setattr(ObjectStoreFileSystem, "delete", spy_delete)
    monkeypatch.setattr(ObjectStoreFileSystem, "rename", spy_rename)
    publish.promote(staging, final)
    assert order[0] == ("delete", [publish.join(final, "release_report.json")])
    renames = [dst for op, dst in order if op == "rename"]
    assert renames[-1] == [publish.join(final, "release_report.json")]
    assert _objects(root) == ["bucket/in/words.parquet", "bucket/out/release_report.json",
                              "bucket/out/released.parquet"]
    assert publish.read_text(publish.join(final, "released.parquet")) == "new"
    assert _read_report(final) == {"released_keys": 1}


def test_check_output_on_object_storage(store):
    fs = ObjectStoreFileSystem(None)
    publish.check_output(f"{BUCKET}/empty", overwrite=False)  # nothing there: fine
    with fs.create(f"{BUCKET}/other/notes.txt") as handle:
        handle.write(b"x")
    with pytest.raises(Exception, match="holds objects that are no release"):
        publish.check_output(f"{BUCKET}/other", overwrite=True)
    with fs.create(f"{BUCKET}/rel/release_report.json") as handle:
        handle.write(b"{}")
    with pytest.raises(Exception, match="already holds a release"):
        publish.check_output(f"{BUCKET}/rel", overwrite=False)
    publish.check_output(f"{BUCKET}/rel", overwrite=True)


def test_failed_run_publishes_nothing_on_object_storage(store, capsys, monkeypatch):
    """A failure after the pipeline wrote its staged objects deletes them all."""
    spec_path, _, root = store

    def fail(files):
        assert files and all(f.startswith(f"{BUCKET}/releases/quickstart.tmp-") for f in files)
        raise OSError("injected failure after the pipeline ran")

    monkeypatch.setattr(publish, "count_released", fail)
    assert main(["run", spec_path]) == 1
    assert "injected failure" in capsys.readouterr().err
    assert _objects(root) == ["bucket/in/words.parquet"]


def test_text_input_on_object_storage_sizes_the_shuffles_like_a_local_file(store, tmp_path):
    """Shard counts come from the input's size; on object storage the size is read from
    the listing, so a remote CSV gets the same estimate as the same local file."""
    from thresher.pipelines.dataio import io
    _, data, root = store
    local = tmp_path / "words.csv"
    import pyarrow.csv as pcsv
    pcsv.write_csv(pq.read_table(data), local)
    (root / "bucket" / "csv").mkdir()
    (root / "bucket" / "csv" / "words.csv").write_bytes(local.read_bytes())
    spec = spec_mod.InputSpec(path="", format="csv", user="user_id", keys=("word",))
    remote_rows = io.check_input(spec, [f"{BUCKET}/csv/words.csv"])
    assert remote_rows == io.check_input(spec, [str(local)]) == os.path.getsize(local) // 40

"""Where a release is staged and how it is published: a local folder or object storage.

``output.path`` is a local folder or a URL that Beam's FileSystems understand
(``gs://bucket/path`` with ``apache-beam[gcp]``, ``s3://bucket/path`` with
``apache-beam[aws]``, ``azfs://``, ``hdfs://``). In both cases the pipeline's sinks write
into a sibling staging location ``<output.path>.tmp-<id>`` (on a distributed runner the
workers write there directly), and the release is published only after the pipeline
succeeded:

- local folder: the staging folder is moved into place with one rename
  (``pipelines.io.promote``), so a release is either complete or absent;
- object storage has no folders and no atomic rename: the earlier release's
  ``release_report.json`` is deleted first, then its other objects; the staged objects
  are moved into place (copy and delete) and ``release_report.json`` is written last.
  **On object storage a release is complete exactly when its release_report.json
  exists**; a reader must look for the report, never list the released files alone.

On failure the staging location is deleted and nothing is published.
"""
import json
import math
import os
import posixpath
import uuid

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from thresher.accounting._lazy import LazyModule
from thresher.pipelines.errors import SpecError, ThresherError

# pipelines.dataio.io on first use: its reading DoFns import Beam, which report_text
# (thresher plan --json) does not need.
io = LazyModule("thresher.pipelines.dataio.io")


def is_remote(path):
    return "://" in path


def _fs():
    from apache_beam.io.filesystems import FileSystems  # heavy: apache_beam
    return FileSystems


def join(base, name):
    return _fs().join(base, name) if is_remote(base) else os.path.join(base, name)


def files_under(prefix):
    """Every object below ``prefix/`` (recursively), sorted; [] if there is none."""
    from apache_beam.io.filesystem import BeamIOError  # heavy: apache_beam
    try:
        result = _fs().match([join(prefix.rstrip("/"), "**")])[0]
    except BeamIOError:
        return []
    return sorted(m.path for m in result.metadata_list)


def _relative(prefix, path):
    return path[len(prefix.rstrip("/")) + 1:]


def check_output(final, overwrite):
    """Refuse to replace an earlier release unless asked, and to write into a location
    that holds anything else."""
    if not is_remote(final):
        io.check_output(final, overwrite)
        return
    existing = [_relative(final, p) for p in files_under(final)]
    if not existing:
        return
    is_release = io.REPORT_FILE in existing or any(
        n.startswith(io.RELEASED_PREFIX) for n in existing)
    if not is_release:
        raise SpecError("output.path", f"{final!r} holds objects that are no release; "
                        f"thresher will not write into it")
    if not overwrite:
        raise SpecError("output.path", f"{final!r} already holds a release; pass --overwrite "
                        f"to replace it, or choose another output.path")


def staging_path(final):
    """The sibling staging location (created if local)."""
    if not is_remote(final):
        staging = io.staging_path(final)
        os.makedirs(staging)
        return staging
    return f"{final.rstrip('/')}.tmp-{uuid.uuid4().hex[:12]}"


def read_text(path):
    """The text of one file, or None if it does not exist."""
    if not is_remote(path):
        if not os.path.exists(path):
            return None
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    if not _fs().exists(path):
        return None
    with _fs().open(path) as handle:
        return handle.read().decode("utf-8")


def delete(path):
    if is_remote(path):
        _fs().delete([path])
    else:
        os.remove(path)


def remove_sink_scratch(staging):
    """Remove Beam's ``beam-temp-*`` leftovers (see ``pipelines.io.remove_sink_scratch``)."""
    if not is_remote(staging):
        io.remove_sink_scratch(staging)
        return
    scratch = [p for p in files_under(staging) if _relative(staging, p).startswith("beam-temp-")]
    if scratch:
        _fs().delete(scratch)


def released_files(staging):
    if not is_remote(staging):
        return io.released_files(staging)
    return [p for p in files_under(staging)
            if "/" not in _relative(staging, p)
            and _relative(staging, p).startswith(io.RELEASED_PREFIX) and p.endswith(".parquet")]


def count_released(files):
    if not files or not is_remote(files[0]):
        return io.count_released(files)
    total = 0
    for path in files:
        with _fs().open(path) as handle:
            total += pq.ParquetFile(pa.PythonFile(handle)).metadata.num_rows
    return int(total)


def published_names(files):
    """The staged ``files`` as the report lists them: names relative to the output
    folder (no machine's paths in a published report)."""
    return [posixpath.basename(f.rstrip("/")) for f in files]


def report_text(document):
    """``document`` as strict JSON (RFC 8259: no NaN or Infinity, which Python's json would
    write and other parsers refuse; issue 30 D5). A non-finite number is a ThresherError
    naming where it is, before anything is written."""
    try:
        return json.dumps(document, indent=2, default=_json_default, allow_nan=False) + "\n"
    except ValueError:
        where = _non_finite(document, "")
        raise ThresherError(f"the release report's field {where or '?'} is not a finite "
                            f"number; nothing was published") from None


def _json_default(value):
    if isinstance(value, (np.integer,)):
        return int(value)
    if isinstance(value, (np.floating,)):
        return float(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")


def _non_finite(value, where):
    """The dotted path of the first NaN/Infinity in a JSON-able document, or None."""
    if isinstance(value, float):
        return None if math.isfinite(value) else (where or "(the document)")
    if hasattr(value, "dtype"):          # numpy scalars (_json_default turns them to floats)
        return _non_finite(float(value), where) if value.dtype.kind == "f" else None
    items = (value.items() if isinstance(value, dict)
             else enumerate(value) if isinstance(value, (list, tuple)) else ())
    for key, item in items:
        found = _non_finite(item, f"{where}.{key}" if isinstance(key, str) and where
                            else f"{where}[{key}]" if not isinstance(key, str) else key)
        if found:
            return found
    return None


def write_json(path, document):
    """Write a report as strict JSON (``report_text``)."""
    text = report_text(document)
    if not is_remote(path):
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
        return
    with _fs().create(path, mime_type="application/json") as handle:
        handle.write(text.encode("utf-8"))


def promote(staging, final):
    """Publish a finished staging location (holding the report) as ``final``."""
    if not is_remote(final):
        io.promote(staging, final)
        return
    fs = _fs()
    old_report = join(final, io.REPORT_FILE)
    if fs.exists(old_report):
        fs.delete([old_report])              # the earlier release stops being complete first
    old = files_under(final)
    if old:
        fs.delete(old)
    staged = [p for p in files_under(staging) if _relative(staging, p) != io.REPORT_FILE]
    if staged:
        fs.rename(staged, [join(final, _relative(staging, p)) for p in staged])
    fs.rename([join(staging, io.REPORT_FILE)], [old_report])   # last: the release is complete
    discard(staging)


def discard(staging):
    """Delete a staging location; never raises (it runs while another error propagates)."""
    if not is_remote(staging):
        io.discard(staging)
        return
    try:
        leftovers = files_under(staging)
        if leftovers:
            _fs().delete(leftovers)
    except Exception:  # noqa: BLE001 - best effort; the original error matters more
        pass

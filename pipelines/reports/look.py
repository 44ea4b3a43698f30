"""``thresher show`` and ``thresher report``: reading a published release back.

Both read only the published files (``release_report.json`` and the released Parquet) and
treat them as untrusted input: a damaged or foreign file is an error naming it (exit 2,
``pipelines.summary.load_report`` / ``parquet_file``), text is printed with its control
characters escaped (``summary.escape``), and the released rows are streamed in chunks
(``pyarrow.parquet.ParquetFile.iter_batches``) so that memory stays one chunk.

Standard output closed early (``thresher show OUT --format csv | head -1``) is a normal
end: :func:`to_stdout` stops writing, points file descriptor 1 at ``/dev/null`` (so the
flush at interpreter exit cannot fail again; the recipe of Python's ``signal`` module
documentation, "Note on SIGPIPE") and the command exits 0 with nothing on stderr.
"""
import argparse
import contextlib
import json
import math
import os
import stat
import sys

from thresher.pipelines.reports import summary
from thresher.pipelines.errors import SpecError

FORMATS = ("table", "csv", "json")
TABLE_TOP = 20
CHUNK_ROWS = 4096


class PipeClosed(Exception):
    """The reader of standard output went away; the command ends normally."""


@contextlib.contextmanager
def to_stdout():
    """Run a command that writes to stdout; a closed pipe ends it quietly (exit 0)."""
    try:
        yield
        sys.stdout.flush()
    except (BrokenPipeError, PipeClosed):
        _discard_stdout()


def _discard_stdout():
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
    except (OSError, ValueError):
        pass


def is_stdout(path):
    """Whether ``path`` names this process's standard output (``/dev/stdout``, the file or
    pipe it is), so that a page written there is not followed by a "wrote" line."""
    try:
        here, there = os.fstat(sys.stdout.fileno()), os.stat(path)
    except (OSError, ValueError, AttributeError):
        return False
    return (here.st_dev, here.st_ino) == (there.st_dev, there.st_ino)


def positive_rows(text):
    """argparse type of ``--top``: a whole number >= 1."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be a whole number >= 1, got {value}")
    return value


# ---- show ----------------------------------------------------------------------------------

def show(output, fmt="table", top=None, out=None):
    """Write the released rows of the release in ``output`` to ``out`` (stdout).

    ``table``: a title line and the ``top`` rows (default 20) with the largest released
    value, aligned, intervals as ``value [low, high]``. ``csv`` and ``json`` (one JSON
    object per line): every row in the file's order, or the ``top`` largest when asked,
    columns as published."""
    out = out or sys.stdout
    report = summary.load_report(output)
    files = summary.released_files(output, report)
    schema = summary.released_schema(files)
    names = schema.names
    if fmt == "table" or top is not None:
        n = top or TABLE_TOP
        column = _value_column(files, names)
        best = _top(files, report, n, column, schema)
        if fmt == "table":
            name = summary.escape(str(report.get('name')))
            if not best.num_rows:
                _write(out, f"{name}: no key was released\n")
                return
            _write(out, f"{name}: {report['released_keys']:,} keys released; top "
                        f"{best.num_rows} by {column or 'key'}\n")
            _write(out, summary.format_table(best) + "\n")
            _write(out, "".join(line + "\n" for line in table_notes(report, best, output)))
            return
        batches = best.to_batches(max_chunksize=CHUNK_ROWS)
    else:
        batches = summary.iter_batches(files, CHUNK_ROWS)
    (_csv if fmt == "csv" else _jsonl)(out, names, batches)


def table_notes(report, table, output, keys=None):
    """The lines under a table of released keys: what its counts are of (the bounded data,
    issue 42) and, when a key was cut to fit, where to read it whole."""
    names = summary.key_columns(table.column_names, report) if keys is None else keys
    key = " and ".join(names) if names else "key"
    notes = [summary.bounded_data(report, key)]
    if any(summary.is_cut(v) for name in table.column_names
           for v in table.column(name).to_pylist()):
        notes.append(f"a text longer than {summary.KEY_WIDTH} characters is cut, ending in "
                     f"{summary.CUT}; thresher show {output} --format csv (or json) prints "
                     f"it whole")
    return notes


def _write(out, text):
    out.write(text)


def _value_column(files, names):
    """The column the table sorts by: the first of count, estimate, token present with a
    value in some row (read column by column from the files' metadata and data)."""
    for name in ("count", "estimate", "token"):
        if name not in names:
            continue
        for batch in summary.iter_batches(files, 1 << 16, columns=[name]):
            if batch.column(0).null_count < batch.num_rows:
                return name
    return None


def _top(files, report, n, column, schema):
    """The n rows with the largest ``column`` (ties by key), over the files' chunks: at
    most n + one chunk of rows in memory."""
    import pyarrow as pa  # heavy: pyarrow
    best = pa.Table.from_batches([], schema=schema)   # (empty_table() imports pandas)
    for batch in summary.iter_batches(files, 1 << 16):
        chunk = pa.Table.from_batches([batch], schema=schema)
        best = summary.top_rows(pa.concat_tables([best, chunk]), report, n, column)
    return summary.top_rows(best, report, n, column)


def _csv(out, names, batches):
    """RFC 4180 fields (a field holding a comma, a quote, CR or LF is quoted; Python's csv
    writer leaves a lone CR unquoted when lines end with LF), lines ending with LF."""
    escape = _text if out.isatty() else (lambda v: v)   # a terminal gets no control bytes
    out.write(_csv_line([escape(n) for n in names]))
    for batch in batches:
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        out.write("".join(_csv_line(["" if v is None else escape(_plain(v)) for v in row])
                          for row in zip(*columns)))


def _csv_line(fields):
    return ",".join(_csv_field(str(f)) for f in fields) + "\n"


def _csv_field(text):
    if any(ch in text for ch in ',"\r\n'):
        return '"' + text.replace('"', '""') + '"'
    return text


def _text(v):
    """A csv field for a terminal: text as the table shows it (``summary.shown_text``: no
    control byte, and a key holding a line break never reads as one holding ``\\n``)."""
    return summary.shown_text(v) if isinstance(v, str) else v


def _plain(v):
    if isinstance(v, float):
        return repr(v)         # shortest text that reads back as the same float
    if isinstance(v, bytes):
        return v.hex()
    return v


def _jsonl(out, names, batches):
    for batch in batches:
        columns = [batch.column(i).to_pylist() for i in range(batch.num_columns)]
        out.write("".join(_json_line(names, row) + "\n" for row in zip(*columns)))


def _json_line(names, row):
    obj = {n: _json_value(v) for n, v in zip(names, row)}
    # json escapes C0 controls; DEL, C1 controls and bidirectional overrides are escaped too
    return summary.escape_json(json.dumps(obj, ensure_ascii=False, default=str))


def _json_value(v):
    if isinstance(v, float) and not math.isfinite(v):
        return None            # JSON has no NaN or infinity
    if isinstance(v, bytes):
        return v.hex()
    return v


# ---- report ----------------------------------------------------------------------------------

def report_lines(output, top=TABLE_TOP):
    """``thresher report OUT``: the release in words, its budget and its top keys."""
    report = summary.load_report(output)
    files = summary.released_files(output, report)
    schema = summary.released_schema(files)
    column = _value_column(files, schema.names)
    best = _top(files, report, top, column, schema)
    privacy = report["privacy"]
    delta = privacy.get("delta_spent", privacy["delta"])
    keys = summary.key_columns(schema.names, report)
    lines = [f"release {summary.escape(str(report.get('name', '')))}: "
             f"{report['released_keys']:,} keys released with user-level "
             f"(epsilon={privacy['epsilon']:g}, delta={delta:g})-differential privacy "
             f"({privacy['neighbouring']}); {report['mechanism'].get('kind', '')} mechanism, "
             f"at most {report['bounding']['max_keys_per_user']} keys per user"]
    if summary.describes_rows(report):
        lines += summary.quantile_lines(report, summary.load_released(output, report))
    lines += summary.noise_in_words(report, keys)
    stages = [s for s in privacy.get("stages", []) if isinstance(s, dict)]
    if stages:
        lines.append("budget stages:")
        lines += [f"  {s.get('name')}: epsilon {s.get('epsilon', 0):g}, delta {s.get('delta', 0):g}"
                  for s in stages]
    if best.num_rows:
        lines.append(f"top {best.num_rows} keys" + (f" by {column}:" if column else ":"))
        lines += ["  " + line for line in summary.format_table(best).splitlines()]
        lines += ["  " + line for line in table_notes(report, best, output, keys)[1:]]
    else:
        lines.append("no key was released: the release is an empty table")
    lines.append(f"files: {', '.join(files)}; a page with plots: "
                 f"thresher report {output} --html")
    return lines


PAGE_HEAD = "<!DOCTYPE html>"
PAGE_TITLE = "<title>thresher release "   # in the first lines of every page html_report writes


def is_report_page(path):
    """Whether ``path`` holds a page ``thresher report --html`` wrote (its first bytes)."""
    try:
        with open(path, "rb") as handle:
            head = handle.read(1024).decode("utf-8", errors="replace")
    except OSError:
        return False
    return head.startswith(PAGE_HEAD) and PAGE_TITLE in head


def _holds_data(path):
    """Whether writing to ``path`` would replace something: a regular file that is not
    empty. Writing to a terminal, a pipe or a device (``--html /dev/stdout``) replaces
    nothing, nor does writing over the empty file a shell's ``> page.html`` made (and a
    terminal is never read to see whether it holds a page)."""
    try:
        st = os.stat(path)
    except OSError:
        return False
    return stat.S_ISREG(st.st_mode) and st.st_size > 0


def html_destination(output, dest, overwrite=False):
    """Where ``report --html [FILE]`` may write: by default OUT/release_report.html. Never
    a file of the release (the report, a released file, anything else in its folder but
    the page itself), never a folder, only where a file can be created, and never over an
    existing file that is not an earlier report page unless ``overwrite`` (issue 36 D11:
    ``--html spec.yaml`` turned the spec into a page)."""
    default = os.path.join(output, "release_report.html")
    dest = dest or default
    real = os.path.realpath(dest)
    if os.path.isdir(real):
        raise SpecError("--html", f"{dest!r} is a folder; give a file name, e.g. "
                                  f"{os.path.join(dest, 'release_report.html')}")
    report = summary.load_report(output)
    protected = {os.path.realpath(os.path.join(output, summary.REPORT_FILE))}
    protected.update(os.path.realpath(f) for f in summary.released_files(output, report))
    folder = os.path.realpath(output)
    if real in protected or (os.path.dirname(real) == folder and real != os.path.realpath(default)):
        raise SpecError("--html", f"{dest!r} is a file of the release in {output!r}; the page "
                                  f"goes to {default} or a file outside the release folder")
    if _holds_data(real) and not overwrite and not is_report_page(real):
        raise SpecError("--html", f"{dest!r} exists and is not a page thresher report "
                                  f"wrote; it is left as it is: choose another file, or "
                                  f"pass --overwrite to replace it")
    parent = os.path.dirname(real) or "."
    if not os.path.isdir(parent):
        raise SpecError("--html", f"cannot write {dest!r}: folder {parent} does not exist")
    if not os.access(parent, os.W_OK) or (os.path.exists(real) and not os.access(real, os.W_OK)):
        raise SpecError("--html", f"cannot write {dest!r}: permission denied")
    return dest

"""Input file formats: telling the format from a path, gzip, CSV delimiters, and JSONL
mistakes worth naming.

- ``infer(path)``: the format from the file name, glob or not (``data/*.parquet``,
  ``logs/2024-*.jsonl.gz``), with its default delimiter (``.tsv`` is CSV split on tabs).
- A name ending in ``.gz`` is read through gzip, locally and on object storage (Beam's
  FileSystems decompress by extension).
- A ``.jsonl`` file that holds one JSON array instead of one object per line is an error
  that says so.
"""
import gzip
import os
import re

from thresher.pipelines.errors import InputError, SpecError
from thresher.pipelines.common.fields import describe

FORMATS = ("parquet", "csv", "jsonl")
COMPRESSIONS = (".gz",)
# name ending -> (format, default delimiter)
_ENDINGS = {
    ".parquet": ("parquet", None), ".pq": ("parquet", None),
    ".csv": ("csv", ","), ".tsv": ("csv", "\t"), ".tab": ("csv", "\t"),
    ".jsonl": ("jsonl", None), ".ndjson": ("jsonl", None), ".json": ("jsonl", None),
}
_TEXT = ("csv", "jsonl")


def _name(path):
    """The last path component without glob characters (``data/*.csv.gz`` -> ``.csv.gz``)."""
    base = path.rstrip("/").rsplit("/", 1)[-1]
    for ch in "*?[]":
        base = base.replace(ch, "")
    return base.lower()


def is_compressed(path):
    return _name(path).endswith(COMPRESSIONS)


def infer(path, field="input.format"):
    """(format, default delimiter or None) from a file name or glob; SpecError naming
    ``field`` when the name does not tell."""
    name = _name(path)
    compressed = name.endswith(COMPRESSIONS)
    if compressed:
        name = name[: name.rindex(".")]
    for ending, (fmt, delimiter) in _ENDINGS.items():
        if name.endswith(ending) and not (compressed and fmt not in _TEXT):
            return fmt, delimiter
    known = ", ".join(sorted(_ENDINGS)) + " (CSV and JSONL also with .gz)"
    raise SpecError(field, f"cannot tell the format from the name {path!r} (known endings: "
                    f"{known}); set {field} to one of {', '.join(FORMATS)}")


def infer_folder(folder, field="input.path"):
    """(format, default delimiter) of a local folder given as the input path: the one
    format its files' names tell (the files ``pipelines.paths.input_files`` reads: names
    starting with . or _ are skipped). A folder mixing formats, or holding a file whose
    name tells none, is a SpecError naming ``field`` and the files; so is an empty folder."""
    names = sorted(f for f in os.listdir(folder) if not f.startswith((".", "_"))
                   and os.path.isfile(os.path.join(folder, f)))
    found, unknown = {}, []
    for name in names:
        try:
            found.setdefault(infer(name), []).append(name)
        except SpecError:
            unknown.append(name)
    if unknown:
        raise SpecError(field, f"the folder {folder!r} holds {_some(unknown)}, whose name tells "
                        f"no input format (known endings: {', '.join(sorted(_ENDINGS))}, CSV "
                        f"and JSONL also with .gz); move it out, or set input.path to a glob "
                        f"of the input files and input.format")
    if len(found) > 1:
        kinds = "; ".join(f"{fmt}{' (tab-separated)' if d == chr(9) else ''}: {_some(files)}"
                          for (fmt, d), files in sorted(found.items(), key=lambda i: i[0][0]))
        raise SpecError(field, f"the folder {folder!r} mixes input formats ({kinds}); one "
                        f"release reads one format: set input.path to a glob such as "
                        f"{os.path.join(folder, '*' + _example(found))}")
    if not found:   # issue 36: said "cannot tell the format" of an empty folder
        raise SpecError(field, f"the folder {folder!r} is empty: it holds no input files "
                        f"(names starting with . or _ are skipped)")
    return next(iter(found))


def _some(names, n=3):
    shown = ", ".join(names[:n])
    return shown + (f" and {len(names) - n} more" if len(names) > n else "")


def _example(found):
    name = sorted(found.values())[0][0].lower()
    for ending in sorted(_ENDINGS, key=len, reverse=True):
        for tail in (ending + ".gz", ending):
            if name.endswith(tail):
                return tail
    return ""


def delimiter(value, field="input.delimiter"):
    """A CSV delimiter: one character, not a quote or a line break."""
    if value == "\\t":
        value = "\t"
    if not isinstance(value, str) or len(value) != 1 or value in "\"\r\n":
        raise SpecError(field, f"must be one character (e.g. ',', ';', '|' or a tab written "
                        f"\"\\t\"), not a quote or line break; got {describe(value)}")
    return value


def open_local(path):
    """A binary file object, decompressing ``.gz`` names."""
    if is_compressed(path):
        return gzip.open(path, "rb")
    return open(path, "rb")


_CHANGED_TYPE = re.compile(r"Column\(/([^)]*)\) changed from (\w+) to (\w+)")


def json_input_error(path, exc, handle_opener, fields=None):
    """An InputError for a JSONL file pyarrow could not parse; names the common mistake of
    a JSON array (``[{...}, {...}]``) where one object per line is expected, and a column
    holding two JSON types (issue 36 D15: ``1`` and ``"1"`` for the user in one file):
    pyarrow's reader types each column once per file and cannot read a number as text,
    so thresher needs one JSON type per column -- in a file, and for the user column in
    every file (``io._check_json_user_types``). ``fields``: {column: spec field} to name
    (``input.user``, ``input.keys[i]``)."""
    changed = _CHANGED_TYPE.search(str(exc))
    if changed:
        column, before, after = changed.groups()
        field = (fields or {}).get(column, "input.path")
        return InputError(f"{field}: {path!r}: column {column!r} holds JSON {before} values "
                          f"and JSON {after} values; thresher reads every JSONL column with one "
                          f"JSON type (pyarrow: {first_line(exc)}): write each value of "
                          f"{column!r} as a string (\"1\") or each as a number (1), in every "
                          f"file")
    first = b""
    try:
        with handle_opener(path) as handle:
            first = handle.read(4096).lstrip()[:1]
    except (OSError, EOFError):
        pass
    if first == b"[":
        return InputError(f"input.path: {path!r} holds a JSON array; JSONL input needs one "
                          f"object per line, e.g. {{\"user_id\": 1, \"word\": \"a\"}} (convert "
                          f"with: jq -c '.[]' in.json > out.jsonl)")
    return InputError(f"input.path: cannot read {path!r} as jsonl (one JSON object per line): "
                      f"{first_line(exc)}")


def first_line(exc):
    """The first line of an exception's text (its type name when it has none)."""
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def estimate_factor(path):
    """Compressed text is about five times smaller than the rows it holds."""
    return 5 if is_compressed(path) else 1

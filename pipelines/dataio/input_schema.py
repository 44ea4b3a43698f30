"""The checks ``thresher validate`` and ``thresher run`` make of the input before any row
is read: every file's schema has the user and key columns with single values, the files
agree on their types, and the estimated number of rows (``pipelines.dataio.io`` sizes its
shuffles from it). Parquet footers and CSV/JSONL headers only.

Kept apart from ``pipelines.dataio.io``, whose reading DoFns need Beam: ``thresher validate``
imports this module and not Beam (tests/pipelines/test_cli_command_imports.py).
"""
import os

import pyarrow as pa
import pyarrow.parquet as pq

from thresher.pipelines.dataio import formats
from thresher.pipelines.errors import InputError, SpecError


def _is_local(path):
    return "://" not in path


def read_schema(path, fmt, delimiter=",", fields=None):
    """The Arrow schema of one input file (Parquet footer, or the first CSV/JSONL block).
    ``fields``: {column: spec field} that a JSONL error names (``column_fields``)."""
    try:
        if fmt == "parquet":
            if _is_local(path):
                return pq.read_schema(path)
            from apache_beam.io.filesystems import FileSystems  # heavy: apache_beam
            with FileSystems.open(path) as handle:
                return pq.read_schema(pa.PythonFile(handle))
        with _open(path) as handle:
            if fmt == "csv":
                import pyarrow.csv as pcsv  # heavy: pyarrow.csv
                return pcsv.open_csv(handle, parse_options=pcsv.ParseOptions(delimiter=delimiter)).schema
            import pyarrow.json as pjson  # heavy: pyarrow.json
            return pjson.read_json(handle, read_options=pjson.ReadOptions(block_size=1 << 20)).schema
    except (pa.ArrowInvalid, pa.ArrowIOError, OSError, ValueError, EOFError) as exc:
        if fmt == "jsonl":
            raise formats.json_input_error(path, exc, _open, fields) from None
        raise InputError(f"input.path: cannot read {path!r} as {fmt}: {_first_line(exc)}") from None


def column_fields(input_spec):
    """{column: the spec field naming it} of the user and key columns."""
    out = {k: f"input.keys[{i}]" for i, k in enumerate(input_spec.keys)}
    if input_spec.user is not None:
        out[input_spec.user] = "input.user"
    return out


def _first_line(exc):
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__


def _open(path):
    if _is_local(path):
        return formats.open_local(path)      # .gz names are decompressed
    from apache_beam.io.filesystems import FileSystems  # heavy: apache_beam
    return FileSystems.open(path)            # decompresses by extension (.gz) too


def check_input(input_spec, files):
    """Check every file's schema has the user and key columns; estimate the row count.

    Reads Parquet footers (metadata only) and CSV/JSONL headers; returns the estimated
    number of rows (exact for Parquet), used to size the shuffles."""
    needed = input_spec.columns
    names = ["input.user", *[f"input.keys[{i}]" for i in range(len(input_spec.keys))],
             *[f"aggregates (column {v!r})" for v in input_spec.values]]
    if input_spec.quantile_column is not None:
        names.append("mechanism.column")
    if input_spec.sample is not None:
        names = [*names[1:], "input.sample.frequency"]
    est_rows = 0
    first_types = None
    user_types = []        # (file, type of the user column): one kind in every file
    json_user_types = []   # the same for JSONL files (the JSON type the reader inferred)
    for path in files:
        schema = read_schema(path, input_spec.format, input_spec.delimiter,
                             column_fields(input_spec))
        for field, col in zip(names, needed):
            if col not in schema.names:
                raise SpecError(field, f"column {col!r} is not in {path!r}; its columns are: "
                                f"{', '.join(schema.names)}")
            if schema.names.count(col) > 1:   # which one is meant? (issue 30 D14: KeyError)
                raise SpecError(field, f"column {col!r} appears {schema.names.count(col)} "
                                f"times in {path!r} (its header/schema repeats the name); "
                                f"rename the duplicates so each column has its own name")
            _check_column_type(field, col, schema.field(col).type, path)
        if input_spec.format == "parquet":
            types = {c: _value_type(schema.field(c).type) for c in input_spec.keys}
            if input_spec.sample is None:
                user_types.append((path, _value_type(schema.field(input_spec.user).type)))
                _check_user_types(input_spec.user, user_types)
            if first_types is None:
                first_types = types
            else:
                for c, t in types.items():
                    if not _compatible(t, first_types[c]):
                        raise InputError(f"input.path: key column {c!r} is {t} in {path!r} but "
                                         f"{first_types[c]} in {files[0]!r}; all files must agree")
            est_rows += _parquet_rows(path)
        else:
            if input_spec.format == "jsonl" and input_spec.sample is None:
                t = _value_type(schema.field(input_spec.user).type)
                if not pa.types.is_null(t):      # a file of null ids only: no user at all
                    json_user_types.append((path, t))
                    _check_json_user_types(input_spec.user, json_user_types)
            est_rows += _estimate_text_rows(path)
    return est_rows


def _user_kind(t):
    """What a user id of Arrow type ``t`` is identified as (transforms.randomness.user_identity,
    "Type-stable ids"): every integer, boolean and floating type is a number (1, 1.0
    and True are one user), every string and binary type is text; any other type only
    agrees with itself (a decimal's or a timestamp's text depends on its scale or unit)."""
    if pa.types.is_integer(t) or pa.types.is_boolean(t) or pa.types.is_floating(t):
        return "numbers"
    if _is_text(t):
        return "text"
    return str(t)


def _check_user_types(column, user_types):
    """Refuse a Parquet dataset whose files store the user column as different kinds of
    value (text in one, numbers in another): the same user would become two identities,
    each with its own contribution bound -- a privacy loss, never a silent one."""
    first_path, first = user_types[0]
    path, t = user_types[-1]
    if _user_kind(t) != _user_kind(first):
        raise SpecError("input.user", f"column {column!r} holds {_user_kind(t)} ({t}) in "
                        f"{path!r} but {_user_kind(first)} ({first}) in {first_path!r}; every "
                        f"file must store user ids as one kind of value (integers and floats "
                        f"agree, text and numbers do not: is \"01\" the user 1?). Rewrite "
                        f"the files with one type for {column!r}")


def _json_user_kind(t):
    """What the JSON values of a JSONL user column of inferred Arrow type ``t`` are:
    numbers (JSON integers and floats: ``1`` and ``1.0`` are one user,
    ``user_identity.text_ids``), strings, booleans; any other type (pyarrow infers
    timestamps from date-like strings) only agrees with itself."""
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "JSON numbers"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "JSON strings"
    if pa.types.is_boolean(t):
        return "JSON booleans"
    return str(t)


def _check_json_user_types(column, user_types):
    """Refuse a JSONL dataset whose files write the user ids as JSON numbers in one file
    and as strings (or booleans) in another (issue 36 P4). A user is its id's text, but
    the text of a number depends on its spelling: ``1`` and ``"1"`` would be one user while
    ``1e3`` and ``"1e3"``, or ``1.0`` and ``"1.0"``, would be two, each with its own
    contribution bound. Within one file pyarrow's reader refuses a column holding two
    JSON types (``formats.json_input_error``), so one JSON type per dataset holds: refused
    before any row is read, naming both files, as a Parquet dataset mixing text and
    numbers is (:func:`_check_user_types`)."""
    first_path, first = user_types[0]
    path, t = user_types[-1]
    if _json_user_kind(t) != _json_user_kind(first):
        raise SpecError("input.user", f"column {column!r} holds {_json_user_kind(t)} in "
                        f"{path!r} but {_json_user_kind(first)} in {first_path!r}; every "
                        f"JSONL file must write user ids as one JSON type (all strings, "
                        f"\"1\", or all numbers, 1: the text of a number depends on how "
                        f"it is written, so 1e3 and \"1e3\" would be two users). Rewrite "
                        f"the files with one type for {column!r}")


def _check_column_type(field, column, t, path):
    """User and key columns hold single values: text, bytes, integers (uint64 included),
    booleans, floats, decimals, dates and times. Lists, structs, maps and unions are
    refused from the schema, before any row is read."""
    t = _value_type(t)
    nested = (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)
              or pa.types.is_struct(t) or pa.types.is_map(t) or pa.types.is_union(t)
              or getattr(pa.types, "is_list_view", lambda _: False)(t)
              or getattr(pa.types, "is_large_list_view", lambda _: False)(t)
              or isinstance(t, pa.ExtensionType))
    if nested:
        raise SpecError(field, f"column {column!r} in {path!r} has type {t}; user and key columns "
                        f"must hold single values (text, bytes, integers, booleans, floats, "
                        f"decimals, dates or times), not lists, structs or maps")


def _value_type(t):
    return t.value_type if pa.types.is_dictionary(t) else t


def _compatible(a, b):
    strings = (pa.string(), pa.large_string())
    if a in strings and b in strings:
        return True
    return a == b or (pa.types.is_integer(a) and pa.types.is_integer(b))


def _parquet_rows(path):
    try:
        if _is_local(path):
            return pq.ParquetFile(path).metadata.num_rows
        with _open(path) as handle:
            return pq.ParquetFile(pa.PythonFile(handle)).metadata.num_rows
    except (pa.ArrowInvalid, OSError) as exc:
        raise InputError(f"input.path: cannot read {path!r} as parquet: {_first_line(exc)}") from None


def _estimate_text_rows(path):
    try:
        if _is_local(path):
            size = os.path.getsize(path)
        else:  # object storage: the size from the listing, so shards scale there too
            from apache_beam.io.filesystems import FileSystems  # heavy: apache_beam
            size = FileSystems.match([path])[0].metadata_list[0].size_in_bytes
    except Exception:  # noqa: BLE001 - an estimate only; 0 means "unknown"
        size = 0
    return max(1, size * formats.estimate_factor(path) // 40)


def _is_text(arrow_type):
    return (pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type)
            or pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type))

"""``input.public_keys``: a release over a public key domain (paper 002 Section 4).

The spec names a file listing every key of the domain (the key columns, one row per key).
The list must be public knowledge -- fixed before looking at the data and not derived
from it (e.g. a product catalogue, the list of countries) -- because it is used as is:
every listed key is released, with noise and no threshold, and records with any other
key are dropped before bounding (counted in Beam metrics, not private).

This module checks the spec fields, the mechanism fields that only apply with a public
domain (``debias``, ``num_users``, ``clamp_negative``), and reads the domain file into an
Arrow table with the same key types as the released rows. Errors name the field (exit 2).
"""
import os

import pyarrow as pa

from thresher.pipelines.common import limits
from thresher.pipelines.common import declare
from thresher.pipelines.errors import SpecError
from thresher.pipelines.dataio.formats import infer
from thresher.pipelines.dataio.paths import input_files

FIELD = "input.public_keys"
FORMATS = ("parquet", "csv", "jsonl")

# input.public_keys (declared for pipelines.schema).
SECTION_FIELDS = {
    "path": declare.string(description="the file listing every key of the domain (the key "
                                       "columns, one row per key)"),
    "format": declare.choice(FORMATS, description="optional: from the file name otherwise"),
}

# Mechanism fields shared by gaussian and laplace that need input.public_keys.
MECHANISM_FIELDS = {
    "debias": declare.choice(("poisson",), description=(
        "public_keys only: 'poisson' adds a float64 column `debiased` (paper 002 Alg. 5, "
        "post-processing; docs/contribution_bound.md 'Bounded domains')")),
    "num_users": declare.integer(low=1, high=10**15, description=(
        "public_keys with debias only: the public number of users n of Alg. 5 (not read "
        "from the data)")),
    "clamp_negative": declare.boolean(description=(
        "public_keys only: true replaces negative noisy counts by 0 (post-processing; "
        "default false)")),
}


def parse_section(section):
    """{path, format} of input.public_keys (format from the extension when absent); the
    schema has checked the fields."""
    path = section["path"]
    fmt = section.get("format")
    if fmt is None:
        fmt, delimiter = infer(path, f"{FIELD}.format")
        if delimiter not in (None, ","):
            raise SpecError(f"{FIELD}.format", f"{path!r}: public keys are read as parquet, "
                            f"comma-separated csv or jsonl")
    return {"path": path, "format": fmt}


def parse_mechanism_fields(section):
    """debias / num_users / clamp_negative of a gaussian or laplace mechanism section: the
    rules between them (the schema has checked each)."""
    out = {}
    debias = section.get("debias")
    if debias is not None:
        out["debias"] = debias
        if section.get("num_users") is None:
            raise SpecError("mechanism.num_users", "is required with debias: poisson (the "
                            "public number of users n of paper 002 Alg. 5; thresher does not "
                            "count users, that count is not private)")
    if section.get("num_users") is not None:
        if debias is None:
            raise SpecError("mechanism.num_users", "only applies with mechanism.debias")
        out["num_users"] = int(section["num_users"])
    if section.get("clamp_negative", False):
        out["clamp_negative"] = True
    return out


def check_mechanism(mechanism, input_spec, raw_mechanism):
    """Cross-checks between input.public_keys and the mechanism of a kind with a release
    over it (its ``PUBLIC_DOMAIN_NOISE``; the spec loader asks the kind); returns the
    mechanism dict with ``public_keys: True`` (what the kinds' calibrate() and release()
    read)."""
    domain_only = [f for f in MECHANISM_FIELDS if mechanism.get(f) not in (None, False)]
    if input_spec.public_keys is None:
        if domain_only:
            raise SpecError(f"mechanism.{domain_only[0]}", "only applies with input.public_keys "
                            "(a release over a public key domain)")
        return mechanism
    if mechanism.get("threshold") is not None:
        raise SpecError("mechanism.threshold", "does not apply with input.public_keys: every "
                        "public key is released, with no threshold")
    if "pre_threshold" in raw_mechanism and mechanism.get("pre_threshold") != 1:
        raise SpecError("mechanism.pre_threshold", "does not apply with input.public_keys: every "
                        "public key is released, including keys with count 0")
    return {**mechanism, "public_keys": True}


def _read(path, fmt):
    import pyarrow.csv as pcsv  # heavy: pyarrow.csv
    import pyarrow.json as pjson  # heavy: pyarrow.json
    import pyarrow.parquet as pq  # heavy: pyarrow.parquet
    if fmt == "parquet":
        return pq.read_table(path)
    if fmt == "csv":
        # text, as the data's CSV key columns are read (02139 stays 02139)
        names = pcsv.open_csv(path).schema.names
        return pcsv.read_csv(path, convert_options=pcsv.ConvertOptions(
            column_types={n: pa.string() for n in names}))
    return pjson.read_json(path)


def _check_size(path, fmt):
    """The planning limit on the domain (``pipelines.common.limits.check_public_keys``), from
    what the file says before it is read: a Parquet footer's row count, a text file's
    size. A footer that cannot be read is left to the reader's own error."""
    if fmt != "parquet":
        limits.check_public_keys(path, size_bytes=os.path.getsize(path))
        return
    import pyarrow.parquet as pq  # heavy: pyarrow.parquet
    try:
        rows = pq.ParquetFile(path).metadata.num_rows
    except (pa.ArrowInvalid, OSError, ValueError):
        return
    limits.check_public_keys(path, rows=rows)


def load_domain(public_keys, key_columns, key_types=None, data_types=None):
    """Read the domain file into a table of the key columns, cast to ``key_types``
    ({column: pyarrow type}, the released key types; None keeps the file's types).
    ``data_types``: the key types of the data as its files store them
    (:func:`input_file_key_types`; default ``key_types``), which the domain's must agree
    with (:func:`check_key_type`).

    SpecError (field input.public_keys.path) for: a missing or unreadable file, a missing
    key column, a key that cannot be cast, a null or NaN key, an empty domain, a duplicate
    key (-0.0 and 0.0 are one key, as the reader reads them)."""
    # heavy: pyarrow.compute
    import pyarrow.compute as pc     # (here: thresher schema and plan need not load it)
    field = f"{FIELD}.path"
    path, fmt = public_keys["path"], public_keys["format"]
    if not os.path.isfile(path):
        raise SpecError(field, f"{path!r} does not exist (the public key list)")
    _check_size(path, fmt)     # before reading: nothing allocated for a domain too large
    try:
        table = _read(path, fmt)
    except (pa.ArrowInvalid, OSError, ValueError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise SpecError(field, f"cannot read {path!r} as {fmt}: {first}") from None
    missing = [c for c in key_columns if c not in table.column_names]
    if missing:
        raise SpecError(field, f"{path!r} has no key column {missing[0]!r} (input.keys); its "
                        f"columns are: {', '.join(table.column_names) or 'none'}")
    cols = {}
    for name in key_columns:
        col = table.column(name)
        if pa.types.is_dictionary(col.type):
            col = col.cast(col.type.value_type)
        if pa.types.is_large_string(col.type):
            col = col.cast(pa.string())
        target = (key_types or {}).get(name)
        stored = (data_types if data_types is not None else key_types or {}).get(name)
        if stored is not None:
            check_key_type(name, col.type, stored, path, fmt)
        if target is not None and col.type != target:
            try:
                col = pc.cast(col, target)
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
                first = (str(exc).strip().splitlines() or [""])[0]
                raise SpecError(field, f"key column {name!r} of {path!r} cannot be read as the "
                                f"input's type {target}: {first}") from None
        if col.null_count:
            raise SpecError(field, f"{path!r}: key column {name!r} has {col.null_count} null "
                            f"value(s); every public key must be a full key")
        if pa.types.is_floating(col.type):
            nan = pc.sum(pc.is_nan(col)).as_py()
            if nan:
                raise SpecError(field, f"{path!r}: key column {name!r} has {nan} NaN "
                                f"value(s); NaN is no key (the input's NaN keys are dropped), "
                                f"list numbers only")
            # -0.0 and 0.0 are one key, as the reader folds them: a domain listing both
            # is refused below as a duplicate (it released two rows with one noise draw,
            # their difference the exact count)
            col = pc.add(col, pa.scalar(0.0, col.type))
        cols[name] = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    domain = pa.table(cols)
    limits.check_public_keys(path, rows=domain.num_rows)
    if domain.num_rows == 0:
        raise SpecError(field, f"{path!r} lists no keys: the public domain must not be empty")
    distinct = domain.group_by(list(key_columns), use_threads=False).aggregate([([], "count_all")])
    if distinct.num_rows != domain.num_rows:
        dup = distinct.filter(pc.greater(distinct.column("count_all"), 1)).slice(0, 1).to_pylist()[0]
        dup.pop("count_all")
        raise SpecError(field, f"{path!r} lists key {dup} more than once "
                        f"({domain.num_rows - distinct.num_rows} duplicate row(s)); each public "
                        f"key must appear once")
    return domain


def _type_kind(t):
    """What a key column of Arrow type ``t`` holds, for comparing a domain file's column
    with the data's: text, bytes, numbers (integers and floats: a cast between them is
    checked value by value), booleans; any other type only agrees with itself."""
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "text"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t):
        return "bytes"
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "numbers"
    if pa.types.is_boolean(t):
        return "booleans"
    return str(t)


def check_key_type(name, domain_type, data_type, path, fmt):
    """Refuse a domain file whose key column holds another kind of value than the data's
    (issue 36 D12): an int64 domain cast to the text keys of the data named keys "1",
    "2", ... that no record had, and the release published noise alone at the full
    charge. Text and numbers are never equated (is "01" the key 1?), as for user ids.
    A CSV domain is text by nature: it is cast to the data's type, and a value that does
    not convert is refused by name (:func:`load_domain`). SpecError naming
    ``input.public_keys``."""
    if fmt == "csv" or _type_kind(domain_type) == _type_kind(data_type):
        return
    raise SpecError(FIELD, f"key column {name!r} of {path!r} holds {_type_kind(domain_type)} "
                    f"({domain_type}) but the input's {name!r} holds {_type_kind(data_type)} "
                    f"({data_type}); the public keys must have the data's type (no record "
                    f"would match a key of another type, and the release would be noise "
                    f"alone): rewrite the domain file with {data_type} keys, or list them in "
                    f"a CSV file (read as text and converted to the data's type)")


def domain_candidates(candidates, domain_size, model):
    """The automatic bound's candidates over a public domain of d keys (both public).

    In the l0 model a user holds at most d distinct domain keys, so every C >= d keeps
    every user whole: the bounded counts are the same for all of them and only the noise
    grows with C (paper 002 Sec. 4: sigma(C) and C/epsilon increase in C). Their scores
    tie (Lemma 4.2's rank count is 0 past d; Thm 4.3's tail sum is 0 past d), and the tie
    goes to the smaller bound: the candidates at or above d are replaced by d itself.
    The cut uses d and the spec's candidates only (never a statistic of the data), so it
    costs no privacy. In the l1 model a user may hold several records of one key, so d
    caps nothing and the candidates are kept."""
    cands = tuple(sorted(int(c) for c in candidates))
    d = int(domain_size)
    if model != "l0" or cands[-1] < d:
        return cands
    return tuple(c for c in cands if c < d) + (d,)


def report_section(public_keys, domain_size):
    """The report's ``bounding.public_keys``: the file and the domain size d (both public)."""
    return {"path": public_keys["path"], "size": int(domain_size)}


def input_key_types(input_spec):
    """{key column: pyarrow type} of the released key columns, as the reader normalises
    them (text inputs: string; Parquet: the column type, dictionaries decoded, large
    strings as strings); None when the input files cannot be listed yet (``thresher plan``
    on a spec whose data is elsewhere: the domain then keeps its own types)."""
    # heavy: pyarrow.parquet
    from thresher.pipelines.dataio import input_schema as io   # no Beam (plan, validate)
    if input_spec.path is None:
        return None     # a release over rows: pipelines.api casts the domain to the rows' types
    try:
        files = input_files(input_spec)
    except SpecError:
        return None
    if input_spec.format != "parquet":
        return {k: pa.string() for k in input_spec.keys}
    schema = io.read_schema(files[0], input_spec.format)
    out = {}
    for name in input_spec.keys:
        if name not in schema.names:
            return None   # io.check_input reports the missing column
        t = schema.field(name).type
        if pa.types.is_dictionary(t):
            t = t.value_type
        out[name] = pa.string() if pa.types.is_large_string(t) else t
    return out


def input_file_key_types(input_spec):
    """{key column: pyarrow type} of the key columns as the input files store them: the
    Parquet or JSONL schema of the first file (JSON numbers are numbers there, although the
    reader then takes their text), text for CSV; None when the files cannot be listed or
    read yet (``thresher plan`` on a spec whose data is elsewhere)."""
    # heavy: pyarrow.parquet
    from thresher.pipelines.dataio import input_schema as io   # no Beam (plan, validate)
    if input_spec.path is None:
        return None     # a release over rows: no file stores the keys
    if input_spec.format == "csv":
        return {k: pa.string() for k in input_spec.keys}
    try:
        files = input_files(input_spec)
        schema = io.read_schema(files[0], input_spec.format)
    except SpecError:
        return None
    out = {}
    for name in input_spec.keys:
        if name not in schema.names:
            return None   # io.check_input reports the missing column
        t = schema.field(name).type
        out[name] = t.value_type if pa.types.is_dictionary(t) else t
    return out

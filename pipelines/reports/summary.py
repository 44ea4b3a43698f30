"""A release as people read it: the lines ``thresher run`` ends with, ``thresher show``'s
table of top keys, and the numbers behind ``thresher report --html`` (pipelines/reports/html_report.py).

Everything here is computed from the published files (``release_report.json`` and the
released Parquet) or from the calibrated parameters alone; nothing reads the input.
"""
import json
import os
import unicodedata

from thresher.pipelines.errors import SpecError

REPORT_FILE = "release_report.json"


# ---- reading a published release -------------------------------------------------------

REQUIRED_REPORT_FIELDS = ("mechanism", "bounding", "privacy", "released_keys")


def load_report(output):
    """The release's report, checked to be one: a damaged or foreign file is a SpecError
    naming it (exit 2), never an internal error."""
    path = os.path.join(output, REPORT_FILE)
    if not os.path.isfile(path):
        raise SpecError("", f"{output!r} ({os.path.abspath(output)}) holds no release: "
                            f"{REPORT_FILE} is missing")
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise SpecError("", f"{path}: not a release report: cannot be read as JSON "
                            f"({_first_line(exc)})") from None
    problem = _report_problem(report)
    if problem:
        raise SpecError("", f"{path}: not a release report: {problem}")
    return report


def _report_problem(report):
    if not isinstance(report, dict):
        return f"expected a JSON object, found {type(report).__name__}"
    missing = [f for f in REQUIRED_REPORT_FIELDS if f not in report]
    if missing:
        return f"{', '.join(missing)} missing"
    for field in ("mechanism", "bounding", "privacy"):
        if not isinstance(report[field], dict):
            return f"{field} is not an object"
    if not isinstance(report["released_keys"], int) or isinstance(report["released_keys"], bool):
        return "released_keys is not an integer"
    for field in ("epsilon", "delta"):
        if not _is_number(report["privacy"].get(field)):
            return f"privacy.{field} is not a number"
    if not isinstance(report["privacy"].get("neighbouring"), str):
        return "privacy.neighbouring is not text"
    if not isinstance(report["bounding"].get("max_keys_per_user"), int):
        return "bounding.max_keys_per_user is not an integer"
    if not isinstance(report.get("outputs", []), list):
        return "outputs is not a list"
    return None


def _first_line(exc):
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0][:300]


def released_files(output, report):
    """The released Parquet files, as listed in the report (absolute or relative to the
    output folder) or, failing that, found in the folder."""
    files = []
    for name in report.get("outputs", []):
        if not isinstance(name, str):
            continue
        for candidate in (name, os.path.join(output, name), os.path.join(output, os.path.basename(name))):
            if os.path.isfile(candidate):
                files.append(candidate)
                break
    if not files:
        files = sorted(os.path.join(output, f) for f in os.listdir(output)
                       if f.startswith("released") and f.endswith(".parquet"))
    if not files:
        raise SpecError("", f"{output!r} holds no released Parquet file")
    return files


def parquet_file(path):
    """``pyarrow.parquet.ParquetFile`` of a released file; a damaged one is a SpecError
    naming it."""
    import pyarrow as pa  # heavy: pyarrow
    import pyarrow.parquet as pq  # heavy: pyarrow.parquet
    try:
        return pq.ParquetFile(path)
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise SpecError("", f"{path}: not a released Parquet file: cannot be read "
                            f"({_first_line(exc)})") from None


def iter_batches(files, batch_size=4096, columns=None):
    """The released rows in chunks (``pyarrow.RecordBatch``), file by file: memory stays
    one chunk whatever the release's size. A file damaged past its footer is a SpecError
    naming it."""
    import pyarrow as pa  # heavy: pyarrow
    for path in files:
        handle = parquet_file(path)
        try:
            yield from handle.iter_batches(batch_size=batch_size, columns=columns)
        except (pa.ArrowException, OSError, ValueError) as exc:
            raise SpecError("", f"{path}: not a released Parquet file: cannot be read "
                                f"({_first_line(exc)})") from None


def released_schema(files):
    return parquet_file(files[0]).schema_arrow


def load_released(output, report):
    import pyarrow as pa  # heavy: pyarrow
    files = released_files(output, report)
    schema = released_schema(files)
    batches = list(iter_batches(files))
    return pa.Table.from_batches(batches, schema=schema) if batches else schema.empty_table()


VALUE_COLUMNS = ("count", "estimate", "token", "debiased")


def interval_columns(names):
    """{column: (column_low, column_high)} for each released column with both interval
    columns beside it."""
    present = set(names)
    return {n: (f"{n}_low", f"{n}_high") for n in names
            if f"{n}_low" in present and f"{n}_high" in present}


def kind_output_columns(report):
    """The columns the release's kind writes beside the keys (``OUTPUT_COLUMNS`` of
    ``pipelines.kinds``: a count, an estimate, heavy hitters' and quantiles' ``rank``...);
    empty for a kind this thresher does not know."""
    mech = report.get("mechanism", {}) if isinstance(report, dict) else {}
    kind = mech.get("kind")
    if not isinstance(kind, str):
        return ()
    from thresher.pipelines import kinds  # heavy: start-up of thresher --help
    try:
        return tuple(kinds.get(kind).OUTPUT_COLUMNS)
    except KeyError:
        return ()


def key_columns(names, report):
    """The released columns that name a key (the spec's keys): not the released values,
    the kind's other output columns (heavy hitters' and quantiles' ``rank``: issue 36 D6,
    the words said "a word and rank"), their intervals, nor the aggregates' columns."""
    mech = report.get("mechanism", {}) if isinstance(report, dict) else {}
    values = set(VALUE_COLUMNS)
    values.update(kind_output_columns(report))
    values.update(a.get("output") for a in mech.get("aggregates", []) or [] if isinstance(a, dict))
    for low, high in interval_columns(names).values():
        values.update((low, high))
    return [n for n in names if n not in values]


# Output columns that order the rows of one key after the keys (a quantile's rank).
ORDER_COLUMNS = ("rank",)


def value_column(table, report):
    """The released column people sort by: the noisy count, else the estimate."""
    for name in ("count", "estimate", "token"):
        if name in table.column_names and table.column(name).null_count < table.num_rows:
            return name
    return None


def top_rows(table, report, top, column=None):
    """The ``top`` rows with the largest released value (ties by key, for a stable table)."""
    column = column or value_column(table, report)
    order = [(column, "descending")] if column else []
    ties = key_columns(table.column_names, report)
    ties += [c for c in ORDER_COLUMNS if c in table.column_names and c not in ties]
    order += [(k, "ascending") for k in ties if k != column]
    if order:
        table = table.sort_by(order)
    return table.slice(0, top)


def format_table(table):
    """A plain-text table: a header, a rule, right-aligned numbers; a value with interval
    columns (``<col>_low``, ``<col>_high``) as ``value [low, high]``; text with its control
    characters escaped (nothing reaches the terminal as a control sequence)."""
    intervals = interval_columns(table.column_names)
    hidden = {c for pair in intervals.values() for c in pair}
    names = [n for n in table.column_names if n not in hidden]
    values = {n: table.column(n).to_pylist() for n in table.column_names}
    columns, numeric = [], []
    for n in names:
        col = values[n]
        if n in intervals:
            low, high = (values[c] for c in intervals[n])
            columns.append([_cell(v) if v is None else f"{_cell(v)} [{_cell(lo)}, {_cell(hi)}]"
                            for v, lo, hi in zip(col, low, high)])
        else:
            columns.append([_cell(v) for v in col])
        numeric.append(all(_is_number(v) for v in col if v is not None))
    shown = [escape(n) for n in names]
    widths = [max([_columns(n)] + [_columns(c) for c in col]) for n, col in zip(shown, columns)]

    def pad(c, w, num):
        fill = " " * (w - _columns(c))
        return fill + c if num else c + fill

    def line(cells):
        return "  ".join(pad(c, w, num) for c, w, num in zip(cells, widths, numeric)).rstrip()
    out = [line(shown), line(["-" * w for w in widths])]
    out += [line([col[i] for col in columns]) for i in range(table.num_rows)]
    return "\n".join(out)


def _columns(text):
    """Terminal columns ``text`` takes: two for a wide (CJK, emoji) character, none for a
    combining one, one otherwise (Unicode's East Asian Width), so columns stay aligned."""
    if text.isascii():
        return len(text)
    return sum(0 if unicodedata.combining(ch) else
               2 if unicodedata.east_asian_width(ch) in "WF" else 1 for ch in text)


def escape(text):
    """``text`` with each control, format or line/paragraph separator character (ESC, CR,
    backspace, DEL, C1 controls, bidirectional overrides, U+2028...) written as a Python
    escape (``\\x1b``, ``\\r``, ``\\u202e``), so a released key cannot move the cursor,
    erase or recolour a terminal, or reorder what is shown; other text, any script, is
    unchanged."""
    if text.isprintable():
        return text
    return "".join(_escaped(ch) if unicodedata.category(ch) in _UNSAFE else ch for ch in text)


def escape_json(text):
    """JSON text with the control and format characters ``json.dumps(ensure_ascii=False)``
    leaves as they are (DEL, C1 controls, bidirectional overrides...) written as JSON
    ``\\uXXXX`` escapes: the same JSON value, and nothing a terminal acts on."""
    if text.isprintable():
        return text
    return "".join(_json_escaped(ch) if unicodedata.category(ch) in _UNSAFE else ch
                   for ch in text)


def _json_escaped(ch):
    code = ord(ch)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000
    return f"\\u{0xd800 + (code >> 10):04x}\\u{0xdc00 + (code & 0x3ff):04x}"


_UNSAFE = {"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"}


def _escaped(ch):
    named = {"\n": "\\n", "\r": "\\r", "\t": "\\t", "\b": "\\b"}
    if ch in named:
        return named[ch]
    code = ord(ch)
    return f"\\x{code:02x}" if code < 0x100 else (f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}")


def _is_number(v):
    return isinstance(v, (int, float)) and not isinstance(v, bool)


KEY_WIDTH = 60      # characters of a text cell shown in tables (show, report, the page)


def _cell(v, width=KEY_WIDTH):
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:,.6g}" if abs(v) < 1e15 else f"{v:.6g}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, bytes):
        return cut(escape(repr(v)), width)
    return cut(shown_text(str(v)), width)


def shown_text(text):
    """A released key as tables show it, one text for one key (issue 42: the key ``a\\nb``,
    a backslash and an ``n``, and the key holding a real line break were both shown
    ``a\\nb``). A key with no control, format or separator character and no leading
    double quote is shown as it is (``C:\\tmp`` stays ``C:\\tmp``); any other key is
    shown quoted, ``"a\\nb"``, with its backslashes and double quotes escaped as well, so
    that no shown-as-is key can read the same as a quoted one."""
    if not text.startswith('"') and (text.isprintable()
                                     or not any(unicodedata.category(ch) in _UNSAFE for ch in text)):
        return text
    return '"' + "".join("\\\\" if ch == "\\" else '\\"' if ch == '"' else
                         _escaped(ch) if unicodedata.category(ch) in _UNSAFE else ch
                         for ch in text) + '"'


CUT = "\u2026"       # the ellipsis that ends a cut text


def cut(text, width=KEY_WIDTH):
    """``text`` cut to ``width`` characters, its last one an ellipsis when it was longer
    (issue 42: a key of 10,000 characters pushed every count off the table)."""
    return text if width is None or len(text) <= width else text[:width - 1] + CUT


def is_cut(v, width=KEY_WIDTH):
    """Whether ``_cell`` shortens the value ``v``."""
    return isinstance(v, (str, bytes)) and _cell(v, None) != _cell(v, width)


# ---- the probability that a key is released -----------------------------------------------

def release_probability(report, counts):
    """P(a key held by n users is released), n in ``counts``, from the calibrated
    parameters alone (report["mechanism"]) by the kind's ``release_probability``; None
    when every key is released regardless (public keys) or the kind has no such curve.

    - gaussian (paper 004 Alg. 1): n >= pre_threshold and n + Z >= threshold, Z discrete
      Gaussian(sigma): ``accounting.discrete_gaussian.sf``;
    - laplace (paper 002 Alg. 3): n >= pre_threshold and n + Z >= threshold, Z discrete
      Laplace(scale): ``accounting.laplace_threshold.log_suppress``;
    - sample_and_threshold (paper 003 Sec. 3.1): Binomial(n, p) >= threshold;
    - weighted_sampling (paper 001 Alg. 3): pi_n, the end-to-end reporting probability.
    A user bounded to fewer keys than they had counts once in each kept key, so n is the
    key's count after bounding.
    """
    import numpy as np  # heavy: numpy
    mech = report["mechanism"]
    kind = _kind(report)
    n = np.asarray(counts, dtype=np.int64)
    if mech.get("public_keys") or "by_max_keys_per_user" in mech or kind is None:
        return None
    return kind.release_probability(report, n)


def _kind(report):
    """The kind object of a report's ``mechanism.kind`` (``pipelines.kinds.base.Kind``),
    which owns every kind-specific word; None for a kind this thresher does not know."""
    mech = report.get("mechanism", {}) if isinstance(report, dict) else {}
    kind = mech.get("kind")
    if not isinstance(kind, str):
        return None
    from thresher.pipelines import kinds  # heavy: start-up of thresher --help
    try:
        return kinds.get(kind)
    except KeyError:
        return None


def describes_rows(report):
    """Whether the report's kind has words about its released rows (its
    ``value_lines``; quantiles: null values and resolution), so they are worth reading."""
    kind = _kind(report)
    return kind is not None and kind.DESCRIBES_ROWS


def release_ceiling(report):
    """(M, p_M) when no count of users reaches release probability 1 because the table
    stops at an explicit max_frequency M below saturation (weighted_sampling: the kind's
    ``release_ceiling``); else None."""
    kind = _kind(report)
    return None if kind is None else kind.release_ceiling(report)


def users_at(report, probability, limit=10**7):
    """The smallest n whose release probability reaches ``probability`` (None if none)."""
    lo, hi = 0, 1
    while hi <= limit:
        p = release_probability(report, [hi])
        if p is None:
            return None
        if p[0] >= probability:
            break
        lo, hi = hi, hi * 2
    else:
        return None
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if release_probability(report, [mid])[0] >= probability:
            hi = mid
        else:
            lo = mid
    return hi


# ---- words -----------------------------------------------------------------------------------

def _g(x):
    return f"{x:.4g}" if isinstance(x, float) else f"{x}"


def bounded_data(report, key="key"):
    """The sentence that says what a released value is of (issue 42): the data after the
    contribution bound, not every input record -- the bound drops a user's keys (or
    records) beyond C before anything is counted, and the noise and the guarantee are
    about that bounded data (docs/contribution_bound.md)."""
    bounding = report["bounding"]
    c = bounding["max_keys_per_user"]
    if bounding.get("model") == "l1":
        return (f"counts are of the bounded data: a user with more than {c} records "
                f"contributes {c} of them, so a {key}'s count is of the records the bound "
                f"kept, not of all its records in the input")
    held = (f"a user holding more than {c} key{'s' if c != 1 else ''} is counted in {c} of "
            f"them only")
    kind = _kind(report)
    words = kind.bounded_data_words(held, key) if kind is not None else None
    if words is not None:
        return words
    return (f"counts are of the bounded data: {held}, so a {key}'s count is of the users "
            f"the bound kept for it, not of all its users in the input")


def noise_in_words(report, keys, release_point=True):
    """One or two sentences: what was added to each key's count and which keys came out."""
    mech = report["mechanism"]
    kind = _kind(report)
    bounding = report["bounding"]
    c = bounding["max_keys_per_user"]
    unit = "records" if bounding.get("model") == "l1" else "distinct users"
    each = (f"each user counted in at most {c} key{'s' if c != 1 else ''}"
            if bounding.get("model") != "l1" else f"each user contributing at most {c} records")
    how = "chosen privately" if bounding.get("chosen_by") == "exponential_mechanism" else "from the spec"
    key = " and ".join(keys) if keys else "key"
    out = [f"bound: {each} ({how})", bounded_data(report, key)]
    if mech.get("public_keys"):
        noise = (kind.public_noise_words(mech) if kind is not None else None) or "noise"
        out.append(f"noise: every public {key} is released with its count of {unit} plus "
                   f"{noise}; no threshold")
        return out
    if kind is not None:
        words, unit = kind.noise_words(report, key, unit)
        out += words
    for agg in mech.get("aggregates") or []:
        if isinstance(agg, dict) and "output" in agg:
            clip = agg.get("clip") or ["?", "?"]
            out.append(f"{agg['output']}: the {agg.get('statistic')} of {agg.get('column')} per "
                       f"released {key}, each user's total clamped to [{_g(clip[0])}, "
                       f"{_g(clip[1])}]" + (f", noise sigma {_g(agg['sigma'])}"
                                            if "sigma" in agg and agg.get("statistic") == "sum" else ""))
    ceiling = release_ceiling(report) if release_point else None
    half, sure = (users_at(report, 0.5), users_at(report, 0.99)) if release_point else (None, None)
    if half is not None and sure is not None:
        out.append(f"a {key} of {half:,} {unit} is released at least half the time; of "
                   f"{sure:,}, at least 99% of the time")
    elif ceiling is not None:
        m, top = ceiling
        reach = (f"a {key} of {half:,} {unit} is released at least half the time; "
                 if half is not None else "")
        out.append(f"{reach}counts above max_frequency {m} are treated as {m}, so a {key} of "
                   f"any size is released with probability at most {top:.3g} (pi_{m}); "
                   f"leave max_frequency to auto for a table that reaches 1")
    return out


def quantile_lines(report, table):
    """Words about a quantiles release's values, from its released rows (issue 36 D9: a
    release whose every value was null said "released 8 keys", and the report's
    ``resolution`` was taken for the values' own): how many values are null and why, and
    the resolution the values actually have (the ``resolution`` column) beside the finest
    the plan allows. [] for other kinds."""
    kind = _kind(report)
    if kind is None or not kind.DESCRIBES_ROWS:
        return []
    return kind.value_lines(report, table, key_columns(table.column_names, report))


def quantile_lines_of(output, report):
    """:func:`quantile_lines` of the release published in ``output`` (a local folder; []
    elsewhere, or when the files cannot be read)."""
    kind = _kind(report)
    if kind is None or not kind.DESCRIBES_ROWS or "://" in str(output):
        return []
    try:
        return quantile_lines(report, load_released(output, report))
    except (SpecError, OSError):
        return []


def run_lines(report, output, keys, ledger_line=None):
    """What ``thresher run`` prints at the end."""
    # The report names its files relative to the output folder (local or a URL).
    base = output.rstrip("/")
    files = [f"{base}/{name}" for name in report.get("outputs", [])] + [f"{base}/{REPORT_FILE}"]
    privacy = report["privacy"]
    delta = privacy.get("delta_spent", privacy["delta"])
    lines = ["wrote " + ", ".join(files),
             f"released {report['released_keys']:,} keys; spent epsilon={privacy['epsilon']:g}, "
             f"delta={delta:g} (user-level: {privacy['neighbouring']}); "
             f"max_keys_per_user={report['bounding']['max_keys_per_user']}"]
    lines += quantile_lines_of(output, report)
    if ledger_line:
        lines.append(ledger_line)
    lines += noise_in_words(report, keys)
    lines.append(f"look at it: thresher show {output}   |   thresher report {output} --html")
    return lines

"""The release spec: a YAML file describing one differentially private release.

The spec is data. It is read with a safe YAML loader (``!!python/...`` tags are refused,
duplicate keys are refused), checked against its JSON Schema (``pipelines.schema``, with
the jsonschema library: types, ranges, choices, unknown and missing fields), then by the
rules across fields below and in the kinds' ``parse``; nothing in it is evaluated as
code. Every error names the field and what is allowed; the CLI exits with code 2 on
them. Validation reads no data (only, in ``check_input``, file names and the schema in
file metadata).
"""
import dataclasses
import os
import re

import yaml

from thresher.pipelines.specs import columns, continual_section, schema
from thresher.pipelines.common import declare

from thresher.pipelines.dataio import formats, public_keys

from thresher.pipelines import kinds
# the automatic bound's defaults of a kind that sets none (pipelines.kinds.base.Kind.AUTO_*)
from thresher.pipelines.kinds.base import DEFAULT_AUTO_EPSILON_FRACTION, DEFAULT_AUTO_MAX_BOUND

from thresher.pipelines.ledgers import ledger
from thresher.pipelines.errors import SpecError
from thresher.pipelines.common.fields import SHORT as _SHORT
from thresher.pipelines.common.fields import describe as _describe
from thresher.pipelines.dataio.paths import input_files, resolved  # noqa: F401 (input_files: cli, release)

FORMATS = formats.FORMATS
MODELS = schema.MODELS
KINDS = schema.KINDS
TOP_FIELDS = schema.TOP_FIELDS
# Output columns the release adds; a key column may not share their names.
RESERVED_COLUMNS = ("count", "estimate", "token")

# A kind may set its own AUTO_MAX_BOUND (pipelines.kinds.base.Kind) (weighted_gaussian: 1024, whose noise does
# not grow with the bound; docs/partition_selection.md section 5).
# bounding.auto.objective: keys (the smoothed count of keys the release publishes) or l1
# (paper 002's error bound); the default from the docstring-corpus measurements in
# docs/contribution_bound.md section 1b.
DEFAULT_AUTO_OBJECTIVE = "keys"


@dataclasses.dataclass(frozen=True)
class InputSpec:
    path: object            # a file, glob or folder; None for a release over rows (rows_input)
    format: object          # parquet, csv or jsonl; None for a release over rows
    user: object            # the user column; None for a pre-sampled input (input.sample)
    keys: tuple
    sample: object = None   # {frequency, scheme, threshold} for an existing weighted sample
    public_keys: object = None  # {path, format} of the public key domain (pipelines/dataio/public_keys.py)
    values: tuple = ()      # value columns of ``aggregates`` (pipelines/specs/aggregates.py)
    delimiter: str = ","        # CSV field separator (input.delimiter; "\t" for .tsv)
    quantile_column: object = None  # the numeric column a quantiles release reads (mechanism.column)
    # the key columns the reader's ``__key`` hashes (None: every key column); a kind whose
    # release never reads that hash of a column it reads like a key sets it
    # (kinds.quantiles.read_spec: per-key quantiles over public cells, issue 43 round 7)
    hashed_keys: object = None

    @property
    def columns(self):
        """The columns a release reads."""
        if self.sample is not None:
            return [*self.keys, self.sample["frequency"]]
        return [self.user, *self.keys, *self.values,
                *([self.quantile_column] if self.quantile_column is not None else [])]


@dataclasses.dataclass(frozen=True)
class PrivacySpec:
    epsilon: float
    delta: float


@dataclasses.dataclass(frozen=True)
class AutoBoundSpec:
    epsilon: float          # the selection stage's epsilon, taken from privacy.epsilon
    candidates: tuple       # candidate bounds C, increasing
    max_bound: int
    dropped_weight: object = "balanced"   # "balanced" | "paper" | a number >= 1
    objective: str = "keys"                # "keys" | "l1" (accounting.contribution_bound)


@dataclasses.dataclass(frozen=True)
class BoundingSpec:
    max_keys_per_user: object   # int, or "auto"
    model: str
    auto: object                # AutoBoundSpec or None


@dataclasses.dataclass(frozen=True)
class OutputSpec:
    path: object               # the release folder; None for a release over rows (rows_input)
    confidence: float = 0.95   # of the <column>_low / _high intervals (pipelines/dataio/intervals.py)


@dataclasses.dataclass(frozen=True)
class ReleaseSpec:
    name: str
    description: str
    input: InputSpec
    privacy: PrivacySpec
    bounding: BoundingSpec
    mechanism: dict          # kind plus the kind's validated fields
    output: OutputSpec
    source_text: str         # the YAML as read, for the report's config_sha256
    aggregates: tuple = ()   # pipelines.specs.aggregates.AggregateSpec, one per output column
    aggregates_auto: object = None  # pipelines.specs.aggregates.AutoClipSpec with clip: auto
    budget: object = None    # pipelines.ledger.BudgetSpec: the dataset's ledger, or None
    continual: object = None  # pipelines.specs.continual_section.ContinualSpec, or None

    @property
    def kind(self):
        return self.mechanism["kind"]

    @property
    def kind_object(self):
        """The kind object of ``mechanism.kind`` (``pipelines.kinds.base.Kind``): what the
        modules below the kinds (intervals, public keys) ask for the kind's decisions."""
        return kinds.get(self.kind)

    @property
    def auto_bound(self):
        return self.bounding.max_keys_per_user == "auto"


class _StrictSafeLoader(yaml.SafeLoader):
    """SafeLoader that also refuses duplicate mapping keys (a silent overwrite otherwise)."""


def _construct_mapping(loader, node, deep=False):
    loader.flatten_mapping(node)
    seen = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        if isinstance(key, (list, dict)):
            raise SpecError("", f"line {key_node.start_mark.line + 1}: a mapping key must be a "
                                f"plain value (a name), got a {type(key).__name__}")
        if key in seen:
            raise SpecError("", f"line {key_node.start_mark.line + 1}: duplicate key {_SHORT.repr(key)}")
        seen.add(key)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_StrictSafeLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)

# YAML 1.1 (PyYAML) reads a float only with a dot: 1e-8 and 1e308 would be strings. Also
# resolve YAML 1.2's exponent forms (1e-8, 1E+8, -2e3), as people write them, as floats.
_StrictSafeLoader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*)(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"),
    list("-+0123456789"))


def load_yaml(text, source="spec"):
    """Parse YAML text safely; errors become SpecError with the line number."""
    try:
        data = yaml.load(text, Loader=_StrictSafeLoader)  # noqa: S506 - a SafeLoader subclass
    except SpecError:
        raise
    except RecursionError:
        raise SpecError("", f"{source}: malformed YAML: nested too deeply") from None
    except yaml.constructor.ConstructorError as exc:
        mark = exc.problem_mark
        where = f"line {mark.line + 1}: " if mark else ""
        raise SpecError("", f"{source}: {where}{exc.problem} (only plain YAML data is "
                            f"allowed; tags such as !!python/... are refused)") from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"line {mark.line + 1}, column {mark.column + 1}: " if mark else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise SpecError("", f"{source}: malformed YAML: {where}{problem}") from None
    size = _expanded_size(data)
    if size > MAX_EXPANDED_NODES:
        raise SpecError("", f"{source}: the document expands to more than {MAX_EXPANDED_NODES:,} "
                            f"values (YAML aliases); a spec is small, write it out")
    return data


# A spec has tens of values; aliases (&a / *a) can make a tiny document expand to billions.
MAX_EXPANDED_NODES = 100_000


def _expanded_size(data):
    """Number of values the document has with every alias written out, counted over the
    shared structure (each distinct object once, memoised): linear in the document."""
    memo = {}

    def size(obj):
        if not isinstance(obj, (list, dict)):
            return 1
        key = id(obj)
        if key in memo:
            return memo[key]
        memo[key] = MAX_EXPANDED_NODES + 1      # a cycle (a: &a [*a]) expands forever
        items = obj.values() if isinstance(obj, dict) else obj
        total = 1 + len(obj)
        for item in items:
            total += size(item)
            if total > MAX_EXPANDED_NODES:
                break
        memo[key] = total
        return total

    try:
        return size(data)
    except RecursionError:
        return MAX_EXPANDED_NODES + 1


# ---- sections (after the schema check: the rules across fields) ----------------------

def _parse_input(section, kind=None, rows_input=False):
    """``input`` of a release of kind ``kind`` (its kind object: it reads ``input.sample``;
    None: an input without a sample); ``rows_input``: no file (path and format None)."""
    sample = None
    if "sample" in section:
        if kind is None or not kind.SAMPLE_INPUT:
            raise SpecError("mechanism.kind", f"must be "
                            f"{_kinds_where(lambda k: k.SAMPLE_INPUT)} with input.sample (an "
                            f"existing sample is sanitized, not re-counted), got "
                            f"{kind.name if kind is not None else None!r}")
        sample = kind.parse_sample(section["sample"])
        if "user" in section:
            raise SpecError("input.user", "must be left out with input.sample: an existing "
                            "sample has one row per key, no user column")
    path = section.get("path")
    # a release over rows has no file: no format, and parse refused the file fields
    fmt, delimiter = (None, None) if rows_input else _file_format(section, path)
    user = section["user"] if sample is None else None
    keys = section.get("keys", [])
    keys = (keys,) if isinstance(keys, str) else tuple(keys)
    if user in keys:
        raise SpecError("input.keys", f"must not contain the user column {user!r}")
    for i, k in enumerate(keys):
        if k in RESERVED_COLUMNS or k.startswith("__"):
            raise SpecError(f"input.keys[{i}]", f"{k!r} is a name thresher uses for its output "
                            f"columns ({', '.join(RESERVED_COLUMNS)}) or internally (__*); "
                            f"rename the column")
    if sample is not None and sample["frequency"] in keys:
        raise SpecError("input.sample.frequency", "must not be one of input.keys")
    public = None
    if "public_keys" in section:
        if sample is not None:
            raise SpecError("input.public_keys", "cannot be combined with input.sample")
        public = public_keys.parse_section(section["public_keys"])
    return InputSpec(path=path, format=fmt, user=user, keys=keys, sample=sample,
                     public_keys=public, delimiter=delimiter or ",")


def _file_format(section, path):
    """(format, delimiter) of the input file(s) at ``path``: ``input.format`` or the file
    name's, a folder's files' format, and the CSV delimiter (None: the default ",")."""
    fmt, delimiter = section.get("format"), None
    folder = None
    if fmt is None and "://" not in path and os.path.isdir(path):
        folder = formats.infer_folder(path)     # a folder: the format of the files in it
    if folder is not None:
        fmt, delimiter = folder
    elif fmt is None:
        fmt, delimiter = formats.infer(path)
    if "delimiter" in section:
        if fmt != "csv":
            raise SpecError("input.delimiter", f"is only for csv input, not {fmt}")
        delimiter = formats.delimiter(section["delimiter"])
    elif fmt == "csv" and delimiter is None and folder is None:
        delimiter = formats.infer(path)[1] if _tells_format(path) else ","
    return fmt, delimiter


def _tells_format(path):
    try:
        formats.infer(path)
        return True
    except SpecError:
        return False


def _parse_privacy(section):
    return PrivacySpec(epsilon=float(section["epsilon"]), delta=float(section["delta"]))


def auto_max_bound(kind):
    """The default bounding.auto.max_bound of a kind (its AUTO_MAX_BOUND, default
    DEFAULT_AUTO_MAX_BOUND)."""
    return kinds.get(kind).AUTO_MAX_BOUND


def auto_min_bound(kind):
    """The smallest default candidate of a kind's automatic bound (its AUTO_MIN_BOUND,
    default 1: the whole sqrt(2) grid)."""
    return kinds.get(kind).AUTO_MIN_BOUND


def auto_epsilon_fraction(kind):
    """The default share of privacy.epsilon spent choosing C for a kind (its
    AUTO_EPSILON_FRACTION, default DEFAULT_AUTO_EPSILON_FRACTION)."""
    return kinds.get(kind).AUTO_EPSILON_FRACTION


def _parse_bounding(section, privacy, default_max_bound=DEFAULT_AUTO_MAX_BOUND,
                    epsilon_fraction=DEFAULT_AUTO_EPSILON_FRACTION, min_bound=1):
    bound = section["max_keys_per_user"]
    if bound != "auto":
        bound = int(bound)
    auto = None
    if bound == "auto":
        auto = _parse_auto(section.get("auto", {}), privacy, default_max_bound, epsilon_fraction,
                           min_bound)
    elif "auto" in section:
        raise SpecError("bounding.auto", "is only allowed with max_keys_per_user: auto")
    return BoundingSpec(max_keys_per_user=bound, model=section.get("model", "l0"), auto=auto)


def _parse_auto(section, privacy, default_max_bound=DEFAULT_AUTO_MAX_BOUND,
                epsilon_fraction=DEFAULT_AUTO_EPSILON_FRACTION, min_bound=1):
    field = "bounding.auto"
    eps = float(section.get("epsilon", epsilon_fraction * privacy.epsilon))
    if eps >= privacy.epsilon:
        raise SpecError(f"{field}.epsilon", f"is taken from privacy.epsilon and must be smaller "
                        f"than it ({privacy.epsilon:g}), got {eps:g}")
    max_bound = int(section.get("max_bound", default_max_bound))
    if "candidates" in section:
        cands = [int(c) for c in section["candidates"]]
        for i, c in enumerate(cands):
            if c > max_bound:
                raise SpecError(f"{field}.candidates[{i}]", f"must be an integer <= max_bound "
                                f"({max_bound}), got {c}")
        cands = tuple(sorted(cands))
    else:
        cands = default_candidates(max_bound)
        high = tuple(c for c in cands if c >= min_bound)
        cands = high or cands      # max_bound below the kind's floor: the whole grid
    # heavy: start-up of thresher validate
    from thresher.accounting.contribution_bound import DEFAULT_DROPPED_WEIGHT
    weight = section.get("dropped_weight", DEFAULT_DROPPED_WEIGHT)
    if not isinstance(weight, str):
        weight = float(weight)
    objective = section.get("objective", DEFAULT_AUTO_OBJECTIVE)
    if objective != "l1" and "dropped_weight" in section:
        raise SpecError(f"{field}.dropped_weight", f"weighs the l1 error score and only "
                        f"applies with {field}.objective: l1 (the objective is {objective})")
    return AutoBoundSpec(epsilon=eps, candidates=cands, max_bound=max_bound,
                         dropped_weight=weight, objective=objective)


def default_candidates(max_bound):
    """The geometric sqrt(2) grid 1, 2, 3, 4, 6, 8, 11, ... up to max_bound
    (accounting.contribution_bound.default_candidates; docs/contribution_bound.md)."""
    # heavy: start-up of thresher validate
    from thresher.accounting.contribution_bound import default_candidates as grid
    return grid(max_bound)


def _parse_mechanism(section):
    kind = section["kind"]
    fields = dict(section)
    del fields["kind"]
    return {"kind": kind, **kinds.get(kind).parse(fields)}


def parse_mechanism(section):
    """One ``mechanism`` section alone: checked against its kind's declared fields, then
    the kind's rules (what ``parse`` does with it; used by tests and tools)."""
    section = declare.without_nulls(section)
    kind = section.get("kind") if isinstance(section, dict) else None
    declare.check(section, schema.mechanism_schema((kind,) if kind in kinds.KINDS else ()),
                  "mechanism")
    return _parse_mechanism(section)


def _spec_schema(data, rows_input=False):
    """The schema the loader checks: with the spec's own kind only (or none when the kind
    is missing or unknown: the schema then reports that first)."""
    mechanism = data.get("mechanism")
    kind = mechanism.get("kind") if isinstance(mechanism, dict) else None
    return schema.json_schema(kinds=(kind,) if isinstance(kind, str) and kind in kinds.KINDS else (),
                              rows_input=rows_input)


def _refuse_file_fields(data):
    """A release over rows reads no file and writes none: a file field there would be
    silently ignored, so it is refused naming the field (the Python API drops the ones its
    documentation says it ignores before parsing)."""
    for section, names in (("input", schema.FILE_INPUT_FIELDS),
                           ("output", schema.FILE_OUTPUT_FIELDS)):
        given = data.get(section)
        for name in names:
            if isinstance(given, dict) and name in given:
                raise SpecError(f"{section}.{name}", "does not apply to a release over rows: "
                                "the rows are its input and the caller's sinks its output; "
                                "leave it out")
    if "continual" in data:
        raise SpecError("continual", "a release over rows makes one release; a continual "
                        "release runs one period at a time with `thresher run SPEC --period P` "
                        "(docs/continual.md)")


def _kinds_where(test):
    """The kinds whose kind object passes ``test``, as an error names them ("gaussian or
    laplace"): loads every kind, on an error path only."""
    return " or ".join(k for k in kinds.KINDS if test(kinds.get(k)))


def _public_domain_kinds():
    """The kinds taking ``input.public_keys``, as the error names them ("gaussian and
    laplace (and quantiles)"): loads every kind, on this error path only."""
    released = [k for k in kinds.KINDS if kinds.get(k).PUBLIC_DOMAIN_NOISE is not None]
    own = [k for k in kinds.KINDS if kinds.get(k).OWN_PUBLIC_KEYS]
    text = " and ".join(released)
    return text + (f" (and {' and '.join(own)})" if own else "")


def parse(data, source_text="", rows_input=False):
    """Validate a parsed YAML document into a ReleaseSpec; raises SpecError.

    ``rows_input``: the spec of a release over rows already in a pipeline (the Python API,
    Beam YAML: ``pipelines.api.release_of``): ``input`` names the rows' fields only and
    ``output`` gives at most ``confidence``; ``input.path``/``format``/``delimiter`` and
    ``output.path`` are refused (nothing would read them) and are None in the spec, as is
    ``output`` optional. A ``thresher run`` spec (the default) requires them."""
    if not isinstance(data, dict):
        raise SpecError("", f"the spec must be a YAML mapping with fields "
                            f"{', '.join(TOP_FIELDS)}; got {_describe(data)}")
    _refuse_null_confidence(data)
    data = declare.without_nulls(data)
    if rows_input:
        _refuse_file_fields(data)
    declare.check(data, _spec_schema(data, rows_input))
    privacy = _parse_privacy(data["privacy"])
    input_spec = _parse_input(data["input"], kinds.get(data["mechanism"]["kind"]), rows_input)
    bounding = _parse_bounding(data["bounding"], privacy, auto_max_bound(data["mechanism"]["kind"]),
                               auto_epsilon_fraction(data["mechanism"]["kind"]),
                               auto_min_bound(data["mechanism"]["kind"]))
    mechanism = _parse_mechanism(data["mechanism"])
    kind = kinds.get(mechanism["kind"])
    # the kind's checks of the input and bounding (heavy_hitters, quantiles, gaussian...)
    input_spec = kind.check_spec(mechanism, input_spec, bounding, privacy) or input_spec
    if kind.PUBLIC_DOMAIN_NOISE is not None:
        mechanism = public_keys.check_mechanism(mechanism, input_spec, data["mechanism"])
    elif input_spec.public_keys is not None and not kind.OWN_PUBLIC_KEYS:
        raise SpecError("input.public_keys", f"public_keys is supported for "
                        f"{_public_domain_kinds()}, not {mechanism['kind']!r}")
    auto_section = data["bounding"].get("auto") if isinstance(data["bounding"], dict) else None
    if input_spec.public_keys is not None and isinstance(auto_section, dict) \
            and "objective" in auto_section:
        raise SpecError("bounding.auto.objective", "does not apply with input.public_keys "
                        "(every public key is released; the bound follows the bounded-domain "
                        "rules, docs/contribution_bound.md section 4)")
    if mechanism.get("debias") and "debiased" in input_spec.keys:
        raise SpecError(f"input.keys[{input_spec.keys.index('debiased')}]",
                        "'debiased' is the output column that mechanism.debias adds; rename "
                        "the key column")
    if input_spec.sample is not None:
        mechanism = _presampled_mechanism(kind, mechanism, input_spec.sample, bounding)
    aggregates, aggregates_auto = (), None
    if "aggregates_auto" in data and "aggregates" not in data:
        raise SpecError("aggregates_auto", "only applies with aggregates (clip: auto)")
    if "aggregates" in data:
        # heavy: start-up of thresher validate
        from thresher.pipelines.specs import aggregates as aggregates_mod   # its calibration loads numerics
        aggregates = aggregates_mod.parse(data["aggregates"], input_spec, mechanism["kind"],
                                          bounding, RESERVED_COLUMNS + ("debiased",))
        input_spec = dataclasses.replace(input_spec, values=tuple(
            c for c, _ in aggregates_mod.value_columns(aggregates)))
        aggregates_auto = aggregates_mod.parse_auto(data.get("aggregates_auto"), privacy, aggregates)
        kind.check_aggregates(mechanism)
    columns.check(input_spec, mechanism, aggregates, kind.OUTPUT_COLUMNS)
    budget = ledger.parse_section(data["budget"], privacy) if "budget" in data else None
    continual = None
    if "continual" in data:
        continual_section.check(data, input_spec, bounding, mechanism, budget, kind,
                                lambda: _kinds_where(lambda k: k.CONTINUAL))
        continual = continual_section.parse(data["continual"])
    return ReleaseSpec(
        name=data["name"],
        description=data.get("description", ""),
        input=input_spec,
        privacy=privacy,
        bounding=bounding,
        mechanism=mechanism,
        output=OutputSpec(path=data.get("output", {}).get("path"),
                          confidence=float(data.get("output", {}).get("confidence", 0.95))),
        source_text=source_text,
        aggregates=aggregates,
        aggregates_auto=aggregates_auto,
        budget=budget,
        continual=continual,
    )


def _refuse_null_confidence(data):
    """``output.confidence: null`` is refused, not read as the default 0.95 (issue 36): it
    sets what the published interval columns claim, so a level nobody wrote is never
    published (leave the field out for the default)."""
    output = data.get("output")
    if isinstance(output, dict) and "confidence" in output and output["confidence"] is None:
        raise SpecError("output.confidence", f"must be a number > 0 and < 1, got nothing "
                        f"(null); leave the field out for the default "
                        f"{OutputSpec.confidence}")


def _presampled_mechanism(kind, mechanism, sample, bounding):
    """An existing weighted sample is released by the kind's sanitizer alone (a kind with
    ``SAMPLE_INPUT``, weighted_sampling: paper 001's post-processing use): the guarantee
    holds if the sample was drawn as declared from per-key user counts with each user in
    at most max_keys_per_user keys, once each."""
    if bounding.max_keys_per_user == "auto" or bounding.model != "l0":
        raise SpecError("bounding.max_keys_per_user", "with input.sample must be the integer bound "
                        "the sample was built with (model l0): it cannot be chosen from the sample")
    return {"kind": mechanism["kind"], **kind.for_sample(
        {k: v for k, v in mechanism.items() if k != "kind"}, sample, bounding)}


def load(path):
    """Read and validate a spec file."""
    try:
        with open(path, "rb") as handle:
            raw = handle.read()
    except FileNotFoundError:
        raise SpecError("", f"spec file {path!r}{resolved(path)} does not exist") from None
    except IsADirectoryError:
        raise SpecError("", f"spec file {path!r} is a directory") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SpecError("", f"spec file {path!r} is not UTF-8 text (byte {exc.start})") from None
    spec = parse(load_yaml(text, source=path), source_text=text)
    if spec.budget is not None:
        # budget.ledger: a relative path names a file beside the spec (docs/ledger.md)
        spec = dataclasses.replace(spec, budget=ledger.resolved_from(spec.budget, path))
    return spec



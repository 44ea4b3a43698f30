"""The release spec: a YAML file describing one differentially private release.

The spec is data. It is read with a safe YAML loader (``!!python/...`` tags are refused,
duplicate keys are refused), checked field by field, and nothing in it is evaluated as
code. Every error names the field and what is allowed; the CLI exits with code 2 on
them. Validation reads no data (only, in ``check_input``, file names and the schema in
file metadata).
"""
import dataclasses
import glob
import math
import os
import re
import reprlib

import yaml

from pipelines.errors import SpecError

FORMATS = ("parquet", "csv", "jsonl")
MODELS = ("l0", "l1")
KINDS = ("gaussian", "laplace", "sample_and_threshold", "weighted_sampling", "heavy_hitters",
         "quantiles")
# Kinds whose input.keys may be empty or left out (one global release).
KEYLESS_KINDS = ("quantiles",)
# Output columns the release adds; a key column may not share their names.
RESERVED_COLUMNS = ("count", "estimate", "token")

DEFAULT_AUTO_EPSILON_FRACTION = 0.1
DEFAULT_AUTO_MAX_BOUND = 128
# bounding.auto.objective: keys (the smoothed count of keys the release publishes) or l1
# (paper 002's error bound); the default from the docstring-corpus measurements in
# docs/contribution_bound.md section 1b.
DEFAULT_AUTO_OBJECTIVE = "keys"


@dataclasses.dataclass(frozen=True)
class InputSpec:
    path: str
    format: str
    user: object            # the user column; None for a pre-sampled input (input.sample)
    keys: tuple
    sample: object = None   # {frequency, scheme, threshold} for an existing weighted sample
    public_keys: object = None  # {path, format} of the public key domain (pipelines/public_keys.py)
    values: tuple = ()      # value columns of ``aggregates`` (pipelines/aggregates.py)
    delimiter: str = ","        # CSV field separator (input.delimiter; "\t" for .tsv)
    quantile_column: object = None  # the numeric column a quantiles release reads (mechanism.column)

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
    path: str


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
    aggregates: tuple = ()   # pipelines.aggregates.AggregateSpec, one per output column
    aggregates_auto: object = None  # pipelines.aggregates.AutoClipSpec with clip: auto
    budget: object = None    # pipelines.ledger.BudgetSpec: the dataset's ledger, or None

    @property
    def kind(self):
        return self.mechanism["kind"]

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


# ---- field checkers -------------------------------------------------------------

def _mapping(value, field):
    if not isinstance(value, dict):
        raise SpecError(field, f"must be a mapping, got {_describe(value)}")
    return value


def _describe(value):
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {_SHORT.repr(value)}"


# Error messages show at most this much of a value (never the expansion of a large one).
_SHORT = reprlib.Repr()
_SHORT.maxstring = _SHORT.maxother = 80
_SHORT.maxlevel, _SHORT.maxlist, _SHORT.maxdict = 3, 6, 6


def check_fields(section, field, allowed, required=()):
    """Refuse unknown and missing fields of one mapping."""
    for key in section:
        if key not in allowed:
            raise SpecError(f"{field}.{key}" if field else str(key),
                            f"unknown field; allowed fields of {field or 'the spec'}: "
                            f"{', '.join(allowed)}")
    for key in required:
        if key not in section or section[key] is None:
            raise SpecError(f"{field}.{key}" if field else key, "is required")


def string(value, field):
    if not isinstance(value, str) or not value.strip():
        raise SpecError(field, f"must be a non-empty string, got {_describe(value)}")
    return value


def number(value, field, *, low=None, high=None, low_open=False, high_open=False):
    """A finite real number within [low, high] (open ends where asked)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, f"must be a number, got {_describe(value)}")
    value = float(value)
    if not math.isfinite(value):
        raise SpecError(field, f"must be finite, got {value}")
    ok = True
    if low is not None:
        ok &= value > low if low_open else value >= low
    if high is not None:
        ok &= value < high if high_open else value <= high
    if not ok:
        lo = "" if low is None else f"{'>' if low_open else '>='} {low:g}"
        hi = "" if high is None else f"{'<' if high_open else '<='} {high:g}"
        rng = " and ".join(p for p in (lo, hi) if p)
        raise SpecError(field, f"must be {rng}, got {value:g}")
    return value


def integer(value, field, *, low=None, high=None):
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SpecError(field, f"must be an integer, got {_describe(value)}")
    if low is not None and value < low:
        raise SpecError(field, f"must be an integer >= {low}, got {value}")
    if high is not None and value > high:
        raise SpecError(field, f"must be an integer <= {high}, got {value}")
    return value


def choice(value, field, allowed):
    if value not in allowed:
        raise SpecError(field, f"must be one of {', '.join(allowed)}, got {_describe(value)}")
    return value


# ---- sections ----------------------------------------------------------------------

def _parse_input(section, keys_optional=False):
    field = "input"
    _mapping(section, field)
    check_fields(section, field, ("path", "format", "user", "keys", "sample", "public_keys",
                                  "delimiter"), ("path",) if keys_optional else ("path", "keys"))
    sample = None
    if section.get("sample") is not None:
        from pipelines.kinds.weighted_sampling import parse_sample
        sample = parse_sample(section["sample"])
        if section.get("user") is not None:
            raise SpecError("input.user", "must be left out with input.sample: an existing "
                            "sample has one row per key, no user column")
    elif section.get("user") is None:
        raise SpecError("input.user", "is required")
    path = string(section["path"], "input.path")
    from pipelines import formats
    fmt, delimiter = section.get("format"), None
    if fmt is None:
        fmt, delimiter = formats.infer(path)
    choice(fmt, "input.format", FORMATS)
    if section.get("delimiter") is not None:
        if fmt != "csv":
            raise SpecError("input.delimiter", f"is only for csv input, not {fmt}")
        delimiter = formats.delimiter(section["delimiter"])
    elif fmt == "csv" and delimiter is None:
        delimiter = formats.infer(path)[1] if _tells_format(path) else ","
    user = string(section["user"], "input.user") if sample is None else None
    keys = section.get("keys")
    if isinstance(keys, str):
        keys = [keys]
    if keys_optional and keys in (None, []):
        keys = []
    elif not isinstance(keys, list) or not keys:
        raise SpecError("input.keys", f"must be a non-empty list of column names, got {_describe(keys)}")
    keys = tuple(string(k, f"input.keys[{i}]") for i, k in enumerate(keys))
    if len(set(keys)) != len(keys):
        raise SpecError("input.keys", f"lists a column twice: {list(keys)}")
    if user in keys:
        raise SpecError("input.keys", f"must not contain the user column {user!r}")
    for i, k in enumerate(keys):
        if k in RESERVED_COLUMNS or k.startswith("__"):
            raise SpecError(f"input.keys[{i}]", f"{k!r} is a name thresher uses for its output "
                            f"columns ({', '.join(RESERVED_COLUMNS)}) or internally (__*); "
                            f"rename the column")
    if sample is not None and sample["frequency"] in keys:
        raise SpecError("input.sample.frequency", "must not be one of input.keys")
    public_keys = None
    if section.get("public_keys") is not None:
        from pipelines import public_keys as public_keys_mod
        if sample is not None:
            raise SpecError("input.public_keys", "cannot be combined with input.sample")
        public_keys = public_keys_mod.parse_section(section["public_keys"])
    return InputSpec(path=path, format=fmt, user=user, keys=keys, sample=sample,
                     public_keys=public_keys, delimiter=delimiter or ",")


def _tells_format(path):
    from pipelines import formats
    try:
        formats.infer(path)
        return True
    except SpecError:
        return False


def _parse_privacy(section):
    _mapping(section, "privacy")
    check_fields(section, "privacy", ("epsilon", "delta"), ("epsilon", "delta"))
    epsilon = number(section["epsilon"], "privacy.epsilon", low=0, low_open=True)
    delta = number(section["delta"], "privacy.delta", low=0, high=1, low_open=True, high_open=True)
    return PrivacySpec(epsilon=epsilon, delta=delta)


def _parse_bounding(section, privacy):
    _mapping(section, "bounding")
    check_fields(section, "bounding", ("max_keys_per_user", "model", "auto"), ("max_keys_per_user",))
    bound = section["max_keys_per_user"]
    if bound != "auto":
        if isinstance(bound, str):
            raise SpecError("bounding.max_keys_per_user",
                            f"must be a positive integer or \"auto\", got {bound!r}")
        bound = integer(bound, "bounding.max_keys_per_user", low=1, high=10**7)
    model = choice(section.get("model", "l0"), "bounding.model", MODELS)
    auto_section = section.get("auto")
    auto = None
    if bound == "auto":
        auto = _parse_auto(auto_section or {}, privacy)
    elif auto_section is not None:
        raise SpecError("bounding.auto", "is only allowed with max_keys_per_user: auto")
    return BoundingSpec(max_keys_per_user=bound, model=model, auto=auto)


def _parse_auto(section, privacy):
    field = "bounding.auto"
    _mapping(section, field)
    check_fields(section, field, ("epsilon", "candidates", "max_bound", "dropped_weight",
                                  "objective"))
    if "epsilon" in section:
        eps = number(section["epsilon"], f"{field}.epsilon", low=0, low_open=True)
    else:
        eps = DEFAULT_AUTO_EPSILON_FRACTION * privacy.epsilon
    if eps >= privacy.epsilon:
        raise SpecError(f"{field}.epsilon", f"is taken from privacy.epsilon and must be smaller "
                        f"than it ({privacy.epsilon:g}), got {eps:g}")
    max_bound = integer(section.get("max_bound", DEFAULT_AUTO_MAX_BOUND), f"{field}.max_bound",
                        low=1, high=10**6)
    if "candidates" in section:
        cands = section["candidates"]
        if not isinstance(cands, list) or not cands:
            raise SpecError(f"{field}.candidates", f"must be a non-empty list of positive "
                            f"integers, got {_describe(cands)}")
        cands = [integer(c, f"{field}.candidates[{i}]", low=1, high=max_bound)
                 for i, c in enumerate(cands)]
        if len(set(cands)) != len(cands):
            raise SpecError(f"{field}.candidates", f"lists a value twice: {cands}")
        cands = tuple(sorted(cands))
    else:
        cands = default_candidates(max_bound)
    from accounting.contribution_bound import DEFAULT_DROPPED_WEIGHT, DROPPED_WEIGHT_RULES
    weight = section.get("dropped_weight", DEFAULT_DROPPED_WEIGHT)
    if isinstance(weight, str):
        if weight not in DROPPED_WEIGHT_RULES:
            raise SpecError(f"{field}.dropped_weight", f"must be balanced, paper or a number "
                            f">= 1, got {_describe(weight)}")
    else:
        weight = number(weight, f"{field}.dropped_weight", low=1, high=1e6)
    from accounting.contribution_bound import OBJECTIVES
    objective = choice(section.get("objective", DEFAULT_AUTO_OBJECTIVE), f"{field}.objective",
                       OBJECTIVES)
    if objective != "l1" and "dropped_weight" in section:
        raise SpecError(f"{field}.dropped_weight", f"weighs the l1 error score and only "
                        f"applies with {field}.objective: l1 (the objective is {objective})")
    return AutoBoundSpec(epsilon=eps, candidates=cands, max_bound=max_bound,
                         dropped_weight=weight, objective=objective)


def default_candidates(max_bound):
    """The geometric sqrt(2) grid 1, 2, 3, 4, 6, 8, 11, ... up to max_bound
    (accounting.contribution_bound.default_candidates; docs/contribution_bound.md)."""
    from accounting.contribution_bound import default_candidates as grid
    return grid(max_bound)


def _parse_mechanism(section):
    _mapping(section, "mechanism")
    if "kind" not in section:
        raise SpecError("mechanism.kind", f"is required; one of {', '.join(KINDS)}")
    kind = choice(section["kind"], "mechanism.kind", KINDS)
    module = kind_module(kind)
    fields = dict(section)
    del fields["kind"]
    check_fields(fields, "mechanism", tuple(module.FIELDS))
    parsed = module.parse(fields)
    return {"kind": kind, **parsed}


def kind_module(kind):
    import importlib
    return importlib.import_module(f"pipelines.kinds.{kind}")


def _parse_output(section):
    _mapping(section, "output")
    check_fields(section, "output", ("path",), ("path",))
    return OutputSpec(path=string(section["path"], "output.path"))


TOP_FIELDS = ("name", "description", "input", "privacy", "bounding", "mechanism", "output",
              "aggregates", "aggregates_auto", "budget")


def parse(data, source_text=""):
    """Validate a parsed YAML document into a ReleaseSpec; raises SpecError."""
    if not isinstance(data, dict):
        raise SpecError("", f"the spec must be a YAML mapping with fields "
                            f"{', '.join(TOP_FIELDS)}; got {_describe(data)}")
    check_fields(data, "", TOP_FIELDS,
                 ("name", "input", "privacy", "bounding", "mechanism", "output"))
    name = string(data["name"], "name")
    description = data.get("description", "")
    if not isinstance(description, str):
        raise SpecError("description", f"must be a string, got {_describe(description)}")
    privacy = _parse_privacy(data["privacy"])
    kind = data["mechanism"].get("kind") if isinstance(data["mechanism"], dict) else None
    input_spec = _parse_input(data["input"], keys_optional=kind in KEYLESS_KINDS)
    bounding = _parse_bounding(data["bounding"], privacy)
    mechanism = _parse_mechanism(data["mechanism"])
    check_spec = getattr(kind_module(mechanism["kind"]), "check_spec", None)
    if check_spec is not None:  # kind-specific checks of the input and bounding (heavy_hitters, quantiles)
        input_spec = check_spec(mechanism, input_spec, bounding, privacy) or input_spec
    if mechanism["kind"] in ("gaussian", "laplace"):
        from pipelines import public_keys as public_keys_mod
        mechanism = public_keys_mod.check_mechanism(mechanism, input_spec, data["mechanism"])
    elif input_spec.public_keys is not None and mechanism["kind"] != "quantiles":
        raise SpecError("input.public_keys", f"public_keys is supported for gaussian and "
                        f"laplace (and quantiles), not {mechanism['kind']!r}")
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
        mechanism = _presampled_mechanism(mechanism, input_spec.sample, bounding)
    aggregates, aggregates_auto = (), None
    if data.get("aggregates_auto") is not None and data.get("aggregates") is None:
        raise SpecError("aggregates_auto", "only applies with aggregates (clip: auto)")
    if data.get("aggregates") is not None:
        from pipelines import aggregates as aggregates_mod
        aggregates = aggregates_mod.parse(data["aggregates"], input_spec, mechanism["kind"],
                                          bounding, RESERVED_COLUMNS + ("debiased",))
        input_spec = dataclasses.replace(input_spec, values=tuple(
            c for c, _ in aggregates_mod.value_columns(aggregates)))
        aggregates_auto = aggregates_mod.parse_auto(data.get("aggregates_auto"), privacy, aggregates)
    return ReleaseSpec(
        name=name,
        description=description,
        input=input_spec,
        privacy=privacy,
        bounding=bounding,
        mechanism=mechanism,
        output=_parse_output(data["output"]),
        source_text=source_text,
        aggregates=aggregates,
        aggregates_auto=aggregates_auto,
        budget=_parse_budget(data.get("budget"), privacy),
    )


def _parse_budget(section, privacy):
    if section is None:
        return None
    from pipelines.ledger import parse_section
    return parse_section(section, privacy)


def _presampled_mechanism(mechanism, sample, bounding):
    """An existing weighted sample is released by SanitizeSample alone (paper 001's
    post-processing use): the guarantee holds if the sample was drawn as declared from
    per-key user counts with each user in at most max_keys_per_user keys, once each."""
    if mechanism["kind"] != "weighted_sampling":
        raise SpecError("mechanism.kind", "must be weighted_sampling with input.sample "
                        f"(an existing sample is sanitized, not re-counted), got {mechanism['kind']!r}")
    if bounding.max_keys_per_user == "auto" or bounding.model != "l0":
        raise SpecError("bounding.max_keys_per_user", "with input.sample must be the integer bound "
                        "the sample was built with (model l0): it cannot be chosen from the sample")
    from pipelines.kinds.weighted_sampling import mechanism_for_sample
    return {"kind": mechanism["kind"], **mechanism_for_sample(
        {k: v for k, v in mechanism.items() if k != "kind"}, sample)}


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
    return parse(load_yaml(text, source=path), source_text=text)


def resolved(path):
    """" (resolved: /abs/path)" for a relative local path, so an error shows where it looked."""
    if "://" in path or os.path.isabs(path):
        return ""
    return f" (resolved: {os.path.abspath(path)})"


def input_files(input_spec):
    """The files an input path names (a file, a glob, or a folder of files); SpecError if none.

    Remote paths (gs://, s3://, ...) are matched through Beam's FileSystems."""
    path = input_spec.path
    if "://" in path:
        from apache_beam.io.filesystems import FileSystems
        try:
            matches = FileSystems.match([path])[0].metadata_list
        except Exception as exc:  # noqa: BLE001 - any filesystem failure is reported as such
            raise SpecError("input.path", f"cannot list {path!r}: {exc}") from None
        files = sorted(m.path for m in matches)
    elif os.path.isdir(path):
        files = sorted(os.path.join(path, f) for f in os.listdir(path)
                       if not f.startswith((".", "_")) and os.path.isfile(os.path.join(path, f)))
    elif glob.has_magic(path):
        files = sorted(f for f in glob.glob(path) if os.path.isfile(f))
    else:
        files = [path] if os.path.isfile(path) else []
    if not files:
        if glob.has_magic(path):
            what = "matches no files"
        elif os.path.isdir(path):
            what = "is a folder with no input files in it (names starting with . or _ are skipped)"
        elif os.path.exists(path):
            what = "is not a regular file (a FIFO, socket or device); give a file or a folder"
        else:
            what = "does not exist"
        raise SpecError("input.path", f"{path!r}{resolved(path)} {what}")
    return files

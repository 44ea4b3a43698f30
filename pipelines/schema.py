"""The release spec as a JSON Schema (draft 2020-12), for editors and CI linters:
``thresher schema > thresher.schema.json``.

It is generated from the declarations the loader itself uses: the top-level fields
(``pipelines.spec.TOP_FIELDS``), each kind's ``FIELDS`` (``pipelines/kinds/``), the formats,
models and kinds, and ``pipelines.ledger.FIELDS``; the types and ranges below mirror the
checks in ``pipelines.spec``. ``thresher validate`` remains the authority (it also checks
cross-field rules, the input's columns and the calibration); a spec the schema accepts
may still be refused there, with the field named.
"""
from pipelines import ledger
from pipelines import spec as spec_mod

DRAFT = "https://json-schema.org/draft/2020-12/schema"
_NUMBER = {"type": "number"}
_POSITIVE = {"type": "number", "exclusiveMinimum": 0}
_STRING = {"type": "string", "minLength": 1}


def _object(properties, required=(), description=None):
    out = {"type": "object", "properties": properties, "additionalProperties": False}
    if required:
        out["required"] = list(required)
    if description:
        out["description"] = description
    return out


def _input():
    from pipelines.kinds.weighted_sampling import SAMPLE_FIELDS
    keys = {"oneOf": [_STRING, {"type": "array", "items": _STRING, "minItems": 1}]}
    return _object({
        "path": {**_STRING, "description": "a file, a glob or a folder; local or a Beam "
                                           "filesystem URL (gs://, s3://)"},
        "format": {"enum": list(spec_mod.FORMATS),
                   "description": "optional: from the file name otherwise"},
        "user": {**_STRING, "description": "the column holding the privacy unit"},
        "keys": {**keys, "description": "one or more group-by columns"},
        "delimiter": {"type": "string", "minLength": 1, "maxLength": 2,
                      "description": "csv only: one character (\"\\t\" for a tab)"},
        "sample": _object({name: {"description": text} for name, text in SAMPLE_FIELDS.items()},
                          ("frequency", "scheme"),
                          "an existing weighted sample to sanitize (weighted_sampling only)"),
        "public_keys": _object({"path": _STRING, "format": {"enum": list(spec_mod.FORMATS)}},
                               ("path",), "a public key domain (gaussian, laplace)"),
    }, ("path", "keys"))


def _privacy():
    return _object({"epsilon": _POSITIVE,
                    "delta": {"type": "number", "exclusiveMinimum": 0, "exclusiveMaximum": 1}},
                   ("epsilon", "delta"), "the release's total (epsilon, delta)")


def _bounding():
    return _object({
        "max_keys_per_user": {"oneOf": [{"type": "integer", "minimum": 1, "maximum": 10**7},
                                        {"const": "auto"}]},
        "model": {"enum": list(spec_mod.MODELS)},
        "auto": _object({
            "epsilon": _POSITIVE,
            "candidates": {"type": "array", "minItems": 1,
                           "items": {"type": "integer", "minimum": 1}},
            "max_bound": {"type": "integer", "minimum": 1, "maximum": 10**6},
            "dropped_weight": {"oneOf": [{"enum": ["balanced", "paper"]},
                                         {"type": "number", "minimum": 1, "maximum": 1e6}]},
            "objective": {"enum": ["keys", "l1"]},
        }),
    }, ("max_keys_per_user",))


def _mechanism():
    variants = []
    for kind in spec_mod.KINDS:
        module = spec_mod.kind_module(kind)
        props = {"kind": {"const": kind}}
        for name, text in module.FIELDS.items():
            props[name] = {"description": text}
        variants.append(_object(props, ("kind",), (module.__doc__ or "").strip().splitlines()[0]))
    return {"type": "object", "required": ["kind"],
            "properties": {"kind": {"enum": list(spec_mod.KINDS)}},
            "oneOf": variants}


def _budget():
    return _object({
        "ledger": {**_STRING, "description": "a SQLite file path (database URLs are not "
                                             "supported yet)"},
        "dataset": {**_STRING, "description": "what the total protects: the same users "
                                              "across releases"},
        "epsilon": _POSITIVE,
        "delta": {"type": "number", "minimum": 0, "exclusiveMaximum": 1},
    }, ledger.FIELDS, "charge this release to a dataset's total in a ledger")


def _aggregates():
    from pipelines.aggregates import STATISTICS
    clip = {"oneOf": [{"type": "array", "items": _NUMBER, "minItems": 2, "maxItems": 2},
                      {"const": "auto"}],
            "description": "[low, high] bounds each user's total for the key, or auto"}
    entry = _object({"column": _STRING, "statistic": {"enum": list(STATISTICS)}, "clip": clip},
                    ("column", "statistic", "clip"))
    return {"type": "array", "items": entry, "minItems": 1,
            "description": "per released key, beside the count (gaussian, laplace)"}


def _aggregates_auto():
    return _object({"epsilon": _POSITIVE, "quantile": _NUMBER,
                    "min_exponent": {"type": "integer"}, "max_exponent": {"type": "integer"}},
                   description="the private choice of clip: auto bounds")


def json_schema():
    """The JSON Schema of a release spec (a dict)."""
    sections = {
        "name": {**_STRING, "description": "the release's name (in the report)"},
        "description": {"type": "string"},
        "input": _input(),
        "privacy": _privacy(),
        "bounding": _bounding(),
        "mechanism": _mechanism(),
        "output": _object({"path": _STRING}, ("path",),
                          "a folder: released.parquet + release_report.json"),
        "budget": _budget(),
        "aggregates": _aggregates(),
        "aggregates_auto": _aggregates_auto(),
    }
    missing = set(spec_mod.TOP_FIELDS) ^ set(sections)
    if missing:      # a field added to the loader without its schema (or the reverse)
        raise AssertionError(f"schema and spec.TOP_FIELDS disagree on {sorted(missing)}")
    return {
        "$schema": DRAFT,
        "title": "thresher release spec",
        "type": "object",
        "properties": {name: sections[name] for name in spec_mod.TOP_FIELDS},
        "required": ["name", "input", "privacy", "bounding", "mechanism", "output"],
        "additionalProperties": False,
    }

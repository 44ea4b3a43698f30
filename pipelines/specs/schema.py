"""The release spec as a JSON Schema (draft 2020-12): declared once, here and in the
modules that own fields, and used twice.

- ``thresher schema`` prints it (``thresher schema > thresher.schema.json``) for editors
  and CI linters;
- ``pipelines.spec.parse`` checks every spec against it with the jsonschema library
  (``pipelines.declare.check``) before the rules across fields run, so a field's type,
  range, choices, and the unknown and missing fields are reported from this declaration.

Owners: the top-level sections are declared below; each kind declares its ``mechanism``
fields (``pipelines/kinds/<kind>.py``: its kind object's ``FIELDS`` and ``REQUIRED``), ``input.sample`` is weighted
sampling's (``SAMPLE_FIELDS``), ``input.public_keys`` and the public-domain mechanism
fields are ``pipelines.public_keys``', ``budget`` is ``pipelines.ledger``'s, ``aggregates``
and ``aggregates_auto`` are ``pipelines.specs.aggregates``' (declared in
``pipelines.aggregates_fields``, which loads no numerics). ``thresher validate`` remains the
authority: a spec the schema accepts may still be refused by a rule across fields, the
input's columns or the calibration, with the field named.
"""
from thresher.pipelines.kinds._sample_fields import SAMPLE_FIELDS
from thresher.pipelines.specs import aggregates_fields
from thresher.pipelines.common import declare as d
from thresher.pipelines.ledgers import ledger
from thresher.pipelines.specs import continual_section
from thresher.pipelines.dataio import public_keys
from thresher.pipelines import kinds as kinds_pkg
from thresher.pipelines.dataio.formats import FORMATS

DRAFT = "https://json-schema.org/draft/2020-12/schema"
MODELS = ("l0", "l1")
KINDS = kinds_pkg.KINDS
MAX_BOUND = 10**7            # bounding.max_keys_per_user
MAX_AUTO_BOUND = 10**6       # bounding.auto.max_bound
MAX_CANDIDATES = 64          # bounding.auto.candidates (each is calibrated by the plan)
REQUIRED = ("name", "input", "privacy", "bounding", "mechanism", "output")
# accounting.contribution_bound.DROPPED_WEIGHT_RULES (a test checks they agree; that module
# loads scipy.stats, seconds the loader need not spend)
DROPPED_WEIGHT_RULES = ("balanced", "paper")
OBJECTIVES = ("keys", "l1")      # accounting.contribution_bound.OBJECTIVES (tested, as above)


# The fields a release over rows (the Python API, Beam YAML: ``rows_input``) has no use
# for: the rows are its input and the caller's sinks its output (pipelines.api).
FILE_INPUT_FIELDS = ("path", "format", "delimiter")
FILE_OUTPUT_FIELDS = ("path",)


def _input(rows_input=False):
    column = d.string()
    fields = {
        "path": d.string(description="a file, a glob or a folder; local or a Beam filesystem "
                                     "URL (gs://, s3://)"),
        "format": d.choice(FORMATS, description="optional: from the file name otherwise"),
        "user": d.string(description="the column holding the privacy unit (left out with "
                                     "input.sample)"),
        "keys": d.one_of(column, d.array(column, unique=True),
                         description="one or more group-by columns (none: quantiles only)"),
        "delimiter": {"type": "string", "minLength": 1, "maxLength": 2,
                      "description": "csv only: one character (\"\\t\" for a tab)"},
        "sample": d.mapping(SAMPLE_FIELDS, ("frequency", "scheme"),
                            description="an existing weighted sample to sanitize "
                                        "(weighted_sampling only)"),
        "public_keys": d.mapping(public_keys.SECTION_FIELDS, ("path",),
                                 description="a public key domain (gaussian, laplace, quantiles)"),
    }
    if rows_input:
        fields = {k: v for k, v in fields.items() if k not in FILE_INPUT_FIELDS}
    return d.mapping(fields, () if rows_input else ("path",),
                     **{"if": {"required": ["sample"]}, "else": {"required": ["user"]}})


def _privacy():
    return d.mapping({"epsilon": d.number(low=0, low_open=True),
                      "delta": d.number(low=0, high=1, low_open=True, high_open=True)},
                     ("epsilon", "delta"), description="the release's total (epsilon, delta)")


def _bounding():
    return d.mapping({
        "max_keys_per_user": d.one_of(d.integer(low=1, high=MAX_BOUND), d.const("auto")),
        "model": d.choice(MODELS, default="l0"),
        "auto": d.mapping({
            "epsilon": d.number(low=0, low_open=True, description="the selection stage's "
                                "epsilon, out of privacy.epsilon (default a tenth; adaptive: a "
                                "twentieth)"),
            "candidates": d.array(d.integer(low=1, high=MAX_AUTO_BOUND), min_items=1,
                                  max_items=MAX_CANDIDATES, unique=True, description=(
                                      "the bounds to choose from; each is calibrated when "
                                      f"planning, so at most {MAX_CANDIDATES}")),
            "max_bound": d.integer(low=1, high=MAX_AUTO_BOUND),
            "dropped_weight": d.one_of(d.choice(DROPPED_WEIGHT_RULES),
                                       d.number(low=1, high=1e6)),
            "objective": d.choice(OBJECTIVES, default="keys", description=(
                "what the chosen bound maximises: keys (the expected number of released "
                "keys) or l1 (minus the l1 error of the counts)")),
        }, description="the private choice of max_keys_per_user (with max_keys_per_user: auto)"),
    }, ("max_keys_per_user",))


def kind_variant(kind):
    """The fields of one kind's mechanism section, from its kind object's FIELDS."""
    found = kinds_pkg.get(kind)
    properties = {"kind": d.const(kind), **found.FIELDS}
    return d.mapping(properties, ("kind", *found.REQUIRED), description=found.description)


def mechanism_schema(kinds):
    return {"type": "object", "required": ["kind"],
            "properties": {"kind": d.choice(kinds_pkg.KINDS)},
            "allOf": [{"if": {"properties": {"kind": {"const": k}}, "required": ["kind"]},
                       "then": kind_variant(k)} for k in kinds]}


def _keys_optional(kinds):
    """input.keys is required (one or more) unless the kind reads none (KEYS_OPTIONAL, e.g.
    quantiles: then it may be left out or empty)."""
    keyless = [k for k in kinds if kinds_pkg.get(k).KEYS_OPTIONAL]
    return {"if": {"properties": {"mechanism": {"properties": {"kind": {"enum": keyless}},
                                                "required": ["kind"]}},
                   "required": ["mechanism"]},
            "else": {"properties": {"input": {"required": ["keys"],
                                              "properties": {"keys": {"minItems": 1}}}}}}


def _output(rows_input=False):
    fields = {"path": d.string(),
              "confidence": d.number(
                  low=0, high=1, low_open=True, high_open=True, default=0.95,
                  description="confidence level of the <column>_low / <column>_high "
                              "intervals, in (0, 1) (docs/intervals.md)")}
    if rows_input:
        return d.mapping({k: v for k, v in fields.items() if k not in FILE_OUTPUT_FIELDS},
                         description="the released rows' interval level")
    return d.mapping(fields, ("path",),
                     description="a folder: released.parquet + release_report.json")


def sections(kinds=None, rows_input=False):
    """The top-level sections; ``rows_input``: of a release over rows (no file input or
    output: ``input.path``/``format``/``delimiter`` and ``output.path`` are not fields)."""
    kinds = kinds_pkg.KINDS if kinds is None else kinds
    return {
        "name": d.string(description="the release's name (in the report)"),
        "description": {"type": "string"},
        "input": _input(rows_input),
        "privacy": _privacy(),
        "bounding": _bounding(),
        "mechanism": mechanism_schema(kinds),
        "output": _output(rows_input),
        "aggregates": d.array(d.mapping(aggregates_fields.ENTRY_FIELDS,
                                        tuple(aggregates_fields.ENTRY_FIELDS)),
                              min_items=1, description="per released key, beside the count "
                                                       "(gaussian, laplace)"),
        "aggregates_auto": d.mapping(aggregates_fields.AUTO_FIELDS,
                                     description="the private choice of clip: auto bounds"),
        "budget": d.mapping(ledger.FIELDS, ledger.REQUIRED,
                            description="charge this release to a dataset's total in a ledger"),
        "continual": d.mapping(continual_section.FIELDS, continual_section.REQUIRED,
                               description="release every period of a horizon, charged once "
                                           "(docs/continual.md)"),
    }


TOP_FIELDS = ("name", "description", "input", "privacy", "bounding", "mechanism", "output",
              "aggregates", "aggregates_auto", "budget", "continual")


def json_schema(kinds=None, rows_input=False):
    """The JSON Schema of a release spec (a dict); ``kinds`` limits the mechanism variants
    (the loader passes the spec's own kind, so only that kind's module is imported; None:
    every kind, registered ones included). ``rows_input``: the spec of a release over rows
    (``pipelines.specs.spec.parse``'s rows mode), where ``output`` is optional."""
    kinds = kinds_pkg.KINDS if kinds is None else kinds
    required = tuple(r for r in REQUIRED if r != "output") if rows_input else REQUIRED
    body = d.mapping(sections(kinds, rows_input), required, allOf=[_keys_optional(kinds)])
    return {"$schema": DRAFT, "title": "thresher release spec", **body}

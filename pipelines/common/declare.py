"""Spec fields declared once, as JSON Schema (draft 2020-12) fragments, and a spec checked
against them (``pipelines.schema_check`` recognises a valid spec without importing
jsonschema; otherwise the jsonschema library finds the first error), turned into thresher's one-line
``SpecError`` (the field's dotted path, what is allowed, what was given; exit 2).

The same declarations are what ``thresher schema`` prints (``pipelines.schema``) and what
``thresher validate`` / ``run`` check first (``pipelines.spec.parse``); rules across
fields (and against the input's columns or the calibration) stay code after that.

A declaration is a plain dict of JSON Schema; the helpers below build the usual ones:
``number(low=0, low_open=True)`` is ``{"type": "number", "exclusiveMinimum": 0}``. A
field declared by a description alone (``{"description": "..."}`` or just the text)
accepts any value; its owner checks it in code.
"""
import json
import math

from thresher.pipelines.common import schema_check
from thresher.pipelines.errors import SpecError
from thresher.pipelines.common.fields import SHORT, describe


# ---- declarations ---------------------------------------------------------------------

def _with(schema, description=None, default=None):
    if description:
        schema["description"] = description
    if default is not None:
        schema["default"] = default
    return schema


def number(*, low=None, high=None, low_open=False, high_open=False, description=None,
           default=None):
    """A finite real number in [low, high] (open ends where asked)."""
    schema = {"type": "number"}
    if low is not None:
        schema["exclusiveMinimum" if low_open else "minimum"] = low
    if high is not None:
        schema["exclusiveMaximum" if high_open else "maximum"] = high
    return _with(schema, description, default)


def integer(*, low=None, high=None, description=None, default=None):
    """An integer in [low, high] (1.0 counts as 1, as in JSON Schema)."""
    schema = {"type": "integer"}
    if low is not None:
        schema["minimum"] = low
    if high is not None:
        schema["maximum"] = high
    return _with(schema, description, default)


def string(*, description=None, default=None, **extra):
    """A non-empty string (at least one character that is not white space)."""
    return _with({"type": "string", "pattern": r"\S", **extra}, description, default)


def choice(values, *, description=None, default=None):
    return _with({"enum": list(values)}, description, default)


def boolean(*, description=None, default=None):
    return _with({"type": "boolean"}, description, default)


def const(value, *, description=None):
    return _with({"const": value}, description)


def one_of(*alternatives, description=None, default=None):
    return _with({"oneOf": list(alternatives)}, description, default)


def array(items, *, min_items=None, max_items=None, unique=False, description=None,
          default=None):
    schema = {"type": "array", "items": items}
    if min_items is not None:
        schema["minItems"] = min_items
    if max_items is not None:
        schema["maxItems"] = max_items
    if unique:
        schema["uniqueItems"] = True
    return _with(schema, description, default)


def mapping(properties, required=(), *, description=None, **extra):
    """An object with exactly these fields (others are refused)."""
    schema = {"type": "object", "additionalProperties": False}
    if required:
        schema["required"] = list(required)
    schema["properties"] = {name: field(value) for name, value in properties.items()}
    schema.update(extra)
    return _with(schema, description)


def field(declaration):
    """A field's schema: a dict as is; a bare description string accepts any value."""
    if isinstance(declaration, str):
        return {"description": declaration}
    return declaration


# ---- checking ---------------------------------------------------------------------------

def without_nulls(document):
    """The document with every ``field: null`` left out: a null field is a field not
    given (its default applies, or ``is required`` is reported). List items are kept."""
    if isinstance(document, dict):
        return {k: without_nulls(v) for k, v in document.items() if v is not None}
    if isinstance(document, list):
        return [without_nulls(v) for v in document]
    return document


def check(document, schema, prefix=""):
    """Raise the SpecError of the first place ``document`` breaks ``schema``."""
    _refuse_non_finite(document, [])
    if schema_check.valid(document, schema):   # a valid spec: no jsonschema import (start-up)
        return
    import jsonschema  # heavy: jsonschema
    validator = jsonschema.Draft202012Validator(schema)
    error = next(iter(validator.iter_errors(document)), None)
    if error is not None:
        raise _spec_error(validator, error, prefix)


def _refuse_non_finite(value, path):
    """.inf and .nan are YAML numbers but not JSON ones: no field accepts them."""
    if isinstance(value, float) and not math.isfinite(value):
        raise SpecError(dotted(path), f"must be finite, got {value}")
    if isinstance(value, dict):
        for k, v in value.items():
            _refuse_non_finite(v, [*path, k])
    elif isinstance(value, list):
        for i, v in enumerate(value):
            _refuse_non_finite(v, [*path, i])


def dotted(path, prefix=""):
    """["input", "keys", 0] -> "input.keys[0]"."""
    out = prefix
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            out += f"[{part}]"
        else:
            out = f"{out}.{part}" if out else str(part)
    return out


def _spec_error(validator, error, prefix):
    path = list(error.absolute_path)
    node, value, keyword = error.schema, error.instance, error.validator
    if keyword == "additionalProperties":
        allowed = list(node.get("properties", {}))
        extra = next(k for k in value if k not in node.get("properties", {}))
        section = dotted(path, prefix)
        return SpecError(dotted([*path, extra], prefix),
                         f"unknown field; allowed fields of {section or 'the spec'}: "
                         f"{', '.join(map(str, allowed))}")
    if keyword == "required":
        missing = next(k for k in node["required"] if k not in value)
        enum = node.get("properties", {}).get(missing, {}).get("enum")
        more = f"; one of {', '.join(map(str, enum))}" if enum else ""
        return SpecError(dotted([*path, missing], prefix), f"is required{more}")
    if keyword in ("oneOf", "anyOf"):
        branch = _branch_of_type(validator, node[keyword], value)
        if branch is not None:
            inner = next(iter(validator.evolve(schema=branch).iter_errors(value)), None)
            if inner is not None:
                inner_path = [*path, *inner.absolute_path]
                inner.path.clear()
                inner.path.extend(inner_path)
                return _spec_error(validator, inner, prefix)
    return SpecError(dotted(path, prefix), _what_went_wrong(node, value, keyword))


def _branch_of_type(validator, branches, value):
    """The one alternative of a oneOf whose type the value has (an integer 0 for
    "a positive integer or auto"), or None (then the message lists every alternative)."""
    typed = [b for b in branches if "type" in b and validator.is_type(value, b["type"])]
    return typed[0] if len(typed) == 1 else None


def _what_went_wrong(node, value, keyword):
    if keyword == "uniqueItems":
        return f"must not list a value twice, got {SHORT.repr(value)}"
    if keyword in ("minItems", "maxItems") and "type" not in node:
        node = {**node, "type": "array"}
    if keyword in ("minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"):
        if node.get("type") == "integer":
            return f"must be an integer {_range(node)}, got {value}"
        return f"must be {_range(node)}, got {value:g}"
    return f"must be {allowed(node)}, got {describe(value)}"


def _num(x):
    return str(x) if isinstance(x, int) else f"{x:g}"


def _range(node):
    parts = []
    for key, sign in (("minimum", ">="), ("exclusiveMinimum", ">"), ("maximum", "<="),
                      ("exclusiveMaximum", "<")):
        if key in node:
            parts.append(f"{sign} {_num(node[key])}")
    return " and ".join(parts)


def allowed(node):
    """What a declaration allows, in words ("a number > 0 and < 1", "one of l0, l1")."""
    if "const" in node:
        return json.dumps(node["const"])
    if "enum" in node:
        return f"one of {', '.join(map(str, node['enum']))}"
    for key in ("oneOf", "anyOf"):
        if key in node:
            return " or ".join(allowed(b) for b in node[key])
    kind = node.get("type")
    rng = _range(node)
    if kind == "number":
        return f"a number {rng}" if rng else "a number"
    if kind == "integer":
        return f"an integer {rng}" if rng else "an integer"
    if kind == "string":
        what = "a non-empty string" if "pattern" in node or node.get("minLength") else "a string"
        if "maxLength" in node:
            what += f" of at most {node['maxLength']} characters"
        return what
    if kind == "boolean":
        return "true or false"
    if kind == "null":
        return "null"
    if kind == "array":
        low, high = node.get("minItems"), node.get("maxItems")
        if low is not None and low == high:
            size = f"a list of {low} values"
        elif low:
            size = "a non-empty list" + (f" of at most {high} values" if high else "")
        else:
            size = "a list" + (f" of at most {high} values" if high else "")
        items = node.get("items")
        return f"{size} (each {allowed(items)})" if items and allowed(items) != "anything" else size
    if kind == "object":
        names = list(node.get("properties", {}))
        return f"a mapping with fields {', '.join(names)}" if names else "a mapping"
    return "anything"

"""Is a spec valid against its JSON Schema? A quick answer without importing jsonschema.

``pipelines.declare.check`` validates every spec with the jsonschema library, whose import
(with attrs, referencing and rpds) costs 0.05-0.1 s of every ``thresher`` start-up here.
The schemas thresher writes (``pipelines.declare``) use a small part of JSON Schema 2020-12;
``valid`` decides exactly those keywords for the plain values YAML gives (mapping with
string keys, list, string, int, float, bool, null) and answers None for anything else
(another keyword, another value type). ``declare.check`` accepts a document at once when
this says True and asks jsonschema otherwise, which also finds and words the error. So a
valid spec never imports jsonschema, and an invalid one gets jsonschema's first error as
before; tests/pipelines/common/test_schema_check.py checks the answers against jsonschema's.

Semantics followed (JSON Schema 2020-12 validation, as jsonschema implements them):
``integer`` accepts a float with no fractional part and no type accepts a bool except
``boolean``; ``enum``, ``const`` and ``uniqueItems`` compare 1 and 1.0 equal but never a
bool with a number; ``pattern`` is ``re.search``; string lengths count code points;
numeric bounds and ``pattern``/length keywords ignore values of other types; ``items``
applies to every item (there are no ``prefixItems``).
"""
import re

_ANNOTATIONS = frozenset(("description", "default", "title", "$schema", "examples",
                          "$comment", "deprecated", "readOnly", "writeOnly"))
_PLAIN = (dict, list, str, int, float, bool, type(None))


class _Unknown(Exception):
    """A keyword or value this checker does not decide."""


def valid(document, schema):
    """True or False when decided exactly, None when jsonschema must decide."""
    try:
        return _valid(document, schema)
    except _Unknown:
        return None


def _is_type(value, name):
    if name == "object":
        return isinstance(value, dict)
    if name == "array":
        return isinstance(value, list)
    if name == "string":
        return isinstance(value, str)
    if name == "boolean":
        return isinstance(value, bool)
    if name == "null":
        return value is None
    if isinstance(value, bool):
        return False
    if name == "number":
        return isinstance(value, (int, float))
    if name == "integer":
        return isinstance(value, int) or (isinstance(value, float) and value.is_integer())
    raise _Unknown(name)


def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _equal(a, b):
    if isinstance(a, bool) or isinstance(b, bool):
        return isinstance(a, bool) and isinstance(b, bool) and a == b
    if _number(a) and _number(b):
        return a == b
    if isinstance(a, str) or isinstance(b, str):
        return isinstance(a, str) and isinstance(b, str) and a == b
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_equal(a[k], b[k]) for k in a)
    return False


def _check_value(value):
    if type(value) not in _PLAIN:
        raise _Unknown(type(value).__name__)
    if isinstance(value, dict) and not all(type(k) is str for k in value):
        raise _Unknown("non-string key")


def _valid(value, schema):
    if schema is True:
        return True
    if schema is False:
        return False
    if not isinstance(schema, dict):
        raise _Unknown("schema")
    _check_value(value)
    for keyword, arg in schema.items():
        if keyword in _ANNOTATIONS or keyword in ("then", "else"):
            continue
        checker = _KEYWORDS.get(keyword)
        if checker is None:
            raise _Unknown(keyword)
        if not checker(value, arg, schema):
            return False    # keywords are conjunctive: one decided failure decides
    return True


def _type(value, arg, schema):
    names = arg if isinstance(arg, list) else [arg]
    return any(_is_type(value, n) for n in names)


def _enum(value, arg, schema):
    return any(_equal(value, option) for option in arg)


def _const(value, arg, schema):
    return _equal(value, arg)


def _bound(test):
    def check(value, arg, schema):
        if not _number(arg):
            raise _Unknown("bound")
        return not _number(value) or test(value, arg)
    return check


def _pattern(value, arg, schema):
    return not isinstance(value, str) or re.search(arg, value) is not None


def _min_length(value, arg, schema):
    return not isinstance(value, str) or len(value) >= arg


def _max_length(value, arg, schema):
    return not isinstance(value, str) or len(value) <= arg


def _properties(value, arg, schema):
    if not isinstance(value, dict):
        return True
    ok = True
    for name, sub in arg.items():
        if name in value:
            ok = _valid(value[name], sub) and ok
    return ok


def _required(value, arg, schema):
    return not isinstance(value, dict) or all(name in value for name in arg)


def _additional(value, arg, schema):
    if not isinstance(value, dict):
        return True
    if "patternProperties" in schema:
        raise _Unknown("patternProperties")
    known = schema.get("properties", {})
    ok = True
    for name, item in value.items():
        if name not in known:
            ok = _valid(item, arg) and ok
    return ok


def _items(value, arg, schema):
    if not isinstance(value, list):
        return True
    if "prefixItems" in schema:
        raise _Unknown("prefixItems")
    ok = True
    for item in value:
        ok = _valid(item, arg) and ok
    return ok


def _min_items(value, arg, schema):
    return not isinstance(value, list) or len(value) >= arg


def _max_items(value, arg, schema):
    return not isinstance(value, list) or len(value) <= arg


def _unique(value, arg, schema):
    if not isinstance(value, list) or not arg:
        return True
    if any(isinstance(item, (list, dict)) for item in value):
        if len(value) > 1000:
            raise _Unknown("uniqueItems of many containers")
        return not any(_equal(value[i], value[j])
                       for i in range(len(value)) for j in range(i + 1, len(value)))
    seen = set()
    for item in value:
        # bools apart from numbers; 1 and 1.0 hash and compare equal, as _equal says
        key = ("bool", item) if isinstance(item, bool) else (type(item) is str, item)
        if key in seen:
            return False
        seen.add(key)
    return True


def _one_of(value, arg, schema):
    return sum(1 for sub in arg if _valid(value, sub)) == 1


def _any_of(value, arg, schema):
    return sum(1 for sub in arg if _valid(value, sub)) >= 1


def _all_of(value, arg, schema):
    return all([_valid(value, sub) for sub in arg])


def _if(value, arg, schema):
    branch = schema.get("then", True) if _valid(value, arg) else schema.get("else", True)
    return _valid(value, branch)


_KEYWORDS = {
    "type": _type,
    "enum": _enum,
    "const": _const,
    "minimum": _bound(lambda v, a: v >= a),
    "maximum": _bound(lambda v, a: v <= a),
    "exclusiveMinimum": _bound(lambda v, a: v > a),
    "exclusiveMaximum": _bound(lambda v, a: v < a),
    "pattern": _pattern,
    "minLength": _min_length,
    "maxLength": _max_length,
    "properties": _properties,
    "required": _required,
    "additionalProperties": _additional,
    "items": _items,
    "minItems": _min_items,
    "maxItems": _max_items,
    "uniqueItems": _unique,
    "oneOf": _one_of,
    "anyOf": _any_of,
    "allOf": _all_of,
    "if": _if,
}

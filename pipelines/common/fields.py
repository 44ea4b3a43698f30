"""Checks of single spec values, for the rules that stay code (cross-field rules, and the
fields of a kind that declares its fields by description only).

Most fields are declared once as JSON Schema fragments (``pipelines.declare``) and checked
by the jsonschema library; the messages here have the same form: the field's dotted path,
what is allowed, and what was given (``SpecError``, exit 2). This module imports nothing
from the rest of thresher but ``pipelines.errors``, so every spec module can use it.
"""
import math
import reprlib

from thresher.pipelines.errors import SpecError

# Error messages show at most this much of a value (never the expansion of a large one).
SHORT = reprlib.Repr()
SHORT.maxstring = SHORT.maxother = 80
SHORT.maxlevel, SHORT.maxlist, SHORT.maxdict = 3, 6, 6


def describe(value):
    """A given value as an error message shows it: its type and a short repr."""
    if value is None:
        return "nothing (null)"
    return f"{type(value).__name__} {SHORT.repr(value)}"


def mapping(value, field):
    if not isinstance(value, dict):
        raise SpecError(field, f"must be a mapping, got {describe(value)}")
    return value


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
        raise SpecError(field, f"must be a non-empty string, got {describe(value)}")
    return value


def number(value, field, *, low=None, high=None, low_open=False, high_open=False):
    """A finite real number within [low, high] (open ends where asked)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(field, f"must be a number, got {describe(value)}")
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
            raise SpecError(field, f"must be an integer, got {describe(value)}")
    if low is not None and value < low:
        raise SpecError(field, f"must be an integer >= {low}, got {value}")
    if high is not None and value > high:
        raise SpecError(field, f"must be an integer <= {high}, got {value}")
    return value


def choice(value, field, allowed):
    if value not in allowed:
        raise SpecError(field, f"must be one of {', '.join(allowed)}, got {describe(value)}")
    return value


def optional_float(section, name):
    """A number field the schema has checked, as a float (None when absent)."""
    value = section.get(name)
    return None if value is None else float(value)


def optional_int(section, name, default=None):
    """An integer field the schema has checked (1.0 is read as 1), or ``default``."""
    value = section.get(name, default)
    return None if value is None else int(value)

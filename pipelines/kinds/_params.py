"""A kind's parsed ``mechanism`` section as a frozen, typed object (issue 44 item 1): the
fields code outside the kind reads, declared once as a frozen dataclass in the kind's module
(its ``PARAMS``) and built and checked from the section's dict by :func:`build`
(``Kind.params``).

The dict stays what the spec loader, the calibration and the report pass around and
publish (the report's ``mechanism`` section is its wire format, byte for byte); the typed
object is a read-only view of it, so a field read outside the kind is an attribute a
reader and a linter can follow, and a missing field or a value of the wrong type fails
where the object is built, naming the field, instead of as a KeyError deep in a check.
"""
import dataclasses
import types
import typing


def build(cls, section, where="mechanism"):
    """The frozen dataclass ``cls`` from the dict ``section``: each field of ``cls`` read
    from it (a field with a default may be absent; keys ``cls`` does not declare are left
    to the dict), its value checked against the field's type. TypeError naming
    ``<where>.<field>`` for a missing field or a value of another type."""
    hints = typing.get_type_hints(cls)
    values = {}
    for field in dataclasses.fields(cls):
        name = f"{where}.{field.name}"
        if field.name in section:
            values[field.name] = _checked(section[field.name], hints[field.name], name)
        elif field.default is dataclasses.MISSING and \
                field.default_factory is dataclasses.MISSING:
            raise TypeError(f"{name}: missing from the parsed section ({cls.__name__} "
                            f"needs it)")
    return cls(**values)


_NOT = object()


def _checked(value, hint, name):
    """``value`` as a ``hint``: float, int, bool, str, None, ``tuple[X, ...]`` (from a list;
    X itself may be a union), or a union of them (the first that takes it). An int is a
    float; a bool is neither an int nor a float."""
    got = _as(value, hint)
    if got is not _NOT:
        return got
    raise TypeError(f"{name}: must be {_wanted(hint)}, got {value!r}")


def _options(hint):
    """The types a union ``hint`` admits, in order (``(hint,)`` for one type)."""
    return (typing.get_args(hint)
            if typing.get_origin(hint) in (typing.Union, types.UnionType) else (hint,))


def _wanted(hint):
    """``hint`` in words, for the refusal: "float or None", "a list of (int or None)"."""
    def one(o):
        if o is type(None):
            return "None"
        if typing.get_origin(o) is tuple:
            element = typing.get_args(o)[0]
            words = _wanted(element)
            return f"a list of ({words})" if len(_options(element)) > 1 else f"a list of {words}"
        return o.__name__
    return " or ".join(one(o) for o in _options(hint))


def _as(value, hint):
    """``value`` as the first option of ``hint`` that takes it, else _NOT."""
    for option in _options(hint):
        got = _as_one(value, option)
        if got is not _NOT:
            return got
    return _NOT


def _as_one(value, option):
    if typing.get_origin(option) is tuple:           # tuple[X, ...]: a list or tuple of X
        element = typing.get_args(option)[0]         # X may be a union (int | None)
        if not isinstance(value, (list, tuple)):
            return _NOT
        items = tuple(_as(v, element) for v in value)
        return _NOT if any(i is _NOT for i in items) else items
    if option is type(None):
        return None if value is None else _NOT
    if isinstance(value, bool):
        return value if option is bool else _NOT
    if option is float and isinstance(value, (int, float)):
        return float(value)
    if option in (int, str) and isinstance(value, option):
        return value
    return _NOT

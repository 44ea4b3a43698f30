"""Names a release publishes or uses internally, which the spec's own columns must not take.

A released file holds the key columns, then the kind's output columns (``count``,
``estimate``, ``rank``, ``value``, ...), the ``aggregates`` columns ``<column>_<statistic>``,
``debiased`` with ``mechanism.debias``, and beside each value column its interval columns
``<column>_low`` / ``<column>_high`` (pipelines/dataio/intervals.py). A key column named
like one of them was overwritten by it (issue 36 D1: keys ``[count_low]`` with ``gaussian``
published a file without its keys, exit 0). Inside the pipeline the prepared batches carry
``__user``, ``__user_lo``, ``__user_hi``, ``__key``, ``__v<k>``, ``__ns<i>``, ...: every
name starting with ``__`` is thresher's.

:func:`check` refuses, when the spec is read (``validate``, ``plan``, ``run`` and the
Beam YAML transform alike), every key or value column whose name is one of these, naming
the field (``input.keys[i]``, ``mechanism.column``; for the internal names also
``aggregates[i].column`` and ``input.sample.frequency``) and the column it would
collide with.
"""
from thresher.pipelines.errors import SpecError

INTERNAL_PREFIX = "__"
INTERVAL_SUFFIXES = ("_low", "_high")


def published_columns(kind_columns, mechanism, aggregates):
    """{name: what it is} of every non-key column a release of this spec may publish: the
    kind's output columns, ``debiased``, the aggregates' columns, and the interval columns
    of each of them (reserved for every value column, whether or not the kind publishes
    an interval for it today: a key is never named like one)."""
    values = {name: f"an output column of mechanism.kind {mechanism['kind']}"
              for name in kind_columns}
    if mechanism.get("debias"):
        values["debiased"] = "the output column mechanism.debias adds"
    for a in aggregates:
        values[a.output] = f"the output column of an aggregates entry ({a.column}, {a.statistic})"
    out = dict(values)
    for name, what in values.items():
        for suffix in INTERVAL_SUFFIXES:
            out.setdefault(name + suffix, f"the interval column of {name!r} ({what})")
    return out


def check(input_spec, mechanism, aggregates, kind_columns):
    """SpecError naming the first key or value column whose name a release publishes or
    uses internally (module docstring).

    Key columns, and quantiles' ``mechanism.column`` (read and bounded like a key column,
    ``kinds.quantiles.read_spec``), may take neither a published nor an internal name.
    The value columns of ``aggregates`` and an existing sample's frequency column are
    read into columns of thresher's own names (``__v<k>``, ``count``) and never published
    under their own, so only the internal prefix is refused for them: summing a column
    named ``count`` (released as ``count_sum``) overwrites nothing."""
    published = published_columns(kind_columns, mechanism, aggregates)
    like_keys = [(f"input.keys[{i}]", k) for i, k in enumerate(input_spec.keys)]
    if input_spec.quantile_column is not None:
        like_keys.append(("mechanism.column", input_spec.quantile_column))
    values = [(f"aggregates[{i}].column", a.column) for i, a in enumerate(aggregates)]
    if input_spec.sample is not None:
        values.append(("input.sample.frequency", input_spec.sample["frequency"]))
    for field, name in like_keys + values:
        if isinstance(name, str) and name.startswith(INTERNAL_PREFIX):
            raise SpecError(field, f"{name!r}: column names starting with {INTERNAL_PREFIX} are "
                            f"thresher's own (__user, __user_lo, __user_hi, __key, ...); "
                            f"rename the column")
    for field, name in like_keys:
        if name in published:
            raise SpecError(field, f"{name!r} is {published[name]}, which the release "
                            f"publishes beside the keys; rename the column (names a release "
                            f"publishes here: {', '.join(sorted(published))})")

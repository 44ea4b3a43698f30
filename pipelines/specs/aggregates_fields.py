"""The spec fields of ``aggregates`` and ``aggregates_auto`` (pipelines/specs/aggregates.py), as
JSON Schema declarations for ``pipelines.schema``; kept apart from the calibration so
that reading a spec loads no numerics."""
from thresher.pipelines.common import declare

AUTO = "auto"
STATISTICS = ("sum", "mean", "variance", "stddev")
# Statistics that need the sum of squares of the clamped totals too.
SPREAD = ("variance", "stddev")

# One entry of the ``aggregates`` list, and ``aggregates_auto`` (declared for pipelines.schema).
ENTRY_FIELDS = {
    "column": declare.string(description="the numeric input column"),
    "statistic": declare.choice(STATISTICS),
    "clip": declare.one_of(
        declare.array(declare.number(), min_items=2, max_items=2),
        declare.const(AUTO),
        description="[low, high] bounds each user's total for the key, or auto"),
}
AUTO_FIELDS = {
    "epsilon": declare.number(low=0, low_open=True, description="the clip stage's epsilon, "
                              "out of privacy.epsilon (default a tenth)"),
    "quantile": declare.number(low=0, high=1, low_open=True, high_open=True),
    "min_exponent": declare.integer(low=-900, high=900),
    "max_exponent": declare.integer(low=-900, high=900),
}



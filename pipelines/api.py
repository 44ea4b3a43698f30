"""The Python API: a whole release as one PTransform, and planning without data.

``Release(spec)`` is the release of a ``thresher run`` spec inside a user's own Beam
pipeline: it takes schema'd rows (``beam.Row`` or a PCollection with a schema) with the
spec's user and key fields and returns ``{"released": rows, "report": one row}`` — the
same validation, calibration and transforms as the CLI (``pipelines.beam_yaml``). It
takes every section of a ``thresher run`` spec: ``input`` gives ``user`` and ``keys``
(and may give ``public_keys``), or ``keys`` and ``sample`` (an existing weighted sample:
one row per key with its frequency, no user); ``input.path``/``format``/``delimiter``
and ``output.path`` are ignored (the rows are the input; the caller writes the
PCollections wherever it likes), ``output.confidence`` sets the level of the
``<column>_low`` / ``_high`` interval columns ``released`` carries as ``thresher run``'s
file does; ``description`` is ignored too (it is in no report); ``budget`` charges the
ledger once per run of the pipeline, under a run token drawn with the run's secret
(``pipelines.ledgers.pipeline_charge``; a ledger the workers cannot reach is refused when
the pipeline is built).

``plan(spec)`` calibrates a spec without reading data (``pipelines.planning.plan.make_plan``): the
returned plan's ``report()`` is the release report minus its data fields, as
``thresher plan --json`` prints it.

A spec is a path to a YAML file or the parsed mapping.
"""
import os

import yaml

from thresher.pipelines.specs import spec as spec_module
from thresher.pipelines.errors import SpecError
from thresher.pipelines.planning.plan import make_plan


def load_spec(spec):
    """A validated ``ReleaseSpec`` from a YAML path or a mapping (raises ``SpecError``
    naming the field)."""
    if isinstance(spec, (str, os.PathLike)):
        return spec_module.load(os.fspath(spec))
    if not isinstance(spec, dict):
        raise SpecError("", f"a spec is a YAML path or a mapping, got {type(spec).__name__}")
    return spec_module.parse(spec, source_text=yaml.safe_dump(spec, sort_keys=True))


def plan(spec):
    """The calibrated plan of ``spec`` (no data is read): ``plan(spec).report()``."""
    return make_plan(load_spec(spec))


def Release(spec, num_shards=16):
    """A release as a PTransform: schema'd rows in, ``{"released", "report"}`` out.

    ``spec``: a YAML path or mapping with the sections of a ``thresher run`` spec:
    ``privacy``, ``bounding``, ``mechanism``, ``input: {user, keys[, public_keys]}`` or
    ``input: {keys, sample}``, and optionally ``name``, ``aggregates``,
    ``aggregates_auto``, ``budget``, ``output: {confidence}`` (``input.path``/``format``/
    ``delimiter``, ``output.path`` and ``description`` are ignored; module docstring).
    ``num_shards``: shards of the user and key shuffles, about rows / 1e6."""
    if isinstance(spec, (str, os.PathLike)):
        with open(os.fspath(spec), "rb") as handle:
            spec = spec_module.load_yaml(handle.read().decode("utf-8"), source=os.fspath(spec))
    if not isinstance(spec, dict):
        raise SpecError("", f"a spec is a YAML path or a mapping, got {type(spec).__name__}")
    known = spec_module.TOP_FIELDS
    extra = sorted(set(spec) - set(known))
    if extra:
        raise SpecError(extra[0], "is not a section of a release spec; allowed sections: "
                        + ", ".join(known))
    if "continual" in spec:
        raise SpecError("continual", "a continual release runs one period at a time with "
                        "`thresher run SPEC --period P` (docs/continual.md); thresher.Release "
                        "makes one release")
    section = spec.get("input")
    if not isinstance(section, dict) or ("user" not in section and "sample" not in section):
        raise SpecError("input", "needs user and keys (the fields of the input rows), or "
                        "keys and sample (an existing weighted sample)")
    output = spec.get("output")
    if output is not None and not isinstance(output, dict):
        raise SpecError("output", f"must be a mapping, got {type(output).__name__}")
    from thresher.pipelines.beam_yaml import ThresherRelease  # heavy: apache_beam
    return ThresherRelease(section.get("user"), section.get("keys"), spec.get("privacy"),
                           spec.get("bounding", {}), spec.get("mechanism"),
                           name=spec.get("name", "release"), num_shards=num_shards,
                           aggregates=spec.get("aggregates"),
                           aggregates_auto=spec.get("aggregates_auto"),
                           public_keys=section.get("public_keys"),
                           budget=spec.get("budget"), sample=section.get("sample"),
                           confidence=(output or {}).get("confidence"))

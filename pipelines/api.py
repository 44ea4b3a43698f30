"""The Python API: a whole release as one PTransform, and planning without data.

``Release(spec)`` is the release of a ``thresher run`` spec inside a user's own Beam
pipeline: it takes schema'd rows (``beam.Row`` or a PCollection with a schema) with the
spec's user and key fields and returns ``{"released": rows, "report": one row}`` — the
same validation, calibration and transforms as the CLI (``pipelines.beam_yaml``). It
takes every section of a ``thresher run`` spec: ``input`` needs ``user`` and ``keys``
(and may give ``public_keys``); ``input.path``/``format``/``delimiter`` and ``output``
are ignored (the rows are the input; the caller writes the PCollections wherever it
likes; no interval columns yet), ``description`` too (it is in no report); ``budget``
charges the ledger once, when the transform is applied (``pipelines.beam_yaml``'s
docstring). Only ``input.sample`` (an existing weighted sample, without users) is
refused.

``plan(spec)`` calibrates a spec without reading data (``pipelines.plan.make_plan``): the
returned plan's ``report()`` is the release report minus its data fields, as
``thresher plan --json`` prints it.

A spec is a path to a YAML file or the parsed mapping.
"""
import os

import yaml

from thresher.pipelines.specs import spec as spec_module
from thresher.pipelines.errors import SpecError
from thresher.pipelines.plan import make_plan


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
    ``privacy``, ``bounding``, ``mechanism``, ``input: {user, keys[, public_keys]}``, and
    optionally ``name``, ``aggregates``, ``aggregates_auto``, ``budget`` (``input.path``/
    ``format``/``delimiter``, ``output`` and ``description`` are ignored; module
    docstring). ``num_shards``: shards of the user and key shuffles, about rows / 1e6."""
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
    section = spec.get("input")
    if not isinstance(section, dict) or "user" not in section or "keys" not in section:
        raise SpecError("input", "needs user and keys (the fields of the input rows)")
    if "sample" in section:
        raise SpecError("input.sample", "an existing weighted sample is read by thresher run "
                        "only; Release() takes one row per record, with its user")
    from thresher.pipelines.beam_yaml import ThresherRelease
    return ThresherRelease(section["user"], section["keys"], spec.get("privacy"),
                           spec.get("bounding", {}), spec.get("mechanism"),
                           name=spec.get("name", "release"), num_shards=num_shards,
                           aggregates=spec.get("aggregates"),
                           aggregates_auto=spec.get("aggregates_auto"),
                           public_keys=section.get("public_keys"),
                           budget=spec.get("budget"))

"""The Python API: a whole release as one PTransform, and planning without data.

``Release(spec)`` is the release of a ``thresher run`` spec inside a user's own Beam
pipeline: it takes schema'd rows (``beam.Row`` or a PCollection with a schema) with the
spec's user and key fields and returns ``{"released": rows, "report": one row}`` — the
same validation, calibration and transforms as the CLI (``pipelines.beam_yaml``). Its
``input`` section needs only ``user`` and ``keys``; ``output`` is not used (the caller
writes the PCollections wherever it likes).

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

    ``spec``: a YAML path or mapping with ``privacy``, ``bounding``, ``mechanism``
    (``aggregates`` too) and ``input: {user, keys}`` (``name`` optional; ``input.path``/``format`` and ``output``
    are ignored). ``num_shards``: shards of the user and key shuffles, about rows / 1e6."""
    if isinstance(spec, (str, os.PathLike)):
        with open(os.fspath(spec), "rb") as handle:
            spec = spec_module.load_yaml(handle.read().decode("utf-8"), source=os.fspath(spec))
    if not isinstance(spec, dict):
        raise SpecError("", f"a spec is a YAML path or a mapping, got {type(spec).__name__}")
    known = {"name", "description", "input", "privacy", "bounding", "mechanism", "output",
             "aggregates"}
    extra = sorted(set(spec) - known)
    if extra:
        raise SpecError(extra[0], "is not available in Release() yet; allowed sections: "
                        + ", ".join(sorted(known)))
    section = spec.get("input")
    if not isinstance(section, dict) or "user" not in section or "keys" not in section:
        raise SpecError("input", "needs user and keys (the fields of the input rows)")
    from thresher.pipelines.beam_yaml import ThresherRelease
    return ThresherRelease(section["user"], section["keys"], spec.get("privacy"),
                           spec.get("bounding", {}), spec.get("mechanism"),
                           name=spec.get("name", "release"), num_shards=num_shards,
                           aggregates=spec.get("aggregates"))

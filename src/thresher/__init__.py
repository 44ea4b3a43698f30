"""thresher: user-level differentially private statistics per key, as Apache Beam pipelines.

The installed package is ``thresher`` alone; its parts are ``thresher.accounting`` (the
privacy accounting, no Beam), ``thresher.transforms`` (the composite PTransforms beside
their numpy kernels) and ``thresher.pipelines`` (specs, the CLI, I/O, the wiring of a
release). The names below are the public Python API; they are imported on first use, so
``import thresher`` stays cheap (the CLI's start-up depends on it).

- ``Release(spec)``: a whole release as one PTransform over schema'd rows (the same spec
  sections as ``thresher run``), with outputs ``released`` and ``report``.
- ``plan(spec)``: calibrate a spec without data (noise, threshold, guarantee per stage).
- The design's building blocks: ``PerUserBound``, ``RandClip``, ``ChooseContributionBound``,
  ``SampleAndThreshold``, ``SanitizeSample``, ``NoisyThreshold`` (they work on Arrow
  batches of hashed records; a privacy guarantee holds for their composition as
  ``Release`` wires it).
"""
import importlib
import logging

__version__ = "0.1.0"


class _BeamApitoolsWarning(logging.Filter):
    """Drops the one warning importing Beam logs without Google's ``apitools`` package
    ("apitools not found, and bigquery client libraries are not available ...", from
    ``apache_beam.io.gcp.internal.clients.bigquery``): it concerns BigQuery, which thresher
    never uses, and it was printed on every API and Beam YAML run (issue 36 D7). Installed
    on the root logger when thresher is imported, so a program that imports thresher before
    Beam never shows it; every other record passes."""

    def filter(self, record):
        return not (record.name == "root"
                    and str(record.msg).startswith("apitools not found, and bigquery"))


if not any(isinstance(f, _BeamApitoolsWarning) for f in logging.getLogger().filters):
    logging.getLogger().addFilter(_BeamApitoolsWarning())

_EXPORTS = {
    "Release": "thresher.pipelines.api",
    "plan": "thresher.pipelines.api",
    "load_spec": "thresher.pipelines.api",
    "PerUserBound": "thresher.transforms.bounding.per_user_bound",
    "RandClip": "thresher.transforms.bounding.rand_clip",
    "ChooseContributionBound": "thresher.transforms.bounding.choose_contribution_bound",
    "SampleAndThreshold": "thresher.transforms.selection.sample_and_threshold",
    "SanitizeSample": "thresher.transforms.selection.sanitize_sample",
    "NoisyThreshold": "thresher.transforms.selection.noisy_threshold",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'thresher' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))

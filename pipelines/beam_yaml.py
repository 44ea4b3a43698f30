"""thresher releases as a Beam YAML transform.

A Beam YAML pipeline calls thresher through a ``providers:`` entry (``type: python``,
``config: {}``, ``transforms: {ThresherRelease: pipelines.beam_yaml.ThresherRelease}``)
and runs with ``python -m apache_beam.yaml.main --yaml_pipeline_file=...`` (needs
``pip install 'thresher[yaml]'``); see ``configs/beam_yaml/quickstart_release.yaml`` and
docs/running.md.

``ThresherRelease`` takes schema'd rows (one per input record, or with ``sample`` one per
key of an existing sample, from any Beam YAML source: ReadFromParquet, ReadFromCsv,
ReadFromBigQuery, ...) and is the release of a ``thresher run`` spec: its config's
sections are put together as a spec (``user``, ``keys``, ``public_keys`` and ``sample``
are the spec's ``input`` fields, ``confidence`` its ``output.confidence``) and handed to
``thresher.Release`` (``pipelines.api.release_of``), which validates and calibrates it
as ``thresher run`` does and applies the one ``Release`` transform
(``pipelines.running.release.Release``) to the rows (``pipelines.api``). This module
only names the config's fields in errors (``ThresherRelease.user``) and ends
``python -m apache_beam.yaml.main`` cleanly on a thresher error. Two outputs:

- ``released``: one row per released key (the key fields, the kind's output columns and
  their interval columns), the rows ``thresher run`` writes to ``released.parquet``;
- ``report``: one row with a single string field ``report``, the release report as JSON
  (``thresher run``'s ``release_report.json`` without ``outputs``).

Every section of a ``thresher run`` spec is accepted except where it names files: the
rows replace ``input.path`` (and ``format``/``delimiter``), and the caller writes the two
outputs wherever it likes. What rows change (``pipelines.api``):

- ``public_keys``: the domain file is read when the transform is constructed (a path
  relative to the working directory of the process that builds the pipeline) and its
  keys are cast to the types of the rows' key fields when it is applied;
- ``mechanism.kind: quantiles``: the rows carry the value column ``mechanism.column``
  beside the user and key fields;
- ``sample``: the rows are an existing weighted sample, the key fields and the
  frequency field, no user;
- ``budget`` (the ledger, ``pipelines.ledgers.ledger``): the release is charged when the
  pipeline *runs*, once per run, by a stage that reserves under a run token derived from
  the run's secret (``pipelines.ledgers.pipeline_charge``): a retried reservation charges
  once, a second ``run()`` of the same pipeline object is a second release and a second
  charge (refused when the budget cannot fit it: the run fails, and neither output gets
  a row). Both outputs wait for the charge. It is recorded as published (output
  ``beam pipeline: <label>``): thresher cannot see where or whether the pipeline writes
  its outputs, so from then on the release counts as spent. The ledger must be one the
  workers reach -- PostgreSQL, or SQLite under Beam's in-process and Prism runners --
  and is refused otherwise when the pipeline is built (``ThresherRelease.budget.ledger``);
  a release the ledger already cannot fit is refused then too (``ThresherRelease.budget``).

Randomness: the release secret is drawn inside the pipeline, as ``thresher run`` draws it
(``transforms.randomness.keyed_random.PipelineSecret``), and every stage identity is taken
relative to the ``Release`` transform's own label, so under one secret the transform
draws exactly what ``thresher run`` draws for the same spec and records.

The building blocks (PerUserBound, NoisyThreshold, ...) are deliberately not exposed one
by one: they work on Arrow batches of hashed records, and a privacy guarantee holds only
for the composition (noise calibrated for counts that were bounded per user), which
this transform fixes.
"""
import os
import re
import sys

import yaml

from thresher.pipelines.api import DEFAULT_NUM_SHARDS, release_of
from thresher.pipelines.errors import ThresherError

# Fields of the spec's input section, as this transform's config names them.
_CONFIG_FIELD = {"input.user": "user", "input.keys": "keys", "input.public_keys": "public_keys",
                 "input.sample": "sample", "output.confidence": "confidence"}


def ThresherRelease(user=None, keys=None, privacy=None, bounding=None, mechanism=None,
                    name="beam_yaml_release", num_shards=DEFAULT_NUM_SHARDS, aggregates=None,
                    aggregates_auto=None, public_keys=None, budget=None, sample=None,
                    confidence=None):
    """A differentially private histogram of distinct users (or records) per key.

    The release of a ``thresher run`` spec on rows from any Beam YAML source. Outputs
    ``released`` (one row per released key) and ``report`` (one row, field ``report``:
    the release report as JSON).

    Args:
      user: the field identifying a user; all of a user's rows are protected together
        (left out with ``sample``).
      keys: the key fields (a list, or one name).
      privacy: ``{epsilon, delta}`` as in a thresher spec.
      bounding: ``{max_keys_per_user, model, auto}`` as in a thresher spec.
      mechanism: ``{kind, ...}`` as in a thresher spec (gaussian, laplace, quantiles, ...).
        quantiles reads the numeric field ``mechanism.column`` of the rows.
      name: the release's name in the report.
      aggregates: clipped sums and means of numeric fields per released key, as the
        spec's ``aggregates:`` section (docs/aggregates.md); each adds a float column
        ``<column>_<statistic>`` to ``released``; ``clip: auto`` bounds are chosen in the
        pipeline and reported.
      aggregates_auto: the spec's ``aggregates_auto`` section (the clip choice's budget).
      public_keys: the spec's ``input.public_keys`` (``{path, format}``): a public key
        domain, read when the transform is constructed.
      budget: the spec's ``budget`` section (``{ledger, dataset, epsilon, delta[,
        composition, threshold_delta]}``): the release is charged once per run of the
        pipeline (module docstring).
      sample: the spec's ``input.sample`` (``{frequency, scheme[, threshold]}``): the rows
        are an existing weighted sample, one per key with its frequency field and no user
        (``mechanism.kind: weighted_sampling``; docs/weighted_sampling.md).
      confidence: the spec's ``output.confidence`` (default 0.95): the level of the
        ``<column>_low`` / ``<column>_high`` interval columns (docs/intervals.md).
      num_shards: user and key shards of the shuffles, about rows / 1,000,000 (>= 1).
    """
    _clean_errors_under_yaml_main()
    config = {"privacy": privacy, "bounding": bounding, "mechanism": mechanism, "name": name,
              "num_shards": num_shards}
    spec = {"name": name, "input": {}, "privacy": privacy, "bounding": bounding,
            "mechanism": mechanism, "output": {}}
    for field, value in (("aggregates", aggregates), ("aggregates_auto", aggregates_auto),
                         ("budget", budget)):
        if value is not None:
            config[field] = spec[field] = value
    for field, value in (("user", user), ("keys", keys), ("public_keys", public_keys),
                         ("sample", sample)):
        if value is not None:
            config[field] = spec["input"][field] = value
    if confidence is not None:
        config["confidence"] = spec["output"]["confidence"] = confidence
    return release_of(spec, num_shards, yaml.safe_dump(config, sort_keys=True),
                      field_name=_config_field)


_USER_ERROR = re.compile(r"(?:SpecError|InputError|CalibrationError|ThresherError): (.+?)"
                         r"(?:\s\[while running|$)", re.S)


def _user_error(exc):
    """The message of a thresher error in ``exc``, its causes or, raised on a Beam worker
    and wrapped by the runner, its text (None if it holds none)."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ThresherError):
            return str(exc).strip().splitlines()[0]
        match = _USER_ERROR.search(str(exc))
        if match:
            return match.group(1).strip().splitlines()[0]
        exc = exc.__cause__ or exc.__context__
    return None


def _clean_errors_under_yaml_main():
    """Under ``python -m apache_beam.yaml.main``: a thresher error (a budget refusal, a
    bad config field) ends the command as ``thresher run`` ends it -- one line
    ``thresher: error: FIELD: message`` on stderr and exit code 2 -- instead of arriving
    at the end of a Beam traceback with exit code 1 (issue 42). Other errors keep Beam's
    traceback. Installed once, as the process's excepthook; not in other programs (a
    Python pipeline gets the exception itself)."""
    main = sys.modules.get("__main__")
    if getattr(getattr(main, "__spec__", None), "name", None) != "apache_beam.yaml.main":
        return
    if getattr(sys.excepthook, "_thresher", False):
        return
    previous = sys.excepthook

    def hook(kind, value, tb):
        message = _user_error(value)
        if message is None:
            return previous(kind, value, tb)
        sys.stderr.write(f"thresher: error: {message}\n")
        sys.stderr.flush()
        sys.stdout.flush()
        os._exit(2)       # the pipeline has ended; exit 2 like the thresher command

    hook._thresher = True
    sys.excepthook = hook


def _config_field(field):
    """A spec field named as this transform's config names it (``input.user`` ->
    ``ThresherRelease.user``; "" -> ``ThresherRelease``)."""
    for spec_field, config_field in _CONFIG_FIELD.items():
        if field == spec_field or field.startswith(spec_field + "[") \
                or field.startswith(spec_field + "."):
            field = config_field + field[len(spec_field):]
    return f"ThresherRelease.{field}" if field else "ThresherRelease"

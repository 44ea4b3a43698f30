"""thresher releases as a Beam YAML transform.

A Beam YAML pipeline calls thresher through a ``providers:`` entry (``type: python``,
``config: {}``, ``transforms: {ThresherRelease: pipelines.beam_yaml.ThresherRelease}``)
and runs with ``python -m apache_beam.yaml.main --yaml_pipeline_file=...`` (needs
``pip install 'thresher[yaml]'``); see ``configs/beam_yaml/quickstart_release.yaml`` and
docs/running.md.

``ThresherRelease`` takes schema'd rows (one per input record, or with ``sample`` one per
key of an existing sample, from any Beam YAML source:
ReadFromParquet, ReadFromCsv, ReadFromBigQuery, ...) and is the whole release of a
``thresher run`` spec — the same ``privacy``, ``bounding`` and ``mechanism`` sections,
validated and calibrated by the same code (``pipelines.spec``, ``pipelines.planning.plan``), then
the same transforms: ShardByUser, PerUserBound / RandClip (with
ChooseContributionBound for ``max_keys_per_user: auto``), SumCountsPerKey and the
mechanism kind's release. It has two outputs:

- ``released``: one row per released key (the key fields, the kind's output columns and
  their interval columns);
- ``report``: one row with a single string field ``report``, the release report as JSON
  (the plan's parameters and privacy guarantee, the chosen bound and clips,
  ``released_keys``).

Every section of a ``thresher run`` spec is accepted except where it names files: the
rows replace ``input.path`` (and ``format``/``delimiter``), and the caller writes the two
outputs wherever it likes (``output.path``; ``output.confidence`` is the config's
``confidence``). ``released`` carries the CLI's ``<column>_low`` / ``<column>_high``
interval columns, computed per released table by ``intervals.add_columns`` from the
released values and the report's parameters (the CLI's launcher computes them on its
gathered file; they are row by row, so the same). What differs from the CLI:

- ``aggregates`` with ``clip: auto``: the chosen clips flow as a singleton side input
  into the bounding and into the report (the CLI writes them to its staging folder);
- ``public_keys`` (the spec's ``input.public_keys``): the domain file is read when the
  transform is constructed (a path relative to the working directory of the process
  that builds the pipeline) and its keys are cast to the types of the rows' key fields
  when it is applied;
- ``mechanism.kind: quantiles``: the rows carry the value column ``mechanism.column``
  beside the user and key fields;
- ``input.sample`` (the config's ``sample``): the rows are an existing weighted sample,
  the key fields and the frequency field, no user; they go through the CLI's stages
  (``release.release_stages``: OneRowPerKey, SanitizeSample);
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
(``transforms.randomness.keyed_random.PipelineSecret``), and each stage is handed its label
path from the release's root (``keyed_random.KeyedDraws``), so under one secret the
transform draws exactly what ``thresher run`` draws for the same spec and records.

The building blocks (PerUserBound, NoisyThreshold, ...) are deliberately not exposed one
by one: they work on Arrow batches of hashed records, and a privacy guarantee holds only
for the composition (noise calibrated for counts that were bounded per user), which
this transform fixes.
"""
import dataclasses
import json
import os
import re
import sys
import typing

import apache_beam as beam
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.transforms.trigger import DefaultTrigger
from apache_beam.transforms.window import GlobalWindows
import numpy as np
import pyarrow as pa
import yaml
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.typehints.schemas import named_fields_from_element_type

from thresher.pipelines.dataio import intervals, io
from thresher.pipelines.dataio.public_keys import load_domain
from thresher.pipelines.errors import SpecError, ThresherError
from thresher.pipelines.ledgers import pipeline_charge
from thresher.pipelines.ledgers.pipeline_charge import charge_when_run
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.beam_flags import refuse_dask, refuse_graph_saving
from thresher.pipelines.running.release import release_stages
from thresher.pipelines import kinds
from thresher.pipelines.specs.aggregates import apply_clips, value_columns
from thresher.pipelines.specs.spec import parse
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.keyed_random import KeyedDraws, PipelineSecret
from thresher.transforms.randomness.secret_commitment import OneSecret
from thresher.transforms.randomness.user_identity import identity_key

DEFAULT_NUM_SHARDS = 16
_BATCH_ROWS = 1 << 16
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
    # The rows come from the YAML pipeline; path and format only satisfy the spec's
    # schema and are never read.
    input_section = {"path": "<beam yaml input>", "format": "parquet"}
    output_section = {"path": "<beam yaml output>"}
    document = {
        "name": name, "input": input_section,
        "privacy": privacy, "bounding": bounding, "mechanism": mechanism,
        "output": output_section,
    }
    for field, value in (("aggregates", aggregates), ("aggregates_auto", aggregates_auto),
                         ("budget", budget)):
        if value is not None:
            config[field] = document[field] = value
    for field, value in (("user", user), ("keys", keys), ("public_keys", public_keys),
                         ("sample", sample)):
        if value is not None:
            config[field] = input_section[field] = value
    if confidence is not None:
        config["confidence"] = output_section["confidence"] = confidence
    try:
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise SpecError("num_shards", f"must be an integer >= 1, got {num_shards!r}")
        spec = parse(document, source_text=yaml.safe_dump(config, sort_keys=True))
        plan = make_plan(spec)
    except SpecError as exc:
        raise _named(exc) from None
    return _Release(plan, num_shards)


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


def _named(exc):
    """A SpecError of the spec's fields, named as this transform's config names them."""
    field = exc.field
    for spec_field, config_field in _CONFIG_FIELD.items():
        if field == spec_field or field.startswith(spec_field + "[") \
                or field.startswith(spec_field + "."):
            field = config_field + field[len(spec_field):]
    return SpecError(f"ThresherRelease.{field}" if field else "ThresherRelease", exc.message)


_ARROW_OF = {bool: pa.bool_(), int: pa.int64(), float: pa.float64(), str: pa.string(),
             bytes: pa.binary()}


def _arrow_type(python_type):
    """The Arrow type ``pa.array`` gives the values of a row field (None if unknown)."""
    args = [a for a in typing.get_args(python_type) if a is not type(None)]
    if typing.get_origin(python_type) is typing.Union and len(args) == 1:
        python_type = args[0]
    return _ARROW_OF.get(python_type)


def _domain_for(plan, fields):
    """The plan with its public key domain cast to the types of the rows' key fields (as
    ``thresher run`` casts it to the types its reader gives the key columns)."""
    spec = plan.spec
    if plan.domain is None:
        return plan
    types = {k: _arrow_type(fields[k]) for k in spec.input.keys}
    if any(t is None for t in types.values()):
        return plan        # keep the file's own types
    try:
        domain = load_domain(spec.input.public_keys, spec.input.keys, types)
    except SpecError as exc:
        raise _named(exc) from None
    return dataclasses.replace(plan, domain=domain)


def _budget_checked(plan, pipeline):
    """With a budget: the plan with a ledger the workers reach (SpecError naming
    ``ThresherRelease.budget.ledger`` otherwise) that can still fit the release
    (``ThresherRelease.budget`` otherwise), checked when the pipeline is built."""
    if plan.spec.budget is None:
        return plan
    try:
        budget = pipeline_charge.workers_reach(plan.spec.budget, pipeline)
        plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, budget=budget))
        pipeline_charge.check_fits(plan)
    except SpecError as exc:
        raise _named(exc) from None
    return plan


def _python_type(arrow_type, field):
    if pa.types.is_boolean(arrow_type):
        return bool
    if pa.types.is_integer(arrow_type):
        return int
    if pa.types.is_floating(arrow_type):
        return float
    if pa.types.is_string(arrow_type) or pa.types.is_large_string(arrow_type):
        return str
    raise TypeError(f"output column {field!r} has type {arrow_type}, which has no Beam "
                    f"YAML schema type here")


def _interval_columns(spec, output_columns):
    """``output_columns`` with the ``<column>_low`` / ``_high`` columns ``thresher run``
    publishes, each after its value column (pipelines/dataio/intervals.py ``add_columns``):
    {name: (Arrow type, nullable)}."""
    with_interval = (intervals.report_section(spec)["columns"]
                     if intervals.kind_publishes(spec) else {})
    out = {}
    for name, (arrow_type, nullable) in output_columns.items():
        out[name] = (arrow_type, nullable)
        if name in with_interval:
            # counts: integer endpoints, never null; other values: float endpoints, null
            # where the value has no interval (a mean without users, ...)
            bounds = (pa.int64(), False) if name == "count" else (pa.float64(), True)
            for column in intervals.output_names(name):
                out[column] = bounds
    return out


def _refuse_windowing(rows):
    """A release is one computation over all of its input: each user bounded once over all
    of their rows and one privacy charge. Windows or a trigger would bound users per window
    or pane, and release (and charge) nothing or several times; so the input must be in
    Beam's global window with its default trigger (SpecError otherwise)."""
    windowing = rows.windowing
    if not isinstance(windowing.windowfn, GlobalWindows):
        raise SpecError("ThresherRelease", f"its input is in windows "
                        f"({type(windowing.windowfn).__name__}); a release bounds each user "
                        f"over all of their rows once: apply it to rows in the global window "
                        f"(beam.WindowInto(window.GlobalWindows())) with the default trigger")
    if not isinstance(windowing.triggerfn, DefaultTrigger):
        raise SpecError("ThresherRelease", f"its input has a trigger "
                        f"({windowing.triggerfn}); a release bounds each user over all of "
                        f"their rows once and fires once: use the default trigger")


def _plain_type(field_type):
    """The type inside ``Optional[...]`` (a nullable field), else the type itself."""
    args = [a for a in getattr(field_type, "__args__", ()) or () if a is not type(None)]
    if getattr(field_type, "__origin__", None) is typing.Union and len(args) == 1:
        return args[0]
    return field_type


def _check_identity_type(field_type):
    """The user field must have one Arrow type in every batch (each batch of rows becomes
    its own Arrow table): integers, floats, booleans, text or bytes. A decimal's Arrow
    precision and scale follow the values in the batch, so one user could read as "2" in
    one batch and "2.0" in another -- two identities, each with its own bound; other
    types are refused alike (SpecError naming the field)."""
    plain = _plain_type(field_type)
    allowed = (int, float, bool, str, bytes, np.integer, np.floating, np.bool_)
    if isinstance(plain, type) and issubclass(plain, allowed):
        return
    raise SpecError("ThresherRelease.user", f"the user field has type {plain!r}; a user id "
                    f"must be an integer, float, boolean, string or bytes field (a decimal "
                    f"or other type may be encoded differently from batch to batch, which "
                    f"would split one user into several); cast it in the pipeline first")


class _RowsToRecords(beam.DoFn):
    """A batch of rows -> one prepared Arrow table (``pipelines.io.prepare_batch``); rows
    without a user or with a null key are dropped and counted, as ``thresher run`` does.
    ``rng_factory``: the release's ``KeyedSource``, whose secret keys the user identities
    (``transforms.randomness.user_identity``)."""

    def __init__(self, user, keys, value_columns=(), rng_factory=None):
        self._user = user
        self._keys = tuple(keys)
        self._values = list(value_columns)     # [(field, prepared name)] of aggregates
        self._rng_factory = rng_factory

    def process(self, rows, charged=None):
        # charged: with a budget, the run's ledger charge (read only so that this stage,
        # the first to read a row, runs after it)
        names = list(dict.fromkeys((self._user, *self._keys, *(c for c, _ in self._values))))
        table = pa.table({name: pa.array([getattr(row, name) for row in rows]) for name in names})
        beam.metrics.Metrics.counter(io.NOT_PRIVATE, "rows_read").inc(table.num_rows)
        io.check_float_user_ids(table.column(self._user), "the input rows", self._user)
        prepared, drops = io.prepare_batch(table, self._user, self._keys,
                                           value_columns=self._values,
                                           identity_key=identity_key(self._rng_factory))
        for name, value in drops.items():
            if value:
                beam.metrics.Metrics.counter(io.NOT_PRIVATE, name).inc(value)
        if prepared.num_rows:
            yield prepared


class _SampleRowsToRecords(beam.DoFn):
    """``input.sample``: a batch of an existing sample's rows (key fields and the frequency
    field, no user) -> one prepared Arrow table (``pipelines.io.prepare_sample_batch``, as
    ``thresher run`` reads a sample file)."""

    def __init__(self, keys, frequency):
        self._keys = tuple(keys)
        self._frequency = frequency

    def process(self, rows, charged=None):
        names = list(dict.fromkeys((*self._keys, self._frequency)))
        table = pa.table({name: pa.array([getattr(row, name) for row in rows]) for name in names})
        beam.metrics.Metrics.counter(io.NOT_PRIVATE, "rows_read").inc(table.num_rows)
        prepared, drops = io.prepare_sample_batch(table, self._keys, self._frequency)
        for name, value in drops.items():
            if value:
                beam.metrics.Metrics.counter(io.NOT_PRIVATE, name).inc(value)
        if prepared.num_rows:
            yield prepared


def _chosen_report(reports, chosen, clips=None):
    """The plan's report for the chosen bound, with the chosen clips (clip: auto) as
    ``thresher run`` reports them (``aggregates.report_chosen_clips``)."""
    report = dict(reports[int(chosen)])
    if clips is not None:
        report["mechanism"] = apply_clips(report["mechanism"], clips)
    return report


def _table_to_rows(table, columns, spec, reports, chosen, clips=None, charged=None):
    """Released rows of one Arrow table, with the interval columns ``thresher run`` adds
    in its launcher (``intervals.add_columns``: post-processing of the released values
    and the report's public parameters, row by row, so a table's rows get the same
    endpoints here as in the CLI's gathered file). ``charged``: with a budget, this run's
    ledger charge, a side input read only so that no row is emitted before it exists."""
    if not table.num_rows:
        return
    if intervals.kind_publishes(spec):
        mechanism = _chosen_report(reports, chosen, clips)["mechanism"]
        table = intervals.add_columns(table, mechanism, spec)
    for record in table.select(list(columns)).to_pylist():
        yield beam.Row(**record)


def _report_json(released_keys, reports, chosen, clips=None, notes=None, kind=None,
                 charged=None):
    report = _chosen_report(reports, chosen, clips)
    if notes is not None:    # e.g. quantiles' capped key selection, as thresher run reports it
        report = kinds.get(kind).apply_notes(report, json.loads(notes))
    report["released_keys"] = int(released_keys)
    return beam.Row(report=json.dumps(report, sort_keys=False, allow_nan=False))


class _Release(beam.PTransform):
    def __init__(self, plan, num_shards, label=None):
        super().__init__(label)
        self._plan = plan
        self._num_shards = num_shards
        # Tests only: a KeyedSource with a known secret, to compare with thresher run
        # (pipelines.running.release.run's rng_factory). None: the secret is drawn in the pipeline.
        self._rng_factory = None

    def expand(self, rows):
        refuse_graph_saving(rows.pipeline.options, "by ThresherRelease")
        refuse_dask(rows.pipeline.runner)
        refuse_dask(rows.pipeline.options.view_as(StandardOptions).runner)
        _refuse_windowing(rows)
        plan = _budget_checked(self._plan, rows.pipeline)
        spec = plan.spec
        user, keys = spec.input.user, list(spec.input.keys)
        sample = spec.input.sample
        # what is read of each row: quantiles reads its value column like a key column
        read_keys = list(kinds.get(spec.kind).read_spec(spec).keys)
        try:
            fields = dict(named_fields_from_element_type(rows.element_type))
        except (TypeError, ValueError):
            wanted = ([user] + keys if sample is None else keys + [sample["frequency"]])
            raise SpecError("ThresherRelease", f"its input must be rows with a schema (fields "
                            f"{', '.join(map(repr, wanted))}), got elements of type "
                            f"{rows.element_type}") from None
        if sample is not None:     # an existing sample: keys and frequency, no user
            needed = [(f"keys[{i}]", k) for i, k in enumerate(keys)] + [
                ("sample.frequency", sample["frequency"])]
        else:
            needed = [("user", user)] + [
                (f"keys[{i}]" if i < len(keys) else "mechanism.column", k)
                for i, k in enumerate(read_keys)]
        for where, name in needed:
            if name not in fields:
                raise SpecError(f"ThresherRelease.{where}", f"field {name!r} is not in the "
                                f"input; its fields are: {', '.join(fields)}")
        if sample is None:
            _check_identity_type(fields[user])
        plan = _domain_for(plan, fields)
        values = []
        if spec.aggregates:
            values = value_columns(spec.aggregates)
            for i, (name, _) in enumerate(values):
                if name not in fields:
                    raise SpecError("ThresherRelease.aggregates", f"field {name!r} is not in "
                                    f"the input; its fields are: {', '.join(fields)}")
        kind = kinds.get(spec.kind)           # its NULLABLE_COLUMNS may hold null
        output_columns = {c: (t, c in kind.NULLABLE_COLUMNS)
                          for c, t in kind.OUTPUT_COLUMNS.items()}
        if spec.mechanism.get("debias"):      # input.public_keys with debias: poisson
            output_columns["debiased"] = (pa.float64(), False)
        for agg in spec.aggregates or ():     # a mean over a public key can be null
            output_columns[agg.output] = (pa.float64(), True)
        output_columns = _interval_columns(spec, output_columns)
        row_type = RowTypeConstraint.from_fields(
            [(k, fields[k]) for k in keys]
            + [(c, typing.Optional[_python_type(t, c)] if nullable else _python_type(t, c))
               for c, (t, nullable) in output_columns.items()])

        # the release secret: drawn inside the pipeline, never carried in its graph
        source = (self._rng_factory if self._rng_factory is not None
                  else PipelineSecret.draw(rows.pipeline))
        draws = KeyedDraws(source)   # the release's root: each stage gets its own child
        charged = None      # budget: this run's charge. The release's first stage that reads
        # a row (ToRecords) and both outputs take it as a side input, so on every runner
        # the charge is in the ledger before any row is read by the release: a run that
        # then fails on its data stays charged (issue 42). The charge reads the secret (its
        # run token), so it is added before OneSecret seals the secret's readers.
        if spec.budget is not None:
            charged = beam.pvalue.AsSingleton(charge_when_run(rows.pipeline, plan, source,
                                                              self.label))
        gate = {} if charged is None else {"charged": charged}
        batches = rows | "Batch" >> beam.BatchElements(min_batch_size=_BATCH_ROWS // 16,
                                                       max_batch_size=_BATCH_ROWS)
        if sample is not None:       # Table(__key, keys, count)
            records = batches | "ToRecords" >> beam.ParDo(
                _SampleRowsToRecords(keys, sample["frequency"]), **gate)
        else:                        # Table(__user, __user_lo, __key, keys)
            records = batches | "ToRecords" >> keyed_random.par_do(
                _RowsToRecords(user, read_keys, values, source), **gate)
        clips = []     # clip: auto -- the chosen bounds (one dict), for the report
        notes = []     # a kind's report figures computed in the pipeline (one JSON line)
        released, chosen = release_stages(records, plan, self._num_shards, rng_factory=draws,
                                          clip_sink=clips.append, notes_sink=notes.append)
        # nothing leaves before the run is known to have read one secret (issue 36 P2)
        released = released | "OneSecret" >> OneSecret(source)

        if chosen is None:
            bound = spec.bounding.max_keys_per_user
            reports, chosen_value = {bound: plan.report()}, bound
        else:
            reports = {c: plan.report(chosen_bound=c) for c in plan.candidates}
            chosen_value = beam.pvalue.AsSingleton(chosen, default_value=min(plan.candidates))
        clips_value = beam.pvalue.AsSingleton(clips[0]) if clips else None
        notes_value = beam.pvalue.AsSingleton(notes[0]) if notes else None
        released_rows = released | "ToRows" >> beam.FlatMap(
            _table_to_rows, columns=keys + list(output_columns), spec=spec, reports=reports,
            chosen=chosen_value, clips=clips_value, charged=charged).with_output_types(row_type)
        report = (released
                  | "CountReleased" >> beam.Map(lambda table: table.num_rows)
                  | "SumReleased" >> beam.CombineGlobally(sum)
                  | "Report" >> beam.Map(_report_json, reports=reports, chosen=chosen_value,
                                         clips=clips_value, notes=notes_value,
                                         kind=spec.kind, charged=charged)
                  .with_output_types(RowTypeConstraint.from_fields([("report", str)])))
        return {"released": released_rows, "report": report}

"""The Python API: a whole release as one PTransform, and planning without data.

``Release(spec)`` is the release of a ``thresher run`` spec inside a user's own Beam
pipeline: it takes schema'd rows (``beam.Row`` or a PCollection with a schema) with the
spec's user and key fields and returns ``{"released": rows, "report": one row}`` — the
same validation and calibration, and the same ``Release`` transform
(``pipelines.running.release.Release``) as ``thresher run``, over the rows
(``RowsRelease``; Beam YAML's ``ThresherRelease`` is this function too). It
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

**Rows in and out** (``RowsRelease``): the rows are batched into Arrow tables and
prepared as ``thresher run``'s reader prepares a file's batches (``io.prepare_batch`` /
``io.prepare_sample_batch``), then go through ``Release``; its finished table becomes
one ``beam.Row`` per released row (the key fields, the kind's columns and their interval
columns) and its report one row with the report as JSON. What only rows need is here:
the fields' check against the spec, their types, the input's windowing, the public key
domain cast to the fields' types, and the ledger charged when the pipeline runs. Errors
name the spec's fields (``input.user``, ``mechanism.column``, ...); Beam YAML renames
them as its config names them (``ThresherRelease.user``).
"""
import dataclasses
import json
import os
import typing

import apache_beam as beam
import numpy as np
import pyarrow as pa
import yaml
from apache_beam.options.pipeline_options import StandardOptions
from apache_beam.transforms.trigger import DefaultTrigger
from apache_beam.transforms.window import GlobalWindows
from apache_beam.typehints.row_type import RowTypeConstraint
from apache_beam.typehints.schemas import named_fields_from_element_type

from thresher.pipelines import kinds
from thresher.pipelines.dataio import intervals, io
from thresher.pipelines.dataio.public_keys import load_domain
from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import pipeline_charge
from thresher.pipelines.ledgers.pipeline_charge import charge_when_run
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running import release
from thresher.pipelines.running.beam_flags import refuse_dask, refuse_graph_saving
from thresher.pipelines.specs import spec as spec_module
from thresher.pipelines.specs.aggregates import value_columns
from thresher.transforms.randomness import keyed_random
from thresher.transforms.randomness.user_identity import identity_key

DEFAULT_NUM_SHARDS = 16
# The input fields a release over rows reads; the others (path, format, delimiter) and
# output.path are ignored as docs/api.md promises, and the spec is parsed in its rows mode
# (spec_module.parse(rows_input=True)), which neither needs nor invents them.
_INPUT_FIELDS = ("user", "keys", "public_keys", "sample")


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


def Release(spec, num_shards=DEFAULT_NUM_SHARDS):
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
    sections = {k: v for k, v in spec.items() if k != "description"}
    sections.setdefault("name", "release")
    sections.setdefault("bounding", {})
    return release_of(sections, num_shards, yaml.safe_dump(spec, sort_keys=True))


def _api_field(field):
    """How ``thresher.Release`` names a field in its errors: the spec's dotted name."""
    return field or "thresher.Release"


def release_of(spec, num_shards, source_text, field_name=_api_field):
    """The release transform over rows (``RowsRelease``) of a spec mapping
    whose ``input`` names fields (``user``, ``keys``, ``public_keys``, ``sample``) and
    whose ``output`` gives at most ``confidence``; other input and output fields are
    ignored. ``source_text``: the text the report's ``config_sha256`` hashes;
    ``field_name``: how errors name a spec field (Beam YAML: ``ThresherRelease.user``)."""
    section = spec.get("input") or {}
    document = {k: v for k, v in spec.items() if k != "output"}
    document["input"] = {k: section[k] for k in _INPUT_FIELDS
                         if isinstance(section, dict) and k in section}
    if isinstance(spec.get("output"), dict) and "confidence" in spec["output"]:
        document["output"] = {"confidence": spec["output"]["confidence"]}
    try:
        if isinstance(num_shards, bool) or not isinstance(num_shards, int) or num_shards < 1:
            raise SpecError("num_shards", f"must be an integer >= 1, got {num_shards!r}")
        plan = make_plan(spec_module.parse(document, source_text=source_text, rows_input=True))
    except SpecError as exc:
        raise SpecError(field_name(exc.field), exc.message) from None
    return RowsRelease(plan, num_shards, field_name=field_name)


_BATCH_ROWS = 1 << 16
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
    domain = load_domain(spec.input.public_keys, spec.input.keys, types)
    return dataclasses.replace(plan, domain=domain)


def _budget_checked(plan, pipeline):
    """With a budget: the plan with a ledger the workers reach (SpecError naming
    ``budget.ledger`` otherwise) that can still fit the release (``budget`` otherwise),
    checked when the pipeline is built."""
    if plan.spec.budget is None:
        return plan
    budget = pipeline_charge.workers_reach(plan.spec.budget, pipeline)
    plan = dataclasses.replace(plan, spec=dataclasses.replace(plan.spec, budget=budget))
    pipeline_charge.check_fits(plan)
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
        raise SpecError("", f"its input is in windows "
                        f"({type(windowing.windowfn).__name__}); a release bounds each user "
                        f"over all of their rows once: apply it to rows in the global window "
                        f"(beam.WindowInto(window.GlobalWindows())) with the default trigger")
    if not isinstance(windowing.triggerfn, DefaultTrigger):
        raise SpecError("", f"its input has a trigger "
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
    raise SpecError("input.user", f"the user field has type {plain!r}; a user id "
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


def _table_rows(done, columns, charged=None):
    """The finished release's rows as ``beam.Row``s (``charged``: with a budget, this
    run's ledger charge, a side input read only so that no row leaves before it exists)."""
    table, _ = done
    for record in table.select(list(columns)).to_pylist():
        yield beam.Row(**record)


def _report_row(done, charged=None):
    _, report = done
    return beam.Row(report=json.dumps(report, sort_keys=False, allow_nan=False))


class RowsRelease(beam.PTransform):
    """The release of ``plan`` over schema'd rows: ``{"released": rows, "report": one row}``
    (module docstring). ``field_name``: how errors name a spec field, given its dotted
    name ("" for the transform itself; default: the dotted name, ``thresher.Release``)."""

    def __init__(self, plan, num_shards, field_name=None, label=None):
        super().__init__(label)
        self._plan = plan
        self._num_shards = num_shards
        self._field_name = field_name or _api_field
        # Tests only: a KeyedSource with a known secret, to compare with thresher run
        # (pipelines.running.release.run's rng_factory). None: the secret is drawn in the pipeline.
        self._rng_factory = None

    def expand(self, rows):
        refuse_graph_saving(rows.pipeline.options, "by " + self._field_name(""))
        refuse_dask(rows.pipeline.runner)
        refuse_dask(rows.pipeline.options.view_as(StandardOptions).runner)
        try:       # the errors below name spec fields: named as the caller names them
            return self._expand(rows)
        except SpecError as exc:
            raise SpecError(self._field_name(exc.field), exc.message) from None

    def _expand(self, rows):
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
            raise SpecError("", f"its input must be rows with a schema (fields "
                            f"{', '.join(map(repr, wanted))}), got elements of type "
                            f"{rows.element_type}") from None
        if sample is not None:     # an existing sample: keys and frequency, no user
            needed = [(f"input.keys[{i}]", k) for i, k in enumerate(keys)] + [
                ("input.sample.frequency", sample["frequency"])]
        else:
            needed = [("input.user", user)] + [
                (f"input.keys[{i}]" if i < len(keys) else "mechanism.column", k)
                for i, k in enumerate(read_keys)]
        for where, name in needed:
            if name not in fields:
                raise SpecError(where, f"field {name!r} is not in the input; its fields "
                                f"are: {', '.join(fields)}")
        if sample is None:
            _check_identity_type(fields[user])
        plan = _domain_for(plan, fields)
        values = []
        if spec.aggregates:
            values = value_columns(spec.aggregates)
            for i, (name, _) in enumerate(values):
                if name not in fields:
                    raise SpecError("aggregates", f"field {name!r} is not in the input; its "
                                    f"fields are: {', '.join(fields)}")
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
                  else keyed_random.PipelineSecret.draw(rows.pipeline))
        charged = None      # budget: this run's charge. The release's first stage that reads
        # a row (ToRecords) and both outputs take it as a side input, so on every runner
        # the charge is in the ledger before any row is read by the release: a run that
        # then fails on its data stays charged (issue 42). The charge reads the secret (its
        # run token), so it is added before the release's publisher seals the secret's readers.
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
        # the key columns' types as the rows give them (null: as the released tables have them)
        key_fields = [pa.field(k, _arrow_type(fields[k]) or pa.null()) for k in keys]
        finished = records | "Release" >> release.Release(plan, self._num_shards, source,
                                                          key_fields)
        released = finished | "ToRows" >> beam.FlatMap(
            _table_rows, columns=keys + list(output_columns), **gate).with_output_types(row_type)
        report = finished | "ReportRow" >> beam.Map(_report_row, **gate).with_output_types(
            RowTypeConstraint.from_fields([("report", str)]))
        return {"released": released, "report": report}

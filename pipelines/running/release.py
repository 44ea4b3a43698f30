"""Build and run the Beam pipeline of one release: Read -> Release -> Write.

    Read ─► ShardByUser ─► PerUserBound / RandClip ─► SumCountsPerKey ─► mechanism ─┐
                 │                 ▲ side input: C                                  │
                 └─► ChooseContributionBound (max_keys_per_user: auto) ──────────────┤
                                                     FinishRelease (table, report) ◄┘ ─► Write

``Release`` is the one release transform: ``thresher run`` applies it to the records it
reads, ``thresher.Release`` (pipelines/api.py) and Beam YAML's ``ThresherRelease``
(pipelines/beam_yaml.py) to schema'd rows. It ends in the pipeline with the released
table (canonical order, interval columns) and the report; ``thresher run`` writes both
once into a staging folder beside ``output.path``, moved into place only after the
pipeline succeeded, so a failed run never leaves an output that looks complete.
"""
import json
import logging
import os
import time

import apache_beam as beam
import pyarrow as pa
from apache_beam.io.filesystems import FileSystems
from apache_beam.options.pipeline_options import PortableOptions, StandardOptions

from thresher.pipelines import kinds
from thresher.pipelines.common import progress
from thresher.pipelines.dataio import intervals, io, publish, released_file
from thresher.pipelines.dataio.claim import claim
from thresher.pipelines.errors import InputError, ThresherError
from thresher.pipelines.kinds.base import RECORDS, USERS, whole_user_setting
from thresher.pipelines.ledgers import ledger
from thresher.pipelines.running import signals
from thresher.pipelines.running.beam_flags import refuse_dask, refuse_graph_saving
from thresher.pipelines.running.beam_options import ReleaseOptions
from thresher.pipelines.running.live_metrics import LiveMetricsRunner
from thresher.pipelines.specs.aggregates import (apply_clips, auto_columns, check_rows,
                                                 choose_clips, output_fields, sum_columns)
from thresher.pipelines.specs.spec import input_files
from thresher.transforms.bounding.choose_contribution_bound import (_DEFAULT_KEY_SHARDS,
                                                                    ChooseContributionBound)
from thresher.transforms.bounding.prereduce import PreReduceL0, PreReducePairs
from thresher.transforms.bounding.prereduce_stages import PreReduceDistinctPairs
from thresher.transforms.bounding.rand_clip import RandClip
from thresher.transforms.bounding.rand_clip_copies import PreReduceCopies, RandClipCopies
from thresher.transforms.bounding.scored_bound import ScoredPerUserBound, user_key_cap
from thresher.transforms.bounding.user_shards import MAX_USER_ROWS, ShardByUser
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.plumbing.spill import SPILL_FOLDER
from thresher.transforms.randomness import keyed_random, secret_commitment
from thresher.transforms.selection import public_domain
from thresher.transforms.selection.adaptive_rounds import ShardedUsers
from thresher.transforms.selection.public_domain import packed_domain, unpack
from thresher.transforms.selection.unique_keys import OneRowPerKey
from thresher.transforms.values.aggregate_values import (PerUserBoundWithValues,
                                                         ReleaseWithAggregates, zero_sums)

log = logging.getLogger("thresher")

def pipeline_options(beam_args):
    """Beam options from the flags after ``--``; the default runner is the in-process
    FnApiRunner (what DirectRunner uses for batch Python pipelines, without DirectRunner's
    attempt to download the Prism runner first). Each options view is built once
    (``pipelines.beam_options``)."""
    options = ReleaseOptions(list(beam_args))
    runner = options.view_as(StandardOptions).runner
    refuse_dask(runner)
    return options, runner


def _make_runner(runner_name):
    if runner_name:
        return runner_name
    return LiveMetricsRunner()     # Beam's FnApiRunner, its metrics readable while it runs


def key_fields(spec, files):
    """The released file's key columns: pyarrow fields typed as the reader gives them."""
    schema = io.read_schema(files[0], spec.input.format, spec.input.delimiter)
    fields = []
    for name in spec.input.keys:
        t = schema.field(name).type
        if pa.types.is_dictionary(t):
            t = t.value_type
        if spec.input.format != "parquet" or pa.types.is_large_string(t):
            t = pa.string() if (spec.input.format != "parquet" or pa.types.is_large_string(t)) else t
        fields.append(pa.field(name, t))
    return fields


def release_schema(spec, key_fields):
    """Fields of the released table: ``key_fields`` (pyarrow fields of the key columns)
    and the kind's columns (before the interval columns, which ``finish`` adds)."""
    fields = list(key_fields)
    for name, t in kinds.get(spec.kind).OUTPUT_COLUMNS.items():
        fields.append(pa.field(name, t))
    if spec.mechanism.get("debias"):   # input.public_keys with debias: poisson
        fields.append(pa.field("debiased", pa.float64()))
    if spec.aggregates:
        fields.extend(output_fields(spec.aggregates))
    return fields


def build(pipeline, plan, files, est_rows, staging, rng_factory=None):
    """``thresher run``'s pipeline: Read -> Release -> Write. The one ``Release`` transform
    (the Python API's and Beam YAML's too) ends in-pipeline with the released table and
    the report; ``write_release`` writes both into ``staging`` once. Returns nothing."""
    spec = plan.spec
    if spec.aggregates:   # int64 grid sums cannot overflow: <= MAX_USERS users per key
        check_rows(est_rows)
    exact_rows = spec.input.format == "parquet"     # footers: est_rows is the row count
    num_shards = io.num_shards_for(est_rows, exact=exact_rows)

    read_spec = kinds.get(spec.kind).read_spec(spec)
    source = keyed_random.resolve(rng_factory)   # the publisher checks: one secret per run
    records = pipeline | "Read" >> io.ReadRecords(read_spec, files,
                                                  rng_factory=source)   # Table(__user, __key, keys)
    spill_dir = None   # a small input's shuffles stay in memory (a few MB at most)
    if spec.input.sample is None and not io.is_small_input(est_rows, exact_rows):
        spill_dir = _spill_dir(pipeline, staging)
    finished = records | "Release" >> Release(plan, num_shards, source, key_fields(spec, files),
                                               spill_dir=spill_dir, rng_factory=rng_factory)
    finished | "Write" >> beam.Map(write_release, staging=staging)


class Release(beam.PTransform):
    """The one release of a spec (``thresher run``, ``thresher.Release`` and Beam YAML's
    ``ThresherRelease`` all apply it): prepared record batches in
    (``pipelines.dataio.io.prepare_batch``; ``prepare_sample_batch`` with ``input.sample``),
    the release finished in the pipeline out:

    one element ``(table, report)``: every released row in the canonical order and
    layout of ``pipelines.dataio.released_file`` with the interval columns
    (``pipelines.dataio.intervals``), and the release report (the plan's, for the chosen
    bound, with the chosen clips, the kind's notes and ``released_keys``).

    Both are functions of the released rows, the spec and the version only: the chosen
    bound, clips and notes reach the one finishing stage as side inputs, nothing is
    written beside the release and read back. The finishing stage is the release's
    publisher (``transforms.randomness.secret_commitment.publisher``): under the
    in-pipeline secret it first checks that every stage read one secret, so nothing
    leaves before that check passed.

    ``source``: the release's keyed source (``PipelineSecret`` or a test ``KeyedSource``);
    each drawing stage is handed its own child of it (``keyed_random.KeyedDraws``), named
    as the stage is labelled, so the release draws the same wherever it is applied. ``key_fields``: pyarrow fields of the key
    columns (of type null: as the released tables give it). ``spill_dir``: the in-process
    runner's shuffle spill folder (``_spill_dir``). ``rng_factory``: what the stages are
    given (tests: the fixed source; None: the release's ``source``)."""

    def __init__(self, plan, num_shards, source, key_fields, spill_dir=None,
                 rng_factory=None, label=None):
        super().__init__(label)
        self._plan = plan
        self._num_shards = num_shards
        self._source = source
        self._key_fields = list(key_fields)
        self._spill_dir = spill_dir
        self._rng_factory = rng_factory

    def expand(self, records):
        plan = self._plan
        spec = plan.spec
        keys = list(spec.input.keys)
        pipeline = records.pipeline
        clips = []     # clip: auto -- the chosen bounds (one dict)
        notes = []     # a kind's report figures computed in the pipeline (one JSON line)
        # the draws' root: each stage is handed its own child of it, named as the stage
        # is labelled, wherever this transform is applied (keyed_random.KeyedDraws)
        factory = self._rng_factory if self._rng_factory is not None else self._source
        released, chosen = release_stages(records, plan, self._num_shards,
                                          rng_factory=keyed_random.KeyedDraws(
                                              keyed_random.resolve(factory)),
                                          clip_sink=clips.append,
                                          spill_dir=self._spill_dir,
                                          notes_sink=notes.append)
        if chosen is None:
            bound = spec.bounding.max_keys_per_user
            reports = {bound: plan.report()}
            chosen = bound
        else:
            reports = {c: plan.report(chosen_bound=c) for c in plan.candidates}
            chosen = beam.pvalue.AsList(chosen)
        extra = {}
        if clips:
            extra["clips"] = beam.pvalue.AsList(clips[0])
        if notes:
            extra["notes"] = beam.pvalue.AsList(notes[0])
        if plan.domain is not None:
            extra["domain"] = beam.pvalue.AsSingleton(packed_domain(pipeline, plan.domain, keys))
        finished = (pipeline
                    | "GatherReleased" >> beam.Impulse()
                    | "FinishRelease" >> secret_commitment.publisher(
                        finish, self._source, tables=beam.pvalue.AsList(released),
                        chosen=chosen, reports=reports, spec=spec,
                        key_fields=self._key_fields, **extra))
        return finished


def _one(values, what):
    """The one element of a side input that holds one (a private choice, a note): None
    when there is none (a stage that did not run), an error naming ``what`` for more."""
    values = list(values)
    if len(values) > 1:
        raise ThresherError(f"{what} produced {len(values)} values, expected exactly one; "
                            f"nothing was published")
    return values[0] if values else None


def finish(unused_impulse, tables, chosen, reports, spec, key_fields, clips=None, notes=None,
           domain=None):
    """The release finished: (canonical released table with its interval columns, report).

    Post-processing of the released tables and the private choices with the public
    parameters only (the plan's reports for each candidate bound, the spec), so the
    published table and report are a function of the private output, the spec and the
    version on every runner."""
    keys = list(spec.input.keys)
    if not isinstance(chosen, int):           # max_keys_per_user: auto -- the chosen bound
        chosen = _one(chosen, "the contribution-bound stage")
        if chosen is None:
            raise ThresherError("the contribution-bound stage produced no bound; nothing "
                                "was published")
    report = dict(reports[int(chosen)])
    if clips is not None:                     # clip: auto -- the chosen bounds
        clips = _one(clips, "the clip stage")
        if clips is not None:
            report["mechanism"] = apply_clips(report["mechanism"], clips)
    if notes is not None:                     # e.g. quantiles' capped key selection
        note = _one(notes, "the kind's notes stage")
        if note is not None:
            report = kinds.get(spec.kind).apply_notes(report, json.loads(note))
    tables = list(tables)
    schema = pa.schema([_key_field(f, tables) for f in key_fields]
                       + release_schema(spec, []))
    if domain is not None:
        domain = unpack(domain)
    table = released_file.canonical_table(tables, schema, keys, domain=domain)
    table = intervals.add_columns(table, report["mechanism"], spec)
    report["released_keys"] = int(table.num_rows)
    return table, report


def _key_field(field, tables):
    """A key column's field: as given, or (type null) as the released tables have it."""
    if field.type != pa.null():
        return field
    for t in tables:
        if field.name in t.column_names:
            return pa.field(field.name, t.schema.field(field.name).type)
    return pa.field(field.name, pa.string())


def write_release(done, staging):
    """``thresher run``'s Write: the finished release's ``released.parquet`` and
    ``release_report.json`` written into the staging location, once each."""
    table, report = done
    report = dict(report, outputs=[io.RELEASED_FILE])
    path = publish.join(staging, io.RELEASED_FILE)
    if publish.is_remote(path):
        with FileSystems.create(path) as handle:
            handle.write(released_file.serialise(table))
    else:
        released_file.write(table, path)
    publish.write_json(publish.join(staging, io.REPORT_FILE), report)
    return table.num_rows


def _spill_dir(pipeline, staging):
    """Where the in-process runner's user shuffle spills (transforms/plumbing/spill.py): a
    ``beam-temp-*`` folder in the local staging folder, removed with Beam's scratch after
    the pipeline. None (the runner's own shuffle) for any other runner, a remote output,
    or SDK workers that may not share this machine's disk (``--environment_type`` other
    than the in-process ones)."""
    # heavy: apache_beam.runners.portability.fn_api_runner (only the launcher needs it)
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    environment = (pipeline.options.view_as(PortableOptions).environment_type or "").upper()
    same_machine = environment in ("", "EMBEDDED", "LOOPBACK", "PROCESS")
    if isinstance(pipeline.runner, FnApiRunner) and same_machine \
            and not publish.is_remote(staging):
        return os.path.join(os.path.abspath(staging), SPILL_FOLDER)
    return None


def release_stages(records, plan, num_shards, rng_factory=None, clip_sink=None, spill_dir=None,
                   notes_sink=None):
    """The stages of a release between its prepared records and its finishing stage
    (``Release``).

    records: PCollection[pyarrow.Table] of prepared batches (``pipelines.io.prepare_batch``:
    ``__user``, ``__key`` and the key columns; with ``input.sample``
    ``pipelines.io.prepare_sample_batch``: ``__key``, the key columns and ``count``);
    spill_dir: a local folder for the user
    shuffle's pieces (in-process runner only, see ``_spill_dir``); clip_sink: called with the
    PCollection of the chosen clips (``clip: auto``); notes_sink: called with a
    PCollection of one JSON line when the kind computes report figures in the pipeline
    (``WRITES_NOTES``). ``Release`` takes both as side inputs of its finishing stage,
    which folds them into the report (``apply_clips``, the kind's ``apply_notes``).
    The kind's ``releases_from`` (``pipelines.kinds.base``) says which wiring applies.
    rng_factory: the release's source (a ``keyed_random.KeyedSource``, ``PipelineSecret``
    or, in tests, ``seeded_for_tests``) or its root ``keyed_random.KeyedDraws``: every
    stage that draws is handed its own child of it, named as the stage is labelled.
    Returns (released PCollection[pyarrow.Table],
    chosen bound PCollection[int] with exactly one element, or None for a fixed bound).
    """
    if not isinstance(rng_factory, keyed_random.KeyedDraws):
        rng_factory = keyed_random.KeyedDraws(rng_factory)   # the root: labels from here
    spec = plan.spec
    keys = list(spec.input.keys)
    if spec.input.sample is not None:
        return _sample_stages(records, plan, num_shards, rng_factory), None
    kind = kinds.get(spec.kind)
    if kind.releases_from == RECORDS:                    # heavy_hitters, quantiles
        extra = ({"notes_sink": notes_sink}
                 if notes_sink is not None and kind.WRITES_NOTES else {})
        if spill_dir is not None and kind.TAKES_SPILL_DIR:
            extra["spill_dir"] = spill_dir     # heavy_hitters' adaptive rounds (issue 43)
        return kind.release_stages(records, plan, num_shards, rng_factory, **extra), None
    if plan.domain is not None:
        return _public_domain_stages(records, plan, num_shards, rng_factory, clip_sink, spill_dir)
    if _one_pass_auto(spec):
        return _one_pass_auto_stages(records, plan, num_shards, rng_factory, spill_dir)
    reduced = _prereduced(records, plan, rng_factory)
    distinct_rows = False   # a user's distinct records or keys all meet in one place
    if reduced is records:   # issue 43: the other fixed bounds' own pre-reductions
        reduced, distinct_rows = _prereduced_heavy(records, plan, rng_factory)
    combined = reduced is not records   # pre-reduced: a user sends ~C rows per table
    shards = _UserShards(reduced, num_shards, keys, spec.auto_bound, spill_dir,
                         combined=combined, per_consumer=kind.releases_from == USERS,
                         setting=_whole_user_setting(plan)
                         if not combined or spec.aggregates or distinct_rows else None)
    chosen = None
    if spec.auto_bound:
        chosen = shards.for_choice | "ChooseContributionBound" >> ChooseContributionBound(
            keys, candidates=plan.candidates, epsilon=plan.select_stage.epsilon,
            model=spec.bounding.model, score=plan.score_name,
            score_params=plan.score_params(), max_bound=spec.bounding.auto.max_bound,
            num_key_shards=_key_shards(num_shards),
            rng_factory=keyed_random.child(rng_factory, "ChooseContributionBound"),
            spill_dir=spill_dir)                                               # one int
    if kind.releases_from == USERS:                      # adaptive: rounds over the users
        users = shards.sharded(chosen, min(plan.candidates))     # each round concatenates
        bound, params = _bound_and_params(users, plan, chosen)
        return kind.release_users(
            users, _side(params), bound, keys, num_shards, spec.mechanism,
            rng_factory=rng_factory, spill_dir=spill_dir), chosen
    users = shards.users(chosen, min(plan.candidates))                     # Table of whole users
    clips = _choose_clips(users, plan, rng_factory, clip_sink)
    partial, params = _bound_users(users, plan, chosen, rng_factory, clips)
    counts = partial | "SumCountsPerKey" >> SumCountsPerKey(
        keys, num_shards, spill_dir=spill_dir)                              # Table(keys, count)
    if spec.aggregates:   # counts and grid sums (pipelines/specs/aggregates.py)
        return counts | "ReleaseWithAggregates" >> ReleaseWithAggregates(
            _side(params), rng_factory=keyed_random.child(rng_factory, "ReleaseWithAggregates")
        ), chosen
    released = kind.release(counts, _side(params), keys, rng_factory)
    return released, chosen


def _sample_stages(records, plan, num_shards, rng_factory):
    """An existing weighted sample (``input.sample``): one row per key with its frequency;
    no users to bound, the declared bound is the sample's, and the kind's release
    (weighted_sampling: SanitizeSample) sanitizes it (paper 001's post-processing use)."""
    spec = plan.spec
    keys = list(spec.input.keys)
    params = plan.params_by_bound[spec.bounding.max_keys_per_user]
    counts = records | "OneRowPerKey" >> OneRowPerKey(keys, num_shards)     # Table(keys, count)
    return kinds.get(spec.kind).release(counts, params, keys, rng_factory)


def _prereduced(records, plan, rng_factory):
    """Fixed-bound l0 bounding by ``PerUserBound`` (or ``PerUserBoundWithValues``):
    combine the read batches into the shuffle's tables and drop from each, where that
    pays, rows the bounding cannot keep (transforms/bounding/prereduce.py; same released
    bytes, a heavy user shuffles about C rows per table instead of all of them); with
    aggregates a kept (user, key)'s rows travel as its exact partial total per table
    (prereduce.py, "Aggregates"; under ``clip: auto`` no key is cut). Every other
    bounding needs all of a user's records (prereduce.py's docstring says why), and so
    does fresh randomness (a test's seeded factory): their records pass unchanged."""
    spec = plan.spec
    source = keyed_random.resolve(rng_factory)
    if (spec.auto_bound or spec.bounding.model != "l0"
            or not kinds.get(spec.kind).plain_l0_bound   # adaptive, weighted_gaussian
            or not isinstance(source, keyed_random.KeyedSource)):
        return records
    # the keyed draws are those of the PerUserBound applied in _bound_users
    stage = keyed_random.child(rng_factory, "PerUserBound").stage
    if spec.aggregates:   # PerUserBoundWithValues: exact partial totals of the kept keys
        # (issue 43; clip: auto reads every key's total, so no key is cut there)
        return records | "PreReduceUsers" >> PreReduceL0(
            spec.input.keys, None if auto_columns(spec.aggregates)
            else spec.bounding.max_keys_per_user, source, stage, every_row=True,
            value_names=sorted({v for v, _ in sum_columns(spec.aggregates)}))
    return records | "PreReduceUsers" >> PreReduceL0(
        spec.input.keys, spec.bounding.max_keys_per_user, source, stage)


def _prereduced_pairs(records, plan, rng_factory):
    """``max_keys_per_user: auto`` in one pass: combine the read batches into the
    shuffle's tables and keep, where that pays, one row per distinct (user, exact key)
    (transforms/bounding/prereduce.py, "The automatic bound": every score V(C), the draw
    and every candidate's kept set are unchanged), and cut a heavy user to its
    ``scored_bound.user_key_cap`` smallest hash ranks per table (all the score reads of
    it). Applied under the release's secret only, as the fixed bound's step is (its
    proof is about keyed draws)."""
    source = keyed_random.resolve(rng_factory)
    if not isinstance(source, keyed_random.KeyedSource):
        return records
    # the keyed draws of the ScoredPerUserBound applied as "PerUserBound" beside this
    stage = keyed_random.child(rng_factory, "PerUserBound").stage
    return records | "PreReducePairs" >> PreReducePairs(
        plan.spec.input.keys, user_key_cap(plan.candidates), source, stage, mark_kept=True)


def _copies_apply(plan, rng_factory):
    """Whether l1 rows travel as (record, count) (:func:`_prereduced_heavy`)."""
    spec = plan.spec
    return (spec.bounding.model == "l1" and not spec.auto_bound and not spec.aggregates
            and plan.domain is None and kinds.get(spec.kind).releases_from != USERS
            and isinstance(keyed_random.resolve(rng_factory), keyed_random.KeyedSource))


def _prereduced_heavy(records, plan, rng_factory):
    """issue 43: the pre-reductions of the fixed bounds ``_prereduced`` leaves alone, so
    that a heavy user is bounded rather than refused; each leaves the published bytes as
    they are (their modules say why). Returns (records, whether a user's distinct rows
    still all meet in one place, so the whole-user limit stays):

    * l1 (``RandClip``): a user's repeated records travel as one row per table with
      their count (transforms/bounding/rand_clip_copies.py; ``RandClipCopies`` reads it);
    * adaptive: one row per (user, key) and table (transforms/bounding/prereduce_stages.py,
      ``PreReduceDistinctPairs``);
    * weighted_gaussian (``WeightedPerUserBound``: the l0 kernel, then weights and counts
      of the kept keys only): ``PreReduceL0`` at C, as the plain l0 bound.

    Under the release's keyed secret only; every other bounding gets its records."""
    spec = plan.spec
    kind = kinds.get(spec.kind)
    source = keyed_random.resolve(rng_factory)
    if (spec.auto_bound or spec.aggregates or plan.domain is not None
            or not isinstance(source, keyed_random.KeyedSource)):
        return records, False
    if kind.releases_from == USERS:
        if spec.bounding.model != "l0":
            return records, False
        return records | "PreReduceDistinctPairs" >> PreReduceDistinctPairs(
            spec.input.keys), True
    if _copies_apply(plan, rng_factory):
        return records | "PreReduceCopies" >> PreReduceCopies(), True
    if (spec.bounding.model == "l0" and kind.releases_from != RECORDS
            and not kind.plain_l0_bound):     # weighted_gaussian (the others: _prereduced)
        stage = keyed_random.child(rng_factory, "PerUserBound").stage
        return records | "PreReduceUsers" >> PreReduceL0(
            spec.input.keys, spec.bounding.max_keys_per_user, source, stage), False
    return records, False


_FIXED_L0 = ("use a fixed bounding.max_keys_per_user with bounding.model: l0 (its "
             "bounding drops a user's extra rows before the shuffle), or leave such users "
             "out of the input")


def _whole_user_setting(plan):
    """(spec field, remedy) of a release whose user shards hold all of a user's rows:
    each consumer refuses a user with more than ``user_shards.MAX_USER_ROWS`` rows,
    naming the field (issue 34: such a user took 1.6-5.5 GB in process). Fixed-bound l0
    bounding pre-reduces a user to about C rows per table (transforms/bounding/prereduce.py), so
    the check never fires there."""
    spec = plan.spec
    kind = kinds.get(spec.kind)
    if kind.releases_from == RECORDS:                    # heavy_hitters, quantiles
        return whole_user_setting(spec.kind)
    if spec.auto_bound and not _one_pass_auto(spec):
        return ("bounding.max_keys_per_user", "'auto' with this bounding scores every "
                "key of every user; " + _FIXED_L0)
    if spec.auto_bound:
        return ("bounding.max_keys_per_user", "'auto' reads at most 65,536 keys of a "
                "user, but this user still has more rows than that after the per-table "
                "pre-reduction; " + _FIXED_L0)
    if spec.bounding.model == "l1":
        return ("bounding.model", "l1 samples a user's records, not keys: its repeated "
                "records travel as one row with their count, but all of its distinct "
                "records meet in one place; " + _FIXED_L0)
    if kind.releases_from == USERS:
        return ("mechanism.kind", f"{spec.kind} re-bounds a user's keys in every round: "
                "a user's repeated keys travel once per table, but all of its distinct "
                "keys meet in one place; " + _FIXED_L0)
    if spec.aggregates:   # pre-reduced to exact partial totals (_prereduced, issue 43)
        if auto_columns(spec.aggregates):
            return ("aggregates", "'clip: auto' reads every key's total of every user: a "
                    "user's rows travel as one partial total per key and table, but all of "
                    "its distinct keys meet in one place; use a fixed clip, or leave such "
                    "users out of the input")
        return ("aggregates", "a user's kept keys travel as exact partial totals, one per "
                "table, but a partial total beyond the float64 range (about 1.8e308) "
                "travels as its rows; leave such values out of the input")
    if plan.domain is not None:   # a fixed l0 bound is pre-reduced (_public_domain_stages)
        return ("input.public_keys", "with a public key domain and this bounding a user's "
                "rows are bounded where they meet, not before the shuffle; " + _FIXED_L0)
    return ("mechanism.kind", f"{spec.kind} bounds a user's keys where all its rows meet; "
            "gaussian, laplace and sample_and_threshold with a fixed "
            "bounding.max_keys_per_user and bounding.model: l0 drop a user's extra rows "
            "before the shuffle, or leave such users out of the input")


def _one_pass_auto(spec):
    """``auto`` with plain l0 bounding (PerUserBound): bounded and scored in one pass
    (not adaptive's own rounds, nor a bounding with options the one pass ignores)."""
    return (spec.auto_bound and not spec.aggregates and spec.bounding.model == "l0"
            and kinds.get(spec.kind).plain_l0_bound)


def _key_shards(num_shards):
    """Shards of the automatic bound's per-key score sums: as many as the user shards, and
    never fewer than the 16 a small release uses, so one reducer's share of the keys
    shrinks as the data grows (docs/scale.md, "what breaks first"). The sums are exact
    integers and each key's pieces meet in one shard, so the count changes neither the
    scores nor the chosen bound."""
    return max(_DEFAULT_KEY_SHARDS, int(num_shards))


def _one_pass_auto_stages(records, plan, num_shards, rng_factory, spill_dir):
    """``max_keys_per_user: auto`` in one pass over the user shards
    (transforms/bounding/scored_bound.py): the bounding pass sorts each shard once and emits both
    the score's statistics and per-key counts for every candidate C; the chosen C then
    selects its counts. Same draws and same released bytes as bounding after the choice,
    without concatenating, checking and hashing the shards a second time."""
    spec = plan.spec
    keys = list(spec.input.keys)
    reduced = _prereduced_pairs(records, plan, rng_factory)
    # the shuffle alone: the bounding pass concatenates each shard itself, and the sort
    # by user that checks the shard's users also orders its ranking (one sort, not two).
    # Pre-reduced tables are combined already (about COALESCE_ROWS rows each, one chunk):
    # each is split as it comes, as the fixed bound's are (_UserShards, combined), not
    # waited for and split as two chunks (Arrow's take on chunked columns combines them
    # on every gather: auto's split at 1e7 rows cost 2.4x the fixed bound's)
    shards = ShardByUser(
        num_shards, key_columns=keys, spill_dir=spill_dir, max_user_rows=MAX_USER_ROWS,
        setting=_whole_user_setting(plan), grouped_only=True,
        coalesce_rows=1 if reduced is not records else None, marked=reduced is not records)
    records = reduced
    users = records | "ShardByUser" >> shards
    choose = ChooseContributionBound(
        keys, candidates=plan.candidates, epsilon=plan.select_stage.epsilon,
        model=spec.bounding.model, score=plan.score_name,
        score_params=plan.score_params(), max_bound=spec.bounding.auto.max_bound,
        num_key_shards=_key_shards(num_shards),
        rng_factory=keyed_random.child(rng_factory, "ChooseContributionBound"), spill_dir=spill_dir)
    bounder = ScoredPerUserBound(keys, choose.score,
                                 rng_factory=keyed_random.child(rng_factory, "PerUserBound"),
                                 num_key_shards=_key_shards(num_shards), spill_dir=spill_dir,
                                 concat=shards.concat_arguments(), count_shards=num_shards)
    scored = users | "PerUserBound" >> bounder     # the fixed pipeline's label: same salts
    chosen = bounder.statistics(scored) | "ChooseContributionBound" >> choose    # one int
    params = chosen | "ParamsForBound" >> beam.Map(_params_for, table=dict(plan.params_by_bound))
    # per-key counts at the chosen C: SumCountsPerKey(keys, num_shards) of the selected
    # running counts, which the pass split by those key shards already
    counts = bounder.counts(scored["buckets"], chosen, min(plan.candidates))
    released = kinds.get(spec.kind).release(counts, beam.pvalue.AsSingleton(params), keys,
                                            rng_factory)
    return released, chosen


def _public_domain_stages(records, plan, num_shards, rng_factory, clip_sink=None, spill_dir=None):
    """input.public_keys (paper 002 Sec. 4): records outside the domain are dropped before
    bounding, every domain key gets a zero partial count (so it comes out once even with no
    user), C is chosen by the bounded-domain rule, and every key is released with noise and
    no threshold (transforms/selection/public_domain.py)."""
    spec = plan.spec
    keys = list(spec.input.keys)
    domain = public_domain.packed_domain(records.pipeline, plan.domain, keys)   # once
    kept = records | "RestrictToDomain" >> public_domain.RestrictToDomain(domain, keys)
    # issue 43: the fixed bound's pre-reduction after the domain filter (the bounding
    # keeps a user's first C keys among its in-domain keys: those are the rows here)
    reduced = _prereduced(kept, plan, rng_factory)
    combined = reduced is not kept
    shards = _UserShards(reduced, num_shards, keys, spec.auto_bound, spill_dir,
                         combined=combined,
                         setting=_whole_user_setting(plan)
                         if not combined or spec.aggregates else None)
    chosen = None
    if spec.auto_bound:
        chosen = shards.for_choice | "ChooseDomainBound" >> public_domain.ChooseDomainBound(
            plan.domain_bound_rule(), epsilon=plan.select_stage.epsilon,
            model=spec.bounding.model,
            rng_factory=keyed_random.child(rng_factory, "ChooseDomainBound"))  # one int
    users = shards.users(chosen, min(plan.candidates))                     # Table of whole users
    clips = _choose_clips(users, plan, rng_factory, clip_sink)
    partial, params = _bound_users(users, plan, chosen, rng_factory, clips)
    zeros = records.pipeline | "DomainZeroCounts" >> public_domain.DomainZeroCounts(domain, keys)
    if spec.aggregates:   # zero grid sums beside the zero counts (pipelines/specs/aggregates.py)
        zeros = zeros | "DomainZeroSums" >> beam.Map(
            zero_sums, num_sums=len(sum_columns(spec.aggregates)))
    counts = ((partial, zeros)
              | "WithDomainKeys" >> beam.Flatten()
              | "SumCountsPerKey" >> SumCountsPerKey(keys, num_shards,
                                                   spill_dir=spill_dir))  # every domain key once
    if spec.aggregates:
        return counts | "ReleaseWithAggregates" >> ReleaseWithAggregates(
            _side(params), rng_factory=keyed_random.child(rng_factory, "ReleaseWithAggregates")
        ), chosen
    released = counts | "NoisyDomainCounts" >> public_domain.NoisyDomainCounts(
        _side(params), rng_factory=keyed_random.child(rng_factory, "NoisyDomainCounts"))
    return released, chosen


class _UserShards:
    """The user shuffle of a release (``ShardByUser``), and its consumers.

    With an automatic bound the choice of C and the bounding each concatenate the
    shuffled pieces themselves, and the bounding's concatenation reads the chosen C as a
    side input: it then runs after the choice, in the bounding's stage, and the
    concatenated shards are never materialised between stages (the in-process runner held
    them whole beside the shuffle: 1.6x the time and memory of a fixed bound). The
    shuffle itself happens once."""

    def __init__(self, records, num_shards, keys, auto_bound, spill_dir=None, combined=False,
                 setting=None, per_consumer=False):
        # combined: the tables are combined already (PreReduceL0): split each as it comes;
        # setting: what _whole_user_setting says (a user over MAX_USER_ROWS fails the run);
        # per_consumer: every consumer concatenates the shuffled pieces (:meth:`sharded`)
        self._shard = ShardByUser(num_shards, key_columns=keys, spill_dir=spill_dir,
                                  coalesce_rows=1 if combined else None,
                                  max_user_rows=MAX_USER_ROWS if setting else None,
                                  setting=setting)
        if not auto_bound and not per_consumer:
            self.for_choice = None
            self._users = records | "ShardByUser" >> self._shard
            return
        self._grouped = records | "ShardByUser" >> beam.ptransform_fn(self._shard.grouped)()
        self.for_choice = (self._grouped | "ConcatUserShardForChoice" >> self._shard.concat()
                           if auto_bound else None)
        self._users = None

    def sharded(self, chosen=None, default=None):
        """Whole users for a consumer that reads them several times (the adaptive
        rounds): ``transforms.selection.adaptive_rounds.ShardedUsers``, concatenated by
        each reader (after ``chosen``, when the bound is automatic), never materialised
        between stages (issue 43: 1.8 GB at 1e7 rows when concatenated once)."""
        after = (None if chosen is None
                 else beam.pvalue.AsSingleton(chosen, default_value=default))
        return ShardedUsers(self._grouped, self._shard, after=after)

    def users(self, chosen=None, default=None):
        """Whole users for bounding (after ``chosen``, when the bound is automatic)."""
        if self._users is None:
            after = beam.pvalue.AsSingleton(chosen, default_value=default)
            self._users = self._grouped | "ConcatUserShard" >> self._shard.concat(after=after)
        return self._users


def _choose_clips(users, plan, rng_factory, clip_sink):
    """aggregates with clip: auto: the chosen bounds (one dict), else None."""
    if not plan.spec.aggregates:
        return None
    return choose_clips(users, plan, rng_factory, clip_sink)


def _bound_users(users, plan, chosen, rng_factory, clips=None):
    """Bound every user (PerUserBound, or RandClip in the l1 model) to C — the spec's, or
    the privately chosen one as a side input — and pick the mechanism's parameters for
    that C. Returns (partial per-key counts, parameters as a one-element PCollection)."""
    spec = plan.spec
    keys = list(spec.input.keys)
    bound, params = _bound_and_params(users, plan, chosen)
    if spec.aggregates:   # l0 bound carrying each kept user's clamped grid totals
        clip_side = None
        if clips is not None:
            clip_side = beam.pvalue.AsSingleton(clips)
            if not isinstance(params, beam.pvalue.PCollection):   # a fixed bound
                params = users.pipeline | "Params" >> beam.Create([params])
            params = params | "ApplyClips" >> beam.Map(apply_clips, clips=clip_side)
        partial = users | "PerUserBound" >> PerUserBoundWithValues(
            keys, bound, sum_columns(spec.aggregates),
            rng_factory=keyed_random.child(rng_factory, "PerUserBound"), clips=clip_side)
    elif spec.bounding.model == "l1":
        # rows carry __copies (_prereduced_heavy): the count-aware kernel, same kept records
        clipper = RandClipCopies if _copies_apply(plan, rng_factory) else RandClip
        partial = users | "RandClip" >> clipper(
            keys, bound, rng_factory=keyed_random.child(rng_factory, "RandClip"))
    else:   # a kind may bound with weights (weighted_gaussian: WeightedPerUserBound)
        kind = kinds.get(spec.kind)
        bounder = kind.per_user_bound()
        options = kind.bound_options(spec.mechanism)
        partial = users | "PerUserBound" >> bounder(
            keys, bound, rng_factory=keyed_random.child(rng_factory, "PerUserBound"), **options)
    return partial, params


def _bound_and_params(users, plan, chosen):
    """The bound C (the spec's int, or the chosen one as a side input) and the
    mechanism's parameters for it: a one-element PCollection after a private choice, the
    calibrated dict itself for the spec's C (handed to the release DoFns as an argument,
    as a side input would hand it: no stage of its own)."""
    if chosen is not None:
        bound = beam.pvalue.AsSingleton(chosen, default_value=min(plan.candidates))
        params = chosen | "ParamsForBound" >> beam.Map(_params_for, table=dict(plan.params_by_bound))
    else:
        bound = plan.spec.bounding.max_keys_per_user
        params = plan.params_by_bound[bound]
    return bound, params


def _side(params):
    """What the release transforms take: a side input of a PCollection, a dict as is."""
    if isinstance(params, beam.pvalue.PCollection):
        return beam.pvalue.AsSingleton(params)
    return params


def _params_for(bound, table):
    return table[int(bound)]


def _metrics(result):
    try:
        counters = result.metrics().query(
            beam.metrics.MetricsFilter().with_namespace(io.NOT_PRIVATE))["counters"]
    except Exception:  # noqa: BLE001 - some runners do not report metrics
        return {}
    out = {}
    for c in counters:
        out[c.key.metric.name] = out.get(c.key.metric.name, 0) + (c.committed or c.attempted or 0)
    return out


def run(plan, beam_args=(), overwrite=False, rng_factory=None):
    """Run the release; returns the report written beside the output.

    With a ``budget`` section the release's (epsilon, delta) is reserved in the ledger
    before any input is opened, and committed once published (``pipelines.ledger``).

    Randomness: every draw is keyed by a release secret drawn once from the OS CSPRNG
    inside the pipeline, as a materialised singleton side input
    (``transforms.randomness.keyed_random.PipelineSecret``; never in the pipeline graph, never logged
    or written anywhere), so runners that retry or recompute stages draw the same values.
    ``rng_factory`` is for tests (a ``KeyedSource`` with a fixed secret, or
    ``keyed_random.seeded_for_tests(seed)``: public identities, no privacy claim): then
    every stage uses it as is."""
    refuse_graph_saving(beam_args, "by thresher's release")   # before the ledger is asked
    with ledger.reservation_for(plan) as reservation:
        report = _run(plan, beam_args, overwrite, rng_factory, reservation)
        if reservation is not None:
            reservation.commit(output=os.path.abspath(plan.spec.output.path)
                               if "://" not in plan.spec.output.path else plan.spec.output.path)
    return report


def _run(plan, beam_args, overwrite, rng_factory, reservation):
    spec = plan.spec
    files = input_files(spec.input)
    est_rows = io.check_input(spec.input, files)
    final = spec.output.path
    if not publish.is_remote(final) and os.path.islink(final.rstrip("/")):
        final = os.path.realpath(final)   # follow a symlinked output folder, never replace it
    publish.check_output(final, overwrite)
    options, runner_name = pipeline_options(beam_args)
    with claim(final) as held:          # one run at a time into an output (pipelines/dataio/claim.py)
        publish.check_output(final, overwrite)   # again: a run may have published meanwhile
        held.remove_stale_staging()
        return _run_claimed(plan, files, est_rows, final, options, runner_name, rng_factory,
                            reservation)


def _run_claimed(plan, files, est_rows, final, options, runner_name, rng_factory, reservation):
    staging = publish.staging_path(final)
    started = time.time()
    try:
        beam_runner = _make_runner(runner_name)
        pipeline = beam.Pipeline(runner=beam_runner, options=options)
        if rng_factory is None:           # the secret is drawn inside the pipeline
            keyed = keyed_random.PipelineSecret.draw(pipeline)
        else:                             # tests: a fixed KeyedSource, or seeded_for_tests
            keyed = rng_factory           # (the reader refuses any other source)
        # every stage draws from the release secret, handed to it by build
        build(pipeline, plan, files, est_rows, staging, rng_factory=keyed)
        progress.watch(beam_runner)       # live metrics of the in-process runner
        if reservation is not None:
            reservation.reading()         # from here on a failure keeps the charge
        result = pipeline.run()           # returns at once on distributed runners:
        progress.watch(result)            # their result's metrics are polled meanwhile
        result.wait_until_finish()
        signals.check()                   # a SIGTERM that library code swallowed
        publish.remove_sink_scratch(staging)
        report_text = publish.read_text(publish.join(staging, io.REPORT_FILE))
        if report_text is None or not publish.released_files(staging):
            raise InputError("the pipeline finished but wrote no released file; nothing was published")
        report = json.loads(report_text)    # what WriteRelease wrote, returned as published
        signals.check()
        if reservation is not None:
            reservation.publishing()      # from here on the release stays charged
        publish.promote(staging, final)
    except BaseException:
        publish.discard(staging)
        raise
    diagnostics = _metrics(result)
    log.info("operator diagnostics (NOT differentially private, do not publish): %s; "
             "wall time %.2f s", json.dumps(diagnostics, sort_keys=True), time.time() - started)
    return report

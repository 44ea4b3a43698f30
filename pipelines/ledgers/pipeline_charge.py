"""The ledger charge of a release built into a Beam pipeline (``pipelines.beam_yaml``'s
``ThresherRelease``, ``thresher.Release``): once per *run*, never per build.

The release secret is drawn inside the pipeline (``keyed_random.PipelineSecret``), so each
``run()`` of one pipeline object is a new release with new noise. Charging when the
transform is applied charged one of them; here the charge is a stage of the pipeline:

- ``LedgerCharge`` (Impulse -> a DoFn with the secret's side input) derives a **run
  token** from the run's secret, a PRF output under a reserved stage name containing a
  NUL (like ``user_identity.IDENTITY_STAGE``; the secret never leaves the worker), and
  reserves with it (``ledger.reserve_charge(..., run_token=...)``): the ledger charges a
  token once, so a retried or recomputed reservation of the same run (the same secret,
  materialised once by the secret's Reshuffle) charges nothing more, and a second run
  (a new secret) is a second charge, refused like any release the budget cannot fit.
- The release's first stage that reads a row (``ToRecords``) and both outputs
  (``released``, ``report``) read the charge's one element as a side input. A runner
  must have a side input ready before it processes an element of the stage that reads
  it (the Beam model), so on every runner the charge is in the ledger before the release
  reads a row: a run that then fails on its data stays charged (issue 42; before, the
  charge was a branch with no order against reading). A refused charge fails the run
  with the ledger's message, nothing read by the release or written by its outputs.
- The reservation checks a token it finds against the dataset, spec digest and charge
  (``lifecycle._check_token_row``): one secret reused for another release is refused. A
  new token for a spec already charged under earlier tokens (the same Beam YAML pipeline
  run again) is charged and said in a warning: its sinks may replace the earlier output.

The workers must reach the ledger: a PostgreSQL ledger (a server the workers connect
to), or a SQLite file under the runners whose workers run on the machine that built the
pipeline (Beam's in-process runners and Prism, without a docker or external worker
environment). Every other combination is refused when the pipeline is built (SpecError
naming ``budget.ledger``, exit 2): a worker elsewhere would create or lock another file
of that name, charging a ledger nobody reads. The SQLite path is made absolute when the
pipeline is built (workers may run in another folder).

Recorded like the CLI's release (same dataset, name, charge and config hash), state
``published`` at once with output ``beam pipeline: <label>``: thresher cannot see where
or whether the pipeline writes its outputs, so from the charge on the release counts as
spent (a run that later fails stays charged: the safe side). The CLI keeps its order:
reserve before reading, publish, mark (``pipelines.ledgers.ledger``).
"""
import dataclasses
import logging
import os

import apache_beam as beam
from apache_beam.options.pipeline_options import PortableOptions

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import ledger, store
from thresher.transforms.randomness import keyed_random

RUN_TOKEN_STAGE = "\x00thresher/ledger-run-token"    # NUL: no Beam label is this stage
# Runners whose Python workers run on the machine that builds the pipeline.
LOCAL_RUNNERS = ("DirectRunner", "SwitchingDirectRunner", "BundleBasedDirectRunner",
                 "FnApiRunner", "PrismRunner")
LOCAL_ENVIRONMENTS = (None, "", "LOOPBACK", "PROCESS", "EMBED")


def workers_reach(budget, pipeline):
    """The budget section with a SQLite path made absolute, or SpecError naming
    ``budget.ledger`` when the pipeline's workers could not reach this ledger."""
    if not store.backend_for(budget.ledger).is_file:
        return budget
    runner = type(pipeline.runner).__name__ if pipeline.runner is not None else "DirectRunner"
    environment = pipeline.options.view_as(PortableOptions).environment_type
    if runner not in LOCAL_RUNNERS or (environment or "").upper() not in (
            e or "" for e in LOCAL_ENVIRONMENTS):
        where = runner + (f" with environment_type {environment}" if environment else "")
        raise SpecError("budget.ledger", f"a SQLite ledger ({budget.ledger!r}) is a file on "
                        f"this machine, and the release is charged by a worker of the pipeline "
                        f"when it runs ({where}), which may be on another machine and would "
                        f"charge another file; use a PostgreSQL ledger (postgresql://...) that "
                        f"the workers reach, or Beam's in-process or Prism runner")
    return dataclasses.replace(budget, ledger=os.path.abspath(budget.ledger))


def check_fits(plan):
    """At build time: SpecError naming ``budget`` (or the mode fields) when the ledger
    already cannot fit the release (read only; the run decides, under its lock)."""
    seen = ledger.preview(plan)
    if seen.refuses:
        raise SpecError(seen.field, seen.text)


class ChargeRun(beam.DoFn):
    """Impulse -> the ledger row id of this run's charge (module docstring)."""

    def __init__(self, budget, name, config_sha256, charge, output, rng_factory):
        self._budget = budget
        self._name = name
        self._sha = config_sha256
        self._charge = charge
        self._output = output
        self._rng_factory = rng_factory      # the release's KeyedSource (its secret)

    def process(self, _):
        token = self._rng_factory.stage_key(RUN_TOKEN_STAGE)[:16].hex()
        reservation = ledger.reserve_charge(self._budget, self._name, self._sha, self._charge,
                                            run_token=token, output=self._output)
        if reservation.charged and reservation.earlier:
            # A second run of the same release (Beam YAML run twice): a new release with
            # new noise, charged again, whose sinks may replace the first one's output --
            # said, not silent (issue 42)
            logging.getLogger("thresher").warning(
                "ledger %s: this run is a new release of %r on dataset %r, charged "
                "again (release %d); the same spec was already released %d time%s in this "
                "ledger. If the pipeline's sinks write where the earlier run wrote, they "
                "replace its output: the earlier release stays charged either way",
                store.where(self._budget.ledger), self._name, self._budget.dataset,
                reservation.row_id, reservation.earlier,
                "" if reservation.earlier == 1 else "s")
        yield reservation.row_id


def charge_when_run(pipeline, plan, source, label):
    """The PCollection of this run's one charge (a ledger row id), for a side input that
    gates the release's outputs; applied inside the release's ``expand`` (its stages are
    the release's). ``plan.spec.budget`` must have passed :func:`workers_reach`."""
    spec = plan.spec
    charge = ledger.full_charge(plan)
    return (pipeline
            | "LedgerCharge" >> beam.Impulse()
            | "LedgerChargeReserve" >> keyed_random.par_do(ChargeRun(
                spec.budget, spec.name, ledger.config_sha256(spec), charge,
                f"beam pipeline: {label or 'ThresherRelease'}", source)))

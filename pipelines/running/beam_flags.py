"""The Beam options a user passes after ``--``: checked with Beam's own parser, so a
misspelt flag is an error naming it (Beam would drop it with a warning and run anyway),
and a Beam flag put before ``--`` gets a hint.
"""
import difflib
import logging

from thresher.pipelines.errors import InputError, SpecError

_BEAM_OPTIONS_LOGGER = "apache_beam.options.pipeline_options"


class _Discarded(logging.Handler):
    """Collects what Beam's option parser reports as discarded ("unparseable")."""

    def __init__(self):
        super().__init__(level=logging.WARNING)
        self.args = []

    def emit(self, record):
        if "unparseable" in record.msg and record.args:
            found = record.args[0] if isinstance(record.args, tuple) else record.args
            if isinstance(found, (list, tuple)):
                self.args.extend(str(a) for a in found)


def known_option_names():
    """Every option name Beam's PipelineOptions know (all registered option groups)."""
    from apache_beam.options.pipeline_options import PipelineOptions  # heavy: apache_beam
    return set(PipelineOptions([]).get_all_options(drop_default=False))


def unknown(beam_args):
    """The arguments Beam's parser does not understand: flags (``--runnr``) and stray
    words (a value with no flag). Beam reports them as "unparseable" and drops them."""
    from apache_beam.options.pipeline_options import PipelineOptions  # heavy: apache_beam
    logger = logging.getLogger(_BEAM_OPTIONS_LOGGER)
    handler = _Discarded()
    old_level, old_propagate = logger.level, logger.propagate
    logger.addHandler(handler)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    try:
        options = PipelineOptions(list(beam_args))
        known = options.get_all_options(retain_unknown_options=False)
        retained = options.get_all_options(retain_unknown_options=True)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(old_level)
        logger.propagate = old_propagate
    bad, after_flag = [], False
    for token in handler.args:
        if token.startswith("-"):
            bad.append(token.split("=", 1)[0])
            after_flag = "=" not in token
        elif after_flag:
            after_flag = False          # the value of the unknown flag before it
        else:
            bad.append(token)
    # Should Beam stop logging what it discards, its retained unknown options still tell.
    bad += [f"--{name}" for name in retained if name not in known and f"--{name}" not in bad]
    return bad


def check(beam_args):
    """SpecError naming the first argument after ``--`` that Beam does not know, or the
    first option that saves the graph for later launches (:data:`GRAPH_SAVING`)."""
    if not beam_args:
        return
    bad = unknown(beam_args)
    if not bad:
        refuse_graph_saving(beam_args)
        check_runner(beam_args)
        return
    first = bad[0]
    if first.startswith("-"):
        close = difflib.get_close_matches(first.lstrip("-"), sorted(known_option_names()), n=1)
        hint = f" (did you mean --{close[0]}?)" if close else ""
        raise SpecError("", f"unknown Beam option {first} after --{hint}; nothing was run "
                            f"(docs/running.md lists the runners' options)")
    raise SpecError("", f"Beam cannot use {first!r} after --: Beam options are flags such "
                        f"as --runner=DirectRunner; nothing was run")


# Options that save the pipeline graph to be launched later (or launch one saved
# earlier): every launch of a saved graph would reuse one release's noise and sampling
# while the ledger charges one release (issue 25 F4). docs/running.md lists them.
GRAPH_SAVING = {
    "template_location": "saves a Dataflow template, launched later any number of times",
    "dataflow_job_file": "writes the Dataflow job (the pipeline graph) to a file",
    "output_executable_path": "writes a Flink/Spark executable jar instead of running",
    "create_from_snapshot": "creates the job from a saved Dataflow snapshot",
}


def refuse_dask(runner):
    """Beam's DaskRunner publishes wrong releases, and it recomputes side inputs per
    partition: the release secret (drawn inside the pipeline and pinned by a Reshuffle,
    transforms.randomness.keyed_random.PipelineSecret) could take a different value in each consumer.
    ``runner``: a runner name or a runner object."""
    name = runner if isinstance(runner, str) else type(runner).__name__ if runner else ""
    if name.rsplit(".", 1)[-1].lower() in ("daskrunner", "dask"):
        raise InputError("--runner=DaskRunner is not supported: Beam's Dask runner drops "
                         "outputs of finish_bundle, mixes tagged outputs, ignores "
                         "Reshuffle and recomputes side inputs (the release secret among "
                         "them), so it publishes wrong releases (docs/running.md)")


def check_runner(beam_args):
    """SpecError naming ``--runner`` when Beam has no runner by that name (issue 36 D3: an
    internal error, exit 1, before): the runner is made the way ``beam.Pipeline`` makes it
    (``apache_beam.runners.runner.create_runner``: a known name, case-insensitive, with or
    without "Runner", or the full name of a PipelineRunner class), before anything runs."""
    # heavy: apache_beam
    from apache_beam.options.pipeline_options import PipelineOptions, StandardOptions
    from apache_beam.runners.runner import create_runner  # heavy: apache_beam
    name = PipelineOptions(list(beam_args)).view_as(StandardOptions).runner
    if not name or not isinstance(name, str):
        return
    refuse_dask(name)          # a runner thresher refuses by name says why (docs/running.md)
    try:
        create_runner(name)
    except (ValueError, ImportError, AttributeError, TypeError) as exc:
        known = ", ".join(StandardOptions.KNOWN_RUNNER_NAMES)
        why = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        detail = ("" if isinstance(exc, ValueError)
                  else f" ({type(exc).__name__}: {why[:300]})")
        raise SpecError("--runner", f"Beam has no runner {name!r}{detail}; the runners are "
                        f"{known}, or the full name of a PipelineRunner class "
                        f"(docs/running.md); nothing was run") from None


def refuse_graph_saving(options, where="after --"):
    """SpecError naming the first option (``PipelineOptions`` or Beam's flags) that saves
    the graph for later launches: thresher's ledger cannot charge launches it never sees."""
    from apache_beam.options.pipeline_options import PipelineOptions  # heavy: apache_beam
    if options is None:
        return
    if not isinstance(options, PipelineOptions):
        if not list(options):
            return     # no flags save nothing (and Beam's full option parser costs ~0.02 s)
        options = PipelineOptions(list(options))
    given = options.get_all_options(drop_default=True)
    for name, why in GRAPH_SAVING.items():
        if given.get(name) not in (None, False, ""):
            raise SpecError(f"--{name}", f"refused ({where}): it {why}; every launch of a "
                            f"saved graph would reuse this release's noise and sampling while "
                            f"the privacy ledger charges one release. Run the release itself "
                            f"each time (docs/running.md, options thresher refuses)")


def beam_flags_among(words):
    """Those of ``words`` that are Beam flags (``--runner=X``, ``--runner``), for the hint
    when they were given before ``--``."""
    names = known_option_names()
    return [w for w in words
            if w.startswith("--") and w[2:].split("=", 1)[0] in names]

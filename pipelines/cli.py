"""The ``thresher`` command line.

    thresher run CONFIG [--overwrite] [-- <Beam pipeline options>]
    thresher plan CONFIG [--json]
    thresher validate CONFIG
    thresher ledger show LEDGER [--dataset D] [--json]
    thresher ledger reservations LEDGER [--dataset D] [--json]
    thresher ledger release LEDGER ID [--force]
    thresher ledger set-budget LEDGER DATASET --epsilon E [--delta D] [--threshold-delta D0] [--force]
    thresher show OUTPUT [--format table|csv|json] [--top N]
    thresher schema
    thresher report OUTPUT [--html [FILE] [--overwrite]]
    thresher engines fetch flink|spark|prism [...] [--flink-version X.Y]
    thresher engines check flink|spark|prism... [--rows N] [--workers N] [--json]

Usage and spec errors print one line naming the field and exit with code 2; no
traceback unless ``--debug`` is given.
"""
import argparse
import contextlib
import io
import json
import logging
import math
import os
import re
import signal
import sys
import threading

from thresher.pipelines import __version__

from thresher.pipelines.reports import look, summary
from thresher.pipelines.reports.look import FORMATS, _discard_stdout, positive_rows
from thresher.pipelines.running import process, run_workers, signals
from thresher.pipelines.errors import SpecError, ThresherError

EXIT_USAGE = 2
EXIT_INTERNAL = 1
EXIT_TERMINATED = 143      # 128 + SIGTERM, as a shell reports a process it terminated


class _Parser(argparse.ArgumentParser):
    def error(self, message):
        self.print_usage(sys.stderr)
        print(f"thresher: error: {message}", file=sys.stderr)
        sys.exit(EXIT_USAGE)


def _parser():
    parser = _Parser(prog="thresher", description=(
        "Differentially private histograms with user-level privacy, as Apache Beam pipelines."))
    parser.add_argument("--version", action="version", version=f"thresher {__version__}")
    parser.add_argument("--debug", action="store_true", help="show tracebacks and Beam's logs")
    # --debug also after the subcommand (thresher run spec.yaml --debug); SUPPRESS keeps a
    # --debug given before it.
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--debug", action="store_true", default=argparse.SUPPRESS,
                        help="show tracebacks and Beam's logs")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser(
        "run", parents=[common], help="run a release; Beam options go after --",
        usage="thresher run CONFIG [--overwrite] [-q | --quiet] [--progress | --no-progress] "
              "[--debug] [-- <Beam options>]",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Beam options go after --, unchanged, for example:\n"
               "  thresher run release.yaml -- --runner=DirectRunner\n"
               "  thresher run release.yaml -- --direct_running_mode=multi_processing "
               "--direct_num_workers=2\n"
               "  thresher run release.yaml -- --runner=DataflowRunner --project=P "
               "--region=R --temp_location=gs://B/tmp --setup_file=./setup.py\n"
               "An option Beam does not know is an error. docs/running.md has each runner.")
    run.add_argument("config", help="release spec (YAML)")
    run.add_argument("--overwrite", action="store_true", help="replace an earlier release in output.path")
    run.add_argument("--timeout", type=float, default=None, metavar="S",
                     help="stop the run, and every process it started, if it has not "
                          "finished after S seconds (nothing is published; for engines whose "
                          "jobs can wait forever, docs/running.md, Engines)")
    run.add_argument("-q", "--quiet", action="store_true",
                     help="print only errors (no summary, no progress unless --progress)")
    run.add_argument("--period", type=int, default=None, metavar="P",
                     help="a continual release's period, 1..continual.horizon (docs/continual.md)")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress lines on stderr (stages, rows read); default: on when "
                          "stderr is a terminal")
    plan = sub.add_parser("plan", parents=[common],
                          help="calibrated parameters and the privacy guarantee; reads no data")
    plan.add_argument("config")
    plan.add_argument("--json", action="store_true", help="print the plan as the report's JSON")
    plan.add_argument("-v", "--verbose", action="store_true",
                      help="every parameter (each candidate bound's), the accounting in full")
    plan.add_argument("--users", type=positive_rows, default=2000, metavar="N",
                      help="users per key for the aggregates' expected errors (default 2000)")
    validate = sub.add_parser("validate", parents=[common],
                              help="check a spec (and that its input has the columns)")
    validate.add_argument("config")
    show = sub.add_parser("show", parents=[common],
                          help="the released rows of a published release (a table of the top "
                               "keys, or CSV / JSON lines)")
    show.add_argument("output", help="a release's output folder")
    show.add_argument("--format", choices=FORMATS, default="table",
                      help="table (default): the top keys, aligned; csv or json (one object "
                           "per line): every released row, streamed")
    show.add_argument("--top", type=positive_rows, default=None, metavar="N",
                      help="only the N rows with the largest released value (default 20 "
                           "for the table, every row for csv and json)")
    report = sub.add_parser("report", parents=[common],
                            help="a readable report of a published release (text, or an "
                                 "HTML page with --html)")
    report.add_argument("output", help="a release's output folder")
    report.add_argument("--html", nargs="?", const="", default=None, metavar="FILE",
                        help="write a self-contained HTML page with plots (default "
                             "OUTPUT/release_report.html); needs the report extra (matplotlib)")
    report.add_argument("--overwrite", action="store_true",
                        help="with --html: replace FILE even if it is not an earlier report "
                             "page (an earlier page is replaced without it)")
    sub.add_parser("schema", parents=[common],
                   help="print the spec's JSON Schema (for editors and linters)")
    engines = sub.add_parser("engines", help="the Flink/Spark job servers and Prism, fetched once")
    engines_sub = engines.add_subparsers(dest="engines_command", required=True, parser_class=_Parser)
    fetch = engines_sub.add_parser(
        "fetch", parents=[common],
        help="fetch job-server jars (Maven) / build Prism (go install) into the cache")
    fetch.add_argument("engine", nargs="+", choices=["flink", "spark", "prism"])
    fetch.add_argument("--flink-version", default=None, choices=["1.19"],
                       help="the Flink major.minor of the Flink job server: only those whose "
                            "Beam runner jar the registry serves (default 1.19)")
    check = engines_sub.add_parser(
        "check", parents=[common],
        help="one release of synthetic records under one fresh secret, in process and on "
             "each engine: are the published bytes the same? (exit 1 when not)")
    check.add_argument("engine", nargs="+", choices=["flink", "spark", "prism"])
    check.add_argument("--rows", type=positive_rows, default=200_000, metavar="N",
                       help="synthetic records (default 200,000)")
    check.add_argument("--workers", type=positive_rows, default=1, metavar="N",
                       help="Python SDK worker processes per engine run, and the engine's "
                            "parallelism (default 1: the work runs in the launcher)")
    check.add_argument("--timeout", type=float, default=1800.0, metavar="S",
                       help="seconds per run before it is stopped (default 1800)")
    check.add_argument("--json", action="store_true",
                       help='print a JSON list of {"engine", "workers", "rows", "seconds", '
                            '"identical"}')
    ledger = sub.add_parser("ledger", help="the privacy-budget ledger (spec section budget:)")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, parser_class=_Parser)
    show = ledger_sub.add_parser("show", parents=[common],
                                 help="each dataset's budget, what is spent, every release")
    show.add_argument("ledger", help="the ledger file (budget.ledger of a spec)")
    show.add_argument("--dataset", help="only this dataset")
    show.add_argument("--json", action="store_true", help="print JSON")
    held = ledger_sub.add_parser("reservations", parents=[common],
                                 help="open reservations: runs going on, or killed ones whose "
                                      "charge stayed")
    held.add_argument("ledger", help="the ledger file or postgresql:// URL")
    held.add_argument("--dataset", help="only this dataset")
    held.add_argument("--json", action="store_true", help="print JSON")
    free = ledger_sub.add_parser("release", parents=[common],
                                 help="delete an open reservation whose run has ended "
                                      "(docs/robustness.md, Ledger operations)")
    free.add_argument("ledger", help="the ledger file or postgresql:// URL")
    free.add_argument("id", type=_ledger_id, help="the reservation's id (thresher ledger "
                                                  "reservations)")
    free.add_argument("--force", action="store_true",
                      help="also when its owner runs on another host or is still running "
                           "(that run then refuses to publish)")
    totals = ledger_sub.add_parser("set-budget", parents=[common],
                                   help="change a dataset's total (recomputes rho_B; "
                                        "recorded in the ledger)")
    totals.add_argument("ledger", help="the ledger file or postgresql:// URL")
    totals.add_argument("dataset", help="the dataset whose total changes")
    totals.add_argument("--epsilon", type=_finite_number, required=True,
                        help="the new total epsilon over all releases on the dataset")
    totals.add_argument("--delta", type=_finite_number, default=None,
                        help="the new total delta (default: unchanged)")
    totals.add_argument("--threshold-delta", type=_finite_number, default=None,
                        help="zcdp datasets: the new delta0_B (default: unchanged)")
    totals.add_argument("--force", action="store_true",
                        help="also when the new total is below what the dataset has spent "
                             "(it then admits no release until raised)")
    return parser


def _split_beam_args(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _print_plan(plan, as_json, verbose=False, users=2000):
    report = plan.report()
    if as_json:
        from thresher.pipelines.dataio.publish import report_text  # heavy: pyarrow.parquet
        print(report_text(report), end="")      # strict JSON, as the published report
        return
    # heavy: start-up of thresher --help
    from thresher.pipelines.reports.plan_text import format_plan, format_short
    if not verbose:
        print("\n".join(format_short(plan, report, users)))
        return
    print("\n".join(format_plan(plan, report)))
    if plan.spec.aggregates:
        from thresher.pipelines.specs.aggregates import print_plan  # heavy: pyarrow
        print_plan(plan, users)


def _configure_logging(debug, quiet):
    level = logging.DEBUG if debug else (logging.ERROR if quiet else logging.INFO)
    logging.basicConfig(level=logging.WARNING, format="%(message)s")
    logging.getLogger("thresher").setLevel(level)
    if not debug:
        # CRITICAL: Beam logs a worker's exception (with its traceback) at ERROR before
        # re-raising it; the CLI reports that exception itself, in one line.
        for noisy in ("apache_beam", "root"):
            logging.getLogger(noisy).setLevel(logging.CRITICAL)
        logging.getLogger().setLevel(logging.CRITICAL)
        logging.getLogger("thresher").setLevel(level)
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("thresher: %(message)s"))
        logger = logging.getLogger("thresher")
        logger.handlers[:] = [handler]
        logger.propagate = False


# Beam appends the stage's name to an exception a DoFn raised ("... [while running
# 'Read/ReadText']"); a thresher error's message is complete without it (issue 42).
_STAGE_SUFFIX = re.compile(r" \[while running '[^\n]*'\]$")
_WRAPPED = re.compile(r"(SpecError|InputError|CalibrationError|ThresherError): (.+?)(?:\s\[while running|$)",
                      re.S)


def _user_error_in(exc):
    """A thresher error raised on a Beam worker comes back wrapped; find its message."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ThresherError):
            return _STAGE_SUFFIX.sub("", str(exc))
        exc = exc.__cause__ or exc.__context__
    return None


def _user_error_in_text(text):
    match = _WRAPPED.search(text)
    return match.group(2).strip().splitlines()[0] if match else None


def main(argv=None):
    # The Ctrl-C handler comes first: an interrupt at any point of the command, start-up
    # included (parsing, calibrating, importing Beam), ends it with one line and exit 130
    # (issue 36 D14: a raw KeyboardInterrupt traceback before).
    interrupted = []
    restore_sigint = _watch_sigint(interrupted)
    outcome = [None]       # what the command would have written, for the closing line
    try:
        return _main(argv, interrupted, outcome)
    except KeyboardInterrupt:
        return _interrupted(interrupted, outcome[0])
    finally:
        if restore_sigint is not None:
            signal.signal(signal.SIGINT, restore_sigint)


def _main(argv, interrupted, outcome):
    argv = list(sys.argv[1:] if argv is None else argv)
    own, beam_args = _split_beam_args(argv)
    process.memoize_translation_lookups()      # argparse's gettext look-ups, once each
    parser = _parser()
    args, extra = parser.parse_known_args(own)
    if extra:
        # heavy: start-up of thresher --help
        from thresher.pipelines.running.beam_flags import beam_flags_among
        beam = beam_flags_among(extra)
        if beam:
            print(f"thresher: error: {' '.join(beam)} {'is a Beam option' if len(beam) == 1 else 'are Beam options'}: "
                  f"put Beam options after --, e.g. thresher run CONFIG -- {' '.join(beam)}",
                  file=sys.stderr)
            return EXIT_USAGE
        parser.error(f"unrecognized arguments: {' '.join(extra)}")
    if beam_args and args.command != "run":
        print("thresher: error: Beam options after -- are only for 'thresher run'", file=sys.stderr)
        return EXIT_USAGE
    outcome[0] = _unwritten(args)
    _configure_logging(args.debug, getattr(args, "quiet", False))
    process.prepare(args.command)
    restore = signals.install(run_workers.stop) if args.command == "run" else (lambda: None)
    unmark = run_workers.mark() if args.command == "run" else (lambda: None)
    saved_excepthook = threading.excepthook
    if not args.debug:
        # Beam's worker-watching threads raise when a worker dies (Ctrl-C, a crash) and
        # Python prints each with a traceback; the main thread reports the failure once.
        threading.excepthook = _log_thread_exception
    try:
        with _quiet_workers(args.debug, beam_args):
            return _dispatch(args, beam_args)
    except ThresherError as exc:
        if interrupted:
            return _interrupted(interrupted, outcome[0])
        if args.debug:
            raise
        print(f"thresher: error: {_STAGE_SUFFIX.sub('', str(exc))}", file=sys.stderr)
        return exc.exit_code
    except BrokenPipeError:
        # stdout's reader went away (thresher plan ... | head -1): a normal end, as in
        # show and report (pipelines/reports/look.py)
        _discard_stdout()
        return 0
    except KeyboardInterrupt:
        return _interrupted(interrupted, outcome[0])
    except signals.Terminated:
        return _terminated()
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if signals.requested():
            # SIGTERM raised inside a DoFn comes back wrapped by the runner: still SIGTERM.
            return _terminated()
        if interrupted or _caused_by_interrupt(exc):
            # Ctrl-C reaches Beam's workers too; the runner then reports their failure
            # (a RuntimeError mentioning KeyboardInterrupt, a dead worker): still Ctrl-C.
            return _interrupted(interrupted, outcome[0])
        if args.debug:
            raise
        message = _user_error_in(exc) or _user_error_in_text(str(exc))
        if message:
            print(f"thresher: error: {message}", file=sys.stderr)
            return EXIT_USAGE
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"thresher: internal error ({type(exc).__name__}): {first[:500]}\n"
              f"thresher: {outcome[0] + '; ' if outcome[0] else ''}rerun with --debug for "
              f"the traceback", file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        process.finish()                # the calibration cache is on for this command only
        restore()
        unmark()
        threading.excepthook = saved_excepthook


def _unwritten(args):
    """What a failed or interrupted command left unwritten, for its closing line: a run
    publishes nothing, ``report --html`` writes no page; the others write no file."""
    if args.command == "run":
        return "nothing was published"
    if args.command == "report" and getattr(args, "html", None) is not None:
        return "no page was written"
    return None


def _log_thread_exception(hook_args):
    logging.getLogger("thresher").debug(
        "thread %s: %s: %s", getattr(hook_args.thread, "name", "?"),
        hook_args.exc_type.__name__, hook_args.exc_value)


EXIT_INTERRUPTED = 130


def _terminated():
    run_workers.stop()           # multi-processing workers stop with us
    print("thresher: terminated (SIGTERM); nothing was published", file=sys.stderr)
    return EXIT_TERMINATED


def _interrupted(signalled=(), unwritten="nothing was published"):
    """Report an interrupt. After a real SIGINT the process ends here: the release has
    already been discarded (release.run cleans up on any exception), and Beam's threads
    that watch the stopped workers would otherwise keep the interpreter alive or print
    their failures while it shuts down."""
    run_workers.stop()
    print(f"thresher: interrupted{'; ' + unwritten if unwritten else ''}", file=sys.stderr)
    if signalled:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(EXIT_INTERRUPTED)
    return EXIT_INTERRUPTED


def _caused_by_interrupt(exc):
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, KeyboardInterrupt) or "KeyboardInterrupt" in str(exc):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _watch_sigint(interrupted):
    """Note every SIGINT (then raise KeyboardInterrupt as Python does), so that however
    the interrupt surfaces (in this process or as a worker's failure) the exit is 130."""
    if threading.current_thread() is not threading.main_thread():
        return None

    def on_sigint(signum, frame):
        interrupted.append(signum)
        signals.note_interrupt()      # a swallowed KeyboardInterrupt still stops the release
        # Stop the worker processes first: Beam's clean-up, which the KeyboardInterrupt
        # runs through, joins them, and a worker that got no signal never exits.
        run_workers.stop()
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGINT, on_sigint)
    except ValueError:
        return None


@contextlib.contextmanager
def _quiet_workers(debug, beam_args):
    """Beam's multi-processing workers are child processes that log (tracebacks included)
    to the inherited standard error. Unless --debug, point their file descriptor 2 at
    /dev/null while the pipeline runs; thresher's own messages keep the real stderr."""
    if debug or not any("multi_processing" in a for a in beam_args):
        yield
        return
    try:
        real = os.dup(2)
    except OSError:
        yield
        return
    real_stream = os.fdopen(real, "w", buffering=1, encoding="utf-8", errors="replace")
    saved_stderr = sys.stderr
    handlers = logging.getLogger("thresher").handlers
    devnull = os.open(os.devnull, os.O_WRONLY)
    sys.stderr.flush()
    os.dup2(devnull, 2)
    os.close(devnull)
    if getattr(saved_stderr, "fileno", None) and _is_fd2(saved_stderr):
        sys.stderr = real_stream
        for handler in handlers:
            if isinstance(handler, logging.StreamHandler):
                handler.setStream(real_stream)
    try:
        yield
    finally:
        real_stream.flush()
        os.dup2(real, 2)
        if sys.stderr is real_stream:
            sys.stderr = saved_stderr
            for handler in handlers:
                if isinstance(handler, logging.StreamHandler):
                    handler.setStream(saved_stderr)
        real_stream.close()


def _is_fd2(stream):
    try:
        return stream.fileno() == 2
    except (OSError, ValueError, io.UnsupportedOperation):
        return False


def _dispatch(args, beam_args):
    if args.command == "ledger":
        return _ledger_command(args)
    if args.command == "engines":
        return _engines_command(args)
    if args.command == "schema":
        from thresher.pipelines.specs.schema import json_schema  # heavy: pyarrow
        print(json.dumps(json_schema(), indent=2))
        return 0
    if args.command in ("show", "report"):
        return _look_command(args)
    if args.command == "run":
        from thresher.pipelines.common import progress  # heavy: start-up of thresher --help
        show_progress = args.progress if args.progress is not None else (
            sys.stderr.isatty() and not args.quiet)
        with progress.Reporter(show_progress):
            return _spec_command(args, beam_args)
    return _spec_command(args, beam_args)


def _spec_command(args, beam_args):
    from thresher.pipelines.common import progress  # heavy: start-up of thresher --help
    from thresher.pipelines.specs import spec as spec_mod  # heavy: pyarrow
    from thresher.pipelines.planning.plan import make_plan  # heavy: start-up of thresher --help
    progress.phase(f"reading the spec {args.config}")
    spec = spec_mod.load(args.config)
    if spec.continual is not None or getattr(args, "period", None) is not None:
        return _continual_command(args, spec)
    if args.command == "validate":
        from thresher.pipelines.dataio import input_schema  # heavy: pyarrow.parquet
        # heavy: start-up of thresher --help
        from thresher.pipelines.planning.preflight import check_output_writable
        files = spec_mod.input_files(spec.input)
        input_schema.check_input(spec.input, files)
        check_output_writable(spec.output.path)
        _check_ledger_outside_output(spec)
        plan = make_plan(spec)
        ledger_text = _ledger_preview(plan, refuse=True)
        print(f"{args.config}: valid ({spec.kind}, {len(files)} input file"
              f"{'s' if len(files) != 1 else ''}; checked the spec, the input files' columns "
              f"and types, the output folder's writability and the calibration; the rows are "
              f"checked when the release runs)")
        if ledger_text:
            print(ledger_text)
        return 0
    progress.phase("planning: calibrating the mechanism to the budget")
    plan = make_plan(spec)
    if args.command == "plan":
        _print_plan(plan, args.json, args.verbose, args.users)
        if not args.json:
            ledger_text = _ledger_preview(plan, refuse=False)
            if ledger_text:
                # heavy: start-up of thresher --help
                from thresher.pipelines.reports.plan_text import wrap
                print("\n".join(wrap([ledger_text])))
        return 0
    from thresher.pipelines.running import beam_flags  # heavy: start-up of thresher --help
    # heavy: start-up of thresher --help
    from thresher.pipelines.planning.preflight import check_output_writable
    progress.phase("checking the output folder and the Beam options")
    check_output_writable(spec.output.path)
    _check_ledger_outside_output(spec)
    beam_flags.check(beam_args)
    from thresher.pipelines.running import engines  # heavy: start-up of thresher --help
    beam_args = engines.complete_beam_args(beam_args)   # the cached job server / Prism
    progress.phase("checking the input files and building the Beam pipeline")
    process.prepare_pipeline()
    from thresher.pipelines.running.release import run  # heavy: apache_beam
    from thresher.pipelines.running import engine_watch  # heavy: start-up of thresher --help
    with engine_watch.watched(beam_args, args.timeout):   # Flink/Spark/Prism failures, --timeout
        report = run(plan, beam_args=beam_args, overwrite=args.overwrite)
    if not args.quiet:
        print("\n".join(summary.run_lines(report, spec.output.path, spec.input.keys,
                                          _ledger_line(spec))))
    return 0


def _continual_command(args, spec):
    """A spec with a ``continual`` section (pipelines.continual.command)."""
    if spec.continual is None:
        raise SpecError("--period", "applies to a spec with a continual section only")
    from thresher.pipelines.continual import command, state  # heavy: apache_beam
    _check_ledger_outside_output(spec)
    # the horizon's state (its secret among it) lives beside the ledger: never in the
    # published folder either
    from thresher.pipelines.ledgers import ledger  # heavy: start-up of thresher --help
    where = ledger.inside_output(state.folder_for(spec.budget, spec.name), spec.output.path)
    if where:
        raise ThresherError("budget.ledger: the continual state folder (the horizon's secret) "
                            + where.removeprefix("the ledger "))
    if args.command == "run":
        if args.period is None:
            raise SpecError("--period", f"a continual release runs one period at a time: "
                            f"thresher run {args.config} --period P (P = 1.."
                            f"{spec.continual.horizon})")
        return command.run(spec, args.period, quiet=args.quiet)
    lines, document = command.plan_lines(spec)
    if args.command == "plan" and args.json:
        print(json.dumps(document, indent=2, sort_keys=True))
    elif args.command == "validate":
        print(f"{args.config}: valid (continual, {spec.continual.horizon} periods)")
    else:
        print("\n".join(lines))
    return 0


def _engines_command(args):
    from thresher.pipelines.running import engines  # heavy: start-up of thresher --help
    if args.engines_command == "check":
        from thresher.pipelines.running import engine_check  # heavy: start-up of thresher --help
        wanted = list(dict.fromkeys(args.engine))
        results = engine_check.check(wanted, args.rows, args.workers, timeout=args.timeout)
        print(json.dumps(results) if args.json else engine_check.format_results(results))
        return 0 if all(row["identical"] is not False for row in results) else 1
    for name in args.engine:
        eng = engines.engine(name, flink_version=args.flink_version if name == "flink" else None)
        path = engines.fetch(eng)
        print(f"{eng.name}: --{eng.flag}={path}")
    return 0


def _check_ledger_outside_output(spec):
    """validate: a SQLite ledger inside the output folder is refused (naming
    budget.ledger), as every run would be: the release replaces that folder."""
    budget = getattr(spec, "budget", None)
    if budget is None:
        return
    from thresher.pipelines.ledgers import ledger  # heavy: start-up of thresher --help
    where = ledger.inside_output(budget.ledger, spec.output.path)
    if where:
        raise ThresherError(f"budget.ledger: {where}")


def _ledger_preview(plan, refuse):
    """validate and plan: what the ledger would leave after this release (read, never
    charged). A release the ledger will refuse fails validate (exit 2) and is said so by
    plan; a ledger that cannot be read is a warning on stderr."""
    if getattr(plan.spec, "budget", None) is None:
        return None
    from thresher.pipelines.ledgers import ledger  # heavy: start-up of thresher --help
    seen = ledger.preview(plan)
    if seen.warning:
        print(f"thresher: warning: {seen.text}", file=sys.stderr)
        return None
    if seen.refuses:
        if refuse:
            raise ThresherError(f"{seen.field}: {seen.text}")
        return f"ledger: REFUSES this release: {seen.text}"
    return seen.text


def _ledger_line(spec):
    if getattr(spec, "budget", None) is None:
        return None
    from thresher.pipelines.ledgers import ledger  # heavy: start-up of thresher --help
    return ledger.after_run_line(spec.budget)


def _look_command(args):
    if args.command == "show":
        with look.to_stdout():
            look.show(args.output, args.format, args.top)
        return 0
    if args.html is None:
        with look.to_stdout():
            print("\n".join(look.report_lines(args.output)))
        return 0
    from thresher.pipelines.reports import html_report  # heavy: numpy
    dest = look.html_destination(args.output, args.html, overwrite=args.overwrite)
    with look.to_stdout():
        html_report.write(args.output, dest)
        if not look.is_stdout(dest):      # the page itself went to stdout: nothing after it
            print(f"wrote {dest}")
    return 0


def _ledger_id(text):
    """A ledger row id: an integer that a database row id can be (SQLite's 64-bit)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a reservation id (an integer), got "
                                         f"{text!r}") from None
    if not 0 < value < 2 ** 63:
        raise argparse.ArgumentTypeError(f"must be a reservation id between 1 and 2^63 - 1 "
                                         f"(thresher ledger reservations lists them), got "
                                         f"{text}")
    return value


def _finite_number(text):
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be a number, got {text!r}") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"must be a finite number, got {text!r}")
    return value


def _ledger_command(args):
    from thresher.pipelines.ledgers import ledger  # heavy: start-up of thresher --help
    if args.ledger_command == "set-budget":
        old, new = ledger.set_budget(args.ledger, args.dataset, args.epsilon, args.delta,
                                     args.threshold_delta, force=args.force)
        n = ledger.comp.shown_number
        zcdp = "" if new["rho"] is None else (f", threshold_delta {n(new['threshold_delta'])}"
                                              f"; rho_B {n(new['rho'])}")
        print(f"dataset {ledger.printable(new['dataset'])!r} ({new['composition']}): total set "
              f"to epsilon {n(new['epsilon'])}, delta {n(new['delta'])}{zcdp} (was epsilon "
              f"{old['epsilon']}, delta {old['delta']}"
              + ("" if old["rho"] is None else f", rho_B {old['rho']}") + "); "
              + ("FORCED below what is spent: " if new["forced"] else "")
              + f"{new['spent']}. Recorded in the ledger; give specs on this dataset the new "
              f"budget.epsilon/delta")
        return 0
    if args.ledger_command == "reservations":
        rows = ledger.reservations(args.ledger, args.dataset)
        print(json.dumps(rows, indent=2) if args.json else ledger.format_reservations(rows))
        return 0
    if args.ledger_command == "release":
        row = ledger.release_reservation(args.ledger, args.id, force=args.force)
        n = ledger.comp.shown_number
        print(f"released reservation {row['id']} ({ledger.printable(row['name'])!r}, dataset "
              f"{ledger.printable(row['dataset'])!r}: epsilon {n(row['epsilon'])}, delta "
              f"{n(row['delta'])}; its run was {row['owner']})")
        return 0
    datasets = ledger.summary(args.ledger, args.dataset)
    if args.json:
        print(json.dumps(datasets[0] if len(datasets) == 1 else datasets, indent=2))
    else:
        print(ledger.format_summary(datasets))
    return 0


if __name__ == "__main__":
    sys.exit(main())

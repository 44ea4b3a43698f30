"""The ``thresher`` command line.

    thresher run CONFIG [--overwrite] [-- <Beam pipeline options>]
    thresher plan CONFIG [--json]
    thresher validate CONFIG
    thresher ledger show LEDGER [--dataset D] [--json]
    thresher show OUTPUT [--top N]
    thresher schema
    thresher report OUTPUT --html [FILE]

Usage and spec errors print one line naming the field and exit with code 2; no
traceback unless ``--debug`` is given.
"""
import argparse
import json
import logging
import re
import sys

from pipelines import __version__, signals
from pipelines.errors import ThresherError

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
        usage="thresher run CONFIG [--overwrite] [--quiet] [--progress | --no-progress] "
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
    run.add_argument("--quiet", action="store_true", help="print only errors")
    run.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                     help="progress lines on stderr (stages, rows read); default: on when "
                          "stderr is a terminal")
    plan = sub.add_parser("plan", parents=[common],
                          help="calibrated parameters and the privacy guarantee; reads no data")
    plan.add_argument("config")
    plan.add_argument("--json", action="store_true", help="print the plan as the report's JSON")
    plan.add_argument("--users", type=int, default=2000,
                      help="users per key for the aggregates' expected errors (default 2000)")
    validate = sub.add_parser("validate", parents=[common],
                              help="check a spec (and that its input has the columns)")
    validate.add_argument("config")
    show = sub.add_parser("show", parents=[common],
                          help="the top released keys of a published release, as a table")
    show.add_argument("output", help="a release's output folder")
    show.add_argument("--top", type=int, default=20, help="how many keys (default 20)")
    report = sub.add_parser("report", parents=[common],
                            help="a readable report of a published release")
    report.add_argument("output", help="a release's output folder")
    report.add_argument("--html", nargs="?", const="", metavar="FILE", required=True,
                        help="write a self-contained HTML page with plots (default "
                             "OUTPUT/release_report.html); needs the report extra (matplotlib)")
    sub.add_parser("schema", parents=[common],
                   help="print the spec's JSON Schema (for editors and linters)")
    ledger = sub.add_parser("ledger", help="the privacy-budget ledger (spec section budget:)")
    ledger_sub = ledger.add_subparsers(dest="ledger_command", required=True, parser_class=_Parser)
    show = ledger_sub.add_parser("show", parents=[common],
                                 help="each dataset's budget, what is spent, every release")
    show.add_argument("ledger", help="the ledger file (budget.ledger of a spec)")
    show.add_argument("--dataset", help="only this dataset")
    show.add_argument("--json", action="store_true", help="print JSON")
    return parser


def _split_beam_args(argv):
    if "--" in argv:
        i = argv.index("--")
        return argv[:i], argv[i + 1:]
    return argv, []


def _print_plan(plan, as_json):
    report = plan.report()
    if as_json:
        print(json.dumps(report, indent=2))
        return
    from pipelines.plan_text import format_plan
    print("\n".join(format_plan(plan, report)))


def _configure_logging(debug, quiet):
    level = logging.DEBUG if debug else (logging.WARNING if quiet else logging.INFO)
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


_WRAPPED = re.compile(r"(SpecError|InputError|CalibrationError|ThresherError): (.+?)(?:\s\[while running|$)",
                      re.S)


def _user_error_in(exc):
    """A thresher error raised on a Beam worker comes back wrapped; find its message."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, ThresherError):
            return str(exc)
        exc = exc.__cause__ or exc.__context__
    return None


def _user_error_in_text(text):
    match = _WRAPPED.search(text)
    return match.group(2).strip().splitlines()[0] if match else None


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    own, beam_args = _split_beam_args(argv)
    parser = _parser()
    args, extra = parser.parse_known_args(own)
    if extra:
        from pipelines.beam_flags import beam_flags_among
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
    _configure_logging(args.debug, getattr(args, "quiet", False))
    restore = signals.install() if args.command == "run" else (lambda: None)
    try:
        return _dispatch(args, beam_args)
    except ThresherError as exc:
        if args.debug:
            raise
        print(f"thresher: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("thresher: interrupted; nothing was published", file=sys.stderr)
        return 130
    except signals.Terminated:
        print("thresher: terminated (SIGTERM); nothing was published", file=sys.stderr)
        return EXIT_TERMINATED
    except Exception as exc:  # noqa: BLE001 - the last line of defence against tracebacks
        if args.debug:
            raise
        message = _user_error_in(exc) or _user_error_in_text(str(exc))
        if message:
            print(f"thresher: error: {message}", file=sys.stderr)
            return EXIT_USAGE
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        print(f"thresher: internal error ({type(exc).__name__}): {first[:500]}\n"
              f"thresher: nothing was published; rerun with --debug for the traceback",
              file=sys.stderr)
        return EXIT_INTERNAL
    finally:
        restore()


def _dispatch(args, beam_args):
    if args.command == "ledger":
        return _ledger_command(args)
    if args.command == "schema":
        from pipelines.schema import json_schema
        print(json.dumps(json_schema(), indent=2))
        return 0
    if args.command in ("show", "report"):
        return _look_command(args)
    from pipelines import spec as spec_mod
    from pipelines.plan import make_plan
    spec = spec_mod.load(args.config)
    if args.command == "validate":
        from pipelines import io
        files = spec_mod.input_files(spec.input)
        io.check_input(spec.input, files)
        make_plan(spec)
        print(f"{args.config}: valid ({spec.kind}, {len(files)} input file"
              f"{'s' if len(files) != 1 else ''})")
        return 0
    plan = make_plan(spec)
    if args.command == "plan":
        _print_plan(plan, args.json)
        if spec.aggregates and not args.json:
            from pipelines.aggregates import print_plan
            print_plan(plan, max(1, args.users))
        return 0
    from pipelines import beam_flags, progress
    from pipelines.release import run
    beam_flags.check(beam_args)
    show_progress = args.progress if args.progress is not None else (
        sys.stderr.isatty() and not args.quiet)
    with progress.Reporter(show_progress):
        report = run(plan, beam_args=beam_args, overwrite=args.overwrite)
    if not args.quiet:
        from pipelines import summary
        print("\n".join(summary.run_lines(report, spec.output.path, spec.input.keys,
                                          _ledger_line(spec))))
    return 0


def _ledger_line(spec):
    if getattr(spec, "budget", None) is None:
        return None
    from pipelines import ledger
    d = ledger.summary(spec.budget.ledger, spec.budget.dataset)[0]
    return (f"ledger: dataset {d['dataset']} has spent epsilon {d['spent']['epsilon']:g} of "
            f"{d['budget']['epsilon']:g}, delta {d['spent']['delta']:g} of {d['budget']['delta']:g} "
            f"({spec.budget.ledger})")


def _look_command(args):
    import os
    from pipelines import summary
    if args.command == "show":
        report = summary.load_report(args.output)
        table = summary.load_released(args.output, report)
        top = summary.top_rows(table, report, max(0, args.top))
        print(f"{report.get('name')}: {report['released_keys']:,} keys released; "
              f"top {top.num_rows} by {summary.value_column(table, report) or 'key'}")
        print(summary.format_table(top))
        return 0
    from pipelines import html_report
    dest = args.html or os.path.join(args.output, "release_report.html")
    html_report.write(args.output, dest)
    print(f"wrote {dest}")
    return 0


def _ledger_command(args):
    from pipelines import ledger
    datasets = ledger.summary(args.ledger, args.dataset)
    if args.json:
        print(json.dumps(datasets[0] if len(datasets) == 1 else datasets, indent=2))
    else:
        print(ledger.format_summary(datasets))
    return 0


if __name__ == "__main__":
    sys.exit(main())

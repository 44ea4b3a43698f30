"""The ``thresher`` command line.

    thresher run CONFIG [--overwrite] [-- <Beam pipeline options>]
    thresher plan CONFIG [--json]
    thresher validate CONFIG

Usage and spec errors print one line naming the field and exit with code 2; no
traceback unless ``--debug`` is given.
"""
import argparse
import json
import logging
import re
import sys

from pipelines import __version__
from pipelines.errors import ThresherError

EXIT_USAGE = 2
EXIT_INTERNAL = 1


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
    sub = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)
    run = sub.add_parser("run", help="run a release; Beam options go after --")
    run.add_argument("config", help="release spec (YAML)")
    run.add_argument("--overwrite", action="store_true", help="replace an earlier release in output.path")
    run.add_argument("--quiet", action="store_true", help="print only errors")
    plan = sub.add_parser("plan", help="calibrated parameters and the privacy guarantee; reads no data")
    plan.add_argument("config")
    plan.add_argument("--json", action="store_true", help="print the plan as the report's JSON")
    validate = sub.add_parser("validate", help="check a spec (and that its input has the columns)")
    validate.add_argument("config")
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
    spec = plan.spec
    unit = (f"per user {spec.input.user!r}" if spec.input.sample is None else
            f"sanitizing the existing sample's column {spec.input.sample['frequency']!r}")
    print(f"release {spec.name!r}: {spec.kind} over keys {', '.join(spec.input.keys)} {unit}")
    print(f"privacy: epsilon={plan.budget.epsilon:g}, delta={plan.budget.delta:g} "
          f"({report['privacy']['neighbouring']})")
    for stage in plan.budget.stages:
        print(f"  stage {stage.name}: epsilon={stage.epsilon:g}, delta={stage.delta:g}")
    if spec.auto_bound:
        print(f"bounding: max_keys_per_user chosen privately from {list(plan.candidates)} "
              f"({spec.bounding.model} model)")
        for bound, params in plan.params_by_bound.items():
            print(f"  C={bound}: {_format_params(params)}")
        for bound, why in plan.excluded_bounds.items():
            print(f"  C={bound}: excluded ({why})")
        selection = report["bounding"].get("selection", {})
        if "dropped_weight" in selection:
            print(f"  selection: score {selection['score']}, dropped_weight "
                  f"{selection['dropped_weight']:.4g} ({selection['dropped_weight_rule']}), "
                  f"suppressed_weight {selection['suppressed_weight']:.4g}, sensitivity "
                  f"{selection['sensitivity']:.6g}")
    else:
        print(f"bounding: max_keys_per_user={spec.bounding.max_keys_per_user} "
              f"({spec.bounding.model} model)")
        print(f"mechanism: {_format_params(report['mechanism'])}")
    print(f"accounting: {report['privacy']['accounting']}")
    if "assumes" in report["privacy"]:
        print(f"assumes: {report['privacy']['assumes']}")


def _format_params(params):
    skip = ("kind", "accounting")
    parts = []
    for key, value in params.items():
        if key in skip:
            continue
        if isinstance(value, float):
            value = f"{value:.6g}"
        elif isinstance(value, dict):
            value = "{" + ", ".join(f"{k}: {v:.6g}" if isinstance(v, float) else f"{k}: {v}"
                                    for k, v in value.items()) + "}"
        parts.append(f"{key}={value}")
    return ", ".join(parts)


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
    args = _parser().parse_args(own)
    if beam_args and args.command != "run":
        print("thresher: error: Beam options after -- are only for 'thresher run'", file=sys.stderr)
        return EXIT_USAGE
    _configure_logging(args.debug, getattr(args, "quiet", False))
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


def _dispatch(args, beam_args):
    from pipelines import spec as spec_mod
    from pipelines.plan import make_plan
    spec = spec_mod.load(args.config)
    if args.command == "validate":
        from pipelines import io
        from pipelines.preflight import check_output_writable
        files = spec_mod.input_files(spec.input)
        io.check_input(spec.input, files)
        check_output_writable(spec.output.path)
        make_plan(spec)
        print(f"{args.config}: valid ({spec.kind}, {len(files)} input file"
              f"{'s' if len(files) != 1 else ''}; checked the spec, the input files' columns "
              f"and types, the output folder's writability and the calibration; the rows are "
              f"checked when the release runs)")
        return 0
    plan = make_plan(spec)
    if args.command == "plan":
        _print_plan(plan, args.json)
        return 0
    from pipelines.preflight import check_output_writable
    from pipelines.release import run
    check_output_writable(spec.output.path)
    report = run(plan, beam_args=beam_args, overwrite=args.overwrite)
    if not args.quiet:
        bound = report["bounding"]["max_keys_per_user"]
        print(f"released {report['released_keys']} keys to {spec.output.path} "
              f"(epsilon={report['privacy']['epsilon']:g}, delta={report['privacy']['delta']:g}, "
              f"max_keys_per_user={bound})")
    return 0


if __name__ == "__main__":
    sys.exit(main())

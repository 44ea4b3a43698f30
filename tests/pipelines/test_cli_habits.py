"""The CLI as people use it: --debug anywhere, `run --help` showing the `-- <Beam options>`
form, unknown Beam flags refused by name, Beam flags before `--` hinted, plan and report
text citing papers by authors and title with no Python reprs, progress lines, and
resolved paths in errors."""
import json
import os
import re
import subprocess
import sys

import pytest

from thresher.pipelines.cli import main
from thresher.pipelines.common.progress import Reporter

from .conftest import ROOT

KINDS = ["gaussian", "laplace", "sample_and_threshold", "weighted_sampling"]


def test_debug_after_the_subcommand(write_spec, capsys):
    missing = os.path.join("nowhere", "spec.yaml")
    assert main(["plan", missing]) == 2
    for argv in (["--debug", "plan", missing], ["plan", missing, "--debug"]):
        with pytest.raises(Exception, match="does not exist"):
            main(argv)          # --debug: the exception itself, with its traceback
    capsys.readouterr()
    assert main(["plan", write_spec(), "--debug"]) == 0


def test_run_help_shows_the_beam_options_form(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", "--help"])
    assert stop.value.code == 0
    text = capsys.readouterr().out
    assert text.startswith("usage: thresher run CONFIG [--overwrite]")
    assert "[-- <Beam options>]" in text.splitlines()[0]
    assert "thresher run release.yaml -- --runner=DirectRunner" in text
    assert "--debug" in text and "--progress" in text


@pytest.mark.parametrize("beam_args, message", [
    (["--runnr=DirectRunner"], "unknown Beam option --runnr after -- (did you mean --runner?)"),
    (["--runner=DirectRunner", "--direct_num_wrkers", "2"],
     "unknown Beam option --direct_num_wrkers after -- (did you mean --direct_num_workers?)"),
    (["DirectRunner"], "Beam cannot use 'DirectRunner' after --"),
])
def test_an_unknown_beam_flag_is_an_error_naming_it(write_spec, small_parquet, tmp_path, capsys,
                                                    beam_args, message):
    path = write_spec({"input.path": small_parquet})
    assert main(["run", path, "--", *beam_args]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"thresher: error: {message}") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_known_beam_flags_pass(write_spec, small_parquet, tmp_path, capsys):
    path = write_spec({"input.path": small_parquet})
    assert main(["run", path, "--quiet", "--", "--runner=DirectRunner",
                 "--direct_num_workers", "1", "--experiments=a", "--experiments=b"]) == 0
    assert (tmp_path / "out" / "released.parquet").exists()


@pytest.mark.parametrize("argv", [
    ["run", "SPEC", "--runner=DirectRunner"],
    ["run", "SPEC", "--direct_num_workers=2", "--overwrite"],
])
def test_a_beam_flag_without_double_dash_gets_a_hint(write_spec, capsys, argv):
    argv = [write_spec() if a == "SPEC" else a for a in argv]
    flag = next(a for a in argv if a.startswith("--runner") or a.startswith("--direct"))
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.strip() == (f"thresher: error: {flag} is a Beam option: put Beam options after "
                           f"--, e.g. thresher run CONFIG -- {flag}")


def test_other_unknown_flags_stay_usage_errors(write_spec, capsys):
    with pytest.raises(SystemExit) as stop:
        main(["run", write_spec(), "--force"])
    assert stop.value.code == 2
    assert "unrecognized arguments: --force" in capsys.readouterr().err


_REPR = re.compile(r"\bNone\b|\bTrue\b|\bFalse\b|np\.\w+\(|paper 00\d|papers 00\d")


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bound", [8, "auto"])
def test_plan_text_and_report_cite_papers_and_print_no_reprs(write_spec, capsys, kind, bound):
    path = write_spec({"mechanism": {"kind": kind}, "bounding.max_keys_per_user": bound})
    assert main(["plan", path]) == 0
    short = capsys.readouterr().out           # the one-screen default (issue 29)
    assert main(["plan", path, "--verbose"]) == 0
    text = capsys.readouterr().out
    assert not _REPR.findall(text), _REPR.findall(text)
    assert not _REPR.findall(short), _REPR.findall(short)
    cited = {"gaussian": "Karrer, Kifer, Wilkins & Zhang, \"Exact privacy analysis of the "
                         "Gaussian sparse histogram mechanism\"",
             "laplace": "Liu, Suresh, Zhu, Kairouz & Gruteser, \"Algorithms for bounding "
                        "contribution for histogram estimation under user-level privacy\"",
             "sample_and_threshold": "Bharadwaj & Cormode, \"Sample and Threshold Differential "
                                     "Privacy: Histograms and applications\"",
             "weighted_sampling": "Cohen, Geri, Sarlos & Stemmer, \"Differentially Private "
                                  "Weighted Sampling\""}[kind]
    assert cited in text
    assert " ".join(short.split()).count(cited) == 1     # wrapped at 100 characters, once
    # One line per parameter group: the mechanism's main line holds no nested group.
    for line in text.splitlines():
        assert not re.search(r"=\{", line), line
    assert main(["plan", path, "--json"]) == 0
    report = capsys.readouterr().out
    assert not re.findall(r"paper 00\d|papers 00\d", report)
    assert cited.replace('"', '\\"') in report


def test_plan_states_the_budget_ledger(write_spec, capsys):
    path = write_spec({"budget": {"ledger": "l.sqlite", "dataset": "logs", "epsilon": 3.0,
                                  "delta": 1e-6}})
    assert main(["plan", path]) == 0
    # a relative budget.ledger names a file beside the spec (issue 42): shown resolved
    beside = os.path.join(os.path.dirname(os.path.abspath(path)), "l.sqlite")
    assert ("budget: charged to dataset logs (total epsilon=3, delta=1e-06) in the ledger "
            f"{beside}") in " ".join(capsys.readouterr().out.split())


def test_progress_lines_name_stages_and_rows(write_spec, small_parquet, capsys):
    import io
    stream = io.StringIO()
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    plan = make_plan(spec_mod.load(write_spec({"input.path": small_parquet})))
    with Reporter(True, stream=stream, interval=0.05):
        run(plan)
    lines = stream.getvalue().strip().splitlines()
    assert len(lines) >= 2 and all(line.startswith("thresher: progress ") for line in lines)
    assert re.search(r"stage [A-Za-z, ]+; [\d,]+ rows read", "\n".join(lines[:-1]))
    last = lines[-1]
    assert "finished; 20,000 rows read; stages: " in last
    for stage in ("Read", "ShardByUser", "PerUserBound", "SumCountsPerKey"):
        assert stage in last


def test_progress_is_off_without_a_terminal_and_on_when_asked(write_spec, small_parquet, tmp_path):
    spec = write_spec({"input.path": small_parquet})
    env = dict(os.environ, PYTHONPATH=ROOT, THRESHER_PROGRESS_SECONDS="0.05")
    cmd = [sys.executable, "-m", "thresher.pipelines.cli", "run", spec]
    quiet = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert quiet.returncode == 0 and "progress" not in quiet.stderr
    loud = subprocess.run(cmd + ["--overwrite", "--progress"], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=300)
    assert loud.returncode == 0, loud.stderr
    assert "thresher: progress" in loud.stderr and "finished; 20,000 rows read" in loud.stderr
    # while it ran: the stage and the rows from Beam's metrics (tests/pipelines/common/test_progress_metrics.py)
    match = re.search(r"stage ([A-Za-z, ]+); ([\d,]+) rows read \(Beam metrics: Read/\w+ ([\d,]+)\)",
                      loud.stderr)
    assert match and match.group(1) != "starting", loud.stderr
    assert int(match.group(2).replace(",", "")) > 0


def test_relative_path_errors_print_the_resolved_path(write_spec, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(["validate", write_spec({"input.path": "data/missing.parquet"})]) == 2
    err = capsys.readouterr().err
    assert f"'data/missing.parquet' (resolved: {tmp_path}/data/missing.parquet) does not exist" in err
    assert main(["plan", "specs/none.yaml"]) == 2
    assert f"(resolved: {tmp_path}/specs/none.yaml)" in capsys.readouterr().err


def test_report_json_has_no_paper_numbers(write_spec, small_parquet, tmp_path):
    assert main(["run", write_spec({"input.path": small_parquet}), "--quiet"]) == 0
    text = (tmp_path / "out" / "release_report.json").read_text()
    assert "Karrer, Kifer, Wilkins & Zhang" in json.loads(text)["mechanism"]["accounting"]
    assert not re.findall(r"paper 00\d", text)

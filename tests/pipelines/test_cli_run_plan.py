"""`thresher run`, `plan` and `validate` as a new user tries them (issue 29, "Other CLI
habits"), each through the real CLI in a new interpreter: `-q`, progress from the first
second, a one-screen plan, the ledger read (not charged) by validate and plan, and a folder
as input.path."""
import os
import re
import subprocess
import sys

import pytest

from .conftest import ROOT


def thresher(*argv, env=None, timeout=600):
    return subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", *map(str, argv)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout,
                          env=None if env is None else dict(os.environ, **env))


def test_run_q_prints_nothing_on_success(write_spec, small_parquet, tmp_path):
    spec = write_spec({"input.path": small_parquet})
    done = thresher("run", spec, "-q")
    assert done.returncode == 0, done.stderr
    assert done.stdout == "" and done.stderr == ""
    assert (tmp_path / "out" / "released.parquet").exists()
    again = thresher("run", spec, "-q")            # errors still print: one line, exit 2
    assert again.returncode == 2 and again.stdout == ""
    assert again.stderr.startswith("thresher: error: ") and len(again.stderr.splitlines()) == 1


def test_progress_names_each_step_before_beam_runs(write_spec, small_parquet):
    """The lines start at once (00:00) and name reading the spec, calibrating and the
    input checks before any Beam stage: a large input is never silent while it is planned.
    The interval is long (60 s) so that every line before the closing one is a step's own
    line, not a periodic one."""
    spec = write_spec({"input.path": small_parquet})
    done = thresher("run", spec, "--progress", env={"THRESHER_PROGRESS_SECONDS": "60"})
    assert done.returncode == 0, done.stderr
    lines = [line for line in done.stderr.splitlines() if line.startswith("thresher: progress ")]
    steps = [re.sub(r"^thresher: progress \d\d:\d\d: ", "", line) for line in lines]
    # the periodic lines (after the first second, then every interval) repeat the step
    # or say "still in ..."; each step's own line is printed once, when it starts
    steps = [s for i, s in enumerate(steps) if not s.startswith("still in ") and s not in steps[:i]]
    assert lines[0] == "thresher: progress 00:00: starting"
    assert steps[1:5] == [f"reading the spec {spec}",
                          "planning: calibrating the mechanism to the budget",
                          "checking the output folder and the Beam options",
                          "checking the input files and building the Beam pipeline"]
    assert steps[-1].startswith("finished; 20,000 rows read; stages: ")


AGGREGATES = [{"column": "amount", "statistic": "sum", "clip": [0, 200]},
              {"column": "amount", "statistic": "mean", "clip": [0, 200]}]


@pytest.mark.parametrize("changes", [
    {},
    {"bounding.max_keys_per_user": "auto"},
    {"bounding.max_keys_per_user": "auto", "aggregates": AGGREGATES},
    {"mechanism": {"kind": "adaptive"}, "bounding.max_keys_per_user": "auto"},
    {"mechanism": {"kind": "weighted_sampling"}},
], ids=["gaussian", "auto", "auto-aggregates", "adaptive-auto", "weighted_sampling"])
def test_plan_fits_one_screen_and_verbose_has_the_rest(write_spec, changes):
    """The default: at most 30 lines of at most 100 characters, each paper cited once, the
    guarantee, the stages, the bound, the noise and threshold, the release point and the
    expected errors. --verbose: today's full text (the accounting sentence in full)."""
    from thresher.pipelines.common.citations import PAPERS
    spec = write_spec(changes)
    done = thresher("plan", spec)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert len(lines) <= 30 and max(map(len, lines)) <= 100, done.stdout
    flat = " ".join(done.stdout.split())
    cited = [ref for ref in PAPERS.values() if ref in flat]
    assert cited and all(flat.count(ref) == 1 for ref in cited), flat
    assert lines[1].startswith("guarantee: (epsilon=1, delta=1e-08)-DP, user-level: ")
    assert lines[2].startswith("stages: ")
    assert lines[3].startswith("bound: ")
    kind = changes.get("mechanism", {}).get("kind", "gaussian")
    if kind == "gaussian":
        assert "is released at least half the time" in flat
    if kind != "weighted_sampling":
        assert "E|noise| of a count" in flat
    if "aggregates" in changes:
        assert "E|error| of the sum" in flat and "E|error| of the mean at 2000 users" in flat
    assert lines[-1] == "every parameter and the accounting: thresher plan --verbose (or --json)"
    verbose = thresher("plan", spec, "--verbose")
    assert verbose.returncode == 0 and "\naccounting: " in verbose.stdout
    assert "\naccounting: " not in done.stdout


def _folder(tmp_path, small_parquet, names):
    import pyarrow.csv as pcsv
    import pyarrow.parquet as pq
    table = pq.read_table(small_parquet)
    folder = tmp_path / "data"
    folder.mkdir()
    half = table.num_rows // 2
    for i, name in enumerate(names):
        part = table.slice(i * half, half)
        if name.endswith(".parquet"):
            pq.write_table(part, folder / name)
        elif name.endswith(".tsv"):
            pcsv.write_csv(part, folder / name, pcsv.WriteOptions(delimiter="\t"))
        else:
            (folder / name).write_text("not an input file\n")
    return str(folder)


@pytest.mark.parametrize("names", [["a.parquet", "b.parquet", ".hidden", "_SUCCESS"],
                                   ["part-0.tsv", "part-1.tsv"]])
def test_a_folder_as_input_path_gets_its_files_format(write_spec, small_parquet, tmp_path,
                                                     delete, names):
    """No input.format: the folder's files tell it (parquet; tab-separated CSV from .tsv).
    On main: "input.format: cannot tell the format from the name ..." (exit 2)."""
    folder = _folder(tmp_path, small_parquet, names)
    spec = write_spec({"input.path": folder, "input.format": delete})
    done = thresher("validate", spec)
    assert done.returncode == 0, done.stderr
    assert "valid (gaussian, 2 input files" in done.stdout
    done = thresher("run", spec, "-q")
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "out" / "released.parquet").exists()


@pytest.mark.parametrize("names, says", [
    (["a.parquet", "b.tsv"], "mixes input formats (csv (tab-separated): b.tsv; parquet: a.parquet)"),
    (["a.parquet", "b.parquet", "notes.txt"], "holds notes.txt, whose name tells no input format"),
])
def test_a_folder_mixing_formats_is_refused_naming_the_field(write_spec, small_parquet, tmp_path,
                                                              delete, names, says):
    folder = _folder(tmp_path, small_parquet, names)
    spec = write_spec({"input.path": folder, "input.format": delete})
    for command in ("validate", "plan", "run"):
        done = thresher(command, spec)
        assert done.returncode == 2, (command, done.stderr)
        assert done.stderr.startswith(f"thresher: error: input.path: the folder {folder!r} ")
        assert says in done.stderr and len(done.stderr.splitlines()) == 1, done.stderr


def _ledger_spec(write_spec, small_parquet, ledger, total):
    return write_spec({"input.path": small_parquet,
                       "budget": {"ledger": str(ledger), "dataset": "logs",
                                  "epsilon": total, "delta": 1e-6}})


def _ledger_state(ledger):
    done = thresher("ledger", "show", ledger, "--json")
    assert done.returncode == 0, done.stderr
    return json_loads(done.stdout)


def json_loads(text):
    import json
    return json.loads(text)


def test_validate_and_plan_read_the_ledger_without_charging_it(write_spec, small_parquet, tmp_path):
    """On main validate said "valid" for a release the ledger refuses, and neither said
    what was left."""
    ledger = tmp_path / "ledger.sqlite"
    spec = _ledger_spec(write_spec, small_parquet, ledger, 1.5)
    done = thresher("validate", spec)
    assert done.returncode == 0, done.stderr
    assert (f"ledger: dataset 'logs' is new in '{ledger}' (basic composition; the first "
            f"run creates it); this release costs epsilon=1, delta=1e-08 under basic "
            f"composition; rho=") in done.stdout
    assert not ledger.exists()                       # reading creates nothing
    assert thresher("run", spec, "-q").returncode == 0       # charges epsilon 1 of 1.5
    before = _ledger_state(ledger)
    done = thresher("validate", spec)
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(
        "thresher: error: budget: dataset 'logs' (basic composition) has spent epsilon=1, "
        "delta=1e-08 of its total epsilon=1.5, delta=1e-06; this release needs epsilon=1, "
        "delta=1e-08 under basic composition; rho=")
    assert done.stderr.endswith(f"remaining epsilon=0.5, delta=9.9e-07; refused: it needs 1 "
                                f"of the epsilon budget, 0.5 left (short by 0.5): the ledger "
                                f"'{ledger}' will refuse it\n")
    done = thresher("plan", spec)
    assert done.returncode == 0, done.stderr
    assert ("ledger: REFUSES this release: dataset 'logs' (basic composition) has spent "
            "epsilon=1") in " ".join(done.stdout.split())
    assert _ledger_state(ledger) == before              # nothing charged, nothing reserved
    roomy = _ledger_spec(write_spec, small_parquet, tmp_path / "other.sqlite", 3)
    assert thresher("run", roomy, "-q", "--overwrite").returncode == 0
    done = thresher("validate", roomy)
    assert done.returncode == 0, done.stderr
    assert ("ledger: dataset 'logs' (basic composition) has spent epsilon=1, delta=1e-08 of "
            "its total epsilon=3, delta=1e-06; this release costs epsilon=1, delta=1e-08 under "
            "basic composition; rho=") in done.stdout
    assert "after it epsilon=1, delta=9.8e-07 remain" in done.stdout


@pytest.mark.parametrize("what", ["folder", "garbage"])
def test_an_unreadable_ledger_is_a_warning_in_validate_and_plan(write_spec, small_parquet,
                                                                tmp_path, what):
    ledger = tmp_path / "ledger.sqlite"
    if what == "folder":
        ledger.mkdir()
    else:
        ledger.write_bytes(b"this is not a database" * 100)
    spec = _ledger_spec(write_spec, small_parquet, ledger, 1.5)
    for command in ("validate", "plan"):
        done = thresher(command, spec)
        assert done.returncode == 0, (command, done.stderr)
        assert done.stderr.startswith(f"thresher: warning: cannot read the ledger '{ledger}' (")
        assert "not checked: the run reads it again" in done.stderr

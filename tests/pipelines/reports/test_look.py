"""`thresher show` and `thresher report` through the real CLI (a new interpreter, as a user
runs them; issue 29): formats, streaming to a pipe closed early, escaped control
characters, intervals, `--top` checks, text reports, where `--html` may write, and damaged
releases."""
import csv
import io
import json
import os
import shutil
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipelines.conftest import QUICKSTART_DATA, ROOT


def thresher(*argv, timeout=300):
    return subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", *map(str, argv)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout)


@pytest.fixture(scope="module")
def release(tmp_path_factory):
    """One real release of 20,000 quickstart rows (auto bound: two budget stages)."""
    tmp = tmp_path_factory.mktemp("look")
    data = tmp / "small.parquet"
    pq.write_table(pq.read_table(QUICKSTART_DATA).slice(0, 20_000), data)
    spec = tmp / "spec.yaml"
    spec.write_text(f"""name: look
input: {{path: {data}, user: user_id, keys: [word]}}
privacy: {{epsilon: 1.0, delta: 1e-8}}
bounding: {{max_keys_per_user: auto}}
mechanism: {{kind: gaussian}}
output: {{path: {tmp / 'out'}}}
""")
    done = thresher("run", spec)
    assert done.returncode == 0, done.stderr
    return str(tmp / "out")


def _copy_with(release, tmp_path, table=None, name="copy"):
    """A copy of the release folder, its released.parquet replaced by ``table``."""
    out = tmp_path / name
    shutil.copytree(release, out)
    if table is not None:
        pq.write_table(table, out / "released.parquet")
    return str(out)


def test_show_formats_carry_every_released_row(release):
    table = pq.read_table(os.path.join(release, "released.parquet"))
    rows = table.to_pylist()
    done = thresher("show", release, "--format", "csv")
    assert done.returncode == 0 and done.stderr == ""
    got = list(csv.DictReader(io.StringIO(done.stdout)))
    assert [(r["word"], int(r["count"])) for r in got] == [(r["word"], r["count"]) for r in rows]
    # the interval columns (issue 27) travel as they are in csv and json
    assert [(int(r["count_low"]), int(r["count_high"])) for r in got] == [
        (r["count_low"], r["count_high"]) for r in rows]
    done = thresher("show", release, "--format", "json")
    assert done.returncode == 0 and done.stderr == ""
    assert [json.loads(line) for line in done.stdout.splitlines()] == rows
    done = thresher("show", release, "--format", "json", "--top", "3")
    best = sorted(rows, key=lambda r: (-r["count"], r["word"]))[:3]
    assert [json.loads(line) for line in done.stdout.splitlines()] == best
    done = thresher("show", release, "--top", "3")           # table, the default
    lines = done.stdout.splitlines()
    assert lines[0].startswith("look: ") and lines[1].split() == ["word", "count"]
    # the table prints each count with its interval: 1,830 [1,811, 1,849]
    assert [line.split() for line in lines[3:-1]] == [
        [r["word"], f"{r['count']:,}", f"[{r['count_low']:,},", f"{r['count_high']:,}]"]
        for r in best]
    assert lines[-1].startswith("counts are of the bounded data: ")    # issue 42


@pytest.mark.parametrize("top", ["-5", "0", "x"])
def test_show_refuses_a_top_that_is_not_a_positive_number(release, top):
    done = thresher("show", release, "--top", top)
    assert done.returncode == 2 and done.stdout == ""
    assert "--top: must be a whole number >= 1" in done.stderr


@pytest.mark.parametrize("fmt", ["csv", "json", "table"])
def test_a_pipe_closed_early_is_a_normal_end(release, tmp_path, fmt):
    """`show ... | head -1` on a release of 300,000 rows: exit 0, nothing on stderr (on
    main: `internal error (BrokenPipeError)`). The reader closes the pipe after one line,
    while the writer still has most rows to write (the pipe holds 64 KB)."""
    n = 300_000
    big = pa.table({"word": pa.array([f"w{i:07d}" for i in range(n)]),
                    "count": pa.array(range(n, 0, -1), pa.int64())})
    out = _copy_with(release, tmp_path, big)
    for attempt in range(3):
        extra = ["--top", "200000"] if fmt == "table" else []
        proc = subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", "show", out,
                                 "--format", fmt, *extra],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        first = proc.stdout.readline()
        proc.stdout.close()
        err = proc.stderr.read()
        code = proc.wait(timeout=300)
        assert first and code == 0 and err == b"", (attempt, code, err[-2000:])


def test_show_escapes_control_characters_and_prints_intervals(release, tmp_path):
    nasty = "a\x1b[2Jb\rc\bd\u202ee\x9b"
    table = pa.table({"word": ["plain", nasty], "count": pa.array([3972, 120], pa.int64()),
                      "count_low": pa.array([3941, 100], pa.int64()),
                      "count_high": pa.array([4003, 140], pa.int64())})
    out = _copy_with(release, tmp_path, table)
    done = thresher("show", out)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[1].split() == ["word", "count"]
    assert lines[3].split(None, 1) == ["plain", "3,972 [3,941, 4,003]"]
    # shown quoted, so that it cannot read as a key holding these backslashes (issue 42)
    assert lines[4].split(None, 1) == ['"a\\x1b[2Jb\\rc\\bd\\u202ee\\x9b"', "120 [100, 140]"]
    for fmt in ("table", "json", "csv"):
        text = thresher("show", out, "--format", fmt).stdout
        if fmt != "csv":      # csv into a pipe is data: the key as published
            assert not any(ch in text for ch in "\x1b\r\b\u202e\x9b"), fmt
    rows = [json.loads(line) for line in thresher("show", out, "--format", "json").stdout.splitlines()]
    assert rows == table.to_pylist()          # the columns as they are, the key intact
    raw = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", "show", out, "--format", "csv"],
                         capture_output=True, cwd=ROOT, timeout=300).stdout.decode("utf-8")
    got = list(csv.reader(io.StringIO(raw, newline="")))
    assert got[0] == ["word", "count", "count_low", "count_high"] and got[2][0] == nasty


def test_report_prints_the_release_as_text(release):
    report = json.load(open(os.path.join(release, "release_report.json")))
    done = thresher("report", release)
    assert done.returncode == 0 and done.stderr == ""
    lines = done.stdout.splitlines()
    assert lines[0].startswith(f"release look: {report['released_keys']:,} keys released with "
                               "user-level (epsilon=1, delta=1e-08)-differential privacy")
    assert "bound: each user counted in at most " in done.stdout and "(chosen privately)" in done.stdout
    assert "  choose_contribution_bound: epsilon 0.1, delta 0" in lines
    assert not os.path.exists(os.path.join(release, "release_report.html"))


def test_report_html_never_writes_over_a_release_file(release, tmp_path):
    out = _copy_with(release, tmp_path)
    before = {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)}
    (tmp_path / "ro").mkdir()
    for dest, says in ((os.path.join(out, "released.parquet"), "is a file of the release"),
                       (os.path.join(out, "release_report.json"), "is a file of the release"),
                       (os.path.join(out, "notes.txt"), "is a file of the release"),
                       (out, "is a folder"), (str(tmp_path), "is a folder"),
                       (os.path.join(out, "released.parquet", "x.html"), "does not exist"),
                       (str(tmp_path / "missing" / "x.html"), "does not exist")):
        done = thresher("report", out, "--html", dest)
        assert done.returncode == 2, (dest, done.stderr)
        assert done.stderr.startswith("thresher: error: --html: ") and says in done.stderr, dest
        assert "Traceback" not in done.stderr
    assert {f: open(os.path.join(out, f), "rb").read() for f in os.listdir(out)} == before


@pytest.mark.parametrize("damage, names", [
    ({"released.parquet": os.urandom(4096)}, "released.parquet"),
    ({"released.parquet": b"PAR1" + bytes(64) + b"PAR1"}, "released.parquet"),
    ({"release_report.json": b"{not json"}, "release_report.json"),
    ({"release_report.json": b"[1,2,3]"}, "release_report.json"),
    ({"release_report.json": b'{"name": "x"}'}, "release_report.json"),
    ({"release_report.json": b"\xff\xfe\x00garbage"}, "release_report.json"),
])
def test_a_damaged_release_is_an_error_naming_the_file(release, tmp_path, damage, names):
    out = _copy_with(release, tmp_path)
    for name, data in damage.items():
        with open(os.path.join(out, name), "wb") as handle:
            handle.write(data)
    for argv in (["show", out], ["show", out, "--format", "csv"], ["report", out],
                 ["report", out, "--html", str(tmp_path / "page.html")]):
        done = thresher(*argv)
        assert done.returncode == 2, (argv, done.stderr)
        assert done.stderr.startswith("thresher: error: ") and os.path.join(out, names) in done.stderr
        assert "internal error" not in done.stderr and "nothing was published" not in done.stderr
        assert len(done.stderr.strip().splitlines()) == 1


# ---- the HTML page ---------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def other_releases(tmp_path_factory):
    """Real releases of 20,000 quickstart rows with a value column: one with aggregates
    (sum and mean of amount), one of quantiles of amount."""
    import numpy as np
    tmp = tmp_path_factory.mktemp("look_other")
    table = pq.read_table(QUICKSTART_DATA).slice(0, 20_000)
    amount = np.random.default_rng(0).uniform(0, 100, table.num_rows)
    data = tmp / "small.parquet"
    pq.write_table(table.append_column("amount", pa.array(amount)), data)
    common = (f"input: {{path: {data}, user: user_id, keys: [word]}}\n"
              "privacy: {epsilon: 1.0, delta: 1e-8}\n")
    specs = {
        "agg": common + """bounding: {max_keys_per_user: 8}
mechanism: {kind: gaussian}
aggregates:
  - {column: amount, statistic: sum, clip: [0, 200]}
  - {column: amount, statistic: mean, clip: [0, 200]}
""",
        "quantiles": f"input: {{path: {data}, user: user_id}}\n" + """privacy: {epsilon: 1.0, delta: 1e-6}
bounding: {max_keys_per_user: 1}
mechanism: {kind: quantiles, column: amount, ranks: [0.1, 0.5, 0.9], domain: [0, 100]}
"""}
    outs = {}
    for name, text in specs.items():
        spec = tmp / f"{name}.yaml"
        spec.write_text(f"name: {name}\n{text}output: {{path: {tmp / name}}}\n")
        done = thresher("run", spec)
        assert done.returncode == 0, done.stderr
        outs[name] = str(tmp / name)
    return outs


def _page(out, tmp_path, name="page.html"):
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    page = tmp_path / name
    done = thresher("report", out, "--html", page)
    assert done.returncode == 0, done.stderr
    return page.read_text()


def test_html_describes_the_keys_not_the_aggregate_columns(other_releases, tmp_path):
    text = _page(other_releases["agg"], tmp_path)
    assert "each word&#x27;s count of distinct users gets" in text
    assert "amount_sum and" not in text and "and amount_mean" not in text
    assert "amount_sum: the sum of amount per released word" in text
    words = thresher("report", other_releases["agg"]).stdout
    assert "each word's count of distinct users" in words and "amount_sum and" not in words


def test_html_of_quantiles_plots_the_released_quantiles(other_releases, tmp_path):
    text = _page(other_releases["quantiles"], tmp_path)
    plots = text.split("<h2>Plots</h2>", 1)
    assert len(plots) == 2 and plots[1].count('src="data:image/png;base64,') == 1
    assert "<figcaption>Released quantiles" in plots[1]
    assert "quantiles: of amount at ranks 0.1, 0.5, 0.9" in text


def test_html_bound_plot_shows_what_is_public_about_the_choice(release, tmp_path):
    """The scores V(C) and the EM's probabilities are not private (docs/contribution_bound.md,
    design mechanisms.md "What is public"): the page shows the candidates, the chosen C,
    the selection's epsilon and the score's sensitivity, and says why no score is shown."""
    report = json.load(open(os.path.join(release, "release_report.json")))
    sel, chosen = report["bounding"]["selection"], report["bounding"]["max_keys_per_user"]
    text = _page(release, tmp_path)
    caption = text.split("<figcaption>Contribution bound", 1)[1].split("</figcaption>", 1)[0]
    assert f"The bound C = {chosen} was drawn from {len(report['bounding']['candidates'])} candidates" in caption
    assert f"It spent epsilon {sel['epsilon']:g}" in caption
    assert f"sensitivity {sel['sensitivity']:.4g}" in caption
    assert "not differentially private, so they are not published" in caption


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="Chromium is not installed (apt-get install chromium); CI installs it "
                           "and never skips this test")
def test_html_pages_render_in_headless_chromium(release, other_releases, tmp_path):
    """The quantiles page and the chosen-bound page as Chromium paints them: the quantile
    line (matplotlib's first colour) and the chosen bound's red and its label's grey text
    are on the screen."""
    import numpy as np
    from PIL import Image
    from tests.pipelines.reports.test_summary import _render
    assert CHROMIUM is not None, "CI must have Chromium: .ci/run installs it"
    for out, colour in ((other_releases["quantiles"], [0x1f, 0x77, 0xb4]),
                        (release, [0xd1, 0x49, 0x5b])):
        _page(out, tmp_path)
        shot = _render(tmp_path / "page.html", tmp_path)
        pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
        assert np.any(np.all(np.abs(pixels - colour) < 12, axis=1)), out
        os.remove(shot)


@pytest.mark.parametrize("argv", [["plan"], ["plan", "--verbose"], ["schema"]])
def test_other_commands_into_a_closed_pipe_end_quietly(write_spec, argv):
    """The reader is gone before the command writes (its end closed at once; the child
    needs seconds to import): exit 0, nothing on stderr, not an internal error."""
    command = [sys.executable, "-m", "thresher.pipelines.cli", argv[0]]
    if argv[0] == "plan":
        command += [write_spec(), *argv[1:]]
    proc = subprocess.Popen(command, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and err == b"", err[-2000:]

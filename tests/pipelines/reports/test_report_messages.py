"""Issue 42, "Reports, messages": ``thresher show``, ``report`` and ``report --html``
through the real CLI (a new interpreter, as a user runs them; releases made by
``thresher run``), the page rendered in a real headless Chromium:

- log-axis tick labels are plain text, not math-text markup (``$\\mathdefault{10^{4}}$``);
- a 10,000-character key is cut with an ellipsis in every table and plot label;
- CJK and emoji keys draw without a matplotlib warning on stderr;
- a release of no key says so instead of "Top 0 keys" over an empty table;
- ``--html /dev/stdout | head`` ends quietly;
- the README says what ``report --html`` needs, where it names it;
- run, show, report and the page say counts are of the bounded data;
- a JSONL user id at or above 2**63 is refused in plain words;
- a key holding backslash-n and a key holding a line break are shown apart;
- every field ``plan --json`` prints is documented."""
import base64
import glob
import io
import json
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.cli import main

from tests.pipelines.conftest import ROOT
from tests.pipelines.reports.test_summary import CHROMIUM, _render

LONG_KEY = "L" * 10_000
BIG_KEY = "big"                 # 12,000 users: the released counts span 10^3..10^4
CJK_KEYS = ("中文字", "日本語のキー", "😀 emoji", "🦜🦩")
BACKSLASH_N = "a\\nb"           # a backslash and an n
LINE_BREAK = "a\nb"             # a real line break
KEYS = (LONG_KEY, BACKSLASH_N, LINE_BREAK) + CJK_KEYS
USERS = 400                     # per key but BIG_KEY: far above the threshold (about 22)
BOUNDED = "counts are of the bounded data: a user holding more than 1 key is counted in 1"

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Chromium is not installed (apt-get install chromium); CI installs it and never "
           "skips this test")


def thresher(*argv, timeout=300, **kwargs):
    return subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", *map(str, argv)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout, **kwargs)


def _spec(tmp, data, name, fmt=""):
    spec = tmp / f"{name}.yaml"
    spec.write_text(f"""name: {name}
input: {{path: {data}, user: uid, keys: [key]{fmt}}}
privacy: {{epsilon: 1.0, delta: 1e-6}}
bounding: {{max_keys_per_user: 1}}
mechanism: {{kind: gaussian}}
output: {{path: {tmp / name}}}
""")
    return spec


@pytest.fixture(scope="module")
def weird(tmp_path_factory):
    """A real release (run through the CLI) of the keys above: each key but BIG_KEY held
    by USERS users, BIG_KEY by 12,000, one key per user. Every key is released but with
    probability < 1e-30 (400 users against a threshold near 22 with sigma near 4.2). The
    run's stdout is kept for the words it ends with."""
    tmp = tmp_path_factory.mktemp("issue42")
    keys = [BIG_KEY] * 12_000 + [k for k in KEYS for _ in range(USERS)]
    data = tmp / "weird.parquet"
    pq.write_table(pa.table({"uid": np.arange(len(keys)), "key": keys}), data)
    done = thresher("run", _spec(tmp, data, "weird"))
    assert done.returncode == 0, done.stderr
    out = str(tmp / "weird")
    assert json.load(open(os.path.join(out, "release_report.json")))["released_keys"] == len(KEYS) + 1
    return out, done.stdout


@pytest.fixture(scope="module")
def plain(tmp_path_factory):
    """A real release of ASCII keys only: BIG_KEY with 12,000 users, k0..k4 with USERS."""
    tmp = tmp_path_factory.mktemp("issue42_plain")
    keys = [BIG_KEY] * 12_000 + [f"k{i}" for i in range(5) for _ in range(USERS)]
    data = tmp / "plain.parquet"
    pq.write_table(pa.table({"uid": np.arange(len(keys)), "key": keys}), data)
    done = thresher("run", _spec(tmp, data, "plain"))
    assert done.returncode == 0, done.stderr
    return str(tmp / "plain")


def _page(out, tmp_path, name="page.html", quiet=False):
    """``report --html`` into tmp_path/name; ``quiet``: and nothing on stderr."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    page = tmp_path / name
    done = thresher("report", out, "--html", page)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stderr == "" or not quiet, done.stderr[-3000:]
    return page


def _tick_labels(out, tmp_path, monkeypatch):
    """{figure title: [tick label texts as drawn]} of the page's plots, taken from each
    figure as it is saved (``report --html`` in-process, through ``cli.main``)."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from thresher.pipelines.reports import html_report
    seen, original = {}, html_report._png

    def spy(fig, plt):
        png = original(fig, plt)            # draws the figure: its ticks are formatted
        for ax in fig.axes:
            labels = ax.get_xticklabels() + ax.get_yticklabels()
            labels += ax.get_xticklabels(minor=True) + ax.get_yticklabels(minor=True)
            seen.setdefault(ax.get_title(), []).extend(t.get_text() for t in labels)
        return png
    monkeypatch.setattr(html_report, "_png", spy)
    assert main(["report", out, "--html", str(tmp_path / "spy.html")]) == 0
    return seen


def test_log_axis_tick_labels_are_plain_text(weird, tmp_path, monkeypatch):
    """With matplotlib's math text off (issue 36 D2) its log-axis labels were printed as
    their markup, ``$\\mathdefault{10^{4}}$``. Each label is now a plain number, 10 to a
    superscript power, or a coefficient times one."""
    labels = _tick_labels(weird[0], tmp_path, monkeypatch)
    values = labels["Released values, largest first (log scales)"]
    assert values and not any("$" in t or "mathdefault" in t
                              for ts in labels.values() for t in ts), labels
    plain = re.compile(r"^−?(?:[0-9][0-9.,]*|(?:[0-9.]+×)?10[⁻⁰¹²³⁴⁵⁶⁷⁸⁹·]+)?$")
    assert all(plain.match(t) for t in values), values
    assert "10⁴" in values and "1" in values     # the counts reach 10^4; rank 1


@needs_chromium
def test_the_page_of_long_and_wide_keys_fits_the_window(weird, tmp_path, monkeypatch):
    """Chromium paints the page at 1000 px: the 10,000-character key pushed the table, and
    every count with it, past the window's right edge (the header's colour reached the
    edge). The key is cut to 60 characters with an ellipsis in the table and to 40 in the
    plot labels; the counts' column is on the screen; the log axis's tick labels are
    short (plain text, not math-text markup)."""
    from PIL import Image
    assert CHROMIUM is not None, "CI must have Chromium: .ci/run installs it"
    page = _page(weird[0], tmp_path)
    text = page.read_text()
    assert f'<td class="text">{"L" * 59}…</td>' in text and "L" * 61 not in text
    assert "a text longer than 60 characters is cut" in text
    shot = _render(page, tmp_path)
    pixels = np.asarray(Image.open(shot).convert("RGB")).astype(int)
    header = np.all(np.abs(pixels - [0xe8, 0xee, 0xf3]) < 3, axis=2)   # th background
    columns = np.flatnonzero(header.any(axis=0))
    assert len(columns) and columns.max() < pixels.shape[1] - 100, columns.max()
    labels = _tick_labels(weird[0], tmp_path, monkeypatch)
    drawn = [t for ts in labels.values() for t in ts if t.startswith("L")]
    assert drawn == ["L" * 39 + "…"], drawn
    # The tick labels as painted: the released-values plot's y axis (its spine, the first
    # column of pixels dark over half the plot's height) sits right of its tick labels
    # and the axis title. "10⁴" at 10 pt and 110 dpi is about 30 px wide; the markup
    # "$\mathdefault{10^{4}}$" printed as text, about 170 px.
    first = re.search(r'alt="Released values" src="data:image/png;base64,([^"]+)"', text)
    plot = Image.open(io.BytesIO(base64.b64decode(first.group(1)))).convert("L")
    dark = (np.asarray(plot).astype(int) < 60).mean(axis=0)
    assert 0 < np.flatnonzero(dark > 0.5)[0] < 150, np.flatnonzero(dark > 0.5)[:2]


def test_cjk_and_emoji_keys_make_no_warning(weird, tmp_path):
    """matplotlib's DejaVu Sans has no CJK glyphs: each such character printed a "Glyph
    ... missing from font(s)" warning on stderr (and was drawn as an empty box). The plot
    labels write those characters escaped; the page's table holds the keys as written."""
    text = _page(weird[0], tmp_path, quiet=True).read_text()
    for key in CJK_KEYS:
        assert f'<td class="text">{key}</td>' in text
    from thresher.pipelines.reports import html_report
    assert html_report._label("中文字") == "\\u4e2d\\u6587\\u5b57"


def test_a_release_of_no_key_says_so(tmp_path):
    """Five users per key against a threshold near 22 (sigma near 4.2): no key is released
    but with probability < 1e-6 per key (4 standard deviations). show, report and the page
    say that no key was released, not "Top 0 keys" over an empty table."""
    keys = [f"k{i}" for i in range(20) for _ in range(5)]
    data = tmp_path / "few.parquet"
    pq.write_table(pa.table({"uid": np.arange(len(keys)), "key": keys}), data)
    done = thresher("run", _spec(tmp_path, data, "empty"))
    assert done.returncode == 0, done.stderr
    out = str(tmp_path / "empty")
    assert json.load(open(os.path.join(out, "release_report.json")))["released_keys"] == 0
    shown = thresher("show", out)
    assert shown.returncode == 0 and shown.stdout == "empty: no key was released\n"
    words = thresher("report", out)
    assert words.returncode == 0 and "no key was released" in words.stdout
    assert "top 0" not in words.stdout
    page = _page(out, tmp_path).read_text()
    assert "No key was released" in page and "Top 0 keys" not in page and "<table" not in page


def test_html_to_standard_output_closed_early_ends_quietly(plain, tmp_path):
    """``report --html /dev/stdout | head -1``: the page (hundreds of KB of PNG) cannot fit
    the 64 KB pipe, so the writer meets the closed pipe: exit 0, nothing on stderr (on
    main: exit 2, "cannot write '/dev/stdout': Broken pipe"). Into a file (``>
    page.html``, which the shell creates empty) the page is written whole, with no
    "wrote" line after it."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    out = plain
    proc = subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", "report", out,
                             "--html", "/dev/stdout"], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    first = proc.stdout.readline()
    proc.stdout.close()
    err = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and err == b"" and first == b"<!DOCTYPE html>\n", err
    target = tmp_path / "page.html"
    with open(target, "w") as handle:
        done = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", "report", out,
                               "--html", "/dev/stdout"], cwd=ROOT, stdout=handle,
                              stderr=subprocess.PIPE, text=True, timeout=300)
    assert done.returncode == 0 and done.stderr == ""
    text = target.read_text()
    assert text.startswith("<!DOCTYPE html>") and text.endswith("</html>\n")


def test_the_readme_says_what_report_html_needs():
    """README command 1 (``pip install .``) installs no matplotlib, which ``report --html``
    needs (the ``report`` extra); the README says so where its prose names the command,
    and that extra holds matplotlib. Without it the command exits 2 saying what to
    install (tests/pipelines/reports/test_summary.py::test_report_html_without_matplotlib_exits_2_saying_what_to_install)."""
    readme = open(os.path.join(ROOT, "README.md"), encoding="utf-8").read()
    prose = " ".join(readme.split("\n\n")[[i for i, p in enumerate(readme.split("\n\n"))
                                           if "`thresher report out/quickstart" in p][0]].split())
    assert "a page with plots (it needs matplotlib: `python -m pip install \".[report]\"`)" in prose
    setup = open(os.path.join(ROOT, "setup.py"), encoding="utf-8").read()
    assert re.search(r'"report": \["matplotlib[^"]*"\]', setup)


def test_counts_are_said_to_be_of_the_bounded_data(weird, tmp_path):
    """Each user counts in at most C keys: a key's count is of the bounded data, not of
    all its input records. run's closing words, show's table, report and the page say so."""
    out, run_stdout = weird
    assert BOUNDED in run_stdout
    for argv in (["show", out], ["report", out]):
        done = thresher(*argv)
        assert done.returncode == 0 and BOUNDED in done.stdout, argv
    assert BOUNDED in _page(out, tmp_path).read_text()


def test_a_jsonl_user_id_beyond_int64_is_refused_in_plain_words(tmp_path):
    """pyarrow reads a JSON integer >= 2**63 as a double: the id has lost digits. The
    refusal names the field, file, row and column, shows the number as a number (not
    ``np.float64(...)``), has no Beam stage name, and says what to write instead; written
    as JSON strings, the same ids are read."""
    rows = [{"uid": 2 ** 63 + i, "key": "k"} for i in range(3)]
    data = tmp_path / "ids.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in [{"uid": 1, "key": "k"}] + rows))
    done = thresher("run", _spec(tmp_path, data, "ids"))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith(f"thresher: error: input.user: '{data}' row 2: the user id "
                                  f"9.223372036854776e+18 in column 'uid' ")
    assert "write the user ids as JSON strings" in done.stderr
    assert "np." not in done.stderr and "while running" not in done.stderr
    assert len(done.stderr.splitlines()) == 1
    data.write_text("".join(json.dumps({"uid": str(r["uid"]), "key": "k"}) + "\n" for r in rows))
    done = thresher("run", _spec(tmp_path, data, "ids"))
    assert done.returncode == 0, done.stderr


def test_backslash_n_and_a_line_break_are_shown_apart(weird, tmp_path):
    """The key ``a\\nb`` (backslash, n) and the key holding a line break were both shown
    ``a\\nb``. A key holding a control character is now shown quoted, its backslashes
    and quotes escaped too: ``"a\\nb"``; a printable key as it is."""
    out = weird[0]
    for argv in (["show", out], ["report", out]):
        lines = [line.strip() for line in thresher(*argv).stdout.splitlines()]
        assert any(line.startswith(f"{BACKSLASH_N} ") for line in lines), argv
        assert any(line.startswith('"a\\nb" ') for line in lines), argv
    text = _page(out, tmp_path).read_text()
    assert '<td class="text">a\\nb</td>' in text
    assert '<td class="text">&quot;a\\nb&quot;</td>' in text
    rows = [json.loads(line) for line in thresher("show", out, "--format", "json").stdout.splitlines()]
    assert {BACKSLASH_N, LINE_BREAK} <= {r["key"] for r in rows}     # the data as published
    # csv into a terminal: the fields as the table shows them, then quoted as csv quotes
    lines = _on_a_terminal(["show", out, "--format", "csv"]).splitlines()
    assert any(line.startswith(f"{BACKSLASH_N},") for line in lines), lines
    assert any(line.startswith('"""a\\nb""",') for line in lines), lines


def _on_a_terminal(argv):
    """What a command writes when its standard output is a terminal (a pseudo-terminal:
    the line discipline turns LF into CR LF, undone here)."""
    import pty
    master, slave = pty.openpty()
    proc = subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", *argv], cwd=ROOT,
                            stdout=slave, stderr=subprocess.PIPE)
    os.close(slave)
    chunks = []
    while True:
        try:
            data = os.read(master, 1 << 16)
        except OSError:            # EIO: the writer closed its end
            break
        if not data:
            break
        chunks.append(data)
    os.close(master)
    assert proc.wait(timeout=300) == 0 and proc.stderr.read() == b""
    return b"".join(chunks).decode("utf-8").replace("\r\n", "\n")


def _fields(document, path=""):
    if isinstance(document, dict):
        for name, value in document.items():
            yield name, f"{path}.{name}"
            yield from _fields(value, f"{path}.{name}")
    elif isinstance(document, list):
        for value in document:
            yield from _fields(value, f"{path}[]")


def test_every_field_plan_json_prints_is_documented(tmp_path):
    """``plan --json`` of the two example specs (the quickstart; heavy hitters, trie
    method): every field name it prints is documented in docs/ (as `name`, "name" or
    .name`). ``mechanism.calibrated`` and ``privacy.zcdp.meaning`` were not."""
    docs = "".join(open(p, encoding="utf-8").read() for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))
    missing = {}
    for example in ("quickstart", "heavy_hitters"):
        done = thresher("plan", os.path.join("configs", "examples", f"{example}.yaml"), "--json")
        assert done.returncode == 0, done.stderr
        for name, where in _fields(json.loads(done.stdout)):
            if not re.fullmatch(r"[a-z_0-9]+", name):
                continue          # a value keyed by data (an interval column's name)
            if not any(form in docs for form in (f"`{name}`", f'"{name}"', f".{name}`")):
                missing.setdefault(where, example)
    assert missing == {}

"""Issue 36's defects of ``thresher report`` (text and ``--html``), through the real CLI
(``pipelines.cli.main``, releases made by ``thresher run``): keys holding ``$`` (D2), error
bars of every interval column (D4), flags per statistic (D5), ``rank`` is no key (D6),
the quantiles' null values and actual resolution (D9), and the page never written over a
file that is no page (D11). Pages render in a real headless Chromium as
tests/pipelines/reports/test_summary.py's do. docs/robustness.md lists the cases."""
import json
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.cli import main

from tests.pipelines.conftest import QUICKSTART_DATA
from tests.pipelines.reports.test_summary import CHROMIUM, _render


def _render_tall(page, tmp_path):
    """A Chromium screenshot of the whole page (the interval panels come last)."""
    import subprocess
    shot = tmp_path / "tall.png"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", "--no-first-run",
                           f"--user-data-dir={tmp_path / 'profile-tall'}",
                           "--window-size=1000,9000", f"--screenshot={shot}",
                           f"file://{os.path.abspath(page)}"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return shot

DOLLAR_KEYS = ("$\\frac{$", "a$b$c", "$x^2$")
ZERO_KEYS = 30          # keys whose users all have amount 0: their stddev is 0 (clamped)

needs_chromium = pytest.mark.skipif(
    CHROMIUM is None and not os.environ.get("CI"),
    reason="Chromium is not installed (apt-get install chromium); CI installs it and never "
           "skips this test")


def _spec(path, data, out, mechanism="{kind: gaussian}", extra=""):
    path.write_text(f"""name: issue36
input: {{path: {data}, user: uid, keys: [key]}}
privacy: {{epsilon: 1.0, delta: 1e-6}}
bounding: {{max_keys_per_user: 1}}
mechanism: {mechanism}
{extra}output: {{path: {out}}}
""")
    return str(path)


@pytest.fixture(scope="module")
def dollar_release(tmp_path_factory):
    """A gaussian release with a sum, a mean and a stddev of ``amount``: three keys that
    hold ``$`` (matplotlib math text), each with 400 users and amounts around 2; and
    ZERO_KEYS keys of 300 users whose amounts are all 0 (a stddev of 0, released as 0
    whenever its noise is negative, which happens for some of the 30 keys except with
    probability about 2**-30)."""
    tmp = tmp_path_factory.mktemp("issue36_dollar")
    rng = np.random.default_rng(36)
    users, keys, amounts = [], [], []
    uid = 0
    for key in DOLLAR_KEYS:
        for _ in range(400):
            users.append(uid)
            keys.append(key)
            amounts.append(float(rng.normal(2.0, 1.0)))
            uid += 1
    for k in range(ZERO_KEYS):
        for _ in range(300):
            users.append(uid)
            keys.append(f"zero{k:02d}")
            amounts.append(0.0)
            uid += 1
    data = tmp / "data.parquet"
    pq.write_table(pa.table({"uid": users, "key": keys, "amount": amounts}), data)
    spec = _spec(tmp / "spec.yaml", data, tmp / "out", extra="""aggregates:
  - {column: amount, statistic: sum, clip: [-5, 5]}
  - {column: amount, statistic: mean, clip: [-5, 5]}
  - {column: amount, statistic: stddev, clip: [-5, 5]}
""")
    assert main(["run", spec, "-q"]) == 0
    return str(tmp / "out")


def test_html_report_draws_keys_with_dollars_as_written(dollar_release, tmp_path):
    """D2: keys ``$\\frac{$`` made report --html an internal error (matplotlib parsed them
    as math text) and ``a$b$c`` was drawn as italics without its dollars. The page is
    made, its table holds every key as written, and it renders in Chromium."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    page = tmp_path / "page.html"
    assert main(["report", dollar_release, "--html", str(page)]) == 0
    text = page.read_text()
    for key in DOLLAR_KEYS:
        assert f'<td class="text">{key}</td>' in text
    if CHROMIUM is not None or os.environ.get("CI"):
        assert os.path.getsize(_render(page, tmp_path)) > 0


def test_plot_labels_are_drawn_literally():
    """D2, the drawing itself: under the report's settings a label ``a$b$c`` is five
    glyphs wide (the literal text), wider than matplotlib's math-text rendering of it
    (three glyphs, the dollars removed) -- so no data-derived label is parsed as math."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from thresher.pipelines.reports import html_report
    plt = html_report._pyplot()

    def width(text, settings):
        with plt.rc_context(settings):
            fig, ax = plt.subplots()
            label = ax.text(0, 0, text)
            fig.canvas.draw()
            w = label.get_window_extent().width
            plt.close(fig)
        return w
    literal = width("a$b$c", html_report._literal_text())
    assert literal > width("a$b$c", {"text.parse_math": True}) + 1
    assert literal == pytest.approx(width("a\\$b\\$c", {"text.parse_math": True}), rel=0.05)
    width("$\\frac{$", html_report._literal_text())        # no ValueError: drawn as written


@needs_chromium
def test_html_error_bars_show_every_interval_column(dollar_release, tmp_path):
    """D4: one panel per value column with an interval (count, sum, mean, stddev), each on
    the scale of its own values (relative to the value), not only the count's."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from thresher.pipelines.reports import html_report
    page = tmp_path / "page.html"
    assert main(["report", dollar_release, "--html", str(page)]) == 0
    text = page.read_text()
    columns = ["count", "amount_sum", "amount_mean", "amount_stddev"]
    assert f"Top keys with intervals ({', '.join(columns)})" in text
    # the figure itself: as many panels as columns, each with its own x range
    import matplotlib
    matplotlib.use("Agg")
    table = pq.read_table(os.path.join(dollar_release, "released.parquet"))
    top = table.sort_by([("count", "descending")]).slice(0, 5)
    fig = html_report._interval_figure(html_report._pyplot(), top, ["key"], columns)
    assert [ax.get_title() for ax in fig.axes] == columns
    ranges = [ax.get_xlim()[1] for ax in fig.axes]
    assert len({round(r, 6) for r in ranges}) > 1      # scales differ per column
    shot = _render_tall(page, tmp_path)
    from PIL import Image
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    bar = [int(html_report.ERROR_BAR_COLOUR[i:i + 2], 16) for i in (1, 3, 5)]
    assert np.sum(np.all(np.abs(pixels - bar) < 12, axis=1)) > 200


def test_flags_follow_the_statistic(dollar_release, tmp_path):
    """D5: a stddev is never flagged "interval includes 0" (it is >= 0); one released as 0
    is flagged "clamped at 0"; sums and means keep "interval includes 0"."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from thresher.pipelines.reports import html_report
    table = pq.read_table(os.path.join(dollar_release, "released.parquet"))
    rows = table.to_pylist()
    zero = [r for r in rows if r["amount_stddev"] == 0]
    assert zero, "some of the 30 zero-variance keys must be released with stddev 0"
    report = __import__("json").load(open(os.path.join(dollar_release, "release_report.json")))
    stats = html_report.statistics(report)
    assert stats["amount_stddev"] == "stddev" and stats["amount_sum"] == "sum"
    for r in rows:
        flags = html_report._flags(r["amount_stddev"], r["amount_stddev_low"],
                                   r["amount_stddev_high"], "stddev")
        assert "interval includes 0" not in flags
        assert ("clamped at 0" in flags) == (r["amount_stddev"] == 0)
        sum_flags = html_report._flags(r["amount_sum"], r["amount_sum_low"],
                                       r["amount_sum_high"], "sum")
        assert ("interval includes 0" in sum_flags) == (
            r["amount_sum_low"] <= 0 <= r["amount_sum_high"])
    page = tmp_path / "page.html"
    assert main(["report", dollar_release, "--html", str(page), "--overwrite"]) == 0
    text = page.read_text()
    assert "clamped at 0" in text
    stddev_line = next(line for line in text.split("<li>")
                       if line.startswith("amount_stddev: a typical released value"))
    assert "include 0" not in stddev_line and "clamped at 0" in stddev_line


@pytest.fixture(scope="module")
def heavy_hitters_release(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("issue36_hh")
    data = tmp / "small.parquet"
    pq.write_table(pq.read_table(QUICKSTART_DATA).slice(0, 50_000), data)
    spec = tmp / "spec.yaml"
    spec.write_text(f"""name: hh
input: {{path: {data}, user: user_id, keys: [word]}}
privacy: {{epsilon: 1.0, delta: 1.0e-6}}
bounding: {{max_keys_per_user: 4}}
mechanism: {{kind: heavy_hitters, top_k: 5}}
output: {{path: {tmp / 'out'}}}
""")
    assert main(["run", str(spec), "-q"]) == 0
    return str(tmp / "out")


def test_rank_is_not_a_key_in_the_words(heavy_hitters_release, capsys):
    """D6: report of heavy hitters said "a word and rank"; rank is an output column."""
    assert main(["report", heavy_hitters_release]) == 0
    out = capsys.readouterr().out
    assert "word and rank" not in out and " rank's " not in out
    assert "for a word whose users hold" in out
    from thresher.pipelines.reports import summary
    import json
    report = json.load(open(os.path.join(heavy_hitters_release, "release_report.json")))
    names = pq.read_schema(os.path.join(heavy_hitters_release, "released.parquet")).names
    assert summary.key_columns(names, report) == ["word"]


def _quantile_data(path, n_users, keys=None):
    rng = np.random.default_rng(9)
    users = np.arange(n_users)
    columns = {"uid": users, "x": rng.uniform(0, 100, n_users)}
    if keys:
        columns["key"] = [keys[i % len(keys)] for i in users]
    pq.write_table(pa.table(columns), path)
    return str(path)


def test_quantiles_report_the_resolution_their_values_have(tmp_path, capsys):
    """D9: global hierarchical quantiles of 3,000 users (domain [0, 100], 16**3 leaves):
    the deeper levels release nothing, so the values are level-1 bucket edges (100/16
    apart) while the plan's resolution is 100/4096. Each value's own resolution is in the
    released ``resolution`` column, and the report says the values are coarser."""
    data = _quantile_data(tmp_path / "q.parquet", 3000)
    spec = tmp_path / "q.yaml"
    spec.write_text(f"""name: q
input: {{path: {data}, user: uid}}
privacy: {{epsilon: 1.0, delta: 1.0e-6}}
bounding: {{max_keys_per_user: 1}}
mechanism: {{kind: quantiles, column: x, ranks: [0.25, 0.5, 0.75], domain: [0, 100]}}
output: {{path: {tmp_path / 'out'}}}
""")
    assert main(["run", str(spec)]) == 0
    run_out = capsys.readouterr().out
    table = pq.read_table(tmp_path / "out" / "released.parquet")
    finest = 100 / 16 ** 3
    res = table.column("resolution").to_pylist()
    values = table.column("value").to_pylist()
    assert all(r is not None and r >= finest * (1 - 1e-12) for r in res)
    assert all(any(abs(r - 100 / 16 ** d) < 1e-9 for d in range(4)) for r in res)
    # Not left to chance: a leaf cell is released only when its sampled count reaches the
    # threshold, and no leaf of this data (seed 9) holds that many users, so no value can
    # have the finest resolution whatever the secret (false-failure probability 0)
    threshold = json.loads((tmp_path / "out" / "release_report.json").read_text())[
        "mechanism"]["threshold"]
    x = pq.read_table(data).column("x").to_numpy()
    leaves = np.bincount(np.minimum((x / 100 * 16 ** 3).astype(int), 16 ** 3 - 1))
    assert leaves.max() < threshold, (leaves.max(), threshold)
    coarse = [(v, r) for v, r in zip(values, res) if r > finest * 1.5]
    assert coarse, "at 3,000 users the deeper levels must release nothing somewhere"
    assert "are coarser than the plan's finest" in run_out
    assert main(["report", str(tmp_path / "out")]) == 0
    assert "are coarser than the plan's finest" in capsys.readouterr().out


def test_quantiles_summary_says_when_every_value_is_null(tmp_path, capsys):
    """D9: per-key binary_search on keys far too small to release anything: 8 keys come
    back with every value null; the summary says so and why (it said "released 8 keys")."""
    keys = [f"k{i}" for i in range(8)]
    data = _quantile_data(tmp_path / "q.parquet", 80, keys)
    public = tmp_path / "keys.csv"
    public.write_text("key\n" + "\n".join(keys) + "\n")
    spec = tmp_path / "q.yaml"
    spec.write_text(f"""name: q
input: {{path: {data}, user: uid, keys: [key], public_keys: {{path: {public}}}}}
privacy: {{epsilon: 1.0, delta: 1.0e-6}}
bounding: {{max_keys_per_user: 1}}
mechanism: {{kind: quantiles, column: x, ranks: [0.5], domain: [0, 100],
            method: binary_search, rounds: 4}}
output: {{path: {tmp_path / 'out'}}}
""")
    assert main(["run", str(spec)]) == 0
    run_out = capsys.readouterr().out
    table = pq.read_table(tmp_path / "out" / "released.parquet")
    # Not left to chance: each key holds 10 users, below the sampled count's threshold, so
    # no cell of any round can be released whatever the secret (false-failure probability 0)
    threshold = json.loads((tmp_path / "out" / "release_report.json").read_text())[
        "mechanism"]["threshold"]
    assert len(keys) * 10 == 80 and 10 < threshold, threshold
    assert table.num_rows == 8 and table.column("value").null_count == 8
    for text in (run_out,):
        assert "null values: 8 of 8 (every value); 8 of 8 keys have no value at all" in text
        assert "nothing about it was released" in text
    assert main(["report", str(tmp_path / "out")]) == 0
    assert "null values: 8 of 8 (every value)" in capsys.readouterr().out


def test_without_interval_names_the_quantiles_value(tmp_path):
    """Small item: the report's without_interval named ``count``, which quantiles do not
    release; it names ``value``."""
    data = _quantile_data(tmp_path / "q.parquet", 500)
    spec = tmp_path / "q.yaml"
    spec.write_text(f"""name: q
input: {{path: {data}, user: uid}}
privacy: {{epsilon: 1.0, delta: 1.0e-6}}
bounding: {{max_keys_per_user: 1}}
mechanism: {{kind: quantiles, column: x, ranks: [0.5], domain: [0, 100]}}
output: {{path: {tmp_path / 'out'}}}
""")
    assert main(["run", str(spec), "-q"]) == 0
    import json
    report = json.load(open(tmp_path / "out" / "release_report.json"))
    assert list(report["intervals"]["without_interval"]) == ["value"]


def test_report_html_never_writes_over_a_file_that_is_no_page(dollar_release, tmp_path, capsys):
    """D11: ``--html spec.yaml`` turned the spec into a page. An existing file that is not
    an earlier report page is refused (exit 2, unchanged) unless --overwrite; an earlier
    page is replaced."""
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    spec = tmp_path / "spec.yaml"
    spec.write_text("name: precious\n")
    assert main(["report", dollar_release, "--html", str(spec)]) == 2
    err = capsys.readouterr().err
    assert "--html" in err and "is not a page thresher report wrote" in err and "--overwrite" in err
    assert spec.read_text() == "name: precious\n"
    link = tmp_path / "link.html"
    link.symlink_to(spec)                       # a link to it is refused the same way
    assert main(["report", dollar_release, "--html", str(link)]) == 2
    assert spec.read_text() == "name: precious\n"
    page = tmp_path / "page.html"
    assert main(["report", dollar_release, "--html", str(page)]) == 0
    first = page.read_text()
    assert main(["report", dollar_release, "--html", str(page)]) == 0   # an earlier page
    assert page.read_text().startswith("<!DOCTYPE html>") and first
    assert main(["report", dollar_release, "--html", str(spec), "--overwrite"]) == 0
    assert spec.read_text().startswith("<!DOCTYPE html>")

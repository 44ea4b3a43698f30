"""The HTML report's intervals (issue 27): error bars on the top keys, accuracy in words,
flags on values whose interval includes 0 or whose noise dominates -- rendered in a real
headless Chromium as tests/pipelines/reports/test_summary.py does."""
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.cli import main

from tests.pipelines.reports.test_summary import CHROMIUM, _render


@pytest.fixture(scope="module")
def release_with_sums(tmp_path_factory):
    """A gaussian release with a sum of a signed column: large keys have clear sums, small
    ones sums whose intervals include 0."""
    tmp = tmp_path_factory.mktemp("intervals_html")
    rng = np.random.default_rng(9)
    users, keys, amounts = [], [], []
    for u in range(5000):
        for k in rng.choice(10, size=rng.integers(1, 3), replace=False,
                            p=np.array([40, 20, 10, 8, 6, 5, 4, 3, 2, 2]) / 100):
            users.append(u)
            keys.append(f"k{k}")
            amounts.append(float(rng.normal(1.0 if k < 2 else 0.0, 3.0)))
    data = tmp / "data.parquet"
    pq.write_table(pa.table({"uid": users, "key": keys, "amount": amounts}), data)
    spec = tmp / "spec.yaml"
    spec.write_text(f"""name: with-sums
input: {{path: {data}, user: uid, keys: [key]}}
privacy: {{epsilon: 1.0, delta: 1e-6}}
bounding: {{max_keys_per_user: 2}}
mechanism: {{kind: gaussian}}
aggregates:
  - {{column: amount, statistic: sum, clip: [-5, 5]}}
  - {{column: amount, statistic: mean, clip: [-5, 5]}}
output: {{path: {tmp / 'out'}}}
""")
    assert main(["run", str(spec)]) == 0
    return str(tmp / "out")


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="Chromium is not installed (apt-get install chromium); CI installs it "
                           "and never skips this test")
def test_html_report_draws_error_bars_and_flags_uncertain_values(release_with_sums, tmp_path):
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    from thresher.pipelines.reports import html_report
    table = pq.read_table(os.path.join(release_with_sums, "released.parquet"))
    page = tmp_path / "page.html"
    assert main(["report", release_with_sums, "--html", str(page)]) == 0
    text = page.read_text()
    assert "<h2>Accuracy (0.95 confidence intervals)</h2>" in text
    for column in ("count", "amount_sum", "amount_mean"):
        assert f"<li>{column}: a typical released value is within +/- " in text
    assert "the target is the count after contribution bounding" in text
    # values shown with their intervals; the flags match the published intervals
    rows = table.to_pylist()
    zero = [r for r in rows if r["amount_sum_low"] <= 0 <= r["amount_sum_high"]]
    clear = [r for r in rows if r["amount_sum_low"] > 0]
    assert zero and clear, "the data should give both kinds of sums"
    assert text.count("interval includes 0") >= len(zero)
    assert f"{rows[0]['count']:,} [{rows[0]['count_low']:,}, {rows[0]['count_high']:,}]" in text
    assert "count [low, high]</th>" in text
    assert text.count('src="data:image/png;base64,') == 3   # values, probability, error bars
    shot = _render(page, tmp_path)
    from PIL import Image
    pixels = np.asarray(Image.open(shot).convert("RGB")).reshape(-1, 3).astype(int)
    bar = [int(html_report.ERROR_BAR_COLOUR[i:i + 2], 16) for i in (1, 3, 5)]
    # the error bars (matplotlib drew them, Chromium painted them) and the flag's shade
    assert np.sum(np.all(np.abs(pixels - bar) < 12, axis=1)) > 50
    assert np.any(np.all(np.abs(pixels - [0xfd, 0xec, 0xea]) < 4, axis=1))

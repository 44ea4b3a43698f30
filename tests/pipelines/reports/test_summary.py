"""The release summary: `thresher run`'s closing lines, `thresher show`, and
`thresher report --html` (rendered in a real headless Chromium), plus the release
probability curve checked against brute-force sums."""
import math
import os
import shutil
import subprocess
import sys

import numpy as np
import pyarrow.parquet as pq
import pytest

from thresher.pipelines.reports import summary
from thresher.pipelines.cli import main
from thresher.transforms.randomness import keyed_random

from tests.pipelines.conftest import ROOT

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """Two published releases of 20,000 quickstart rows: a fixed bound and an auto bound."""
    from tests.pipelines.conftest import QUICKSTART_DATA
    tmp = tmp_path_factory.mktemp("summary")
    data = tmp / "small.parquet"
    pq.write_table(pq.read_table(QUICKSTART_DATA).slice(0, 20_000), data)
    outs = {}
    for name, bound in (("fixed", "8"), ("auto", "auto")):
        spec = tmp / f"{name}.yaml"
        spec.write_text(f"""name: {name}
input: {{path: {data}, user: user_id, keys: [word]}}
privacy: {{epsilon: 1.0, delta: 1e-8}}
bounding: {{max_keys_per_user: {bound}}}
mechanism: {{kind: gaussian}}
output: {{path: {tmp / name}}}
""")
        outs[name] = (str(spec), str(tmp / name))
    return outs


def test_run_ends_with_files_and_the_release_in_words(released, capsys):
    spec, out = released["fixed"]
    assert main(["run", spec]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    report = summary.load_report(out)
    assert lines[0] == f"wrote {out}/released.parquet, {out}/release_report.json"
    assert lines[1].startswith(f"released {report['released_keys']:,} keys; spent epsilon=1, "
                               f"delta=1e-08 (user-level: add/remove all records of one user)")
    mech = report["mechanism"]
    assert "bound: each user counted in at most 8 keys (from the spec)" in lines
    assert (f"noise: each word's count of distinct users gets discrete Gaussian noise with sigma "
            f"{mech['sigma']:.4g}; a word is released when its count is at least 1 and its noisy "
            f"count at least {mech['threshold']}") in lines
    assert any(line.startswith("a word of ") and "at least half the time" in line for line in lines)
    assert all("None" not in line and "np." not in line for line in lines)


def test_show_prints_the_top_keys_as_a_table(released, capsys):
    spec, out = released["fixed"]
    if not os.path.exists(out):
        assert main(["run", spec]) == 0
    capsys.readouterr()
    assert main(["show", out, "--top", "5"]) == 0
    text = capsys.readouterr().out.splitlines()
    table = pq.read_table(os.path.join(out, "released.parquet")).to_pylist()
    best = sorted(table, key=lambda r: (-r["count"], r["word"]))[:5]
    assert text[1].split() == ["word", "count"] and set(text[2]) <= {"-", " "}
    assert text[-1].startswith("counts are of the bounded data: ")     # issue 42
    assert [line.split() for line in text[3:-1]] == [
        [r["word"], f"{r['count']:,}", f"[{r['count_low']:,},", f"{r['count_high']:,}]"]
        for r in best]     # each count with its interval (issue 27)


def _brute_gaussian(n, sigma, tau, pre):
    x = np.arange(-60 * int(sigma) - 60, 60 * int(sigma) + 60)
    w = np.exp(-x.astype(float) ** 2 / (2 * sigma * sigma))
    return 0.0 if n < pre else float(w[x >= tau - n].sum() / w.sum())


def _brute_laplace(n, scale, tau, pre):
    x = np.arange(-200 * int(scale) - 200, 200 * int(scale) + 200)
    w = np.exp(-np.abs(x) / scale)
    return 0.0 if n < pre else float(w[x >= tau - n].sum() / w.sum())


def _brute_binomial(n, p, tau):
    return math.fsum(math.comb(n, k) * p ** k * (1 - p) ** (n - k) for k in range(tau, n + 1))


@pytest.mark.parametrize("n", [0, 1, 5, 40, 62, 63, 80, 120])
def test_release_probability_against_brute_force_sums(n):
    g = {"mechanism": {"kind": "gaussian", "sigma": 10.2, "threshold": 62, "pre_threshold": 3}}
    assert summary.release_probability(g, [n])[0] == pytest.approx(
        _brute_gaussian(n, 10.2, 62, 3), rel=1e-9, abs=1e-300)
    lap = {"mechanism": {"kind": "laplace", "scale": 8.0, "threshold": 60, "pre_threshold": 1,
                         "noise": "discrete_laplace"}}
    assert summary.release_probability(lap, [n])[0] == pytest.approx(
        _brute_laplace(n, 8.0, 60, 1), rel=1e-9, abs=1e-300)
    st = {"mechanism": {"kind": "sample_and_threshold", "sampling_rate": 0.3, "threshold": 9}}
    assert summary.release_probability(st, [n])[0] == pytest.approx(
        _brute_binomial(n, 0.3, 9), rel=1e-9, abs=1e-300)


def test_release_probability_of_weighted_sampling_is_pi(write_spec):
    """pi_n of PWS (paper 001 Alg. 3) for the calibrated plan, rising to 1."""
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    report = make_plan(spec_mod.load(write_spec({"mechanism": {"kind": "weighted_sampling"}}))).report()
    p = summary.release_probability(report, np.arange(0, 400))
    assert p[0] == 0 and np.all(np.diff(p) >= 0) and p[-1] == 1.0
    # With no sampling pi reaches 1 at 2L + 1 (Lemma 4.2), L = the report's pws_L.
    assert report["mechanism"]["threshold"] == int(np.flatnonzero(p >= 0.5)[0])


def _render(page, tmp_path):
    shot = tmp_path / "shot.png"
    profile = tmp_path / "profile"
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu",
                           "--disable-background-networking", "--disable-component-update",
                           "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
                           "--window-size=1000,2200", f"--screenshot={shot}",
                           f"file://{os.path.abspath(page)}"],
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-2000:]
    return shot


@pytest.mark.skipif(CHROMIUM is None and not os.environ.get("CI"),
                    reason="Chromium is not installed (apt-get install chromium); CI installs it "
                           "and never skips this test")
def test_html_report_renders_in_headless_chromium(released, tmp_path, capsys):
    pytest.importorskip("matplotlib", reason="the report extra (matplotlib) is not installed")
    assert CHROMIUM is not None, "CI must have Chromium: .ci/run installs it"
    spec, out = released["auto"]
    assert main(["run", spec]) == 0
    page = tmp_path / "page.html"
    assert main(["report", out, "--html", str(page)]) == 0
    assert capsys.readouterr().out.strip().endswith(f"wrote {page}")
    text = page.read_text()
    # Self-contained: four plots as data URIs (the fourth: the top keys' count intervals,
    # issue 27), nothing fetched from elsewhere.
    assert text.count('src="data:image/png;base64,') == 4
    assert "http://" not in text and "https://" not in text and "<script" not in text
    assert "None" not in text and "np.float64" not in text
    shot = _render(page, tmp_path)
    from PIL import Image
    image = Image.open(shot)
    assert image.format == "PNG" and image.size == (1000, 2200)
    pixels = np.asarray(image.convert("RGB")).reshape(-1, 3)
    colours = np.unique(pixels, axis=0)
    non_white = np.mean(np.any(pixels < 245, axis=1))
    assert len(colours) > 50 and non_white > 0.03, (len(colours), non_white)
    # The plots' colours are on the screen: the probability curve's red-brown and the
    # chosen bound's red (matplotlib drew them, Chromium decoded and painted them).
    assert np.any(np.all(np.abs(pixels.astype(int) - [0xb5, 0x52, 0x3b]) < 12, axis=1))
    assert np.any(np.all(np.abs(pixels.astype(int) - [0xd1, 0x49, 0x5b]) < 12, axis=1))


def test_report_html_without_matplotlib_exits_2_saying_what_to_install(released, tmp_path):
    spec, out = released["fixed"]
    if not os.path.exists(out):
        assert main(["run", spec]) == 0
    shadow = tmp_path / "shadow" / "matplotlib"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("raise ImportError('matplotlib is not installed')\n")
    env = dict(os.environ, PYTHONPATH=f"{shadow.parent}{os.pathsep}{ROOT}")
    done = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", "report", out, "--html"],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert done.returncode == 2
    assert done.stderr.strip() == ("thresher: error: thresher report --html needs matplotlib; "
                                   "install it with pip install 'thresher[report]' (or pip "
                                   "install matplotlib)")
    assert not os.path.exists(os.path.join(out, "release_report.html"))


def test_show_and_report_of_a_folder_without_a_release(tmp_path, capsys):
    assert main(["show", str(tmp_path)]) == 2
    assert "holds no release" in capsys.readouterr().err


def _whole_user_counts(path, bound):
    """Per word: the number of its users holding at most ``bound`` distinct words. l0
    bounding keeps such a user whole, so the word's bounded count is at least this."""
    import pyarrow.compute as pc
    pairs = pq.read_table(path, columns=["user_id", "word"]).group_by(["user_id", "word"]).aggregate([])
    per_user = pairs.group_by(["user_id"]).aggregate([([], "count_all")])
    small = per_user.filter(pc.less_equal(per_user.column("count_all"), bound)).column("user_id")
    kept = pairs.filter(pc.is_in(pairs.column("user_id"), value_set=small))
    per_word = kept.group_by(["word"]).aggregate([([], "count_all")]).to_pydict()
    return dict(zip(per_word["word"], per_word["count_all"])), pairs.group_by(["word"]).aggregate([]).num_rows


@pytest.mark.parametrize("max_frequency", [2, "auto"])
def test_weighted_sampling_release_statement_is_true(write_spec, small_parquet, tmp_path,
                                                     max_frequency):
    """The summary's release sentence is computed from the pi table the release draws with
    (an explicit max_frequency clips counts to M: pi_M is then the most any key gets), and
    the release bears it out. Each key is kept independently with pi_{min(n, M)}, pi
    non-decreasing (paper 001 Alg. 3), and a user with <= C words is kept whole, so:
    keys with >= N whole users are released with probability >= the stated one (binomial
    lower tail), and all keys with probability <= pi_M (binomial upper tail). Each check
    fails falsely with probability <= 1e-9 (three checks: < 3e-9)."""
    from scipy import stats
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running.release import run
    bound = 8
    spec = spec_mod.load(write_spec({
        "input.path": small_parquet, "bounding.max_keys_per_user": bound,
        "mechanism": {"kind": "weighted_sampling", "max_frequency": max_frequency}}))
    plan = make_plan(spec)
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(11))
    from thresher.pipelines.kinds.weighted_sampling import release_keep   # the kind owns it
    keep = release_keep(report["mechanism"])
    assert np.all(np.diff(keep) >= 0)
    n = np.arange(0, 3 * len(keep))
    np.testing.assert_array_equal(summary.release_probability(report, n),
                                  keep[np.minimum(n, len(keep) - 1)])
    lines = summary.noise_in_words(report, ["word"])
    released = set(pq.read_table(tmp_path / "out" / "released.parquet").column("word").to_pylist())
    whole, num_words = _whole_user_counts(small_parquet, bound)
    claims = []
    for prob, word in ((0.5, "half the time"), (0.99, "99% of the time")):
        at = summary.users_at(report, prob)
        if at is not None:
            assert any(f"{at:,}" in line and word in line for line in lines)
            claims.append((at, prob))
    ceiling = summary.release_ceiling(report)
    if max_frequency == 2:
        assert ceiling is not None and ceiling[0] == 2 and ceiling[1] == keep[2] < 0.5
        assert claims == []
        assert any(f"at most {keep[2]:.3g}" in line for line in lines)
        assert not any("99% of the time" in line for line in lines)
        # every key: released with probability <= pi_2
        assert len(released) <= stats.binom.isf(1e-9, num_words, keep[2])
    else:
        assert ceiling is None and len(claims) == 2
    for at, prob in claims:
        big = [w for w, c in whole.items() if c >= at]
        assert big, "the corpus must hold keys at the stated size"
        hit = sum(w in released for w in big)
        assert hit >= stats.binom.ppf(1e-9, len(big), prob), (at, prob, hit, len(big))

"""A kind is one module (issue 44 item 1, "the kind owns its column"): a copy of each of
the 8 kind modules, its kind renamed (``NAME = "gaussian"`` -> ``NAME = "copy_gaussian"``,
the one place a kind module writes its name; nothing else changed), kept outside ``pipelines/kinds/`` and registered the documented way
(``THRESHER_KINDS`` for the ``thresher`` command, ``pipelines.kinds.register`` in process),
plans, validates, runs, shows and reports (text) exactly like the original:

- ``thresher plan --json``: the same calibration and accounting (the whole plan, but for
  ``config_sha256``, whose spec names the other kind);
- ``thresher validate`` accepts it;
- a run under one fixed test secret publishes the same ``released.parquet`` rows and the
  same ``release_report.json`` (the kind's name aside);
- ``thresher show`` and ``thresher report`` print the same text, and ``thresher report
  --html`` writes the same page, figures included (the kind's name and the output folder
  aside);
- the decisions only some specs reach: an existing sample (``input.sample``, a kind with
  ``SAMPLE_INPUT``), a continual plan (``continual``, a kind with ``CONTINUAL``), and the
  Beam YAML transform's row type (the kind's ``NULLABLE_COLUMNS``).

Before the kinds owned their limits, intervals, words, aggregates and public keys, the copy
failed ``thresher plan`` with a KeyError in pipelines/planning/limits.py (MAX_KEYS[kind]),
and its report lost its intervals and words; before the second round (the kind's
NULLABLE_COLUMNS, CONTINUAL, SAMPLE_INPUT and FIGURES) the copy of quantiles lost its HTML
figure of quantile curves, and copies were refused with input.sample (weighted_sampling) and
continual (gaussian) and got another Beam YAML row type (quantiles, weighted_sampling).
Deterministic: no statistical assertion.
"""
import json
import os
import re
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines import kinds
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running import release
from thresher.pipelines.specs import spec as spec_mod
from thresher.transforms.randomness import keyed_random

from tests.pipelines.test_released_bytes_frozen import CASES, _workdir, _with

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PACKAGE = "renamed_kinds"
PREFIX = "copy_"
SECRET = b"issue 44 renamed-kind test secret"
ORIGINALS = kinds._ORDER
# one release per kind, plus the kind decisions only some specs reach: aggregates (sum
# and mean columns with intervals), a public key domain, the automatic bound, l1
RENAMED_CASES = {name: CASES[name] for name in (
    *ORIGINALS, "gaussian_aggregates", "gaussian_public_keys", "gaussian_auto_bound",
    "laplace_l1")}


def _renamed(kind):
    return PREFIX + kind


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """A package outside thresher holding a renamed copy of every kind module."""
    folder = tmp_path_factory.mktemp("plugin")
    package = folder / PACKAGE
    package.mkdir()
    (package / "__init__.py").write_text("")
    for kind in ORIGINALS:
        with open(os.path.join(ROOT, "pipelines", "kinds", f"{kind}.py"), encoding="utf-8") as f:
            source = f.read()
        copy, n = re.subn(rf'^NAME = "{kind}"$', f'NAME = "{_renamed(kind)}"', source,
                          flags=re.M)
        assert n == 1, f"pipelines/kinds/{kind}.py: expected one `NAME = \"{kind}\"` line"
        (package / f"{_renamed(kind)}.py").write_text(copy, encoding="utf-8")
    return folder


@pytest.fixture(scope="module")
def workdir(tmp_path_factory):
    return _workdir(tmp_path_factory.mktemp("work"))


@pytest.fixture
def registered(plugin, monkeypatch):
    """The copies registered in this process (restored after the test)."""
    monkeypatch.syspath_prepend(str(plugin))
    monkeypatch.setattr(kinds, "KINDS", kinds.KINDS)
    monkeypatch.setattr(kinds, "_REGISTERED", dict(kinds._REGISTERED))
    for kind in ORIGINALS:
        assert kinds.register(f"{PACKAGE}.{_renamed(kind)}") == _renamed(kind)


def _cli(workdir, plugin, *args):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(plugin), ROOT]),
               THRESHER_KINDS=",".join(f"{PACKAGE}.{_renamed(k)}" for k in ORIGINALS),
               THRESHER_CACHE_DIR=str(workdir / "calibration_cache"))
    done = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", *args],
                          capture_output=True, text=True, cwd=workdir, env=env, timeout=900)
    assert done.returncode == 0, (args, done.stderr[-3000:])
    return done.stdout


def _write_spec(workdir, case, kind):
    doc = _with(RENAMED_CASES[case], "mechanism.kind", kind)
    doc = _with(doc, "output.path", os.path.join(f"{case}_{kind}", "out"))
    if doc["input"].get("keys", ()) is None:
        del doc["input"]["keys"]
    path = f"{case}_{kind}.yaml"
    with open(workdir / path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle, sort_keys=True)
    return path, doc["output"]["path"]


def _run(workdir, spec_path):
    """The release of ``spec_path`` in process under the fixed test secret."""
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        release.run(make_plan(spec_mod.load(spec_path)), [],
                    rng_factory=keyed_random.KeyedSource(SECRET))
    finally:
        os.chdir(cwd)


def _same_words(text, kind, output=None):
    """The text with the copy's kind name (and its output folder) as the original's."""
    text = text if output is None else text.replace(output, "OUT")
    return text.replace(_renamed(kind), kind)


def _words(text):
    """The words of a printed text (its lines are wrapped to a width: a longer kind name
    moves a line break)."""
    return text.split()


@pytest.mark.parametrize("case", sorted(RENAMED_CASES))
def test_a_renamed_copy_of_a_kind_releases_like_the_original(case, plugin, workdir,
                                                             registered):
    kind = RENAMED_CASES[case]["mechanism"]["kind"]
    copy = _renamed(kind)
    original_spec, original_out = _write_spec(workdir, case, kind)
    copy_spec, copy_out = _write_spec(workdir, case, copy)

    # plan: the same calibration and accounting, every field but the spec's hash
    plans = []
    for path, name in ((original_spec, kind), (copy_spec, copy)):
        text = _cli(workdir, plugin, "plan", path, "--json")
        assert json.loads(text)["mechanism"]["kind"] == name      # the copy is its own kind
        plan = json.loads(_same_words(text, kind))
        plan.pop("config_sha256")
        plans.append(plan)
    assert plans[0] == plans[1]
    assert _words(_same_words(_cli(workdir, plugin, "plan", copy_spec), kind)) == \
        _words(_cli(workdir, plugin, "plan", original_spec))
    _cli(workdir, plugin, "validate", copy_spec)

    # run: the same released rows and report under the same secret
    _run(workdir, original_spec)
    _run(workdir, copy_spec)
    released = [pq.read_table(str(workdir / out / "released.parquet"))
                for out in (original_out, copy_out)]
    assert released[0].num_rows > 0 or kind == "weighted_sampling"
    assert released[0].schema == released[1].schema
    assert released[0].to_pylist() == released[1].to_pylist()
    reports = []
    for out, name in ((original_out, kind), (copy_out, copy)):
        with open(workdir / out / "release_report.json", encoding="utf-8") as handle:
            text = handle.read()
        assert json.loads(text)["mechanism"]["kind"] == name
        report = json.loads(_same_words(text, kind, out))
        report.pop("config_sha256")
        reports.append(report)
    assert reports[0] == reports[1]
    if reports[0].get("intervals", {}).get("columns"):
        assert any(c.endswith("_low") for c in released[1].column_names)

    # show and report (text): the same words
    for command in ("show", "report"):
        texts = [_words(_same_words(_cli(workdir, plugin, command, out), kind, out))
                 for out in (original_out, copy_out)]
        assert texts[0] == texts[1], command

    # report --html: the same page, the same figures (their PNG bytes included)
    pages = []
    for out in (original_out, copy_out):
        page = workdir / f"{out.replace(os.sep, '_')}.html"
        _cli(workdir, plugin, "report", out, "--html", str(page))
        # the spec's hash aside (its spec names the other kind), as in the plan and report
        pages.append(re.sub(r"config sha256\s+[0-9a-f]+", "config sha256",
                            _same_words(page.read_text(encoding="utf-8"), kind, out)))
    assert pages[0].count("data:image/png") > 0
    assert _html_figures(pages[0]) == _html_figures(pages[1])
    assert pages[0] == pages[1]


def _html_figures(page):
    """The figures' titles of an HTML report (named in the failure before the whole page)."""
    return re.findall(r'<img alt="([^"]*)"', page)


def test_a_renamed_copy_sanitizes_an_existing_sample_like_the_original(plugin, workdir,
                                                                       registered):
    """input.sample: refused for any kind but weighted_sampling by name before; now for a
    kind without SAMPLE_INPUT. The copy validates, plans and releases the same rows."""
    counts = {}
    for word in pq.read_table(str(workdir / "small.parquet")).column("word").to_pylist():
        counts[word] = counts.get(word, 0) + 1
    pq.write_table(pa.table({"word": sorted(counts), "n": [counts[w] for w in sorted(counts)]}),
                   str(workdir / "sample.parquet"))
    outputs = []
    for kind in ("weighted_sampling", _renamed("weighted_sampling")):
        doc = {"name": "existing_sample",
               "input": {"path": "sample.parquet", "keys": ["word"],
                         "sample": {"frequency": "n", "scheme": "none"}},
               "privacy": {"epsilon": 1.0, "delta": 1e-8},
               "bounding": {"max_keys_per_user": 1},
               "mechanism": {"kind": kind},
               "output": {"path": os.path.join(f"sample_{kind}", "out")}}
        path = f"sample_{kind}.yaml"
        with open(workdir / path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(doc, handle, sort_keys=True)
        _cli(workdir, plugin, "validate", path)
        plan = json.loads(_same_words(_cli(workdir, plugin, "plan", path, "--json"),
                                      "weighted_sampling"))
        plan.pop("config_sha256")
        _run(workdir, path)
        out = doc["output"]["path"]
        with open(workdir / out / "release_report.json", encoding="utf-8") as handle:
            report = json.loads(_same_words(handle.read(), "weighted_sampling", out))
        report.pop("config_sha256")
        outputs.append((plan, report,
                        pq.read_table(str(workdir / out / "released.parquet")).to_pylist()))
    assert outputs[0][2]
    assert outputs[0] == outputs[1]


def test_a_renamed_copy_of_gaussian_plans_a_continual_release(plugin, workdir, registered):
    """continual: refused for any kind but gaussian by name before; now for a kind
    without CONTINUAL (the copy of laplace is still refused, naming the field)."""
    plans = []
    for kind in ("gaussian", _renamed("gaussian")):
        doc = {"name": "daily",
               "input": {"path": "data/day{period}.parquet", "user": "user", "keys": ["word"]},
               "privacy": {"epsilon": 1.0, "delta": 1e-8},
               "bounding": {"max_keys_per_user": 3},
               "mechanism": {"kind": kind},
               "output": {"path": "out"},
               "budget": {"ledger": "ledger.sqlite", "dataset": "words", "epsilon": 10.0,
                          "delta": 1e-6},
               "continual": {"horizon": 30}}
        path = f"continual_{kind}.yaml"
        with open(workdir / path, "w", encoding="utf-8") as handle:
            yaml.safe_dump(doc, handle, sort_keys=True)
        plan = json.loads(_same_words(_cli(workdir, plugin, "plan", path, "--json"),
                                      "gaussian"))
        plan.pop("config_sha256", None)
        plans.append(plan)
    assert plans[0] == plans[1]
    with pytest.raises(spec_mod.SpecError, match=r"mechanism\.kind.*use kind: gaussian or "
                                                 r"copy_gaussian, got 'copy_laplace'"):
        spec_mod.parse({**doc, "mechanism": {"kind": _renamed("laplace")}})


@pytest.mark.parametrize("kind,mechanism,keys", [
    ("quantiles", {"column": "x", "ranks": [0.5], "domain": [0, 100]}, None),
    ("weighted_sampling", {"report": "keys"}, ["word"]),
])
def test_a_renamed_copy_gets_the_same_beam_yaml_row_type(kind, mechanism, keys, registered):
    """The Beam YAML transform's released rows declare the kind's NULLABLE_COLUMNS
    Optional (quantiles' value and resolution, weighted_sampling's token and estimate):
    the same row type for the copy (the pipeline is built, not run)."""
    import apache_beam as beam
    from apache_beam.typehints.schemas import named_fields_from_element_type
    from thresher.pipelines.beam_yaml import ThresherRelease
    types = []
    for name in (kind, _renamed(kind)):
        pipeline = beam.Pipeline()
        rows = pipeline | beam.Create([beam.Row(user_id="u", word="w", x=1.0)])
        released = rows | ThresherRelease(
            user="user_id", keys=keys, privacy={"epsilon": 1.0, "delta": 1e-8},
            bounding={"max_keys_per_user": 1}, mechanism={"kind": name, **mechanism})
        types.append(named_fields_from_element_type(released["released"].element_type))
    assert any("Optional" in str(t) for _, t in types[0])
    assert types[0] == types[1]

"""The Beam YAML transform (pipelines/beam_yaml.py ``ThresherRelease``) accepts what
``thresher run`` accepts (issue 29): ``aggregates`` with ``clip: auto``, ``budget``,
``input.public_keys``, ``mechanism.kind: quantiles`` and ``input.sample`` -- each refused
by name before -- and publishes thresher run's ``<column>_low`` / ``_high`` interval
columns and report section (it published none before).

Each release runs twice on the same records under one fixed, test-only secret (a
``KeyedSource`` given to ``pipelines.running.release.run``, as tests/pipelines/
test_keyed_recomputation.py does, and to the transform through its test-only
``_rng_factory``): once through ``release.run`` (what ``thresher run`` calls) on a
Parquet file, once through the transform in Beam's in-process runner on the same rows.
The transform must publish exactly the same released rows (bit-identical floats) and
the same report fields: the same code validates, calibrates and draws, and the secret's
streams are keyed by stage identities relative to the release
(``keyed_random.building``). One test runs the transform on two SDK worker processes.
No statistical assertion: no false-failure probability.
"""
import json
import os
import subprocess
import sys

import apache_beam as beam
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.running import release
from thresher.pipelines.beam_yaml import ThresherRelease
from thresher.pipelines.errors import SpecError
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod
from thresher.transforms.randomness.keyed_random import KeyedSource

from .conftest import ROOT

SECRET = b"test-only release secret: 32 B.."
PRIVACY = {"epsilon": 1.0, "delta": 1e-8}
# Report fields that differ by construction: the hash of the spec's text (the CLI's
# file vs the transform's config) and the CLI's file names.
NOT_COMPARED = ("config_sha256", "outputs")

_SEEN = {"rows": [], "reports": []}


def _records(n=6000):
    """(user_id, word, amount) rows: the quickstart's first ``n`` with a value column
    that varies per row (a function of the row number only)."""
    data = pq.read_table(os.path.join(ROOT, "configs", "examples", "data",
                                      "quickstart.parquet")).slice(0, n).to_pylist()
    for i, row in enumerate(data):
        row["amount"] = float((i * 37) % 101)
    return data


def _cli(tmp_path, records, config):
    """release.run on ``records`` written as Parquet, the spec made from the transform's
    ``config``; returns (released rows restricted to ``columns``, report)."""
    data = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(records), str(data))
    input_section = {"path": str(data), "format": "parquet", "keys": config["keys"]}
    for field in ("user", "public_keys", "sample"):
        if field in config:
            input_section[field] = config[field]
    doc = {"name": config["name"], "input": input_section, "privacy": config["privacy"],
           "bounding": config["bounding"], "mechanism": config["mechanism"],
           "output": {"path": str(tmp_path / "out")}}
    if "confidence" in config:
        doc["output"]["confidence"] = config["confidence"]
    for field in ("aggregates", "aggregates_auto", "budget"):
        if field in config:
            doc[field] = config[field]
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump(doc, sort_keys=False))
    report = release.run(make_plan(spec_mod.load(str(spec_path))), [],
                         rng_factory=KeyedSource(SECRET))
    return pq.read_table(str(tmp_path / "out" / "released.parquet")), report


def _keep_row(row):
    _SEEN["rows"].append(row._asdict())


def _keep_report(row):
    _SEEN["reports"].append(json.loads(row.report))


def _transform(records, config, fields=None, secret=SECRET):
    """The transform on ``records`` (as beam.Rows of ``fields``) in the in-process
    runner; returns (released rows as dicts, report)."""
    fields = fields or list(records[0])
    got, reports = _SEEN["rows"], _SEEN["reports"]
    got.clear()
    reports.clear()
    transform = ThresherRelease(**config)
    if secret is not None:
        transform._rng_factory = KeyedSource(secret)
    with beam.Pipeline() as pipeline:     # the in-process runner: same process, same _SEEN
        rows = pipeline | beam.Create([beam.Row(**{f: r[f] for f in fields}) for r in records])
        out = rows | "Release" >> transform
        _ = out["released"] | beam.Map(_keep_row)
        _ = out["report"] | beam.Map(_keep_report)
    assert len(reports) == 1
    return list(got), reports[0]


def _same_release(tmp_path, records, config, fields=None):
    """Run both; assert the same released rows (the same columns in the same order, the
    interval columns among them) and report; return (rows, report)."""
    cli_table, cli_report = _cli(tmp_path, records, config)
    rows, report = _transform(records, config, fields)
    assert rows, "nothing released: the comparison would be empty"
    columns = list(rows[0])
    assert columns == cli_table.column_names

    def key(row):
        return tuple((c, repr(row[c])) for c in columns)
    cli_rows = cli_table.select(columns).to_pylist()
    assert sorted(rows, key=key) == sorted(cli_rows, key=key)
    expected = {k: v for k, v in json.loads(json.dumps(cli_report)).items()
                if k not in NOT_COMPARED}
    got = {k: v for k, v in report.items() if k not in NOT_COMPARED}
    assert got == expected
    return rows, report


def _config(**changes):
    config = {"user": "user_id", "keys": ["word"], "privacy": PRIVACY,
              "bounding": {"max_keys_per_user": 4}, "mechanism": {"kind": "gaussian"},
              "name": "parity"}
    config.update(changes)
    return config


def test_the_transform_matches_thresher_run_for_a_plain_count(tmp_path):
    """The pattern itself: a plain Gaussian histogram (accepted before issue 29's rest)."""
    _same_release(tmp_path, _records(), _config(), fields=["user_id", "word"])


def test_aggregates_clip_auto_matches_thresher_run(tmp_path):
    """(a) clip: auto: the chosen clip flows as a side input into the bounding and the
    report; the report names the chosen clip as the CLI's does."""
    aggregates = [{"column": "amount", "statistic": "sum", "clip": "auto"},
                  {"column": "amount", "statistic": "mean", "clip": "auto"}]
    rows, report = _same_release(tmp_path, _records(), _config(aggregates=aggregates))
    assert list(rows[0]) == ["word", "count", "count_low", "count_high",
                             "amount_sum", "amount_sum_low", "amount_sum_high",
                             "amount_mean", "amount_mean_low", "amount_mean_high"]
    entries = report["mechanism"]["aggregates"]
    assert entries and all(e["clip_chosen_by"] == "exponential_mechanism" for e in entries)


def test_public_keys_match_thresher_run(tmp_path):
    """(c) input.public_keys: every listed key is released once (with noise, no
    threshold), also a key no record has; records of unlisted keys are dropped."""
    records = _records()
    words = sorted({r["word"] for r in records})
    domain = words[::3] + ["no-record-has-this-word"]
    keys_file = tmp_path / "domain.parquet"
    pq.write_table(pa.table({"word": domain}), str(keys_file))
    rows, report = _same_release(tmp_path, records, _config(
        public_keys={"path": str(keys_file)}), fields=["user_id", "word"])
    assert sorted(r["word"] for r in rows) == sorted(domain)
    assert report["bounding"]["public_keys"]


@pytest.mark.parametrize("keys", [[], ["word"]])
def test_quantiles_match_thresher_run(tmp_path, keys):
    """(d) quantiles: the rows carry the value column named by mechanism.column and each value's resolution (issue 36 D9)."""
    records = _records()
    if keys:     # few keys with many users, so that select_keys releases some
        for r in records:
            r["word"] = r["word"][:1]
    mechanism = {"kind": "quantiles", "column": "amount", "ranks": [0.25, 0.5, 0.9],
                 "domain": [0, 128], "levels": 2, "branching": 8}
    rows, _ = _same_release(tmp_path, records, _config(keys=keys, mechanism=mechanism,
                                                       bounding={"max_keys_per_user": 1}))
    assert set(rows[0]) == set(keys) | {"rank", "value", "resolution"}
    assert any(r["value"] is not None for r in rows)


def _ledger_rows(path):
    import sqlite3
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("SELECT dataset, name, epsilon, delta, state FROM releases "
                            "ORDER BY id").fetchall()
    finally:
        conn.close()


def test_budget_charges_once_like_thresher_run_and_refuses_without_running(tmp_path):
    """(b) budget: the transform charges the ledger once, when the pipeline runs, and
    records the release as the CLI does (same dataset, name, epsilon, delta, state); a
    release the ledger cannot fit is refused by name while the pipeline is built, and
    nothing of it runs: no released row and no report reach the pipeline's sinks."""
    records = _records()

    def budget(ledger):
        return {"ledger": str(ledger), "dataset": "quickstart", "epsilon": 1.5,
                "delta": 1e-6}
    cli_ledger, yaml_ledger = tmp_path / "cli.sqlite", tmp_path / "yaml.sqlite"
    _cli(tmp_path, records, _config(budget=budget(cli_ledger)))
    _transform(records, _config(budget=budget(yaml_ledger)), fields=["user_id", "word"])
    assert _ledger_rows(yaml_ledger) == _ledger_rows(cli_ledger)
    assert _ledger_rows(yaml_ledger) == [("quickstart", "parity", "1.0", "1E-8", "published")]

    # a second release of epsilon 1 exceeds the total 1.5: refused while the pipeline is
    # built, so the pipeline never runs (a sink on the input rows sees nothing)
    _SEEN["rows"].clear()
    _SEEN["reports"].clear()
    with pytest.raises(SpecError, match=r"^ThresherRelease\.budget: dataset 'quickstart' "
                                        r"\(basic composition\) has spent epsilon=1"):
        with beam.Pipeline() as pipeline:
            rows = pipeline | beam.Create([beam.Row(user_id=r["user_id"], word=r["word"])
                                           for r in records])
            _ = rows | "InputSeen" >> beam.Map(_keep_row)    # runs iff the pipeline runs
            out = rows | "Release" >> ThresherRelease(**_config(budget=budget(yaml_ledger)))
            _ = out["report"] | beam.Map(_keep_report)
    assert _SEEN["rows"] == [] and _SEEN["reports"] == []
    assert len(_ledger_rows(yaml_ledger)) == 1      # recorded exactly once, nothing reserved


def test_missing_quantile_value_field_is_refused_by_name_and_not_charged(tmp_path):
    pipeline = beam.Pipeline()
    rows = pipeline | beam.Create([beam.Row(user_id="u", word="w")])
    mechanism = {"kind": "quantiles", "column": "amount", "ranks": [0.5], "domain": [0, 1]}
    ledger = tmp_path / "ledger.sqlite"
    budget = {"ledger": str(ledger), "dataset": "d", "epsilon": 2.0, "delta": 1e-6}
    with pytest.raises(SpecError, match=r"^ThresherRelease\.mechanism\.column: field 'amount' "
                                        r"is not in the input; its fields are: user_id, word"):
        _ = rows | ThresherRelease(**_config(keys=[], mechanism=mechanism, budget=budget))
    assert not ledger.exists()       # refused before the charge: the ledger was not asked


def test_a_missing_public_keys_file_is_refused_by_name(tmp_path):
    with pytest.raises(SpecError, match=r"^ThresherRelease\.public_keys\.path: .* does not exist"):
        ThresherRelease(**_config(public_keys={"path": str(tmp_path / "none.parquet")}))


def test_api_release_takes_every_section_of_a_cli_spec(tmp_path):
    """thresher.Release(spec) refused `budget` (and had no way to pass `aggregates_auto`
    or `input.public_keys`): the CLI's own spec file, with every top-level section, now
    gives the release thresher run publishes under the same secret, and one ledger
    charge. input.path/format and output are ignored (the rows are the input)."""
    import thresher
    records = _records()
    keys_file = tmp_path / "domain.parquet"
    pq.write_table(pa.table({"word": sorted({r["word"] for r in records})[::2]}), str(keys_file))
    config = _config(public_keys={"path": str(keys_file)},
                     aggregates=[{"column": "amount", "statistic": "mean", "clip": "auto"}],
                     aggregates_auto={"quantile": 0.9},
                     budget={"ledger": str(tmp_path / "cli.sqlite"), "dataset": "d",
                             "epsilon": 2.0, "delta": 1e-6})
    cli_table, cli_report = _cli(tmp_path, records, config)
    spec = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    spec["description"] = "every section of a CLI spec"
    spec["budget"]["ledger"] = str(tmp_path / "api.sqlite")
    # every section but continual, which runs period by period through the CLI only
    # (test_api_release_refuses_a_continual_section)
    assert set(spec) == set(spec_mod.TOP_FIELDS) - {"continual"}

    got, reports = _api_release(spec, records)
    columns = list(got[0])
    assert "amount_mean" in columns

    def key(row):
        return tuple((c, repr(row[c])) for c in columns)
    assert sorted(got, key=key) == sorted(cli_table.select(columns).to_pylist(), key=key)
    assert ({k: v for k, v in reports[0].items() if k not in NOT_COMPARED}
            == {k: v for k, v in json.loads(json.dumps(cli_report)).items()
                if k not in NOT_COMPARED})
    assert _ledger_rows(tmp_path / "api.sqlite") == _ledger_rows(tmp_path / "cli.sqlite")


def test_api_release_refuses_unknown_sections_and_a_user_beside_a_sample_by_name():
    import thresher
    base = {"input": {"user": "user_id", "keys": ["word"]}, "privacy": PRIVACY,
            "bounding": {"max_keys_per_user": 4}, "mechanism": {"kind": "gaussian"}}
    with pytest.raises(SpecError, match=r"^budgets: is not a section of a release spec; "
                                        r"allowed sections: name, "):
        thresher.Release(dict(base, budgets={}))
    # input.sample is accepted (test_an_existing_weighted_sample_matches_thresher_run);
    # the spec's own rules about it still hold, named
    with pytest.raises(SpecError, match=r"^ThresherRelease\.user: must be left out with "
                                        r"input\.sample"):
        thresher.Release(dict(base, mechanism={"kind": "weighted_sampling"}, input={
            "user": "user_id", "keys": ["word"], "sample": {"frequency": "n", "scheme": "none"}}))
    with pytest.raises(SpecError, match=r"^ThresherRelease\.confidence: "):
        thresher.Release(dict(base, output={"confidence": 1.5}))


def _sample(records):
    """An existing weighted sample of ``records``' words: one row per word with its
    number of distinct users (field ``n``), no user field."""
    users = {}
    for r in records:
        users.setdefault(r["word"], set()).add(r["user_id"])
    return [{"word": w, "n": len(u)} for w, u in sorted(users.items())]


@pytest.mark.parametrize("scheme", [{"scheme": "none"},
                                    {"scheme": "priority", "threshold": 0.02}])
def test_an_existing_weighted_sample_matches_thresher_run(tmp_path, scheme):
    """(1) input.sample (refused by name before): the rows are an existing sample, one
    per key with its frequency and no user; the transform reads them with the CLI's
    prepare_sample_batch and releases them through the CLI's stages (OneRowPerKey,
    SanitizeSample), so under one secret it publishes the CLI's rows (token, estimate;
    no interval columns: weighted_sampling has none, and the report says so)."""
    sample = _sample(_records())
    config = _config(user=None, sample={"frequency": "n", **scheme},
                     mechanism={"kind": "weighted_sampling"},
                     bounding={"max_keys_per_user": 1})
    del config["user"]
    rows, report = _same_release(tmp_path, sample, config)
    assert list(rows[0]) == ["word", "token", "estimate"]
    assert 0 < len(rows) < len(sample)
    assert report["intervals"]["columns"] == {}
    assert list(report["intervals"]["without_interval"]) == ["estimate"]


def test_a_missing_sample_frequency_field_is_refused_by_name():
    pipeline = beam.Pipeline()
    rows = pipeline | beam.Create([beam.Row(word="w", count=3)])
    config = _config(sample={"frequency": "n", "scheme": "none"},
                     mechanism={"kind": "weighted_sampling"}, bounding={"max_keys_per_user": 1})
    del config["user"]
    with pytest.raises(SpecError, match=r"^ThresherRelease\.sample\.frequency: field 'n' is "
                                        r"not in the input; its fields are: word, count"):
        _ = rows | ThresherRelease(**config)


def test_api_release_takes_an_existing_sample(tmp_path):
    """thresher.Release with the CLI's own spec of an existing sample (report: keys:
    token and estimate null in every row, nullable in the rows' schema)."""
    import thresher
    sample = _sample(_records())
    config = _config(sample={"frequency": "n", "scheme": "none"},
                     mechanism={"kind": "weighted_sampling", "report": "keys"},
                     bounding={"max_keys_per_user": 1})
    del config["user"]
    cli_table, cli_report = _cli(tmp_path, sample, config)
    spec = yaml.safe_load((tmp_path / "spec.yaml").read_text())
    got, reports = _api_release(spec, sample)
    assert got and all(r["token"] is None and r["estimate"] is None for r in got)
    assert sorted(got, key=lambda r: r["word"]) == sorted(cli_table.to_pylist(),
                                                          key=lambda r: r["word"])
    assert ({k: v for k, v in reports[0].items() if k not in NOT_COMPARED}
            == {k: v for k, v in json.loads(json.dumps(cli_report)).items()
                if k not in NOT_COMPARED})


@pytest.mark.parametrize("changes", [
    {"confidence": 0.8},
    {"mechanism": {"kind": "laplace"}},
    {"mechanism": {"kind": "weighted_gaussian"}},
    {"mechanism": {"kind": "sample_and_threshold"}, "bounding": {"max_keys_per_user": 1}},
    {"aggregates": [{"column": "amount", "statistic": s, "clip": [0, 60]}
                    for s in ("variance", "stddev", "mean")]},
], ids=["gaussian_confidence_0.8", "laplace", "weighted_gaussian", "sample_and_threshold",
        "variance_stddev_mean"])
def test_interval_columns_match_thresher_run(tmp_path, changes):
    """(2) The released rows carry thresher run's <column>_low / _high columns (the
    transform published none before, and its report listed every column as without
    one): same columns in the same order, same endpoints, same report section, at the
    spec's output.confidence. Kinds: the count's truncated Neyman interval (gaussian,
    laplace), the count stage's (weighted_gaussian), the estimate's binomial interval
    (sample_and_threshold), and aggregates whose intervals read staged noisy sums that
    are never published (variance, stddev; a mean alone)."""
    fields = None if "aggregates" in changes else ["user_id", "word"]
    rows, report = _same_release(tmp_path, _records(), _config(**changes), fields=fields)
    columns = report["intervals"]["columns"]
    assert columns
    for column in columns:
        assert {f"{column}_low", f"{column}_high"} <= set(rows[0])
    assert not any(c.startswith("__") for c in rows[0])
    assert report["intervals"]["confidence"] == changes.get("confidence", 0.95)


@pytest.mark.parametrize("method", [{"method": "adaptive"},
                                    {"method": "trie", "prefix_lengths": [2, 4, None]}])
def test_heavy_hitters_match_thresher_run(tmp_path, method):
    """(3) heavy_hitters (its own release_stages): the same top keys, ranks and counts."""
    rows, report = _same_release(tmp_path, _records(20_000), _config(
        mechanism={"kind": "heavy_hitters", "top_k": 10, **method}),
        fields=["user_id", "word"])
    assert list(rows[0]) == ["word", "count", "rank"]
    assert sorted(r["rank"] for r in rows) == list(range(1, len(rows) + 1))


def test_auto_bound_over_public_keys_matches_thresher_run(tmp_path):
    """(3) max_keys_per_user: auto with input.public_keys: the bounded-domain rule's
    choice (ChooseDomainBound) flows into the bounding and the report as in the CLI."""
    records = _records()
    words = sorted({r["word"] for r in records})
    keys_file = tmp_path / "domain.parquet"
    pq.write_table(pa.table({"word": words[::4]}), str(keys_file))
    rows, report = _same_release(tmp_path, records, _config(
        public_keys={"path": str(keys_file)}, bounding={"max_keys_per_user": "auto"}),
        fields=["user_id", "word"])
    assert report["bounding"]["chosen_by"] == "exponential_mechanism"
    assert report["bounding"]["max_keys_per_user"] in report["bounding"]["candidates"]
    assert len(rows) == len(words[::4])


def test_auto_bound_with_clip_auto_matches_thresher_run(tmp_path):
    """(3) max_keys_per_user: auto with aggregates clip: auto: both private choices in
    one release, both side inputs of the bounding and of the report and intervals."""
    aggregates = [{"column": "amount", "statistic": "mean", "clip": "auto"}]
    rows, report = _same_release(tmp_path, _records(), _config(
        aggregates=aggregates,
        bounding={"max_keys_per_user": "auto", "auto": {"max_bound": 8}}))   # quicker plan
    assert report["bounding"]["chosen_by"] == "exponential_mechanism"
    assert report["bounding"]["max_keys_per_user"] in report["bounding"]["candidates"]
    assert report["mechanism"]["aggregates"][0]["clip_chosen_by"] == "exponential_mechanism"
    assert "amount_mean_low" in rows[0]



def _api_release(spec, records):
    """thresher.Release(spec) over ``records`` under the test secret: (released rows,
    reports) as the sinks saw them."""
    import thresher
    got, reports = _SEEN["rows"], _SEEN["reports"]
    got.clear()
    reports.clear()
    transform = thresher.Release(spec)
    transform._rng_factory = KeyedSource(SECRET)
    with beam.Pipeline() as pipeline:
        rows = pipeline | beam.Create([beam.Row(**r) for r in records])
        out = rows | "Release" >> transform
        _ = out["released"] | beam.Map(_keep_row)
        _ = out["report"] | beam.Map(_keep_report)
    return got, reports

def _run_yaml_main(tmp_path, doc):
    """Run the Beam YAML pipeline ``doc`` (with thresher's provider added) through
    ``python -m apache_beam.yaml.main`` on the in-process runner; fail with its stderr."""
    doc = dict(doc, providers=[{"type": "python", "config": {}, "transforms": {
        "ThresherRelease": "thresher.pipelines.beam_yaml.ThresherRelease"}}])
    pipeline_file = tmp_path / "pipeline.yaml"
    pipeline_file.write_text(yaml.safe_dump(doc, sort_keys=False))
    done = subprocess.run(
        [sys.executable, "-m", "apache_beam.yaml.main", f"--yaml_pipeline_file={pipeline_file}",
         "--runner=apache_beam.runners.portability.fn_api_runner.FnApiRunner"],
        capture_output=True, text=True, cwd=str(tmp_path), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]

@pytest.mark.slow
def test_beam_yaml_main_runs_quantiles_over_public_keys_with_a_budget(tmp_path):
    """The four through `python -m apache_beam.yaml.main` itself (config as Beam YAML
    passes it: plain mappings and lists): per-key quantiles of `amount` over a public key
    file, aggregates are not for quantiles, so a second transform in the same pipeline
    releases sums with clip: auto; both charge one ledger once per run (two rows, published)."""
    records = _records()
    data = tmp_path / "data.parquet"
    pq.write_table(pa.Table.from_pylist(records), str(data))
    keys_file = tmp_path / "domain.csv"
    keys_file.write_text("word\n" + "\n".join(sorted({r["word"] for r in records})[:5]) + "\n")
    ledger = str(tmp_path / "ledger.sqlite")
    budget = {"ledger": ledger, "dataset": "d", "epsilon": 2.0, "delta": 1e-6}
    common = {"user": "user_id", "keys": ["word"], "privacy": PRIVACY,
              "bounding": {"max_keys_per_user": 1}, "num_shards": 2, "budget": budget}
    doc = {"pipeline": {"transforms": [
        {"type": "ReadFromParquet", "name": "Read", "config": {"path": str(data)}},
        {"type": "ThresherRelease", "name": "Quantiles", "input": "Read", "config": dict(
            common, name="q", public_keys={"path": str(keys_file)},
            mechanism={"kind": "quantiles", "column": "amount", "ranks": [0.5],
                       "domain": [0, 128], "levels": 2, "branching": 8})},
        {"type": "ThresherRelease", "name": "Sums", "input": "Read", "config": dict(
            common, name="s", mechanism={"kind": "gaussian"},
            aggregates=[{"column": "amount", "statistic": "sum", "clip": "auto"}])},
        {"type": "WriteToText", "name": "WriteQ", "input": "Quantiles.report",
         "config": {"path": str(tmp_path / "out" / "q.json")}},
        {"type": "WriteToText", "name": "WriteS", "input": "Sums.report",
         "config": {"path": str(tmp_path / "out" / "s.json")}},
        {"type": "WriteToParquet", "name": "WriteQRows", "input": "Quantiles.released",
         "config": {"path": str(tmp_path / "out" / "q_rows")}},
    ]}}
    _run_yaml_main(tmp_path, doc)
    out = sorted(os.listdir(tmp_path / "out"))
    q = json.loads((tmp_path / "out" / next(f for f in out if f.startswith("q.json"))).read_text())
    s = json.loads((tmp_path / "out" / next(f for f in out if f.startswith("s.json"))).read_text())
    assert q["mechanism"]["kind"] == "quantiles" and q["bounding"]["public_keys"]
    assert q["released_keys"] == 5          # one row per listed key and rank
    assert s["mechanism"]["aggregates"][0]["clip_chosen_by"] == "exponential_mechanism"
    # charged when the pipeline ran, each release under its own run token: in the order
    # the runner ran the two charges
    assert sorted(_ledger_rows(ledger)) == [("d", "q", "1.0", "1E-8", "published"),
                                            ("d", "s", "1.0", "1E-8", "published")]


def _as_json(row):
    return json.dumps(row._asdict(), sort_keys=True)


def test_clip_auto_on_two_worker_processes_matches_thresher_run(tmp_path, worker_env):
    """(4) The transform on the FnApiRunner with two SDK worker processes (every DoFn,
    the test secret's KeyedSource and the chosen clips' side input cross a process
    boundary): aggregates with clip: auto publish exactly thresher run's rows (interval
    columns included) and report under the same secret. The outputs are written to
    files (the workers share no memory with the test)."""
    from apache_beam.options.pipeline_options import PipelineOptions
    records = _records()
    config = _config(aggregates=[{"column": "amount", "statistic": "sum", "clip": "auto"},
                                 {"column": "amount", "statistic": "mean", "clip": "auto"}],
                     num_shards=2)
    cli_config = {k: v for k, v in config.items() if k != "num_shards"}
    cli_table, cli_report = _cli(tmp_path, records, cli_config)
    transform = ThresherRelease(**config)
    transform._rng_factory = KeyedSource(SECRET)
    out_dir = tmp_path / "yaml_out"
    options = PipelineOptions(["--direct_running_mode=multi_processing",
                               "--direct_num_workers=2"])
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner
    with beam.Pipeline(runner=FnApiRunner(), options=options) as pipeline:
        rows = pipeline | beam.Create([beam.Row(**r) for r in records])
        out = rows | "Release" >> transform
        _ = (out["released"] | "RowsJson" >> beam.Map(_as_json)
             | "WriteRows" >> beam.io.WriteToText(str(out_dir / "rows")))
        _ = (out["report"] | "ReportJson" >> beam.Map(lambda row: row.report)
             | "WriteReport" >> beam.io.WriteToText(str(out_dir / "report")))
        _ = (out["released"] | "WorkerPid" >> beam.Map(lambda row: os.getpid())
             | "WritePids" >> beam.io.WriteToText(str(out_dir / "pids")))
    names = sorted(os.listdir(out_dir))
    pids = {int(line) for f in names if f.startswith("pids")
            for line in (out_dir / f).read_text().splitlines()}
    assert pids and os.getpid() not in pids       # the rows were made in worker processes
    rows = [json.loads(line) for f in names if f.startswith("rows")
            for line in (out_dir / f).read_text().splitlines()]
    reports = [json.loads(line) for f in names if f.startswith("report")
               for line in (out_dir / f).read_text().splitlines()]
    assert rows and len(reports) == 1
    assert "amount_mean_low" in rows[0]

    def key(row):
        return row["word"]
    assert sorted(rows, key=key) == sorted(cli_table.to_pylist(), key=key)
    assert ({k: v for k, v in reports[0].items() if k not in NOT_COMPARED}
            == {k: v for k, v in json.loads(json.dumps(cli_report)).items()
                if k not in NOT_COMPARED})


@pytest.mark.slow
def test_beam_yaml_main_releases_an_existing_sample(tmp_path):
    """input.sample through `python -m apache_beam.yaml.main` (config as Beam YAML passes
    it, no user field; rows from ReadFromParquet): the CLI's release of the same file."""
    sample = _sample(_records())
    config = _config(sample={"frequency": "n", "scheme": "none"},
                     mechanism={"kind": "weighted_sampling"},
                     bounding={"max_keys_per_user": 1})
    del config["user"]
    _, cli_report = _cli(tmp_path, sample, config)       # writes tmp_path / data.parquet
    doc = {"pipeline": {"transforms": [
        {"type": "ReadFromParquet", "name": "Read",
         "config": {"path": str(tmp_path / "data.parquet")}},
        {"type": "ThresherRelease", "name": "Release", "input": "Read",
         "config": dict(config, num_shards=2)},
        {"type": "WriteToText", "name": "WriteReport", "input": "Release.report",
         "config": {"path": str(tmp_path / "yaml_out" / "report.json")}},
    ]}}
    _run_yaml_main(tmp_path, doc)
    out = tmp_path / "yaml_out"
    report = json.loads((out / sorted(os.listdir(out))[0]).read_text())
    assert report["mechanism"]["presampled"] is True
    assert (report["mechanism"], report["privacy"]) == (
        json.loads(json.dumps(cli_report["mechanism"])),
        json.loads(json.dumps(cli_report["privacy"])))
    assert 0 < report["released_keys"] < len(sample)


def test_api_release_refuses_a_continual_section():
    """A spec with a ``continual`` section releases period by period (``thresher run SPEC
    --period P``, charged once for the horizon): thresher.Release must refuse it naming the
    section, never release it once as if the section were not there."""
    import thresher
    spec = {"input": {"user": "user_id", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8},
            "bounding": {"max_keys_per_user": 4}, "mechanism": {"kind": "gaussian"},
            "continual": {"horizon": 6}}
    with pytest.raises(SpecError) as refused:
        thresher.Release(spec)
    assert refused.value.field == "continual"
    assert "--period" in str(refused.value)

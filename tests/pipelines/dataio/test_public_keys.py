"""input.public_keys: spec errors, and real releases over a public key domain on the local
Beam runner (every domain key exactly once, zero-count keys included, no other key,
counts within the noise bound, the automatic bound, the report)."""
import json

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from thresher.accounting import known_domain
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.errors import SpecError
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run
from thresher.transforms.randomness import keyed_random


def _domain_file(tmp_path, small_parquet, n_present=40, absent=("zz-absent-1", "zz-absent-2"),
                 name="domain.parquet"):
    """The n_present most frequent words of the data plus words that never occur."""
    table = pq.read_table(small_parquet, columns=["word"])
    freq = table.group_by(["word"]).aggregate([([], "count_all")]).sort_by(
        [("count_all", "descending"), ("word", "ascending")])
    words = freq.column("word").to_pylist()[:n_present] + list(absent)
    path = tmp_path / name
    pq.write_table(pa.table({"word": words}), path)
    return str(path), words


def _bounded_truth(path, words, user="user_id", key="word"):
    """Distinct users per domain key after restricting records to the domain (before
    bounding), and each user's number of distinct domain keys."""
    table = pq.read_table(path, columns=[user, key])
    table = table.filter(pc.is_in(table.column(key), value_set=pa.array(words)))
    pairs = table.group_by([user, key]).aggregate([])
    per_key = dict(zip(*pairs.group_by([key]).aggregate([([], "count_all")]).to_pydict().values()))
    per_user = pairs.group_by([user]).aggregate([([], "count_all")]).column("count_all").to_numpy()
    return {w: per_key.get(w, 0) for w in words}, per_user


# ---- spec errors ----------------------------------------------------------------------

@pytest.mark.parametrize("make, field", [
    (lambda tmp: {"path": str(tmp / "nope.parquet")}, "input.public_keys.path"),
    (lambda tmp: {"path": _write(tmp, pa.table({"other": ["a"]}))}, "input.public_keys.path"),
    (lambda tmp: {"path": _write(tmp, pa.table({"word": pa.array([], pa.string())}))},
     "input.public_keys.path"),
    (lambda tmp: {"path": _write(tmp, pa.table({"word": ["a", "b", "a"]}))},
     "input.public_keys.path"),
    (lambda tmp: {"path": _write(tmp, pa.table({"word": ["a", None]}))}, "input.public_keys.path"),
    (lambda tmp: {"path": "keys.txt"}, "input.public_keys.format"),
    (lambda tmp: {"path": "keys.csv", "format": "xml"}, "input.public_keys.format"),
    (lambda tmp: {"path": "keys.csv", "colour": 1}, "input.public_keys.colour"),
    (lambda tmp: "keys.csv", "input.public_keys"),
])
def test_public_keys_spec_errors_name_the_field(write_spec, tmp_path, make, field):
    path = write_spec({"input.public_keys": make(tmp_path)})
    with pytest.raises(SpecError) as err:
        make_plan(spec_mod.load(path))
    assert err.value.field == field
    assert main(["validate", path]) == 2


def _write(tmp, table, name="keys.parquet"):
    path = tmp / name
    pq.write_table(table, path)
    return str(path)


@pytest.mark.parametrize("changes, field", [
    ({"mechanism": {"kind": "sample_and_threshold"}}, "input.public_keys"),
    ({"mechanism": {"kind": "gaussian", "threshold": 50}}, "mechanism.threshold"),
    ({"mechanism": {"kind": "gaussian", "pre_threshold": 5}}, "mechanism.pre_threshold"),
    ({"mechanism": {"kind": "laplace", "debias": "poisson"}}, "mechanism.num_users"),
    ({"mechanism": {"kind": "laplace", "debias": "gamma", "num_users": 5}}, "mechanism.debias"),
    ({"mechanism": {"kind": "laplace", "clamp_negative": "yes"}}, "mechanism.clamp_negative"),
    ({"bounding": {"max_keys_per_user": "auto", "auto": {"objective": "keys"}}},
     "bounding.auto.objective"),
])
def test_public_keys_mechanism_errors(write_spec, tmp_path, changes, field):
    keys = _write(tmp_path, pa.table({"word": ["a", "b"]}))
    with pytest.raises(SpecError) as err:
        spec_mod.load(write_spec({"input.public_keys": {"path": keys}, **changes}))
    assert err.value.field == field
    if field == "input.public_keys":
        assert "supported for gaussian and laplace" in str(err.value)


@pytest.mark.parametrize("mechanism, field", [
    ({"kind": "laplace", "debias": "poisson", "num_users": 10}, "mechanism.debias"),
    ({"kind": "gaussian", "clamp_negative": True}, "mechanism.clamp_negative"),
])
def test_domain_only_fields_need_public_keys(write_spec, mechanism, field):
    with pytest.raises(SpecError) as err:
        spec_mod.load(write_spec({"mechanism": mechanism}))
    assert err.value.field == field


def test_csv_domain_is_cast_to_the_input_key_type(write_spec, tmp_path):
    """A CSV domain is read as text; integer key columns of a Parquet input are cast, and
    a value that is not an integer is a spec error naming the file."""
    data = tmp_path / "ints.parquet"
    pq.write_table(pa.table({"user_id": ["u1", "u2"], "code": pa.array([1, 2], pa.int64())}), data)
    good = tmp_path / "good.csv"
    good.write_text("code\n1\n2\n3\n")
    bad = tmp_path / "bad.csv"
    bad.write_text("code\n1\nx\n")
    base = {"input.path": str(data), "input.keys": ["code"]}
    plan = make_plan(spec_mod.load(write_spec({**base, "input.public_keys": {"path": str(good)}})))
    assert plan.domain.schema == pa.schema([("code", pa.int64())]) and plan.domain.num_rows == 3
    with pytest.raises(SpecError) as err:
        make_plan(spec_mod.load(write_spec({**base, "input.public_keys": {"path": str(bad)}})))
    assert err.value.field == "input.public_keys.path" and "int64" in str(err.value)


def _jsonl_lines(path, rows):
    with open(path, "w", encoding="utf-8") as handle:
        for row in rows:
            handle.write(json.dumps(row) + "\n")
    return str(path)


@pytest.mark.parametrize("data_keys, domain, refused", [
    # the data's JSON numbers are numbers in its schema: an integer domain matches them
    ([1, 2, 3], pa.array([1, 2, 3], pa.int64()), False),
    # JSON strings in the data, an integer domain: "1" is never the key 1 (issue 36 D12)
    (["1", "2", "3"], pa.array([1, 2, 3], pa.int64()), True),
    # JSON numbers in the data, a text domain (Parquet strings) is refused alike
    ([1, 2, 3], pa.array(["1", "2", "3"]), True),
])
def test_a_domain_of_another_kind_than_the_jsonl_data_is_refused(write_spec, tmp_path,
                                                                  data_keys, domain, refused):
    data = _jsonl_lines(tmp_path / "in.jsonl", [{"user_id": f"u{i}", "code": data_keys[i % 3]}
                                                for i in range(30)])
    pq.write_table(pa.table({"code": domain}), tmp_path / "domain.parquet")
    spec = spec_mod.load(write_spec({"input.path": data, "input.format": "jsonl",
                                     "input.keys": ["code"],
                                     "input.public_keys": {"path": str(tmp_path / "domain.parquet")}}))
    if not refused:
        assert make_plan(spec).domain.column("code").to_pylist() == ["1", "2", "3"]
        return
    with pytest.raises(SpecError) as err:
        make_plan(spec)
    assert err.value.field == "input.public_keys" and "code" in str(err.value)


def test_the_beam_yaml_transform_refuses_a_domain_of_another_type(tmp_path):
    """The transform casts the domain to its rows' field types: an int64 domain for a
    string key field is refused by name when the pipeline is built (issue 36 D12)."""
    import apache_beam as beam
    from thresher.pipelines.beam_yaml import ThresherRelease
    pq.write_table(pa.table({"word": pa.array([1, 2], pa.int64())}), tmp_path / "d.parquet")
    release = ThresherRelease("user_id", ["word"], {"epsilon": 1.0, "delta": 1e-8},
                              {"max_keys_per_user": 2}, {"kind": "gaussian"},
                              public_keys={"path": str(tmp_path / "d.parquet")})
    with pytest.raises(SpecError) as err:
        with beam.Pipeline() as pipeline:
            _ = (pipeline | beam.Create([beam.Row(user_id="u1", word="a")]) | release)
    assert err.value.field == "ThresherRelease.public_keys", err.value


# ---- releases ---------------------------------------------------------------------------

def test_gaussian_release_over_public_keys(write_spec, small_parquet, tmp_path):
    """Every domain key exactly once (zero-count ones included), no other key; with a bound
    above every user's number of domain keys the bounded counts are the true ones, so each
    released count is within 7 sigma of the truth (false failure < 42 * 2.6e-12)."""
    domain_path, words = _domain_file(tmp_path, small_parquet)
    truth, per_user = _bounded_truth(small_parquet, words)
    bound = int(per_user.max())
    spec = spec_mod.load(write_spec({"input.path": small_parquet,
                                     "input.public_keys": {"path": domain_path},
                                     "bounding.max_keys_per_user": bound}))
    plan = make_plan(spec)
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(5))
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert released.schema == pa.schema([("word", pa.string()), ("count", pa.int64()),
                                         ("count_low", pa.int64()), ("count_high", pa.int64())])
    got = released.column("word").to_pylist()
    assert sorted(got) == sorted(words) and len(got) == len(set(got))
    sigma = report["mechanism"]["sigma"]
    assert sigma == pytest.approx(known_domain.gaussian_sigma(1.0, 1e-8, bound), rel=1e-9)
    counts = dict(zip(got, released.column("count").to_pylist()))
    assert all(abs(counts[w] - truth[w]) <= 7 * sigma for w in words)
    assert truth["zz-absent-1"] == 0 and truth["zz-absent-2"] == 0
    assert report["released_keys"] == len(words)
    assert report["bounding"]["public_keys"] == {"path": domain_path, "size": len(words)}
    assert report["mechanism"]["public_keys"] is True and "threshold" not in report["mechanism"]
    assert report["privacy"]["stages"] == [{"name": "release", "epsilon": 1.0, "delta": 1e-8}]
    assert known_domain.gaussian_delta(1.0, sigma, bound) <= 1e-8


def test_laplace_l1_release_is_pure_and_counts_records(write_spec, small_parquet, tmp_path):
    """l1 model, bound above every user's in-domain record count: released counts are
    record counts plus discrete Laplace(C/eps) noise, within 25 b (false failure
    < 42 e^-25); the release stage spends delta 0 and the report says so."""
    domain_path, words = _domain_file(tmp_path, small_parquet, n_present=20)
    table = pq.read_table(small_parquet, columns=["user_id", "word"])
    table = table.filter(pc.is_in(table.column("word"), value_set=pa.array(words)))
    records = dict(zip(*table.group_by(["word"]).aggregate([([], "count_all")]).to_pydict().values()))
    bound = int(table.group_by(["user_id"]).aggregate([([], "count_all")])
                .column("count_all").to_numpy().max())
    spec = spec_mod.load(write_spec({
        "input.path": small_parquet, "input.public_keys": {"path": domain_path},
        "bounding.max_keys_per_user": bound, "bounding.model": "l1",
        "mechanism": {"kind": "laplace", "clamp_negative": True}}))
    report = run(make_plan(spec), rng_factory=keyed_random.seeded_for_tests(6))
    released = pq.read_table(tmp_path / "out" / "released.parquet").to_pydict()
    assert sorted(released["word"]) == sorted(words)
    b = report["mechanism"]["scale"]
    assert b == bound / 1.0
    for w, c in zip(released["word"], released["count"]):
        assert c >= 0 and abs(c - records.get(w, 0)) <= 25 * b
    privacy = report["privacy"]
    assert privacy["stages"] == [{"name": "release", "epsilon": 1.0, "delta": 0.0}]
    assert privacy["delta_spent"] == 0.0 and privacy["delta"] == 1e-8
    assert "(epsilon, 0)-DP" in privacy["delta_note"]


@pytest.mark.parametrize("kind, model", [("laplace", "l1"), ("laplace", "l0"), ("gaussian", "l0")])
def test_auto_bound_over_public_keys(write_spec, small_parquet, tmp_path, kind, model, caplog):
    """The bounded-domain rule picks one candidate; every domain key is released once;
    stages add to the total epsilon; no data-dependent number reaches the report."""
    domain_path, words = _domain_file(tmp_path, small_parquet, n_present=30)
    mechanism = {"kind": kind}
    if kind == "laplace":
        mechanism.update(debias="poisson", num_users=9679)
    spec = spec_mod.load(write_spec({
        "input.path": small_parquet, "input.public_keys": {"path": domain_path},
        "bounding": {"max_keys_per_user": "auto", "model": model,
                     "auto": {"epsilon": 0.2, "max_bound": 16}},
        "mechanism": mechanism}))
    plan = make_plan(spec)
    report = run(plan, rng_factory=keyed_random.seeded_for_tests(7))
    chosen = report["bounding"]["max_keys_per_user"]
    assert chosen in plan.candidates and chosen in report["bounding"]["candidates"]
    stages = report["privacy"]["stages"]
    assert [s["name"] for s in stages] == ["choose_contribution_bound", "release"]
    assert stages[0] == {"name": "choose_contribution_bound", "epsilon": 0.2, "delta": 0.0}
    assert sum(s["epsilon"] for s in stages) == pytest.approx(report["privacy"]["epsilon"])
    spent = sum(s["delta"] for s in stages)
    assert spent == pytest.approx(report["privacy"].get("delta_spent", report["privacy"]["delta"]))
    assert report["mechanism"] == plan.params_by_bound[chosen]
    selection = report["bounding"]["selection"]
    assert selection["sensitivity"] == (1.0 if kind == "laplace" else pytest.approx(4.0))
    released = pq.read_table(tmp_path / "out" / "released.parquet")
    assert sorted(released.column("word").to_pylist()) == sorted(words)
    if kind == "laplace":
        assert released.schema.field("debiased").type == pa.float64()
        d = report["mechanism"]["debias"]
        assert d["per_user_bound"] == (chosen if model == "l1" else 1)
        noisy = released.column("count").to_numpy()
        expect = known_domain.poisson_debias_counts(noisy, 9679, d["per_user_bound"])
        np.testing.assert_allclose(released.column("debiased").to_numpy(), expect)
    # Only public numbers in the report: it is the data-free plan report for the chosen C
    # plus the output paths and the number of released keys, which is d (public).
    data_free = plan.report(chosen_bound=chosen)
    assert {k: v for k, v in report.items() if k not in ("released_keys", "outputs")} == data_free
    assert report["released_keys"] == len(words)


def test_plan_json_for_public_keys_reports_domain_and_pure_delta(write_spec, small_parquet,
                                                                 tmp_path, capsys):
    domain_path, words = _domain_file(tmp_path, small_parquet, n_present=5)
    path = write_spec({"input.path": small_parquet, "input.public_keys": {"path": domain_path},
                       "mechanism": {"kind": "laplace"}})
    assert main(["plan", path, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["bounding"]["public_keys"] == {"path": domain_path, "size": len(words)}
    assert report["mechanism"]["scale"] == 8.0 and report["privacy"]["delta_spent"] == 0.0


# ---- the automatic bound stops at the domain size (issue 28) ----------------------------

def test_domain_candidates_stop_at_the_domain_size():
    """l0: the candidates >= d tie (every user whole), so they collapse to d, the smaller
    bound; l1 keeps them (a user may hold several records of one key)."""
    from thresher.pipelines.dataio.public_keys import domain_candidates
    assert domain_candidates((1, 2, 4, 8, 16), 3, "l0") == (1, 2, 3)
    assert domain_candidates((1, 2, 4, 8, 16), 4, "l0") == (1, 2, 4)
    assert domain_candidates((1, 2, 4), 40, "l0") == (1, 2, 4)
    assert domain_candidates((4, 8), 2, "l0") == (2,)
    assert domain_candidates((1, 2, 4, 8), 3, "l1") == (1, 2, 4, 8)


@pytest.mark.parametrize("kind, n_present, seeds", [("gaussian", 3, range(10, 16)),
                                                     ("laplace", 21, range(20, 26))])
def test_auto_bound_over_public_keys_never_exceeds_the_domain(write_spec, small_parquet,
                                                               tmp_path, kind, n_present, seeds):
    """Through the real release path, over several draws (fixed seeds): the chosen C is
    never above the domain size d, and the plan offers no candidate above d. The
    candidates are cut at d before any draw, so no seed can fail (false-failure
    probability 0). Without the cut the issue measured ~92% of draws above d: with all
    candidates up to max_bound offered, 6 draws all <= d would be very unlikely."""
    domain_path, words = _domain_file(tmp_path, small_parquet, n_present=n_present, absent=())
    d = len(words)
    spec_dict = {"input.path": small_parquet, "input.public_keys": {"path": domain_path},
                 "bounding": {"max_keys_per_user": "auto", "model": "l0",
                              "auto": {"epsilon": 0.2, "max_bound": 128}},
                 "mechanism": {"kind": kind}}
    plan = make_plan(spec_mod.load(write_spec(spec_dict)))
    assert max(plan.candidates) == d and d in plan.candidates
    if kind == "gaussian":
        assert plan.report()["bounding"]["selection"]["sensitivity"] == pytest.approx(d ** 0.5)
    chosen = []
    for seed in seeds:
        report = run(plan, overwrite=True,
                     rng_factory=keyed_random.seeded_for_tests(seed))
        chosen.append(report["bounding"]["max_keys_per_user"])
        released = pq.read_table(tmp_path / "out" / "released.parquet")
        assert sorted(released.column("word").to_pylist()) == sorted(words)
    assert all(1 <= c <= d for c in chosen), (d, chosen)


# ---- large public domains (issue 36 D13) --------------------------------------------------

def test_plan_states_the_domain_size(write_spec, small_parquet, tmp_path, capsys):
    domain_path, words = _domain_file(tmp_path, small_parquet, n_present=7)
    path = write_spec({"input.path": small_parquet, "input.public_keys": {"path": domain_path}})
    for args in (["plan", path], ["plan", path, "--verbose"]):
        assert main(args) == 0
        out = " ".join(capsys.readouterr().out.split())
        assert f"public keys: {len(words):,} keys listed in" in out
        assert "each released with noise and no threshold" in out


@pytest.mark.parametrize("name", ["keys.parquet", "keys.csv", "keys.jsonl"])
def test_a_domain_over_the_planning_limit_is_refused_before_it_is_read(
        write_spec, small_parquet, tmp_path, monkeypatch, capsys, name):
    """Parquet by its footer's row count, CSV/JSONL by their size: exit 2 naming
    input.public_keys, and the file is never read into memory."""
    from thresher.pipelines.common import limits
    from thresher.pipelines.dataio import public_keys
    words = [f"w{i}" for i in range(50)]
    path = tmp_path / name
    if name.endswith(".parquet"):
        pq.write_table(pa.table({"word": words}), path)
        monkeypatch.setattr(limits, "PUBLIC_KEYS_MAX", 49)
    else:
        path.write_text("word\n" + "\n".join(words) + "\n" if name.endswith(".csv") else
                        "".join(json.dumps({"word": w}) + "\n" for w in words))
        monkeypatch.setattr(limits, "PUBLIC_KEYS_MAX_BYTES", path.stat().st_size - 1)

    def never(*args):
        raise AssertionError("the domain file was read")
    monkeypatch.setattr(public_keys, "_read", never)
    spec = write_spec({"input.path": small_parquet, "input.public_keys": {"path": str(path)}})
    for command in ("plan", "validate", "run"):
        assert main([command, spec]) == 2
        err = capsys.readouterr().err
        assert "input.public_keys" in err and "planning limit" in err and "Traceback" not in err


def test_a_domain_at_the_limit_is_accepted_and_counted_after_reading(write_spec, small_parquet,
                                                                       tmp_path, monkeypatch):
    from thresher.pipelines.common import limits
    domain_path, words = _domain_file(tmp_path, small_parquet, n_present=10, absent=())
    monkeypatch.setattr(limits, "PUBLIC_KEYS_MAX", len(words))
    spec = write_spec({"input.path": small_parquet, "input.public_keys": {"path": domain_path}})
    assert make_plan(spec_mod.load(spec)).domain.num_rows == len(words)
    monkeypatch.setattr(limits, "PUBLIC_KEYS_MAX", len(words) - 1)
    with pytest.raises(SpecError, match="input.public_keys"):
        make_plan(spec_mod.load(spec))


def test_the_graph_holds_a_large_domain_once_packed(write_spec, small_parquet, tmp_path):
    """Before: the domain table was pickled into the restriction DoFn, the zero counts'
    Create and the writer (each pickle bz2-compressed by Beam: ~50 s of CPU for 3e5
    keys). Now one packed copy (zstd Arrow IPC) feeds all three."""
    import apache_beam as beam
    from thresher.pipelines.running import release
    from thresher.transforms.selection import public_domain
    words = [f"domain key {i:07d}" for i in range(100_000)]
    path = tmp_path / "big.parquet"
    pq.write_table(pa.table({"word": words}), path)
    spec = write_spec({"input.path": small_parquet, "input.public_keys": {"path": str(path)}})
    plan = make_plan(spec_mod.load(spec))
    packed = len(public_domain.pack(plan.domain))
    table_bytes = plan.domain.nbytes
    pipeline = beam.Pipeline()
    release.build(pipeline, plan, [small_parquet], 20_000, str(tmp_path / "staging"),
                  rng_factory=keyed_random.KeyedSource(b"graph size test secret........."))
    graph = len(pipeline.to_runner_api().SerializeToString())
    assert graph < 3 * packed + 2_000_000 < table_bytes + 2_000_000

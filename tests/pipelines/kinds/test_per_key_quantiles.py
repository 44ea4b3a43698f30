"""Per-key quantiles over the public cells of public or selected keys (issue 28):
the accounting against an independent brute-force sum, the post-processing kernels
against explicit least squares, the bounding, and a release on a 120-key corpus
(benchmarks/per_key_quantiles.py) through the real release path."""
import dataclasses
import json
import math
import os

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.running.release import run
from thresher.transforms.randomness import keyed_random
from thresher.transforms.trees.public_cells import consistent_tree, key_quantiles, support_floor


def _brute_delta(epsilon, sigma, shifts):
    """delta(eps) of `shifts` N_Z(0, sigma^2) coordinates each shifted by 1, by direct
    pmf sums: the privacy loss of the pair depends on the observed sum S only,
    L = (2 S - a) / (2 sigma^2) under P = N_Z(1, sigma^2)^a; delta = E_P[(1 - e^(eps - L))^+].
    The pmf of S is the a-fold convolution of the discrete Gaussian pmf (numpy only)."""
    k = int(math.ceil(14 * sigma)) + shifts
    x = np.arange(-k, k + 1)
    p = np.exp(-x.astype(float) ** 2 / (2 * sigma ** 2))
    p /= p.sum()
    s = p
    for _ in range(shifts - 1):
        s = np.convolve(s, p)
    total = np.arange(-k * shifts, k * shifts + 1) + shifts      # S under P (each +1)
    loss = (2 * total - shifts) / (2 * sigma ** 2)
    return float(np.sum(s * np.maximum(0.0, 1 - np.exp(epsilon - loss))))


def _spec(tmp_path, data, bound=1, public_keys=None, **mech):
    spec = {"name": "q", "input": {"path": data, "user": "user", "keys": ["country"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "quantiles", "column": "x", "ranks": [0.25, 0.5, 0.75],
                          "domain": [0, 1000], **mech},
            "output": {"path": str(tmp_path / "out")}}
    if public_keys is not None:
        spec["input"]["public_keys"] = {"path": public_keys}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return spec_mod.load(str(path))


@pytest.mark.parametrize("bound", [1, 2])
def test_accounting_matches_brute_force_and_never_divides_by_keys(tmp_path, bound):
    """select_keys spends its share; the levels stage spends the rest on C L unit shifts
    (C = bound, L = 3): sigma's delta, recomputed by a brute-force pmf convolution, is
    within the stage's delta; and sigma does not depend on how many keys there are."""
    plan = make_plan(_spec(tmp_path, "x.parquet", bound=bound))
    report = plan.report()
    stages = report["privacy"]["stages"]
    assert [s["name"] for s in stages] == ["select_keys", "levels"]
    assert math.isclose(math.fsum(s["epsilon"] for s in stages), 1.0, rel_tol=1e-12)
    assert math.isclose(math.fsum(s["delta"] for s in stages), 1e-6, rel_tol=1e-12)
    mech = report["mechanism"]
    assert mech["unit_shifts"] == 3 * bound and mech["noise"] == "discrete_gaussian"
    eps, delta = stages[1]["epsilon"], stages[1]["delta"]
    brute = _brute_delta(eps, mech["sigma"], 3 * bound)
    assert brute <= delta and brute == pytest.approx(mech["delta_achieved"], rel=1e-6)
    # tight: 2% less noise would break the budget
    assert _brute_delta(eps, 0.98 * mech["sigma"], 3 * bound) > delta
    assert "null: the key's noisy number of users is below" in mech["null_values"]


def test_public_keys_sigma_is_the_same_for_2_or_200_keys(tmp_path):
    sigmas = []
    for n in (2, 200):
        keys = tmp_path / f"keys{n}.parquet"
        pq.write_table(pa.table({"country": [f"k{i}" for i in range(n)]}), keys)
        report = make_plan(_spec(tmp_path, "x.parquet", public_keys=str(keys))).report()
        assert [s["name"] for s in report["privacy"]["stages"]] == ["levels"]
        sigmas.append(report["mechanism"]["sigma"])
    assert sigmas[0] == sigmas[1]


def _tree_matrix(branching, levels):
    """Rows: every node of levels 1..L as the sum of its leaves (an explicit design)."""
    leaves = branching ** levels
    rows = []
    for l in range(1, levels + 1):
        width = leaves // branching ** l
        for j in range(branching ** l):
            r = np.zeros(leaves)
            r[j * width:(j + 1) * width] = 1
            rows.append(r)
    return np.array(rows)


@pytest.mark.parametrize("branching, levels", [(2, 3), (3, 2), (4, 3)])
def test_consistent_tree_is_the_least_squares_fit(branching, levels):
    rng = np.random.default_rng(0)
    a = _tree_matrix(branching, levels)
    y = a @ rng.integers(0, 20, a.shape[1]) + rng.normal(0, 3, a.shape[0])
    parts, start = [], 0
    for l in range(1, levels + 1):
        parts.append(y[start:start + branching ** l])
        start += branching ** l
    est, total_var = consistent_tree(parts, branching)
    lstsq = np.linalg.lstsq(a, y, rcond=None)[0]
    np.testing.assert_allclose(est, lstsq, atol=1e-8)
    # the total's variance (noise units): 1^T (A^T A)^-1 1
    one = np.ones(a.shape[1])
    assert total_var == pytest.approx(one @ np.linalg.pinv(a.T @ a) @ one, rel=1e-9)


def test_key_quantiles_interpolate_and_are_monotone():
    # 100 values uniform on the third leaf of 4 over [0, 40): quantiles inside it
    levels = [np.array([100.0, 0]), np.array([0, 100.0, 0, 0])]
    values, total = key_quantiles(levels, [0.75, 0.25, 0.5], lo=0, hi=40, branching=2, floor=1)
    assert total == pytest.approx(100)
    assert values == pytest.approx([17.5, 12.5, 15.0])
    # noisy levels: values non-decreasing in rank for any noise
    rng = np.random.default_rng(1)
    ranks = list(np.linspace(0.05, 0.95, 19))
    for _ in range(50):
        noisy = [rng.normal(0, 20, 4) + 30, rng.normal(0, 20, 16) + 8]
        vals, total = key_quantiles(noisy, ranks, lo=0, hi=1, branching=4, floor=0)
        if vals[0] is not None:
            assert all(a <= b for a, b in zip(vals, vals[1:]))
    vals, _ = key_quantiles([np.zeros(4), np.zeros(16)], ranks, lo=0, hi=1, branching=4,
                            floor=support_floor(10.0, 4, 2))
    assert vals == [None] * len(ranks)


def test_bound_key_values_one_value_per_key_at_most_c_keys():
    from thresher.transforms.bounding.key_value_bound import bound_key_values
    from thresher.transforms.bounding.user_shards import USER_COLUMN
    rng = np.random.default_rng(2)
    n = 5000
    table = pa.table({USER_COLUMN: pa.array(rng.integers(0, 300, n).astype(str)),
                      "k": pa.array(rng.integers(0, 12, n).astype(str)),
                      "x": pa.array(rng.integers(0, 50, n).astype(float))})
    kept = table.take(pa.array(bound_key_values(table, ["k"], "x", 3, rng, rng))).to_pydict()
    pairs = list(zip(kept[USER_COLUMN], kept["k"]))
    assert len(pairs) == len(set(pairs))                     # one value per (user, key)
    per_user = {}
    for u, _ in pairs:
        per_user[u] = per_user.get(u, 0) + 1
    assert max(per_user.values()) == 3
    have = {}
    for u, k in zip(table.column(USER_COLUMN).to_pylist(), table.column("k").to_pylist()):
        have.setdefault(u, set()).add(k)
    assert all(per_user[u] == min(3, len(ks)) for u, ks in have.items())


@pytest.mark.slow     # one release of 263,024 rows: ~35 s
def test_corpus_of_120_keys_big_keys_within_005_and_monotone(tmp_path):
    """benchmarks/per_key_quantiles.py's corpus (6 keys with 5,000-12,000 users, 114 with
    20-2,500), select_keys, epsilon = 1, delta = 1e-6, C = 1, a fixed release secret: every
    key with >= 5,000 users is selected and gets every rank within 0.05 of its true rank;
    every answered key is monotone in rank; a null comes only with the report's reason.
    Noise: sigma 14.5 per cell; the consistent rank of a big key has sd ~ 4 sigma ~ 60
    users, 0.012 at 5,000 users, so 0.05 is > 4 sd (false failure < 1e-4 per rank,
    < 3e-3 over the 30 big-key ranks); a big key is missed by select_keys with probability
    < 1e-12 (release point ~ 90 users)."""
    from benchmarks import per_key_quantiles as bench
    table, truth, users_per_key = bench.corpus(0)
    data = str(tmp_path / "data.parquet")
    pq.write_table(table, data)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(bench.spec_dict(data, str(tmp_path / "out"))))
    report = run(make_plan(spec_mod.load(str(path))),
                 rng_factory=keyed_random.KeyedSource(b"per-key quantiles test secret"))
    rows = pq.read_table(tmp_path / "out" / "released.parquet").to_pylist()
    figs = bench.evaluate(rows, truth, users_per_key)
    assert figs["big_selected"] == figs["big_keys"] == 6
    assert figs["worst_rank_error_big"] <= 0.05, figs
    assert figs["monotone"]
    assert figs["with_value"] >= 30
    if figs["with_value"] < figs["selected"]:
        assert report["mechanism"]["null_values"].startswith("null: the key's noisy number")


def test_binary_search_answers_are_rearranged_monotone():
    """The issue's US answer (0.25 -> 14.8, 0.5 -> 26.6, 0.75 -> 19.4) comes out sorted in
    rank; an unanswered search stays null."""
    from thresher.transforms.trees.quantile_release import search_answers
    ranks = [0.25, 0.5, 0.75, 0.9]
    state = {(("us",), 0): (14.0, 15.6, True), (("us",), 1): (26.0, 27.2, True),
             (("us",), 2): (19.0, 19.8, True), (("us",), 3): (0.0, 100.0, False)}
    out = search_answers(state, ["country"], [("us",)], ranks)
    assert out["value"] == pytest.approx([14.8, 19.4, 26.6, None])


def test_summary_states_the_null_reason(tmp_path):
    """The run summary of a per-key release says when a key's values are null (the
    report's null_values, a public floor)."""
    from thresher.pipelines.reports import summary
    report = make_plan(_spec(tmp_path, "x.parquet")).report(chosen_bound=None)
    lines = summary.noise_in_words(report, ["country"])
    floor = report["mechanism"]["support_floor"]
    assert any("no threshold" in line and f"below {floor:.4g}" in line for line in lines)


@pytest.mark.parametrize("keys", ["public", "selected"])
def test_the_production_path_draws_from_the_pipeline_secret(tmp_path, keys):
    """Without the test hook (no rng_factory), a release draws its secret inside the
    pipeline and every drawing DoFn receives it as a side input (keyed_random.par_do);
    the bounding of per-key quantiles was once applied with a plain ParDo and failed with
    'the release secret side input did not reach this DoFn'."""
    rng = np.random.default_rng(0)
    n = 3000
    data = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"user": rng.integers(0, 800, n).astype(str),
                             "country": rng.integers(0, 3, n).astype(str),
                             "x": rng.integers(0, 1000, n).astype(float)}), data)
    public = None
    if keys == "public":
        public = str(tmp_path / "keys.parquet")
        pq.write_table(pa.table({"country": ["0", "1", "2"]}), public)
    spec = _spec(tmp_path, data, public_keys=public)
    report = run(make_plan(spec))
    assert report["released_keys"] >= 0
    assert os.path.exists(tmp_path / "out" / "released.parquet")


def test_too_many_public_cells_are_refused_before_reading(tmp_path, cli):
    """Every (key, level, bucket) cell of public keys gets a noisy count: 100 keys x
    (2 + 4 + ... + 2**20) cells is above the planning limit, refused by `plan` with exit 2
    naming the field (before this check the run generated ~2e8 cells)."""
    keys = str(tmp_path / "keys.parquet")
    pq.write_table(pa.table({"country": [str(i) for i in range(100)]}), keys)
    data = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"user": ["u"], "country": ["0"], "x": [1.0]}), data)
    spec = {"name": "q", "input": {"path": data, "user": "user", "keys": ["country"],
                                   "public_keys": {"path": keys}},
            "privacy": {"epsilon": 1.0, "delta": 1e-6}, "bounding": {"max_keys_per_user": 1},
            "mechanism": {"kind": "quantiles", "column": "x", "ranks": [0.5],
                          "domain": [0, 1000], "branching": 2, "levels": 20},
            "output": {"path": str(tmp_path / "out")}}
    done = cli(spec, command="plan")
    assert done.returncode == 2, done.stderr
    assert "mechanism.levels" in done.stderr and "planning limit" in done.stderr
    assert "Traceback" not in done.stderr
    spec["mechanism"]["levels"] = 4                      # 100 x 30 cells: planned
    assert cli(spec, command="plan").returncode == 0


def _selected_spec(tmp_path, data, **mech):
    return {"name": "q", "input": {"path": data, "user": "user", "keys": ["country"]},
            "privacy": {"epsilon": 4.0, "delta": 1e-6}, "bounding": {"max_keys_per_user": 1},
            "mechanism": {"kind": "quantiles", "column": "x", "ranks": [0.25, 0.5, 0.75],
                          "domain": [0, 1000], "branching": 4, "levels": 2, **mech},
            "output": {"path": str(tmp_path / "out")}}


def test_more_selected_keys_than_the_cap_keep_exactly_the_cap_and_say_so(tmp_path):
    """8 keys pass select_keys, max_selected_keys is 4: exactly the 4 keys with the
    largest released counts get quantiles, and the report says 8 selected, 4 kept, 4
    dropped and why. Keys: b0..b3 with 600 users, s0..s3 with 150 (one key per user).
    At this budget select_keys samples at p = 0.328 with threshold 14: a small key's
    sampled count is Bin(150, p) (mean 49, sd 5.8), a big key's Bin(600, p) (mean 197,
    sd 11.5), so a small key missing the threshold (< 14) or outranking a big one are
    both > 6 sd events: false failure < 1e-9 (and the secret is fixed)."""
    rng = np.random.default_rng(3)
    sizes = {**{f"b{i}": 600 for i in range(4)}, **{f"s{i}": 150 for i in range(4)}}
    users, countries = [], []
    for k, n in sizes.items():
        users += [f"{k}-u{j}" for j in range(n)]
        countries += [k] * n
    data = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"user": users, "country": countries,
                             "x": rng.uniform(0, 1000, len(users))}), data)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(_selected_spec(tmp_path, data, max_selected_keys=4)))
    plan = make_plan(spec_mod.load(str(path)))
    assert plan.report()["mechanism"]["key_selection"]["max_keys"] == 4
    report = run(plan, rng_factory=keyed_random.KeyedSource(b"selected keys cap test secret.."))
    rows = pq.read_table(tmp_path / "out" / "released.parquet").to_pylist()
    assert sorted({r["country"] for r in rows}) == ["b0", "b1", "b2", "b3"]
    assert len(rows) == 4 * 3
    selection = report["mechanism"]["key_selection"]
    assert (selection["selected_keys"], selection["kept_keys"], selection["dropped_keys"]) \
        == (8, 4, 4)
    assert "max_keys" in selection["dropped_why"] and "8" in selection["dropped_why"]
    saved = json.loads((tmp_path / "out" / "release_report.json").read_text())
    assert saved["mechanism"]["key_selection"]["dropped_keys"] == 4
    assert sorted(os.listdir(tmp_path / "out")) == ["release_report.json", "released.parquet"]


def test_the_cap_defaults_to_the_cell_limit_and_a_larger_one_is_refused(tmp_path, cli):
    """Default max_keys = 2**26 // cells per key (4 + 16 = 20 here); asking for more
    than the limit allows, or for a cap where no keys are selected, is refused by `plan`
    with exit 2 naming mechanism.max_selected_keys."""
    from thresher.pipelines.kinds.quantiles import MAX_PUBLIC_CELLS
    data = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"user": ["u"], "country": ["0"], "x": [1.0]}), data)
    spec = _selected_spec(tmp_path, data)
    path = tmp_path / "default.yaml"
    path.write_text(yaml.safe_dump(spec))
    report = make_plan(spec_mod.load(str(path))).report()
    assert report["mechanism"]["key_selection"]["max_keys"] == MAX_PUBLIC_CELLS // 20
    spec["mechanism"]["max_selected_keys"] = MAX_PUBLIC_CELLS // 20 + 1
    done = cli(spec, command="plan")
    assert done.returncode == 2, done.stderr
    assert "mechanism.max_selected_keys" in done.stderr and "planning limit" in done.stderr
    assert "Traceback" not in done.stderr
    spec["mechanism"]["max_selected_keys"] = MAX_PUBLIC_CELLS // 20
    assert cli(spec, command="plan").returncode == 0
    keys = str(tmp_path / "keys.parquet")
    pq.write_table(pa.table({"country": ["0"]}), keys)
    spec["input"]["public_keys"] = {"path": keys}
    done = cli(spec, command="plan")
    assert done.returncode == 2 and "mechanism.max_selected_keys" in done.stderr, done.stderr


def test_cells_per_key_alone_above_the_limit_are_refused():
    """The spec's leaf limit (2**20) keeps one key's cells below 2**26 today; the cap's
    own check still refuses a shape whose cells per key alone exceed it."""
    from thresher.pipelines.errors import SpecError
    from thresher.pipelines.kinds.quantiles import MAX_PUBLIC_CELLS, selected_keys_cap
    with pytest.raises(SpecError, match="mechanism.levels"):
        selected_keys_cap({"branching": 2, "levels": 26})
    assert selected_keys_cap({"branching": 2, "levels": 25}) == 1     # 2**26 - 2 cells
    assert selected_keys_cap({"branching": 16, "levels": 3}) == MAX_PUBLIC_CELLS // 4368


@pytest.mark.parametrize("bound", [1, 4])
def test_select_keys_composes_a_users_keys_by_the_pld_bound(tmp_path, bound):
    """Issue 38: select_keys over C = 4 keys is calibrated with composition pld (as kind
    sample_and_threshold), a lower release point than basic composition at the same
    stage budget, its delta by pld.user_delta; C = 1 is the exact one-key calibration
    either way (pld and basic coincide)."""
    from thresher.accounting import sample_threshold as acc
    from thresher.accounting.sample_threshold import pld
    data = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"user": ["u"], "country": ["a"], "x": [1.0]}), data)
    spec = _selected_spec(tmp_path, data)
    spec["bounding"]["max_keys_per_user"] = bound
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    selection = make_plan(spec_mod.load(str(path))).report()["mechanism"]["key_selection"]
    eps, delta = 4.0 * selection["share"], 1e-6 * selection["share"]
    basic = acc.calibrate(eps, delta, bound, composition="basic")
    assert selection["composition"] == ("pld" if bound > 1 else "basic")
    assert selection["delta_achieved"] <= delta
    if bound > 1:
        assert selection["delta_achieved"] == pld.user_delta(
            eps, selection["sampling_rate"], selection["threshold"], bound)
        assert selection["release_point"] < 0.7 * basic.release_point
    else:
        assert (selection["sampling_rate"], selection["threshold"]) == (
            basic.sampling_rate, basic.threshold)


def test_restrict_to_selected_keys_is_python_key_equality():
    """``quantiles._restrict_to`` keeps the rows whose key tuple is selected, as the
    Python set membership it replaced (issue 43: that loop ran over every (key, value)
    row of the counts): string and integer keys, two key columns, a float key with
    -0.0 (Python's 0.0), no keys (every row), nothing selected (no table)."""
    from thresher.pipelines.kinds import quantiles as q

    def python_rows(table, keys, selected):
        chosen = set(selected)
        return [kt in chosen for kt in zip(*[table.column(k).to_pylist() for k in keys])]

    rng = np.random.default_rng(11)
    n = 500
    table = pa.table({"k": pa.array(np.char.add("w", rng.integers(0, 30, n).astype(str))
                                    .astype(object)),
                      "j": pa.array(rng.integers(0, 4, n)),
                      "f": pa.array(rng.choice([0.0, -0.0, 1.5, 2.25], n)),
                      "x": pa.array(rng.random(n))})
    cases = [(["k"], [(f"w{i}",) for i in range(0, 30, 3)]),
             (["k", "j"], [(f"w{i}", i % 4) for i in range(30)]),
             (["f"], [(0.0,), (2.25,)]),
             (["j", "f"], [(1, -0.0), (3, 1.5)])]
    for keys, selected in cases:
        got = list(q._restrict_to(table, keys, selected))
        want = table.filter(pa.array(python_rows(table, keys, selected)))
        assert len(got) == 1 and got[0].equals(want), keys
        assert 0 < want.num_rows < n
    assert list(q._restrict_to(table, ["k"], [])) == []
    assert list(q._restrict_to(table, [], [()]))[0].equals(table)


@pytest.mark.parametrize("keys", ["public", "selected"])
def test_the_reader_hashes_the_keys_alone_and_the_bytes_do_not_read_that_hash(
        tmp_path, monkeypatch, keys):
    """Per-key quantiles over public cells read ``__key`` as the hash of the key columns
    alone (``read_spec``'s ``hashed_keys``: the float value's text form was most of the
    reader's hash, issue 43 round 7), and their stages never read the reader's hash: a
    release whose reader hashes (keys, value), as before, publishes the same bytes under
    one secret. The global hierarchy keeps the (keys, value) hash its bound reads."""
    import hashlib
    from thresher.pipelines.dataio import io
    from thresher.pipelines.kinds import quantiles
    rng = np.random.default_rng(12)
    n = 4000
    data = str(tmp_path / "x.parquet")
    pq.write_table(pa.table({"user": rng.integers(0, 700, n).astype(str),
                             "country": rng.integers(0, 4, n).astype(str),
                             "x": np.round(rng.lognormal(5, 1, n), 2)}), data)
    public = None
    if keys == "public":
        public = str(tmp_path / "keys.parquet")
        pq.write_table(pa.table({"country": ["0", "1", "2", "3", "9"]}), public)
    spec = _spec(tmp_path, data, bound=2, public_keys=public)
    assert quantiles.read_spec(spec).hashed_keys == ("country",)
    assert quantiles.read_spec(spec).keys == ("country", "x")
    seen = []
    prepare = io.prepare_batch

    def recording(*args, **kwargs):
        seen.append(kwargs.get("hashed_keys"))
        return prepare(*args, **kwargs)
    monkeypatch.setattr(io, "prepare_batch", recording)
    digests = []
    for hashed in ("keys", "keys and value"):
        if hashed == "keys and value":      # the reader as before: every read column
            monkeypatch.setattr(quantiles.Quantiles, "read_spec", staticmethod(
                lambda s: dataclasses.replace(s.input, keys=(*s.input.keys, s.mechanism["column"]),
                                              quantile_column=None)))
        seen.clear()
        run(make_plan(spec), [], overwrite=True,
            rng_factory=keyed_random.KeyedSource(b"per-key quantiles reader hash secret"))
        assert set(seen) == ({("country",)} if hashed == "keys" else {None})
        digests.append([hashlib.sha256((tmp_path / "out" / f).read_bytes()).hexdigest()
                        for f in ("released.parquet", "release_report.json")])
    assert digests[0] == digests[1]
    table = pq.read_table(tmp_path / "out" / "released.parquet")
    assert table.column("value").null_count < table.num_rows
    glob = _spec(tmp_path, data, bound=2)
    glob_mech = dict(glob.mechanism, method="binary_search")
    glob_mech.pop("public_cells", None)
    assert quantiles.read_spec(dataclasses.replace(glob, mechanism=glob_mech)).hashed_keys is None

"""mechanism.kind: weighted_gaussian end to end: the plan's stages and calibration checked
independently, real CLI runs (fixed and automatic bound), the Beam transforms on the
FnApiRunner against a numpy reference, and spec errors (exit code 2, field named)."""
import json
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to

from thresher.accounting import discrete_gaussian, weighted_gaussian as wg
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.transforms.randomness import keyed_random
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.bounding.user_shards import ShardByUser
from thresher.transforms.selection.weighted_threshold import (WEIGHT_COLUMN, WeightedPerUserBound,
                                           WeightedThreshold, user_weights)

WORDS = [f"w{i}" for i in range(60)]


def _data(tmp_path, users=3000, seed=0):
    rng = np.random.default_rng(seed)
    u, w = [], []
    for i in range(users):
        k = int(rng.integers(1, 25))
        for j in rng.choice(len(WORDS), size=k, replace=False,
                            p=np.arange(len(WORDS), 0, -1) / np.arange(len(WORDS), 0, -1).sum()):
            u.append(f"user{i}")
            w.append(WORDS[j])
    path = tmp_path / "data.parquet"
    pq.write_table(pa.table({"user": pa.array(u, pa.string()), "word": pa.array(w, pa.string())}), path)
    return str(path)


def _spec(tmp_path, data, bound=8, **mech):
    return {"name": "wg", "input": {"path": data, "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "weighted_gaussian", **mech},
            "output": {"path": str(tmp_path / "out")}}


def _load(tmp_path, spec):
    import yaml
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(spec))
    return spec_mod.load(str(path))


def test_plan_has_selection_and_count_stages_that_meet_their_shares(tmp_path):
    plan = make_plan(_load(tmp_path, _spec(tmp_path, "x.parquet", bound=16, count_fraction=0.2)))
    report = plan.report()
    stages = {s["name"]: s for s in report["privacy"]["stages"]}
    assert set(stages) == {"release", "count"}
    assert math.isclose(stages["release"]["epsilon"] + stages["count"]["epsilon"], 1.0, rel_tol=1e-12)
    assert math.isclose(stages["count"]["epsilon"], 0.2, rel_tol=1e-12)
    assert math.isclose(stages["count"]["delta"], 0.2e-6, rel_tol=1e-12)
    mech = report["mechanism"]
    # recomputed independently of the calibration
    assert wg.delta(stages["release"]["epsilon"], mech["sigma"], mech["threshold_grid"], 16) \
        <= stages["release"]["delta"]
    assert discrete_gaussian.composed_shift_delta(stages["count"]["epsilon"], mech["count_sigma"],
                                                  16) <= stages["count"]["delta"]
    assert mech["threshold"] == mech["threshold_grid"] / mech["scale"]


def test_cli_run_fixed_bound_releases_keys_with_noisy_counts(tmp_path, cli):
    data = _data(tmp_path)
    done = cli(_spec(tmp_path, data, bound=8))
    assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "out" / "released.parquet")
    assert table.column_names == ["word", "count", "count_low", "count_high"]   # issue 27
    assert table.schema.field("count").type == pa.int64()
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    assert report["mechanism"]["kind"] == "weighted_gaussian"
    assert report["released_keys"] == table.num_rows
    # the 20 most common words have > 500 users each, far above the threshold at C = 8
    # (weight 1/sqrt(8) each: ~177 against a threshold of ~30, sigma ~5.6): all released
    assert {f"w{i}" for i in range(20)} <= set(table.column("word").to_pylist())
    assert "w59" not in set(table.column("word").to_pylist()) or table.num_rows > 20


def test_cli_run_auto_bound(tmp_path, cli):
    data = _data(tmp_path)
    spec = _spec(tmp_path, data, bound="auto")
    spec["bounding"]["auto"] = {"max_bound": 32}
    done = cli(spec)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    assert report["bounding"]["chosen_by"] == "exponential_mechanism"
    assert report["bounding"]["selection"]["score"] == "weighted_gaussian"
    assert report["bounding"]["max_keys_per_user"] in report["bounding"]["candidates"]
    names = [s["name"] for s in report["privacy"]["stages"]]
    assert names == ["choose_contribution_bound", "release", "count"]
    assert report["released_keys"] > 0


@pytest.mark.parametrize("mech, field", [
    ({"threshold": 2.0}, "mechanism.threshold"),
    ({"sigma": 0.5}, "mechanism.sigma"),
    ({"count_fraction": 1.5}, "mechanism.count_fraction"),
    ({"pre_threshold": 2}, "mechanism"),
])
def test_spec_errors_name_the_field(tmp_path, cli, mech, field):
    done = cli(_spec(tmp_path, "x.parquet", **mech), command="plan")
    assert done.returncode == 2, done.stderr
    assert field in done.stderr and "Traceback" not in done.stderr


def test_bound_above_the_planning_limit_is_refused(tmp_path, cli):
    done = cli(_spec(tmp_path, "x.parquet", bound=4096), command="plan")
    assert done.returncode == 2 and "bounding.max_keys_per_user" in done.stderr


def test_l1_model_is_refused(tmp_path, cli):
    spec = _spec(tmp_path, "x.parquet")
    spec["bounding"]["model"] = "l1"
    done = cli(spec, command="plan")
    assert done.returncode == 2 and "bounding.model" in done.stderr


def _records(users_keys):
    """Prepared record batches (__user, __key, word), as the pipeline reads them."""
    from thresher.pipelines.dataio.io import prepare_batch
    from thresher.transforms.randomness.user_identity import TEST_KEY   # public, tests only
    table = pa.table({"user": pa.array([u for u, _ in users_keys], pa.string()),
                      "word": pa.array([k for _, k in users_keys], pa.string())})
    return prepare_batch(table, "user", ["word"], identity_key=TEST_KEY)[0]


def test_transforms_on_fnapirunner_match_the_numpy_reference():
    """Every user keeps all keys (at most Delta0 = 6): per key the summed grid weights
    are sum over its users of floor(1024 / sqrt(t_user)), the count its users; with the
    threshold at 1 grid unit and tiny noise every key comes out, and its noisy count is
    its count plus a small discrete Gaussian draw."""
    rng = np.random.default_rng(3)
    pairs, expected_w, expected_c = [], {}, {}
    for u in range(200):
        t = int(rng.integers(1, 7))
        keys = rng.choice(30, size=t, replace=False)
        for k in keys:
            pairs.append((f"u{u}", f"k{k}"))
            expected_w[f"k{k}"] = expected_w.get(f"k{k}", 0) + wg.grid_weight(t)
            expected_c[f"k{k}"] = expected_c.get(f"k{k}", 0) + 1
    records = _records(pairs)
    params = {"sigma": 1e-3, "scale": 1024, "threshold_grid": 1, "count_sigma": 1e-3}
    want_sums = sorted((k, expected_c[k], int(expected_w[k])) for k in expected_c)
    want_released = sorted((k, expected_c[k]) for k in expected_c)

    def rows(table, columns):
        return list(zip(*(table.column(c).to_pylist() for c in columns)))

    with beam.Pipeline(runner=FnApiRunner()) as p:
        sums = (p | beam.Create([records])
                | ShardByUser(4)
                | WeightedPerUserBound(["word"], 6, rng_factory=keyed_random.seeded_for_tests(1))
                | SumCountsPerKey(["word"], 3))
        assert_that(sums | "SumRows" >> beam.FlatMap(rows, ["word", "count", WEIGHT_COLUMN]),
                    equal_to(want_sums), label="CheckSums")
        released = sums | WeightedThreshold(params, rng_factory=keyed_random.seeded_for_tests(2))
        assert_that(released | "Columns" >> beam.Map(lambda t: tuple(t.column_names)),
                    lambda got: _all_equal(got, ("word", "count")), label="CheckColumns")
        assert_that(released | "ReleasedRows" >> beam.FlatMap(rows, ["word", "count"]),
                    equal_to(want_released), label="CheckReleased")


def _all_equal(got, want):
    assert got and all(g == want for g in got), got


def test_user_weights_follow_each_users_kept_keys():
    ids = np.array([5, 5, 5, 9, 7, 7, 7, 7], dtype=np.uint64)
    assert user_weights(ids, 1024).tolist() == [591] * 3 + [1024] + [512] * 4


def test_release_probability_curve_is_the_grid_tail():
    """thresher run's 'a key of n users is released ...' line: n users of C keys each
    (weight q_C) are released with probability P[n q_C + Z >= T]; checked against the
    discrete Gaussian's exact tail."""
    from thresher.pipelines.reports.summary import release_probability, users_at
    mech = {"kind": "weighted_gaussian", "sigma": 0.01, "scale": 1024, "threshold_grid": 3000}
    report = {"mechanism": mech, "bounding": {"max_keys_per_user": 4}}
    p = release_probability(report, [0, 5, 6, 7])
    q = wg.grid_weight(4)           # 512: 5 users 2560 < 3000 - 10 sd, 6 users 3072 > 3000 + 7 sd
    assert q == 512
    assert p[0] == 0 and p[1] < 1e-9 and p[2] > 1 - 1e-9 and p[3] > 1 - 1e-9
    exact = discrete_gaussian.sf(3000 - 6 * 512, 0.01 * 1024)
    assert p[2] == pytest.approx(exact, rel=1e-9)
    assert users_at(report, 0.5) == 6


def _kernel_sums(pairs, bound, seed=0):
    """Per-key (count, summed grid weight) through the pipeline's own kernel
    (transforms.selection.weighted_threshold.weighted_counts) on one shard of whole users."""
    from thresher.transforms.selection.weighted_threshold import weighted_counts
    if not pairs:
        return {}
    out = weighted_counts(_records(pairs), ["word"], bound, np.random.default_rng(seed), 1024)
    return {w: (c, s) for w, c, s in zip(out.column("word").to_pylist(),
                                         out.column("count").to_pylist(),
                                         out.column(WEIGHT_COLUMN).to_pylist())}


from hypothesis import given, settings, strategies as st  # noqa: E402

_users = st.lists(st.sets(st.integers(0, 12), min_size=1, max_size=9), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(users=_users, removed=st.integers(0, 11), extra=st.integers(0, 3))
def test_a_users_weight_vector_has_l2_norm_at_most_one_weight(users, removed, extra):
    """Add/remove-one-user neighbours through the real kernel (every user within the
    bound, so no key choice is random): the per-key (count, grid weight) sums differ
    exactly on the removed user's t keys, by (1, q_t) each, and sum q_t^2 <= S^2."""
    bound = max(len(u) for u in users) + extra
    removed %= len(users)
    pairs = [(f"u{i}", f"k{k}") for i, keys in enumerate(users) for k in sorted(keys)]
    smaller = [p for p in pairs if p[0] != f"u{removed}"]
    big, small = _kernel_sums(pairs, bound), _kernel_sums(smaller, bound)
    t = len(users[removed])
    q = wg.grid_weight(t)
    moved = {}
    for word in set(big) | set(small):
        c1, w1 = big.get(word, (0, 0))
        c0, w0 = small.get(word, (0, 0))
        if (c1, w1) != (c0, w0):
            moved[word] = (c1 - c0, w1 - w0)
    assert moved == {f"k{k}": (1, q) for k in users[removed]}
    assert t * q * q <= 1024 * 1024


def test_release_rate_at_the_pre_threshold_matches_the_accounting():
    """Monte Carlo: a user whose 4 kept keys nobody else holds gets at least one released
    by the real kernel with probability 1 - beta_4^4, beta from the exact discrete
    Gaussian CDF (the delta-carrying term of the accounting). 4e5 runs; binomial test,
    false failure probability 1e-4."""
    from scipy import stats
    from thresher.transforms.selection.weighted_threshold import weighted_threshold
    p = wg.calibrate(1.0, 1e-3, 4, count_epsilon=0.5, count_delta=5e-4)
    q = wg.grid_weight(4)
    n = 400_000
    rng = np.random.default_rng(5)
    keep, _ = weighted_threshold(np.ones(4 * n, dtype=np.int64), np.full(4 * n, q),
                                 sigma_grid=p.sigma_grid, threshold_grid=p.threshold_grid,
                                 count_sigma=p.count_sigma, rng=rng)
    hits = int(keep.reshape(n, 4).any(axis=1).sum())
    beta = float(discrete_gaussian.cdf(p.threshold_grid - q - 1, p.sigma_grid))
    expected = 1 - beta ** 4
    assert -math.expm1(4 * float(wg.log_beta_lower(p.threshold_grid, q, p.sigma_grid))) \
        >= expected * (1 - 1e-6)
    assert stats.binomtest(hits, n, expected).pvalue > 1e-4, (hits, n * expected)

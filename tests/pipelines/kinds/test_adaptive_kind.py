"""mechanism.kind: adaptive end to end: the plan's stages recomputed independently, real
CLI runs (fixed and automatic bound), the Beam transforms on the FnApiRunner and the
DirectRunner against a numpy reference of both rounds, spec errors (exit code 2, field
named), and a property test of every round's per-user weight vectors through the
pipeline's own kernels."""
import json
import math

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.direct.direct_runner import BundleBasedDirectRunner
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings, strategies as st

from thresher.accounting import adaptive as ad, discrete_gaussian, weighted_gaussian as wg
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan
from thresher.transforms.selection import adaptive_rounds as ar
from thresher.transforms.randomness import keyed_random
from thresher.transforms.bounding.user_shards import ShardByUser
from thresher.transforms.selection.weighted_threshold import WEIGHT_COLUMN, weighted_counts

from tests.pipelines.kinds.test_weighted_gaussian_kind import _data, _load, _records


def _spec(tmp_path, data, bound=8, **mech):
    return {"name": "ad", "input": {"path": data, "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "adaptive", **mech},
            "output": {"path": str(tmp_path / "out")}}


def test_plan_has_one_release_stage_and_reports_every_round_and_the_count(tmp_path):
    """The rounds and the count compose by f-DP: one budget stage "release" holds them
    all; the report's stages are recomputed from their parameters (each round's Gaussian
    part and threshold term, the count's discrete Gaussian) and composed again."""
    plan = make_plan(_load(tmp_path, _spec(tmp_path, "x.parquet", bound=16,
                                           round_fractions=[0.2, 0.8], count_fraction=0.2,
                                           count_keys_per_user=4)))
    report = plan.report()
    stages = {s["name"]: s for s in report["privacy"]["stages"]}
    assert list(stages) == ["release"]
    assert stages["release"]["epsilon"] == 1.0 and stages["release"]["delta"] == 1e-6
    mech = report["mechanism"]
    assert [r["stage"] for r in mech["rounds"]] == ["round_1", "round_2"]
    assert mech["count_stage"]["counts_per_user"] == 4
    # the noise shares: sigma_r^-2 proportional to (1 - f_c) w_r, the count's to f_c / C_c
    inv = [1 / r["sigma"] ** 2 for r in mech["rounds"]] + [4 / mech["count_sigma"] ** 2]
    assert np.allclose(np.array(inv) / sum(inv), [0.8 * 0.2, 0.8 * 0.8, 0.2], rtol=1e-9)
    for r, w in zip(mech["rounds"], (0.2, 0.8)):   # the smallest threshold for its share
        target = w * ad.THRESHOLD_DELTA_SHARE * 1e-6
        assert ad.round_leak(r["threshold_grid"], r["sigma"], 16) <= target
        assert ad.round_leak(r["threshold_grid"] - 1, r["sigma"], 16) > target
    recomputed = ad.composed_delta([(r["sigma"], r["threshold_grid"]) for r in mech["rounds"]],
                                   mech["count_sigma"], 4, 16, 1.0, 1e-6)
    assert recomputed <= 1e-6 and math.isclose(mech["delta_achieved"], recomputed, rel_tol=1e-12)
    # the f-DP composition spends less than basic composition would at this noise: the
    # rounds' and the count's delta at their basic-composition shares sum far above 1e-6
    basic = sum(wg.delta(0.8 * w, r["sigma"], r["threshold_grid"], 16) for r, w in
                zip(mech["rounds"], (0.2, 0.8))) + float(
        discrete_gaussian.composed_shift_delta(0.2, mech["count_sigma"], 4))
    assert basic > 10 * 1e-6
    assert "f-DP" in mech["accounting"] and "f-DP" in mech["composition"]


def test_cli_run_fixed_bound_releases_keys_with_noisy_counts(tmp_path, cli):
    data = _data(tmp_path)
    done = cli(_spec(tmp_path, data, bound=8))
    assert done.returncode == 0, done.stderr
    table = pq.read_table(tmp_path / "out" / "released.parquet")
    assert table.column_names == ["word", "count", "count_low", "count_high"]   # issue 27
    assert table.schema.field("count").type == pa.int64()
    words = table.column("word").to_pylist()
    assert len(words) == len(set(words)) > 0          # each key once, rounds disjoint
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    assert report["mechanism"]["kind"] == "adaptive"
    assert [s["name"] for s in report["privacy"]["stages"]] == ["release"]


def test_cli_run_auto_bound_three_rounds(tmp_path, cli):
    data = _data(tmp_path)
    spec = _spec(tmp_path, data, bound="auto", rounds=3)
    spec["bounding"]["auto"] = {"max_bound": 32}
    done = cli(spec)
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    assert report["bounding"]["chosen_by"] == "exponential_mechanism"
    assert report["bounding"]["selection"]["score"] == "weighted_gaussian"
    assert [s["name"] for s in report["privacy"]["stages"]] == [
        "choose_contribution_bound", "release"]
    assert len(report["mechanism"]["rounds"]) == 3
    assert report["released_keys"] > 0


@pytest.mark.parametrize("mech, field, words", [
    ({"rounds": 1}, "mechanism.rounds", "weighted_gaussian"),
    ({"rounds": 4}, "mechanism.rounds", ""),
    ({"round_fractions": [0.5, 0.6]}, "mechanism.round_fractions", "sum to 1"),
    ({"round_fractions": [0.2, 0.3, 0.5]}, "mechanism.round_fractions", "one entry per round"),
    ({"count_fraction": 1.5}, "mechanism.count_fraction", ""),
    ({"threshold": 3.0}, "mechanism", ""),
    # round 1 with 5e-5 of the noise budget needs sigma ~ 8.2 / sqrt(0.9 * 5e-5) = 1215 user
    # weights at epsilon 0.5, beyond the sampler's range (1024)
    ({"round_fractions": [0.00005, 0.99995]}, "mechanism.round_fractions", "round 1"),
])
def test_spec_errors_name_the_field(tmp_path, cli, mech, field, words):
    spec = _spec(tmp_path, "x.parquet", **mech)
    spec["privacy"]["epsilon"] = 0.5
    done = cli(spec, command="plan")
    assert done.returncode == 2, done.stderr
    assert field in done.stderr and words in done.stderr and "Traceback" not in done.stderr


def test_bound_above_the_planning_limit_and_the_l1_model_are_refused(tmp_path, cli):
    done = cli(_spec(tmp_path, "x.parquet", bound=4096), command="plan")
    assert done.returncode == 2 and "bounding.max_keys_per_user" in done.stderr
    spec = _spec(tmp_path, "x.parquet")
    spec["bounding"]["model"] = "l1"
    done = cli(spec, command="plan", name="l1.yaml")
    assert done.returncode == 2 and "bounding.model" in done.stderr


# ---------------------------------------------------------------------------------------
# The Beam transforms against a numpy reference of both rounds.

def _reference(users, bound, t1, t2):
    """Every user within the bound (no random choice): round 1 releases the keys whose
    summed grid weight reaches t1; round 2 the keys not in R1 whose weights re-spread over
    each user's remaining keys reach t2; counts are distinct users."""
    def weights(sets):
        w = {}
        for keys in sets:
            for k in keys:
                w[k] = w.get(k, 0) + wg.grid_weight(len(keys))
        return w
    w1 = weights(users)
    r1 = {k for k, v in w1.items() if v >= t1}
    w2 = weights([set(keys) - r1 for keys in users if set(keys) - r1])
    r2 = {k for k, v in w2.items() if v >= t2}
    counts = {}
    for keys in users:
        for k in keys:
            counts[k] = counts.get(k, 0) + 1
    return r1, r2, sorted((k, counts[k]) for k in r1 | r2)


def _fixture_users():
    """Heavy keys h0..h3 (150 users hold each), a tail t0..t9 held by light users whose
    other keys are heavy: in round 2 those users' whole weight goes to their tail key."""
    users = []
    rng = np.random.default_rng(5)
    for u in range(150):
        users.append({f"h{j}" for j in range(4)})
    for i in range(10):
        for u in range(4 + i):
            users.append({f"t{i}", f"h{int(rng.integers(0, 4))}", f"h{(i + u) % 4}"})
    return users


@pytest.mark.parametrize("runner,spill", [(FnApiRunner, False), (BundleBasedDirectRunner, False),
                                          (FnApiRunner, True)])
def test_adaptive_release_on_beam_matches_the_reference(runner, spill, tmp_path):
    users = _fixture_users()
    bound, scale = 4, 1024
    t1, t2 = 60 * scale, 6 * scale
    r1, r2, want = _reference(users, bound, t1, t2)
    assert r1 == {"h0", "h1", "h2", "h3"} and r2 and r2 < {f"t{i}" for i in range(10)}
    # had round 2 kept R1's keys, it would release them again and weigh the tail less
    assert _reference(users, bound, 10**9, t2)[1] != r2
    pairs = [(f"u{i}", k) for i, keys in enumerate(users) for k in sorted(keys)]
    params = {"rounds": [{"sigma": 1e-3, "threshold_grid": t1},
                         {"sigma": 1e-3, "threshold_grid": t2}],
              "scale": scale, "count_sigma": 1e-3, "count_stage": {"counts_per_user": bound}}

    def rows(table):
        return list(zip(table.column("word").to_pylist(), table.column("count").to_pylist()))

    with beam.Pipeline(runner=runner()) as p:
        released = (p | beam.Create([_records(pairs)])
                    | ShardByUser(3)
                    | ar.AdaptiveRelease(["word"], params, bound, 2, 3,
                                         rng_factory=keyed_random.seeded_for_tests(1),
                                         spill_dir=str(tmp_path) if spill else None))
        assert_that(released | beam.FlatMap(rows), equal_to(want))


@pytest.mark.parametrize("side_inputs", [False, True])
def test_count_stage_counts_each_user_in_at_most_counts_per_user_released_keys(side_inputs):
    """Round 1 releases the 4 head keys (round 2 nothing); with
    count_stage.counts_per_user = 1 every user holding a head key counts in exactly one
    of them (the total is the number of such users, not the number of their head keys),
    whether params and bound are plain values or side inputs (the plan's case)."""
    users = _fixture_users()
    heads = {f"h{j}" for j in range(4)}
    holders = sum(1 for keys in users if keys & heads)
    assert sum(len(keys & heads) for keys in users) > 2 * holders     # the bound matters
    bound, scale = 4, 1024
    pairs = [(f"u{i}", k) for i, keys in enumerate(users) for k in sorted(keys)]
    params = {"rounds": [{"sigma": 1e-3, "threshold_grid": 60 * scale},
                         {"sigma": 1e-3, "threshold_grid": 10**9}],
              "scale": scale, "count_sigma": 1e-3, "count_stage": {"counts_per_user": 1}}

    def total(tables):
        return sum(sum(t.column("count").to_pylist()) for t in tables)

    with beam.Pipeline(runner=FnApiRunner()) as p:
        if side_inputs:
            prm = beam.pvalue.AsSingleton(p | "P" >> beam.Create([params]))
            bnd = beam.pvalue.AsSingleton(p | "B" >> beam.Create([bound]))
        else:
            prm, bnd = params, bound
        released = (p | beam.Create([_records(pairs)]) | ShardByUser(3)
                    | ar.AdaptiveRelease(["word"], prm, bnd, 2, 3,
                                         rng_factory=keyed_random.seeded_for_tests(1)))
        assert_that(released | beam.combiners.ToList() | beam.Map(total), equal_to([holders]))


@pytest.mark.parametrize("side_inputs", [False, True])
@pytest.mark.parametrize("count_stage", [None, {}, {"counts_per_user": None},
                                         {"counts_per_user": 0}, {"counts_per_user": 1.5}])
def test_params_without_the_calibrated_counts_per_user_are_refused(side_inputs, count_stage):
    """Fail closed: the count stage never falls back to another bound (it used to take
    max_keys_per_user) when the parameters lack count_stage.counts_per_user, whether they
    are a plain dict (refused while the pipeline is built) or a side input (at run time)."""
    params = {"rounds": [{"sigma": 1e-3, "threshold_grid": 10 * 1024}] * 2,
              "scale": 1024, "count_sigma": 1e-3}
    if count_stage is not None:
        params["count_stage"] = count_stage
    with pytest.raises(ValueError, match=r"count_stage\.counts_per_user"):
        ar.counts_per_user(params)
    pairs = [(f"u{i}", "k") for i in range(20)]
    with pytest.raises(Exception, match=r"count_stage\.counts_per_user"):
        with beam.Pipeline(runner=FnApiRunner()) as p:
            prm = (beam.pvalue.AsSingleton(p | "P" >> beam.Create([params])) if side_inputs
                   else params)
            _ = (p | beam.Create([_records(pairs)]) | ShardByUser(2)
                 | ar.AdaptiveRelease(["word"], prm, 4, 2, 2,
                                      rng_factory=keyed_random.seeded_for_tests(1)))
    assert ar.counts_per_user(dict(params, count_stage={"counts_per_user": 3})) == 3


# ---------------------------------------------------------------------------------------
# Property: every round's per-user weight vector, through the pipeline's own kernels.

def _round_sums(pairs, released, bound):
    """Per-key (count, grid weight) of one round: ``rows_not_released`` then the
    weighted bound kernel (``weighted_counts``) on one shard of whole users."""
    if not pairs:
        return {}
    table = _records(pairs)
    done = ar.released_keys([pa.table({"word": sorted(released)})] if released else [],
                            ["word"])
    table = ar.rows_not_released(table, done, ["word"])
    if table.num_rows == 0:
        return {}
    out = weighted_counts(table, ["word"], bound, np.random.default_rng(0), 1024)
    return {w: (c, s) for w, c, s in zip(out.column("word").to_pylist(),
                                         out.column("count").to_pylist(),
                                         out.column(WEIGHT_COLUMN).to_pylist())}


_users = st.lists(st.sets(st.integers(0, 12), min_size=1, max_size=9), min_size=1, max_size=12)


@settings(max_examples=60, deadline=None)
@given(users=_users, removed=st.integers(0, 11), extra=st.integers(0, 3),
       released=st.sets(st.integers(0, 12), max_size=13), adversarial=st.booleans())
def test_each_rounds_user_vector_has_l2_norm_at_most_one_and_only_its_own_keys(
        users, removed, extra, released, adversarial):
    """Add/remove-one-user neighbours, for any round-1 output R1 (random, or adversarial:
    R1 = all but one of the removed user's keys, so the user's whole weight lands on one
    key in round 2): the round-2 per-key sums with and without the user differ exactly on
    the user's keys outside R1, by (1, q_t') each with t' their number, and
    t' q_t'^2 <= S^2; every other user's contribution is the same on both sides (their
    round-2 input depends on their own keys and R1 only)."""
    bound = max(len(u) for u in users) + extra
    removed %= len(users)
    mine = users[removed]
    if adversarial:
        released = set(sorted(mine)[1:])
    pairs = [(f"u{i}", f"k{k}") for i, keys in enumerate(users) for k in sorted(keys)]
    smaller = [p for p in pairs if p[0] != f"u{removed}"]
    r1 = {f"k{k}" for k in released}
    for r in (set(), r1):                     # round 1 (nothing released yet), round 2
        big, small = _round_sums(pairs, r, bound), _round_sums(smaller, r, bound)
        left = [k for k in mine if f"k{k}" not in r]
        moved = {}
        for word in set(big) | set(small):
            c1, w1 = big.get(word, (0, 0))
            c0, w0 = small.get(word, (0, 0))
            if (c1, w1) != (c0, w0):
                moved[word] = (c1 - c0, w1 - w0)
        if not left:
            assert moved == {}
            continue
        q = wg.grid_weight(len(left))
        assert moved == {f"k{k}": (1, q) for k in left}
        assert len(left) * q * q <= 1024 * 1024
        assert not (set(big) & r)             # released keys carry no weight any more


def test_released_keys_match_user_rows_by_value_whatever_the_string_type():
    """Round 2 and the count stage match released keys (key columns from SumCountsPerKey)
    to user rows by the key values themselves, whatever the string type."""
    records = _records([("u1", "alpha"), ("u2", "beta"), ("u3", "gamma")])
    released = pa.table({"word": pa.array(["beta", "zeta"], pa.large_string())})
    done = ar.released_keys([released, released.slice(0, 1)], ["word"])
    assert done.num_rows == 2
    assert ar.rows_released(records, done, ["word"]).column("word").to_pylist() == ["beta"]
    assert ar.rows_not_released(records, done, ["word"]).column("word").to_pylist() == [
        "alpha", "gamma"]
    assert ar.rows_released(records, None, ["word"]).num_rows == 0
    assert ar.rows_not_released(records, None, ["word"]).num_rows == 3


def test_filter_prepares_the_released_keys_once_per_side_input_value():
    """_FilterFn concatenates and de-duplicates the released keys once per side-input
    value (the list object the runner passes), not once per user shard."""
    fn = ar._FilterFn(["word"], keep_released=True)
    fn.setup()
    released = [pa.table({"word": ["beta"]}), pa.table({"word": ["gamma"]})]
    first = _records([("u1", "alpha"), ("u2", "beta")])
    second = _records([("u3", "gamma"), ("u4", "delta")])
    assert [t.column("word").to_pylist() for t in fn.process(first, released)] == [["beta"]]
    prepared = fn._memo[1]
    assert [t.column("word").to_pylist() for t in fn.process(second, released)] == [["gamma"]]
    assert fn._memo[1] is prepared                       # not rebuilt for the next shard
    again = list(released)                               # a new side-input value
    list(fn.process(second, again))
    assert fn._memo[1] is not prepared and fn._memo[0] is again


def test_auto_bound_spends_five_percent_of_epsilon_by_default(tmp_path):
    """issue 28: adaptive's automatic bound takes 5% of epsilon (AUTO_EPSILON_FRACTION),
    the other kinds 10%; an explicit bounding.auto.epsilon still wins."""
    import yaml
    from thresher.pipelines.specs import spec as spec_mod
    base = {"name": "a", "input": {"path": "x.parquet", "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": 2.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": "auto"},
            "mechanism": {"kind": "adaptive"}, "output": {"path": str(tmp_path / "out")}}
    path = tmp_path / "s.yaml"
    path.write_text(yaml.safe_dump(base))
    assert spec_mod.load(str(path)).bounding.auto.epsilon == pytest.approx(0.1)
    base["mechanism"] = {"kind": "gaussian"}
    path.write_text(yaml.safe_dump(base))
    assert spec_mod.load(str(path)).bounding.auto.epsilon == pytest.approx(0.2)
    base["mechanism"] = {"kind": "adaptive"}
    base["bounding"]["auto"] = {"epsilon": 0.3}
    path.write_text(yaml.safe_dump(base))
    assert spec_mod.load(str(path)).bounding.auto.epsilon == pytest.approx(0.3)


def test_auto_bound_default_candidates_start_at_128(tmp_path):
    """issue 28: adaptive's default candidates are the sqrt(2) grid from AUTO_MIN_BOUND
    (128) to max_bound; below that floor, and for other kinds, the whole grid; explicit
    candidates are used as given."""
    import yaml
    from thresher.pipelines.specs import spec as spec_mod
    base = {"name": "a", "input": {"path": "x.parquet", "user": "user", "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": "auto"},
            "mechanism": {"kind": "adaptive"}, "output": {"path": str(tmp_path / "out")}}
    path = tmp_path / "s.yaml"

    def candidates(bounding, kind="adaptive"):
        path.write_text(yaml.safe_dump({**base, "bounding": bounding, "mechanism": {"kind": kind}}))
        return spec_mod.load(str(path)).bounding.auto.candidates

    assert candidates({"max_keys_per_user": "auto"}) == (128, 181, 256, 362, 512, 724, 1024)
    assert candidates({"max_keys_per_user": "auto", "auto": {"max_bound": 64}})[0] == 1
    assert candidates({"max_keys_per_user": "auto", "auto": {"candidates": [4, 16]}}) == (4, 16)
    assert candidates({"max_keys_per_user": "auto"}, kind="weighted_gaussian")[0] == 1

"""weighted_gaussian's defaults (docs/partition_selection.md section 5): the automatic
bound searches up to 1024, the count column spends count_fraction 0.1, and a user counts
in at most count_keys_per_user (128) of its kept keys -- accounted at min(C, that cap),
checked against direct convolutions of the discrete Gaussian, through the pipeline's own
kernel (hypothesis neighbours), on the FnApiRunner and in a real CLI run."""
import json
import math

import apache_beam as beam
import numpy as np
import pyarrow.parquet as pq
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that, equal_to
from hypothesis import given, settings, strategies as st

from thresher.accounting import discrete_gaussian, weighted_gaussian as wg
from thresher.pipelines.kinds import weighted_gaussian as kind
from thresher.pipelines.planning.plan import make_plan
from tests.pipelines.kinds.test_weighted_gaussian_kind import _data, _load, _records, _spec
from thresher.transforms.randomness import keyed_random
from thresher.transforms.plumbing.aggregate import SumCountsPerKey
from thresher.transforms.bounding.user_shards import ShardByUser
from thresher.transforms.selection.weighted_threshold import WEIGHT_COLUMN, WeightedPerUserBound, weighted_counts


def _sum_pmf(a, s):
    """pmf of the sum of ``a`` independent N_Z(0, s^2) draws, built here from the
    definition (weights exp(-x^2 / 2 s^2) on |x| <= 12 s + 2, normalised; the a-fold
    convolution by FFT), independently of ``accounting.discrete_gaussian``."""
    half = int(np.ceil(12 * s)) + 2
    x = np.arange(-half, half + 1, dtype=np.float64)
    one = np.exp(-x * x / (2.0 * s * s))
    one /= one.sum()
    n = a * 2 * half + 1
    size = 1 << int(np.ceil(np.log2(n)))
    total = np.fft.irfft(np.fft.rfft(one, size) ** a, size)[:n]
    return -a * half, np.clip(total, 0.0, None)


def _convolved_delta(eps, a, s):
    """delta of a counts each shifted by 1 under N_Z(0, s^2), from its definition: the
    exact pmf of the sum X of a draws (direct convolutions), the privacy loss
    L = (2X + a) / (2 s^2) and sum_u P[X = u] (1 - e^(eps - L(u)))_+."""
    offset, p = _sum_pmf(a, s)
    u = offset + np.arange(p.size, dtype=np.float64)
    loss = (2.0 * u + a) / (2.0 * s * s)
    mask = loss > eps
    return float((p[mask] * -np.expm1(eps - loss[mask])).sum())


def _auto_spec(tmp_path, kind_name, **auto):
    spec = _spec(tmp_path, "x.parquet", bound="auto")
    spec["mechanism"] = {"kind": kind_name}
    if auto:
        spec["bounding"]["auto"] = auto
    return _load(tmp_path, spec)


def test_auto_grid_reaches_1024_for_weighted_gaussian_only(tmp_path):
    wg_spec = _auto_spec(tmp_path, "weighted_gaussian")
    assert wg_spec.bounding.auto.max_bound == 1024 == kind.AUTO_MAX_BOUND
    assert wg_spec.bounding.auto.candidates[-4:] == (362, 512, 724, 1024)
    assert _auto_spec(tmp_path, "gaussian").bounding.auto.max_bound == 128
    # an explicit max_bound still wins
    assert _auto_spec(tmp_path, "weighted_gaussian", max_bound=64).bounding.auto.candidates[-1] == 64


def test_default_auto_plan_calibrates_every_candidate_once_with_logarithmic_searches(
        tmp_path, monkeypatch):
    """The plan at the defaults calibrates each of the 20 candidates up to 1024 exactly
    once, and each calibration's work is that of its searches, counted (not timed): the
    unit is one row of ``wg.shift_delta`` (one shifted-row divergence; ``gaussian_part``
    evaluates C rows, ``delta`` at most C (C + 1)). The sigma search
    (``smallest_real`` from 1e-3, rel_tol 1e-7) makes at most log2(sigma / 1e-3) + 1
    doubling and log2(1e7) + 1 bisection steps, the threshold search (``smallest_integer``)
    at most 2 log2(T) + 2 steps (T the grid threshold) and the calibration one more delta:
    a linear search, a second calibration of a candidate or a delta costing more than
    O(C^2) rows exceeds these (before them, pipelines.common.limits evaluates one gaussian_part
    at the largest candidate). Measured: 29 gaussian_part and 2 delta evaluations per
    candidate, 4.3e6 rows in all; the plan time is a benchmark's business."""
    spec = _auto_spec(tmp_path, "weighted_gaussian")
    calibrated, rows = [], {None: 0}     # None: before the calibrations (pipelines.common.limits)
    real_calibrate, real_shift_delta = wg.calibrate, wg.shift_delta

    def counting_calibrate(epsilon, delta, bound, **kw):
        calibrated.append(bound)
        rows[bound] = 0
        return real_calibrate(epsilon, delta, bound, **kw)

    def counting_shift_delta(epsilon, count, shift, sigma_grid):
        rows[calibrated[-1] if calibrated else None] += np.broadcast(np.asarray(epsilon), np.asarray(count),
                                             np.asarray(shift)).size
        return real_shift_delta(epsilon, count, shift, sigma_grid)

    monkeypatch.setattr(wg, "calibrate", counting_calibrate)
    monkeypatch.setattr(wg, "shift_delta", counting_shift_delta)
    plan = make_plan(spec)
    assert sorted(plan.params_by_bound) == list(spec.bounding.auto.candidates)
    assert max(plan.params_by_bound) == 1024
    assert sorted(calibrated) == list(spec.bounding.auto.candidates)      # each once
    assert rows[None] <= 1024          # the planning limit: one gaussian_part at C = 1024
    for c, params in plan.params_by_bound.items():
        sigma_steps = math.log2(params["sigma"] / 1e-3) + 1 + math.log2(1e7) + 1 + 2
        delta_steps = 2 * math.log2(params["threshold_grid"]) + 2 + 1
        budget = sigma_steps * c + delta_steps * c * (c + 1)
        assert 0 < rows[c] <= budget, (c, rows[c], budget)


def test_defaults_are_count_fraction_0_1_and_128_counted_keys(tmp_path):
    plan = make_plan(_load(tmp_path, _spec(tmp_path, "x.parquet", bound=256)))
    report = plan.report()
    mech = report["mechanism"]
    assert mech["count_fraction"] == 0.1 and mech["count_keys_per_user"] == 128
    stages = {s["name"]: s for s in report["privacy"]["stages"]}
    assert math.isclose(stages["count"]["epsilon"], 0.1, rel_tol=1e-12)
    assert math.isclose(stages["count"]["delta"], 1e-7, rel_tol=1e-12)
    assert mech["count_stage"]["counts_per_user"] == 128


@pytest.mark.parametrize("bound, cap, counted", [(64, 4, 4), (3, 4, 3), (64, None, 64)])
def test_count_stage_is_accounted_at_min_of_bound_and_cap(bound, cap, counted):
    """count_sigma meets the count budget for `counted` = min(C, cap) counts shifted by
    one (direct convolutions where small), and is the smallest sigma that does: at
    sigma * 0.99 the same exact delta exceeds the budget -- so it is neither accounted at
    C (too large a sigma) nor below min(C, cap) (budget not met)."""
    eps_c, delta_c = 0.5, 1e-3
    p = wg.calibrate(1.0, 1e-6, bound, count_epsilon=eps_c, count_delta=delta_c,
                     count_keys_per_user=cap)
    assert p.count_keys_per_user == counted
    assert p.count_delta <= delta_c
    assert p.count_delta == pytest.approx(float(discrete_gaussian.composed_shift_delta(
        eps_c, p.count_sigma, counted)))
    if counted <= 4:
        assert _convolved_delta(eps_c, counted, p.count_sigma) <= delta_c
        assert _convolved_delta(eps_c, counted, p.count_sigma * 0.99) > delta_c
    else:
        assert discrete_gaussian.composed_shift_delta(eps_c, p.count_sigma * 0.99, counted) \
            > delta_c
    if cap is not None and cap < bound:
        full = wg.calibrate(1.0, 1e-6, bound, count_epsilon=eps_c, count_delta=delta_c)
        assert p.count_sigma < full.count_sigma * math.sqrt(cap / bound) * 1.3


def _kernel_sums(pairs, bound, cap, seed=0):
    """Per-key (count, grid weight) through the kernel with the production randomness:
    keyed per-user streams (transforms.randomness.keyed_random), so a user's choice of counted keys
    depends on its own stream only, whoever else is in the shard."""
    if not pairs:
        return {}
    rng = keyed_random.StageSource(keyed_random.KeyedSource(b"h15w test secret %d" % seed),
                                   "BoundL0Weighted")
    out = weighted_counts(_records(pairs), ["word"], bound, rng, 1024, count_keys_per_user=cap)
    return {w: (c, s) for w, c, s in zip(out.column("word").to_pylist(),
                                         out.column("count").to_pylist(),
                                         out.column(WEIGHT_COLUMN).to_pylist())}


_users = st.lists(st.sets(st.integers(0, 12), min_size=1, max_size=9), min_size=1, max_size=12)


@settings(max_examples=40, deadline=None)
@given(users=_users, removed=st.integers(0, 11), cap=st.integers(1, 10), seed=st.integers(0, 9))
def test_a_user_moves_at_most_cap_counts_by_one_and_all_its_weights(users, removed, cap, seed):
    """Add/remove-one-user neighbours through the real kernel, every user within the bound
    C (so the kept sets are fixed) and a count cap drawn below and above it: the weights
    differ by q_t on the removed user's t keys; the counts by 1 on exactly min(t, cap) of
    those keys (the count stage's sensitivity) and nowhere else."""
    bound = max(len(u) for u in users)
    removed %= len(users)
    pairs = [(f"u{i}", f"k{k}") for i, keys in enumerate(users) for k in sorted(keys)]
    smaller = [p for p in pairs if p[0] != f"u{removed}"]
    big, small = _kernel_sums(pairs, bound, cap, seed), _kernel_sums(smaller, bound, cap, seed)
    t = len(users[removed])
    q = wg.grid_weight(t)
    dw, dc = {}, {}
    for word in set(big) | set(small):
        c1, w1 = big.get(word, (0, 0))
        c0, w0 = small.get(word, (0, 0))
        if w1 != w0:
            dw[word] = w1 - w0
        if c1 != c0:
            dc[word] = c1 - c0
    assert dw == {f"k{k}": q for k in users[removed]}
    assert set(dc) <= set(dw) and set(dc.values()) <= {1}
    assert len(dc) == min(t, cap)


def test_counted_keys_are_a_uniform_choice_among_the_kept_keys():
    """One user with 6 keys, bound 6, cap 2: each key is counted with probability 1/3.
    3000 kernel runs (3000 release secrets); chi-square against uniform (the pairs of a
    run are dependent, so a loose threshold: false failure well below 1e-4)."""
    from scipy import stats
    pairs = [("u", f"k{k}") for k in range(6)]
    hits = np.zeros(6)
    for seed in range(3000):
        sums = _kernel_sums(pairs, 6, 2, seed)
        for k in range(6):
            hits[k] += sums[f"k{k}"][0]
    assert hits.sum() == 6000
    assert stats.chisquare(hits).pvalue > 1e-4, hits


def test_beam_bound_with_a_count_cap_matches_the_numpy_reference():
    """FnApiRunner: the per-key weights are those of every kept key; the total count is
    sum over users of min(t, cap); no key's count exceeds its users."""
    rng = np.random.default_rng(4)
    pairs, want_w, users_of = [], {}, {}
    caps_total = 0
    for u in range(150):
        t = int(rng.integers(1, 7))
        caps_total += min(t, 2)
        for k in rng.choice(20, size=t, replace=False):
            pairs.append((f"u{u}", f"k{k}"))
            want_w[f"k{k}"] = want_w.get(f"k{k}", 0) + int(wg.grid_weight(t))
            users_of[f"k{k}"] = users_of.get(f"k{k}", 0) + 1

    def rows(table):
        return list(zip(table.column("word").to_pylist(), table.column("count").to_pylist(),
                        table.column(WEIGHT_COLUMN).to_pylist()))

    def check(got):
        assert sorted((w, s) for w, _, s in got) == sorted(want_w.items())
        assert sum(c for _, c, _ in got) == caps_total
        assert all(0 <= c <= users_of[w] for w, c, _ in got)

    with beam.Pipeline(runner=FnApiRunner()) as p:
        sums = (p | beam.Create([_records(pairs)]) | ShardByUser(3)
                | WeightedPerUserBound(["word"], 6, rng_factory=keyed_random.seeded_for_tests(1),
                                       count_keys_per_user=2)
                | SumCountsPerKey(["word"], 2))
        assert_that(sums | beam.FlatMap(rows) | beam.combiners.ToList(),
                    lambda got: check(got[0]))
        assert_that(sums | "Users" >> beam.Map(lambda t: t.num_rows) | beam.CombineGlobally(sum),
                    equal_to([len(want_w)]), label="Keys")


def test_cli_run_with_a_count_cap(tmp_path, cli):
    """A real run with C = 16 and count_keys_per_user 3: the report's count stage is
    accounted for 3 counts per user, and the released counts are near the capped truth
    (each user counts in min(t, 3) of its keys), far below the uncapped counts."""
    data = _data(tmp_path)
    done = cli(_spec(tmp_path, data, bound=16, count_keys_per_user=3))
    assert done.returncode == 0, done.stderr
    report = json.loads((tmp_path / "out" / "release_report.json").read_text())
    mech = report["mechanism"]
    stages = {s["name"]: s for s in report["privacy"]["stages"]}
    assert mech["count_stage"]["counts_per_user"] == 3
    assert discrete_gaussian.composed_shift_delta(stages["count"]["epsilon"], mech["count_sigma"],
                                                  3) <= stages["count"]["delta"]
    table = pq.read_table(tmp_path / "out" / "released.parquet")
    released = sum(table.column("count").to_pylist())
    rows = pq.read_table(data)
    users = rows.group_by("user").aggregate([("word", "count")]).column("word_count").to_numpy()
    # the capped total over all keys bounds the released keys' counts (plus noise:
    # 60 keys x 6 count_sigma at most)
    assert released <= np.minimum(users, 3).sum() + 60 * 6 * mech["count_sigma"]
    assert released < 0.5 * np.minimum(users, 16).sum()


def test_count_cap_spec_errors_name_the_field(tmp_path, cli):
    done = cli(_spec(tmp_path, "x.parquet", count_keys_per_user=0), command="plan")
    assert done.returncode == 2 and "mechanism.count_keys_per_user" in done.stderr
    done = cli(_spec(tmp_path, "x.parquet", count_keys_per_user=2.5), command="plan")
    assert done.returncode == 2 and "mechanism.count_keys_per_user" in done.stderr

"""The seam "summation order" (issue 25, F2): a private choice's score is summed over user
shards and key shards in whatever order and grouping a runner delivers them; the choice
must not depend on it.

Checked here without a large input: the same users split into different user shards (1, 3
and 7 shards, in two orders) and the partials of each key shard in different orders give
bit-identical score sums (the contribution bound, ``clip: auto``'s quantile statistic, the
public-domain Gaussian rule; each of these failed on the float sums of 364e7c4); and the
proven bounds of the rounding that makes the sums exact (``accounting.exact_scores``; docs/contribution_bound.md, "Exact
scores"). The end-to-end reproduction (1e6 rows, in-process vs two worker processes) is
``tests/pipelines/running/test_summation_order.py`` (slow).
"""
import math
from fractions import Fraction

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner
from apache_beam.testing.util import assert_that
from hypothesis import given, settings
from hypothesis import strategies as st

from thresher.accounting import contribution_bound as cb
from thresher.accounting import exact_scores
from tests.accounting.score_fixtures import CANDIDATES, MAX_BOUND, score_params
from thresher.transforms.bounding import choose_contribution_bound as ccb


def _users(seed=11, n_users=900, rows=12_000):
    """One table of records (users with odd record counts, so C / w is rarely dyadic and
    float partial sums carry rounding), its user ids and key ids."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, n_users, rows)
    keys = np.minimum(rng.zipf(1.3, rows), 400)
    table = pa.table({"__user": pa.array([f"user-{u}" for u in users]),
                      "word": pa.array([f"w{k}" for k in keys])})
    return table, users, keys


def _split(table, users, n_shards, reverse=False):
    """The same users in ``n_shards`` user shards (every user in one shard)."""
    shard = (users * 2654435761) % n_shards
    tables = [table.filter(pa.array(shard == s)) for s in range(n_shards)]
    tables = [t for t in tables if t.num_rows]
    return tables[::-1] if reverse else tables


def _plain(sums):
    """The stage's output as nested lists (works for any array-like of two rows)."""
    return [[v for v in row] for row in sums]


def _scores():
    return [
        cb.make_score("laplace_l1", (1, 2, 3, 4, 6, 8, 11, 16), 16,
                      {"epsilon": 1.0, "delta": 1e-5}),
        cb.make_score("gaussian", (1, 2, 3, 4, 6, 8, 11, 16), 16,
                      {"thresholds": [5.0, 7.0, 8.0, 9.5, 12.0, 14.0, 18.0, 24.0],
                       "sigmas": [1.3, 1.7, 2.1, 2.5, 3.1, 3.6, 4.2, 5.1],
                       "objective": "keys"}),
        cb.make_score("sample_and_threshold", (1, 2, 3, 4, 6, 8, 11, 16), 16,
                      {"thresholds": [3, 3, 4, 4, 5, 6, 7, 9],
                       "sampling_rates": [0.9, 0.7, 0.6, 0.5, 0.4, 0.3, 0.25, 0.2]}),
    ]


@pytest.mark.parametrize("score", _scores(), ids=lambda s: f"{s.kind}-{s.objective}")
def test_score_sums_are_bit_identical_for_any_user_shard_split_and_order(score):
    """Different user-shard splits make different per-shard partials of every key's h_j
    and different global sums; the stage's result must not change in any bit. (With the
    float sums of the old stage the splits below gave sums differing in the last bits.)"""
    table, users, _ = _users()
    model = cb.SCORE_MODELS[score.kind]
    if model == "l1":
        assert score.kind == "laplace_l1"
    layouts = {"one": _split(table, users, 1), "three": _split(table, users, 3),
               "seven": _split(table, users, 7), "seven_reversed": _split(table, users, 7, True)}
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        outputs = [(pipeline | f"Create{name}" >> beam.Create(tables)
                    | f"Sums{name}" >> ccb.ContributionBoundSums(["word"], score,
                                                                  num_key_shards=5)
                    | f"Name{name}" >> beam.Map(lambda v, name=name: (name, _plain(v))))
                   for name, tables in layouts.items()]

        def check(results):
            assert sorted(n for n, _ in results) == sorted(layouts)
            first = results[0][1]
            for name, got in results:
                assert got == first, name

        assert_that(outputs | beam.Flatten(), check)


def test_score_sums_are_bit_identical_for_any_number_of_key_shards():
    """The release sets the key shards from its user shards (pipelines/running/release.py,
    _key_shards: docs/scale.md); the sums, so the scores and the chosen bound, must not
    change in any bit with that number (a key's partials meet in one shard whatever it is)."""
    table, users, _ = _users(seed=14)
    score = _scores()[0]
    tables = _split(table, users, 3)
    shard_counts = (1, 5, 16, 64)
    with beam.Pipeline(runner=FnApiRunner()) as pipeline:
        outputs = [(pipeline | f"Create{n}" >> beam.Create(tables)
                    | f"Sums{n}" >> ccb.ContributionBoundSums(["word"], score, num_key_shards=n)
                    | f"Name{n}" >> beam.Map(lambda v, n=n: (n, _plain(v))))
                   for n in shard_counts]

        def check(results):
            assert sorted(n for n, _ in results) == sorted(shard_counts)
            assert len({repr(got) for _, got in results}) == 1, results

        assert_that(outputs | beam.Flatten(), check)


def test_key_shard_costs_do_not_depend_on_the_order_of_the_partials():
    """shard_key_costs adds a key's partials from several user shards: any order of those
    partials (a GroupByKey delivers them in no fixed order) gives the same result."""
    table, users, _ = _users(seed=12)
    score = _scores()[1]
    partials = []
    for t in _split(table, users, 6):
        partials.extend(p for s, p in ccb.table_statistics(t, ["word"], score,
                                                           num_key_shards=1)[1])
    assert len(partials) == 6
    want = ccb.shard_key_costs(partials, ["word"], score)
    rng = np.random.default_rng(0)
    for _ in range(5):
        order = rng.permutation(len(partials))
        got = ccb.shard_key_costs([partials[i] for i in order], ["word"], score)
        assert [v for v in got] == [v for v in want]


def test_exact_integer_sums_equal_the_one_process_reference_and_draw_the_same():
    """Summed per shard, per key shard and across shards in any order, the integers are
    those of ``exact_score_sums`` (one process, np.add.at in Python ints)."""
    table, users, keys = _users(seed=13, rows=4000)
    score = _scores()[0]
    want = cb.exact_score_sums(*cb.pairs_from_records(users, keys), score)
    combiner = ccb.SumIntegers(2 * len(score.candidates))
    pieces, by_shard = [], {}
    for t in _split(table, users, 4):
        dropped, partials = ccb.table_statistics(t, ["word"], score, num_key_shards=3)
        pieces.append(tuple(int(x) for x in dropped) + (0,) * len(score.candidates))
        for s, p in partials:
            by_shard.setdefault(s, []).append(p)
    for parts in by_shard.values():
        pieces.append((0,) * len(score.candidates) + ccb.shard_key_costs(parts, ["word"], score))
    totals = []
    for order in (range(len(pieces)), reversed(range(len(pieces)))):
        acc = combiner.create_accumulator()
        for i in order:
            acc = combiner.add_input(acc, pieces[i])
        totals.append(acc)
    k = len(score.candidates)
    assert totals[0] == totals[1]
    assert (totals[0][:k], totals[0][k:]) == want
    # the draw takes the exact Fractions as they are: the same seed, the same C
    values = score.exact_values(want[0], want[1])
    assert all(isinstance(v, Fraction) for v in values)


def test_expected_count_units_are_the_exact_floor():
    """floor(2^B N min(1, C / w)) and floor(2^B min(x, sqrt x)) computed in integers equal
    the exact rational floor (Fractions), including N C / w far from a float's reach."""
    rng = np.random.default_rng(5)
    w = np.concatenate([rng.integers(1, 300, 400), [1, 2, 3, 2**39 - 1, 10**11]])
    n = np.minimum(rng.integers(1, 50, len(w)), w)
    for c in (1, 2, 3, 7, 16, 128, 1000):
        got = exact_scores.expected_count_units(n, w, c)
        want = [math.floor(Fraction(int(ni) * min(c, int(wi)), int(wi)) * 2**20)
                for ni, wi in zip(n, w)]
        assert got.tolist() == want
        got_w = exact_scores.expected_count_units(None, w, c, user_weighted=True)
        want_w = []
        for wi in w:
            x = Fraction(c, int(wi))
            want_w.append(math.floor(x * 2**20) if x <= 1 else math.isqrt(math.floor(x * 2**40)))
        assert got_w.tolist() == want_w
    with pytest.raises(ValueError, match="2\\^40"):
        exact_scores.expected_count_units(None, [2**41], 4)


def test_exact_sums_and_bincounts_are_exact_beyond_float_range():
    values = np.array([2**61 + 1, 2**61 + 3, 5, 2**53 + 1], dtype=np.int64)
    assert exact_scores.exact_sum(values) == sum(int(v) for v in values)
    big = np.full(4, 2**52 + 1, dtype=np.int64)
    np.testing.assert_array_equal(exact_scores.exact_bincount(np.array([0, 1, 1, 0]), big, 2),
                                  [2**53 + 2, 2**53 + 2])


_datasets = st.lists(
    st.dictionaries(st.integers(0, 12), st.integers(1, 30), min_size=1, max_size=8),
    min_size=1, max_size=12)


def _pairs(dataset):
    users, keys, counts = [], [], []
    for u, hist in enumerate(dataset):
        for key, count in hist.items():
            users.append(u)
            keys.append(key)
            counts.append(count)
    return np.array(users), np.array(keys), np.array(counts)


@pytest.mark.parametrize("objective", ["l1", "keys"])
@pytest.mark.parametrize("kind", sorted(cb.SCORE_MODELS))
@settings(max_examples=30, deadline=None)
@given(dataset=_datasets, removed=st.integers(0, 11))
def test_rounded_scores_move_within_the_charged_sensitivity(kind, objective, dataset, removed):
    """The exact (rounded) scores the pipeline draws from: removing a user moves every
    candidate's V by an amount in [-eta, Delta + eta] (l1 objective; [-Delta - eta, eta]
    for the key-count objective, whose V = -U falls as users are added; exact Fractions,
    no tolerance), and
    the draw's sensitivity is Delta (rounded up) + 2 eta (the monotone EM lemma of
    accounting/exact_scores.py)."""
    params = score_params(kind, len(dataset))
    params["objective"] = objective
    if objective == "keys":
        params.pop("dropped_weight", None)
    score = cb.make_score(kind, CANDIDATES, MAX_BOUND, params)
    removed %= len(dataset)
    smaller = dataset[:removed] + dataset[removed + 1:]
    before = score.exact_values(*cb.exact_score_sums(*_pairs(dataset), score))
    after = score.exact_values(*cb.exact_score_sums(*_pairs(smaller), score)) if smaller else \
        score.exact_values((0,) * len(CANDIDATES), (0,) * len(CANDIDATES))
    eta = exact_scores.rounding_allowance(max(CANDIDATES), score.cost_bits, score.cost_error)
    delta = Fraction(score.sensitivity) * (1 + Fraction(1, 2**50))
    for b, a in zip(before, after):
        if objective == "keys":   # V = -U: a user can only lower it
            assert -delta - eta <= b - a <= eta
        else:
            assert -eta <= b - a <= delta + eta
    assert score.selection_sensitivity == delta + 2 * eta
    # the allowance is small: under 1e-4 of Delta for these grids (1e-3 for
    # sample-and-threshold, whose cost bound covers h up to 2^33 at p = 0.02)
    limit = 1_000 if kind == "sample_and_threshold" else 10_000
    assert eta < Fraction(score.sensitivity) / limit


def test_reported_sensitivity_is_the_one_drawn_with_computed_by_hand(tmp_path):
    """The release report's ``sensitivity_drawn_with`` is Delta' = Delta (1 + 2^-50) + 2 eta,
    eta = 2^20 C_max (2^-K + 2 e), here recomputed by hand for the quickstart's default
    key-count score (per-key cost <= 1, so K = 59 and e = 2^-44), rounded up to a float."""
    import os
    import yaml
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.pipelines.planning.plan import make_plan
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "configs", "examples", "quickstart.yaml")) as handle:
        doc = yaml.safe_load(handle)
    doc["input"]["path"] = os.path.join(root, doc["input"]["path"])
    doc["output"]["path"] = str(tmp_path / "out")
    doc["bounding"]["max_keys_per_user"] = "auto"
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(doc))
    plan = make_plan(spec_mod.load(str(path)))
    score = plan.bound_score()
    assert score.objective == "keys" and score.cost_bits == 59
    eta = Fraction(2**20 * 128) * (Fraction(1, 2**59) + 2 * Fraction(1, 2**44))
    want = Fraction(score.sensitivity) * (1 + Fraction(1, 2**50)) + 2 * eta
    assert score.selection_sensitivity == want
    reported = plan.report()["bounding"]["selection"]["sensitivity_drawn_with"]
    assert Fraction(reported) >= want > Fraction(math.nextafter(reported, 0.0))


def test_clip_statistic_is_the_same_for_any_order_of_the_user_shards():
    """``clip: auto``'s statistic F(b) weighs each (user, key) by 1/k_u; summed over user
    shards in two orders (and over another split), it must be the same vector and give
    the same scores. (With float weights summed across shards the orders differed in the
    last bits.)"""
    from thresher.accounting import aggregates as acc
    from thresher.transforms.values.choose_clip import shard_statistic
    from thresher.transforms.randomness.hashing import hash_columns
    rng = np.random.default_rng(21)
    rows = 20_000
    users = rng.integers(0, 3_000, rows)
    words = pa.array([f"w{k}" for k in np.minimum(rng.zipf(1.4, rows), 300)])
    keyed = pa.table({"word": words})
    table = pa.table({"__user": pa.array(users.astype(np.uint64)),
                      "__key": pa.array(hash_columns(keyed, ["word"])),
                      "word": words, "amount": pa.array(rng.lognormal(1.0, 1.5, rows))})
    candidates = acc.clip_candidates(-4, 12)
    auto = [(0, "amount")]

    def total(tables):
        out = None
        for t in tables:
            s = shard_statistic(t, ["word"], auto, candidates)
            out = list(s) if out is None else [a + b for a, b in zip(out, s)]
        return out

    forward = total(_split(table, users, 9))
    backward = total(_split(table, users, 9, reverse=True))
    other = total(_split(table, users, 4))
    assert forward == backward == other
    assert acc.quantile_scores(forward, 0.99) == acc.quantile_scores(other, 0.99)


def test_public_domain_gaussian_statistic_is_the_same_for_any_order_of_the_user_shards():
    """Thm 4.3's S(C) (``input.public_keys`` with the gaussian rule) sums min(sqrt k_i,
    sqrt s) over users: per-shard vectors added in any order give one statistic. (Float
    square roots summed across shards differed in the last bits.)"""
    from thresher.accounting import known_domain
    rng = np.random.default_rng(22)
    weights = rng.integers(1, 200, 5_000)
    cands = (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64)
    params = {c: {"sigma": 3.0 * math.sqrt(c)} for c in cands}
    rule = known_domain.domain_bound_rule("gaussian", cands, 100, params_by_bound=params,
                                          sparsity=64)
    shards = [weights[i::7] for i in range(7)]

    def total(parts):
        out = None
        for part in parts:
            s = rule.statistic(part)
            out = list(s) if out is None else [a + b for a, b in zip(out, s)]
        return out

    assert total(shards) == total(shards[::-1]) == total([weights[i::3] for i in range(3)])


def test_key_count_units_in_place_are_the_composed_formula_bit_for_bit():
    """``BoundScore.key_cost_units`` of the key-count objective (one buffer, in place;
    issue 43) against the composition it replaced, floor_units(max(key_cost(2^-B units),
    0), K), on counts from 0 to 2^33 contributions (fixed seed), the real benchmark's
    calibration included (sigmas and thresholds of a 14-candidate automatic bound)."""
    rng = np.random.default_rng(43)
    scores = [_scores()[1], cb.make_score(
        "gaussian", (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128), 128,
        {"thresholds": [34, 48, 59, 68, 84, 97, 114, 139, 168, 199, 238, 286, 343, 410],
         "sigmas": [5.62, 7.97, 9.76, 11.27, 13.81, 15.94, 18.69, 22.55, 27.03, 31.89,
                    37.81, 45.09, 53.77, 63.77], "objective": "keys"})]
    for score in scores:
        k = len(score.candidates)
        units = np.concatenate([
            rng.integers(0, 1 << 40, size=(3000, k)),
            rng.integers(0, 400, size=(3000, k)) << exact_scores.COUNT_BITS,
            rng.integers(0, exact_scores.MAX_COUNT_UNITS, size=(500, k)),
            np.zeros((3, k), dtype=np.int64)]).astype(np.int64)
        h = np.ldexp(units.astype(np.float64), -exact_scores.COUNT_BITS)
        old = exact_scores.floor_units(np.maximum(score.key_cost(h), 0.0), score.cost_bits)
        new = score.key_cost_units(units)
        assert new.dtype == np.int64 and np.array_equal(new, old)


def test_power_of_two_scaling_is_ldexp_bit_for_bit():
    """``exact_scores.times_power_of_two`` (one multiply; issue 43) against ``np.ldexp``
    on every kind of binary64 (fixed seed): random bit patterns over the whole exponent
    range, subnormals, +-0, +-inf, the largest finite values, and integer count units,
    at the exponents the scores use (-20, 60) and others in [-1000, 1000]: the same bits
    (NaN compared as NaN)."""
    rng = np.random.default_rng(2043)
    values = np.concatenate([
        rng.integers(0, 1 << 64, 20000, dtype=np.uint64).view(np.float64),
        rng.integers(1, 1 << 52, 2000, dtype=np.uint64).view(np.float64),   # subnormals
        rng.integers(0, exact_scores.MAX_COUNT_UNITS, 2000).astype(np.float64),
        np.array([0.0, -0.0, np.inf, -np.inf, np.nan, np.finfo(np.float64).max,
                  np.finfo(np.float64).tiny, 5e-324, 1.0, 0.5])])
    with np.errstate(all="ignore"):
        for exponent in (-exact_scores.COUNT_BITS, exact_scores.COST_BITS, 1, -1, 7, -1000,
                         1000, -600, 600):
            expected = np.ldexp(values, exponent)
            got = exact_scores.times_power_of_two(values, exponent)
            both_nan = np.isnan(expected) & np.isnan(got)
            assert np.array_equal(got.view(np.uint64)[~both_nan],
                                  expected.view(np.uint64)[~both_nan]), exponent
            assert np.array_equal(np.isnan(got), np.isnan(expected))
            out = values.copy()
            assert exact_scores.times_power_of_two(out, exponent, out=out) is out
            assert np.array_equal(out.view(np.uint64)[~both_nan],
                                  expected.view(np.uint64)[~both_nan])
    with pytest.raises(ValueError):
        exact_scores.times_power_of_two(values, 1001)


def test_key_cost_units_scale_without_ldexp(monkeypatch):
    """The per-key costs of every objective scale by powers of two with a multiply, not
    numpy's ldexp (a scalar loop: ~2 ms per 5e5 values, twice per key shard of the
    automatic bound, issue 43); the units are those of the ldexp formula."""
    score = cb.make_score(
        "gaussian", (1, 2, 3, 4, 6, 8, 11, 16, 23, 32, 45, 64, 91, 128), 128,
        {"thresholds": [34, 48, 59, 68, 84, 97, 114, 139, 168, 199, 238, 286, 343, 410],
         "sigmas": [5.62, 7.97, 9.76, 11.27, 13.81, 15.94, 18.69, 22.55, 27.03, 31.89,
                    37.81, 45.09, 53.77, 63.77], "objective": "keys"})
    units = np.random.default_rng(7).integers(0, 1 << 32, size=(4000, 14))
    h = np.ldexp(units.astype(np.float64), -exact_scores.COUNT_BITS)
    reference = np.floor(np.ldexp(np.maximum(score.key_cost(h), 0.0),
                                  score.cost_bits)).astype(np.int64)

    def refused(*args, **kwargs):
        raise AssertionError("np.ldexp on the score's hot path")

    monkeypatch.setattr(np, "ldexp", refused)
    assert np.array_equal(score.key_cost_units(units), reference)
    for kind in ("gaussian", "laplace_l0", "sample_and_threshold"):
        other = cb.make_score(kind, CANDIDATES, MAX_BOUND, score_params(kind))
        some = units[:, :len(CANDIDATES)]
        assert other.key_cost_units(some).dtype == np.int64


def test_power_of_two_scaling_takes_float64_only():
    """A float32 array would be multiplied in float32 (numpy's casting rules): 1e-30 x
    2^130 overflows to inf there, where ldexp gives 1.4e9. Refused, not rounded."""
    with pytest.raises(TypeError, match="float64"):
        exact_scores.times_power_of_two(np.array([1e-30], dtype=np.float32), 130)
    with pytest.raises(TypeError, match="float64"):
        exact_scores.times_power_of_two(np.array([3], dtype=np.int64), 2)
    assert exact_scores.times_power_of_two(np.array([1e-30]), 130)[0] == np.ldexp(1e-30, 130)

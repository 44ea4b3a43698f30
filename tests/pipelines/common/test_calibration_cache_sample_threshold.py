"""The calibration cache for sample_and_threshold and heavy_hitters (pipelines/
calibration_cache.py, their ``verify_calibration``): a second plan of a spec is read back
(no calibration runs), and an entry whose (sampling_rate, threshold) misses the budget --
checked here against the accounting itself -- is not used: it is recalibrated with a
warning. Also the heavy_hitters default-method rule's trie point
(``heavy_hitters._trie_release_point``), cached under its own forward check."""
import logging

import pytest

from thresher.accounting.sample_threshold import core, pld
from thresher.pipelines.common import calibration_cache as cc
from thresher.pipelines.kinds import heavy_hitters, sample_and_threshold
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod

from tests.pipelines.common.test_calibration_cache import _count_calls, _spec, _typed, cache  # noqa: F401 (fixture)

CASES = {
    "sample_and_threshold_pld": {"kind": "sample_and_threshold", "sampling_rate": 0.05},
    "sample_and_threshold_basic": {"kind": "sample_and_threshold", "composition": "basic"},
    "heavy_hitters_trie": {"kind": "heavy_hitters", "prefix_lengths": [None],
                           "sampling_rate": 0.05},
    "heavy_hitters_default": {"kind": "heavy_hitters"},   # the default-method rule
}


def _count_trie_points(monkeypatch):
    real, calls = heavy_hitters._trie_release_point, []

    def counting(*args):
        calls.append(args)
        return real(*args)
    monkeypatch.setattr(heavy_hitters, "_trie_release_point", counting)
    return calls


def _entries(cache):
    """{file key: value} of the cache's entries holding a (sampling_rate, threshold)."""
    out = {}
    for path in cache.glob("*.json"):
        value = cc._read(path.stem)
        if value and type(value[0]) is dict and "threshold" in value[0] \
                and "sampling_rate" in value[0]:
            out[path.stem] = value[0]
    return out


def _cells(value, spec):
    """(cells a user moves, composition) of a cached value of this spec."""
    c = spec.bounding.max_keys_per_user
    if value.get("kind") == "heavy_hitters" or "kind" not in value:   # trie or its point
        levels = value.get("levels", 1)
        return c * levels, value["composition"]
    return c, value["composition"]


def _misses(value, spec):
    """The budget missed by (sampling_rate, threshold) of ``value``, by the accounting."""
    eps, delta = spec.privacy.epsilon, spec.privacy.delta
    n, composition = _cells(value, spec)
    p, tau = value["sampling_rate"], value["threshold"]
    if composition == "pld":
        return pld.user_delta(eps, p, tau, n) > delta
    return core.delta(eps / n, p, tau) > delta / n


@pytest.mark.parametrize("label", list(CASES))
def test_a_second_plan_is_read_back_and_a_planted_miss_is_recalibrated(cache, monkeypatch,
                                                                      caplog, label):
    mechanism = CASES[label]
    kind = mechanism["kind"]
    calls = _count_calls(monkeypatch, kind)
    points = _count_trie_points(monkeypatch)
    spec = _spec(mechanism=mechanism)
    first = make_plan(spec)
    assert len(calls) == 1
    stored = _entries(cache)
    trie_chosen = first.params_by_bound[8].get("method") != "adaptive"
    assert len(stored) == (1 if kind == "sample_and_threshold" or label == "heavy_hitters_trie"
                           else 1 + trie_chosen)
    assert len(points) == (label == "heavy_hitters_default")

    again = _spec(mechanism=mechanism)                  # check_spec's rule: read back too
    second = make_plan(again)
    assert len(calls) == (1 if (kind == "sample_and_threshold" or trie_chosen) else 2)
    assert len(points) == (label == "heavy_hitters_default")
    assert _typed(second.params_by_bound) == _typed(first.params_by_bound)
    assert second.report() == first.report()

    # Planted: every entry's threshold a quarter (release point to match), all else as
    # it was; the accounting says each misses the budget.
    for key, value in stored.items():
        tau = max(1, value["threshold"] // 4)
        planted = {**value, "threshold": tau, "release_point": tau / value["sampling_rate"]}
        assert _misses(planted, spec)
        cc._write(key, [planted])
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="thresher"):
        third = make_plan(_spec(mechanism=mechanism))
    assert _typed(third.params_by_bound) == _typed(first.params_by_bound)
    warned = [r for r in caplog.records if "fails its forward privacy check" in r.getMessage()]
    assert len(warned) == len(stored)
    assert len(calls) == (2 if (kind == "sample_and_threshold" or trie_chosen) else 3)
    assert len(points) == 2 * (label == "heavy_hitters_default")


def test_heavy_hitters_adaptive_is_not_cached(cache, monkeypatch):
    """Method adaptive has no forward check here: computed every time, nothing stored."""
    assert not heavy_hitters.verify_calibration({"method": "adaptive"}, {"method": "adaptive"},
                                                epsilon=1.0, delta=1e-8, max_keys_per_user=8,
                                                model="l0")
    calls = _count_calls(monkeypatch, "heavy_hitters")
    spec = _spec(mechanism={"kind": "heavy_hitters", "method": "adaptive"})
    make_plan(spec)
    make_plan(spec)
    assert len(calls) == 2 and not _entries(cache)


@pytest.mark.parametrize("module, mech, changes", [
    (sample_and_threshold, {"accounting": "exact"}, ("sampling_rate", "threshold")),
    (sample_and_threshold, {"accounting": "exact", "composition": "basic"},
     ("sampling_rate", "threshold")),
    (sample_and_threshold, {"accounting": "exact", "sampling_rate": 0.05}, ("threshold",)),
    (heavy_hitters, {"top_k": 5, "prefix_lengths": [4, None], "sampling_rate": 0.05},
     ("threshold",)),
])
def test_the_checks_refuse_what_the_accounting_refuses(module, mech, changes):
    """verify_calibration against the accounting: the honest calibration passes; its
    threshold lowered by one or its sampling rate raised by 1% (each: the accounting's
    delta above the budget) fail; a fixed field changed fails; a report field changed
    fails."""
    kw = dict(epsilon=1.0, delta=1e-8, max_keys_per_user=4, model="l0")
    honest = module.calibrate(mech, **kw)
    assert module.verify_calibration(honest, mech, **kw)
    spec_like = type("S", (), {})()
    spec_like.privacy = type("P", (), {"epsilon": 1.0, "delta": 1e-8})()
    spec_like.bounding = type("B", (), {"max_keys_per_user": 4})()
    for field in changes:
        if field == "threshold":
            bad = {**honest, "threshold": honest["threshold"] - 1}
        else:
            bad = {**honest, "sampling_rate": honest["sampling_rate"] * 1.01}
        bad["release_point"] = bad["threshold"] / bad["sampling_rate"]
        assert _misses(bad, spec_like), field
        assert not module.verify_calibration(bad, mech, **kw), field
    if mech.get("sampling_rate") is not None:    # a fixed field: not the spec's
        other = {**mech, "sampling_rate": 0.04}
        assert not module.verify_calibration(honest, other, **kw)
    assert not module.verify_calibration({**honest, "delta_achieved": 1e-30}, mech, **kw)
    assert not module.verify_calibration([honest], mech, **kw)


# ---- a fixed (sampling_rate, threshold) that misses the budget (refused in seconds) -------

MISSES = {
    "heavy_hitters_3_levels": {"kind": "heavy_hitters", "prefix_lengths": [2, 4, None],
                               "sampling_rate": 0.1, "threshold": 8},
    "heavy_hitters_high_rate": {"kind": "heavy_hitters", "prefix_lengths": [None],
                                "sampling_rate": 0.9, "threshold": 10},
    "sample_and_threshold": {"kind": "sample_and_threshold", "sampling_rate": 0.2,
                             "threshold": 5},
}


@pytest.mark.parametrize("label", list(MISSES))
def test_a_fixed_setting_that_misses_is_refused_naming_settings_that_pass(write_spec, capfd,
                                                                          label):
    """``thresher plan``: exit 2, the message names mechanism.sampling_rate and
    mechanism.threshold and a threshold (at the given rate) and/or a rate (at the given
    threshold) that meet the budget; each named setting then plans (exit 0) and its
    delta, by the accounting, is within the budget."""
    import re

    from thresher.pipelines.cli import main
    mechanism = MISSES[label]
    assert main(["plan", write_spec({"mechanism": mechanism})]) == 2
    err = capfd.readouterr().err
    assert "mechanism.sampling_rate, mechanism.threshold:" in err, err
    assert "Traceback" not in err
    taus = re.findall(r"threshold >= (\d+) at sampling_rate", err)
    rates = re.findall(r"sampling_rate <= ([0-9.e-]+) at threshold", err)
    assert taus or rates, err
    named = [{**mechanism, "threshold": int(t)} for t in taus] + \
            [{**mechanism, "sampling_rate": float(r)} for r in rates]
    for i, fixed in enumerate(named):
        path = write_spec({"mechanism": fixed}, name=f"named{i}.yaml")
        assert main(["plan", path, "--json"]) == 0, capfd.readouterr().err
        capfd.readouterr()
        spec = spec_mod.parse(__import__("yaml").safe_load(open(path, encoding="utf-8")))
        c = spec.bounding.max_keys_per_user * len(fixed.get("prefix_lengths", [None]))
        assert pld.user_delta(spec.privacy.epsilon, fixed["sampling_rate"], fixed["threshold"],
                              c) <= spec.privacy.delta


@pytest.mark.parametrize("epsilon, delta, c", [(1.0, 1e-6, 16), (0.5, 1e-8, 4), (2.0, 1e-5, 48),
                                               (1.0, 1e-9, 2)])
def test_basic_compositions_settings_meet_the_composed_bound(epsilon, delta, c):
    """Basic composition's calibration (free, and the smallest threshold at a fixed rate)
    meets the budget by pld.user_delta too, far below its basic term: the composed bound
    is the tighter of the two wherever basic's settings land (issue 38: the pair of
    accounting/sample_threshold/pld.py; its validity is tested in
    tests/accounting/sample_threshold/test_sample_threshold_pld.py)."""
    basic = core.calibrate(epsilon, delta, c, composition="basic")
    settings = [(basic.sampling_rate, basic.threshold)]
    rate = basic.sampling_rate * 2
    settings.append((rate, core.min_threshold(epsilon / c, delta / c, rate)))
    for p, tau in settings:
        term = c * core.delta(epsilon / c, p, tau)
        assert term <= delta * (1 + 1e-12)
        assert pld.user_delta(epsilon, p, tau, c) <= min(term, delta)

def test_an_entry_of_the_earlier_bound_is_refused_and_recalibrated(cache, monkeypatch, caplog):
    """Issue 38 changed the composed bound (pld.py): a cache entry written by the earlier
    bound -- file format 1, its lower sampling rate, its own delta_achieved and the report
    field it had (basic_composition) -- is never used: format 1 is refused on reading,
    and the same value stored under the current format fails the forward check (its
    delta_achieved is not the one recomputed by the current bound, although its rate
    meets the budget), so the plan is recalibrated and equals a fresh one."""
    calls = _count_calls(monkeypatch, "sample_and_threshold")
    spec = _spec(mechanism={"kind": "sample_and_threshold"})
    first = make_plan(spec)
    (key, value), = _entries(cache).items()
    old_rate = value["sampling_rate"] * 0.7            # the earlier bound needed a lower rate
    old = {**value, "sampling_rate": old_rate, "release_point": value["threshold"] / old_rate,
           "delta_achieved": value["delta_achieved"] * 0.93,
           "basic_composition": {"sampling_rate": 0.01, "threshold": 28,
                                 "release_point": 2800.0}}
    assert not _misses(old, spec)                      # private enough: still not used
    document = {"format": 1, "key": key, "value": cc._tag([old])}
    (cache / f"{key}.json").write_text(__import__("json").dumps(document))
    assert cc._read(key) is None                       # format 1: refused on reading
    second = make_plan(_spec(mechanism={"kind": "sample_and_threshold"}))
    assert len(calls) == 2 and second.report() == first.report()
    cc._write(key, [old])                              # current format, stale value
    with caplog.at_level(logging.WARNING, logger="thresher"):
        third = make_plan(_spec(mechanism={"kind": "sample_and_threshold"}))
    assert len(calls) == 3 and third.report() == first.report()
    assert any("fails its forward privacy check" in r.getMessage() for r in caplog.records)

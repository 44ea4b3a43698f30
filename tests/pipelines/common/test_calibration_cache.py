"""The thresher command's calibration cache (pipelines/common/calibration_cache.py): a cached plan
is exactly the computed one, a changed argument or changed code misses, files that are
not private or do not decode are ignored, a second ``thresher run`` of a spec does
not import scipy.special, and a planted entry (parameters that decode but miss the
budget) never reaches a release: it fails its forward check and is recalibrated."""
import json
import math
import os
import subprocess
import sys

import pytest
import yaml

from thresher.pipelines.common import calibration_cache as cc
from thresher.pipelines import kinds
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan

from tests.pipelines.conftest import BASE_SPEC, ROOT


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv(cc.ENV, str(tmp_path / "cache"))
    cc.enable()
    yield tmp_path / "cache" / "calibration"
    cc.disable()


def _spec(**changes):
    data = json.loads(json.dumps(BASE_SPEC))
    data["output"]["path"] = "unused"
    for dotted, value in changes.items():
        node = data
        *parents, last = dotted.split(".")
        for p in parents:
            node = node[p]
        node[last] = value
    return spec_mod.parse(data)


def _count_calls(monkeypatch, kind):
    module = kinds.get(kind)
    real, calls = module.calibrate, []

    def counting(*args, **kwargs):
        calls.append(kwargs)
        return real(*args, **kwargs)
    monkeypatch.setattr(module, "calibrate", counting)
    return calls


def _typed(x):
    """x with the type of every part spelled out (1, 1.0 and True differ)."""
    return cc._tag(x)


@pytest.mark.parametrize("kind, mechanism", [
    ("gaussian", {"kind": "gaussian", "pre_threshold": 2}),
    ("laplace", {"kind": "laplace"}),
])
def test_a_cached_plan_is_the_computed_plan(cache, monkeypatch, kind, mechanism):
    calls = _count_calls(monkeypatch, kind)
    spec = _spec(mechanism=mechanism)
    first = make_plan(spec)
    assert len(calls) == 1 and len(list(cache.glob("*.json"))) == (2 if kind == "gaussian" else 1)
    second = make_plan(spec)
    assert len(calls) == 1                       # read back, not computed
    assert _typed(second.params_by_bound) == _typed(first.params_by_bound)
    assert second.report() == first.report()
    cc.disable()                                 # and the same as without any cache
    assert _typed(make_plan(spec).params_by_bound) == _typed(first.params_by_bound)


@pytest.mark.parametrize("kind", ["weighted_gaussian", "adaptive"])
def test_kinds_without_a_forward_check_are_not_cached(cache, monkeypatch, kind):
    """A kind whose calibration has no cheap forward check (verify_calibration) is computed
    every time and nothing of it is stored."""
    assert kinds.get(kind).verify_calibration is None
    calls = _count_calls(monkeypatch, kind)
    spec = _spec(mechanism={"kind": kind})
    make_plan(spec)
    make_plan(spec)
    assert len(calls) == 2
    assert not [p for p in cache.glob("*.json") if f'"{kind}"' in p.read_text()]


def test_other_arguments_or_other_code_miss(cache, monkeypatch):
    calls = _count_calls(monkeypatch, "gaussian")
    make_plan(_spec())
    make_plan(_spec(**{"privacy.epsilon": 0.5}))
    make_plan(_spec(**{"bounding.max_keys_per_user": 4}))
    assert len(calls) == 3 and len(list(cache.glob("*.json"))) == 6   # and the limit checks
    make_plan(_spec(**{"privacy.epsilon": 0.5}))
    assert len(calls) == 3
    monkeypatch.setattr(cc, "fingerprint", lambda: "other code")
    make_plan(_spec(**{"privacy.epsilon": 0.5}))
    assert len(calls) == 4


def test_argument_types_are_part_of_the_key():
    assert len({cc._key("k", ({"a": v}, 1.0), {"c": 8}) for v in (1, 1.0, True, "1")}) == 4
    assert cc._key("k", ({"a": [1]},), {}) != cc._key("k", ({"a": (1,)},), {})
    assert cc._key("k", (1.0,), {"c": 8}) != cc._key("k", (1.0,), {"c": 8.0})
    assert cc._key("k", (), {"a": 1, "b": 2}) == cc._key("k", (), {"b": 2, "a": 1})
    assert cc._key("k", (1,), {}) != cc._key("j", (1,), {})
    value = {"s": 0.1 + 0.2, "i": 3, "b": False, "t": (1, 2.5), "l": [None, "x"], "d": {"z": 1e-300}}
    assert _typed(cc._untag(json.loads(json.dumps(cc._tag(value))))) == _typed(value)
    with pytest.raises(cc._Uncacheable):
        cc._tag({"x": object()})


def test_files_that_are_not_private_or_do_not_decode_are_ignored(cache, monkeypatch):
    calls = _count_calls(monkeypatch, "gaussian")
    spec = _spec()
    first = make_plan(spec)
    (path,) = [p for p in cache.glob("*.json") if "sigma" in p.read_text()]
    assert path.stat().st_mode & 0o777 == 0o600 and cache.stat().st_mode & 0o777 == 0o700
    os.chmod(path, 0o666)                        # writable by others: not trusted
    make_plan(spec)
    assert len(calls) == 2
    os.chmod(path, 0o600)
    other = cc._key("gaussian.calibrate", ({"kind": "gaussian"},), {"epsilon": 9.0})
    os.replace(path, cache / f"{other}.json")   # a file under another calibration's name
    real_key = cc._key
    monkeypatch.setattr(cc, "_key", lambda name, *args: other if name == "gaussian.calibrate"
                        else real_key(name, *args))
    make_plan(spec)
    assert len(calls) == 3                       # its recorded key differs: recomputed
    monkeypatch.undo()
    calls = _count_calls(monkeypatch, "gaussian")
    monkeypatch.setenv(cc.ENV, str(cache.parent))
    make_plan(spec)                              # written again under its own name
    (path,) = [p for p in cache.glob("*.json") if p.stem != other and "sigma" in p.read_text()]
    path.write_text("{not json")
    assert _typed(make_plan(spec).params_by_bound) == _typed(first.params_by_bound)
    assert len(calls) == 2


def test_off_and_library_use_compute(tmp_path, monkeypatch):
    calls = _count_calls(monkeypatch, "gaussian")
    monkeypatch.setenv(cc.ENV, str(tmp_path))
    make_plan(_spec())                           # not enabled: a library call
    cc.enable()
    try:
        monkeypatch.setenv(cc.ENV, "off")
        make_plan(_spec())
    finally:
        cc.disable()
    assert len(calls) == 2 and not list(tmp_path.rglob("*.json"))


# `thresher run SPEC --quiet` in a fresh process, then the modules it imported (the CLI
# sends stderr to /dev/null while it works, so -X importtime cannot be read).
PROBE = """import json, sys
from thresher.pipelines.cli import main
rc = main(["run", sys.argv[1], "--quiet"])
print(json.dumps(sorted(sys.modules)))
sys.exit(rc)
"""


def test_a_second_run_of_a_spec_does_not_import_scipy(tmp_path, small_parquet):
    spec = json.loads(json.dumps(BASE_SPEC))
    spec["input"]["path"] = small_parquet
    env = {**os.environ, cc.ENV: str(tmp_path / "cache")}
    reports, imported = [], []
    for run in range(2):
        spec["output"]["path"] = str(tmp_path / f"out{run}")
        path = tmp_path / "spec.yaml"
        path.write_text(yaml.safe_dump(spec))
        proc = subprocess.run([sys.executable, "-c", PROBE, str(path)], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=300)
        assert proc.returncode == 0, proc.stderr[-2000:]
        imported.append(set(json.loads(proc.stdout.strip().splitlines()[-1])))
        with open(tmp_path / f"out{run}" / "release_report.json", encoding="utf-8") as handle:
            reports.append(json.load(handle))
    assert "scipy.special" in imported[0]        # computed (the probe sees scipy's import)
    assert "scipy.special" not in imported[1]    # read back
    assert reports[1]["mechanism"] == reports[0]["mechanism"]
    assert reports[1]["privacy"] == reports[0]["privacy"]


def test_the_cache_is_on_only_while_a_command_runs(tmp_path, monkeypatch):
    """An in-process ``thresher`` command must not leave the cache on for later library
    calls (they may run patched code the fingerprint cannot see)."""
    from thresher.pipelines.common import calibration_cache
    from thresher.pipelines import cli
    monkeypatch.setenv("THRESHER_CACHE_DIR", str(tmp_path / "cache"))
    calibration_cache.disable()
    cli.main(["schema"])
    assert calibration_cache._enabled is False


def test_no_absolute_cache_folder_turns_the_cache_off(monkeypatch):
    from thresher.pipelines.common import calibration_cache
    monkeypatch.delenv("THRESHER_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", "relative/cache")
    assert calibration_cache.folder() is None


# ---- planted entries (issue 25 F3) ---------------------------------------------------------

def _calibration_call(monkeypatch, spec):
    """(args, kwargs, value) of the kind's calibrate call that make_plan(spec) makes, computed
    with the cache off: the key the cache files it under and the honest value."""
    module = kinds.get(spec.kind)
    real, seen = module.calibrate, []

    def recording(*args, **kwargs):
        value = real(*args, **kwargs)
        seen.append((args, kwargs, value))
        return value
    monkeypatch.setattr(module, "calibrate", recording)
    cc.disable()
    try:
        make_plan(spec)
    finally:
        monkeypatch.setattr(module, "calibrate", real)
    (call,) = seen
    return call


def _eighth(value):
    """Every float of a calibration divided by 8 (sigma, thresholds, scales, tables)."""
    if type(value) is float:
        return value / 8
    if type(value) is dict:
        return {k: _eighth(v) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_eighth(v) for v in value)
    return value


def _planted(kind, honest):
    """The tampered values planted for each kind (all decode and look plausible)."""
    out = {"all_floats_over_8": _eighth(honest)}
    if kind == "gaussian":
        tau = honest["pre_threshold"]
        out["sigma_over_8"] = {**honest, "sigma": honest["sigma"] / 8}
        out["threshold_over_8"] = {**honest, "threshold": max(tau, honest["threshold"] // 8)}
        out["both_over_8_and_a_small_delta"] = {
            **honest, "sigma": honest["sigma"] / 8,
            "threshold": max(tau, honest["threshold"] // 8), "delta_achieved": 9e-9}
        out["delta_achieved_misreported"] = {**honest, "delta_achieved": honest["delta_achieved"] / 8}
        out["pre_threshold_changed"] = {**honest, "pre_threshold": tau + 5}
        out["continuous_noise"] = {**honest, "noise": "gaussian"}
    if kind == "laplace":
        out["scale_over_8"] = {**honest, "scale": honest["scale"] / 8}
        out["threshold_over_8"] = {**honest, "threshold": honest["threshold"] / 8}
    if kind == "sample_and_threshold":
        tables = [k for k, v in honest.items() if type(v) in (list, tuple) and len(v) > 1]
        for k in tables:
            out[f"{k}_reversed"] = {**honest, k: type(honest[k])(reversed(honest[k]))}
    return out


CLI_CASES = [("gaussian", {"kind": "gaussian", "pre_threshold": 2}),
             ("laplace", {"kind": "laplace"}),
             ("weighted_gaussian", {"kind": "weighted_gaussian"}),
             ("sample_and_threshold", {"kind": "sample_and_threshold"})]


@pytest.mark.parametrize("kind, mechanism", CLI_CASES, ids=[c[0] for c in CLI_CASES])
def test_planted_entries_never_reach_a_release(tmp_path, monkeypatch, capfd, small_parquet,
                                               kind, mechanism):
    """Cache files with the honest key and a tampered value (mode 0600, valid JSON, as an
    edit or a silent corruption leaves them) are planted, and the real CLI runs the spec:
    the released report carries the honest parameters (recalibrated, with a warning),
    never the planted ones. On the code before the forward check the planted sigma/8 was
    published as is."""
    from thresher.pipelines import cli
    data = json.loads(json.dumps(BASE_SPEC))
    data["input"]["path"] = small_parquet
    data["mechanism"] = mechanism
    data["output"]["path"] = str(tmp_path / "unused")
    args, kwargs, honest = _calibration_call(monkeypatch, spec_mod.parse(data))
    name = f"{kind}.calibrate"
    monkeypatch.setenv(cc.ENV, str(tmp_path / "cache"))
    honest_report = None
    for label, value in _planted(kind, honest).items():
        assert _typed(value) != _typed(honest)
        out = tmp_path / f"out_{label}"
        data["output"]["path"] = str(out)
        (tmp_path / "spec.yaml").write_text(yaml.safe_dump(data))
        cc._write(cc._key(name, args, kwargs), [value])          # the planted file
        (path,) = [p for p in (tmp_path / "cache" / "calibration").glob("*.json")
                   if p.stem == cc._key(name, args, kwargs)]
        assert path.stat().st_mode & 0o777 == 0o600
        capfd.readouterr()
        assert cli.main(["run", str(tmp_path / "spec.yaml")]) == 0   # -q would hide the warning
        stderr = capfd.readouterr().err
        with open(out / "release_report.json", encoding="utf-8") as handle:
            mechanism_report = json.load(handle)["mechanism"]
        for field in ("sigma", "threshold", "scale", "delta_achieved", "noise", "pre_threshold"):
            if field in honest:
                assert mechanism_report[field] == honest[field], (label, field)
        if honest_report is None:
            honest_report = mechanism_report
        assert mechanism_report == honest_report, label
        if kinds.get(kind).verify_calibration is not None:
            assert "fails its forward privacy check" in stderr and "recalibrating" in stderr, label
    assert not cc._enabled


def test_the_gaussian_check_refuses_what_the_accounting_refuses():
    """verify_calibration of the gaussian kind against the exact accounting
    (accounting.gshm.delta): honest calibrations pass; sigma or tau* lowered until the
    exact delta exceeds the budget fail, one step either side."""
    from thresher.accounting import gshm
    from thresher.pipelines.kinds import gaussian
    for eps, delta, c, tau in ((1.0, 1e-8, 8, 1), (0.5, 1e-6, 1, 2), (2.0, 1e-10, 30, 1)):
        mech = {"kind": "gaussian", "pre_threshold": tau}
        kw = dict(epsilon=eps, delta=delta, max_keys_per_user=c, model="l0")
        honest = gaussian.calibrate(mech, **kw)
        assert gaussian.verify_calibration(honest, mech, **kw)
        sigma, gap = honest["sigma"], honest["threshold"] - tau
        # the largest gap that fails the exact accounting: the check refuses it
        assert gshm.delta(eps, sigma, gap - 1, c, noise="discrete_gaussian") > delta
        assert not gaussian.verify_calibration({**honest, "threshold": tau + gap - 1}, mech, **kw)
        lowered = sigma * (1 - 1e-6)
        exact = gshm.delta(eps, lowered, gap, c, noise="discrete_gaussian")
        assert gaussian.verify_calibration({**honest, "sigma": lowered, "delta_achieved": exact},
                                           mech, **kw) == (exact <= delta)
        for bad in ({**honest, "sigma": sigma / 8}, {**honest, "kind": "laplace"},
                    {k: v for k, v in honest.items() if k != "sigma"}, [honest],
                    {**honest, "sigma": str(sigma)}, {**honest, "threshold": math.nan}):
            assert not gaussian.verify_calibration(bad, mech, **kw)


def test_the_gaussian_check_verifies_every_candidate_of_an_automatic_bound():
    """An automatic bound's candidates up to C = 128 (delta 1e-8): every honest calibration
    passes the forward check, so a cached one is used and not recalibrated (before the
    pruned bound, plain_gshm.delta_upper gave up at C >= 64 and C = 64, 91, 128 were
    recalibrated on every run); tampered ones still fail."""
    from thresher.pipelines.kinds import gaussian
    mech = {"kind": "gaussian", "pre_threshold": 1}
    for c in (45, 64, 91, 128):
        kw = dict(epsilon=0.9, delta=1e-8, max_keys_per_user=c, model="l0")
        honest = gaussian.calibrate(mech, **kw)
        assert gaussian.verify_calibration(honest, mech, **kw), c
        for bad in ({**honest, "threshold": honest["threshold"] - 1},
                    {**honest, "sigma": honest["sigma"] * (1 - 1e-3)},
                    {**honest, "delta_achieved": honest["delta_achieved"] / 8},
                    {**honest, "delta_achieved": 2e-8}):
            assert not gaussian.verify_calibration(bad, mech, **kw), (c, bad)

"""Plan cost of the worst weighted_sampling specs (issue 18: bounded resources from any spec).

``thresher plan`` of a ppswor / priority weighted_sampling spec builds the PWS tables
(paper 001 Alg. 3/4, ``accounting.pws``): the keep probabilities (keys only) and the Alg. 4
frequency table, whose rows are built one at a time. Before this file, sampling thresholds
near the old floor (1e-6) took 8-60 s and up to ~1 GB to plan. Now the tables are capped
(``pws.MAX_KEEP_LENGTH``, ``MAX_TABLE_ENTRIES``, ``MAX_BAND_ROWS``) and a spec whose
automatic table would exceed them is refused before anything is built
(``pipelines.common.limits``), naming the field and the value that works.

Each case here is the largest of its family that is still accepted (or the smallest that is
refused), run through the real CLI (``pipelines.cli.main``) in one fresh interpreter
(``tests.robustness.cli_driver``: address space capped at 3 GB, a 60 s alarm per case as a
hang guard). Asserted: the exit code (0 or 2) and the message, no traceback; peak resident
memory <= 420 MB (VmHWM; ~240 MB of it is the interpreter with Beam and numpy imported;
measured peaks are <= ~375 MB); and the work, counted rather than timed
(``tests.robustness.pws_work`` counts the tables built): accepted plans build each table
within the caps and few of them, refused specs build nothing. The PWS caches are cleared
between cases, so each plan builds its own tables. Plan times are measured by benchmarks
and quoted in docs/weighted_sampling.md ("Limits"), never asserted here.
"""
import os

import pytest
import yaml

from thresher.accounting import pws
from thresher.accounting.pws import core as pws_core
from tests.robustness.cli_driver import run_batch

PEAK_RSS_MB = 420
# Work caps of a whole plan (test_accepted_plans_build_tables_within_the_caps).
BAND_BUILDS = 2
KEEP_LENGTHS = 4

ROWS, KEEP = pws.MAX_BAND_ROWS, pws.MAX_KEEP_LENGTH
# smallest thresholds whose automatic tables fit: priority 1/cap, ppswor 54 ln 2 / cap
PRIORITY_T = 1.001 / ROWS
PPSWOR_T = 37.43 * 1.001 / ROWS
PPSWOR_KEYS_T = 37.43 * 1.001 / KEEP

# (name, privacy, max_keys_per_user, mechanism, exit code, needles)
CASES = [
    # accepted: the largest tables of each kind
    ("priority_rows_cap_biased_down", (10.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": PRIORITY_T, "estimator": "biased_down"}, 0, ()),
    ("ppswor_rows_cap", (10.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_T}, 0, ()),
    ("priority_rows_cap_eps1", (1.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": PRIORITY_T}, 0, ()),
    ("ppswor_keys_cap", (1.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_KEYS_T, "report": "keys"}, 0, ()),
    ("priority_keys_threshold_floor", (10.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": 1e-6, "report": "keys"}, 0, ()),
    ("none_keys_max_frequency_cap", (10.0, 1e-8), 1,
     {"max_frequency": KEEP, "report": "keys"}, 0, ()),
    ("priority_max_frequency_rows_cap", (10.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": 1e-6, "max_frequency": ROWS}, 0, ()),
    ("entries_cap_small_epsilon", (0.003, 1e-8), 1, {}, 0, ()),
    ("ppswor_rows_cap_C_10000", (1.0, 1e-6), 10_000,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_T}, 0, ()),
    # refused before anything is built
    ("priority_threshold_1e-6", (1.0, 1e-8), 1,
     {"sampling": "priority", "sampling_threshold": 1e-6}, 2,
     ("mechanism.sampling_threshold", "use a threshold >= 2e-05", "max_frequency <= 50000")),
    ("ppswor_keys_threshold_1e-6", (1.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": 1e-6, "report": "keys"}, 2,
     ("mechanism.sampling_threshold", "use a threshold >= 1.79e-05",
      "max_frequency <= 2097152")),
    ("ppswor_threshold_just_too_small", (10.0, 1e-8), 1,
     {"sampling": "ppswor", "sampling_threshold": PPSWOR_T * 0.99}, 2,
     ("mechanism.sampling_threshold", "use a threshold >=")),
    ("max_frequency_rows_cap_plus_one", (10.0, 1e-8), 1, {"max_frequency": ROWS + 1}, 2,
     ("mechanism.max_frequency", f"<= {ROWS}")),
    ("keys_max_frequency_cap_plus_one", (10.0, 1e-8), 1,
     {"max_frequency": KEEP + 1, "report": "keys"}, 2,
     ("mechanism.max_frequency", f"<= {KEEP}")),
]


def _spec(folder, privacy, bound, mechanism):
    return {"name": "pws-cost",
            "input": {"path": os.path.join(folder, "in.parquet"), "user": "user_id",
                      "keys": ["word"]},
            "privacy": {"epsilon": privacy[0], "delta": privacy[1]},
            "bounding": {"max_keys_per_user": bound},
            "mechanism": {"kind": "weighted_sampling", **mechanism},
            "output": {"path": os.path.join(folder, "out")}}


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = tmp_path_factory.mktemp("pws_cost")
    argvs = []
    for name, privacy, bound, mechanism, _, _ in CASES:
        folder = root / name
        folder.mkdir()
        path = folder / "spec.yaml"
        path.write_text(yaml.safe_dump(_spec(str(folder), privacy, bound, mechanism)))
        argvs.append(["plan", str(path)])
    return dict(zip([c[0] for c in CASES], run_batch(argvs, hooks="tests.robustness.pws_work")))


def _work(result):
    """The case's table work (``tests.robustness.pws_work``): builds and their sizes."""
    h = result["hooks"]
    return (f"keep tables {h['keep_entries']}, bands {h['band_rows']} rows / "
            f"{h['band_entries']} entries, cached {h['bands_cached']} bands, "
            f"{h['release_tables_cached']} release tables")


@pytest.mark.parametrize("name,privacy,bound,mechanism,code,needles", CASES,
                         ids=[c[0] for c in CASES])
def test_worst_weighted_sampling_plans_are_bounded(results, name, privacy, bound, mechanism,
                                                   code, needles):
    result = results[name]
    where = (f"case {name}: exit {result['code']}, {result['seconds']:.1f} s wall, "
             f"peak {result['peak_mb']:.0f} MB, {_work(result)}, "
             f"stderr:\n{result['err'][-2000:]}")
    assert result["code"] == code, where
    assert "Traceback" not in result["err"] and "internal error" not in result["err"], where
    for needle in needles:
        assert needle in result["err"], where
    if code == 0:
        plan = result["out"]
        assert "weighted_sampling" in plan and "max_frequency" in plan, where
    assert result["peak_mb"] <= PEAK_RSS_MB, where


@pytest.mark.parametrize("name", [c[0] for c in CASES if c[4] == 0])
def test_accepted_plans_build_tables_within_the_caps(results, name):
    """The work of the worst accepted plans, counted rather than timed: every Alg. 3 keep
    table has <= MAX_KEEP_LENGTH + 1 entries and every Alg. 4 band <= MAX_BAND_ROWS rows
    computed (+ the one that did not fit) and <= MAX_TABLE_ENTRIES entries stored; a plan
    builds at most BAND_BUILDS bands and KEEP_LENGTHS x MAX_KEEP_LENGTH keep
    probabilities in all (the verification margin loop and the saturation search rebuild;
    measured at most 2 bands and 3 keep-table lengths). The plan reads each candidate's
    keep table only (``pws.keep_table``, which lets go of the band calibrate kept): it
    builds estimator tables only where they can still refuse the bound (biased_down) or
    are the keep table (keys only), and keeps no more bands than it built."""
    h = results[name]["hooks"]
    where = f"case {name}: {_work(results[name])}"
    assert all(n <= KEEP + 1 for n in h["keep_entries"]), where
    assert sum(h["keep_entries"]) <= KEEP_LENGTHS * KEEP, where
    assert all(n <= ROWS + 1 for n in h["band_rows"]), where
    assert all(n <= pws.MAX_TABLE_ENTRIES for n in h["band_entries"]), where
    assert len(h["band_rows"]) <= BAND_BUILDS, where
    assert h["bands_cached"] <= len(h["band_rows"]), where
    mechanism = {c[0]: c[3] for c in CASES}[name]
    # release tables at plan time only where they are the keep table (keys only) or can
    # still refuse the bound (biased_down beyond a shift table: pws.release_tables_can_fail)
    needs_tables = mechanism.get("report") == "keys" or mechanism.get("estimator") == "biased_down"
    assert h["release_tables_cached"] == int(needs_tables), where


def test_refused_specs_are_refused_before_building_tables(results):
    """A refusal builds nothing: no keep table or band was computed for the case and the
    PWS caches (pws_core._BANDS, pws.release_tables) are still empty after it."""
    refused = [c[0] for c in CASES if c[4] == 2]
    assert len(refused) == 5
    for name in refused:
        h = results[name]["hooks"]
        assert results[name]["code"] == 2, name
        assert h["keep_entries"] == [] and h["band_rows"] == [], (name, _work(results[name]))
        assert h["bands_cached"] == 0 and h["release_tables_cached"] == 0, (name, h)

"""Settings for the whole test suite."""
import os

# The thresher command keeps calibrations in a per-user cache (pipelines/common/calibration_cache.py).
# The suite computes every calibration (and writes nothing under the home folder); the
# cache's own tests point THRESHER_CACHE_DIR at a temporary folder.
os.environ["THRESHER_CACHE_DIR"] = "off"   # whatever the environment says

# No timed assertions in the suite (speed is measured by benchmarks): hypothesis's default
# 200 ms per-example deadline would fail a property test on a loaded machine.
from hypothesis import settings as _hypothesis_settings  # noqa: E402

# Deterministic property tests (issue 29): derandomize=True draws each test's examples from
# a seed fixed by the test itself, so a run fails or passes the same way every time (a
# property test that passes once passes always; no false failures from an unlucky draw).
# What it costs: the same examples (max_examples per test) are tried on every run, instead
# of new ones each run, so a bug outside them is never found by repetition. To explore
# new examples on purpose (not in CI), run with THRESHER_HYPOTHESIS=explore: random
# examples, and a failure prints the example and the seed to reproduce it.
_hypothesis_settings.register_profile("thresher", deadline=None, derandomize=True,
                                      database=None, print_blob=True)
_hypothesis_settings.register_profile("explore", deadline=None, print_blob=True)
_hypothesis_settings.load_profile(
    "explore" if os.environ.get("THRESHER_HYPOTHESIS") == "explore" else "thresher")


# ---- every release report the suite writes is strict JSON (issue 30 D5) -------------------
import json as _json  # noqa: E402
import os as _os  # noqa: E402

import pytest as _pytest  # noqa: E402

REPORT_NAMES = ("release_report.json",)


def _refuse_constant(name):
    raise ValueError(f"{name} is not JSON (RFC 8259 has no NaN or Infinity)")


def non_strict_reports(root):
    """[(path, why)] for every release report under ``root`` that a strict JSON parser
    refuses because of NaN/Infinity, the only non-standard output Python's json writer
    produces (with allow_nan=True). Files that are not JSON at all are left alone: tests
    write damaged reports on purpose to check that readers refuse them."""
    bad = []
    for folder, _, files in _os.walk(root):
        for name in files:
            if name not in REPORT_NAMES:
                continue
            path = _os.path.join(folder, name)
            try:
                with open(path, encoding="utf-8") as handle:
                    text = handle.read()
            except (OSError, UnicodeDecodeError):
                continue
            try:
                _json.loads(text, parse_constant=_refuse_constant)
            except _json.JSONDecodeError:
                continue
            except ValueError as exc:
                bad.append((path, str(exc)))
    return bad


@_pytest.fixture(scope="session", autouse=True)
def _every_report_is_strict_json(tmp_path_factory):
    """After the session: parse every release_report.json written under the session's
    temporary folders (tmp_path of every test, including what CLI child processes wrote
    there) with a strict parser; a NaN or Infinity fails the session's last teardown."""
    yield
    bad = non_strict_reports(str(tmp_path_factory.getbasetemp()))
    assert not bad, "release reports that are not strict JSON: " + "; ".join(
        f"{path}: {why}" for path, why in bad)

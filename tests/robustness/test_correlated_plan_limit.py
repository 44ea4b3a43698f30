"""``noise: correlated`` at a small epsilon: refused by ``thresher plan`` before any of its
calibration's work, naming privacy.epsilon (issue 42: epsilon 0.001 planned for 12 min 46 s
with no progress line; ``auto`` took 72 s).

The correlated calibration's work grows as sigma (sigma + 2.6 C) at the smallest workable
sigma (accounting.correlated_gshm.MAX_WORK). These tests count that work -- the Thm 5.4
tables (correlated_gshm._Table) the plan fills -- rather than time it: zero at the refused
epsilon, and the refusal names the smallest release epsilon that fits. Each test fails on
the code before the limit: there the plan goes on to fill tables for minutes (correlated)
or fills them and reports a correlated release point (auto).
"""
import json
import re

import pytest
import yaml

from thresher.accounting import correlated_gshm

from .conftest import assert_clean_error, run_cli, words_table, write_parquet, write_spec


@pytest.fixture
def table_work(monkeypatch):
    """The gaps evaluated by Thm 5.4 in correlated_gshm tables during the test."""
    counted = {"gaps": 0}
    original = correlated_gshm._Table.__call__

    def counting(self, gaps):
        before = len(self._values)
        try:
            return original(self, gaps)
        finally:
            counted["gaps"] += len(self._values) - before
    monkeypatch.setattr(correlated_gshm._Table, "__call__", counting)
    return counted


def _spec(tmp_path, noise, epsilon):
    data = write_parquet(tmp_path / "words.parquet", words_table())
    path, _ = write_spec(str(tmp_path), data, max_keys_per_user=4, noise=noise)
    with open(path, encoding="utf-8") as handle:
        doc = yaml.safe_load(handle)
    doc["privacy"]["epsilon"] = epsilon
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle)
    return path


def test_correlated_noise_at_epsilon_0_001_is_refused_before_any_table(tmp_path, table_work,
                                                                        monkeypatch):
    monkeypatch.setenv("THRESHER_CACHE_DIR", "off")
    code, _, err = run_cli("plan", _spec(tmp_path, "correlated", 0.001))
    assert_clean_error(code, err, "privacy.epsilon", "noise: correlated", "planning limit")
    assert table_work["gaps"] == 0
    # the advice is a release epsilon that fits: its smallest sigma is within the limit
    need = float(re.search(r"use a release epsilon >= ([0-9.e+-]+)", err).group(1))
    from thresher.accounting import gshm
    assert gshm.default_sigma(need, 1e-8, 4) <= correlated_gshm.max_sigma(4)
    assert gshm.default_sigma(need / 1.05, 1e-8, 4) > correlated_gshm.max_sigma(4)


def test_auto_noise_at_epsilon_0_001_plans_discrete_gaussian_without_correlated_work(
        tmp_path, table_work, monkeypatch):
    monkeypatch.setenv("THRESHER_CACHE_DIR", "off")
    code, out, err = run_cli("plan", "--json", _spec(tmp_path, "auto", 0.001))
    assert code == 0, err
    mech = json.loads(out)["mechanism"]
    assert mech["noise_auto"]["chosen"] == "discrete_gaussian"
    assert set(mech["noise_auto"]["release_points"]) == {"discrete_gaussian"}
    assert table_work["gaps"] == 0


def test_the_limit_is_the_work_bound_of_the_calibration():
    """max_sigma(C) solves sigma (sigma + WORK_PER_KEY C) = MAX_WORK (checked by substituting
    it back), and falls as C grows."""
    for c in (1, 4, 16, 1024):
        s = correlated_gshm.max_sigma(c)
        assert s * (s + correlated_gshm.WORK_PER_KEY * c) == pytest.approx(
            correlated_gshm.MAX_WORK, rel=1e-12)
    assert correlated_gshm.max_sigma(1024) < correlated_gshm.max_sigma(4) < 1000

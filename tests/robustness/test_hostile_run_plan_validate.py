"""Issue 30's defects of ``run``, ``plan`` and ``validate`` through the real CLI.

Every case runs ``pipelines.cli.main`` in a child interpreter (``tests.robustness.cli_driver``:
3 GB address-space cap, a 60 s alarm per case as a hang guard -- a hung case ends as
"timeout" and fails its exit-code check) and must end with exit code 0 or 2, a message
naming the field, file or flag, no traceback, no "internal error", and nothing left
beside the output folder (``test_hostile_corpus.Case.verify``). docs/robustness.md lists
which test covers each case; the earlier corpora (test_hostile_corpus.py,
test_hostile_inputs.py) hold issue 18's cases under the same checks.
"""
import math
import os
import sqlite3
import subprocess

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.robustness.cli_driver import run_batch
from tests.robustness.test_hostile_corpus import Case, _words


def _amounts(folder, extreme=None):
    """300 users with 3 words each and an int64 ``amount``; ``extreme`` at row 6 (1-based)."""
    rng = np.random.default_rng(0)
    n = 900
    amount = rng.integers(0, 100, size=n).astype(np.int64)
    if extreme is not None:
        amount[5] = extreme
    pq.write_table(pa.table({"user_id": [f"u{i // 3}" for i in range(n)],
                             "word": [f"w{i % 7}" for i in range(n)],
                             "amount": pa.array(amount, pa.int64()),
                             "x": rng.random(n)}),
                   os.path.join(folder, "in.parquet"))


def _int64_max(folder):
    _amounts(folder, extreme=np.iinfo(np.int64).max)


def _repeated_header(folder):
    with open(os.path.join(folder, "in.csv"), "w", encoding="utf-8") as handle:
        handle.write("user_id,word,word\n")
        for i in range(300):
            handle.write(f"u{i // 3},w{i % 5},x\n")


def _repeated_unused_column(folder):
    with open(os.path.join(folder, "in.csv"), "w", encoding="utf-8") as handle:
        handle.write("user_id,word,extra,extra\n")
        for i in range(900):
            handle.write(f"u{i // 3},w{i % 5},a,b\n")


def _csv_input(name):
    def text(folder, spec):
        import yaml
        spec = dict(spec, input={**spec["input"], "path": os.path.join(folder, name),
                                 "format": "csv"})
        return yaml.safe_dump(spec)
    return text


def _ledger_of_another_shape(folder):
    _words(folder)
    conn = sqlite3.connect(os.path.join(folder, "ledger.sqlite"))
    conn.executescript("CREATE TABLE datasets (name TEXT, total REAL);"
                       "CREATE TABLE releases (id INTEGER, what TEXT);")
    conn.close()


def _ledger_not_sqlite(folder):
    _words(folder)
    with open(os.path.join(folder, "ledger.sqlite"), "wb") as handle:
        handle.write(b"this is not a database\n" * 100)


def _with_ledger(folder_name):
    def text(folder, spec):
        import yaml
        spec = dict(spec, budget={"ledger": os.path.join(folder, folder_name), "dataset": "d",
                                  "epsilon": 3.0, "delta": 1e-6})
        return yaml.safe_dump(spec)
    return text


SUM_AUTO = [{"column": "amount", "statistic": "sum", "clip": "auto"}]
QUANTILE_INF = {"input": {"keys": []}, "bounding": {"max_keys_per_user": 1},
                "mechanism": {"kind": "quantiles", "column": "x", "ranks": [0.5],
                              "domain": [-1.0e308, 1.0e308]}}

# name, command, data, spec sections, text, expected code, needles
CASES = [
    # D1: a stage taking all of privacy.epsilon hung plan, validate and run
    *[(f"d1_clip_stage_takes_all_{cmd}", cmd, _amounts,
       {"aggregates": SUM_AUTO, "aggregates_auto": {"epsilon": 1.0}}, None, 2,
       ("aggregates_auto.epsilon", "privacy.epsilon", "leaving the release no epsilon"))
      for cmd in ("plan", "validate", "run")],
    ("d1_two_stages_take_all", "plan", _amounts,
     {"aggregates": SUM_AUTO, "aggregates_auto": {"epsilon": 0.5},
      "bounding": {"max_keys_per_user": "auto", "auto": {"epsilon": 0.5}}}, None, 2,
     ("bounding.auto.epsilon (0.5) + aggregates_auto.epsilon (0.5)",)),
    # a sliver left: the planning limits answer (in seconds) instead of looping
    ("d1_sliver_left_for_the_release", "plan", _amounts,
     {"aggregates": SUM_AUTO, "aggregates_auto": {"epsilon": 0.9999999}}, None, 2,
     ("privacy.epsilon", "release stage 1e-07")),
    # D2: a stage above the total was an internal BudgetExceededError
    *[(f"d2_clip_stage_above_total_{cmd}", cmd, _amounts,
       {"aggregates": SUM_AUTO, "aggregates_auto": {"epsilon": 5.0}}, None, 2,
       ("aggregates_auto.epsilon (5)", "privacy.epsilon (1)")) for cmd in ("plan", "run")],
    # D3: int64's maximum in a value column (ArrowInvalid): the nearest float64, clipped
    ("d3_int64_max_value", "run", _int64_max,
     {"aggregates": [{"column": "amount", "statistic": "sum", "clip": [0, 100]}]}, None, 0, ()),
    # D4: sampling_rate 1e-300 overflowed the accounting
    *[(f"d4_sampling_rate_1e-300_{kind}", "plan", None,
       {"mechanism": {"kind": kind, "sampling_rate": 1e-300, **extra}, **more}, None, 2,
       ("mechanism.sampling_rate", "1e-12"))
      for kind, extra, more in (
          ("sample_and_threshold", {}, {}),
          ("heavy_hitters", {"prefix_lengths": [None]}, {}),
          ("quantiles", {"column": "x", "ranks": [0.5], "domain": [0, 1]},
           {"input": {"keys": []}, "bounding": {"max_keys_per_user": 1}}))],
    ("d4_sampling_rate_1e-300_validate", "validate", _words,
     {"mechanism": {"kind": "sample_and_threshold", "sampling_rate": 1e-300}}, None, 2,
     ("mechanism.sampling_rate",)),
    # D5: an overflowing quantile domain released inf and wrote "resolution": Infinity
    *[(f"d5_quantile_domain_overflows_{cmd}", cmd, _amounts, QUANTILE_INF, None, 2,
       ("mechanism.domain", "finite width")) for cmd in ("plan", "validate", "run")],
    ("d5_quantile_resolution_underflows", "plan", None,
     {**QUANTILE_INF, "mechanism": {**QUANTILE_INF["mechanism"], "domain": [0, 1e-320]}},
     None, 2, ("mechanism.domain", "resolution")),
    # D8: a ledger whose tables have another shape, or no SQLite file at all
    ("d8_ledger_of_another_shape", "run", _ledger_of_another_shape, {},
     _with_ledger("ledger.sqlite"), 2,
     ("budget.ledger", "ledger.sqlite", "not a thresher ledger", "lacks the columns")),
    ("d8_ledger_not_a_database", "run", _ledger_not_sqlite, {}, _with_ledger("ledger.sqlite"),
     2, ("budget.ledger", "ledger.sqlite", "not a usable ledger")),
    # D14: a CSV header that repeats a column name (KeyError)
    *[(f"d14_repeated_header_{cmd}", cmd, _repeated_header, {}, _csv_input("in.csv"), 2,
       ("input.keys[0]", "'word' appears 2 times", "in.csv")) for cmd in ("validate", "run")],
    ("d14_repeated_unused_column_runs", "run", _repeated_unused_column, {},
     _csv_input("in.csv"), 0, ()),
]


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("issue30"))
    cases = [Case(root, name, command=command, data=data, spec=spec, text=text, code=code,
                  needles=needles)
             for name, command, data, spec, text, code, needles in CASES]
    out = run_batch([c.argv() for c in cases])
    return dict(zip([c.name for c in cases], zip(cases, out)))


@pytest.mark.parametrize("name", [c[0] for c in CASES])
def test_case(results, name):
    case, result = results[name]
    case.verify(result)
    if name == "d3_int64_max_value":
        table = pq.read_table(os.path.join(case.output, "released.parquet"))
        assert "amount_sum" in table.column_names and table.num_rows > 0
        assert all(math.isfinite(v) for v in table.column("amount_sum").to_pylist())


def test_ledger_on_a_read_only_mount_is_refused(tmp_path):
    """D9: an existing ledger on a read-only file system (a read-only bind mount of its
    folder in a private mount namespace, as root too) -> exit 2 naming budget.ledger."""
    root = str(tmp_path)
    case = Case(root, "d9", command="run", data=_words, text=_with_ledger("ro/ledger.sqlite"))
    folder = os.path.join(case.folder, "ro")
    os.makedirs(folder)
    conn = sqlite3.connect(os.path.join(folder, "ledger.sqlite"))   # an existing, empty ledger
    from thresher.pipelines.ledgers.sqlite_backend import _SCHEMA
    conn.executescript(_SCHEMA)
    conn.close()
    case.before = set(os.listdir(case.folder))
    case.needles = ("budget.ledger", "ledger.sqlite", "read-only")
    mount = f"mount --bind {folder} {folder} && mount -o remount,bind,ro {folder}"
    try:
        probe = subprocess.run(["unshare", "-m", "sh", "-c", mount], capture_output=True,
                               text=True)
    except FileNotFoundError:
        assert not os.environ.get("CI"), "unshare is not installed"  # Debian: required
        pytest.skip("unshare is not installed")
    if probe.returncode != 0:
        pytest.skip(f"cannot make a read-only mount here: {probe.stderr.strip()}")
    prefix = ("unshare", "-m", "sh", "-c", f'{mount} && exec "$0" "$@"')
    result, = run_batch([case.argv()], prefix=prefix)
    case.verify(result)


def test_planning_searches_are_bounded_whatever_their_input():
    """Defence in depth for D1: the searches end after a bounded number of calls even for
    a start of 0, a subnormal, NaN or a predicate that is never true."""
    from thresher.accounting.search import smallest_real
    from thresher.pipelines.common import limits
    calls = []

    def never(x):
        calls.append(x)
        # an unbounded search fails here (it looped forever, growing this list, on main)
        assert len(calls) <= 10_000, f"{len(calls)} calls: the search is not bounded"
        return False
    for start in (0.0, 5e-324, math.nan, math.inf, -1.0, 1e-300):
        calls.clear()
        assert math.isnan(limits._smallest(never, start))
        assert len(calls) <= limits._DOUBLINGS_MAX + limits._BISECTIONS_MAX
    assert limits._smallest(lambda e: e >= 0.5, 0.01) == pytest.approx(0.5, rel=0.011)
    for low in (math.nan, 0.0, 5e-324):
        calls.clear()
        assert smallest_real(never, low, math.inf) is None
        assert len(calls) <= 1100


def test_a_report_with_a_non_finite_number_is_refused_by_the_writer(tmp_path):
    """D5's second half: the report writer emits strict JSON (no NaN/Infinity) or refuses,
    naming the field; and the session check (tests/conftest.py) finds a non-strict report."""
    from thresher.pipelines.dataio import publish
    from thresher.pipelines.errors import ThresherError
    from tests.conftest import non_strict_reports
    with pytest.raises(ThresherError, match=r"mechanism\.resolution is not a finite number"):
        publish.write_json(str(tmp_path / "release_report.json"),
                           {"mechanism": {"resolution": math.inf}})
    assert not (tmp_path / "release_report.json").exists()
    publish.write_json(str(tmp_path / "release_report.json"), {"a": [1.0, {"b": 2}]})
    assert non_strict_reports(str(tmp_path)) == []
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "release_report.json").write_text('{"resolution": Infinity}')
    assert [p for p, _ in non_strict_reports(str(tmp_path))] == [
        str(tmp_path / "bad" / "release_report.json")]
    os.remove(tmp_path / "bad" / "release_report.json")   # the session check scans tmp dirs

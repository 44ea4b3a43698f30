"""The ledger's composition modes (issue 35; pipelines/ledgers/composition.py): ``zcdp``
admits releases by their (rho, delta0) records against rho_B and delta0_B, ``basic`` by
(epsilon, delta); modes and delta0_B are fixed with the dataset; older ledgers are
migrated; running sums follow reservations, abandons and operator releases; plan,
validate, refusals, ``ledger show`` and the report say what a release costs in both
modes. Real CLI, real SQLite."""
import json
import sqlite3

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.cli import main
from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import ledger, records
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod

from tests.pipelines.conftest import QUICKSTART_DATA


@pytest.fixture
def data(tmp_path):
    table = pq.read_table(QUICKSTART_DATA).slice(0, 3000)
    pq.write_table(table, tmp_path / "tiny.parquet")
    words = sorted(set(table.column("word").to_pylist()))[:40]
    pq.write_table(pa.table({"word": words}), tmp_path / "domain.parquet")
    return tmp_path


def _spec(tmp_path, name, mode, *, public_keys=True, total=3.5, total_delta=1e-5,
          threshold_delta=None, out=None):
    budget = {"ledger": str(tmp_path / f"{mode}.sqlite"), "dataset": "ds", "epsilon": total,
              "delta": total_delta, "composition": mode}
    if threshold_delta is not None:
        budget["threshold_delta"] = threshold_delta
    spec = {"name": name,
            "input": {"path": str(tmp_path / "tiny.parquet"), "user": "user_id",
                      "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-6},
            "bounding": {"max_keys_per_user": 1},
            "mechanism": {"kind": "gaussian"},
            "output": {"path": str(out or tmp_path / f"out-{name}")},
            "budget": budget}
    if public_keys:
        spec["input"]["public_keys"] = {"path": str(tmp_path / "domain.parquet")}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump(spec))
    return str(path)


def _plan(path):
    text = open(path).read()
    return make_plan(spec_mod.parse(yaml.safe_load(text), source_text=text))


def _run(args, capsys):
    code = main(args)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


@pytest.mark.slow       # fifteen CLI releases: ~60 s
def test_ten_gaussian_releases_fit_zcdp_where_basic_fits_three(data, capsys):
    """The issue's done-when: (3.5, 1e-5), zcdp with threshold_delta 0, public keys
    (no threshold, delta0 0), C = 1, releases at (1, 1e-6): exactly ten admitted, the
    eleventh refused (exit 2 naming budget, spent/requested/remaining printed, nothing
    published); basic composition with the same budget admits three."""
    codes = []
    for i in range(11):
        spec = _spec(data, f"z{i}", "zcdp", threshold_delta=0)
        codes.append(_run(["run", spec], capsys))
    assert [c for c, _, _ in codes] == [0] * 10 + [2], [c[2][-300:] for c in codes]
    refusal = codes[10][2]
    assert ("thresher: error: budget: dataset 'ds' (zcdp composition) has spent "
            "rho=0.279") in refusal
    for part in ("this release needs epsilon=1, delta=1e-06 under basic composition; "
                 "rho=0.0279", "remaining rho=0.0155", "nothing was read or published"):
        assert part in refusal, refusal
    assert not (data / "out-z10").exists()
    shown = json.loads(_run(["ledger", "show", str(data / "zcdp.sqlite"), "--json"], capsys)[1])
    assert shown["composition"] == "zcdp" and len(shown["releases"]) == 10
    assert 3.39 < shown["spent"]["epsilon"] <= 3.5       # the converted epsilon
    assert shown["zcdp"]["delta0_spent"] == 0.0
    report = json.loads((data / "out-z0" / "release_report.json").read_text())
    assert report["privacy"]["zcdp"]["rho"] == shown["releases"][0]["rho"]
    # the ledger's converted epsilon against dp_accounting's RdpAccountant on the same
    # ten Gaussian mechanisms: never above it, within 1e-2
    dp_accounting = pytest.importorskip("dp_accounting")
    accountant = dp_accounting.rdp.RdpAccountant()
    accountant.compose(dp_accounting.GaussianDpEvent(report["mechanism"]["sigma"]), 10)
    theirs = accountant.get_epsilon(1e-5)
    assert theirs - 1e-2 <= shown["spent"]["epsilon"] <= theirs

    basic = [_run(["run", _spec(data, f"b{i}", "basic")], capsys)[0] for i in range(4)]
    assert basic == [0, 0, 0, 2]


def test_thresholded_gaussian_under_the_default_split(data):
    """The second done-when line, from the stored records: a thresholded gaussian at
    (1, 1e-6), C = 1, with the default split (delta0_B = delta/2 = 5e-6) is charged rho
    0.02793 and delta0 5.97e-7, so the dataset admits 8 (delta0_B binds: 8 x 5.97e-7 <=
    5e-6 < 9 x) where basic composition admits 3. Reserved through the real ledger."""
    plan = _plan(_spec(data, "t", "zcdp", public_keys=False))
    rho, delta0 = records.privacy_record(plan)
    totals = comp.Totals.of_spec(plan.spec.budget)
    assert totals.delta0 == comp.dec("0.000005")
    expected = min(int(totals.rho / rho), int(totals.delta0 / delta0))
    assert expected == 8 and int(totals.rho / rho) == 9
    admitted = 0
    for _ in range(expected + 1):
        try:
            ledger.reserve(plan)
            admitted += 1
        except Exception as exc:      # the ninth: refused naming budget
            assert str(exc).startswith("budget: ") and "delta0=" in str(exc)
    assert admitted == 8


def test_plan_and_validate_print_both_modes_and_what_remains(data, capsys):
    spec = _spec(data, "p", "zcdp", threshold_delta=0)
    code, out, _ = _run(["plan", spec], capsys)
    text = " ".join(out.split())
    assert code == 0
    assert "this release costs epsilon=1, delta=1e-06 under basic composition; rho=0.0279" in text
    assert "under zcdp; after it rho=0.266" in text
    code, out, _ = _run(["validate", _spec(data, "v", "basic")], capsys)
    assert code == 0 and "after it epsilon=2.5, delta=9e-06 remain" in out


def test_a_dataset_cannot_switch_modes_or_its_threshold_delta(data, capsys):
    spec = _spec(data, "a", "zcdp")
    plan = _plan(spec)
    ledger.reserve(plan)
    other = _spec(data, "b", "basic")
    # the same ledger file, the other mode
    doc = yaml.safe_load(open(other).read())
    doc["budget"]["ledger"] = str(data / "zcdp.sqlite")
    open(other, "w").write(yaml.safe_dump(doc))
    code, _, err = _run(["run", other], capsys)
    assert code == 2 and ("thresher: error: budget.composition: dataset 'ds' composes by "
                          "zcdp") in err
    code, out, err = _run(["validate", other], capsys)
    assert code == 2 and "budget.composition" in err + out
    changed = _spec(data, "c", "zcdp", threshold_delta=1e-6)
    code, _, err = _run(["run", changed], capsys)
    assert code == 2 and ("thresher: error: budget.threshold_delta: dataset 'ds' has "
                          "delta0_B=5e-06") in err
    assert len(ledger.summary(str(data / "zcdp.sqlite"))[0]["releases"]) == 1


@pytest.mark.parametrize("section,message", [
    ({"composition": "zcdp", "threshold_delta": 1e-5}, "budget.threshold_delta: must be in "
                                                       "[0, budget.delta)"),
    ({"composition": "basic", "threshold_delta": 0}, "budget.threshold_delta: applies to "
                                                     "composition: zcdp only"),
    ({"composition": "rdp"}, "budget.composition"),
])
def test_bad_composition_fields_are_refused_by_name(data, capsys, section, message):
    spec = _spec(data, "x", "zcdp")
    doc = yaml.safe_load(open(spec).read())
    doc["budget"].update(section)
    open(spec, "w").write(yaml.safe_dump(doc))
    code, out, err = _run(["validate", spec], capsys)
    assert code == 2 and message in err, err


def test_running_sums_follow_abandon_and_operator_release(data):
    plan = _plan(_spec(data, "s", "zcdp"))
    first = ledger.reserve(plan)
    first.publishing()
    first.commit("out")
    rho, delta0 = records.privacy_record(plan)
    second = ledger.reserve(plan)
    second.abandon()                        # deleted: its charge comes off the sums
    third = ledger.reserve(plan)
    ledger.release_reservation(str(data / "zcdp.sqlite"), third.row_id, force=True)
    shown = ledger.summary(str(data / "zcdp.sqlite"))[0]
    assert "warning" not in shown            # the running sums equal the releases' sums
    assert shown["zcdp"]["rho_spent"] == float(rho)
    assert shown["zcdp"]["delta0_spent"] == float(delta0)
    conn = sqlite3.connect(str(data / "zcdp.sqlite"))
    row = conn.execute("SELECT spent_rho, spent_delta0, spent_epsilon FROM datasets").fetchone()
    assert (comp.dec(row[0]), comp.dec(row[1]), comp.dec(row[2])) == (rho, delta0, comp.dec(1.0))
    # a hand edit of the sums is reported by ledger show
    conn.execute("UPDATE datasets SET spent_rho = '0'")
    conn.commit()
    conn.close()
    assert "differ from the sums of its releases" in ledger.summary(
        str(data / "zcdp.sqlite"))[0]["warning"]


_OLD_SCHEMA = """
CREATE TABLE datasets (dataset TEXT PRIMARY KEY, epsilon TEXT NOT NULL, delta TEXT NOT NULL,
                       created TEXT NOT NULL);
CREATE TABLE releases (id INTEGER PRIMARY KEY AUTOINCREMENT,
    dataset TEXT NOT NULL REFERENCES datasets(dataset), name TEXT NOT NULL,
    epsilon TEXT NOT NULL, delta TEXT NOT NULL, config_sha256 TEXT NOT NULL,
    state TEXT NOT NULL, reserved_at TEXT NOT NULL, finished_at TEXT, output TEXT,
    host TEXT, pid INTEGER);
INSERT INTO datasets VALUES ('ds', '3.5', '1e-05', '2026-01-01T00:00:00Z');
INSERT INTO releases (dataset, name, epsilon, delta, config_sha256, state, reserved_at)
    VALUES ('ds', 'old1', '1.0', '1E-6', 'x', 'published', '2026-01-01T00:00:00Z'),
           ('ds', 'old2', '0.5', '1E-6', 'x', 'published', '2026-01-01T00:00:00Z');
"""


def test_an_older_ledger_is_read_as_is_and_migrated_when_written(data, capsys):
    path = data / "basic.sqlite"
    conn = sqlite3.connect(str(path))
    conn.executescript(_OLD_SCHEMA)
    conn.close()
    shown = ledger.summary(str(path))[0]          # read only: nothing altered
    assert shown["composition"] == "basic" and shown["spent"]["epsilon"] == 1.5
    assert [r["rho"] for r in shown["releases"]] == [None, None]
    code, _, err = _run(["run", _spec(data, "new", "basic")], capsys)
    assert code == 0, err
    shown = ledger.summary(str(path))[0]
    assert shown["spent"] == {"epsilon": 2.5, "delta": 3e-6}
    assert [r["name"] for r in shown["releases"]] == ["old1", "old2", "new"]
    assert shown["releases"][2]["rho"] > 0 and shown["zcdp"]["rho_spent"] is None
    # and a zcdp spec on this old (basic) dataset is a mode switch
    doc = yaml.safe_load(open(_spec(data, "z", "zcdp")).read())
    doc["budget"]["ledger"] = str(path)
    (data / "z.yaml").write_text(yaml.safe_dump(doc))
    code, _, err = _run(["run", str(data / "z.yaml")], capsys)
    assert code == 2 and "budget.composition" in err


def test_an_older_ledger_that_cannot_be_altered_is_refused_naming_the_table(data, capsys):
    """Its releases 'table' is a view (ALTER TABLE fails): exit 2 naming the table,
    nothing lost."""
    path = data / "basic.sqlite"
    conn = sqlite3.connect(str(path))
    conn.executescript(_OLD_SCHEMA.replace("CREATE TABLE releases", "CREATE TABLE rel0")
                       .replace("INSERT INTO releases", "INSERT INTO rel0")
                       + "CREATE VIEW releases AS SELECT * FROM rel0;")
    conn.close()
    code, _, err = _run(["run", _spec(data, "new", "basic")], capsys)
    assert code == 2 and "its table 'releases' cannot be given the columns" in err, err
    conn = sqlite3.connect(str(path))
    assert conn.execute("SELECT count(*) FROM rel0").fetchone() == (2,)
    conn.close()


def _conversion_epsilon(rho, delta):
    """dp_accounting's RDP-to-(epsilon, delta) conversion of rho-zCDP (RDP alpha rho) on a
    dense grid of orders: an epsilon independent of accounting.zcdp."""
    import numpy as np
    from dp_accounting.rdp import rdp_privacy_accountant
    orders = 1.0 + np.logspace(-4, 4, 40001)
    return rdp_privacy_accountant.compute_epsilon(orders, orders * rho, delta)[0]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_zcdp_filter_counts_the_new_release(tmp_path, seed):
    """Issue 42: an adaptive sequence of releases (the next chosen from what the ledger
    showed) against one zcdp dataset, through ``reserve_charge`` on real SQLite. Every
    admission must equal the filter computed here with exact fractions -- sum rho + rho_new
    <= rho_B and sum delta0 + delta0_new <= delta0_B -- and the admitted rho must convert
    within the dataset's epsilon by dp_accounting's RDP conversion (independent of
    accounting.zcdp). A filter comparing the spent sums without the new release's admits
    one release past the budget and fails both. Deterministic (fixed seeds); default suite
    (the concurrent property tests of test_ledger_filter_property.py are slow)."""
    import random
    from fractions import Fraction
    pytest.importorskip("dp_accounting")
    budget = ledger.BudgetSpec(ledger=str(tmp_path / "f.sqlite"), dataset="ds", epsilon=2.0,
                               delta=1e-5, composition=comp.ZCDP, threshold_delta=4e-6)
    totals = comp.Totals.of_spec(budget)
    rho_b, delta0_b = Fraction(totals.rho), Fraction(totals.delta0)
    spent_rho, spent_delta0 = Fraction(0), Fraction(0)
    decisions, seen = [], "nothing"
    for step in range(14):
        rng = random.Random(f"{seed}/{step}/{seen}")
        # charges of 5-45 % of rho_B and 0-40 % of delta0_B, 12 significant digits
        rho = comp.dec(f"{float(rho_b) * rng.uniform(0.05, 0.45):.11e}")
        delta0 = comp.dec(f"{float(delta0_b) * rng.choice([0, 0.1, 0.25, 0.4]):.11e}")
        charge = comp.Charge(comp.dec(1.0), comp.dec(1e-6), rho, delta0)
        fits = (spent_rho + Fraction(rho) <= rho_b
                and spent_delta0 + Fraction(delta0) <= delta0_b)
        try:
            ledger.reserve_charge(budget, f"r{step}", "0" * 64, charge)
            admitted = True
        except SpecError as exc:
            assert exc.field == "budget"
            admitted = False
        decisions.append((step, admitted, fits))
        assert admitted == fits, decisions
        if admitted:
            spent_rho += Fraction(rho)
            spent_delta0 += Fraction(delta0)
        seen = repr(ledger.summary(budget.ledger, budget.dataset)[0]["zcdp"].get("rho_spent"))
    assert any(not a for _, a, _ in decisions)            # the budget was reached
    assert spent_delta0 <= Fraction(comp.dec(4e-6))
    assert _conversion_epsilon(float(spent_rho), 1e-5 - 4e-6) <= 2.0 * (1 + 1e-6)

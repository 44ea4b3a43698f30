"""The ledger on a real PostgreSQL server (``budget.ledger: postgresql://...``), started in
the test from Debian's packages (initdb, pg_ctl; run as ``nobody`` when the tests run as
root): releases charged across runs, the third refused past the total, ``ledger show URL
--json``, and concurrent reservations decided by a row lock -- with real processes."""
import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import tempfile

import pytest
import yaml

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import ledger
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.cli import main
from thresher.pipelines.planning.plan import make_plan

from tests.pipelines.ledgers.ledger_race import assert_exactly_two_reserved, race
from tests.pipelines.ledgers.test_ledger import _cli, _finish, _spec_text, tiny  # noqa: F401

if os.environ.get("CI"):   # the dev extra installs it: CI never skips the server tests
    import psycopg
else:
    psycopg = pytest.importorskip("psycopg", reason="the postgres extra (psycopg) is not installed")


def _bindir():
    found = shutil.which("initdb")
    if found:
        return os.path.dirname(found)
    dirs = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"))
    return os.path.dirname(dirs[-1]) if dirs else None


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _plan_for(tmp_path, data, url, name, **kw):
    text = _spec_text(name, data, tmp_path / name, url, **kw)
    return make_plan(spec_mod.parse(yaml.safe_load(text), source_text=text))


@pytest.fixture(scope="module")
def server():
    """A PostgreSQL server on 127.0.0.1 for this module; yields its base URL."""
    bindir = _bindir()
    assert bindir is not None or not os.environ.get("CI"), \
        "CI must have the PostgreSQL server: .ci/run installs it"
    if bindir is None:
        pytest.skip("the PostgreSQL server binaries (initdb, pg_ctl) are not installed "
                    "(Debian: apt-get install postgresql)")
    base = tempfile.mkdtemp(prefix="thresher-pg-")
    os.chmod(base, 0o755)
    prefix = []
    if os.geteuid() == 0:           # the server refuses to run as root
        nobody = pwd.getpwnam("nobody")
        os.chown(base, nobody.pw_uid, nobody.pw_gid)
        prefix = ["runuser", "-u", "nobody", "--"]
    data, port = os.path.join(base, "data"), _free_port()
    subprocess.run([*prefix, os.path.join(bindir, "initdb"), "-D", data, "-U", "thresher",
                    "--auth=trust", "-E", "UTF8", "--no-sync"],
                   check=True, capture_output=True, timeout=120)
    subprocess.run([*prefix, os.path.join(bindir, "pg_ctl"), "-D", data, "-l",
                    os.path.join(base, "server.log"), "-w", "-t", "60", "-o",
                    f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off", "start"],
                   check=True, capture_output=True, timeout=120)
    try:
        yield f"postgresql://thresher@127.0.0.1:{port}"
    finally:
        subprocess.run([*prefix, os.path.join(bindir, "pg_ctl"), "-D", data, "-m", "immediate",
                        "stop"], capture_output=True, timeout=120)
        shutil.rmtree(base, ignore_errors=True)


@pytest.fixture
def url(server, request):
    """A fresh database on the server for one test."""
    name = "t_" + request.node.name.lower().replace("[", "_").replace("]", "")[:50]
    with psycopg.connect(f"{server}/postgres", autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}"')
        conn.execute(f'CREATE DATABASE "{name}"')
    return f"{server}/{name}"


@pytest.mark.slow      # three CLI runs: ~30 s
def test_three_releases_at_one_against_two_and_a_half(tmp_path, tiny, url):  # noqa: F811
    codes = []
    for i in range(3):
        spec = tmp_path / f"r{i}.yaml"
        spec.write_text(_spec_text(f"r{i}", tiny, tmp_path / f"out{i}", url))
        codes.append(_finish(_cli(["run", str(spec)], tmp_path)))
    assert [c for c, _, _ in codes] == [0, 0, 2], codes
    assert codes[2][2].startswith("thresher: error: budget:") and "Traceback" not in codes[2][2]
    assert not (tmp_path / "out2").exists()
    code, out, err = _finish(_cli(["ledger", "show", url, "--json"], tmp_path))
    assert code == 0, err
    shown = json.loads(out)
    assert shown["dataset"] == "ds" and shown["budget"] == {"epsilon": 2.5, "delta": 1e-6}
    assert shown["spent"] == {"epsilon": 2.0, "delta": 2e-8}
    assert [(r["name"], r["state"]) for r in shown["releases"]] == [("r0", "published"),
                                                                    ("r1", "published")]
    for i, r in enumerate(shown["releases"]):
        assert r["config_sha256"] == json.loads(
            (tmp_path / f"out{i}" / "release_report.json").read_text())["config_sha256"]
    # The rows are in the server's tables (not a file named like the URL).
    with psycopg.connect(url) as conn:
        rows = conn.execute("SELECT name, state FROM releases ORDER BY id").fetchall()
    assert rows == [("r0", "published"), ("r1", "published")]
    assert not [p for p in os.listdir(tmp_path) if "postgresql" in p]


@pytest.mark.slow      # two CLI runs at once: ~18 s
def test_two_concurrent_runs_with_room_for_one(tmp_path, tiny, url):  # noqa: F811
    for i in range(2):
        (tmp_path / f"c{i}.yaml").write_text(
            _spec_text(f"c{i}", tiny, tmp_path / f"out{i}", url, total=1.5))
    procs = [_cli(["run", str(tmp_path / f"c{i}.yaml")], tmp_path) for i in range(2)]
    results = [_finish(p) for p in procs]
    assert sorted(c for c, _, _ in results) == [0, 2], results
    assert "budget:" in next(r for r in results if r[0] == 2)[2]
    assert len([i for i in range(2) if (tmp_path / f"out{i}").exists()]) == 1
    shown = ledger.summary(url)[0]
    assert shown["spent"]["epsilon"] == 1.0
    assert [r["state"] for r in shown["releases"]] == ["published"]


def _reserve_forked(plan, barrier, results):
    barrier.wait()
    try:
        ledger.reserve(plan)
        results.put("reserved")
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put(f"refused: {exc}")


def test_reservations_race_on_the_row_lock(tmp_path, tiny, url):  # noqa: F811
    """Six processes reserve at the same instant, on a dataset not yet in the ledger (the
    tables are not even created), with room for two: exactly two get it. (Forked with the
    plan made here, so the race is between the reservations alone.)"""
    plan = _plan_for(tmp_path, tiny, url, "race", total=2.5)
    outcomes = race("fork", _reserve_forked, plan)
    assert_exactly_two_reserved(outcomes, url)


def test_refusal_releases_and_commit_keeps(tmp_path, tiny, url, capsys):  # noqa: F811
    """reserve / abandon / commit on the server: an abandoned reservation is deleted, a
    committed one stays; exact decimal sums (ten at 0.1 fill 1.0); ``ledger show URL
    --json``."""
    def plan(name):
        return _plan_for(tmp_path, tiny, url, name, dataset="dec", epsilon=0.1, total=1.0)
    ledger.reserve(plan("gone")).abandon()
    for i in range(10):
        ledger.reserve(plan(f"d{i}")).commit("o")
    with pytest.raises(ledger.SpecError, match="^budget:"):
        ledger.reserve(plan("d10"))
    shown = ledger.summary(url, "dec")[0]
    assert shown["spent"]["epsilon"] == 1.0 and len(shown["releases"]) == 10
    capsys.readouterr()
    assert main(["ledger", "show", url, "--json"]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["dataset"] == "dec" and printed["budget"] == {"epsilon": 1.0, "delta": 1e-6}
    assert printed["spent"]["epsilon"] == 1.0
    assert [r["name"] for r in printed["releases"]] == [f"d{i}" for i in range(10)]


def test_ledger_show_errors_name_the_server_without_its_password(server, capsys):
    bad = server.replace("thresher@", "thresher:s3cret@") + "/no_such_database"
    assert main(["ledger", "show", bad, "--json"]) == 2
    err = capsys.readouterr().err
    assert "cannot connect to the ledger" in err and "s3cret" not in err
    assert len(err.strip().splitlines()) == 1


def test_an_older_postgres_ledger_is_migrated_and_zcdp_datasets_work(url):
    """Tables of a ledger written before composition modes: the first write adds the new
    columns (nullable, rows kept) and folds the running sums once; a zcdp dataset then
    reserves and refuses by its records, on the server."""
    from thresher.pipelines.ledgers import composition as comp
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("CREATE TABLE datasets (dataset TEXT PRIMARY KEY, epsilon TEXT NOT NULL, "
                     "delta TEXT NOT NULL, created TEXT NOT NULL)")
        conn.execute("CREATE TABLE releases (id BIGSERIAL PRIMARY KEY, dataset TEXT NOT NULL "
                     "REFERENCES datasets(dataset), name TEXT NOT NULL, epsilon TEXT NOT NULL, "
                     "delta TEXT NOT NULL, config_sha256 TEXT NOT NULL, state TEXT NOT NULL, "
                     "reserved_at TEXT NOT NULL, finished_at TEXT, output TEXT, host TEXT, "
                     "pid INTEGER)")
        conn.execute("INSERT INTO datasets VALUES ('old', '3.0', '1e-06', 'x')")
        conn.execute("INSERT INTO releases (dataset, name, epsilon, delta, config_sha256, state, "
                     "reserved_at) VALUES ('old', 'r', '1.0', '1E-8', 'x', 'published', 'x')")
    charge = comp.Charge(comp.dec(1.0), comp.dec(1e-8), comp.dec("0.1"), comp.dec("1E-7"))
    old = ledger.BudgetSpec(ledger=url, dataset="old", epsilon=3.0, delta=1e-6)
    ledger.reserve_charge(old, "new", "0" * 64, charge)
    shown = ledger.summary(url, "old")[0]
    assert shown["spent"] == {"epsilon": 2.0, "delta": 2e-8} and "warning" not in shown
    assert [r["rho"] for r in shown["releases"]] == [None, 0.1]
    zcdp = ledger.BudgetSpec(ledger=url, dataset="z", epsilon=5.0, delta=1e-6,
                             composition="zcdp", threshold_delta=2.5e-7)
    for _ in range(2):
        ledger.reserve_charge(zcdp, "z", "0" * 64, charge)
    with pytest.raises(SpecError, match=r"^budget: dataset 'z' \(zcdp composition\) has spent "
                                        r"rho=0\.2 of rho_B=0\.[0-9]+ and delta0=2e-07"):
        ledger.reserve_charge(zcdp, "z", "0" * 64, charge)

"""The ledger's smaller defects of issue 42, each through the real CLI (in-process main):
messages for fields the spec left out, totals printed with every digit, control
characters escaped, a ledger server that does not answer, a read-only folder, a first
release abandoned before reading, ``ledger show FOLDER``."""
import os
import socket
import subprocess
import threading

import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import ledger, postgres_backend
from tests.robustness.conftest import run_cli

from tests.pipelines.conftest import QUICKSTART_DATA


@pytest.fixture
def tiny(tmp_path):
    path = tmp_path / "tiny.parquet"
    pq.write_table(pq.read_table(QUICKSTART_DATA).slice(0, 3000), path)
    return path


def _spec(tmp_path, data, ledger_path, name="r", keys=("word",), **budget):
    section = {"ledger": str(ledger_path), "dataset": "ds", "epsilon": 2.5, "delta": 1e-6,
               **budget}
    path = tmp_path / f"{name}.yaml"
    path.write_text(yaml.safe_dump({
        "name": name, "input": {"path": str(data), "user": "user_id", "keys": list(keys)},
        "privacy": {"epsilon": 1.0, "delta": 1e-8}, "bounding": {"max_keys_per_user": 4},
        "mechanism": {"kind": "gaussian"}, "output": {"path": str(tmp_path / f"out-{name}")},
        "budget": section}))
    return str(path)


def _charge():
    return comp.Charge(comp.dec(1.0), comp.dec(1e-8), comp.dec("0.02"), comp.dec("1E-9"))


def _clean(code, err, *needles):
    assert code == 2, err
    assert "Traceback" not in err and "internal error" not in err, err
    for needle in needles:
        assert needle in err, err


def test_a_left_out_composition_is_said_to_be_left_out(tmp_path):
    """Before: "the spec says basic" of a spec that says nothing about composition."""
    path = str(tmp_path / "l.sqlite")
    zcdp = ledger.BudgetSpec(ledger=path, dataset="ds", epsilon=2.5, delta=1e-6,
                             composition="zcdp")
    ledger.reserve_charge(zcdp, "r", "0" * 64, _charge()).commit("o")
    silent = ledger.BudgetSpec(ledger=path, dataset="ds", epsilon=2.5, delta=1e-6,
                               composition_given=False)
    with pytest.raises(ledger.SpecError, match="the spec leaves budget.composition out, which "
                                               "means basic"):
        ledger.reserve_charge(silent, "r", "0" * 64, _charge())
    said = ledger.BudgetSpec(ledger=path, dataset="ds", epsilon=2.5, delta=1e-6)
    with pytest.raises(ledger.SpecError, match="the spec says basic"):
        ledger.reserve_charge(said, "r", "0" * 64, _charge())
    other = ledger.BudgetSpec(ledger=path, dataset="ds", epsilon=2.5, delta=1e-6,
                              composition="zcdp", threshold_delta=1e-7)
    with pytest.raises(ledger.SpecError, match="the spec gives 1e-07"):
        ledger.reserve_charge(other, "r", "0" * 64, _charge())


def test_a_left_out_composition_through_the_cli(tmp_path, tiny):
    path = tmp_path / "l.sqlite"
    assert run_cli("run", _spec(tmp_path, tiny, path, "a", composition="zcdp"), "-q")[0] == 0
    code, _, err = run_cli("run", _spec(tmp_path, tiny, path, "b"), "-q")
    _clean(code, err, "budget.composition: ", "the spec leaves budget.composition out")
    code, _, err = run_cli("run", _spec(tmp_path, tiny, path, "c", composition="zcdp",
                                        threshold_delta=1e-7), "-q")
    _clean(code, err, "budget.threshold_delta: ", "the spec gives 1e-07")


def test_totals_are_printed_with_the_digits_that_tell_them_apart(tmp_path):
    """Before: a total of 1.0000001 printed as "1" (``%g``), the same as 1."""
    path = str(tmp_path / "l.sqlite")
    budget = ledger.BudgetSpec(ledger=path, dataset="ds", epsilon=1.0000001, delta=1.0000001e-6)
    ledger.reserve_charge(budget, "r", "0" * 64, comp.Charge(
        comp.dec(0.3333333), comp.dec(1e-8), comp.dec("0.02"), comp.dec("1E-9"))).commit("o")
    code, out, err = run_cli("ledger", "show", path)
    assert code == 0, err
    assert "spent epsilon 0.3333333 of 1.0000001, delta 1e-08 of 1.0000001e-06" in out


def test_control_characters_in_names_are_escaped_by_ledger_show(tmp_path):
    """Before: a dataset named with an escape sequence was written raw to the terminal."""
    path = str(tmp_path / "l.sqlite")
    budget = ledger.BudgetSpec(ledger=path, dataset="evil\x1b[2J\nname", epsilon=2.0,
                               delta=1e-6)
    ledger.reserve_charge(budget, "re\x07lease", "0" * 64, _charge()).commit("o\rut")
    code, out, err = run_cli("ledger", "show", path)
    assert code == 0, err
    assert "\x1b" not in out and "\x07" not in out and "\r" not in out
    assert "dataset evil\\x1b[2J\\nname:" in out and "re\\x07lease" in out and "o\\rut" in out


def test_a_ledger_server_that_never_answers_is_said_at_once(monkeypatch):
    """Before: 30 s of silence before the connection timed out. A listening socket that
    accepts and never answers; the timeout shortened to 3 s for the test."""
    pytest.importorskip("psycopg")
    monkeypatch.setattr(postgres_backend, "CONNECT_TIMEOUT_S", 3)
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(4)
    held = []
    stop = threading.Event()

    def accept():
        listener.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(listener.accept()[0])
            except OSError:
                pass

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        port = listener.getsockname()[1]
        code, _, err = run_cli("ledger", "show", f"postgresql://u:secret@127.0.0.1:{port}/db")
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        listener.close()
    _clean(code, err, "the server has not answered yet; waiting up to 3 s")
    assert "secret" not in err


def test_a_read_only_folder_for_a_new_ledger_is_named(tmp_path, tiny):
    """Before: "unable to open database file". A read-only file system (a root test
    process ignores a folder's mode bits), mounted for the test."""
    folder = tmp_path / "ro"
    folder.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=1m", "tmpfs", str(folder)],
                             capture_output=True)
    if mounted.returncode != 0:
        os.chmod(folder, 0o555)
        if os.access(folder, os.W_OK):
            pytest.skip("neither a read-only mount nor a read-only folder can be made here")
    try:
        code, _, err = run_cli("run", _spec(tmp_path, tiny, folder / "l.sqlite"), "-q")
    finally:
        if mounted.returncode == 0:
            subprocess.run(["umount", str(folder)], check=True)
    _clean(code, err, "budget.ledger: cannot create the ledger", "its folder is not writable")
    assert "unable to open database file" not in err


def test_no_new_dataset_is_announced_for_a_first_release_abandoned_before_reading(tmp_path,
                                                                                   tiny):
    """A first release refused by the budget it would create (zcdp, total 0.5 for a
    release of epsilon 1), or failing before reading (a key column the input lacks),
    leaves no dataset; before, the refused one said "new dataset" anyway. A published
    first release says it, with the ledger's absolute path."""
    path = tmp_path / "l.sqlite"
    code, _, err = run_cli("run", _spec(tmp_path, tiny, path, "z", composition="zcdp",
                                        epsilon=0.5))
    _clean(code, err, "budget: ")
    assert "new dataset" not in err
    code, _, err = run_cli("run", _spec(tmp_path, tiny, path, "a", keys=("nope",)), "-q")
    assert code == 2 and "nope" in err, err
    assert "new dataset" not in err
    assert ledger.summary(str(path)) == []
    code, _, err = run_cli("run", _spec(tmp_path, tiny, path, "b"))
    assert code == 0, err
    assert f"ledger {path}: new dataset 'ds' (basic composition)" in err


def test_ledger_show_of_a_folder_says_it_is_a_folder(tmp_path):
    (tmp_path / "ledgers").mkdir()
    ledger.reserve_charge(ledger.BudgetSpec(ledger=str(tmp_path / "ledgers" / "a.sqlite"),
                                            dataset="ds", epsilon=2.0, delta=1e-6),
                          "r", "0" * 64, _charge()).commit("o")
    for command in (["show"], ["reservations"]):
        code, _, err = run_cli("ledger", *command, tmp_path / "ledgers")
        _clean(code, err, "is a folder, not a ledger", "ledger files in it: a.sqlite")

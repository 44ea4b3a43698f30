"""Issue 36's command-line defects, through the real CLI in its own process (a user's
``python -m thresher.pipelines.cli``): an unknown Beam runner (D3), ``plan --users -1``
(D3), Ctrl-C during start-up (D14), a locked ledger that made ``run`` wait silently, and
the closing line of a failed ``report --html``. docs/robustness.md lists them."""
import os
import signal
import sqlite3
import subprocess
import sys
import threading
import time

import pyarrow.parquet as pq
import pytest

from tests.robustness.conftest import words_table
from tests.robustness.test_hostile_corpus import base_spec, write_yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def thresher(*argv, timeout=300, env=None):
    return subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", *map(str, argv)],
                          capture_output=True, text=True, cwd=ROOT, timeout=timeout, env=env)


@pytest.fixture
def spec(tmp_path):
    pq.write_table(words_table(n_users=300), tmp_path / "in.parquet")
    return write_yaml(str(tmp_path), base_spec(str(tmp_path)))


@pytest.mark.parametrize("runner", ["NoSuchRunner", "no_such_module.SomeRunner"])
def test_an_unknown_beam_runner_is_a_usage_error_naming_the_flag(spec, tmp_path, runner):
    done = thresher("run", spec, "--", f"--runner={runner}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.startswith("thresher: error: --runner: Beam has no runner "
                                  f"{runner!r}"), done.stderr
    assert "internal error" not in done.stderr and "Traceback" not in done.stderr
    assert "DirectRunner" in done.stderr           # the runners Beam has are named
    assert not os.path.exists(tmp_path / "out")


@pytest.mark.parametrize("users", ["-1", "0", "many"])
def test_plan_refuses_a_users_count_below_one(spec, users):
    done = thresher("plan", spec, "--users", users)
    assert done.returncode == 2, done.stdout
    assert "argument --users: must be a whole number >= 1" in done.stderr
    assert done.stdout == ""


def _mapped(pid, library):
    try:
        with open(f"/proc/{pid}/maps", encoding="ascii", errors="replace") as handle:
            return library in handle.read()
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")
def test_ctrl_c_during_start_up_is_one_line_and_exit_130(spec, tmp_path):
    """SIGINT while the command is starting (as soon as it has loaded pyarrow's library:
    reading the spec, planning, importing Beam -- never the interpreter's own start,
    which no program can guard): exit 130, one line, no traceback, nothing written."""
    env = dict(os.environ, THRESHER_CACHE_DIR="off")
    proc = subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", "run", spec],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env)
    deadline = time.time() + 60
    while not _mapped(proc.pid, "libarrow.so") and proc.poll() is None \
            and time.time() < deadline:
        time.sleep(0.002)
    assert proc.poll() is None, proc.communicate()
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 130, err
    assert err.strip().splitlines() == ["thresher: interrupted; nothing was published"], err
    assert sorted(os.listdir(tmp_path)) == ["in.parquet", "spec.yaml"]


def test_ctrl_c_of_a_command_that_publishes_nothing_says_only_interrupted(spec):
    """``plan`` interrupted while it waits on a locked ledger: "interrupted", not
    "nothing was published" (it never publishes)."""
    import yaml
    folder = os.path.dirname(spec)
    ledger_path = os.path.join(folder, "ledger.db")
    with open(spec, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    data["budget"] = {"ledger": ledger_path, "dataset": "d", "epsilon": 10, "delta": 1e-6}
    spec = write_yaml(folder, data)
    # hold the ledger's exclusive lock: plan's read of the ledger waits (up to 60 s), so the
    # signal reaches a process that is still running, whatever the machine's speed
    holder = sqlite3.connect(ledger_path, isolation_level=None)
    holder.execute("CREATE TABLE IF NOT EXISTS hold (x)")
    holder.execute("BEGIN EXCLUSIVE")
    try:
        proc = subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", "plan", spec],
                                cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
        deadline = time.time() + 60
        while not _mapped(proc.pid, "libarrow.so") and proc.poll() is None \
                and time.time() < deadline:
            time.sleep(0.002)
        time.sleep(1.0)                   # past start-up, into the ledger's wait
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        out, err = proc.communicate(timeout=120)
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    assert proc.returncode == 130, (out, err)
    assert err.strip().splitlines() == ["thresher: interrupted"], err


def test_a_locked_ledger_makes_run_say_that_it_waits_and_for_what(spec, tmp_path):
    """Another process holds the ledger's write lock: ``run`` says within seconds that it
    waits for that ledger (it waited up to 60 s without a word), then runs once the lock
    is released."""
    import yaml
    ledger_path = str(tmp_path / "ledger.db")
    with open(spec, encoding="utf-8") as handle:
        data = yaml.safe_load(handle)
    data["budget"] = {"ledger": ledger_path, "dataset": "d", "epsilon": 10, "delta": 1e-6}
    spec = write_yaml(str(tmp_path), data)
    assert thresher("validate", spec).returncode == 0          # (creates no ledger)
    holder = sqlite3.connect(ledger_path, isolation_level=None)
    holder.execute("CREATE TABLE IF NOT EXISTS hold (x)")
    holder.execute("BEGIN IMMEDIATE")                          # the write lock
    proc = subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", "run", spec],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)
    lines = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stderr), daemon=True)
    reader.start()
    deadline = time.time() + 120
    while not any("waiting for the ledger" in line for line in lines) \
            and proc.poll() is None and time.time() < deadline:
        time.sleep(0.05)
    holder.execute("ROLLBACK")
    holder.close()
    out = proc.stdout.read()
    proc.wait(timeout=120)
    reader.join(timeout=10)
    waiting = [line for line in lines if "waiting for the ledger" in line]
    assert waiting, lines
    assert waiting[0].startswith(f"thresher: waiting for the ledger {ledger_path}: another "
                                 f"process"), waiting
    assert "up to 60 s" in waiting[0]
    assert proc.returncode == 0, (out, lines)


@pytest.mark.parametrize("argv, trailer", [
    (["report", "{out}", "--html", "{page}"], "thresher: no page was written; rerun with "
                                              "--debug for the traceback"),
    (["report", "{out}"], "thresher: rerun with --debug for the traceback"),
    (["show", "{out}"], "thresher: rerun with --debug for the traceback"),
])
def test_an_internal_error_of_a_report_does_not_say_nothing_was_published(
        tmp_path, monkeypatch, capsys, argv, trailer):
    """The CLI's last line of defence (an exception nobody anticipated, injected here)
    ends with what the command failed to write: a report publishes nothing, so it never
    says "nothing was published" (it did, after issue 36 D2's crash of report --html)."""
    from thresher.pipelines import cli
    from thresher.pipelines.reports import html_report, look

    def broken(*args, **kwargs):
        raise RuntimeError("injected")
    for module, name in ((html_report, "write"), (look, "report_lines"), (look, "show")):
        monkeypatch.setattr(module, name, broken)
    monkeypatch.setattr(look, "html_destination", lambda output, dest, overwrite=False: dest)
    out = tmp_path / "out"
    out.mkdir()
    code = cli.main([a.format(out=out, page=tmp_path / "page.html") for a in argv])
    err = capsys.readouterr().err
    assert code == 1
    assert err.splitlines() == ["thresher: internal error (RuntimeError): injected", trailer]
    assert not (tmp_path / "page.html").exists()

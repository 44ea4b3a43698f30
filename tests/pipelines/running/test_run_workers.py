"""An interrupted or terminated run stops its own Beam workers and no one else's.

Stop 49's CI failed here: the default suite's Ctrl-C test interrupted a ``thresher run``
started in the CI script's process group, and the run's clean-up sent SIGTERM to every
Beam SDK worker of that group -- the slow suite's two-worker release among them
("Worker subprocess exited with return code -15", "Channel closed prematurely"). A Beam
worker is now the run's only if it is its descendant or carries the run's mark
(``run_workers.MARK``) in its environment."""
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pyarrow.parquet as pq
import pytest

from thresher.pipelines.running import run_workers
from tests.robustness.conftest import words_table
from tests.robustness.test_cli_edge_cases import _mapped
from tests.robustness.test_hostile_corpus import base_spec, write_yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))

pytestmark = pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="needs Linux /proc")

# A stand-in for a Beam SDK worker: what the stop looks for is the module's name in the
# command line (a real worker needs a runner's control service to live).
FAKE_WORKER = [sys.executable, "-c", "import time; time.sleep(300)",
               "apache_beam.runners.worker.sdk_worker_main"]

_DRIVER = textwrap.dedent("""
    import json, os, subprocess, sys, time
    from thresher.pipelines.running import run_workers
    fake = json.loads(sys.argv[1])
    run_workers.mark()

    def orphan(env):
        # sh starts the worker in the background and exits: the worker is no longer our
        # descendant (as after a terminal's Ctrl-C killed its sh), but it is in our group
        done = subprocess.run(["sh", "-c", '"$@" >/dev/null 2>&1 & echo $!', "sh", *fake],
                              env=env, capture_output=True, text=True, check=True)
        return int(done.stdout)

    child = subprocess.Popen(fake)                       # a descendant
    ours = orphan(dict(os.environ))                      # carries this run's mark
    theirs = orphan(dict(os.environ, THRESHER_RUN_PID="1"))   # another run's mark
    unmarked = orphan({k: v for k, v in os.environ.items() if k != run_workers.MARK})
    time.sleep(0.3)
    found = run_workers.marked_beam_workers()
    run_workers.stop()
    print(json.dumps({"child": child.pid, "ours": ours, "theirs": theirs,
                      "unmarked": unmarked, "found": found}))
""")


def _alive(pid):
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as handle:
            return handle.read().rsplit(") ", 1)[1][:1] not in ("Z", "X")
    except OSError:
        return False


def _kill(pids):
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def test_stop_ends_the_runs_own_workers_and_spares_the_groups_others():
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps(FAKE_WORKER)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          start_new_session=True)
    assert done.returncode == 0, done.stderr
    pids = json.loads(done.stdout)
    try:
        assert pids["ours"] in pids["found"]
        assert pids["theirs"] not in pids["found"] and pids["unmarked"] not in pids["found"]
        deadline = time.time() + 5
        while (_alive(pids["ours"]) or _alive(pids["child"])) and time.time() < deadline:
            time.sleep(0.05)
        assert not _alive(pids["child"]), "the run's own worker (a descendant) survived"
        assert not _alive(pids["ours"]), "the run's own orphaned worker survived"
        assert _alive(pids["theirs"]), "another run's Beam worker was stopped"
        assert _alive(pids["unmarked"]), "a Beam worker of no thresher run was stopped"
    finally:
        _kill([pids["child"], pids["ours"], pids["theirs"], pids["unmarked"]])


def test_ctrl_c_of_a_run_spares_another_beam_worker_of_its_group(tmp_path):
    """The CI failure through the real CLI: a script starts a Beam worker of its own in the
    background, then ``thresher run`` (one process group, as in a non-interactive shell),
    and the run is interrupted while it starts. It exits 130 and the other worker is
    still running."""
    pq.write_table(words_table(n_users=300), tmp_path / "in.parquet")
    spec = write_yaml(str(tmp_path), base_spec(str(tmp_path)))
    pid_file = tmp_path / "other.pid"
    script = ('( "$@" >/dev/null 2>&1 & echo $! > "$0" ); '
              'exec "${THRESHER_PYTHON}" -m thresher.pipelines.cli run "${THRESHER_SPEC}"')
    env = dict(os.environ, THRESHER_CACHE_DIR="off", THRESHER_PYTHON=sys.executable,
               THRESHER_SPEC=spec)
    proc = subprocess.Popen(["sh", "-c", script, str(pid_file), *FAKE_WORKER], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env=env, start_new_session=True)
    other = None
    try:
        deadline = time.time() + 60
        while not _mapped(proc.pid, "libarrow.so") and proc.poll() is None \
                and time.time() < deadline:
            time.sleep(0.002)
        assert proc.poll() is None, proc.communicate()
        other = int(pid_file.read_text())
        assert _alive(other) and os.getpgid(other) == proc.pid
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 130, err
        time.sleep(0.5)
        assert _alive(other), "thresher's Ctrl-C stopped another Beam worker of its group"
    finally:
        if proc.poll() is None:
            proc.kill()
        if other is not None:
            _kill([other])

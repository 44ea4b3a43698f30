"""Publishing is exclusive and leaves nothing behind (issue 13, items 5 and 6): one run at a
time into an output, SIGTERM removes the staging folder, a killed run's leftovers are
removed by the next run, and the report names its files relative to the output."""
import glob
import json
import os
import signal
import subprocess
import sys
import time

import pytest

from thresher.pipelines.dataio.claim import OutputClaim
from thresher.pipelines.errors import SpecError
from tests.robustness.conftest import ROOT, run_cli, words_table, write_parquet, write_spec

QUICKSTART = os.path.join(ROOT, "configs", "examples", "data", "quickstart.parquet")


def _cli(*argv, new_session=False):
    return subprocess.Popen([sys.executable, "-m", "thresher.pipelines.cli", *argv], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=new_session)


def test_a_claim_is_exclusive_and_leaves_no_lock_file(tmp_path):
    out = str(tmp_path / "out")
    with OutputClaim(out):
        with pytest.raises(SpecError, match="another thresher run is writing"):
            OutputClaim(out).acquire()
    assert not os.path.exists(out + ".lock")
    with OutputClaim(out):          # free again
        pass


def test_two_concurrent_runs_publish_once(tmp_path):
    """Two real processes into one empty output: exactly one publishes; the other exits 2
    without computing (no operator diagnostics: its pipeline never ran). Started together,
    the second can reach the output only after the first has published when the machine
    is loaded (its refusal then says "already holds a release", which a run with no
    exclusion would also print): the pair is run again, into a fresh output, until the
    loser is refused by the claim, at most three times; every pair must publish once."""
    by_claim = False
    for attempt in range(3):
        folder = tmp_path / f"pair{attempt}"
        folder.mkdir()
        spec, out = write_spec(folder, QUICKSTART, max_keys_per_user=8)
        procs = [_cli("run", spec) for _ in range(2)]
        results = [(p.wait(timeout=300), *p.communicate()) for p in procs]
        codes = sorted(code for code, _, _ in results)
        assert codes == [0, 2], results
        loser = next(err for code, _, err in results if code == 2)
        assert "output.path" in loser and "Traceback" not in loser
        assert "operator diagnostics" not in loser
        assert os.path.exists(os.path.join(out, "release_report.json"))
        assert not glob.glob(out + ".tmp-*") and not os.path.exists(out + ".lock")
        if "another thresher run is writing" in loser:   # refused while the winner ran
            by_claim = True
            break
        assert "already holds a release" in loser, loser
    assert by_claim, "in three pairs the loser never met the winner's claim"


@pytest.mark.parametrize("beam_args", [
    [], pytest.param(["--", "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
                     marks=pytest.mark.slow)], ids=["in_process", "multi_processing"])
def test_sigterm_removes_the_staging_folder(tmp_path, beam_args):
    """``timeout``/``kill`` during a run: exit 143, nothing published, nothing left, and
    (multi-processing) no worker left running."""
    table = words_table(n_users=300_000, keys_per_user=3, n_words=5000)
    data = write_parquet(tmp_path / "big.parquet", table, row_group_size=50_000)
    spec, out = write_spec(tmp_path, data)
    proc = _cli("run", spec, *beam_args, new_session=True)
    deadline = time.time() + 120
    while not glob.glob(out + ".tmp-*"):
        assert proc.poll() is None, proc.communicate()
        assert time.time() < deadline
        time.sleep(0.05)
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    code = proc.wait(timeout=120)
    _, err = proc.communicate()
    assert code == 143, err
    assert "terminated" in err and "nothing was published" in err and "Traceback" not in err
    assert not os.path.exists(out)
    assert not glob.glob(out + ".tmp-*") and not os.path.exists(out + ".lock")
    if beam_args:
        from tests.robustness.test_hostile_corpus import _live_in_group
        deadline = time.time() + 5
        while _live_in_group(proc.pid) and time.time() < deadline:
            time.sleep(0.2)
        assert not _live_in_group(proc.pid), "worker processes outlived the terminated run"


def test_next_run_removes_a_killed_runs_leftovers(tmp_path):
    data = write_parquet(tmp_path / "d.parquet", words_table(n_users=500))
    spec, out = write_spec(tmp_path, data)
    os.makedirs(out + ".tmp-0123456789ab/beam-temp-x")
    os.makedirs(out + ".old-0123456789ab")
    open(out + ".lock", "w").close()          # a SIGKILLed run's lock file (not locked)
    code, _, err = run_cli("run", spec)
    assert code == 0, err
    assert "removed 2 staging folder(s) left by an interrupted run" in err
    assert sorted(os.listdir(tmp_path)) == ["d.parquet", "out", "spec.yaml"]


def test_report_lists_outputs_relative_to_the_output_folder(tmp_path):
    data = write_parquet(tmp_path / "d.parquet", words_table(n_users=500))
    spec, out = write_spec(tmp_path, data)
    code, _, err = run_cli("run", spec)
    assert code == 0, err
    with open(os.path.join(out, "release_report.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    assert report["outputs"] == ["released.parquet"]
    assert str(tmp_path) not in json.dumps(report)

"""Hostile inputs for the real CLI: data generators, spec writer and a CLI runner.

``run_cli`` runs ``python -m thresher`` either in a fresh interpreter (subprocess:
exactly what a user runs) or in-process through ``pipelines.cli.main`` with stdout and
stderr captured (the same code path and the same Beam FnApiRunner, without the ~4 s of
interpreter and Beam start-up, so the default run stays fast)."""
import contextlib
import glob
import io
import json
import logging
import os
import re
import subprocess
import sys

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def words_table(n_users=2000, keys_per_user=3, n_words=30, seed=0):
    """Users with a few words each from a skewed vocabulary: the top words have hundreds
    of distinct users (released at epsilon 1, delta 1e-8), the tail has a handful."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, n_words + 1)
    words = rng.choice(n_words, size=n_users * keys_per_user, p=weights / weights.sum())
    users = np.repeat(np.arange(n_users), keys_per_user)
    return pa.table({"user_id": pa.array([f"u{u}" for u in users]),
                     "word": pa.array([f"w{w}" for w in words])})


@pytest.fixture
def workdir(tmp_path):
    return tmp_path


def write_parquet(path, table, **kw):
    pq.write_table(table, str(path), **kw)
    return str(path)


def write_spec(folder, input_path, *, fmt="parquet", keys=("word",), user="user_id",
               max_keys_per_user=3, output="out", **mechanism):
    spec = {
        "name": "robustness",
        "input": {"path": str(input_path), "format": fmt, "user": user, "keys": list(keys)},
        "privacy": {"epsilon": 1.0, "delta": 1e-8},
        "bounding": {"max_keys_per_user": max_keys_per_user},
        "mechanism": {"kind": "gaussian", "pre_threshold": 1, **mechanism},
        "output": {"path": str(os.path.join(folder, output))},
    }
    path = os.path.join(folder, "spec.yaml")
    with open(path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(spec, handle)
    return path, spec["output"]["path"]


def run_cli(*argv, in_process=True, timeout=600):
    """(exit code, stdout, stderr) of ``thresher <argv>``."""
    argv = [str(a) for a in argv]
    if not in_process:
        proc = subprocess.run([sys.executable, "-m", "thresher.pipelines.cli", *argv], cwd=ROOT,
                              capture_output=True, text=True, timeout=timeout)
        return proc.returncode, proc.stdout, proc.stderr
    from thresher.pipelines.cli import main
    out, err = io.StringIO(), io.StringIO()
    # The CLI configures logging itself; pytest's capture handlers on the root logger
    # would swallow what a user would see (e.g. a worker's traceback logged by Beam).
    root = logging.getLogger()
    saved_handlers, saved_level = root.handlers[:], root.level
    root.handlers[:] = []
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:          # argparse usage errors
                code = exc.code
    finally:
        root.handlers[:] = saved_handlers
        root.setLevel(saved_level)
    return code, out.getvalue(), err.getvalue()


def assert_clean_error(code, err, *needles):
    """Exit code 2, one clear message naming what is wrong, no traceback."""
    assert code == 2, f"exit code {code}, stderr:\n{err}"
    assert "Traceback" not in err, err
    assert "internal error" not in err, err
    for needle in needles:
        assert needle in err, f"{needle!r} not in:\n{err}"


def assert_nothing_published(output):
    """No output folder and no staging/trash folders beside it."""
    assert not os.path.exists(output), os.listdir(output)
    assert not glob.glob(f"{output}.tmp-*") and not glob.glob(f"{output}.old-*")


def diagnostics(err):
    """The operator's (not private) counters printed by ``thresher run``."""
    match = re.search(r"operator diagnostics \(NOT differentially private, do not publish\): "
                      r"(\{.*?\}); wall time", err)
    assert match, err
    return json.loads(match.group(1))


def read_release(output):
    with open(os.path.join(output, "release_report.json"), encoding="utf-8") as handle:
        report = json.load(handle)
    table = pq.read_table(os.path.join(output, "released.parquet"))
    return report, table

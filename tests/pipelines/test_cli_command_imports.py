"""The ``thresher`` commands that run no pipeline answer without importing Beam (issue 34,
item 6): ``schema``, ``validate``, ``plan`` (also ``--json``, with its calibration cached),
``show``, ``report`` (text) and every refused spec -- nor ``scipy.special`` once the
calibration is cached (the gaussian release point in words sums discrete Gaussian tails
with ``accounting.discrete_gaussian._logsumexp``). Importing Beam (with pandas, which it
imports) cost 7-14 s of each such command on a busy machine; their speed is measured by
``benchmarks/bench_commands.py``, and this test keeps the imports out.

Each command runs through the CLI's ``main`` in its own process, forked from a driver
interpreter that has imported only ``thresher.pipelines.cli``; after the command the child
reports which of the heavy modules are in ``sys.modules``. (numpy, pyarrow, PyYAML and the
spec and report modules are imported once, in the driver: had they imported a heavy
module, the driver would say so.)"""
import json
import os
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from tests.pipelines.conftest import QUICKSTART_DATA, ROOT

HEAVY = ("apache_beam", "pandas", "scipy.stats", "matplotlib", "scipy.special")

_DRIVER = r"""
import json, os, sys, time
heavy, commands = json.loads(sys.argv[1])
# What every command may import, once, before the forks (each child then only adds its
# own imports); a module here that imported a heavy one would show in "before".
import numpy, pyarrow, pyarrow.parquet, pyarrow.compute, yaml
from thresher.pipelines import cli
from thresher.pipelines.specs import spec, schema
from thresher.pipelines.reports import look, summary
before = [m for m in heavy if m in sys.modules]
out = {"before": before, "commands": []}
for argv in commands:
    read, write = os.pipe()
    started = time.perf_counter()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, 1)
        os.dup2(devnull, 2)
        try:
            code = cli.main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:
            code = repr(exc)
        found = [m for m in heavy if m in sys.modules]
        os.write(write, json.dumps([code, found]).encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 65536)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    code, found = json.loads(b"".join(chunks))
    out["commands"].append({"argv": argv, "exit": code, "imported": found,
                            "seconds": round(time.perf_counter() - started, 2)})
print(json.dumps(out))
"""


def _spec(path, data, out, **changes):
    lines = {"name": "imports", "input": f"{{path: {data}, user: user_id, keys: [word]}}",
             "privacy": "{epsilon: 1.0, delta: 1.0e-8}",
             "bounding": "{max_keys_per_user: 4}",
             "mechanism": "{kind: gaussian}",
             "output": f"{{path: {out}}}"}
    lines.update(changes)
    path.write_text("".join(f"{k}: {v}\n" for k, v in lines.items()))
    return str(path)


@pytest.fixture(scope="module")
def released(tmp_path_factory):
    """A small real release (2,000 quickstart rows), made by ``thresher run`` in this
    process (Beam is imported here anyway)."""
    from thresher.pipelines import cli
    tmp = tmp_path_factory.mktemp("imports")
    data = tmp / "small.parquet"
    pq.write_table(pq.read_table(QUICKSTART_DATA).slice(0, 2_000), data)
    out = tmp / "out"
    assert cli.main(["run", _spec(tmp / "run.yaml", data, out), "-q"]) == 0
    return tmp, str(data), str(out)


def test_commands_that_run_no_pipeline_do_not_import_beam(released, tmp_path):
    tmp, data, out = released
    good = _spec(tmp_path / "good.yaml", data, tmp_path / "new")
    refused = {
        "epsilon": _spec(tmp_path / "e.yaml", data, tmp_path / "o1",
                         privacy="{epsilon: -1, delta: 1.0e-8}"),
        "unknown field": _spec(tmp_path / "u.yaml", data, tmp_path / "o2",
                               mechanism="{kind: gaussian, sigmaa: 3}"),
        "unknown kind": _spec(tmp_path / "k.yaml", data, tmp_path / "o3",
                              mechanism="{kind: gausian}"),
        "missing column": _spec(tmp_path / "c.yaml", data, tmp_path / "o4",
                                input=f"{{path: {data}, user: nobody, keys: [word]}}"),
    }
    # The first plan calibrates (and may import scipy.special for it); every later command
    # finds the calibration cached and imports none of HEAVY, scipy.special included.
    commands = [["plan", good], ["schema"], ["validate", good], ["plan", good],
                ["plan", good, "--json"], ["plan", good, "-v"],
                ["show", out], ["show", out, "--format", "json"], ["report", out],
                ["plan", refused["epsilon"]], ["validate", refused["unknown field"]],
                ["plan", refused["unknown kind"]], ["validate", refused["missing column"]],
                ["run", refused["epsilon"]]]
    env = dict(os.environ, THRESHER_CACHE_DIR=str(tmp_path / "cache"))  # plan: cached
    done = subprocess.run([sys.executable, "-c", _DRIVER, json.dumps([HEAVY, commands])],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["before"] == []
    expected = [0] * 9 + [2] * 5
    got = [(c["argv"], c["exit"], c["imported"]) for c in result["commands"]]
    assert [c["exit"] for c in result["commands"]] == expected, got
    assert [m for m in got[0][2] if m != "scipy.special"] == [], got[0]
    assert [g for g in got[1:] if g[2]] == []


def test_kinds_declare_the_output_columns_of_their_transforms():
    """sample_and_threshold and weighted_sampling write their transforms' OUTPUT_COLUMNS
    out (importing the transforms would import Beam): they must stay the same."""
    from thresher.pipelines.kinds import sample_and_threshold, weighted_sampling
    from thresher.transforms.selection import sample_and_threshold as sat_transform
    from thresher.transforms.selection import sanitize_sample
    assert sample_and_threshold.OUTPUT_COLUMNS == sat_transform.OUTPUT_COLUMNS
    assert weighted_sampling.OUTPUT_COLUMNS == sanitize_sample.OUTPUT_COLUMNS
    assert all(isinstance(t, pa.DataType) for t in sample_and_threshold.OUTPUT_COLUMNS.values())

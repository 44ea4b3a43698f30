"""Released bytes and drawing-stage labels frozen across refactors (issue 37).

Every keyed draw's identity includes the Beam label of the composite that draws
(transforms/randomness/keyed_random.py, "stable identity"), so re-nesting or renaming a composite, or
moving code that builds one, can change what a release publishes under the same secret.
This test runs every example config and one release per kind (and per bounding path:
``auto``, ``l1``, aggregates, a public key domain, correlated noise) under one fixed test
secret and compares, against the baseline committed beside it
(``released_bytes_baseline.json``, taken on main after issue 34's PRF changed the bytes):

- the sha256 of ``released.parquet`` (where the baseline's pyarrow wrote it: the file names
  its writer's version; under another pyarrow the sha256 of its columns, metadata and
  values instead) and of ``release_report.json``;
- the sorted list of stage names every draw of the release was keyed by
  (``KeyedSource.stage_key``), so a renamed drawing stage is named in the failure.

It fails on any change of a released byte or a drawing stage. A change that is meant to
change the bytes (a new sampler, a new PRF) regenerates the baseline on purpose with
``THRESHER_WRITE_RELEASED_BYTES_BASELINE=1 python -m pytest tests/pipelines/test_released_bytes_frozen.py``
and says so in its commit; a move or a rename never does. The thresher version is part of
the report, so a version bump regenerates it too.

The same comparison runs again (marked slow: five fresh interpreters, minutes on a loaded
machine) under each OpenBLAS kernel, OPENBLAS_CORETYPE unset, Haswell, Prescott and
SkylakeX, and with numpy's AVX-512 code for exp and log turned off, each asserting
(threadpoolctl, numpy's CPU feature table) what it really ran on (issue 42: the same secret
must publish the same bytes on every machine; docs/privacy_testing.md, "Platform
independence").

Runs use relative paths from one working folder, so the spec echoed in the report is the
same in every run and on every machine.
"""
import copy
import hashlib
import json
import os
import shutil

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from thresher.pipelines.running import release
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod
from thresher.transforms.randomness import keyed_random

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BASELINE = os.path.join(os.path.dirname(os.path.abspath(__file__)),
                        "released_bytes_baseline.json")
QUICKSTART_DATA = os.path.join("configs", "examples", "data", "quickstart.parquet")
SECRET = b"issue 37 frozen-bytes test secret"

_STAGES = set()      # stage names drawn from, filled in process by the runner's workers


class _RecordingSource(keyed_random.KeyedSource):
    """The fixed test secret, recording each stage name a draw is keyed by. Pickled by
    reference to this module: Beam's in-process runner unpickles it in this process, so the
    module-level set sees every stage."""

    def stage_key(self, stage):
        _STAGES.add(stage)
        return super().stage_key(stage)


def _examples():
    folder = os.path.join(ROOT, "configs", "examples")
    return sorted(f for f in os.listdir(folder) if f.endswith(".yaml"))


_SMALL = "small.parquet"        # 30,000 quickstart rows with two numeric columns
_DOMAIN = "domain.csv"


def _base(kind, **mech):
    return {"name": f"frozen_{kind}",
            "input": {"path": _SMALL, "format": "parquet", "user": "user_id",
                      "keys": ["word"]},
            "privacy": {"epsilon": 1.0, "delta": 1e-8},
            "bounding": {"max_keys_per_user": 4},
            "mechanism": {"kind": kind, **mech},
            "output": {"path": "out"}}


def _with(doc, dotted, value):
    doc = copy.deepcopy(doc)
    node = doc
    *parents, last = dotted.split(".")
    for part in parents:
        node = node.setdefault(part, {})
    node[last] = value
    return doc


# one release per kind and per bounding / value path; ids are the baseline's keys
CASES = {
    "gaussian": _base("gaussian"),
    "gaussian_auto_bound": _with(_base("gaussian"), "bounding.max_keys_per_user", "auto"),
    "gaussian_correlated": _base("gaussian", noise="correlated"),
    "gaussian_aggregates": _with(_base("gaussian"), "aggregates", [
        {"column": "amount", "statistic": "sum", "clip": [0.0, 10.0]},
        {"column": "amount", "statistic": "mean", "clip": [0.0, 10.0]}]),
    "gaussian_public_keys": _with(_base("gaussian"), "input.public_keys", {"path": _DOMAIN}),
    "laplace": _base("laplace"),
    "laplace_l1": _with(_base("laplace"), "bounding.model", "l1"),
    "sample_and_threshold": _base("sample_and_threshold"),
    "weighted_sampling": _base("weighted_sampling"),
    "weighted_gaussian": _base("weighted_gaussian"),
    "adaptive": _base("adaptive"),
    "heavy_hitters": _base("heavy_hitters", top_k=10),
    "quantiles": _with(_base("quantiles", column="x", ranks=[0.25, 0.5, 0.9],
                             domain=[0, 100]), "input.keys", None),
}


def _workdir(tmp_path):
    """The folder every run starts in: the example data at its repository path, the small
    table and the public domain beside it."""
    data = tmp_path / os.path.dirname(QUICKSTART_DATA)
    data.mkdir(parents=True)
    shutil.copy(os.path.join(ROOT, QUICKSTART_DATA), data)
    table = pq.read_table(os.path.join(ROOT, QUICKSTART_DATA)).slice(0, 30000)
    i = np.arange(table.num_rows, dtype=np.int64)
    table = table.append_column("amount", pa.array((i * 7919 % 1000) / 97.0))
    table = table.append_column("x", pa.array((i * 104729 % 10007) / 100.07))
    pq.write_table(table, str(tmp_path / _SMALL))
    words = sorted(set(table.column("word").to_pylist()))[:200] + ["not-in-the-data"]
    (tmp_path / _DOMAIN).write_text("word\n" + "\n".join(words) + "\n", encoding="utf-8")
    return tmp_path


def _run(workdir, name, doc):
    """Run one release from ``workdir`` under the recording test secret; its record."""
    folder = workdir / name
    folder.mkdir()
    if doc is None:                                   # an example config, as shipped
        with open(os.path.join(ROOT, "configs", "examples", name), encoding="utf-8") as f:
            doc = yaml.safe_load(f)
    doc = _with(doc, "output.path", os.path.join(name, "out"))
    if doc["input"].get("keys", ()) is None:
        del doc["input"]["keys"]
    spec_path = os.path.join(name, "spec.yaml")
    with open(workdir / spec_path, "w", encoding="utf-8") as handle:
        yaml.safe_dump(doc, handle, sort_keys=True)
    _STAGES.clear()
    cwd = os.getcwd()
    os.chdir(workdir)
    try:
        release.run(make_plan(spec_mod.load(spec_path)), [],
                    rng_factory=_RecordingSource(SECRET))
    finally:
        os.chdir(cwd)
    out = folder / "out"

    def digest(file):
        return hashlib.sha256((out / file).read_bytes()).hexdigest()
    return {"released.parquet": digest("released.parquet"),
            "released.parquet content": _content_digest(out / "released.parquet"),
            "release_report.json": digest("release_report.json"),
            "drawing_stages": sorted(_STAGES)}


def _content_digest(path):
    """sha256 of what the Parquet file holds, independent of the writing library's
    version: its columns (name, type, nullability), its key-value metadata and every
    value in order. The file's own bytes also carry the writer's version
    (``created_by: parquet-cpp-arrow version X``), so they are compared only where the
    baseline was written by the same pyarrow."""
    table = pq.read_table(str(path))
    metadata = {k.decode("utf-8", "replace"): v.decode("utf-8", "replace")
                for k, v in (table.schema.metadata or {}).items()}
    content = {"columns": [(f.name, str(f.type), f.nullable) for f in table.schema],
               "metadata": metadata, "rows": table.to_pylist()}
    return hashlib.sha256(json.dumps(content, sort_keys=True, default=repr)
                          .encode("utf-8")).hexdigest()


def _all_records(tmp_path):
    workdir = _workdir(tmp_path)
    records = {name: _run(workdir, name, None) for name in _examples()}
    records.update({name: _run(workdir, name, doc) for name, doc in CASES.items()})
    return records


def _changed(records):
    """What differs from the committed baseline: {case: {what: how}} (empty: nothing)."""
    with open(BASELINE, encoding="utf-8") as handle:
        saved = json.load(handle)
    baseline = saved["releases"]
    same_writer = saved["pyarrow"] == pa.__version__   # else the file's bytes name another
    assert sorted(records) == sorted(baseline), "cases added or removed: regenerate on purpose"
    changed = {}
    for name, want in baseline.items():
        got = records[name]
        if got["drawing_stages"] != want["drawing_stages"]:
            changed[name] = {"stages only before": sorted(set(want["drawing_stages"])
                                                         - set(got["drawing_stages"])),
                             "stages only now": sorted(set(got["drawing_stages"])
                                                       - set(want["drawing_stages"]))}
        files = ["released.parquet content", "release_report.json"]
        if same_writer:
            files.append("released.parquet")
        for file in files:
            if got[file] != want[file]:
                changed.setdefault(name, {})[file] = "bytes differ"
    return changed


def test_every_example_and_kind_publishes_the_baselines_bytes_and_draws_from_its_stages(
        tmp_path):
    records = _all_records(tmp_path)
    if os.environ.get("THRESHER_WRITE_RELEASED_BYTES_BASELINE") == "1":
        with open(BASELINE, "w", encoding="utf-8") as handle:
            json.dump({"pyarrow": pa.__version__, "releases": records}, handle, indent=1,
                      sort_keys=True)
            handle.write("\n")
        pytest.skip("baseline written (THRESHER_WRITE_RELEASED_BYTES_BASELINE=1)")
    changed = _changed(records)
    assert not changed, json.dumps(changed, indent=1)
    # every kind draws (a release that drew nothing would freeze nothing)
    assert all(r["drawing_stages"] for r in records.values())


# -- the same bytes under every BLAS kernel and SIMD path (issue 42) --------------------------
#
# numpy's wheel bundles OpenBLAS (scipy-openblas), which picks its kernel per CPU when it loads;
# OPENBLAS_CORETYPE overrides the pick. Kernels order a dot product's additions differently,
# so a BLAS call anywhere on the path to a private choice or a published number shows up
# here as other bytes (issue 42: heavy_hitters.yaml under Haswell and Prescott). numpy's own
# float64 exp / log / expm1 / log1p take AVX-512 code where the CPU has it and the C
# library's elsewhere (different last bits): one more run turns that dispatch off
# (NPY_DISABLE_CPU_FEATURES), as on a CPU without AVX-512. Each run is a fresh interpreter
# (both choices are fixed when the libraries load) that reports, through threadpoolctl and
# numpy's CPU feature table, what it really ran on: a run that silently fell back to the
# default would compare nothing new.

# OPENBLAS_CORETYPE -> the names openblas_get_corename() gives that kernel (x86_64 builds
# alias Prescott's kernel as Katmai, the first name of the pair it reports)
KERNELS = {"Haswell": {"haswell"}, "Prescott": {"prescott", "katmai"},
           "SkylakeX": {"skylakex"}}

_CHILD = """
import json, os, sys, tempfile, pathlib
sys.path.insert(0, sys.argv[1])
import test_released_bytes_frozen as frozen
records = frozen._all_records(pathlib.Path(tempfile.mkdtemp(dir=sys.argv[2])))
import threadpoolctl
from numpy._core._multiarray_umath import __cpu_features__
blas = [(i["filepath"], i.get("architecture")) for i in threadpoolctl.threadpool_info()
        if i.get("internal_api") == "openblas"]
print(json.dumps({"changed": frozen._changed(records), "openblas": blas,
                  "simd": {k: bool(v) for k, v in __cpu_features__.items()}}))
"""


def _avx512_dispatch():
    """numpy's dispatch targets that use AVX-512 on this CPU (empty without AVX-512)."""
    from numpy._core._multiarray_umath import __cpu_dispatch__, __cpu_features__
    return [t for t in __cpu_dispatch__ if __cpu_features__.get(t)
            and (t.startswith("AVX512") or t == "X86_V4")]


@pytest.mark.slow
def test_every_openblas_kernel_and_simd_path_publishes_the_baselines_bytes(tmp_path):
    """The frozen comparison above in fresh interpreters: OPENBLAS_CORETYPE unset, Haswell,
    Prescott and SkylakeX (the last two only where the CPU has AVX-512: OpenBLAS would fall
    back), and numpy's AVX-512 dispatch turned off; two at a time (the suite's machines have
    two cores). Each must publish the baseline's bytes and have run on what it asked for."""
    import subprocess
    import sys
    import threadpoolctl  # noqa: F401  (the dev extra; the children report through it)
    avx512 = _avx512_dispatch()
    runs = {"default": {}, "Haswell": {"OPENBLAS_CORETYPE": "Haswell"},
            "Prescott": {"OPENBLAS_CORETYPE": "Prescott"}}
    if avx512:
        runs["SkylakeX"] = {"OPENBLAS_CORETYPE": "SkylakeX"}
        runs["no AVX-512 in numpy"] = {"NPY_DISABLE_CPU_FEATURES": " ".join(avx512)}
    here = os.path.dirname(os.path.abspath(__file__))

    def start(extra):
        env = {k: v for k, v in os.environ.items()
               if k not in ("OPENBLAS_CORETYPE", "NPY_DISABLE_CPU_FEATURES",
                            "THRESHER_WRITE_RELEASED_BYTES_BASELINE")}
        env.update(extra)
        return subprocess.Popen([sys.executable, "-c", _CHILD, here, str(tmp_path)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)

    results = {}
    names = list(runs)
    for i in range(0, len(names), 2):
        running = {name: start(runs[name]) for name in names[i:i + 2]}
        for name, proc in running.items():
            out, err = proc.communicate()
            assert proc.returncode == 0, f"{name}: {err[-3000:]}"
            results[name] = json.loads(out.strip().splitlines()[-1])
    used = set()
    for name, result in results.items():
        kernels = {arch.lower() for _, arch in result["openblas"]}
        assert result["openblas"], f"{name}: no OpenBLAS loaded"
        if name in KERNELS:
            assert kernels <= KERNELS[name], (name, result["openblas"])
        if name == "no AVX-512 in numpy":
            assert not any(result["simd"].get(t) for t in avx512), result["simd"]
        elif avx512:
            assert all(result["simd"].get(t) for t in avx512), (name, result["simd"])
        used |= kernels
        assert not result["changed"], (f"{name} (kernel {sorted(kernels)}): "
                                       + json.dumps(result["changed"], indent=1))
    # every kernel family asked for really ran, each its own (never one kernel four
    # times): Haswell and Prescott everywhere, SkylakeX too where the CPU has AVX-512
    # (three kernels there; two on a CPU without it, where the default run is Haswell's)
    asked = [name for name in results if name in KERNELS]
    assert all(kernels & KERNELS[name] for name in asked
               for kernels in [{arch.lower() for _, arch in results[name]["openblas"]}]), results
    assert len(used) >= len(asked) >= 2 + bool(avx512), (used, asked)

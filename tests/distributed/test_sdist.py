"""Worker packaging: ``setup.py`` as ``--setup_file``.

Beam's stager (what every runner, Dataflow included, calls to package a pipeline's code)
builds an sdist from ``setup.py``; workers pip-install it. This test builds it exactly
that way from a copy of the checkout, checks it carries every module of the three
packages, installs it into a new virtual environment (no system site-packages) the way a
worker without internet does -- ``PIP_NO_INDEX=1``, everything from a local wheelhouse
(which the test fills from the package index first, build requirements of pyproject.toml
included) -- and runs the quickstart there
with the installed ``thresher`` command on two worker processes, from a folder outside
the checkout and without PYTHONPATH, so nothing can be imported from the source tree.
Slow: installing apache-beam and its dependencies into the venv takes ~40 s with a warm
pip cache, a few minutes with a cold one.

A second test installs the same staged sdist (pip, no dependencies: a worker's container
already holds Beam) into a new venv that sees none of the checkout and none of this
environment's thresher, and walks the installed package: every subpackage imports and
every module of the checkout is there, so a subpackage ``setup.py`` leaves out fails it.
"""
import glob
import json
import os
import site
import shutil
import subprocess
import sys
import tarfile

import pytest
import yaml
from apache_beam.options.pipeline_options import PipelineOptions
from apache_beam.portability.api import beam_runner_api_pb2
from apache_beam.runners.portability.stager import Stager

from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.planning.plan import make_plan

from .conftest import ROOT
from .release_check import check_release

PACKAGES = ("accounting", "transforms", "pipelines")
SKIP_DIRS = {".git", "out", "__pycache__", ".pytest_cache", "build", "dist", ".hypothesis"}


def _copy_checkout(dest):
    def ignore(folder, names):
        return [n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")]
    shutil.copytree(ROOT, dest, ignore=ignore)


def _stage_setup_file(setup_file, staging):
    """The sdist Beam stages for ``--setup_file`` (workflow.tar.gz)."""
    options = PipelineOptions([f"--setup_file={setup_file}"])
    artifacts = Stager.create_job_resources(options, staging,
                                            log_submission_env_dependencies=False)
    for artifact in artifacts:
        role = beam_runner_api_pb2.ArtifactStagingToRolePayload.FromString(artifact.role_payload)
        if role.staged_name == "workflow.tar.gz":
            return beam_runner_api_pb2.ArtifactFilePayload.FromString(artifact.type_payload).path
    raise AssertionError(f"Beam staged no workflow.tar.gz for --setup_file: {artifacts}")


# Run by the installed venv's Python outside the checkout: walk the installed package
# (importing every package on the way; an import error fails) and say where each is.
WALK = """
import importlib, json, pkgutil, sys
import thresher
def fail(name):
    raise SystemExit(f"cannot import {name}: {sys.exc_info()[1]!r}")
modules = ["thresher"] + [m.name for m in pkgutil.walk_packages(thresher.__path__, "thresher.", onerror=fail)]
packages = {m: importlib.import_module(m).__file__ for m in modules if m == "thresher"
            or hasattr(sys.modules.get(m), "__path__")}
print(json.dumps({"modules": sorted(modules), "packages": packages}))
"""


def checkout_modules(root):
    """The dotted module names the checkout's sources install as: src/thresher/*.py and
    every module of the three folders (a package is its __init__)."""
    found = set()
    for folder, prefix in [(os.path.join("src", "thresher"), "thresher")] + [
            (pkg, f"thresher.{pkg}") for pkg in PACKAGES]:
        for path in glob.glob(os.path.join(root, folder, "**", "*.py"), recursive=True):
            rel = os.path.relpath(path, os.path.join(root, folder))[:-3].replace(os.sep, ".")
            found.add(f"{prefix}.{rel}".removesuffix(".__init__"))
    return found


def walk_installed(python, env, cwd, venv):
    """The installed package walked by ``python``: its modules, each package imported from
    the venv (never from a checkout)."""
    done = subprocess.run([python, "-c", WALK], capture_output=True, text=True, env=env,
                          cwd=str(cwd), timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    walked = json.loads(done.stdout.strip().splitlines()[-1])
    outside = {m: f for m, f in walked["packages"].items()
               if not os.path.realpath(f).startswith(os.path.realpath(venv))}
    assert not outside, outside
    return walked


def _modules(root):
    return sorted(os.path.relpath(p, root) for pkg in PACKAGES
                  for p in glob.glob(os.path.join(root, pkg, "**", "*.py"), recursive=True))


@pytest.mark.slow
def test_setup_file_sdist_installs_into_clean_venv_and_runs_quickstart(tmp_path):
    source = str(tmp_path / "checkout")
    _copy_checkout(source)
    os.makedirs(tmp_path / "staging")
    tarball = _stage_setup_file(os.path.join(source, "setup.py"), str(tmp_path / "staging"))

    with tarfile.open(tarball) as tar:
        members = [m.name.split("/", 1)[1] for m in tar.getmembers() if "/" in m.name]
    shipped = sorted(m for m in members if m.endswith(".py") and m.split("/")[0] in PACKAGES)
    assert shipped == _modules(ROOT), "the sdist does not carry exactly the checkout's modules"
    assert "src/thresher/__init__.py" in members and "pyproject.toml" in members

    venv = str(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.path.join(venv, "bin") + os.pathsep + env.get("PATH", "")
    wheelhouse = str(tmp_path / "wheelhouse")
    fill = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "download", "-q",
                           "-d", wheelhouse, tarball, "setuptools>=64", "wheel"],
                          capture_output=True, text=True, env=env, timeout=1200)
    assert fill.returncode == 0, fill.stderr[-4000:]
    offline = dict(env, PIP_NO_INDEX="1", PIP_FIND_LINKS=wheelhouse)
    pip = subprocess.run([os.path.join(venv, "bin", "python"), "-m", "pip", "install", "-q",
                          tarball], capture_output=True, text=True, env=offline, timeout=1200)
    assert pip.returncode == 0, pip.stderr[-4000:]

    # The quickstart, copied outside the checkout with its data beside it.
    run_dir = tmp_path / "run"
    os.makedirs(run_dir / "data")
    with open(os.path.join(ROOT, "configs", "examples", "quickstart.yaml"), encoding="utf-8") as f:
        doc = yaml.safe_load(f)
    shutil.copy(os.path.join(ROOT, doc["input"]["path"]), run_dir / "data" / "quickstart.parquet")
    doc["input"]["path"] = "data/quickstart.parquet"
    doc["output"]["path"] = "out/quickstart"
    (run_dir / "quickstart.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))

    where = subprocess.run(
        [os.path.join(venv, "bin", "python"), "-c",
         "import importlib.util as u, thresher.pipelines.kinds as k; "
         "assert not any(u.find_spec(n) for n in ('accounting', 'pipelines', 'transforms')); "
         "print(k.__file__)"],
        capture_output=True, text=True, env=env, cwd=str(run_dir), timeout=120)
    assert where.returncode == 0, where.stderr[-2000:]
    assert where.stdout.strip().startswith(venv), where.stdout
    walked = walk_installed(os.path.join(venv, "bin", "python"), env, run_dir, venv)
    assert set(walked["modules"]) == checkout_modules(ROOT)

    done = subprocess.run(
        [os.path.join(venv, "bin", "thresher"), "run", "quickstart.yaml", "--",
         "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
        capture_output=True, text=True, env=env, cwd=str(run_dir), timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "released" in done.stdout

    spec = spec_mod.load(str(run_dir / "quickstart.yaml"))
    cwd = os.getcwd()
    try:  # the spec's paths are relative to where thresher ran
        os.chdir(run_dir)
        plan_report = make_plan(spec).report()
    finally:
        os.chdir(cwd)
    check_release(str(run_dir / "out" / "quickstart"), plan_report,
                  str(run_dir / "data" / "quickstart.parquet"))


@pytest.mark.slow
def test_setup_file_sdist_installs_every_subpackage(tmp_path):
    """The sdist Beam stages for ``--setup_file``, pip-installed (no dependencies, no
    index) into a new venv whose only other path is this environment's site-packages
    (Beam, NumPy; its editable thresher is not activated: no .pth there is read), imports
    every subpackage from the venv, and the installed modules are the checkout's."""
    source = tmp_path / "checkout"
    _copy_checkout(str(source))
    os.makedirs(tmp_path / "staging")
    tarball = _stage_setup_file(str(source / "setup.py"), str(tmp_path / "staging"))

    venv = str(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True, timeout=300)
    python = os.path.join(venv, "bin", "python")
    purelib = subprocess.run([python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True).stdout.strip()
    with open(os.path.join(purelib, "zz_dependencies.pth"), "w", encoding="utf-8") as f:
        f.write("\n".join(site.getsitepackages()) + "\n")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(PIP_NO_INDEX="1", PIP_DISABLE_PIP_VERSION_CHECK="1")
    pip = subprocess.run([python, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                          "--ignore-installed", tarball],
                         capture_output=True, text=True, env=env, timeout=600)
    assert pip.returncode == 0, pip.stderr[-4000:]

    run_dir = tmp_path / "elsewhere"
    os.makedirs(run_dir)
    walked = walk_installed(python, env, run_dir, venv)
    expected = checkout_modules(ROOT)
    assert {"thresher.transforms.randomness", "thresher.pipelines.kinds"} <= expected
    assert set(walked["modules"]) == expected
    assert set(walked["packages"]) == {m for m in expected if os.path.isdir(
        os.path.join(ROOT, *m.split(".")[1:])) or m == "thresher"}

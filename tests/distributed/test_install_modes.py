"""Every way thresher gets installed gives one ``thresher`` package and nothing else.

The repository keeps ``accounting/``, ``pipelines/`` and ``transforms/`` at the top (the
design's layout); they install as ``thresher.accounting``, ``thresher.pipelines`` and
``thresher.transforms``. Each test installs a *copy* of the checkout into a new virtual
environment (system site-packages visible, so Beam and NumPy need no download) and checks,
from the copy's root (where ``import accounting`` would find the source folder) and from
an unrelated folder, that the installed package answers and that no top-level
``accounting``, ``pipelines`` or ``transforms`` module is ever loaded. Slow: each builds a
package (~20-60 s); the editable installs fetch setuptools>=64 for their isolated build.
"""
import glob
import os
import shutil
import subprocess
import sys
import zipfile

import pytest

from .conftest import ROOT

pytestmark = pytest.mark.slow

SKIP_DIRS = {".git", "out", "__pycache__", ".pytest_cache", "build", "dist", ".hypothesis"}
TOP_LEVEL = ("accounting", "pipelines", "transforms")

# What the installed package must answer, run with the venv's Python: the public API
# imports, the calibration cache still finds the sources it fingerprints (a wrong path
# turns the cache off silently), and no generic top-level name was imported.
PROBE = """
import sys
from thresher import PerUserBound, Release, RandClip, NoisyThreshold, plan
import thresher.pipelines.cli
from thresher.pipelines.common.calibration_cache import fingerprint
assert fingerprint(), "the calibration cache found no sources to fingerprint"
stray = sorted(m for m in sys.modules if m.split('.')[0] in {top!r})
assert not stray, stray
print(thresher.pipelines.cli.__file__)
""".format(top=TOP_LEVEL)


def _copy_checkout(dest):
    def ignore(folder, names):
        return [n for n in names if n in SKIP_DIRS or n.endswith(".egg-info")]
    shutil.copytree(ROOT, dest, ignore=ignore)


def _venv(path):
    subprocess.run([sys.executable, "-m", "venv", "--system-site-packages", str(path)],
                   check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env["PATH"] = os.path.join(str(path), "bin") + os.pathsep + env.get("PATH", "")
    return os.path.join(str(path), "bin", "python"), env


def _run(cmd, env, cwd, timeout=900):
    done = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(cwd),
                          timeout=timeout)
    assert done.returncode == 0, f"{cmd}\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


def _probe(python, env, cwd):
    return _run([python, "-c", PROBE], env, cwd).strip()


def _pip(python, env, cwd, *args):
    return _run([python, "-m", "pip", "install", "-q", "--no-deps", *args], env, cwd)


def test_non_editable_install_from_another_folder_and_from_the_root(tmp_path):
    source = tmp_path / "checkout"
    _copy_checkout(source)
    python, env = _venv(tmp_path / "venv")
    _pip(python, env, tmp_path, str(source))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _probe(python, env, elsewhere).startswith(str(tmp_path / "venv"))
    # from the root, where accounting/ pipelines/ transforms/ are folders
    assert _probe(python, env, source).startswith(str(tmp_path / "venv"))
    # the README's second command runs pytest there: a release from the root, with two
    # worker processes that start in that folder too
    _run([os.path.join(str(tmp_path / "venv"), "bin", "thresher"), "run",
          "configs/examples/quickstart.yaml", "--overwrite", "--",
          "--direct_running_mode=multi_processing", "--direct_num_workers=2"],
         env, source, timeout=900)
    assert (source / "out" / "quickstart" / "released.parquet").exists()


def test_editable_install_with_the_machine_pip(tmp_path):
    """pip 23.2 (Python 3.11's bundled pip) makes a PEP 660 install from pyproject.toml;
    with setup.py alone it fell back to a legacy develop install that ignores package_dir."""
    source = tmp_path / "checkout"
    _copy_checkout(source)
    python, env = _venv(tmp_path / "venv")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    _pip(python, env, tmp_path, "-e", str(source))
    assert _probe(python, env, elsewhere) == str(source / "pipelines" / "cli.py")
    assert _probe(python, env, source) == str(source / "pipelines" / "cli.py")


def test_editable_install_with_current_pip(tmp_path):
    source = tmp_path / "checkout"
    _copy_checkout(source)
    python, env = _venv(tmp_path / "venv")
    _run([python, "-m", "pip", "install", "-q", "--upgrade", "pip"], env, tmp_path)
    _pip(python, env, tmp_path, "-e", str(source))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    assert _probe(python, env, elsewhere) == str(source / "pipelines" / "cli.py")


def test_wheel_holds_only_thresher_even_with_a_stale_build_folder(tmp_path):
    source = tmp_path / "checkout"
    _copy_checkout(source)
    for stale in ("build/lib/accounting/stale.py", "build/lib/thresher/stale.py",
                  "build/lib/pipelines/__init__.py"):
        os.makedirs(source / os.path.dirname(stale), exist_ok=True)
        (source / stale).write_text("STALE = True\n")
    python, env = _venv(tmp_path / "venv")
    _run([python, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(tmp_path / "dist"),
          str(source)], env, tmp_path)
    wheel, = glob.glob(str(tmp_path / "dist" / "thresher-*.whl"))
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names}
    assert tops == {"thresher", os.path.basename(wheel).split("-py")[0] + ".dist-info"}, tops
    assert not [n for n in names if n.endswith("stale.py")]
    for part in TOP_LEVEL:
        assert f"thresher/{part}/__init__.py" in names

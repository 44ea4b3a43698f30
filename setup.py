"""thresher: differentially private histograms over open-ended key spaces, on Apache Beam."""
import os
import shutil

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

VERSION = "0.1.0"

# The repository keeps the design's layout (accounting/, pipelines/, transforms/ at the
# top); they install as subpackages of the one ``thresher`` package, whose own
# ``__init__`` lives in src/thresher (a thresher/ folder at the root would shadow the
# installed package whenever Python starts there: pytest, multi-process Beam workers).
PARTS = ("accounting", "pipelines", "transforms")


def _packages():
    found = ["thresher"]
    for part in PARTS:
        found += ["thresher." + name for name in find_packages(include=[part, part + ".*"])]
    return found


class CleanBuildPy(build_py):
    """build_py that empties its build folder first: a stale build/lib from an earlier
    install (for instance one with top-level accounting/) would otherwise be copied into
    the wheel."""

    def run(self):
        if os.path.isdir(self.build_lib):
            shutil.rmtree(self.build_lib)
        super().run()

setup(
    name="thresher",
    version=VERSION,
    description=(
        "Differentially private histograms (counts per key over open-ended key spaces) "
        "with user-level privacy and exact accounting, as Apache Beam pipelines."
    ),
    long_description=open("README.md", encoding="utf-8").read() if __import__("os").path.exists("README.md") else "",
    long_description_content_type="text/markdown",
    license="Apache-2.0",
    python_requires=">=3.10",
    # Subpackages too (thresher.pipelines.kinds): workers install this as --setup_file.
    packages=_packages(),
    package_dir={"thresher": "src/thresher", **{f"thresher.{part}": part for part in PARTS}},
    cmdclass={"build_py": CleanBuildPy},
    install_requires=[
        "apache-beam>=2.60",
        "numpy>=1.26",
        "scipy>=1.11",
        "pyarrow>=14",
        "PyYAML>=6",
        # The spec's JSON Schema is checked with it (pipelines/specs/schema.py): pure Python, and
        # the same library Beam's own YAML support (apache-beam[yaml]) validates with.
        "jsonschema>=4.18,<5",
        # AES for the secret-keyed user identities (transforms/randomness/user_identity.py); Apache
        # Beam requires it too, so it adds nothing to an install.
        "cryptography>=39",
    ],
    extras_require={
        # Test-only oracles: peer libraries are used to cross-check numbers, never at run time.
        # apache-beam[yaml] because the tests run the Beam YAML example.
        # pytest-xdist: the README's test command runs the suite on both cores (-n 2).
        "dev": ["pytest>=8.2", "pytest-xdist>=3.5", "hypothesis>=6.100", "mpmath>=1.3", "dp-accounting>=0.4",
                "python-dp>=1.1", "apache-beam[yaml]>=2.60", "matplotlib>=3.7",
                "psycopg[binary]>=3.1",
                # tests/pipelines/test_released_bytes_frozen.py asks which OpenBLAS kernel
                # each run really used (issue 42: the same bytes under every kernel).
                "threadpoolctl>=3.1",
                # tests/distributed/test_sdist.py builds the staged --setup_file sdist with
                # pip and no index (--no-build-isolation): the build requirements must be here.
                "setuptools>=64", "wheel"],
        # thresher report --html draws its plots with matplotlib.
        "report": ["matplotlib>=3.7"],
        "bench": ["pipeline-dp>=0.2"],
        # budget.ledger: postgresql://... (pipelines/ledgers/postgres_backend.py).
        "postgres": ["psycopg[binary]>=3.1"],
        "yaml": ["apache-beam[yaml]>=2.60"],
        # Object storage for input.path / output.path (docs/running.md).
        "gcp": ["apache-beam[gcp]>=2.60"],
        "aws": ["apache-beam[aws]>=2.60"],
    },
    entry_points={"console_scripts": ["thresher=thresher.pipelines.cli:main"]},
    include_package_data=True,
)

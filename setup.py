"""thresher: differentially private histograms over open-ended key spaces, on Apache Beam."""
from setuptools import find_packages, setup

VERSION = "0.1.0"

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
    # Subpackages too (pipelines.kinds): workers install this as --setup_file.
    packages=find_packages(include=["accounting", "accounting.*", "transforms", "transforms.*",
                                    "pipelines", "pipelines.*"]),
    install_requires=[
        "apache-beam>=2.60",
        "numpy>=1.26",
        "scipy>=1.11",
        "pyarrow>=14",
        "PyYAML>=6",
        # The spec's JSON Schema is checked with it (pipelines/specs/schema.py): pure Python, and
        # the same library Beam's own YAML support (apache-beam[yaml]) validates with.
        "jsonschema>=4.18,<5",
    ],
    extras_require={
        # Test-only oracles: peer libraries are used to cross-check numbers, never at run time.
        # apache-beam[yaml] because the tests run the Beam YAML example.
        "dev": ["pytest>=8.2", "hypothesis>=6.100", "mpmath>=1.3", "dp-accounting>=0.4",
                "python-dp>=1.1", "apache-beam[yaml]>=2.60", "matplotlib>=3.7",
                "psycopg[binary]>=3.1"],
        # thresher report --html draws its plots with matplotlib.
        "report": ["matplotlib>=3.7"],
        "bench": ["pipeline-dp>=0.2"],
        # budget.ledger: postgresql://... (pipelines/ledgers/ledger_postgres.py).
        "postgres": ["psycopg[binary]>=3.1"],
        "yaml": ["apache-beam[yaml]>=2.60"],
        # Object storage for input.path / output.path (docs/running.md).
        "gcp": ["apache-beam[gcp]>=2.60"],
        "aws": ["apache-beam[aws]>=2.60"],
    },
    entry_points={"console_scripts": ["thresher=pipelines.cli:main"]},
    include_package_data=True,
)

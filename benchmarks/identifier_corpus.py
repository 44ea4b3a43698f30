"""A small-population corpus (issue 28): the distinct identifiers (Python NAME tokens,
keywords excluded) of every .py file of a few installed libraries, one user per file.

About 3,000 users (numpy, scipy, pandas and pyarrow as installed here: 2,980 files) with
a heavy tail (``self``, ``np``, ``return``-free names shared by thousands of files; most
names in one file), users holding far more distinct keys than any sensible bound. It is
built from data installed on the machine, offline, and differs from
``benchmarks/docstring_corpus.py`` (docstring words of every file, 10,783 users).

    python -m benchmarks.identifier_corpus [--data-dir DIR]     # builds and describes it
"""
import argparse
import keyword
import os
import sys
import time
import tokenize

import pyarrow as pa
import pyarrow.parquet as pq

PACKAGES = ("numpy", "scipy", "pandas", "pyarrow")
DEFAULT_DATA_DIR = os.path.join(os.path.expanduser("~"), ".cache", "thresher-bench")


def site_root():
    """Where the packages are installed: numpy's folder's parent (a virtualenv's own
    site-packages, site.getsitepackages()[0], may not hold them: an empty corpus)."""
    import numpy
    return os.path.dirname(os.path.dirname(os.path.abspath(numpy.__file__)))


def python_files(packages=PACKAGES, root=None):
    root = root or site_root()
    out = []
    for package in packages:
        for folder, dirs, files in os.walk(os.path.join(root, package)):
            dirs.sort()
            out.extend(os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
    return sorted(out)


def identifiers(path):
    """The distinct identifiers of one file (empty when it does not tokenize)."""
    names = set()
    try:
        with open(path, "rb") as handle:
            for tok in tokenize.tokenize(handle.readline):
                if tok.type == tokenize.NAME and not keyword.iskeyword(tok.string):
                    names.add(tok.string)
    except (tokenize.TokenError, SyntaxError, UnicodeDecodeError, OSError, IndentationError):
        return set()
    return names


def build(packages=PACKAGES, root=None):
    """Table(user, word): one row per distinct (file, identifier)."""
    root = root or site_root()
    users, words = [], []
    for path in python_files(packages, root):
        names = identifiers(path)
        rel = os.path.relpath(path, root)
        users.extend([rel] * len(names))
        words.extend(sorted(names))
    return pa.table({"user": pa.array(users), "word": pa.array(words)})


def cached(data_dir=DEFAULT_DATA_DIR, packages=PACKAGES):
    """The corpus as a parquet path under ``data_dir`` (built once)."""
    name = f"identifiers_{'_'.join(packages)}_py{sys.version_info[0]}{sys.version_info[1]}.parquet"
    path = os.path.join(data_dir, name)
    if not os.path.exists(path):
        os.makedirs(data_dir, exist_ok=True)
        pq.write_table(build(packages), path + ".part")
        os.replace(path + ".part", path)
    return path


def describe(table):
    users = table.group_by(["user"]).aggregate([]).num_rows
    words = table.group_by(["word"]).aggregate([]).num_rows
    return f"{table.num_rows:,} (user, word) rows, {users:,} users, {words:,} distinct words"


def main(argv=None):
    ap = argparse.ArgumentParser()
    ap.add_argument("--data-dir", default=DEFAULT_DATA_DIR)
    args = ap.parse_args(argv)
    t0 = time.perf_counter()
    path = cached(args.data_dir)
    print(f"{path}: {describe(pq.read_table(path))} ({time.perf_counter() - t0:.0f} s)")


if __name__ == "__main__":
    main()

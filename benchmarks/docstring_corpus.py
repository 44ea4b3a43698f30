"""A real corpus for heavy hitters, assembled offline: the words of the docstrings of
every Python module installed with this interpreter (standard library and
site-packages). The privacy unit (user) is one docstring (``--unit docstring``, the
default: a module's, class's or function's docstring is one document written for one
object) or one source file (``--unit file``).

Why it is representative of thresher's use (counts per key by distinct users over an
open-ended key space): the key space (words, identifiers, misspellings, non-English
text, multi-byte UTF-8 such as ``é`` or ``×``) is unbounded and Zipf-like, each user
(file) holds many distinct keys, far more than a contribution bound C = 16, and the
head is shared by thousands of users while most keys belong to one user only.

    python -m benchmarks.docstring_corpus OUT.parquet [--unit docstring|file] [--max-files N]

Columns: ``user`` (the file's path relative to the library root, plus ``:LINE`` of the
docstring's object with ``--unit docstring``) and ``word`` (lower-cased run of letters,
2..30 characters; Unicode letters kept), one row per distinct (user, word). Files are visited in sorted order, so the corpus is the same on
every run of the same installation.
"""
import argparse
import ast
import os
import re
import sys
import sysconfig
import warnings

import pyarrow as pa
import pyarrow.parquet as pq

WORD = re.compile(r"[^\W\d_]{2,30}")


def library_root():
    return sysconfig.get_paths()["stdlib"]


def python_files(root, max_files=None):
    out = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            if name.endswith(".py"):
                out.append(os.path.join(folder, name))
    out.sort()
    return out[:max_files] if max_files else out


def docstring_words(path):
    """{line: distinct lower-cased words} of a file's module, class and function docstrings
    (line 0 for the module's)."""
    try:
        with open(path, "rb") as handle:
            source = handle.read()
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            tree = ast.parse(source)
    except (SyntaxError, ValueError, OSError, RecursionError):
        return {}
    docs = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            doc = ast.get_docstring(node, clean=False)
            if doc:
                words = {w.lower() for w in WORD.findall(doc)}
                if words:
                    docs.setdefault(getattr(node, "lineno", 0), set()).update(words)
    return docs


def build(max_files=None, units=("docstring", "file")):
    """{unit: pyarrow.Table(user, word)} for each privacy unit asked for (one pass)."""
    root = library_root()
    rows = {unit: ([], []) for unit in units}
    for path in python_files(root, max_files):
        rel = os.path.relpath(path, root)
        docs = docstring_words(path)
        if "docstring" in rows:
            users, words = rows["docstring"]
            for line in sorted(docs):
                for w in sorted(docs[line]):
                    users.append(f"{rel}:{line}")
                    words.append(w)
        if "file" in rows:
            users, words = rows["file"]
            for w in sorted(set().union(*docs.values())):
                users.append(rel)
                words.append(w)
    return {unit: pa.table({"user": pa.array(u, pa.string()), "word": pa.array(w, pa.string())})
            for unit, (u, w) in rows.items()}


def describe(table):
    return (f"{table.num_rows} (user, word) rows, "
            f"{len(set(table.column('user').to_pylist()))} users, "
            f"{len(set(table.column('word').to_pylist()))} distinct words")


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--unit", choices=("docstring", "file"), default="docstring")
    ap.add_argument("--max-files", type=int, default=None)
    args = ap.parse_args(argv)
    table = build(args.max_files, units=(args.unit,))[args.unit]
    pq.write_table(table, args.out)
    print(f"{args.out}: {describe(table)}, user = one {args.unit} "
          f"(python {sys.version.split()[0]}, {library_root()})")


if __name__ == "__main__":
    main()

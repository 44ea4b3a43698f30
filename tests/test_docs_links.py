"""The README and docs/ stay true to the repository (issue 37, part 3).

- README.md is at most 150 lines and opens with the project's two set-up commands, the
  ones .ci/run runs;
- every relative link in README.md and docs/*.md resolves: the file exists and a
  `#anchor` names a heading of the target (GitHub's slugs);
- every repository path they cite exists: `pipelines/running/release.py`, `tests/x/test_y.py::name`
  (the name defined in that file), `pipelines/running/release._UserShards` (module and attribute),
  a bare `test_x.py` or `bench_x.py` (some file of that name under tests/ or benchmarks/),
  and a dotted module path, `thresher.pipelines.api.Release` or `pipelines.api.Release`
  (its first name after the module defined or imported there). Paths of files a user or a
  benchmark writes are listed in OUTPUT_PATHS.

Each check is also run on a small made-up page, so a check that matched nothing would fail.
"""
import ast
import fnmatch
import functools
import glob
import os
import re

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PAGES = ["README.md"] + sorted(os.path.relpath(p, ROOT)
                               for p in glob.glob(os.path.join(ROOT, "docs", "*.md")))

SETUP_COMMANDS = (
    'python -m pip install . && thresher run configs/examples/quickstart.yaml --overwrite',
    'python -m pip install -e ".[dev]" && python -m pytest tests -q -n 2',
)
README_MAX_LINES = 150

# Cited paths that are not in the repository on purpose: data the benchmarks generate
# (gitignored) -- each entry is a path prefix.
OUTPUT_PATHS = ("benchmarks/data/",)

TOP_DIRS = ("accounting", "pipelines", "transforms", "tests", "benchmarks", "configs", "docs",
            "src", ".ci")
_PATH = re.compile(r"(?<![\w./~$@:-])((?:%s)/[\w.*/-]*[\w*])(::[\w*]+)?"
                   % "|".join(re.escape(d) for d in TOP_DIRS))
_BARE = re.compile(r"(?<![\w./~$@:-])((?:test|bench)_\w+\.py)(::[\w*]+)?")
_DOTTED = re.compile(r"(?<![\w./~$@:-])(?:thresher\.)?((?:accounting|transforms|pipelines)(?:\.\w+)+)")
_IMPORT = re.compile(r"^[ \t]*from[ \t]+((?:thresher\.)?(?:accounting|transforms|pipelines)[\w.]*)[ \t]+import[ \t]+"
                     r"([\w, \t]+)", re.M)
_NOT_MODULES = ("md", "py", "txt", "yaml", "yml", "json", "toml", "cfg")   # accounting.md
_FENCE = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.S | re.M)
_LINK = re.compile(r"!?\[[^\]\n]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")


def _read(page):
    with open(os.path.join(ROOT, page), encoding="utf-8") as handle:
        return handle.read()


# --- anchors -----------------------------------------------------------------------------

def slug(heading):
    """GitHub's anchor for a heading: markup dropped, lower case, every character but
    letters, digits, '_', '-' and spaces removed, spaces turned into '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)       # a link: its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text):
    """The anchors of a page's headings (outside fenced code), duplicates numbered."""
    seen, out = {}, set()
    for line in _FENCE.sub("", text).splitlines():
        match = re.match(r"^ {0,3}#{1,6}[ \t]+(.*?)[ \t#]*$", line)
        if not match:
            continue
        base = slug(match.group(1))
        count = seen.get(base, 0)
        seen[base] = count + 1
        out.add(base if count == 0 else "%s-%d" % (base, count))
    for name in re.findall(r"<a\s+(?:name|id)=\"([^\"]+)\"", text):
        out.add(name)
    return out


def links(text):
    """The targets of a page's Markdown links, outside code blocks and code spans."""
    prose = _FENCE.sub("", text)
    prose = re.sub(r"`[^`\n]*`", "", prose)
    return [m.group(1) for m in _LINK.finditer(prose)]


def broken_links(page, text):
    problems = []
    here = os.path.dirname(os.path.join(ROOT, page))
    for target in links(text):
        if re.match(r"^[a-z][a-z0-9+.-]*:", target):             # http:, https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        if not path:                                              # an anchor on this page
            if anchor not in anchors(text):
                problems.append("%s: %s (no heading with that anchor)" % (page, target))
            continue
        full = os.path.normpath(os.path.join(here, path))
        if not os.path.exists(full):
            problems.append("%s: %s (no such file)" % (page, target))
            continue
        if anchor and full.endswith(".md"):
            with open(full, encoding="utf-8") as handle:
                if anchor not in anchors(handle.read()):
                    problems.append("%s: %s (no heading with that anchor)" % (page, target))
    return problems


# --- cited repository paths ----------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _names(path):
    with open(path, encoding="utf-8") as handle:
        tree = ast.parse(handle.read())
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names.update((a.asname or a.name).split(".")[0] for a in node.names)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update(n.id for n in ast.walk(target) if isinstance(n, ast.Name))
    return frozenset(names)


def _defines(path, name):
    """Whether the Python file defines or imports `name` (a function, class, assignment or
    imported name, at any depth); `name` may hold `*` as a wildcard."""
    return any(fnmatch.fnmatchcase(n, name) for n in _names(path))


def _module_file(parts):
    """The file of a dotted module path under ROOT, and the rest of the parts."""
    for cut in range(len(parts), 0, -1):
        base = os.path.join(ROOT, *parts[:cut])
        if os.path.isfile(base + ".py"):
            return base + ".py", parts[cut:]
        if os.path.isfile(os.path.join(base, "__init__.py")):
            return os.path.join(base, "__init__.py"), parts[cut:]
    return None, parts


def _everywhere(name):
    return [os.path.join(d, f) for top in ("tests", "benchmarks")
            for d, _, files in os.walk(os.path.join(ROOT, top)) for f in files if f == name]


def _check_path(cited, member):
    """None if the cited path (and `::member`) exists, else why not."""
    if cited.startswith(OUTPUT_PATHS) or (cited + "/").startswith(OUTPUT_PATHS):
        return None
    full = os.path.join(ROOT, cited)
    files = glob.glob(full) if "*" in cited else ([full] if os.path.exists(full) else [])
    if not files and not cited.endswith(".py"):
        head, tail = os.path.split(cited)
        module, dot, attribute = tail.partition(".")
        if os.path.isfile(os.path.join(ROOT, head, module + ".py")):
            # pipelines/running/release._UserShards: a module and one of its names
            files = [os.path.join(ROOT, head, module + ".py")]
            if dot and attribute not in ("md", "txt", "yaml", "yml", "json", "parquet", "csv"):
                member = member or "::" + attribute.split(".")[0]
    if not files:
        return "no such file"
    if member:
        name = re.sub(r"\[.*$", "", member[2:])
        if not any(f.endswith(".py") and _defines(f, name) for f in files):
            return "%s is not defined there" % name
    return None


def stale_paths(page, text):
    problems = []
    for match in _PATH.finditer(text):
        why = _check_path(match.group(1), match.group(2))
        if why:
            problems.append("%s: `%s%s` (%s)" % (page, match.group(1), match.group(2) or "", why))
    for match in _BARE.finditer(text):
        found = _everywhere(match.group(1))
        member = match.group(2)
        if not found:
            problems.append("%s: `%s` (no such file under tests/ or benchmarks/)" % (page, match.group(1)))
        elif member and not any(_defines(f, re.sub(r"\[.*$", "", member[2:])) for f in found):
            problems.append("%s: `%s%s` (not defined there)" % (page, match.group(1), member))
    for match in _DOTTED.finditer(text):
        parts = match.group(1).split(".")
        if parts[1] in _NOT_MODULES:
            continue
        found, rest = _module_file(parts)
        if found is None:
            problems.append("%s: `%s` (no such module)" % (page, match.group(0)))
        elif rest and not _defines(found, rest[0]):
            problems.append("%s: `%s` (%s not defined in %s)"
                            % (page, match.group(0), rest[0], os.path.relpath(found, ROOT)))
    for match in _IMPORT.finditer(text):           # an example's import line, as a user types it
        module, names = match.group(1), [n.split()[0] for n in match.group(2).split(",") if n.strip()]
        found, rest = _module_file(module.split(".")[1:] if module.startswith("thresher.") else [])
        if not module.startswith("thresher.") or found is None or rest:
            problems.append("%s: `from %s import` (import it as thresher.%s)"
                            % (page, module, module.replace("thresher.", "", 1)))
            continue
        problems.extend("%s: `from %s import %s` (not defined there)" % (page, module, name)
                        for name in names if not _defines(found, name)
                        and not _module_file(module.split(".")[1:] + [name])[1] == [])
    return problems


# --- the tests -----------------------------------------------------------------------------

@pytest.mark.parametrize("page", PAGES)
def test_every_relative_link_resolves(page):
    assert broken_links(page, _read(page)) == []


@pytest.mark.parametrize("page", PAGES)
def test_every_cited_repository_path_exists(page):
    assert stale_paths(page, _read(page)) == []


def test_the_readme_is_one_screen_and_opens_with_the_two_set_up_commands():
    text = _read("README.md")
    assert len(text.splitlines()) <= README_MAX_LINES
    blocks = _code_blocks(text)
    assert [b.strip() for b in blocks[:2]] == list(SETUP_COMMANDS)
    ci = _read(os.path.join(".ci", "run")).replace("pip install -q ", "pip install ")
    for command in SETUP_COMMANDS:           # CI runs the README's commands
        assert all(part.strip() in ci for part in command.split("&&")), command


def test_every_docs_page_is_linked_from_the_readme():
    linked = {os.path.normpath(target.partition("#")[0]) for target in links(_read("README.md"))}
    assert [page for page in PAGES[1:] if page not in linked] == []


def _code_blocks(text):
    """Fenced and indented (4 spaces after a blank line) code blocks, in order."""
    blocks, lines, i = [], text.splitlines(), 0
    while i < len(lines):
        if lines[i].startswith(("```", "~~~")):
            j = i + 1
            while j < len(lines) and not lines[j].startswith(lines[i][:3]):
                j += 1
            blocks.append("\n".join(lines[i + 1:j]))
            i = j + 1
        elif lines[i].startswith("    ") and (i == 0 or not lines[i - 1].strip()):
            j = i
            while j < len(lines) and (lines[j].startswith("    ") or not lines[j].strip()):
                j += 1
            blocks.append("\n".join(line[4:] for line in lines[i:j]))
            i = j
        else:
            i += 1
    return blocks


# --- the checks catch what they are for (a made-up page) --------------------------------

def test_the_checks_find_broken_links_and_stale_paths():
    page = "docs/made_up.md"
    text = "\n".join([
        "# A page", "## Its `second` heading (with ε, §1)", "## Its second heading, again",
        "[ok](#its-second-heading-with-ε-1) [ok](accounting.md#laplace-thresholding)",
        "[bad](#no-such-heading) [bad](no_such_page.md) [bad](accounting.md#no-such-heading)",
        "```", "# not a heading", "```",
        "`pipelines/specs/spec.py` `pipelines/no_such_module.py` `tests/test_docs_links.py::slug`",
        "`tests/test_docs_links.py::no_such_name` `test_docs_links.py` `test_no_such_file.py`",
        "see transforms/randomness/keyed_random.py. `pipelines/specs/spec._no_such_attribute`",
        "`benchmarks/data/corpus.parquet` `thresher.pipelines.api.Release` `thresher.pipelines.nope`",
        "`thresher.accounting.gaussian.no_such_function` `tests/pipelines/test_*.py`",
        "(`pipelines.io.num_shards_for`; accounting.md; `accounting.sample_threshold.calibrate`)",
        "```python", "from accounting import pws", "from thresher.accounting.pws import pld, nope",
        "from thresher.pipelines.api import Release", "```",
    ])
    assert slug("Its `second` heading (with ε, §1)") == "its-second-heading-with-ε-1"
    assert "its-second-heading-again" in anchors(text) and "not-a-heading" not in anchors(text)
    assert [p.split(": ", 1)[1] for p in broken_links(page, text)] == [
        "#no-such-heading (no heading with that anchor)",
        "no_such_page.md (no such file)",
        "accounting.md#no-such-heading (no heading with that anchor)",
    ]
    found = [p.split(": ", 1)[1] for p in stale_paths(page, text)]
    assert found == [
        "`pipelines/no_such_module.py` (no such file)",
        "`tests/test_docs_links.py::no_such_name` (no_such_name is not defined there)",
        "`pipelines/specs/spec._no_such_attribute` (_no_such_attribute is not defined there)",
        "`test_no_such_file.py` (no such file under tests/ or benchmarks/)",
        "`thresher.pipelines.nope` (nope not defined in pipelines/__init__.py)",
        "`thresher.accounting.gaussian.no_such_function` (no_such_function not defined in "
        "accounting/gaussian.py)",
        "`pipelines.io.num_shards_for` (io not defined in pipelines/__init__.py)",
        "`from accounting import` (import it as thresher.accounting)",
        "`from thresher.accounting.pws import nope` (not defined there)",
    ], found

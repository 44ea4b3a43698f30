"""Randomness is passed, never found (issue 44 item 5; transforms/randomness/keyed_random.py,
"How a stage that draws gets the secret and its label").

The release hands each stage that draws its keyed source and label path
(``keyed_random.KeyedDraws``) as a constructor argument. Before, a stage given no source
took the source of whatever release was being built from a module-level stack
(``keyed_random.building``), and its label from Beam's private
``pipeline._current_transform()``: a stage a kind forgot to hand the source to drew from
the release's secret under a label nobody chose, and a Beam upgrade could change the
private API the draws depended on.

- The package holds no ambient build-time state a draw could come from, and reads no
  private attribute of a Beam pipeline (a source scan: it fails on a planted
  ``_current_transform`` call or a planted stack pushed and popped by a context manager).
- A stage given no source, or a source without its own label, refuses when it is built,
  naming ``rng_factory`` (a TypeError / ValueError that is also a ``ThresherError``,
  exit 2), inside a release being built as well as on its own.
- A stage's draws are keyed by the label path it is handed, whatever Beam label it is
  applied under (and only by it).

No statistical assertion: no false-failure probability.
"""
import ast
import os

import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.runners.portability.fn_api_runner import FnApiRunner

import thresher
from thresher.errors import ThresherError
from thresher.transforms.randomness import keyed_random

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
PACKAGE_DIRS = ("transforms", "pipelines", "accounting", os.path.join("src", "thresher"))
SECRET = b"randomness passed test secret.."

# Beam's private build state: the transform being expanded and its stack
_BEAM_BUILD_STATE = {"_current_transform", "transforms_stack", "_current_annotations"}
_PUSH = {"append", "insert", "add", "appendleft", "extend", "setdefault", "update", "set"}
_POP = {"pop", "popleft", "remove", "discard", "clear", "reset"}


def _package_files():
    for folder in PACKAGE_DIRS:
        for dirpath, _, names in os.walk(os.path.join(ROOT, folder)):
            for name in names:
                if name.endswith(".py"):
                    yield os.path.join(dirpath, name)


def _is_pipeline(node):
    """``pipeline``, ``p`` or ``<anything>.pipeline``: an expression naming a Beam pipeline."""
    return ((isinstance(node, ast.Name) and node.id in ("pipeline", "p"))
            or (isinstance(node, ast.Attribute) and node.attr == "pipeline"))


def _is_context_manager(function):
    return any(ast.unparse(d).split(".")[-1] in ("contextmanager", "asynccontextmanager")
               for d in function.decorator_list)


def _module_names(tree):
    names = set()
    for node in tree.body:
        targets = (node.targets if isinstance(node, ast.Assign)
                   else [node.target] if isinstance(node, ast.AnnAssign) else [])
        names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def _ambient_stacks(tree):
    """Module-level names that one context manager both pushes onto and pops from (the
    shape of an ambient stack: state set for whatever is built inside a ``with``), and
    module-level ``ContextVar`` / ``threading.local`` objects."""
    module = _module_names(tree)
    found = []
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                ast.unparse(node.value.func).split(".")[-1] in ("ContextVar", "local"):
            found.append(ast.unparse(node.targets[0]))
    for function in ast.walk(tree):
        if not isinstance(function, (ast.FunctionDef, ast.AsyncFunctionDef)) \
                or not _is_context_manager(function):
            continue
        pushed, popped = set(), set()
        for call in ast.walk(function):
            if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) \
                    and isinstance(call.func.value, ast.Name) and call.func.value.id in module:
                if call.func.attr in _PUSH:
                    pushed.add(call.func.value.id)
                if call.func.attr in _POP:
                    popped.add(call.func.value.id)
            if isinstance(call, ast.Delete):
                popped.update(t.value.id for t in call.targets
                              if isinstance(t, ast.Subscript) and isinstance(t.value, ast.Name))
        found.extend(f"{function.name}: {name}" for name in sorted(pushed & popped))
    return found


def violations(files=None):
    """{file: [what]} of every private Beam build state read and ambient stack found."""
    out = {}
    for path in files or _package_files():
        with open(path, encoding="utf-8") as handle:
            tree = ast.parse(handle.read(), path)
        found = []
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and node.attr in _BEAM_BUILD_STATE:
                found.append(f"line {node.lineno}: {ast.unparse(node)}")
            elif isinstance(node, ast.Attribute) and node.attr.startswith("_") \
                    and not node.attr.startswith("__") and _is_pipeline(node.value):
                found.append(f"line {node.lineno}: private pipeline attribute "
                             f"{ast.unparse(node)}")
        found.extend(f"ambient stack {s}" for s in _ambient_stacks(tree))
        if found:
            out[os.path.relpath(path, ROOT)] = found
    return out


def test_no_private_beam_build_state_and_no_ambient_stack_in_the_package():
    found = violations()
    assert not found, found


_PLANTED_CURRENT = '''
def stage_name(pvalue):
    return pvalue.pipeline._current_transform().full_label
'''

_PLANTED_STACK = '''
import contextlib
_BUILDING = []

@contextlib.contextmanager
def building(source):
    _BUILDING.append(source)
    try:
        yield
    finally:
        _BUILDING.pop()
'''

_PLANTED_CONTEXTVAR = '''
import contextvars
_SOURCE = contextvars.ContextVar("source")
'''


@pytest.mark.parametrize("planted", [_PLANTED_CURRENT, _PLANTED_STACK, _PLANTED_CONTEXTVAR])
def test_the_scan_finds_a_planted_current_transform_or_ambient_stack(tmp_path, planted):
    """The scan itself, on the two things it must catch (what keyed_random.py held
    before) and on a context variable."""
    path = tmp_path / "planted.py"
    path.write_text(planted, encoding="utf-8")
    assert violations([str(path)])


# -- a stage given no source refuses -----------------------------------------------------------

def _counts():
    return pa.table({"word": [f"w{i}" for i in range(20)],
                     "count": pa.array(np.arange(20) + 100, pa.int64())})


_NT_PARAMS = {"noise": "laplace", "scale": 1.0, "pre_threshold": 0, "threshold": 1.0}


def _stages(rng_factory):
    """A stage of each family that draws: bounding, choice of C, per-key release."""
    from thresher.accounting import pws
    return [
        thresher.PerUserBound(["word"], 2, rng_factory=rng_factory),
        thresher.RandClip(["word"], 2, rng_factory=rng_factory),
        thresher.ChooseContributionBound(
            ["word"], candidates=[1, 2, 4], epsilon=1.0, model="l0", score="laplace_l0",
            score_params={"epsilon": 1.0, "delta": 1e-6}, max_bound=4,
            rng_factory=rng_factory),
        thresher.SampleAndThreshold({"sampling_rate": 0.5, "threshold": 1},
                                    rng_factory=rng_factory),
        thresher.NoisyThreshold(_NT_PARAMS, rng_factory=rng_factory),
        thresher.SanitizeSample(pws.calibrate(1.0, 1e-6, 1), ["word"], rng_factory=rng_factory),
    ]


def _build(transform):
    pipeline = beam.Pipeline(runner=FnApiRunner())
    _ = pipeline | beam.Create([_counts()]) | transform     # expansion; never run


@pytest.mark.parametrize("index", range(6))
def test_a_stage_given_no_source_is_a_type_error_naming_rng_factory(index):
    with pytest.raises(TypeError, match=r"given no secret: pass\s+rng_factory=") as caught:
        _build(_stages(None)[index])
    assert isinstance(caught.value, ThresherError) and caught.value.exit_code == 2


@pytest.mark.parametrize("index", range(6))
def test_a_stage_given_a_source_without_a_label_is_a_value_error_naming_rng_factory(index):
    """A bare source would key every stage it is given by one label, so two stages would
    draw the same noise: refused (before, the stage's Beam label was looked up)."""
    source = keyed_random.KeyedSource(SECRET)
    for unlabelled in (source, keyed_random.KeyedDraws(source)):
        with pytest.raises(ValueError, match=r"rng_factory=.*names no stage") as caught:
            _build(_stages(unlabelled)[index])
        assert isinstance(caught.value, ThresherError) and caught.value.exit_code == 2


def test_a_kind_that_forgets_the_source_fails_the_release_build(tmp_path, monkeypatch):
    """A kind's release stage built without the draws the release hands it refuses while
    the release is built: before, it silently drew from the release's secret through
    the ambient stack, under a label nobody handed it."""
    import pyarrow.parquet as pq
    import yaml
    from thresher.pipelines.kinds import gaussian
    from thresher.pipelines.planning.plan import make_plan
    from thresher.pipelines.running import release
    from thresher.pipelines.specs import spec as spec_mod
    from thresher.transforms.selection.noisy_threshold import NoisyThreshold

    def forgetful(counts, params, key_columns, rng_factory=None):
        return counts | "NoisyThreshold" >> NoisyThreshold(params)      # no rng_factory
    monkeypatch.setattr(gaussian.KIND, "release", forgetful)
    data = tmp_path / "in.parquet"
    pq.write_table(pa.table({"user_id": [f"u{i % 30}" for i in range(200)],
                             "word": [f"w{i % 7}" for i in range(200)]}), data)
    spec_path = tmp_path / "spec.yaml"
    spec_path.write_text(yaml.safe_dump({
        "name": "forgetful", "input": {"path": str(data), "format": "parquet",
                                       "user": "user_id", "keys": ["word"]},
        "privacy": {"epsilon": 1.0, "delta": 1e-8}, "bounding": {"max_keys_per_user": 2},
        "mechanism": {"kind": "gaussian"}, "output": {"path": str(tmp_path / "out")}}))
    plan = make_plan(spec_mod.load(str(spec_path)))
    with pytest.raises(TypeError, match="rng_factory="):
        release.run(plan, [], rng_factory=keyed_random.KeyedSource(SECRET))
    assert not (tmp_path / "out").exists()


# -- the label keys the draws ------------------------------------------------------------------

_OUT = []     # filled by _keep in this process (the in-process runner unpickles it here)


def _keep(tables):
    _OUT.extend(r for t in tables for r in zip(t.column("word").to_pylist(),
                                               t.column("count").to_pylist()))


def _released(rng_factory, beam_label):
    """(word, noisy count) of NoisyThreshold under ``rng_factory``, applied as ``beam_label``."""
    params = {"noise": "discrete_gaussian", "sigma": 40.0, "pre_threshold": 0,
              "threshold": -10**6}
    _OUT.clear()
    with beam.Pipeline(runner=FnApiRunner()) as p:
        released = (p | beam.Create([_counts()])
                    | beam_label >> thresher.NoisyThreshold(params, rng_factory=rng_factory))
        _ = released | beam.combiners.ToList() | beam.Map(_keep)
    return sorted(_OUT)


def test_the_handed_label_keys_the_draws_whatever_the_beam_label():
    """Same handed label under two Beam labels: the same noise; another handed label under
    the same Beam label: other noise (sigma 40 over 20 keys: all equal with probability
    below 1e-20)."""
    source = keyed_random.KeyedSource(SECRET)
    a = _released(source.child("Release"), "Here")
    b = _released(source.child("Release"), "Elsewhere")
    c = _released(source.child("Other"), "Here")
    assert len(a) == 20 and a == b and a != c
    path = keyed_random.KeyedDraws(source).child("Outer").child("Release")
    assert path.stage == "Outer/Release" and keyed_random.stage_of(path) == (source, "Outer/Release")


@pytest.mark.parametrize("name", ["", "Outer/Release", "\x00reserved", 3])
def test_a_label_is_one_name_and_never_a_reserved_stage(name):
    """A path grows one name at a time (so two composites cannot hand out one path by
    joining names differently), and no name starts a reserved stage (user identities and
    the secret's commitments are keyed by stage names that start with NUL)."""
    with pytest.raises(ValueError, match="stage label"):
        keyed_random.KeyedSource(SECRET).child(name)

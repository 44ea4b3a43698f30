"""A kind's parsed section as a frozen typed object (issue 44 item 1: "each kind's
parameters are a frozen typed object; the report dict stays the wire format").

``Kind.params(mechanism)`` builds the kind's ``PARAMS`` dataclass from the parsed
``mechanism`` dict (``pipelines.kinds._params.build``); the planning limits and the joint
calibration of aggregate sums read the fields of gaussian, laplace, weighted_sampling,
weighted_gaussian and adaptive from it, the planning limits those of sample_and_threshold,
heavy_hitters and quantiles (a given sampling rate and threshold). Checked here:
the object holds the dict's values (defaults where the dict leaves a field out), cannot be
changed, and a missing field or a value of the wrong type is refused naming the field. The
published bytes are unchanged (tests/pipelines/test_released_bytes_frozen.py).
Deterministic: no statistical assertion.
"""
import dataclasses

import pytest

from thresher.pipelines import kinds
from thresher.pipelines.errors import SpecError
from thresher.pipelines.kinds._params import build
from thresher.pipelines.common import limits
from thresher.pipelines.specs import spec as spec_mod

TYPED = ("gaussian", "laplace")     # pre_threshold required, threshold a float


def _spec(kind, **mechanism):
    return spec_mod.parse({
        "name": "typed", "input": {"path": "data.parquet", "user": "u", "keys": ["k"]},
        "privacy": {"epsilon": 1.0, "delta": 1e-8}, "bounding": {"max_keys_per_user": 4},
        "mechanism": {"kind": kind, **mechanism}, "output": {"path": "out"}})


@pytest.mark.parametrize("kind,mechanism", [
    ("gaussian", {}),
    ("gaussian", {"pre_threshold": 3, "sigma": 4, "threshold": 30}),
    ("gaussian", {"noise": "correlated"}),
    ("laplace", {}),
    ("laplace", {"pre_threshold": 2, "scale": 2.5, "threshold": 40}),
    ("weighted_sampling", {}),
    ("weighted_sampling", {"sampling": "ppswor", "sampling_threshold": 0.5,
                           "report": "keys", "max_frequency": 300}),
    ("weighted_gaussian", {}),
    ("weighted_gaussian", {"sigma": 3, "count_fraction": 0.2, "count_keys_per_user": 8}),
    ("adaptive", {}),
    ("adaptive", {"rounds": 3, "round_fractions": [0.05, 0.15, 0.8]}),
])
def test_params_hold_the_parsed_section(kind, mechanism):
    spec = _spec(kind, **mechanism)
    params = spec.kind_object.params(spec.mechanism)
    assert isinstance(params, kinds.get(kind).PARAMS)
    for field in dataclasses.fields(params):
        want = spec.mechanism.get(field.name, field.default)
        want = tuple(want) if isinstance(want, list) else want     # a list reads as a tuple
        assert getattr(params, field.name) == want, field.name
    with pytest.raises(dataclasses.FrozenInstanceError):
        params.threshold = 1.0


@pytest.mark.parametrize("kind", TYPED)
def test_a_missing_field_or_a_wrong_type_is_named(kind):
    cls = kinds.get(kind).PARAMS
    with pytest.raises(TypeError, match=r"^mechanism\.pre_threshold: missing"):
        build(cls, {})
    with pytest.raises(TypeError, match=r"^mechanism\.threshold: must be float or None, got 'ten'"):
        build(cls, {"pre_threshold": 1, "threshold": "ten"})
    with pytest.raises(TypeError, match=r"^mechanism\.pre_threshold: must be int, got True"):
        build(cls, {"pre_threshold": True})
    assert build(cls, {"pre_threshold": 1, "threshold": 7}).threshold == 7.0


def test_a_union_field_takes_each_of_its_types():
    cls = kinds.get("weighted_sampling").PARAMS
    assert build(cls, {"max_frequency": 12}).max_frequency == 12
    assert build(cls, {"max_frequency": "auto"}).max_frequency == "auto"
    with pytest.raises(TypeError, match=r"^mechanism\.max_frequency: must be int or str, "
                                        r"got 1\.5"):
        build(cls, {"max_frequency": 1.5})


def test_a_list_field_is_a_tuple_of_its_type():
    cls = kinds.get("adaptive").PARAMS
    fields = {"rounds": 2, "count_fraction": 0.1, "count_keys_per_user": 4}
    assert build(cls, {**fields, "round_fractions": [1, 0.5]}).round_fractions == (1.0, 0.5)
    with pytest.raises(TypeError, match=r"^mechanism\.round_fractions: must be a list of "
                                        r"float, got \[0\.5, 'x'\]"):
        build(cls, {**fields, "round_fractions": [0.5, "x"]})


def test_the_limits_read_the_typed_fields():
    """check_gaussian_fields / check_laplace_fields take the typed section: a dict is
    refused (it has no attributes), a typed section beyond a limit is named."""
    params = kinds.get("gaussian").params({"pre_threshold": 1, "threshold": 1e9})
    with pytest.raises(SpecError, match=r"^mechanism\.threshold: must be <= pre_threshold"):
        limits.check_gaussian_fields(params)
    with pytest.raises(AttributeError):
        limits.check_gaussian_fields({"pre_threshold": 1, "threshold": 1e9})
    params = kinds.get("laplace").params({"pre_threshold": 1, "threshold": 1e13})
    with pytest.raises(SpecError, match=r"^mechanism\.threshold: must be <="):
        limits.check_laplace_fields(params)
    params = kinds.get("weighted_sampling").params(
        {"sampling": "priority", "sampling_threshold": 1e-30, "presampled": True})
    with pytest.raises(SpecError, match=r"^input\.sample\.threshold: must be >="):
        limits.check_weighted_sampling_fields(params)


def test_a_kind_without_params_says_so():
    untyped = [k for k in kinds.KINDS if kinds.get(k).PARAMS is None]
    for kind in untyped:
        with pytest.raises(TypeError, match="declares no PARAMS"):
            kinds.get(kind).params({})


# sample_and_threshold, heavy_hitters and quantiles (the sample-and-threshold kinds):
# their typed sections, read by planning.limits' check of a given sampling rate and
# threshold (limits.check_sampled_fields) and by heavy_hitters' release limits.
SAMPLED = ("sample_and_threshold", "heavy_hitters", "quantiles")
# the smallest section each accepts: the values a wrong-typed field replaces
VALID = {"sample_and_threshold": {}, "heavy_hitters": {},
         "quantiles": {"column": "v", "ranks": [0.5], "domain": [0, 1]}}


def _sampled_spec(kind, **mechanism):
    """quantiles with a given sampling rate or threshold: one global release (per-key
    hierarchical quantiles release noisy public cells, with no threshold)."""
    section = {"name": "typed", "input": {"path": "data.parquet", "user": "u", "keys": ["k"]},
               "privacy": {"epsilon": 1.0, "delta": 1e-8},
               "bounding": {"max_keys_per_user": 4},
               "mechanism": {"kind": kind, **mechanism}, "output": {"path": "out"}}
    if kind == "quantiles" and ({"sampling_rate", "threshold"} & set(mechanism)):
        del section["input"]["keys"]
    return spec_mod.parse(section)


@pytest.mark.parametrize("kind,mechanism", [
    ("sample_and_threshold", {}),
    ("sample_and_threshold", {"sampling_rate": 0.5, "threshold": 7, "accounting": "exact",
                              "composition": "pld"}),
    ("sample_and_threshold", {"accounting": "kl", "composition": "basic"}),
    ("heavy_hitters", {}),
    ("heavy_hitters", {"top_k": 5, "prefix_lengths": [2, 4, None], "sampling_rate": 0.5,
                       "threshold": 9}),
    ("heavy_hitters", {"prefix_lengths": [3]}),              # null added as the last level
    ("heavy_hitters", {"method": "adaptive"}),
    ("quantiles", VALID["quantiles"]),
    ("quantiles", {**VALID["quantiles"], "ranks": [0.1, 0.9], "domain": [-5, 5.5],
                   "branching": 4, "levels": 6, "sampling_rate": 0.5, "threshold": 3}),
    ("quantiles", {**VALID["quantiles"], "key_selection_share": 0.3,
                   "max_selected_keys": 100}),
    ("quantiles", {**VALID["quantiles"], "method": "binary_search", "rounds": 12}),
])
def test_sampled_kinds_params_hold_the_parsed_section(kind, mechanism):
    spec = _sampled_spec(kind, **mechanism)
    params = spec.kind_object.params(spec.mechanism)
    assert isinstance(params, kinds.get(kind).PARAMS)
    for field in dataclasses.fields(params):
        want = spec.mechanism.get(field.name, field.default)
        want = tuple(want) if isinstance(want, list) else want     # a list reads as a tuple
        assert getattr(params, field.name) == want, field.name
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(params, field.name, getattr(params, field.name))


@pytest.mark.parametrize("kind", SAMPLED)
def test_each_sampled_field_of_a_wrong_type_is_named(kind):
    """Every field of the three kinds' PARAMS refuses a value no field type takes (a
    mapping), naming the field."""
    cls = kinds.get(kind).PARAMS
    assert build(cls, VALID[kind]) == cls(**{k: tuple(v) if isinstance(v, list) else v
                                           for k, v in VALID[kind].items()})
    for field in dataclasses.fields(cls):
        with pytest.raises(TypeError, match=rf"^mechanism\.{field.name}: must be .*, "
                                            r"got \{'x': 1\}$"):
            build(cls, {**VALID[kind], field.name: {"x": 1}})


@pytest.mark.parametrize("kind", SAMPLED)
def test_a_sampled_threshold_is_an_int_and_a_rate_a_float(kind):
    cls = kinds.get(kind).PARAMS
    with pytest.raises(TypeError, match=r"^mechanism\.threshold: must be int or None, got 2\.5$"):
        build(cls, {**VALID[kind], "threshold": 2.5})
    with pytest.raises(TypeError, match=r"^mechanism\.threshold: must be int or None, got True$"):
        build(cls, {**VALID[kind], "threshold": True})
    with pytest.raises(TypeError, match=r"^mechanism\.sampling_rate: must be float or None, "
                                        r"got '0\.5'$"):
        build(cls, {**VALID[kind], "sampling_rate": "0.5"})
    params = build(cls, {**VALID[kind], "sampling_rate": 1, "threshold": 3})
    assert (params.sampling_rate, params.threshold) == (1.0, 3)
    assert isinstance(params.sampling_rate, float)


def test_a_list_of_a_union_names_each_element_type():
    """heavy_hitters' prefix_lengths: a list of int or null (the whole key), or none."""
    cls = kinds.get("heavy_hitters").PARAMS
    assert build(cls, {"prefix_lengths": [2, 4, None]}).prefix_lengths == (2, 4, None)
    assert build(cls, {"prefix_lengths": None}).prefix_lengths is None
    with pytest.raises(TypeError, match=r"^mechanism\.prefix_lengths: must be a list of "
                                        r"\(int or None\) or None, got \[2, '4', None\]$"):
        build(cls, {"prefix_lengths": [2, "4", None]})


def test_quantiles_required_fields_are_named():
    cls = kinds.get("quantiles").PARAMS
    for field in ("column", "ranks", "domain"):
        section = {k: v for k, v in VALID["quantiles"].items() if k != field}
        with pytest.raises(TypeError, match=rf"^mechanism\.{field}: missing"):
            build(cls, section)
    with pytest.raises(TypeError, match=r"^mechanism\.ranks: must be a list of float, "
                                        r"got \[0\.5, 'x'\]$"):
        build(cls, {**VALID["quantiles"], "ranks": [0.5, "x"]})


@pytest.mark.parametrize("kind", SAMPLED)
def test_the_limits_read_the_typed_sampled_fields(kind):
    """limits.check_sampled_fields takes the typed section (a dict is refused: it has no
    attributes); the spec's check (limits.check_spec, through the kind's check_limits)
    refuses a sampling rate below SAMPLING_RATE_MIN and a threshold above THRESHOLD_MAX,
    naming the field."""
    with pytest.raises(AttributeError):
        limits.check_sampled_fields(kind, {"threshold": limits.THRESHOLD_MAX + 1})
    params = kinds.get(kind).params({**VALID[kind], "threshold": limits.THRESHOLD_MAX + 1})
    with pytest.raises(SpecError, match=r"^mechanism\.threshold: a given threshold must be "
                                        rf"an integer in \[1, {limits.THRESHOLD_MAX}\] for {kind}"):
        limits.check_sampled_fields(kind, params)
    spec = _sampled_spec(kind, **VALID[kind], sampling_rate=1e-13)
    with pytest.raises(SpecError, match=r"^mechanism\.sampling_rate: must be >= 1e-12"):
        limits.check_spec(spec, spec.kind_object)
    spec = _sampled_spec(kind, **VALID[kind], threshold=limits.THRESHOLD_MAX + 1)
    with pytest.raises(SpecError, match=r"^mechanism\.threshold: a given threshold"):
        limits.check_spec(spec, spec.kind_object)
    limits.check_spec(_sampled_spec(kind, **VALID[kind], sampling_rate=1e-12,
                            threshold=limits.THRESHOLD_MAX), spec.kind_object)


def _example_configs():
    import glob
    import os
    from tests.pipelines.kinds.conftest import ROOT
    return sorted(glob.glob(os.path.join(ROOT, "configs", "examples", "*.yaml")))


@pytest.mark.parametrize("path", _example_configs(), ids=lambda p: p.rsplit("/", 1)[-1])
def test_every_example_config_builds_its_params(path):
    """Each spec under configs/examples (heavy_hitters.yaml is the one of the three kinds
    added here; no example of sample_and_threshold or quantiles is shipped) parses, and its
    kind's params hold its parsed section."""
    import os
    from tests.pipelines.kinds.conftest import ROOT
    with open(path) as handle:
        data = spec_mod.load_yaml(handle.read(), path)
    data["input"]["path"] = os.path.join(ROOT, data["input"]["path"])
    spec = spec_mod.parse(data)
    params = spec.kind_object.params(spec.mechanism)
    for field in dataclasses.fields(params):
        want = spec.mechanism.get(field.name, field.default)
        want = tuple(want) if isinstance(want, list) else want
        assert getattr(params, field.name) == want, field.name


def test_every_kind_declares_params():
    assert [k for k in kinds.KINDS if kinds.get(k).PARAMS is None] == []

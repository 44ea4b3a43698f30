"""A kind's parsed section as a frozen typed object (issue 44 item 1: "each kind's
parameters are a frozen typed object; the report dict stays the wire format").

``Kind.params(mechanism)`` builds the kind's ``PARAMS`` dataclass from the parsed
``mechanism`` dict (``pipelines.kinds._params.build``); the planning limits and the joint
calibration of aggregate sums read the fields of gaussian, laplace, weighted_sampling,
weighted_gaussian and adaptive from it. Checked here:
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

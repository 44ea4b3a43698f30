"""pipelines.kinds.weighted_sampling: spec fields, calibration report and the Beam hook-up."""
import json
import apache_beam as beam
import numpy as np
import pyarrow as pa
import pytest
from apache_beam.testing.test_pipeline import TestPipeline
from apache_beam.testing.util import assert_that

from thresher.accounting import pws
from thresher.pipelines.errors import CalibrationError, SpecError
from thresher.pipelines.common import declare
from thresher.pipelines.kinds import weighted_sampling as ws
from thresher.pipelines.specs.spec import parse_mechanism
from thresher.transforms.randomness import keyed_random


def test_parse_defaults():
    assert ws.parse({}) == {"sampling": "none", "sampling_threshold": None,
                            "report": "keys_and_frequencies", "estimator": "mle",
                            "composition": "optimal", "max_frequency": "auto"}


def test_default_composition_follows_the_report():
    """pld (accounting.pws.pld) is the default with report: keys; the frequency tokens keep
    optimal, and pld with them is refused naming mechanism.composition."""
    assert ws.parse({"report": "keys"})["composition"] == "pld"
    assert ws.parse({"report": "keys", "composition": "basic"})["composition"] == "basic"
    assert ws.parse({})["composition"] == "optimal"
    with pytest.raises(SpecError) as err:
        parse_mechanism({"kind": "weighted_sampling", "composition": "pld"})
    assert err.value.field == "mechanism.composition" and "report: keys" in err.value.message


def test_calibrate_pld_reports_its_table_and_beats_optimal():
    """eps = 1, delta = 1e-8, C = 8: the pld table reaches pi >= 1/2 at 88, optimal at 143;
    the report carries mu and round-trips to the same release tables."""
    out = ws.calibrate(ws.parse({"report": "keys"}), epsilon=1.0, delta=1e-8,
                       max_keys_per_user=8, model="l0")
    opt = ws.calibrate(ws.parse({"report": "keys", "composition": "optimal"}), epsilon=1.0,
                       delta=1e-8, max_keys_per_user=8, model="l0")
    json.dumps(out)
    assert out["composition"] == "pld" and out["key_mu"] > 0
    assert "Blackwell" in out["accounting"]
    assert (out["threshold"], opt["threshold"]) == (88, 143)
    assert out["delta_achieved"] <= 1e-8
    params = pws.PWSParameters.from_dict(out)
    keep = pws.release_tables(params).keep
    assert keep[88] >= 0.5 > keep[87] and len(keep) - 1 == out["max_frequency"]
    one = ws.calibrate(ws.parse({"report": "keys"}), epsilon=1.0, delta=1e-8,
                       max_keys_per_user=2, model="l0")
    assert one["key_mu"] is None and one["accounting"].startswith("composition pld fell back")


@pytest.mark.parametrize("section,field,message", [
    ({"sampling": "bernoulli"}, "mechanism.sampling", "must be one of none, ppswor, priority"),
    ({"sampling": "ppswor"}, "mechanism.sampling_threshold", "is required"),
    ({"sampling": "priority", "sampling_threshold": 0}, "mechanism.sampling_threshold", "> 0"),
    ({"sampling_threshold": 0.1}, "mechanism.sampling_threshold", "only allowed"),
    ({"report": "frequencies"}, "mechanism.report", "keys, keys_and_frequencies"),
    ({"estimator": "mean"}, "mechanism.estimator", "mle, biased_down"),
    ({"report": "keys", "estimator": "mle"}, "mechanism.estimator", "only used"),
    ({"composition": "advanced"}, "mechanism.composition", "pld, optimal, basic"),
    ({"max_frequency": 1}, "mechanism.max_frequency", ">= 2"),
    ({"max_frequency": "big"}, "mechanism.max_frequency", "auto"),
])
def test_parse_errors_name_the_field(section, field, message):
    with pytest.raises(SpecError) as err:
        parse_mechanism({"kind": "weighted_sampling", **section})
    assert err.value.field == field
    assert message in err.value.message


def test_calibrate_reports_every_parameter_and_meets_the_budget():
    mech = ws.parse({"sampling": "ppswor", "sampling_threshold": 0.01})
    out = ws.calibrate(mech, epsilon=1.0, delta=1e-6, max_keys_per_user=8, model="l0")
    assert out["kind"] == "weighted_sampling"
    json.dumps(out)  # the report is JSON
    for name in ("key_epsilon", "key_delta", "key_delta_realized", "max_frequency",
                 "saturation_frequency", "beyond_table", "accounting", "threshold", "comparison"):
        assert name in out
    assert out["delta_achieved"] <= 1e-6
    assert pws.composed_delta(out["key_epsilon"], out["key_delta_realized"], 8, 1.0) <= 1e-6
    assert out["key_epsilon"] >= 1.0 / 8 * (1 - 1e-9)
    params = pws.PWSParameters.from_dict(out)
    assert params.sampling == "ppswor" and params.sampling_threshold == 0.01
    keep = pws.release_tables(params).keep
    assert keep[out["threshold"]] >= 0.5 > keep[out["threshold"] - 1]


def test_calibrate_refuses_the_l1_model():
    with pytest.raises(SpecError) as err:
        ws.calibrate(ws.parse({}), epsilon=1.0, delta=1e-6, max_keys_per_user=2, model="l1")
    assert err.value.field == "bounding.model"


def test_an_explicit_max_frequency_whose_table_is_too_large_names_the_field():
    """max_frequency 50,000 at epsilon 0.003 needs a frequency table of more than
    MAX_TABLE_ENTRIES entries (each row is ~2 pws_L wide): a spec error naming
    mechanism.max_frequency and the largest that fits, not a bare calibration error."""
    with pytest.raises(SpecError) as err:
        ws.calibrate(ws.parse({"max_frequency": 50_000}), epsilon=0.003, delta=1e-8,
                     max_keys_per_user=1, model="l0")
    assert err.value.field == "mechanism.max_frequency"
    assert "at most" in err.value.message and "fits" in err.value.message


def test_calibration_failures_become_calibration_errors(monkeypatch):
    def fail(*args, **kwargs):
        raise ValueError("PWS tables could not be verified")
    monkeypatch.setattr(pws, "calibrate", fail)
    with pytest.raises(CalibrationError, match="weighted_sampling release at epsilon=1"):
        ws.calibrate(ws.parse({}), epsilon=1.0, delta=1e-6, max_keys_per_user=2, model="l0")


def test_sample_section_parsing_and_mechanism_merge():
    sample = ws.parse_sample({"frequency": "n", "scheme": "priority", "threshold": 0.001})
    assert sample == {"frequency": "n", "scheme": "priority", "threshold": 0.001}
    mech = ws.mechanism_for_sample(ws.parse({}), sample)
    assert mech["presampled"] and mech["sampling"] == "priority"
    with pytest.raises(SpecError) as err:
        ws.mechanism_for_sample(ws.parse({"sampling": "ppswor", "sampling_threshold": 0.1}), sample)
    assert err.value.field == "mechanism.sampling"
    for section, field in [({"scheme": "none"}, "input.sample.frequency"),
                           ({"frequency": "n"}, "input.sample.scheme"),
                           ({"frequency": "n", "scheme": "ppswor"}, "input.sample.threshold"),
                           ({"frequency": "n", "scheme": "none", "threshold": 1},
                            "input.sample.threshold"),
                           ({"frequency": "n", "scheme": "none", "rate": 1}, "input.sample.rate")]:
        with pytest.raises(SpecError) as err:
            # the schema's input.sample (declared by ws.SAMPLE_FIELDS), then its rules
            declare.check(section, declare.mapping(ws.SAMPLE_FIELDS, ("frequency", "scheme")),
                          "input.sample")
            ws.parse_sample(section)
        assert err.value.field == field


def test_release_and_sanitize_existing_sample_in_beam():
    mech = ws.parse({"report": "keys_and_frequencies"})
    params = ws.calibrate(mech, epsilon=2.0, delta=1e-8, max_keys_per_user=1, model="l0")
    sample_mech = ws.mechanism_for_sample(
        ws.parse({}), ws.parse_sample({"frequency": "n", "scheme": "ppswor", "threshold": 0.5}))
    sample_params = ws.calibrate(sample_mech, epsilon=2.0, delta=1e-8, max_keys_per_user=1,
                                 model="l0")
    assert sample_params["presampled"]
    counts = pa.table({"k": ["a", "b", "c"], "count": np.array([1, 500, 10_000], np.int64)})
    sample = pa.table({"k": ["x", "y"], "n": np.array([400, 9_000], np.int64)})

    def check_release(tables):
        out = pa.concat_tables(tables)
        assert set(out.column_names) == {"k", *ws.OUTPUT_COLUMNS}
        # "a" (one user) is released with probability <= 1e-8; "b", "c" always
        assert sorted(out.column("k").to_pylist()) == ["b", "c"]

    def check_sample(tables):
        out = pa.concat_tables(tables)
        assert sorted(out.column("k").to_pylist()) == ["x", "y"]   # q = pi = 1 there

    # the kind's stages take the release's draws, as a release hands them over
    draws = keyed_random.KeyedDraws(keyed_random.KeyedSource(bytes(32)))
    with TestPipeline() as p:
        side = p | "P" >> beam.Create([params])
        released = ws.release(p | "C" >> beam.Create([counts]), beam.pvalue.AsSingleton(side),
                              ["k"], draws)
        assert_that(released, check_release, label="release")
        side2 = p | "P2" >> beam.Create([sample_params])
        from_sample = ws.sanitize_existing_sample(p | "S" >> beam.Create([sample]),
                                                  beam.pvalue.AsSingleton(side2), ["k"], "n",
                                                  draws)
        assert_that(from_sample, check_sample, label="sample")

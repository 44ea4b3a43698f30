"""Launching one pipeline graph more than once (issue 25 F4): the Beam options that save a
graph for later launches (pipelines.beam_flags.GRAPH_SAVING) are refused, with exit code 2
naming the flag, by the thresher command, the Python API (pipelines.running.release.run) and the
Beam YAML transform (ThresherRelease) -- before any input is read or the ledger asked.
On the code before, ``--output_executable_path`` ran with exit 0."""
import apache_beam as beam
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from thresher.pipelines import cli
from thresher.pipelines.specs import spec as spec_mod
from thresher.pipelines.running.beam_flags import GRAPH_SAVING
from thresher.pipelines.errors import SpecError
from thresher.pipelines.planning.plan import make_plan

FLAGS = {"template_location": "gs://bucket/templates/release",
         "dataflow_job_file": "job.json",
         "output_executable_path": "release.jar",
         "create_from_snapshot": "snapshot-1"}


def test_every_graph_saving_option_is_tested_and_known_to_beam():
    from thresher.pipelines.running.beam_flags import known_option_names
    assert set(FLAGS) == set(GRAPH_SAVING)
    assert set(GRAPH_SAVING) <= known_option_names()


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_the_command_refuses_with_exit_2_naming_the_flag(write_spec, tmp_path, capsys, flag):
    path = write_spec()
    code = cli.main(["run", path, "--quiet", "--", f"--{flag}={tmp_path / FLAGS[flag]}"])
    err = capsys.readouterr().err
    assert code == 2
    assert f"--{flag}" in err and "refused" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists() and not (tmp_path / FLAGS[flag]).exists()


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_the_python_api_refuses(write_spec, tmp_path, monkeypatch, flag):
    from thresher.pipelines.running import release
    spec = spec_mod.load(write_spec())

    def no_input(*args, **kwargs):     # refused before any input is opened
        raise AssertionError("input opened")
    monkeypatch.setattr(release, "input_files", no_input)
    with pytest.raises(SpecError, match=rf"^--{flag}: refused"):
        release.run(make_plan(spec), beam_args=[f"--{flag}={FLAGS[flag]}"])


@pytest.mark.parametrize("flag", sorted(FLAGS))
def test_the_beam_yaml_transform_refuses(flag):
    from thresher.pipelines.beam_yaml import ThresherRelease
    config = {"user": "user_id", "keys": ["word"], "privacy": {"epsilon": 1.0, "delta": 1e-8},
              "bounding": {"max_keys_per_user": 8}, "mechanism": {"kind": "gaussian"}}
    pipeline = beam.Pipeline(options=PipelineOptions([f"--{flag}={FLAGS[flag]}"]))
    rows = pipeline | beam.Create([beam.Row(user_id="u", word="w")])
    with pytest.raises(SpecError, match=rf"^--{flag}: refused"):
        _ = rows | ThresherRelease(**config)


def test_ordinary_flags_still_pass():
    from thresher.pipelines.running.beam_flags import check
    check(["--runner=DirectRunner", "--direct_num_workers=2"])


def test_the_beam_yaml_transform_and_the_api_refuse_the_dask_runner():
    """The release secret is drawn inside the pipeline and pinned by a Reshuffle; Beam's
    DaskRunner recomputes side inputs per partition, so each consumer could see another
    secret. The CLI refused it already; the transform (and thresher.Release, built on it)
    now refuse it too, before anything is read."""
    from apache_beam.runners.portability.fn_api_runner import FnApiRunner

    import thresher
    from thresher.pipelines.beam_yaml import ThresherRelease
    from thresher.pipelines.errors import InputError
    config = {"user": "user_id", "keys": ["word"], "privacy": {"epsilon": 1.0, "delta": 1e-8},
              "bounding": {"max_keys_per_user": 8}, "mechanism": {"kind": "gaussian"}}
    for apply in (lambda: ThresherRelease(**config),
                  lambda: thresher.Release({"input": {"user": "user_id", "keys": ["word"]},
                                            **{k: config[k] for k in ("privacy", "bounding",
                                                                      "mechanism")}})):
        pipeline = beam.Pipeline(runner=FnApiRunner(),
                                 options=PipelineOptions(["--runner=DaskRunner"]))
        rows = pipeline | beam.Create([beam.Row(user_id="u", word="w")])
        with pytest.raises(InputError, match="DaskRunner is not supported"):
            _ = rows | apply()

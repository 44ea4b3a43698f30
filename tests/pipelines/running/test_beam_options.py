"""ReleaseOptions (pipelines/running/beam_options.py): views built once give what Beam's fresh
views give, share one options dictionary, and copies carry no kept views."""
import copy
import pickle

import apache_beam as beam
from apache_beam.options import pipeline_options as po
from apache_beam.testing.util import assert_that, equal_to

from thresher.pipelines.running.beam_options import ReleaseOptions
from thresher.pipelines.running.live_metrics import LiveMetricsRunner

FLAGS = ["--direct_num_workers=3", "--experiments=a", "--experiments=b",
         "--runtime_type_check", "--job_name=x"]


def _option_classes():
    seen, todo = [], [po.PipelineOptions]
    while todo:
        cls = todo.pop()
        for sub in cls.__subclasses__():
            if sub not in seen and sub is not ReleaseOptions:
                seen.append(sub)
                todo.append(sub)
    return seen


def _values(view):
    return {name: getattr(view, name) for name in view._visible_option_list()}


def test_views_are_beams_views_built_once():
    kept, fresh = ReleaseOptions(list(FLAGS)), po.PipelineOptions(list(FLAGS))
    classes = _option_classes()
    assert len(classes) > 20
    for cls in classes:
        view = kept.view_as(cls)
        assert type(view) is cls
        assert _values(view) == _values(fresh.view_as(cls))
        assert kept.view_as(cls) is view                      # built once
    assert kept.get_all_options() == fresh.get_all_options()
    assert kept.view_as(po.DebugOptions).experiments == ["a", "b"]


def test_values_set_through_a_view_are_seen_by_every_view():
    options = ReleaseOptions([])
    standard = options.view_as(po.StandardOptions)
    standard.runner = "SomeRunner"
    assert options.view_as(po.StandardOptions).runner == "SomeRunner"
    assert options.get_all_options()["runner"] == "SomeRunner"
    options.view_as(po.DebugOptions).add_experiment("c")
    assert options.view_as(po.DebugOptions).experiments == ["c"]
    assert po.PipelineOptions.view_as(options, po.DebugOptions).experiments == ["c"]


def test_copies_start_without_kept_views_and_keep_the_values():
    options = ReleaseOptions(["--job_name=x"])
    options.view_as(po.StandardOptions).streaming = True
    for clone in (copy.deepcopy(options), pickle.loads(pickle.dumps(options))):
        assert "_thresher_views" not in clone.__dict__
        assert clone.view_as(po.StandardOptions).streaming is True
        assert clone.view_as(po.GoogleCloudOptions).job_name == "x"
        clone.view_as(po.StandardOptions).streaming = False         # its own dictionary
        assert options.view_as(po.StandardOptions).streaming is True


def test_a_pipeline_runs_with_them():
    with beam.Pipeline(runner=LiveMetricsRunner(), options=ReleaseOptions([])) as p:
        out = p | beam.Create([1, 2, 3]) | beam.Map(lambda x: x * 2)
        assert_that(out, equal_to([2, 4, 6]))

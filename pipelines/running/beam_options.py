"""Beam's ``PipelineOptions`` for a release, with each view built once.

Beam reads its options through ``options.view_as(SomeOptions)`` about a hundred times
while it builds and runs even a small release (``TypeOptions`` at every applied
transform, ``StandardOptions``, ``DebugOptions`` ... in the runner), and every call
builds that class's ``argparse`` parser and parses the flags again: 0.03-0.04 s of CPU
of a 1,000-row ``thresher run`` (docs/performance.md, Start-up).

A view is a function of the view class and the flags (its parsed namespace), plus the
options dictionary that every view of one options object shares (Beam's ``view_as``
hands each new view the same dictionary; values set through any view land there). So
:class:`ReleaseOptions` keeps the first view of each class and hands it out again while
the flags are the same list, unchanged: every view reads and writes the one shared
dictionary, as Beam's fresh views do. Copies (``copy.deepcopy`` in ``beam.Pipeline``,
pickling) start with no views kept.
"""
from apache_beam.options.pipeline_options import PipelineOptions


class ReleaseOptions(PipelineOptions):
    """``PipelineOptions`` whose ``view_as`` builds each view class once (see above)."""

    def view_as(self, cls):
        views = self.__dict__.get("_thresher_views")
        flags = self.__dict__.get("_flags")
        key = (cls, tuple(flags) if flags is not None else None)
        if views is not None and key in views:
            return views[key]
        view = super().view_as(cls)
        if views is None:
            views = {}
            object.__setattr__(self, "_thresher_views", views)
        views[key] = view
        return view

    def __getstate__(self):
        state = dict(super().__getstate__())
        state.pop("_thresher_views", None)
        return state

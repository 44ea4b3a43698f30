"""``thresher run`` is Read -> Release -> Write (issue 44, item 2): the pipeline ends with
the published files themselves. What it leaves in the staging folder when it finishes is
exactly ``released.parquet`` and ``release_report.json`` -- the chosen bound, the chosen
clips and a kind's notes are side inputs of the release's last stage, never files beside
the release to be read back -- and ``released.parquet`` is written once, never rewritten
to add the interval columns. Real CLI runs on real Parquet (tests/privacy/harness.py), in
the cases that wrote side files before: an automatic bound with ``clip: auto`` (the bound
and the clips) and per-key quantiles (the key selection's note). No statistical
assertion: no false-failure probability."""
import os

import pytest

from tests.privacy import harness

CASES = {
    "auto_bound_clip_auto": dict(kind="gaussian", auto=True, aggregates=[
        {"column": "amount", "statistic": "mean", "clip": "auto"}]),
    "quantiles_per_key": dict(kind="quantiles", bound=1, column="amount", ranks=[0.5],
                              domain=[0, 100]),
}
PUBLISHED = ["release_report.json", "released.parquet"]


@pytest.mark.parametrize("case", CASES)
def test_the_pipeline_leaves_only_the_published_files_each_written_once(case, tmp_path,
                                                                         monkeypatch):
    from thresher.pipelines.dataio import released_file
    from thresher.pipelines.running import signals
    folder = tmp_path / "run"
    after_pipeline, writes = [], []
    real_check, real_write = signals.check, released_file.write

    def check():
        # the launcher's first check once the staging folder exists: right after the
        # pipeline finished, before the launcher looks at what it wrote
        staging = [d for d in os.listdir(folder) if d.startswith("out.tmp-")] \
            if folder.exists() else []
        if staging and not after_pipeline:
            after_pipeline.append(sorted(f for f in os.listdir(folder / staging[0])
                                         if not f.startswith("beam-temp")))
        return real_check()

    def write(table, sink):
        writes.append(sink)
        return real_write(table, sink)
    monkeypatch.setattr(signals, "check", check)
    monkeypatch.setattr(released_file, "write", write)
    out = harness.release(folder, harness.dataset(), harness.spec_dict(**CASES[case]),
                          monkeypatch)
    assert after_pipeline == [PUBLISHED]
    assert len(writes) == 1
    assert sorted(os.listdir(out)) == PUBLISHED

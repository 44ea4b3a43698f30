"""A release built into a Beam pipeline is charged per run (issue 36 P1;
pipelines/ledgers/pipeline_charge.py): one pipeline object run twice is two releases
(a new in-pipeline secret each run) and two charges, the second refused when the budget
holds one; a retried reservation of one run charges once; a ledger the workers cannot
reach is refused when the pipeline is built. Real Beam (in-process runner), real SQLite."""
import sqlite3

import apache_beam as beam
import pyarrow.parquet as pq
import pytest
from apache_beam.options.pipeline_options import PipelineOptions

from thresher.pipelines.beam_yaml import ThresherRelease
from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import ledger

from tests.pipelines.conftest import QUICKSTART_DATA

_REPORTS = []


def _keep(report):
    _REPORTS.append(report)


def _pipeline(ledger_path, total, options=None):
    data = pq.read_table(QUICKSTART_DATA).slice(0, 2000).to_pylist()
    pipeline = beam.Pipeline(options=options)
    rows = pipeline | beam.Create([beam.Row(user_id=r["user_id"], word=r["word"]) for r in data])
    out = rows | "Release" >> ThresherRelease(
        user="user_id", keys=["word"], privacy={"epsilon": 1.0, "delta": 1e-8},
        bounding={"max_keys_per_user": 4}, mechanism={"kind": "gaussian"},
        budget={"ledger": str(ledger_path), "dataset": "d", "epsilon": total, "delta": 1e-6})
    _ = out["report"] | beam.Map(_keep)
    return pipeline


def _rows(path):
    conn = sqlite3.connect(str(path))
    try:
        return conn.execute("SELECT epsilon, state, run_token FROM releases ORDER BY id").fetchall()
    finally:
        conn.close()


@pytest.mark.slow
def test_one_pipeline_object_run_twice_is_charged_twice(tmp_path):
    """Before: the charge was made when the transform was applied, so the second run (a
    new secret, new noise: a second release) was free. Now each run charges under its own
    run token: two rows, two tokens, the dataset's sum 2."""
    path = tmp_path / "ledger.sqlite"
    pipeline = _pipeline(path, total=2.5)
    assert not path.exists()            # building charges nothing
    _REPORTS.clear()
    pipeline.run().wait_until_finish()
    pipeline.run().wait_until_finish()
    rows = _rows(path)
    assert [(e, s) for e, s, _ in rows] == [("1.0", "published")] * 2
    assert len({t for _, _, t in rows}) == 2 and all(t for _, _, t in rows)
    assert ledger.summary(str(path))[0]["spent"]["epsilon"] == 2.0
    assert len(_REPORTS) == 2


@pytest.mark.slow
def test_the_second_run_is_refused_when_the_budget_holds_one(tmp_path):
    """Total 1.5, releases of 1: the first run is charged and reports; the second run
    fails with the ledger's refusal and its report never reaches the sink."""
    path = tmp_path / "ledger.sqlite"
    pipeline = _pipeline(path, total=1.5)
    _REPORTS.clear()
    pipeline.run().wait_until_finish()
    assert len(_REPORTS) == 1
    with pytest.raises(Exception, match=r"budget: dataset 'd' \(basic composition\) has spent "
                                        r"epsilon=1"):
        pipeline.run().wait_until_finish()
    assert len(_REPORTS) == 1
    assert [(e, s) for e, s, _ in _rows(path)] == [("1.0", "published")]


def test_a_retried_reservation_of_one_run_charges_once(tmp_path):
    """The worker's reservation may run again (a retried bundle): the same run token is
    one charge, and the retry gets the first row back."""
    from thresher.pipelines.ledgers import composition as comp
    budget = ledger.BudgetSpec(ledger=str(tmp_path / "l.sqlite"), dataset="d", epsilon=1.5,
                               delta=1e-6)
    charge = comp.Charge(comp.dec(1.0), comp.dec(1e-8), comp.dec("0.02"), comp.dec("1E-9"))
    first = ledger.reserve_charge(budget, "r", "0" * 64, charge, run_token="t1", output="o")
    again = ledger.reserve_charge(budget, "r", "0" * 64, charge, run_token="t1", output="o")
    assert again.row_id == first.row_id and first.charged and not again.charged
    shown = ledger.summary(budget.ledger)[0]
    assert shown["spent"] == {"epsilon": 1.0, "delta": 1e-8}
    assert len(shown["releases"]) == 1
    with pytest.raises(SpecError, match="^budget: "):   # another run: refused (1 + 1 > 1.5)
        ledger.reserve_charge(budget, "r", "0" * 64, charge, run_token="t2", output="o")


@pytest.mark.parametrize("flags", [
    ["--runner=PortableRunner", "--job_endpoint=localhost:9"],
    ["--environment_type=DOCKER"],
])
def test_a_sqlite_ledger_the_workers_may_not_reach_is_refused_when_built(tmp_path, flags):
    path = tmp_path / "ledger.sqlite"
    with pytest.raises(SpecError, match=r"^ThresherRelease\.budget\.ledger: a SQLite ledger"):
        _pipeline(path, total=2.5, options=PipelineOptions(flags))
    assert not path.exists()


def test_each_run_secret_is_its_own_charge(tmp_path):
    """Issue 42 (default suite; the two-run pipeline tests above are slow): the charge
    stage of ONE built pipeline, as each run's worker gets it (pickled: no secret), given
    that run's secret. Two runs (two secrets: two releases) are two rows under two tokens,
    a retry of the first run (its secret again) is no new charge, and a third run past the
    budget is refused. Counted here from the ledger's rows. A run token that is the same
    for every run (not derived from the run's secret) makes the second run free and fails."""
    import pickle
    from thresher.pipelines.ledgers import composition as comp
    from thresher.pipelines.ledgers import pipeline_charge
    from thresher.transforms.randomness import keyed_random
    budget = ledger.BudgetSpec(ledger=str(tmp_path / "l.sqlite"), dataset="d", epsilon=2.5,
                               delta=1e-6)
    charge = comp.Charge(comp.dec(1.0), comp.dec(1e-8), comp.dec("0.5"), comp.dec("1E-9"))
    built = pickle.dumps(pipeline_charge.ChargeRun(budget, "r", "0" * 64, charge, "o",
                                                   keyed_random.PipelineSecret()))

    def run(secret):
        dofn = pickle.loads(built)          # what a worker of this run deserialises
        dofn._rng_factory.set_secret(secret)
        return list(dofn.process(None))

    first, second = keyed_random.new_secret(), keyed_random.new_secret()
    assert first != second
    row_a, = run(first)
    row_b, = run(second)
    row_retry, = run(first)
    assert row_a != row_b and row_retry == row_a
    rows = _rows(budget.ledger)
    assert [(e, s) for e, s, _ in rows] == [("1.0", "published")] * 2
    assert len({t for _, _, t in rows}) == 2 and all(t for _, _, t in rows)
    assert ledger.summary(budget.ledger)[0]["spent"]["epsilon"] == 2.0
    with pytest.raises(SpecError, match="^budget: "):     # a third run: 3 > 2.5
        run(keyed_random.new_secret())
    assert len(_rows(budget.ledger)) == 2

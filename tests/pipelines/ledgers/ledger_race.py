"""Six processes reserving at one instant: the shared body of the SQLite and PostgreSQL
ledger race tests (pipelines/ledgers/sqlite_backend.py, pipelines/ledgers/postgres_backend.py)."""
import multiprocessing

from thresher.pipelines.ledgers import ledger

RACERS = 6


def race(start_method, target, argument):
    """Start RACERS processes running ``target(argument, barrier, results)``; their outcomes."""
    ctx = multiprocessing.get_context(start_method)
    barrier, results = ctx.Barrier(RACERS), ctx.Queue()
    procs = [ctx.Process(target=target, args=(argument, barrier, results))
             for _ in range(RACERS)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    return outcomes


def assert_exactly_two_reserved(outcomes, ledger_location):
    """Room for two releases at epsilon 1 (total 2.5): two reserve, the rest are refused
    naming the budget, and the ledger shows exactly those two."""
    assert outcomes.count("reserved") == 2, outcomes
    assert all(o.startswith("refused: budget:") for o in outcomes if o != "reserved"), outcomes
    shown = ledger.summary(ledger_location)[0]
    assert shown["spent"]["epsilon"] == 2.0
    assert [r["state"] for r in shown["releases"]] == ["reserved", "reserved"]

"""Property (issue 35): random adaptive sequences of releases -- kinds and parameters
chosen from what the ledger showed so far -- run by concurrent processes never admit a
release past either budget of the dataset (zcdp: sum rho <= rho_B and sum delta0 <=
delta0_B; basic: sum epsilon <= epsilon, sum delta <= delta), on SQLite and PostgreSQL,
and the running sums always equal the sums over the admitted releases. The charges are
the real records of real plans (pipelines.ledgers.records), computed once. Fixed seeds;
deterministic given the interleaving, and the property holds for every interleaving."""
import multiprocessing
import random

import pytest
import yaml

from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import ledger
from thresher.pipelines.planning.plan import make_plan
from thresher.pipelines.specs import spec as spec_mod

from tests.pipelines.conftest import QUICKSTART_DATA
from tests.pipelines.ledgers.test_ledger_postgres import server, url  # noqa: F401  (fixtures)

WORKERS, STEPS = 4, 12


def _menu(domain):
    """(kind, epsilon, delta, C) -> the release's full charge, from real plans; over public
    keys (delta0 0) and thresholded."""
    out = []
    for kind, mech, public in (("gaussian", {"kind": "gaussian"}, False),
                               ("gaussian-public", {"kind": "gaussian"}, True),
                               ("laplace", {"kind": "laplace"}, False),
                               ("laplace-public", {"kind": "laplace"}, True),
                               ("weighted_gaussian", {"kind": "weighted_gaussian"}, False)):
        for epsilon, delta, bound in ((0.3, 1e-7, 1), (0.7, 1e-6, 2), (1.2, 3e-7, 4)):
            source = {"path": QUICKSTART_DATA, "user": "user_id", "keys": ["word"]}
            if public:
                source["public_keys"] = {"path": domain}
            doc = {"name": f"{kind}-{epsilon}", "input": source,
                   "privacy": {"epsilon": epsilon, "delta": delta},
                   "bounding": {"max_keys_per_user": bound}, "mechanism": mech,
                   "output": {"path": "/tmp/unused"}}
            text = yaml.safe_dump(doc)
            out.append((doc["name"], ledger.full_charge(
                make_plan(spec_mod.parse(doc, source_text=text)))))
    return out


@pytest.fixture(scope="module")
def menu(tmp_path_factory):
    import pyarrow as pa
    import pyarrow.parquet as pq
    domain = tmp_path_factory.mktemp("domain") / "domain.parquet"
    pq.write_table(pa.table({"word": ["a", "b", "c"]}), domain)
    return _menu(str(domain))


def _worker(budget, menu, seed, index, results):
    """Adaptive: the next release depends on the dataset's state this worker last saw."""
    admitted, refused = [], 0
    seen = "nothing yet"
    for step in range(STEPS):
        rng = random.Random(f"{seed}/{index}/{step}/{seen}")
        name, charge = menu[rng.randrange(len(menu))]
        try:
            ledger.reserve_charge(budget, name, "0" * 64, charge, run_token=None)
            admitted.append(name)
        except SpecError as exc:
            if exc.field != "budget":
                results.put(("error", f"{exc.field}: {exc.message}"))
                return
            refused += 1
        try:
            shown = ledger.summary(budget.ledger, budget.dataset)[0]
            seen = repr((shown["spent"], shown["zcdp"].get("rho_spent")))
        except SpecError as exc:        # no dataset yet (nothing admitted so far)
            seen = exc.field
    results.put(("ok", admitted, refused))


def _run_sequences(budget, menu, seed):
    ctx = multiprocessing.get_context("fork")
    results = ctx.Queue()
    procs = [ctx.Process(target=_worker, args=(budget, menu, seed, i, results))
             for i in range(WORKERS)]
    for p in procs:
        p.start()
    outcomes = [results.get(timeout=300) for _ in procs]
    for p in procs:
        p.join(timeout=60)
    assert all(o[0] == "ok" for o in outcomes), outcomes
    return outcomes


def _check_never_past_the_budget(budget, menu, outcomes):
    charges = dict(menu)
    shown = ledger.summary(budget.ledger)
    shown = next((d for d in shown if d["dataset"] == budget.dataset), {"releases": []})
    assert "warning" not in shown, shown["warning"]       # running sums == the releases
    names = [r["name"] for r in shown["releases"]]
    assert sorted(names) == sorted(n for o in outcomes for n in o[1])
    total = comp.Spent()
    for name in names:
        total = total.plus(charges[name])
    totals = comp.Totals.of_spec(budget)
    if budget.composition == comp.ZCDP:
        assert total.rho <= totals.rho and total.delta0 <= totals.delta0
    else:
        assert total.epsilon <= totals.epsilon and total.delta <= totals.delta
    assert sum(o[2] for o in outcomes) > 0          # the budget was reached: refusals happened
    return len(names)


def _budgets(location, seed):
    rng = random.Random(seed)
    out = []
    for mode in (comp.ZCDP, comp.BASIC):
        epsilon = rng.choice([2.0, 3.5, 5.0])
        delta = rng.choice([1e-5, 4e-6])
        threshold = rng.choice([None, 0.0, delta / 4]) if mode == comp.ZCDP else None
        out.append(ledger.BudgetSpec(ledger=location(mode), dataset=f"ds-{mode}",
                                     epsilon=epsilon, delta=delta, composition=mode,
                                     threshold_delta=threshold))
    return out


@pytest.mark.slow        # the menu's calibrations and 2 x 4 processes: ~30 s
@pytest.mark.parametrize("seed", [1, 2])
def test_concurrent_adaptive_sequences_never_pass_a_budget_on_sqlite(tmp_path, menu, seed):
    for budget in _budgets(lambda mode: str(tmp_path / f"{mode}.sqlite"), seed):
        outcomes = _run_sequences(budget, menu, seed)
        assert _check_never_past_the_budget(budget, menu, outcomes) > 0


@pytest.mark.slow
@pytest.mark.parametrize("seed", [3])
def test_concurrent_adaptive_sequences_never_pass_a_budget_on_postgresql(url, menu,  # noqa: F811
                                                                         seed):
    for budget in _budgets(lambda mode: url, seed):
        outcomes = _run_sequences(budget, menu, seed)
        assert _check_never_past_the_budget(budget, menu, outcomes) > 0

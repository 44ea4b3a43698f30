"""``thresher ledger show``: every dataset of a ledger -- its mode and totals, what is
spent (the running sums, checked against a fold of its releases), every release -- as
the ``--json`` document (``summary``) and as text (``format_summary``); and the line
``thresher run`` prints after a charged release (``after_run_line``). Read only, through
``store`` and the ``backend.Backend`` interface.
"""
from thresher.pipelines.errors import SpecError
from thresher.pipelines.ledgers import composition as comp
from thresher.pipelines.ledgers import store
from thresher.pipelines.ledgers.store import TOTALS_HELP, as_float, loose, printable


def summary(path, dataset=None):
    """Every dataset of a ledger (or one): its mode and budgets, what is charged (the
    running sums, checked against the releases), every release."""
    with store.errors(path, "", "read"):
        return _summary(path, dataset)


def _summary(path, dataset):
    conn = store.connect(path, create=False)
    try:
        try:
            names = [r[0] for r in conn.execute("SELECT dataset FROM datasets "
                                                "ORDER BY dataset").fetchall()]
        except conn.statement_errors() as exc:
            raise SpecError("", f"{store.shown(path)!r} is not a thresher ledger: {exc}") from None
        if dataset is not None:
            names = [d for d in names if d == dataset]
            if not names:
                raise SpecError("--dataset", f"no dataset {dataset!r} in the ledger "
                                             f"{store.shown(path)!r}")
        out = []
        for name in names:
            rows = store.select(conn, "releases", (
                "name", "epsilon", "delta", "config_sha256", "state", "reserved_at",
                "finished_at", "output", "id", "rho", "delta0"),
                " WHERE dataset = ? ORDER BY id", (name,)).fetchall()
            try:
                state = store.dataset_row(conn, name)
                folded = store.folded(conn, name)
            except store.BadRow as exc:
                # ledger show is how an operator finds such a row: shown, never a crash
                out.append(_unreadable_summary(name, rows, exc.message))
                continue
            entry = _dataset_summary(name, state.totals, state.spent, folded, rows,
                                     state.problem)
            if state.totals_problem is not None:
                entry["warning"] = " ".join(filter(None, (
                    f"{state.totals_problem}: no release is admitted on this dataset until "
                    f"its totals are set again ({TOTALS_HELP}).", entry.get("warning"))))
            out.append(entry)
        return out
    finally:
        conn.close()


def _unreadable_summary(name, rows, message):
    """A dataset whose row or releases hold a value no thresher writes: its releases as
    stored (numbers that are no numbers shown as null) and the problem as its warning."""
    return {
        "dataset": name, "composition": None, "budget": None, "spent": None, "zcdp": None,
        "releases": [{"id": r[8], "name": r[0], "epsilon": loose(r[1]),
                      "delta": loose(r[2]), "rho": loose(r[9]), "delta0": loose(r[10]),
                      "config_sha256": r[3], "state": r[4], "time": r[6] or r[5],
                      "output": r[7]} for r in rows],
        "warning": f"{message.replace('; nothing was read or published', '')}; every run "
                   f"on this dataset is refused until the value is repaired",
    }


def _dataset_summary(name, totals, spent, folded, rows, problem=None):
    zcdp = totals.composition == comp.ZCDP
    if zcdp and (spent.rho is None or spent.delta0 is None):
        entry = _unreadable_summary(name, rows, "a zcdp dataset holds a release without a "
                                    "(rho, delta0) record (NULL), so its spent rho is unknown")
        entry.update(composition=totals.composition, budget={
            "epsilon": float(totals.epsilon), "delta": float(totals.delta)})
        return entry
    if zcdp:
        eps = totals.epsilon_of(spent.rho)
        shown_spent = {"epsilon": eps, "delta": float(comp.add(
            spent.delta0, totals.conversion_delta if spent.rho > 0 else 0))}
    else:
        shown_spent = {"epsilon": float(spent.epsilon), "delta": float(spent.delta)}
    records = {"rho_spent": as_float(comp.text(spent.rho)),
               "delta0_spent": as_float(comp.text(spent.delta0))}
    if zcdp:
        records.update(rho_budget=float(totals.rho), delta0_budget=float(totals.delta0),
                       conversion_delta=float(totals.conversion_delta),
                       epsilon_of_rho_spent=shown_spent["epsilon"])
    elif spent.rho is not None:
        records["epsilon_of_rho_spent_at_delta"] = {
            "delta": float(totals.delta), "note": "what these releases would convert to "
            "under zcdp with threshold_delta 0, for comparison",
            "epsilon": comp.Totals(comp.ZCDP, totals.epsilon, totals.delta, comp.ZERO,
                                   comp.ZERO).epsilon_of(spent.rho)}
    entry = {
        "dataset": name,
        "composition": totals.composition,
        "budget": {"epsilon": float(totals.epsilon), "delta": float(totals.delta)},
        "spent": shown_spent,
        "zcdp": records,
        "releases": [{"id": r[8], "name": r[0], "epsilon": as_float(r[1]), "delta": as_float(r[2]),
                      "rho": as_float(r[9]), "delta0": as_float(r[10]),
                      "config_sha256": r[3], "state": r[4], "time": r[6] or r[5],
                      "output": r[7]} for r in rows],
    }
    if problem is not None:
        entry["warning"] = (f"the running sums in the dataset's row cannot be right ({problem}); "
                            f"shown: the sums of its releases. The next run refuses until they "
                            f"are repaired (set the dataset's spent_* columns to NULL to have "
                            f"them folded again)")
    elif folded != spent:
        entry["warning"] = (f"the running sums in the dataset's row ({spent}) differ from the "
                            f"sums of its releases ({folded}): the ledger was edited by hand "
                            f"or is corrupt")
    return entry


def format_summary(datasets):
    n = comp.shown_number
    lines = []
    for d in datasets:
        b, s, z = d["budget"], d["spent"], d["zcdp"]
        name = printable(d["dataset"])
        count = f"{len(d['releases'])} release{'s' if len(d['releases']) != 1 else ''}"
        if s is None:
            lines.append(f"dataset {name} ({count}): cannot be read")
        elif d["composition"] == comp.ZCDP:
            lines.append(f"dataset {name} (zcdp composition, {count}): spent rho "
                         f"{n(z['rho_spent'])} of rho_B {n(z['rho_budget'])}, delta0 "
                         f"{n(z['delta0_spent'])} of delta0_B {n(z['delta0_budget'])}; that is "
                         f"epsilon {n(s['epsilon'])} of {n(b['epsilon'])} at delta "
                         f"{n(z['conversion_delta'])} + delta0 (total delta {n(b['delta'])})")
        else:
            lines.append(f"dataset {name}: spent epsilon {n(s['epsilon'])} of "
                         f"{n(b['epsilon'])}, delta {n(s['delta'])} of {n(b['delta'])} "
                         f"({count}, basic composition)")
        if d.get("warning"):
            lines.append(f"  WARNING: {printable(d['warning'])}")
        for r in d["releases"]:
            record = ("" if r["rho"] is None else
                      f" rho={n(r['rho'])} delta0={n(r['delta0'])}")
            lines.append(f"  {r['time']}  {printable(r['state']):<14} {printable(r['name'])}  "
                         f"epsilon={n(r['epsilon'])} delta={n(r['delta'])}{record}  config "
                         f"{printable(str(r['config_sha256'])[:12])}  "
                         f"{printable(r['output'] or '-')}")
    return "\n".join(lines) if lines else "the ledger holds no dataset yet"


def after_run_line(budget):
    """The line ``thresher run`` prints after a charged release."""
    try:
        d = summary(budget.ledger, budget.dataset)[0]
    except SpecError as exc:      # the release is published; the warning above says more
        return f"ledger: cannot be read now ({exc})"
    s, b, n = d["spent"], d["budget"], comp.shown_number
    if s is None:
        return f"ledger: cannot be read now ({d['warning']})"
    name = printable(d["dataset"])
    if d["composition"] == comp.ZCDP:
        z = d["zcdp"]
        return (f"ledger: dataset {name} (zcdp) has spent rho {n(z['rho_spent'])} of "
                f"{n(z['rho_budget'])}, delta0 {n(z['delta0_spent'])} of "
                f"{n(z['delta0_budget'])} (epsilon {n(s['epsilon'])} of {n(b['epsilon'])}) "
                f"({store.where(budget.ledger)})")
    return (f"ledger: dataset {name} has spent epsilon {n(s['epsilon'])} of "
            f"{n(b['epsilon'])}, delta {n(s['delta'])} of {n(b['delta'])} "
            f"({store.where(budget.ledger)})")

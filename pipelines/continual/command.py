"""``thresher run SPEC --period P`` and ``thresher plan SPEC`` for a spec with a
``continual`` section (docs/continual.md).

One run of period P, in this order (each step's crash leaves a state that a re-run of the
same period repairs; ``THRESHER_CONTINUAL_FAULT=<point>`` makes the process ``os._exit``
at a named point, for the tests that kill it at each one):

1. calibrate the whole horizon (``accounting.continual.calibrate``); lock the state
   folder (``pipelines.continual.state``) and read its head, verified by digest;
2. refuse a period out of order (P > last published + 1), a missing input for P
   (exit 2, never zeros), a spec or plan whose digest differs from the one the horizon
   was charged with;
3. period 1 only: write ``horizon.json`` with the ledger run token (a PRF of the
   horizon's secret), then charge the horizon's whole (epsilon, delta) and (rho, delta0)
   to the ledger under that token (``pipelines.ledgers.ledger.reserve_charge``: a token
   is charged once, so a re-run charges nothing); every later period checks that the
   ledger holds the token and charges nothing;
4. compute the period (``pipelines.continual.period``) from the state before P;
5. publish ``OUT/period=P/`` (staged, then renamed into place); if it is already there
   (a re-run, or a crash after publishing), its bytes must equal the computed ones, or
   the run is refused;
6. commit: write the new state tables (content-addressed), then replace ``head.json``.
"""
import dataclasses
import hashlib
import json
import os
import shutil

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.csv as pacsv
import pyarrow.json as pajson
import pyarrow.parquet as pq

from thresher.accounting import continual as acc, zcdp
from thresher.pipelines.continual import period as period_mod
from thresher.pipelines.continual import state as state_mod
from thresher.pipelines.dataio.io import prepare_batch
from thresher.pipelines.dataio.paths import input_files
from thresher.pipelines.ledgers import composition as comp, ledger
from thresher.pipelines.ledgers.ledger import config_sha256
from thresher.pipelines.specs.continual_section import PERIOD_FIELD
from thresher.pipelines.errors import CalibrationError, InputError, SpecError
from thresher.transforms.randomness.keyed_random import KeyedSource
from thresher.transforms.randomness.user_identity import identity_key

FAULT_ENV = "THRESHER_CONTINUAL_FAULT"
FAULT_EXIT = 86
FAULT_POINTS = ("before_charge", "after_charge", "after_pending", "after_stage",
                "after_publish", "after_state_files", "after_commit")
RUN_TOKEN_STAGE = "\x00thresher/continual-ledger-run-token"
RELEASED_FILE, REPORT_FILE = "released.parquet", "release_report.json"


def fault(point):
    """Die here, without cleanup, when the test hook names this point."""
    if os.environ.get(FAULT_ENV) == point:
        os._exit(FAULT_EXIT)


# ---- the plan ------------------------------------------------------------------------------

def calibration_of(spec):
    c = spec.continual
    try:
        return acc.calibrate(spec.privacy.epsilon, spec.privacy.delta,
                             spec.bounding.max_keys_per_user, c.horizon, c.selection_share)
    except ValueError as exc:
        raise CalibrationError(f"continual release at epsilon={spec.privacy.epsilon:g}, "
                               f"delta={spec.privacy.delta:g}, max_keys_per_user="
                               f"{spec.bounding.max_keys_per_user}, horizon={c.horizon}: "
                               f"{exc}") from None


def plan_document(spec, calibration):
    """The plan's public figures (JSON values): what every period's report repeats."""
    T = calibration.horizon
    tree, once = acc.noise_units(T)
    unit = (calibration.max_keys_per_user / (2.0 * calibration.rho)) ** 0.5
    by_k = {str(k): {"periods": n, "noise_sd": calibration.sigma * k ** 0.5}
            for k, n in sorted(acc.prefix_node_counts(T).items())}
    ratio = acc.noise_ratio(T)
    return {
        "name": spec.name,
        "kind": "continual",
        "key_columns": list(spec.input.keys),
        "confidence": spec.output.confidence,
        "continual": {**calibration.as_dict(), "selection_share": spec.continual.selection_share},
        "noise": {
            "node_sigma": calibration.sigma,
            "worst_noise_sd": calibration.sigma * calibration.max_prefix_nodes ** 0.5,
            "rerelease_noise_sd": once * unit,
            "ratio": ratio,
            "noise_units": {"tree": tree, "rerelease": once},
            "by_nodes_in_prefix": by_k,
            "recommendation": ("continual (tree)" if ratio < 1.0 else
                               "one-shot releases: the tree does not pay at this horizon"),
        },
        "mechanism": {"kind": "continual", "noise": "discrete_gaussian",
                      "tree": "binary mechanism", "sigma": calibration.sigma,
                      "threshold": calibration.threshold},
        "bounding": {"max_keys_per_user": calibration.max_keys_per_user, "model": "l0",
                     "scope": "the whole horizon"},
        "outputs": [RELEASED_FILE],
        "privacy": {"epsilon": spec.privacy.epsilon, "delta": spec.privacy.delta,
                    "neighbouring": "add/remove all records of one user, in every period",
                    "tree_rho": calibration.rho, "delta_selection": calibration.delta_selection,
                    "epsilon_of_rho": calibration.epsilon_achieved,
                    "zcdp_record": dataclasses.asdict(acc.privacy_record(calibration)),
                    "unit": "user (all records of one user in all periods)"},
    }


def plan_lines(spec):
    cal = calibration_of(spec)
    doc = plan_document(spec, cal)
    noise = doc["noise"]
    lines = [
        f"continual release {spec.name!r}: {cal.horizon} periods, charged once at period 1: "
        f"epsilon={spec.privacy.epsilon:g}, delta={spec.privacy.delta:g} (user-level over the "
        f"whole horizon; the tree's zCDP rho={cal.rho:.6g} converts to epsilon="
        f"{cal.epsilon_achieved:.6g} at delta {cal.delta - cal.delta_selection:.3g}, plus "
        f"key selection's delta {cal.delta_selection:.3g})",
        f"bound: each user counted in at most {cal.max_keys_per_user} keys over the horizon "
        f"(its first distinct keys in period order)",
        f"tree: binary mechanism, {cal.levels} nodes per period, discrete Gaussian node noise "
        f"sigma {cal.sigma:.2f}; a key is released from the first period its noisy cumulative "
        f"count reaches {cal.threshold}, and stays",
        "noise sd of a cumulative count, per period (by the number of nodes it sums):",
    ]
    for k, item in noise["by_nodes_in_prefix"].items():
        lines.append(f"  {item['periods']:>6} periods with {k} node(s): sd {item['noise_sd']:.2f}")
    lines.append(f"worst case {noise['worst_noise_sd']:.2f} vs {noise['rerelease_noise_sd']:.2f} "
                 f"re-releasing cumulative counts every period at the same total rho: ratio "
                 f"{noise['ratio']:.3f} ({noise['noise_units']['tree']:.2f} vs "
                 f"{noise['noise_units']['rerelease']:.2f} noise units)")
    lines.append("for reference: ratio " + ", ".join(
        f"{acc.noise_ratio(T):.3f} at T = {T}" for T in (30, 365, 1000)))
    lines.append(f"recommendation: {noise['recommendation']}")
    return lines, doc


def plan_sha256(document):
    return hashlib.sha256(json.dumps(document, sort_keys=True).encode("utf-8")).hexdigest()


# ---- the input -----------------------------------------------------------------------------

def period_input(spec, period):
    """The input spec of ``period`` ({period} filled in) and its files; SpecError naming
    input.path when the period's input is missing."""
    path = spec.input.path.replace(PERIOD_FIELD, str(period))
    input_spec = dataclasses.replace(spec.input, path=path)
    try:
        files = input_files(input_spec)
    except SpecError as exc:
        raise SpecError("input.path", f"period {period}'s input: {exc.message} (a missing "
                        f"period is an error, not a period without records)") from None
    return input_spec, files


def read_period(input_spec, files, source):
    """The period's records, prepared (user identities, keys): ``prepare_batch``."""
    columns = [input_spec.user, *input_spec.keys]
    tables = []
    for path in files:
        try:
            if input_spec.format == "parquet":
                table = pq.read_table(path, columns=columns)
            elif input_spec.format == "csv":
                table = pacsv.read_csv(path, parse_options=pacsv.ParseOptions(
                    delimiter=input_spec.delimiter),
                    convert_options=pacsv.ConvertOptions(include_columns=columns))
            else:
                table = pajson.read_json(path).select(columns)
        except (pa.ArrowInvalid, KeyError, OSError) as exc:
            raise InputError(f"cannot read {path!r}: {str(exc).splitlines()[0]}") from None
        tables.append(table)
    table = pa.concat_tables(tables, promote_options="permissive")
    prepared, _ = prepare_batch(table, input_spec.user, list(input_spec.keys),
                                as_text=input_spec.format != "parquet",
                                identity_key=identity_key(source))
    return prepared.select([period_mod.USERS[0], period_mod.USERS[1], *input_spec.keys])


# ---- the ledger ----------------------------------------------------------------------------

def _charge(spec, calibration, spec_sha, token, out):
    record = acc.privacy_record(calibration)
    charge = comp.Charge(comp.dec(spec.privacy.epsilon), comp.dec(spec.privacy.delta),
                         zcdp.decimal_up(record.rho), zcdp.decimal_up(record.delta0))
    return ledger.reserve_charge(spec.budget, spec.name, spec_sha, charge, run_token=token,
                                 output=f"continual: {out} ({calibration.horizon} periods)")


def ledger_holds(budget, token):
    """True when the ledger holds the horizon's charge (its run token)."""
    if not os.path.isfile(budget.ledger):
        return False
    with ledger.errors(budget.ledger, "budget.ledger", "read"):
        conn = ledger._connect(budget.ledger, create=False)
        try:
            row = conn.execute("SELECT id FROM releases WHERE run_token = ? AND dataset = ?",
                               (token, budget.dataset)).fetchone()
        finally:
            conn.close()
    return row is not None


# ---- one period ----------------------------------------------------------------------------

def run(spec, period, quiet=False):
    """Run one period (module docstring). Returns the exit code (0)."""
    T = spec.continual.horizon
    if not 1 <= period <= T:
        raise SpecError("--period", f"must be in 1..{T} (continual.horizon), got {period}")
    calibration = calibration_of(spec)
    _, document = plan_lines(spec)
    plan_sha = plan_sha256(document)
    spec_sha = config_sha256(spec)
    store = state_mod.State(state_mod.folder_for(spec.budget, spec.name))
    out_root = spec.output.path
    with store.locked():
        head = store.head()
        done = int(head["period"])
        if period > done + 1:
            raise SpecError("--period", f"periods run in order: period {done + 1} is next "
                            f"(published: {done or 'none'})")
        input_spec, files = period_input(spec, period)
        horizon = store.read_json(state_mod.HORIZON)
        secret = store.secret(create=(done == 0))
        source = KeyedSource(secret)
        token = source.stage_key(RUN_TOKEN_STAGE)[:16].hex()
        if horizon is not None and (horizon["spec_sha256"], horizon["plan_sha256"]) != (
                spec_sha, plan_sha):
            if done == 0 and not ledger_holds(spec.budget, token):
                horizon = None          # nothing charged or published yet: a new start
            else:
                raise SpecError("continual", f"the spec or its plan changed since the horizon "
                                f"was charged at period 1 (digest {horizon['spec_sha256'][:12]}); "
                                f"a continual release keeps its spec for the whole horizon: "
                                f"restore it, or start a new release (another name)")
        if horizon is None:
            horizon = {"spec_sha256": spec_sha, "plan_sha256": plan_sha, "horizon": T,
                       "run_token": token, "dataset": spec.budget.dataset, "name": spec.name}
            store.write_json(state_mod.HORIZON, horizon)
        if horizon["run_token"] != token:
            raise SpecError("continual", "the horizon's secret does not match its charge "
                            "(state folder changed outside thresher)")
        if done == 0:
            fault("before_charge")
            _charge(spec, calibration, spec_sha, token, out_root)
            fault("after_charge")
        elif not ledger_holds(spec.budget, token):
            raise SpecError("budget.ledger", f"the ledger {spec.budget.ledger!r} does not hold "
                            f"this horizon's charge (run token {token[:8]}...): the state and "
                            f"the ledger disagree; nothing was read or published")
        key_schema = None
        if head["users"] is not None:
            users_all = store.read_table(head["users"])
            released_all = store.read_table(head["released"])
            users_before = users_all.filter(pc.less(users_all.column(
                period_mod.FIRST_PERIOD), period))
            released_before = released_all.filter(pc.less(released_all.column(
                period_mod.FIRST_PERIOD), period))
        prepared = read_period(input_spec, files, source)
        if head["users"] is None:
            key_schema = prepared.select(list(spec.input.keys)).schema
            users_before = period_mod.empty_users(key_schema)
            released_before = period_mod.empty_released(key_schema)
        try:
            prepared = prepared.cast(pa.schema([*users_before.schema][:2] + [
                users_before.schema.field(k) for k in spec.input.keys]))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
            raise InputError(f"period {period}'s key columns do not have the types of earlier "
                             f"periods ({exc})") from None
        rows, users, released, figures = period_mod.release(
            prepared, users_before, released_before, list(spec.input.keys), calibration,
            period, spec.output.confidence, source)
        report = {**document, "period": period, **figures,
                  "noise_sd": calibration.sd_at(period),
                  "nodes_in_prefix": len(acc.prefix_nodes(period)),
                  "columns": {"count": "noisy distinct-user count over periods 1..period",
                              "count_low": "lower end of the interval",
                              "count_high": "upper end of the interval",
                              "first_period": "the period the key was first released"}}
        files_out = {RELEASED_FILE: state_mod.table_bytes(rows),
                     REPORT_FILE: state_mod.json_bytes(report)}
        digests = {name: hashlib.sha256(data).hexdigest() for name, data in files_out.items()}
        final = os.path.join(out_root, f"period={period}")
        recorded = head["outputs"].get(str(period))
        if recorded is None:
            # a crash after publishing (before the head was committed) leaves these: the
            # same noise on changed data would disclose the change, so the bytes must match
            # whether or not the period's folder is still there
            pending = store.read_json(state_mod.PENDING)
            if pending is not None and pending.get("period") == period:
                recorded = pending.get("outputs")
        if recorded is not None and recorded != digests:
            raise SpecError("input.path", f"period {period} was published (or its publication "
                            f"begun) with other bytes: its input changed since; nothing was "
                            f"published")
        if period > done:
            store.write_json(state_mod.PENDING, {"period": period, "outputs": digests})
            fault("after_pending")
        _publish(final, files_out, digests, period)
        if period <= done:
            if not quiet:
                print(f"period {period} is already published at {final}; this run computed "
                      f"the same bytes (nothing changed, nothing charged)")
            return 0
        users_entry = store.write_table("users", users)
        released_entry = store.write_table("released", released)
        fault("after_state_files")
        new_head = {"period": period, "users": users_entry, "released": released_entry,
                    "outputs": {**head["outputs"], str(period): digests}}
        store.write_json(state_mod.HEAD, new_head)
        fault("after_commit")
        store.remove_unreferenced(new_head)
    if not quiet:
        print(f"wrote {final}/{RELEASED_FILE}, {final}/{REPORT_FILE}")
        print(f"period {period} of {T}: {figures['released_keys']} keys released "
              f"({figures['new_keys']} new); noise sd {calibration.sd_at(period):.2f}; "
              f"{'charged' if period == 1 else 'charged at period 1'}: epsilon="
              f"{spec.privacy.epsilon:g}, delta={spec.privacy.delta:g} for the whole horizon "
              f"(user-level)")
    return 0


def _publish(final, files_out, digests, period):
    """Write the period's folder through a staging folder; a folder already there must
    hold the same bytes (a re-run, or a crash after publishing), else refuse."""
    if os.path.isdir(final):
        found = {}
        for name in files_out:
            path = os.path.join(final, name)
            found[name] = state_mod.sha256_file(path) if os.path.isfile(path) else None
        if found != digests:
            raise SpecError("output.path", f"{final} holds other bytes than period {period} "
                            f"computes now (its input or spec changed); nothing was published")
        return
    staging = os.path.join(os.path.dirname(final) or ".", f".{os.path.basename(final)}.staging")
    shutil.rmtree(staging, ignore_errors=True)
    os.makedirs(staging)
    for name, data in files_out.items():
        state_mod.write_atomic(os.path.join(staging, name), data)
    fault("after_stage")
    os.replace(staging, final)
    state_mod._fsync_dir(os.path.dirname(final) or ".")
    fault("after_publish")
